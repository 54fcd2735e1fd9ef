"""The levers that are off by default: DAPO's dynamic sampling (filter) and overlong filtering in the
batch, and the adaptive task curriculum (its draws, its metrics, its resumable state)."""

import os
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
    assert kept.loss_mask.sum(1).tolist() == [1, 1, 0, 0, 0, 0]  # groups 1 and 2 have no signal
    assert torch.equal(kept.action_mask, plain.action_mask)
    assert kept.info == {"dapo/zero_variance_groups": pytest.approx(2 / 3)}
    # group 0's advantages are unchanged: scores 1, 0 -> +-1/sqrt(0.5) (eps aside) on its one action token
    assert_close(kept.advantages, plain.advantages)
    assert_close(kept.advantages.sum(1)[:2], torch.tensor([0.707106, -0.707106]), atol=1e-5, rtol=0)
    # a batch of such groups alone is trained on whole
    flat = build_train_batch(LEARNER, trajs[2:], RLConfig(dynamic_sampling=True), PAD)
    assert flat.loss_mask.sum() == 4 and flat.info == {"dapo/zero_variance_groups": 1.0}
    with pytest.raises(ConfigError, match="rl.dynamic_sampling: .*needs group_size >= 2, got 1"):
        load_config("tiny", "pipelines.yaml", parse_overrides(["rl.dynamic_sampling=true", "rl.group_size=1"]))


@pytest.mark.parametrize("overrides,estimator", [
    (["rl.algorithm=reinforce_pp"], "reinforce_pp"), (["rl.algorithm=gae"], "gae"),
    (["rl.algorithm=gigpo"], "gigpo"), (["rl.algorithm=gigpo", "rl.process_rewards=false", "rl.gamma=0.9"], "gigpo"),
    (["methods=[grpo, reinforce_pp_baseline]"], "reinforce_pp_baseline")])
def test_dynamic_sampling_is_refused_where_equal_rewards_keep_a_signal(overrides, estimator):
    """Whitening over the batch, a critic, or gigpo's step returns (with step rewards or gamma < 1) give a group
    whose episodes all got the same reward non-zero advantages: one line names the setting and the estimator."""
    with pytest.raises(ConfigError) as e:
        load_config("tiny", "pipelines.yaml", parse_overrides(["rl.dynamic_sampling=true", *overrides]))
    message = str(e.value)
    assert "\n" not in message and message.startswith("invalid config for pipeline 'tiny' (pipelines.yaml): "
                                                      f"rl.dynamic_sampling: estimator {estimator!r} gives a group "
                                                      "whose episodes all got the same reward non-zero advantages"), message
    for ok in (["rl.algorithm=grpo"], ["rl.algorithm=rloo"], ["methods=[gigpo_outcome, grpo]"]):
        assert load_config("tiny", "pipelines.yaml", parse_overrides(["rl.dynamic_sampling=true", *ok])).rl.dynamic_sampling


# One update with dynamic sampling on this process's share of four groups of two episodes: groups 0 and 1 (every
# reward equal) on rank 0, groups 2 (a signal) and 3 (equal) on rank 1, all four in one process. The entropy bonus
# gives every row a gradient, so a group trained or left out changes the step. Rank 0 saves the weights' change.
DYNAMIC_RANKS = """
import json, sys
import torch
from transformers import AutoModelForCausalLM, Qwen2Config
from agent_r1.config import RLConfig
from agent_r1.learner import Learner, LearnerConfig
from agent_r1.learner.distributed import init_distributed, rank, world_size
from agent_r1.pipeline.rl_driver import build_train_batch
from agent_r1.trajectory import Step, Trajectory

init_distributed()
torch.manual_seed(0)
model = AutoModelForCausalLM.from_config(Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64,
    num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True))
before = {k: v.clone() for k, v in model.state_dict().items()}
learner = Learner(model, LearnerConfig(lr=1e-3, entropy_coef=0.01), precision="fp32")

def episode(group, j, final):
    steps = [Step([1, 2, 3 + group], [10 + 4 * group + j + k for k in range(2 + j)], [-1.0] * (2 + j))]
    return Trajectory(f"t{group}", group, steps, final_reward=final)

finals = {0: (1.0, 1.0), 1: (0.0, 0.0), 2: (1.0, 0.0), 3: (0.5, 0.5)}
shares = {1: [0, 1, 2, 3], 2: [[0, 1], [2, 3]][rank()]}[world_size()]
trajs = [episode(g, j, finals[g][j]) for g in shares for j in range(2)]
batch = build_train_batch(learner, trajs, RLConfig(dynamic_sampling=sys.argv[2] == "on"), 0)
stats = learner.update(batch, torch.Generator().manual_seed(0))
if rank() == 0:
    torch.save({k: v - before[k] for k, v in learner.model.state_dict().items()}, sys.argv[1] + ".pt")
    with open(sys.argv[1] + ".json", "w") as f:
        json.dump(batch.info | {"live_share": stats["update/live_share"]}, f)
"""


