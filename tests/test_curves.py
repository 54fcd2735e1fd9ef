"""Held-out learning curves (eval.every), the validation split they are drawn on, and rejection-sampling
fine-tuning (method rft) in the RL loop."""

import hashlib
import json
from pathlib import Path

import pandas as pd
import pytest
import torch

from agent_r1.config import RLConfig
from agent_r1.data.code_tasks import CodeTaskConfig, generate_code_tasks
from agent_r1.data.synthetic import WorldConfig, generate
from agent_r1.evaluate import curve_markdown
from agent_r1.learner import Learner, LearnerConfig
from agent_r1.pipeline.curves import area, summary
from agent_r1.pipeline.rl_driver import _rft_update, build_train_batch
from test_learner import batch_of, make_trajs, state

ROOT = Path(__file__).resolve().parents[1]


def _digest(obj) -> str:
    return hashlib.md5(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def test_the_code_val_split_is_disjoint_seeded_and_leaves_train_and_test_as_they_were():
    without = generate_code_tasks(CodeTaskConfig(seed=3, n_train=20, n_test=5))
    with_val = generate_code_tasks(CodeTaskConfig(seed=3, n_train=20, n_test=5, n_val=4))
    val = with_val.pop("val")
    assert _digest(with_val) == _digest(without)
    assert len(val) == 4 * 6 and val == generate_code_tasks(CodeTaskConfig(seed=3, n_train=20, n_test=5, n_val=4))["val"]
    questions = {t["question"] for split in without.values() for t in split}
    assert not {t["question"] for t in val} & questions


def test_the_synthetic_val_split_asks_about_a_world_of_its_own():
    cfg = dict(seed=1, n_films=60, n_directors=20, n_studios=6)
    without, world = generate(WorldConfig(**cfg)), generate(WorldConfig(**cfg, val_per_type=3))
    q = world.questions
    assert q[q.split != "val"].to_json() == without.questions.to_json()
    val = q[q.split == "val"]
    assert len(val) == 3 * q.qtype.nunique() and val.id.is_unique
    names = lambda df: {n for chain in df.search_chain for n in chain}  # noqa: E731
    assert not names(val) & names(q[q.split != "val"])
    assert names(val) <= set(world.val_corpus.title)  # its documents are searchable, apart
    pd.testing.assert_frame_equal(world.corpus, without.corpus)


def test_the_val_documents_leave_the_test_corpus_and_its_search_as_they_were(tmp_path):
    """The validation split's documents are searched by its own questions only: the prepared test
    corpus, and what a search finds in it for every test question, are the same with or without them."""
    from agent_r1.config import load_config, parse_overrides
    from agent_r1.data import load_corpus, load_split, task_records
    from agent_r1.run import make_tools, prepare_data
    from agent_r1.tools import run_tool

    found = {}
    for v in (0, 4):
        cfg = load_config("tiny", ROOT / "pipelines.yaml", parse_overrides([f"data.val_per_type={v}", "env.top_k=3",
                                                                             f"output_dir={tmp_path / str(v)}"]))
        data_dir = prepare_data(cfg)
        [search] = make_tools(cfg, data_dir, "test")
        queries = [c for t in task_records(load_split(data_dir, "test")) for c in t["search_chain"]][:60]
        found[v] = (load_corpus(data_dir), load_corpus(data_dir, "test"), [run_tool(search, {"query": q}).text for q in queries])
    pd.testing.assert_frame_equal(found[0][0], found[4][0])
    pd.testing.assert_frame_equal(found[0][1], found[4][0])
    assert found[0][2] == found[4][2]
    # the val questions search their own documents beside the corpus
    [val_search] = make_tools(cfg, data_dir, "val")
    val = task_records(load_split(data_dir, "val"))
    assert len(load_corpus(data_dir, "val")) > len(found[4][0])
    assert all(t["gold_titles"][0] in run_tool(val_search, {"query": t["search_chain"][0]}).text for t in val[:10])


def test_the_rft_update_is_an_sft_step_on_the_kept_episodes_action_tokens(tok, make_model):
    trajs = make_trajs(seed=5, n=6)  # final rewards 0, 1, 0, 1, ...: the odd ones are kept
    kept = [t for t in trajs if t.final_reward >= 1.0]
    rft = Learner(make_model(seed=2), LearnerConfig(lr=1e-3, kl_coef=0.1), precision="fp32")
    sft = Learner(make_model(seed=2), LearnerConfig(lr=1e-3), precision="fp32")
    batch = build_train_batch(rft, trajs, RLConfig(algorithm="rft", rft_threshold=1.0), tok.pad_token_id)
    rows_run = []  # the rows of every forward pass: the kept ones alone
    hook = rft.model.get_input_embeddings().register_forward_pre_hook(lambda m, args: rows_run.append(len(args[0])))
    stats = _rft_update(rft, batch)
    hook.remove()
    assert sum(rows_run) == int((batch.loss_mask.sum(1) > 0).sum()) < len(batch)
    reference = sft.sft_step(batch_of(kept, tok.pad_token_id))
    assert stats["rft/nll"] == pytest.approx(reference["sft_loss"], rel=1e-5)
    after, expected = state(rft.model), state(sft.model)
    assert any(not torch.equal(after[k], state(make_model(seed=2))[k]) for k in after)
    for k in after:
        torch.testing.assert_close(after[k], expected[k], rtol=1e-4, atol=1e-6)


def test_rft_with_nothing_kept_leaves_the_policy_alone(tok, make_model):
    learner = Learner(make_model(seed=2), LearnerConfig(lr=1e-3), precision="fp32")
    before = state(learner.model)
    batch = build_train_batch(learner, make_trajs(seed=5, n=4), RLConfig(algorithm="rft", rft_threshold=2.0),
                              tok.pad_token_id)
    assert _rft_update(learner, batch) == {"update/tokens": 0}
    assert all(torch.equal(v, state(learner.model)[k]) for k, v in before.items())


def test_the_curve_area_is_the_trapezoid_mean_and_baselines_are_flat():
    points = [{"episodes": 0, "em": 0.0}, {"episodes": 10, "em": 1.0}, {"episodes": 30, "em": 1.0}]
    assert area(points, "em") == pytest.approx((5 + 20) / 30)
    rows = summary({"grpo": points}, {"no_tool": 0.25}, "em", 20)
    assert rows["grpo"]["em_final"] == 1.0 and rows["no_tool"] == {"em_auc": 0.25, "em_final": 0.25, "points": 0, "n": 20}
    table = curve_markdown(rows, "curve_val")  # what `agent-r1 table` adds below the comparison
    assert "| curve_val em AUC | final |" in table and "| no_tool | 0.250 | 0.250 | 0 |" in table
    assert table.index("no_tool") < table.index("| grpo | 0.833 | 1.000 | 3 |")


def test_evaluating_a_split_the_data_lacks_is_one_clear_error_and_a_curve_on_it_is_off():
    from agent_r1.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="eval.split: val: the data has no val split .set data.val_per_type > 0"):
        load_config("code-tiny", ROOT / "pipelines.yaml", {"eval": {"split": "val"}, "data": {"val_per_type": 0}})
    assert load_config("code-tiny", ROOT / "pipelines.yaml", {"eval": {"every": 2}}).curve_every == 2
    assert load_config("hotpotqa", ROOT / "pipelines.yaml", {"eval": {"every": 2}}).curve_every == 0


