"""Group baselines count episodes, not rows (DESIGN.md contract 12): an episode that is not one
prefix chain is one training row per step, and grpo, grpo_no_std, rloo and reinforce_pp_baseline
give it exactly what they give the same episode packed as one prefix-chain row. Episodes with
equal rewards get equal advantages, and a tied group gets exactly 0, whatever the layout."""

from types import SimpleNamespace

import pytest
import torch
from torch.testing import assert_close

from agent_r1.algorithms import AdvantageInputs, get_advantage
from agent_r1.config import RLConfig
from agent_r1.pipeline.rl_driver import build_train_batch
from agent_r1.trajectory import Step, Trajectory, collate, to_sequences

PAD = 0
GROUP_BASELINES = ["grpo", "grpo_no_std", "rloo", "reinforce_pp_baseline"]
P = [11, 12, 13]


def episode(group: int, actions: list[list[int]], rewards: list[float], final: float, window: bool) -> Trajectory:
    """Turns with `actions` (observation [90 + k] after turn k) and step `rewards`. Full history,
    or (`window`) contexts that keep the prompt and only the last turn: not a prefix chain."""
    steps, history = [], []
    for k, (a, r) in enumerate(zip(actions, rewards)):
        context = P + (history[-1] if window and history else [x for turn in history for x in turn])
        steps.append(Step(list(context), a, [-0.1 * (j + 1) for j in range(len(a))], reward=r))
        history.append(a + [90 + k])
    return Trajectory(task_id=f"t{group}", group_id=group, steps=steps, final_reward=final)


def batch_of(trajs: list[Trajectory]):
    return collate([s for i, t in enumerate(trajs) for s in to_sequences(t, i)], PAD)


def advantages(name: str, trajs: list[Trajectory], from_steps: bool = True):
    """The batch and `name`'s advantages; scores from the batch's step rewards, or (`from_steps` false)
    from its token rewards alone."""
    b = batch_of(trajs)
    inp = AdvantageInputs(token_rewards=b.token_rewards, mask=b.action_mask, group_ids=b.group_ids,
                          step_ids=b.step_ids, episode_ids=b.episode_ids,
                          step_rewards=b.step_rewards if from_steps else None)
    adv, _ = get_advantage(name)(inp)
    return b, adv


def per_step(b, adv, episode_id: int) -> dict[int, torch.Tensor]:
    """The advantages on each action token of one episode, by step: {step id: [tokens]}."""
    out = {}
    for row in torch.nonzero(b.episode_ids == episode_id).flatten().tolist():
        for k in b.step_ids[row][b.action_mask[row].bool()].unique().tolist():
            out[k] = adv[row][(b.step_ids[row] == k) & b.action_mask[row].bool()]
    return out


# the episode under test (index 0), two more of its group, and a group of two
X = dict(group=0, actions=[[21, 22], [41, 42, 43], [61], [71, 72]], rewards=[0.5, -0.25, 0.0, 0.125], final=1.0)
OTHERS = [
    episode(0, [[21], [45]], [0.0, 0.0], 1.0, window=False),
    episode(0, [[23, 24]], [0.25], -1.0, window=False),
    episode(1, [[25], [46]], [0.0, 0.5], 0.0, window=False),
    episode(1, [[26]], [0.0], 1.0, window=False),
]


def two_forms():
    chain = [episode(**X, window=False)] + OTHERS
    steps = [episode(**X, window=True)] + OTHERS
    assert len(to_sequences(chain[0])) == 1 and len(to_sequences(steps[0])) == 4
    return chain, steps


@pytest.mark.parametrize("from_steps", [True, False])
@pytest.mark.parametrize("name", GROUP_BASELINES)
def test_an_episode_as_step_rows_gets_its_prefix_chain_advantage(name, from_steps):
    chain, steps = two_forms()
    b1, a1 = advantages(name, chain, from_steps)
    b2, a2 = advantages(name, steps, from_steps)
    x1, x2 = per_step(b1, a1, 0), per_step(b2, a2, 0)
    assert sorted(x1) == sorted(x2) == [0, 1, 2, 3]
    for k in x1:
        assert_close(x2[k], x1[k], rtol=0, atol=1e-6)
    if name != "reinforce_pp_baseline":  # one advantage for the whole episode, not zero
        assert torch.cat(list(x2.values())).unique().numel() == 1 and x2[0][0] != 0


