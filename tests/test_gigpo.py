"""GiGPO (Feng et al. 2025, arXiv:2505.10978): the environment's state keys reach the batch as anchor
ids, and the estimator gives each step its episode advantage + w · its step advantage within the
anchor group, by hand, against verl-agent's formulas, and the same for step rows as for one
prefix-chain row (DESIGN.md contract 12)."""

import random
from collections import defaultdict

import pytest
import torch
from torch.testing import assert_close

from agent_r1.algorithms import AdvantageInputs, get_advantage
from agent_r1.context import ContextManager
from agent_r1.envs import ToolEnv
from agent_r1.rollout import SamplingParams, ScriptedEngine, run_episodes
from agent_r1.trajectory import Step, Trajectory, collate, from_frame, to_frame, to_sequences

P = [11, 12, 13]


def episode(group: int, keys: list, rewards: list[float], final: float, window: bool = False) -> Trajectory:
    """One action of two tokens per turn (observation [90 + k] after turn k), state ``keys[k]`` at turn k.
    ``window``: the context keeps the prompt and the last turn only (not a prefix chain from turn 3 on)."""
    steps, history = [], []
    for k, (key, r) in enumerate(zip(keys, rewards)):
        context = P + (history[-1] if window and history else [x for turn in history for x in turn])
        steps.append(Step(list(context), [20 + k, 40 + group], [-0.5, -0.5], reward=r, state_key=key))
        history.append([20 + k, 40 + group, 90 + k])
    return Trajectory(task_id=f"t{group}", group_id=group, steps=steps, final_reward=final)


def gigpo(trajs: list[Trajectory], gamma: float = 1.0, **settings):
    b = collate([s for i, t in enumerate(trajs) for s in to_sequences(t, i)], 0)
    inp = AdvantageInputs(token_rewards=b.token_rewards, mask=b.action_mask, group_ids=b.group_ids,
                          step_ids=b.step_ids, episode_ids=b.episode_ids, anchor_ids=b.anchor_ids, gamma=gamma)
    return b, get_advantage("gigpo")(inp, **settings)[0]


def per_step(b, adv, e: int) -> list[float]:
    """Episode e's advantage at each of its steps (every action token of a step gets the same)."""
    out = {}
    for row in torch.nonzero(b.episode_ids == e).flatten().tolist():
        on = b.action_mask[row].bool()
        for k in b.step_ids[row][on].unique().tolist():
            vals = adv[row][on & (b.step_ids[row] == k)]
            assert torch.all(vals == vals[0])
            out[k] = float(vals[0])
    return [out[k] for k in sorted(out)]


def test_two_episodes_meet_the_same_state_one_succeeds_by_hand():
    # both start in "hall" and reach "kitchen"; the first then wins (final 1), the second loses (0)
    won = episode(0, ["hall", "kitchen", "chest"], [0, 0, 0], 1.0)
    lost = episode(0, ["hall", "kitchen", "cellar"], [0, 0, 0], 0.0)
    b, adv = gigpo([won, lost], gamma=0.5, step_advantage_weight=0.5)
    # episode advantage: scores 1, 0 -> mean 0.5, std sqrt(0.5) = 0.707107 -> +-0.707107 (eps 1e-6 aside)
    # returns-to-go (gamma 0.5, per step): won 0.25, 0.5, 1; lost 0, 0, 0
    # hall {0.25, 0}: +-0.125 / std 0.176777 = +-0.707107; kitchen {0.5, 0}: +-0.707107; chest, cellar alone: 0
    e, s = 0.707107, 0.5 * 0.707107
    assert per_step(b, adv, 0) == pytest.approx([e + s, e + s, e], abs=1e-5)
    assert per_step(b, adv, 1) == pytest.approx([-e - s, -e - s, -e], abs=1e-5)
    # norm: mean (no std): episode +-0.5; step hall +-0.125, kitchen +-0.25, times w 0.5
    b, adv = gigpo([won, lost], gamma=0.5, step_advantage_weight=0.5, norm="mean")
    assert per_step(b, adv, 0) == pytest.approx([0.5 + 0.0625, 0.5 + 0.125, 0.5])
    assert per_step(b, adv, 1) == pytest.approx([-0.5 - 0.0625, -0.5 - 0.125, -0.5])


