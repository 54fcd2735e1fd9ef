"""Hand-computed checks of the advantage estimators and losses in agent_r1.algorithms."""

import math
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import fields, replace

import pytest
import torch
from torch.testing import assert_close

from agent_r1.algorithms import (
    ADVANTAGES,
    POLICY_LOSSES,
    AdvantageInputs,
    aggregate,
    entropy_from_logits,
    gae,
    get_advantage,
    get_policy_loss,
    grpo,
    grpo_no_std,
    kl_penalty,
    logprobs_from_logits,
    masked_whiten,
    ppo_clip_loss,
    register_advantage,
    reinforce_pp,
    reinforce_pp_baseline,
    rloo,
    step_gae,
    vanilla_pg_loss,
    value_loss,
)


def t(rows):
    return torch.tensor(rows, dtype=torch.float32)


# ---------------------------------------------------------------- registry


def test_registry_names_and_lookup():
    assert set(ADVANTAGES) == {
        "gae", "step_gae", "grpo", "grpo_no_std", "rloo", "reinforce_pp", "reinforce_pp_baseline", "gigpo"
    }
    assert set(POLICY_LOSSES) == {"ppo", "vanilla", "gspo"}
    assert get_advantage("gae").fn is gae and get_policy_loss("ppo").fn is ppo_clip_loss
    # what the driver and the learner read from the entries (nothing else names an estimator)
    assert {n for n, e in ADVANTAGES.items() if e.needs_critic} == {"gae", "step_gae"}
    assert {n for n, e in ADVANTAGES.items() if e.needs_groups} == {"grpo", "grpo_no_std", "rloo", "reinforce_pp_baseline",
                                                                    "gigpo"}
    assert get_advantage("gigpo").settings == {"step_advantage_weight": 1.0, "norm": "std"}
    assert get_advantage("gae").report_name == "ppo" and get_advantage("rloo").report_name == "rloo"
    assert get_advantage("reinforce_pp").settings == {"whiten": True} and get_advantage("grpo").settings == {}
    assert get_policy_loss("ppo").settings == ("clip_low", "clip_high", "dual_clip")
    # what rl.learner takes where a config leaves it unset: the loss function's own defaults
    assert get_policy_loss("gspo").defaults() == {"loss_agg": "seq-mean-token-mean", "clip_low": 3e-4, "clip_high": 4e-4}
    assert get_policy_loss("ppo").defaults() == {"loss_agg": "token-mean", "clip_low": 0.2, "clip_high": 0.2, "dual_clip": 3.0}
    # where a group of equal rewards gets advantage 0 (what rl.dynamic_sampling needs)
    assert {n: e.zero_when_tied for n, e in ADVANTAGES.items() if e.zero_when_tied != "never"} == {
        "grpo": "always", "grpo_no_std": "always", "rloo": "always", "gigpo": "outcome"}
    with pytest.raises(ValueError, match="zero_when_tied must be one of always, outcome, never, got 'yes'"):
        register_advantage("mine", zero_when_tied="yes")
    with pytest.raises(KeyError, match=r"'nope'.*grpo.*rloo"):
        get_advantage("nope")
    with pytest.raises(KeyError, match=r"'nope'.*ppo.*vanilla"):
        get_policy_loss("nope")
    with pytest.raises(ValueError, match="already registered"):
        register_advantage("gae")(lambda inp: inp)


# ---------------------------------------------------------------- whitening


def test_masked_whiten():
    # masked x = 1, 2, 3: mean 2, unbiased var ((-1)^2 + 0 + 1^2) / (3 - 1) = 1 -> -1, 0, 1
    out = masked_whiten(t([[1, 2, 3, 100]]), t([[1, 1, 1, 0]]), eps=0.0)
    assert_close(out, t([[-1, 0, 1, 0]]))
    # a single masked entry is its own mean -> 0 (variance taken as 0, no division by zero)
    assert_close(masked_whiten(t([[5, 7]]), t([[0, 1]])), t([[0, 0]]))