@pytest.mark.slow
@pytest.mark.timeout(1800)  # code-tiny's stages, twice RL, the curves: a few minutes on a free 2-core machine
def test_code_tiny_with_eval_every_logs_heldout_points_and_draws_the_figure(tmp_path, monkeypatch):
    """What `agent-r1 train -p code-tiny -s eval.every=1` runs (with rft and grpo+prefix beside grpo),
    in this process: every stage of the `code` pipeline on the tiny model, the python tool
    sandboxed, the no_tool and base_tool_call baselines beside SFT and the RL methods; a held-out
    point per iteration 0..N of each method in MLflow, at step = episodes seen; the figure; the
    curve rows; the prefix method's episodes from the first tokens of the programs, one k per kind."""
    from mlflow.tracking import MlflowClient

    from agent_r1.config import load_config, parse_overrides
    from agent_r1.pipeline import run_all
    from agent_r1.tracking import Tracker

    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}"
    # smoke sizes: 8 SFT steps, RL iterations of 2 tasks x 2 episodes, 6 test (one per kind) and 2 curve problems
    run_all(load_config("code-tiny", ROOT / "pipelines.yaml", parse_overrides(
        ["eval.every=1", "methods=[grpo, rft, grpo+prefix]", "rl.demo_settings={unit: tokens, share_by: qtype}",
         "rl.demo_pool=all", "eval.curve_size=2", "sft.epochs=0.25", "data.test_per_type=1",
         "rl.tasks_per_iteration=2", "rl.group_size=2", f"output_dir={tmp_path / 'out'}"])), Tracker(uri=uri, project_dir=tmp_path))
    client = MlflowClient(uri)
    runs = {r.info.run_name: r for r in client.search_runs([e.experiment_id for e in client.search_experiments()])}
    iterations, group = 2, 2 * 2  # code-tiny: 2 iterations, here of 2 tasks x 2 episodes
    for method in ("grpo", "rft"):
        run_id = next(r.info.run_id for name, r in runs.items() if name and name.endswith(method))
        em = client.get_metric_history(run_id, "heldout/em")
        assert sorted(m.step for m in em) == [i * group for i in range(iterations + 1)]
        assert sorted(m.value for m in client.get_metric_history(run_id, "heldout/iteration")) == [0, 1, 2]
        assert len(client.get_metric_history(run_id, "heldout/wall_s")) == iterations + 1
        points = json.loads((tmp_path / "out" / "metrics" / "heldout" / f"{method}.json").read_text())
        assert [p["iteration"] for p in points] == [0, 1, 2]
    test = json.loads((tmp_path / "out" / "metrics" / "eval.json").read_text())["test"]
    assert set(test) == {"no_tool", "base_tool_call", "sft", "grpo", "rft", "grpo+prefix"}
    prefix = json.loads((tmp_path / "out" / "metrics" / "train" / "grpo+prefix.json").read_text())
    assert prefix[0]["demos/prefix_episodes"] > 0  # the tiny model fails every group: each gets prefixed episodes
    kinds = {k.rsplit("/", 1)[1] for h in prefix for k in h if k.startswith("demos/prefix_k/")}
    assert kinds and kinds <= {"arithmetic", "prime_sum", "divisible_count", "fibonacci", "collatz", "digit_sum"}
    assert test["no_tool"]["turns"] == 1.0 and test["no_tool"]["tool_calls"] == 0.0
    assert all(0.0 <= m["em"] <= 1.0 and "code_runs" in m for m in test.values())
    history = json.loads((tmp_path / "out" / "metrics" / "train" / "grpo.json").read_text())
    assert len(history) == 2 and "code_failures" in history[0]
    history = json.loads((tmp_path / "out" / "metrics" / "train" / "rft.json").read_text())
    assert all(0.0 <= h["rft/kept_fraction"] <= 1.0 for h in history)
    assert (tmp_path / "out" / "metrics" / "curves.png").stat().st_size > 0
    rows = json.loads((tmp_path / "out" / "metrics" / "eval.json").read_text())["curve_val"]
    assert {"grpo", "rft", "no_tool", "base_tool_call"} <= set(rows) and "em_auc" in rows["grpo"]
    evaluate = next(r.info.run_id for name, r in runs.items() if name and name.endswith("evaluate"))
    assert "curves.png" in {a.path.split("/")[-1] for a in client.list_artifacts(evaluate, "")} | {
        a.path.split("/")[-1] for a in client.list_artifacts(evaluate, "metrics")}