@pytest.mark.slow  # three processes of torch + DeepSpeed: ~30 s on two busy cores
@pytest.mark.timeout(400)
def test_two_ranks_with_dynamic_sampling_take_the_step_one_process_takes(tmp_path):
    """Dynamic sampling decides on every rank's counts: rank 0, whose groups all got equal rewards, leaves
    them out because rank 1 has a group with a signal, as one process does (deciding per rank, it trained
    them whole). The step equals one process's to float32 rounding, and differs from the step that trains
    every group."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    from agent_r1.ports import free_port

    root = Path(__file__).resolve().parents[1]
    base = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK",
                                                            "WORLD_SIZE")}
    base |= {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(root), "TORCH_EXTENSIONS_DIR": str(tmp_path / "ext")}
    ranks = base | {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": "2"}
    runs = [("two", "on", ranks | {"RANK": str(r), "LOCAL_RANK": str(r)}) for r in (0, 1)]
    runs += [("one", "on", base), ("all", "off", base)]
    procs = [subprocess.Popen([sys.executable, "-c", DYNAMIC_RANKS, str(tmp_path / name), mode], cwd=root, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for name, mode, env in runs]
    outs = [p.communicate(timeout=360)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(o[-3000:] for o in outs)
    two, one, every = (torch.load(tmp_path / f"{n}.pt") for n in ("two", "one", "all"))
    info = {n: json.loads((tmp_path / f"{n}.json").read_text()) for n in ("two", "one")}
    assert info["two"]["dapo/zero_variance_groups"] == info["one"]["dapo/zero_variance_groups"] == 0.75
    size = max(float(d.abs().max()) for d in one.values())
    assert size > 1e-4  # the step moved the weights
    gap, other = (max(float((x[k] - one[k]).abs().max()) for k in one) for x in (two, every))
    print(f"step: max |change| {size:.2e}; two ranks - one process {gap:.2e}; every group trained - one process {other:.2e}")
    assert gap <= 1e-3 * size
    assert other > 0.1 * size


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


# ---------------------------------------------------------------- GSPO
def test_gspo_settings_in_force_are_the_runs_mlflow_params_and_sft_keeps_its_own(tmp_path):
    """``rl.learner.policy_loss=gspo`` alone: the run's MLflow params show the clip range and aggregation GSPO
    trains with; SFT and the control keep their token mean."""
    from agent_r1.pipeline.record import Recorder
    from agent_r1.pipeline.state import sft_learner_config
    from agent_r1.tracking import Tracker

    def cfg(*overrides):
        return load_config("tiny", "pipelines.yaml", parse_overrides([f"output_dir={tmp_path / 'out'}",
                                                                      "rl.learner.policy_loss=gspo", *overrides]))

    tracker = Tracker(f"sqlite:///{tmp_path / 'mlflow.db'}", project_dir=tmp_path)
    params = tracker.run_info(Recorder(cfg(), tracker).open())["params"]
    assert {k: params[f"rl.learner.{k}"] for k in ("policy_loss", "clip_low", "clip_high", "loss_agg")} == {
        "policy_loss": "gspo", "clip_low": "0.0003", "clip_high": "0.0004", "loss_agg": "seq-mean-token-mean"}
    assert sft_learner_config(cfg()).loss_agg == "token-mean"
    mine = cfg("rl.learner.clip_low=0.1", "rl.learner.loss_agg=token-mean").rl.learner
    assert (mine.clip_low, mine.clip_high, mine.loss_agg) == (0.1, 4e-4, "token-mean")


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