def on_parts(parts: list, fn) -> list:
    """``fn(part, reduce)`` for every part at once, one thread each, ``reduce`` summing a list of floats over
    every part as an all-reduce sums over ranks (each part waits for the others): a batch split over ranks."""
    barrier = threading.Barrier(len(parts), timeout=60)  # a part that never reduces breaks it: no hang
    slots = [None] * len(parts)

    def reducer(i):
        def reduce(values):
            slots[i] = values
            barrier.wait()
            out = [sum(v) for v in zip(*slots)]
            barrier.wait()  # every part has read the sums before any writes its next values
            return out
        return reduce

    with ThreadPoolExecutor(len(parts)) as pool:
        futures = [pool.submit(fn, part, reducer(i)) for i, part in enumerate(parts)]
        return [f.result() for f in futures]


def test_masked_whiten_over_two_parts_whitens_the_whole_batch():
    x = t([[1, 2, 3, 100], [4, 8, 0, 0], [-3, 5, 7, 1]])
    mask = t([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]])
    whole = masked_whiten(x, mask)
    halves = [(x[:1], mask[:1]), (x[1:], mask[1:])]
    assert_close(torch.cat(on_parts(halves, lambda h, reduce: masked_whiten(*h, reduce=reduce))), whole)
    # each part whitened over its own entries (N ranks without the all-reduce): other advantages
    assert (torch.cat([masked_whiten(*h) for h in halves]) - whole).abs().max() > 0.1
    # one masked entry in all: variance 0 (Bessel's n - 1 is of the whole count), as in one process
    one = on_parts([(t([[5, 7]]), t([[0, 1]])), (t([[2]]), t([[0]]))], lambda h, reduce: masked_whiten(*h, reduce=reduce))
    assert_close(torch.cat(one, 1), t([[0, 0, 0]]))


# ---------------------------------------------------------------- token-level GAE

# one trajectory [prompt, act, act, obs, act]; gamma = 0.9, lam = 0.8 -> gamma * lam = 0.72
ONE_MASK = t([[0, 1, 1, 0, 1]])
ONE_VALUES = t([[0.0, 0.5, 1.0, 9.0, 2.0]])
ONE_REWARDS = t([[0, 0, 0.5, 0, 1.0]])  # step reward 0.5 ends turn 1, final reward 1.0


def one_inputs(mask=ONE_MASK, **kw):
    return AdvantageInputs(
        token_rewards=ONE_REWARDS, mask=mask, group_ids=torch.tensor([0]), values=ONE_VALUES, **kw
    )


def test_gae_skips_observation_tokens():
    adv, ret = gae(one_inputs(gamma=0.9, lam=0.8), whiten=False)
    # t=4 (last action): delta = 1.0 + 0.9*0 - 2.0 = -1.0;                  A4 = -1.0
    # t=3 observation: skipped, so t=2's next value is V4 = 2.0
    # t=2: delta = 0.5 + 0.9*2.0 - 1.0 = 1.3;          A2 = 1.3 + 0.72*(-1.0) = 0.58
    # t=1: delta = 0.0 + 0.9*1.0 - 0.5 = 0.4;          A1 = 0.4 + 0.72*0.58   = 0.8176
    assert_close(adv, t([[0, 0.8176, 0.58, 0, -1.0]]))
    # returns = A + V: 0.8176 + 0.5, 0.58 + 1.0, -1.0 + 2.0
    assert_close(ret, t([[0, 1.3176, 1.58, 0, 1.0]]))


def test_gae_advantage_mask_differs_from_including_observations():
    adv_obs, _ = gae(one_inputs(mask=t([[0, 1, 1, 1, 1]]), gamma=0.9, lam=0.8), whiten=False)
    # t=4: A4 = -1.0
    # t=3: delta = 0 + 0.9*2.0 - 9.0 = -7.2;           A3 = -7.2 + 0.72*(-1.0)   = -7.92
    # t=2: delta = 0.5 + 0.9*9.0 - 1.0 = 7.6;          A2 = 7.6 + 0.72*(-7.92)   = 1.8976
    # t=1: delta = 0 + 0.9*1.0 - 0.5 = 0.4;            A1 = 0.4 + 0.72*1.8976    = 1.766272
    assert_close(adv_obs, t([[0, 1.766272, 1.8976, -7.92, -1.0]]))
    adv_mask, _ = gae(one_inputs(gamma=0.9, lam=0.8), whiten=False)
    assert (adv_obs[0, 1:3] - adv_mask[0, 1:3]).abs().min() > 0.5