@pytest.mark.parametrize("from_steps", [True, False])
@pytest.mark.parametrize("name", GROUP_BASELINES)
def test_group_statistics_do_not_change_when_an_episode_is_cut_into_steps(name, from_steps):
    chain, steps = two_forms()
    b1, a1 = advantages(name, chain, from_steps)
    b2, a2 = advantages(name, steps, from_steps)
    for e in range(1, len(chain)):  # the other episodes, of both groups, are untouched
        assert_close(per_step(b2, a2, e), per_step(b1, a1, e), rtol=0, atol=1e-6)


def test_grpo_over_step_rows_by_hand():
    _, steps = two_forms()
    b, adv = advantages("grpo", steps)
    totals = torch.tensor([t.total_reward for t in steps[:3]], dtype=torch.float64)  # group 0: three episodes, six rows
    assert (b.group_ids == 0).sum() == 6
    want = (totals - totals.mean()) / (totals.std() + 1e-6)
    for e in range(3):
        got = torch.cat(list(per_step(b, adv, e).values()))
        assert_close(got, want[e].expand_as(got))
    # rloo: score minus the mean of the OTHER episodes' scores
    b, adv = advantages("rloo", steps)
    got = per_step(b, adv, 0)[3]
    assert_close(got, (totals[0] - totals[1:].mean()).expand_as(got))


def test_without_episode_ids_each_row_is_an_episode():
    _, steps = two_forms()
    b = batch_of(steps)
    kw = dict(token_rewards=b.token_rewards, mask=b.action_mask, group_ids=b.group_ids, step_ids=b.step_ids)
    rows = torch.arange(len(b))
    old, _ = get_advantage("grpo")(AdvantageInputs(**kw))
    own, _ = get_advantage("grpo")(AdvantageInputs(**kw, episode_ids=rows))
    assert torch.equal(old, own)
    assert not torch.allclose(old, advantages("grpo", steps)[1])  # rows, not episodes: the old baseline


def test_an_episode_across_groups_is_rejected():
    _, steps = two_forms()
    b = batch_of(steps)
    groups = b.group_ids.clone()
    groups[1] = 5  # the second step row of episode 0
    inp = AdvantageInputs(token_rewards=b.token_rewards, mask=b.action_mask, group_ids=groups,
                          step_ids=b.step_ids, episode_ids=b.episode_ids)
    with pytest.raises(ValueError, match="rows of an episode have different group ids"):
        get_advantage("grpo")(inp)


@pytest.mark.parametrize("name", GROUP_BASELINES)
def test_the_driver_gives_each_trajectory_an_episode(name):
    learner = SimpleNamespace(critic=None, single_step=True, reference=None)
    cfg = RLConfig(algorithm=name)
    chain, steps = two_forms()
    b1 = build_train_batch(learner, chain, cfg, PAD)
    b2 = build_train_batch(learner, steps, cfg, PAD)
    assert b2.episode_ids.tolist() == [0, 0, 0, 0, 1, 2, 3, 4]
    for e in range(len(chain)):
        assert_close(per_step(b2, b2.advantages, e), per_step(b1, b1.advantages, e), rtol=0, atol=1e-6)


def test_outcome_methods_train_on_the_final_reward_alone():
    """`<method>_outcome` (rl.process_rewards false): the step rewards leave the batch, the final stays."""
    from agent_r1.config import parse_method

    learner = SimpleNamespace(critic=None, single_step=True, reference=None)
    chain, _ = two_forms()
    with_steps = build_train_batch(learner, chain, RLConfig(algorithm="grpo"), PAD)
    outcome = build_train_batch(learner, chain, RLConfig(**parse_method("grpo_outcome")), PAD)
    finals = torch.tensor([t.final_reward for t in chain], dtype=torch.float64)
    assert_close(outcome.token_rewards.sum(1), finals)
    assert not torch.allclose(with_steps.token_rewards.sum(1), finals)
    assert chain[0].steps[0].reward == 0.5  # the episodes themselves keep their step rewards