def test_anchor_groups_stay_within_a_task_group_and_need_a_key():
    # the same key in another task group is another state; a step without a key is alone
    trajs = [episode(0, ["s", None], [0, 0], 1.0), episode(0, ["s", None], [0, 0], 0.0),
             episode(1, ["s"], [0], 1.0), episode(1, ["t"], [0], 1.0)]
    b, adv = gigpo(trajs, step_advantage_weight=1.0, norm="mean")
    assert per_step(b, adv, 0) == pytest.approx([0.5 + 0.5, 0.5])  # "s" shared in group 0; step 1 has no key
    assert per_step(b, adv, 2) == per_step(b, adv, 3) == [0.0]  # group 1: equal scores, anchors alone


def test_weight_zero_is_grpo():
    trajs = [episode(0, ["a", "b"], [0.5, 0], 1.0), episode(0, ["a", "c"], [0, 0.25], 0.0),
             episode(0, ["a"], [0], 1.0)]
    b, adv = gigpo(trajs, step_advantage_weight=0.0)
    inp = AdvantageInputs(token_rewards=b.token_rewards, mask=b.action_mask, group_ids=b.group_ids,
                          step_ids=b.step_ids, episode_ids=b.episode_ids)
    assert_close(adv, get_advantage("grpo")(inp)[0])
    with pytest.raises(ValueError, match="norm"):
        gigpo(trajs, norm="max")


def test_step_rows_get_the_prefix_chain_advantages():
    keys = [["a", "b", "c", "d"], ["a", "b", "x", "d"], ["a", "y"], ["z", "b", "c"]]
    rewards = [[0.5, 0, -0.25, 0.125], [0, 0.25, 0, 0], [0, 1.0], [0.25, 0, 0]]
    finals = [1.0, 0.0, 1.0, -1.0]
    chain = [episode(0, k, r, f) for k, r, f in zip(keys, rewards, finals)]
    rows = [episode(0, k, r, f, window=True) for k, r, f in zip(keys, rewards, finals)]
    assert len(to_sequences(rows[0])) == 4 and len(to_sequences(chain[0])) == 1
    b1, a1 = gigpo(chain, gamma=0.8)
    b2, a2 = gigpo(rows, gamma=0.8)
    for e in range(4):
        assert per_step(b2, a2, e) == pytest.approx(per_step(b1, a1, e), abs=1e-6)
    assert len(set(per_step(b1, a1, 0))) > 1  # steps differ: the step advantage is there


# ---------------------------------------------------------------- verl-agent's formulas
def verl_agent_gigpo(trajs: list[Trajectory], gamma: float, w: float, std: bool, eps: float = 1e-6) -> list[list[float]]:
    """GiGPO as verl-agent's gigpo/core_gigpo.py computes it, on one row per step: episode advantage
    (episode_norm_reward, statistics across trajectories) + w * step advantage (step_norm_reward over
    build_step_group's exact-match anchor groups of each task group, on compute_step_discounted_returns).
    Written out here from those formulas, over plain lists."""
    scores = [t.total_reward for t in trajs]
    by_group = defaultdict(list)
    for t, s in zip(trajs, scores):
        by_group[t.group_id].append(s)

    def norm(x, xs):
        mean = sum(xs) / len(xs)
        if not std:
            return x - mean
        sd = torch.tensor(xs).std().item() if len(xs) > 1 else 1.0
        return (x - mean) / (sd + eps)

    returns = []
    for t in trajs:
        rs = [s.reward for s in t.steps]
        rs[-1] += t.final_reward
        g, out = 0.0, []
        for r in reversed(rs):
            g = r + gamma * g
            out.append(g)
        returns.append(out[::-1])
    clusters = defaultdict(list)
    for i, t in enumerate(trajs):
        for k, s in enumerate(t.steps):
            clusters[(t.group_id, s.state_key)].append(returns[i][k])
    return [[norm(scores[i], by_group[t.group_id]) + w * norm(returns[i][k], clusters[(t.group_id, s.state_key)])
             for k, s in enumerate(t.steps)] for i, t in enumerate(trajs)]