def test_gae_whitens_by_default():
    inp = one_inputs(gamma=0.9, lam=0.8)
    raw, ret_raw = gae(inp, whiten=False)
    adv, ret = gae(inp)
    assert_close(adv, masked_whiten(raw, ONE_MASK))
    assert_close(ret, ret_raw)  # returns are never whitened


def test_gae_needs_values():
    inp = AdvantageInputs(token_rewards=ONE_REWARDS, mask=ONE_MASK, group_ids=torch.tensor([0]))
    with pytest.raises(ValueError, match="values"):
        gae(inp)


# ---------------------------------------------------------------- step-level GAE


def test_step_gae():
    # row 0: [prompt, act, act, obs, act, act], turns 0 and 1; row 1: [prompt, act, pad x4]
    mask = t([[0, 1, 1, 0, 1, 1], [0, 1, 0, 0, 0, 0]])
    step_ids = torch.tensor([[-1, 0, 0, -1, 1, 1], [-1, 0, -1, -1, -1, -1]])
    values = t([[0, 1.0, 7.0, 9.0, 2.0, 5.0], [0, 0.3, 0, 0, 0, 0]])
    rewards = t([[0, 0.2, 0.3, 0, 0, 1.0], [0, 1.0, 0, 0, 0, 0]])
    inp = AdvantageInputs(rewards, mask, torch.tensor([0, 0]), values, step_ids, gamma=0.9, lam=0.8)
    adv, ret = step_gae(inp, whiten=False)
    # row 0: R0 = 0.2 + 0.3 = 0.5, V0 = 1.0 (first token of turn 0); R1 = 1.0, V1 = 2.0
    #   step 1: delta = 1.0 + 0 - 2.0 = -1.0;                 A1 = -1.0, return 1.0
    #   step 0: delta = 0.5 + 0.9*2.0 - 1.0 = 1.3;   A0 = 1.3 + 0.72*(-1.0) = 0.58, return 1.58
    # row 1: one step, R0 = 1.0, V0 = 0.3: A0 = 0.7, return 1.0
    assert_close(adv, t([[0, 0.58, 0.58, 0, -1.0, -1.0], [0, 0.7, 0, 0, 0, 0]]))
    assert_close(ret, t([[0, 1.58, 1.58, 0, 1.0, 1.0], [0, 1.0, 0, 0, 0, 0]]))
    assert_close(step_gae(inp)[0], masked_whiten(adv, mask))


# ---------------------------------------------------------------- group estimators

# four rows [prompt, act, obs, act]; groups {rows 0,1,2} and {row 3}
GROUP_MASK = t([[0, 1, 0, 1]] * 4)
GROUP_REWARDS = t([
    [0, 0.25, 0, 0.75],  # step reward 0.25 + final 0.75 -> score 1
    [0, 0, 0, 0],        # score 0
    [0, 0, 0, 0],        # score 0
    [0, 0, 0, 2.0],      # score 2, alone in its group
])
GROUP_INPUTS = AdvantageInputs(GROUP_REWARDS, GROUP_MASK, torch.tensor([7, 7, 7, 3]))


def test_grpo():
    adv, ret = grpo(GROUP_INPUTS)
    # group {1, 0, 0}: mean 1/3; unbiased var ((2/3)^2 + 2*(1/3)^2) / (3-1) = 1/3, std 0.577350
    # (1 - 1/3) / 0.577350 = 1.154701;  (0 - 1/3) / 0.577350 = -0.577350; group of one -> 0
    a = [1.154701, -0.577350, -0.577350, 0.0]
    assert_close(adv, t([[0, x, 0, x] for x in a]))
    assert_close(ret, adv)


def test_grpo_no_std():
    adv, _ = grpo_no_std(GROUP_INPUTS)
    # score - group mean: 1 - 1/3, 0 - 1/3, 0 - 1/3; group of one -> 0
    a = [2 / 3, -1 / 3, -1 / 3, 0.0]
    assert_close(adv, t([[0, x, 0, x] for x in a]))


def test_rloo():
    adv, _ = rloo(GROUP_INPUTS)
    # score - mean of the others: 1 - (0+0)/2 = 1, 0 - (1+0)/2 = -0.5 (twice); group of one -> 0
    a = [1.0, -0.5, -0.5, 0.0]
    assert_close(adv, t([[0, x, 0, x] for x in a]))