# ------------------------------------------------------------------------------ ties stay ties
def tied(window: bool, actions: list[list[int]], **settings) -> Trajectory:
    """Step rewards 0.1, 0.2, 0.3 and final reward 0.7, with the state keys s0, s1, s2 (gigpo's anchors)."""
    t = episode(0, actions, [0.1, 0.2, 0.3], 0.7, window)
    for k, step in enumerate(t.steps):
        step.state_key = f"s{k}"
    return t


SHORT, LONG = [[21], [22], [23]], [[31 + j for j in range(8)], [41], [51 + j for j in range(9)]]  # 1,1,1 and 8,1,9 tokens
LAYOUTS = {"full history": (False, False), "cut": (True, True), "mixed": (False, True), "mixed, other way": (True, False)}
TIE_ESTIMATORS = [("grpo", {}), ("grpo_no_std", {}), ("rloo", {}), ("gigpo", {}), ("gigpo", {"norm": "mean"}),
                  ("gigpo", {"gamma": 0.9})]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name,settings", TIE_ESTIMATORS)
def test_equal_rewards_get_advantage_zero_in_every_layout(name, settings, layout):
    """Two episodes of one group with the same rewards: both get exactly 0 on every token, full history,
    cut into step rows, or one of each. (Summed in float32 over their full-history rows, their rewards
    differ by an ulp: the tie this keeps.)"""
    rows = [collate(to_sequences(tied(False, a)), PAD).token_rewards.float().sum(1).item() for a in (SHORT, LONG)]
    assert rows[0] != rows[1]
    settings = dict(settings)
    gamma = settings.pop("gamma", 1.0)
    learner = SimpleNamespace(critic=None, single_step=True, reference=None)
    cfg = RLConfig(algorithm=name, gamma=gamma, advantage_settings=settings)
    window_a, window_b = LAYOUTS[layout]
    b = build_train_batch(learner, [tied(window_a, SHORT), tied(window_b, LONG)], cfg, PAD)
    assert len(b) == 2 + 2 * window_a + 2 * window_b and b.action_mask.sum() == 3 + 18
    assert torch.equal(b.advantages, torch.zeros_like(b.advantages))


@pytest.mark.parametrize("name", ["grpo", "grpo_no_std", "rloo", "gigpo"])
def test_a_tied_group_gets_exactly_zero_where_its_mean_rounds(name):
    """Three scores of 0.1: their float64 mean is 0.10000000000000002, so score - mean would be -1.4e-17
    (and a std of 0 would leave it at -1.4e-11); the statistics are taken on score - the group's least."""
    trajs = [episode(0, [[21 + i]], [0.0], 0.1, window=False) for i in range(3)]
    assert sum([0.1] * 3) / 3 != 0.1
    _, adv = advantages(name, trajs)
    assert torch.equal(adv, torch.zeros_like(adv)) and adv.dtype == torch.float64


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name", ["reinforce_pp", "reinforce_pp_baseline"])
def test_equal_rewards_get_equal_advantages_step_by_step_under_batch_whitening(name, layout):
    """The batch-whitened estimators (gamma 1) give the two tied episodes one advantage per step, the
    same in both: the returns-to-go of a full-history row (float64 tokens) and of step rows are equal."""
    learner = SimpleNamespace(critic=None, single_step=True, reference=None)
    window_a, window_b = LAYOUTS[layout]
    b = build_train_batch(learner, [tied(window_a, SHORT), tied(window_b, LONG)], RLConfig(algorithm=name), PAD)
    a, other = per_step(b, b.advantages, 0), per_step(b, b.advantages, 1)
    for k in range(3):
        assert a[k].unique().numel() == 1 and torch.equal(other[k].unique(), a[k].unique()), (k, a[k], other[k])
