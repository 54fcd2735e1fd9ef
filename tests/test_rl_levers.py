"""The levers that are off by default: DAPO's dynamic sampling (filter) and overlong filtering in the
batch, and the adaptive task curriculum (its draws, its metrics, its resumable state)."""

from types import SimpleNamespace

import pytest
import torch
from torch.testing import assert_close

from agent_r1.config import ConfigError, CurriculumConfig, RLConfig, load_config, parse_overrides
from agent_r1.context import ContextManager
from agent_r1.envs import ToolEnv
from agent_r1.learner import Learner, LearnerConfig
from agent_r1.pipeline.curriculum import Curriculum
from agent_r1.pipeline.rl_driver import RLFiles, RLTrainer, build_train_batch
from agent_r1.rollout import HFEngine
from agent_r1.trajectory import Step, Trajectory

PAD = 0
LEARNER = SimpleNamespace(critic=None, single_step=True, reference=None)


def episode(group: int, final: float, stop: str = "answer", turns: int = 1) -> Trajectory:
    steps = [Step([11, 12] + [30 + j for j in range(k)], [30 + k], [-0.5], reward=0.0) for k in range(turns)]
    return Trajectory(task_id=f"t{group}", group_id=group, steps=steps, final_reward=final, stop_reason=stop)


# ---------------------------------------------------------------- DAPO
def test_dynamic_sampling_leaves_out_the_groups_whose_rewards_are_all_equal():
    trajs = [episode(0, 1.0), episode(0, 0.0), episode(1, 1.0), episode(1, 1.0), episode(2, 0.0), episode(2, 0.0)]
    plain = build_train_batch(LEARNER, trajs, RLConfig(), PAD)
    assert plain.group_ids.tolist() == [0, 0, 1, 1, 2, 2] and plain.info == {}
    kept = build_train_batch(LEARNER, trajs, RLConfig(dynamic_sampling=True), PAD)
    assert kept.group_ids.tolist() == [0, 0]  # groups 1 and 2 have no signal
    assert kept.info == {"dapo/zero_variance_groups": pytest.approx(2 / 3)}
    # group 0's advantages are unchanged: scores 1, 0 -> +-1/sqrt(0.5) (eps aside) on its one action token
    assert_close(kept.advantages, plain.advantages[:2])
    assert_close(kept.advantages.sum(1), torch.tensor([0.707106, -0.707106]), atol=1e-5, rtol=0)
    # a batch of such groups alone is trained on whole
    flat = build_train_batch(LEARNER, trajs[2:], RLConfig(dynamic_sampling=True), PAD)
    assert len(flat) == 4 and flat.info == {"dapo/zero_variance_groups": 1.0}
    with pytest.raises(ConfigError, match="rl.dynamic_sampling: .*needs group_size >= 2, got 1"):
        load_config("tiny", "pipelines.yaml", parse_overrides(["rl.dynamic_sampling=true", "rl.group_size=1",
                                                                 "rl.algorithm=reinforce_pp"]))


def test_overlong_filter_zeroes_the_loss_mask_of_cut_episodes_only():
    trajs = [episode(0, 1.0, "answer", 2), episode(0, 0.0, "token_budget", 2), episode(0, 0.0, "max_turns", 2)]
    plain = build_train_batch(LEARNER, trajs, RLConfig(), PAD)
    cut = build_train_batch(LEARNER, trajs, RLConfig(overlong_filter=["token_budget"]), PAD)
    assert plain.loss_mask.sum(1).tolist() == [2, 2, 2]
    assert cut.loss_mask.sum(1).tolist() == [2, 0, 2]
    assert torch.equal(cut.action_mask, plain.action_mask)  # the actions are what they were
    assert_close(cut.advantages, plain.advantages)  # its reward still counts in the group's baseline
    assert cut.info == {"dapo/overlong_episodes": pytest.approx(1 / 3)}
    both = build_train_batch(LEARNER, trajs, RLConfig(overlong_filter=["token_budget", "max_turns"]), PAD)
    assert both.loss_mask.sum(1).tolist() == [2, 0, 0]
    with pytest.raises(ConfigError, match="rl.overlong_filter"):
        load_config("tiny", "pipelines.yaml", parse_overrides(["rl.overlong_filter=[answer]"]))