# ---------------------------------------------------------------- REINFORCE++


def test_reinforce_pp():
    adv, ret = reinforce_pp(one_inputs(gamma=0.9), whiten=False)
    # return-to-go over action tokens only (observation skipped):
    # G4 = 1.0; G2 = 0.5 + 0.9*1.0 = 1.4; G1 = 0 + 0.9*1.4 = 1.26
    assert_close(adv, t([[0, 1.26, 1.4, 0, 1.0]]))
    assert_close(ret, adv)
    assert_close(reinforce_pp(one_inputs(gamma=0.9))[0], masked_whiten(adv, ONE_MASK))


def test_reinforce_pp_baseline():
    # row 0 as in test_reinforce_pp (score 1.5); row 1: [prompt, act, act, pad, pad], score 0.5
    mask = t([[0, 1, 1, 0, 1], [0, 1, 1, 0, 0]])
    rewards = t([[0, 0, 0.5, 0, 1.0], [0, 0, 0.5, 0, 0]])
    inp = AdvantageInputs(rewards, mask, torch.tensor([0, 0]), gamma=0.9)
    adv, ret = reinforce_pp_baseline(inp, whiten=False)
    # return-to-go: row 0 [1.26, 1.4, 1.0]; row 1 G2 = 0.5, G1 = 0.9*0.5 = 0.45
    assert_close(ret, t([[0, 1.26, 1.4, 0, 1.0], [0, 0.45, 0.5, 0, 0]]))
    # group mean score (1.5 + 0.5) / 2 = 1.0 subtracted from every action token
    assert_close(adv, t([[0, 0.26, 0.4, 0, 0.0], [0, -0.55, -0.5, 0, 0]]))
    assert_close(reinforce_pp_baseline(inp)[0], masked_whiten(adv, mask))


# ---------------------------------------------------------------- all estimators

# three rows in one group, [prompt, act, act, obs, act, act, obs, act, pad]: turns 0, 1, 2;
# row 2 is shorter (turns 0 and 1, one token in turn 1)
BATCH_MASK = t([[0, 1, 1, 0, 1, 1, 0, 1, 0]] * 2 + [[0, 1, 1, 0, 1, 0, 0, 0, 0]])
BATCH_STEPS = torch.tensor(
    [[-1, 0, 0, -1, 1, 1, -1, 2, -1]] * 2 + [[-1, 0, 0, -1, 1, -1, -1, -1, -1]]
)
BATCH_FINAL = t([  # final rewards on each row's last action token
    [0, 0, 0, 0, 0, 0, 0, 1.0, 0],
    [0, 0, 0, 0, 0, 0, 0, 0.0, 0],
    [0, 0, 0, 0, 0.5, 0, 0, 0, 0],
])
BATCH_VALUES = torch.arange(27, dtype=torch.float32).reshape(3, 9) * 0.1 - 0.5


def batch_inputs(rewards):
    return AdvantageInputs(
        rewards, BATCH_MASK, torch.tensor([4, 4, 4]), BATCH_VALUES, BATCH_STEPS, gamma=0.9, lam=0.8
    )


def with_step_reward(r=0.3):
    """BATCH_FINAL plus a step reward r on row 1's turn 1 (its last token, position 5)."""
    rewards = BATCH_FINAL.clone()
    rewards[1, 5] += r
    return rewards


@pytest.mark.parametrize("name", sorted(ADVANTAGES))
def test_zero_off_the_advantage_mask(name):
    adv, ret = get_advantage(name)(batch_inputs(with_step_reward()))
    off = BATCH_MASK == 0
    assert (adv[off] == 0).all() and (ret[off] == 0).all()
    assert adv[~off].abs().sum() > 0


@pytest.mark.parametrize("name", sorted(ADVANTAGES))
def test_step_reward_changes_advantages_before_its_step(name):
    fn = get_advantage(name)
    base, _ = fn(batch_inputs(BATCH_FINAL))
    new, _ = fn(batch_inputs(with_step_reward()))
    # row 1 gets the step reward on turn 1; its turn-0 tokens (positions 1, 2) come before it
    assert (new - base)[1, [1, 2, 4, 5]].abs().min() > 1e-3