def test_a_resumed_run_keeps_its_held_out_points_and_takes_each_once(tok, make_model, tmp_path):
    from agent_r1.context import ContextManager
    from agent_r1.pipeline.rl_driver import RLFiles, RLTrainer
    from agent_r1.rollout import HFEngine
    from test_rl import TASKS, LetterEnv

    calls = []

    def heldout(progress, label):
        calls.append(label)
        return {"em": 0.1 * len(calls), "eval_s": 0.0}

    files = RLFiles(tmp_path / "rl", tmp_path / "history.json", tmp_path / "state", tmp_path / "rollouts", "fp",
                    tmp_path / "heldout.json")
    cfg = RLConfig(group_size=2, tasks_per_iteration=2, iterations=2, checkpoint_every=1)

    def trainer() -> RLTrainer:
        learner = Learner(make_model(seed=0), LearnerConfig(lr=1e-3), precision="fp32")
        return RLTrainer(learner, HFEngine(learner.model, tok, precision="fp32"), LetterEnv, TASKS, ContextManager(tok),
                         cfg, max_new_tokens=4, max_context_tokens=256, files=files, heldout=heldout, every=1)

    first = trainer()
    first.heldout_point()  # iteration 0, as run() takes it
    first.step()  # iteration 1: its point, then the resumable state; then the run is killed
    first.close()
    again = trainer()
    assert again.iteration == 1 and [p["iteration"] for p in again.curve] == [0, 1]
    again.run()
    points = json.loads(files.curve.read_text())
    assert [p["iteration"] for p in points] == [0, 1, 2] and len(calls) == 3
    assert [p["episodes"] for p in points] == [0, 4, 8] and points[2]["wall_s"] >= points[1]["wall_s"] > 0