# ---------------------------------------------------------------- the curriculum
def results(drawn: list[int], easy: set[int]) -> list[Trajectory]:
    """Two episodes of each drawn task: an easy task's both succeed, another's one of two does."""
    return [episode(g, 1.0 if task in easy or k == 0 else 0.0) for g, task in enumerate(drawn) for k in range(2)]


def test_tasks_solved_always_are_drawn_less_often():
    cur, g = Curriculum(8, CurriculumConfig(enabled=True, window=2, saturated_weight=0.1)), torch.Generator().manual_seed(0)
    easy = {0, 1, 2, 3}
    for _ in range(12):
        stats = cur.update(results(cur.draw(4, g), easy))
    assert {i for i in range(8) if cur.saturated(i)} == easy
    assert stats["curriculum/saturated_tasks"] == 0.5
    counts = torch.zeros(8)
    for _ in range(300):
        counts[cur.draw(2, g)] += 1
    assert counts[:4].sum() < 0.3 * counts[4:].sum()  # weight 0.1 against 1
    # saturated_drawn: the share of the last draw's tasks that were saturated when drawn
    cur.drawn = [0, 4]
    assert cur.update(results([0, 4], easy))["curriculum/saturated_drawn"] == 0.5
    # a task saturates only when its last `window` draws all succeeded, or all failed
    cur = Curriculum(2, CurriculumConfig(enabled=True, window=2))
    cur.drawn = [0, 1]
    cur.update([episode(0, 1.0), episode(0, 1.0), episode(1, 0.0), episode(1, 0.0)])
    assert not cur.saturated(0) and not cur.saturated(1)
    cur.update([episode(0, 1.0), episode(0, 1.0), episode(1, 1.0), episode(1, 1.0)])
    assert cur.saturated(0) and not cur.saturated(1)


def test_the_curriculum_refuses_rollouts_ahead():
    with pytest.raises(ConfigError, match="rl.curriculum: .*rl.max_staleness: 0"):
        load_config("tiny", "pipelines.yaml", parse_overrides(
            ["rl.curriculum.enabled=true", "rl.max_staleness=1", "rollout.engine=vllm"]))


class Half(ToolEnv):
    """One turn. An "easy" task always pays 1; another pays 1 to an episode whose turn has an odd number
    of characters: a reward of the episode's own (not of the order in which the rollout's threads start
    episodes, nor of how many episodes ran before in this process)."""

    def __init__(self):
        super().__init__([], max_turns=1)

    def final_reward(self, answer, action_text):
        return (1.0 if self.task["easy"] or len(action_text) % 2 else 0.0), {}


def test_a_resumed_run_draws_what_the_uninterrupted_one_draws(tok, make_model, tmp_path):
    tasks = [{"id": str(i), "prompt": "go", "easy": i < 3} for i in range(6)]
    cfg = RLConfig(group_size=2, tasks_per_iteration=2, checkpoint_every=2,
                   curriculum=CurriculumConfig(enabled=True, window=1, saturated_weight=0.05))
    files = RLFiles(tmp_path / "agent", tmp_path / "history.json", tmp_path / "state", tmp_path / "rollouts", "fp")

    def trainer():
        learner = Learner(make_model(seed=0), LearnerConfig(), precision="fp32")
        return RLTrainer(learner, HFEngine(learner.model, tok, precision="fp32"), Half, tasks, ContextManager(tok), cfg,
                         max_new_tokens=4, max_context_tokens=256, seed=0, files=files)

    first = trainer()
    first.step(), first.step()  # the state is saved after iteration 2
    saved = first.curriculum.state()
    assert any(first.curriculum.saturated(i) for i in range(6))
    stats = first.step()
    assert 0 <= stats["curriculum/saturated_drawn"] <= 1 and "curriculum/saturated_tasks" in stats
    resumed = trainer()
    assert resumed.iteration == 2 and resumed.curriculum.state() == saved
    resumed.step()
    assert resumed.batch_tasks == first.batch_tasks and resumed.curriculum.state() == first.curriculum.state()