def test_step_reward_propagation_by_hand():
    r, gl, g = 0.3, 0.9 * 0.8, 0.9

    def diff_rows(fn):  # unwhitened advantages with the step reward minus those without
        with_r, _ = fn(batch_inputs(with_step_reward(r)), whiten=False)
        without, _ = fn(batch_inputs(BATCH_FINAL), whiten=False)
        return with_r - without

    # token GAE: the extra reward at position 5 reaches each earlier action token discounted by
    # (gamma*lam)^k, k = action tokens in between (observations skipped):
    # position 5: r, 4: r*gl, 2: r*gl^2, 1: r*gl^3
    d = diff_rows(gae)
    assert_close(d[1], t([0, r * gl**3, r * gl**2, 0, r * gl, r, 0, 0, 0]))
    assert_close(d[[0, 2]], torch.zeros(2, 9))
    # REINFORCE++: the same with gamma alone
    d = diff_rows(reinforce_pp)
    assert_close(d[1], t([0, r * g**3, r * g**2, 0, r * g, r, 0, 0, 0]))
    # REINFORCE++-baseline: additionally the group mean score rises by r/3 = 0.1 on every row
    d = diff_rows(reinforce_pp_baseline)
    assert_close(d[1], t([0, r * g**3, r * g**2, 0, r * g, r, 0, 0, 0]) - 0.1 * BATCH_MASK[1])
    assert_close(d[0], -0.1 * BATCH_MASK[0])
    # step GAE: turn 1's step reward rises by r; turn 0 (one step earlier) by r*gl
    d = diff_rows(step_gae)
    assert_close(d[1], t([0, r * gl, r * gl, 0, r, r, 0, 0, 0]))


def rows_of(inp: AdvantageInputs, rows: slice) -> AdvantageInputs:
    return replace(inp, **{f.name: getattr(inp, f.name)[rows] for f in fields(inp)
                           if isinstance(getattr(inp, f.name), torch.Tensor)})


@pytest.mark.parametrize("name", sorted(ADVANTAGES))
def test_a_batch_split_over_two_ranks_gets_one_processs_advantages(name):
    """Rows 0-1 (group 4) and 2-3 (group 7) on two "ranks" (``on_parts``), the estimators that whiten
    taking the batch's mean and variance through the reducer: the advantages one process gets."""
    rewards = torch.cat([with_step_reward(), BATCH_FINAL[:1] * 0.25])
    inp = AdvantageInputs(rewards, torch.cat([BATCH_MASK, BATCH_MASK[:1]]), torch.tensor([4, 4, 7, 7]),
                          torch.cat([BATCH_VALUES, BATCH_VALUES[:1] * 2]), torch.cat([BATCH_STEPS, BATCH_STEPS[:1]]),
                          gamma=0.9, lam=0.8)
    whole = get_advantage(name)(inp)
    parts = on_parts([slice(0, 2), slice(2, 4)], lambda rows, reduce: get_advantage(name)(rows_of(replace(inp, reduce=reduce), rows)))
    for got, want in zip(zip(*parts), whole):
        assert_close(torch.cat(got), want)
    if name in ("reinforce_pp", "reinforce_pp_baseline", "gae", "step_gae"):  # whitened: each part alone differs
        alone = torch.cat([get_advantage(name)(rows_of(inp, r))[0] for r in (slice(0, 2), slice(2, 4))])
        assert (alone - whole[0]).abs().max() > 0.1


# ---------------------------------------------------------------- aggregation


def test_aggregate_modes():
    x = t([[1, 2, 3], [4, 9, 9], [5, 5, 5]])
    mask = t([[1, 1, 1], [1, 0, 0], [0, 0, 0]])  # lengths 3, 1, 0 (row 2 is ignored)
    assert_close(aggregate(x, mask, "token-mean"), torch.tensor(2.5))  # (1+2+3+4) / 4
    assert_close(aggregate(x, mask, "seq-mean-token-mean"), torch.tensor(3.0))  # (6/3 + 4/1) / 2
    assert_close(aggregate(x, mask, "seq-mean-token-sum"), torch.tensor(5.0))  # (6 + 4) / 2
    assert_close(aggregate(x, torch.zeros(3, 3), "token-mean"), torch.tensor(0.0))
    with pytest.raises(ValueError, match="'token-sum'"):
        aggregate(x, mask, "token-sum")