def test_each_iteration_logs_the_held_out_points_share_of_the_rl_time_and_its_memory(tok, make_model):
    """time/heldout_share: the held-out points' seconds (eval_s) over those plus the iterations' so far;
    memory/released_gb, memory/rss_gb and memory/peak_rss_gb: what handing freed pages back released, then
    the process's resident memory and its largest."""
    from agent_r1.context import ContextManager
    from agent_r1.pipeline.rl_driver import RLTrainer
    from agent_r1.rollout import HFEngine
    from test_rl import TASKS, LetterEnv

    learner = Learner(make_model(seed=0), LearnerConfig(lr=1e-3), precision="fp32")
    trainer = RLTrainer(learner, HFEngine(learner.model, tok, precision="fp32"), LetterEnv, TASKS, ContextManager(tok),
                        RLConfig(group_size=2, tasks_per_iteration=2, iterations=3), max_new_tokens=4,
                        max_context_tokens=256, heldout=lambda progress, label: {"em": 0.0, "eval_s": 5.0}, every=2)
    trainer.run()
    points = [1, 2, 3]  # taken by the end of iteration 1, 2, 3: at 0 (the start), 2, 3 (the last)
    assert [p["iteration"] for p in trainer.curve] == [0, 2, 3]
    for i, h in enumerate(trainer.history):
        heldout_s = 5.0 * points[i]
        rl_s = sum(g["time/iteration_s"] for g in trainer.history[: i + 1])
        assert h["time/heldout_share"] == pytest.approx(heldout_s / (heldout_s + rl_s))
        assert 0.05 < h["memory/rss_gb"] < h["memory/peak_rss_gb"] + 0.01  # the kernel's peak can lag a little
        assert h["memory/released_gb"] >= 0


@pytest.mark.slow
def test_the_control_gets_points_on_the_same_tasks_at_rl_s_shares_of_its_time(tmp_path):
    from agent_r1.pipeline import stages
    from agent_r1.pipeline.control import control
    from agent_r1.pipeline.rl_driver import curve_path
    from agent_r1.pipeline.state import history_path
    from test_pipeline import tiny_cfg

    cfg = tiny_cfg(tmp_path, "sft.epochs=0.05", "eval.every=1", "data.val_per_type=1", "eval.curve_size=2")
    stages.prepare(cfg)
    stages.sft(cfg)
    rl = [{"iteration": i, "episodes": 8 * i, "wall_s": 0.5 * i, "em": 0.25} for i in range(3)]
    for path, data in ((curve_path(cfg, cfg.rl.method), rl),
                       (history_path(cfg, cfg.rl.method), [{"time/iteration_s": 0.5}, {"time/iteration_s": 0.5}])):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data))
    control(cfg)
    points = json.loads(curve_path(cfg, "sft_control").read_text())
    assert points[0] == rl[0]  # the SFT start, RL's iteration 0
    assert [(p["episodes"], p["wall_s"]) for p in points[1:]] == [(8, 0.5), (16, 1.0)]
    assert all(0.0 <= p["em"] <= 1.0 and p["eval_s"] > 0 for p in points[1:])
    # RL started from another model (rl.init_from): the control's start, the SFT checkpoint, is a point of its own
    control(tiny_cfg(tmp_path, "sft.epochs=0.05", "eval.every=1", "data.val_per_type=1", "eval.curve_size=2",
                     f"rl.init_from={tmp_path / 'elsewhere'}"))
    own = json.loads(curve_path(cfg, "sft_control").read_text())
    assert own[0] != rl[0] and (own[0]["iteration"], own[0]["episodes"], own[0]["wall_s"]) == (0, 0, 0.0)
    assert own[0]["eval_s"] > 0 and len(own) == 3