@pytest.mark.parametrize("std", [True, False])
def test_parity_with_verl_agent_on_a_random_batch(std):
    rng = random.Random(7)
    trajs = []
    for g in range(3):
        for _ in range(4):
            n = rng.randint(1, 5)
            keys = [f"room{rng.randint(0, 2)}-{k // 2}" for k in range(n)]
            trajs.append(episode(g, keys, [rng.choice([0.0, 0.5, -0.25]) for _ in range(n)], rng.choice([0.0, 1.0]),
                                 window=rng.random() < 0.5))
    gamma, w = 0.9, 0.7
    b, adv = gigpo(trajs, gamma=gamma, step_advantage_weight=w, norm="std" if std else "mean")
    want = verl_agent_gigpo(trajs, gamma, w, std)
    for e in range(len(trajs)):
        assert per_step(b, adv, e) == pytest.approx(want[e], abs=1e-5)


# ---------------------------------------------------------------- state keys from the environment
class Rooms(ToolEnv):
    """A room per turn: its state key is the room the turn starts in."""

    def reset(self, task):
        self.room = "hall"
        return super().reset(task)

    def state_key(self):
        return self.room

    def step(self, action_text, context_tokens=None):
        res = super().step(action_text, context_tokens)
        self.room = "kitchen"
        return res


def test_the_rollout_records_the_state_each_step_starts_from(tok):
    engine = ScriptedEngine(tok, ["go east", "look", "<answer>x</answer>"])
    trajs = run_episodes(engine, lambda: Rooms([], max_turns=3), [{"id": "q", "question": "where?"}],
                         ContextManager(tok), SamplingParams())
    assert [s.state_key for s in trajs[0].steps] == ["hall", "kitchen", "kitchen"]
    again = from_frame(to_frame(trajs))  # the keys are stored with the trajectory
    assert [s.state_key for s in again[0].steps] == ["hall", "kitchen", "kitchen"]
    old = to_frame(trajs).drop(columns="state_key")  # a file written before state keys
    assert [s.state_key for s in from_frame(old)[0].steps] == [None] * 3
    assert ToolEnv([]).state_key() is None


def test_textworld_state_key_is_its_observation_whitespace_collapsed():
    from agent_r1.envs.text_game import TextWorldEnv

    env = TextWorldEnv.__new__(TextWorldEnv)  # no game process: the key is read from the state alone
    env.engine, env.show_admissible, env.state = None, True, {"feedback": "-= Hall =-\nYou are in   a hall.\n\n>", "admissible": ["go east", "look"]}
    assert env.state_key() == "-= Hall =- You are in a hall. Admissible commands: go east, look"


def test_gigpo_methods_by_name():
    from agent_r1.config import RLConfig, parse_method

    assert parse_method("gigpo_outcome") == {"algorithm": "gigpo", "loss_mask": True, "adv_mask": True,
                                             "process_rewards": False, "demos": None}
    assert RLConfig(**parse_method("gigpo")).method == "gigpo"


def test_the_driver_passes_the_state_keys_to_gigpo():
    from types import SimpleNamespace

    from agent_r1.config import RLConfig
    from agent_r1.pipeline.rl_driver import build_train_batch

    won = episode(0, ["hall", "kitchen", "chest"], [0, 0, 0], 1.0)
    lost = episode(0, ["hall", "kitchen", "cellar"], [0, 0, 0], 0.0)
    learner = SimpleNamespace(critic=None, single_step=True, reference=None)
    cfg = RLConfig(algorithm="gigpo", gamma=0.5, advantage_settings={"step_advantage_weight": 0.5})
    b = build_train_batch(learner, [won, lost], cfg, 0)
    e, s = 0.707107, 0.5 * 0.707107  # as in the hand-computed case above
    assert per_step(b, b.advantages, 0) == pytest.approx([e + s, e + s, e], abs=1e-5)
    assert b.info == {"rollout/shared_state_steps": pytest.approx(4 / 6)}  # hall and kitchen, twice each
    keyless = [episode(0, [None], [0], 1.0), episode(0, [None], [0], 0.0)]
    assert build_train_batch(learner, keyless, cfg, 0).info == {}