# ---------------------------------------------------------------- policy losses

# ratios 1.1, 1.5, 0.5, 5.0, 10.0 (old log-probs 0); the last token is masked out
PPO_LOGP = torch.log(t([[1.1, 1.5, 0.5, 5.0, 10.0]]))
PPO_OLD = torch.zeros(1, 5)
PPO_ADV = t([[1.0, 1.0, -1.0, -1.0, 2.0]])
PPO_MASK = t([[1, 1, 1, 1, 0]])


def test_ppo_clip_and_dual_clip():
    logp = PPO_LOGP.clone().requires_grad_()
    loss, metrics = ppo_clip_loss(logp, PPO_OLD, PPO_ADV, PPO_MASK)
    # token: max(-A*r, -A*clip(r, 0.8, 1.2)), then for A < 0 min(., -3*A)
    # 0: r 1.1, A  1: max(-1.1, -1.1) = -1.1                 (inside the range)
    # 1: r 1.5, A  1: max(-1.5, -1.2) = -1.2                 (clipped)
    # 2: r 0.5, A -1: max( 0.5,  0.8) =  0.8, min(0.8, 3)    (clipped)
    # 3: r 5.0, A -1: max( 5.0,  1.2) =  5.0, min(5.0, 3) = 3 (dual clip)
    # token-mean: (-1.1 - 1.2 + 0.8 + 3) / 4 = 0.375
    assert_close(loss, torch.tensor(0.375))
    assert metrics["clipfrac"] == pytest.approx(0.5)
    assert metrics["dual_clip_frac"] == pytest.approx(0.25)
    # mean(old - logp) = -log(1.1 * 1.5 * 0.5 * 5.0) / 4 = -log(4.125) / 4
    assert metrics["approx_kl"] == pytest.approx(-math.log(4.125) / 4, rel=1e-5)
    # only token 0 is on its unclipped branch: d/dlogp (-A*r)/4 = -1.1/4
    loss.backward()
    assert_close(logp.grad, t([[-0.275, 0, 0, 0, 0]]))


def test_ppo_without_dual_clip_and_asymmetric_clip():
    loss, metrics = ppo_clip_loss(PPO_LOGP, PPO_OLD, PPO_ADV, PPO_MASK, dual_clip=None)
    assert_close(loss, torch.tensor(0.875))  # (-1.1 - 1.2 + 0.8 + 5.0) / 4
    assert metrics["dual_clip_frac"] == 0.0
    loss, _ = ppo_clip_loss(PPO_LOGP, PPO_OLD, PPO_ADV, PPO_MASK, clip_high=0.28)
    assert_close(loss, torch.tensor(0.355))  # token 1 now -1.28: (-1.1 - 1.28 + 0.8 + 3) / 4
    with pytest.raises(ValueError, match="dual_clip"):
        ppo_clip_loss(PPO_LOGP, PPO_OLD, PPO_ADV, PPO_MASK, dual_clip=1.0)


def test_gspo_sequence_ratio_and_clip():
    # row 0: log-ratios ln 1.1, ln 1.5, ln 0.5 (token 3 masked out) -> s = (1.1 * 1.5 * 0.5)^(1/3) = 0.825^(1/3)
    # row 1: log-ratios ln 2, ln 2 -> s = 2
    logp = torch.log(t([[1.1, 1.5, 0.5, 9.0], [2.0, 2.0, 1.0, 1.0]])).requires_grad_()
    old, mask = torch.zeros(2, 4), t([[1, 1, 1, 0], [1, 1, 0, 0]])
    adv = t([[1.0, 1.0, 1.0, 1.0], [-1.0, -1.0, 0, 0]])
    s0 = 0.825 ** (1 / 3)  # 0.937909: inside [0.8, 1.2]
    loss, metrics = get_policy_loss("gspo")(logp, old, adv, mask, clip_low=0.2, clip_high=0.2, agg="seq-mean-token-mean")
    # row 0: max(-s0, -clip(s0)) = -s0 on each token; row 1: A = -1, max(2, 1.2) = 2 (unclipped, no dual clip)
    assert_close(loss, torch.tensor((-s0 + 2.0) / 2))
    assert metrics["clipfrac"] == 0.0
    # gradient: row 0 -A * s0 * d(logp_t)/(2 seqs * 3 tokens); row 1: -A * 2 / (2 * 2)
    loss.backward()
    assert_close(logp.grad, t([[-s0 / 6] * 3 + [0], [0.5, 0.5, 0, 0]]))
    # asymmetric range [0.8, 1.9]: row 1 is clipped at 1.9 on its negative advantage side -> max(2, 1.9) = 2 still;
    # with A = +1 instead, max(-2, -1.9) = -1.9 and no gradient
    logp = logp.detach().requires_grad_()
    loss, metrics = get_policy_loss("gspo")(logp, old, adv.abs(), mask, clip_low=0.2, clip_high=0.9, agg="seq-mean-token-mean")
    assert_close(loss, torch.tensor((-s0 - 1.9) / 2))
    assert metrics["clipfrac"] == pytest.approx(2 / 5)
    loss.backward()
    assert_close(logp.grad[1], torch.zeros(4))


def test_vanilla_pg_loss():
    loss, metrics = vanilla_pg_loss(PPO_LOGP, PPO_OLD, PPO_ADV, PPO_MASK)
    assert_close(loss, torch.tensor(0.725))  # (-1.1 - 1.5 + 0.5 + 5.0) / 4
    assert set(metrics) == {"approx_kl"}


# ---------------------------------------------------------------- KL, entropy, log-probs, value


def test_kl_penalty():
    logp, ref = torch.log(t([0.5, 0.25])), torch.log(t([0.25, 0.5]))
    ln2 = math.log(2)
    # k1 = logp - ref = +-ln 2
    assert_close(kl_penalty(logp, ref, "k1"), t([ln2, -ln2]))
    # k2 = 0.5 * (ln 2)^2 = 0.240227 for both
    assert_close(kl_penalty(logp, ref, "k2"), t([0.5 * ln2**2] * 2))
    # k3 = exp(ref - logp) - (ref - logp) - 1: 0.5 + ln 2 - 1 = 0.193147;  2 - ln 2 - 1 = 0.306853
    assert_close(kl_penalty(logp, ref, "k3"), t([0.193147, 0.306853]))
    with pytest.raises(ValueError, match="'k4'"):
        kl_penalty(logp, ref, "k4")


def test_entropy_from_logits():
    # exp(100) overflows float32, so the last row checks the logsumexp form
    logits = t([[[0, 0], [0, math.log(3)], [100, 100]]])
    # uniform over 2: ln 2; p = (1/4, 3/4): 0.25*ln 4 + 0.75*ln(4/3) = 0.346574 + 0.215762
    assert_close(entropy_from_logits(logits), t([[math.log(2), 0.562335, math.log(2)]]))


def test_logprobs_from_logits():
    logits = t([[[0, math.log(3)], [0, math.log(3)], [100, 100]]])  # exp(100) overflows float32
    labels = torch.tensor([[1, 0, 0]])
    # p = (1/4, 3/4): ln 0.75, ln 0.25; equal logits: ln 0.5
    expected = t([[math.log(0.75), math.log(0.25), math.log(0.5)]])
    assert_close(logprobs_from_logits(logits, labels), expected)


def test_value_loss():
    values, old, returns = t([[1.0, 0.5, 3.0]]), t([[0.5, 0.5, 2.5]]), t([[2.0, 0.0, 2.0]])
    loss, metrics = value_loss(values, old, returns, torch.ones(1, 3))
    # v_clip = old + clamp(v - old, -0.2, 0.2) = 0.7, 0.5, 2.7
    # 0: (1-2)^2 = 1,  (0.7-2)^2 = 1.69 -> 1.69 (clipped one larger)
    # 1: 0.25, 0.25                     -> 0.25
    # 2: (3-2)^2 = 1,  (2.7-2)^2 = 0.49 -> 1.0
    # 0.5 * (1.69 + 0.25 + 1.0) / 3 = 0.49
    assert_close(loss, torch.tensor(0.49))
    assert metrics["vf_clipfrac"] == pytest.approx(1 / 3)
