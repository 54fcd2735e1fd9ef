"""Imitation to its plateau (sft.plateau: early stopping on the validation curve, the best checkpoint
kept) and pass@k beside greedy in evaluation."""

import json

import pytest
import torch

from agent_r1.evaluate import comparison_markdown, pass_at_k, pass_at_k_by_hops
from agent_r1.pipeline import stages
from agent_r1.pipeline.record import StageLog
from agent_r1.sft import Plateau
from agent_r1.trajectory import Trajectory

from test_pipeline import tiny_cfg, weights


# ------------------------------------------------------------------------------ the plateau
def test_plateau_keeps_the_first_best_and_stops_patience_evaluations_after_it():
    p = Plateau(patience=2)
    assert p.add(10, 0.2) == (True, False)
    assert p.add(20, 0.5) == (True, False)
    assert p.add(30, 0.5) == (False, False)  # a tie is no improvement
    assert p.add(40, 0.4) == (False, True)  # two evaluations after the best
    assert p.best == {"step": 20, "score": 0.5}
    resumed = Plateau(2, p.points[:3])  # the points a resumable state keeps
    assert resumed.add(40, 0.6) == (True, False) and resumed.best["step"] == 40
    perfect = Plateau(3)
    assert perfect.add(10, 0.9, ceiling=1.0) == (True, False)
    assert perfect.add(20, 1.0, ceiling=1.0) == (True, True)  # nothing can beat it: no patience to wait out
    assert Plateau(3).add(10, 1.0) == (True, False)  # a metric with no ceiling (reward) waits


def test_sft_plateau_stops_after_its_patience_and_keeps_the_best_checkpoint(tmp_path, monkeypatch):
    """The real stage on the tiny model: the validation curve (em on 3 val tasks) is what it is; the
    record must name its argmax (the first of equal scores), training must have stopped exactly
    `patience` evaluations after it, the checkpoint must hold the weights of that evaluation (not the
    last), and the plateau must reach MLflow."""
    from agent_r1.tracking import Tracker

    every, patience, size = 2, 2, 3
    # em on 3 tasks improves at most 3 times, so patience ends the run well before max_epochs
    cfg = tiny_cfg(tmp_path / "out", "data.val_per_type=2", "sft.plateau.enabled=true",
                   f"sft.plateau.eval_every_steps={every}", f"sft.plateau.patience={patience}",
                   "sft.plateau.max_epochs=40", "sft.warmup_steps=2", f"eval.curve_size={size}")
    stages.prepare(cfg)
    seen = []  # the weights the model had at each evaluation
    real = stages.heldout_point

    def spy(agent, tasks, progress=None, label=""):
        seen.append({k: v.detach().clone() for k, v in agent.model.state_dict().items()})
        assert len(tasks) == size and all(t["id"] in val_ids for t in tasks)  # the validation split's tasks
        return real(agent, tasks, progress, label)

    import pandas as pd

    val_ids = set(pd.read_parquet(cfg.out / "data" / "val.parquet")["id"].astype(str))
    monkeypatch.setattr(stages, "heldout_point", spy)
    tracker = Tracker(f"sqlite:///{tmp_path / 'mlflow.db'}", project_dir=tmp_path)
    run_id = tracker.start_pipeline_run("plateau", {})
    out = stages.sft(cfg, StageLog(tracker, run_id))

    rec = json.loads((cfg.out / "metrics" / "sft_plateau.json").read_text())
    points = rec["points"]
    scores = [p["score"] for p in points]
    best = scores.index(max(scores))
    assert rec["best"] == points[best] and rec["metric"] == "em" and rec["split"] == "val"
    assert [p["step"] for p in points] == [every * (i + 1) for i in range(len(points))]
    assert len(points) - 1 - best == patience  # stopped exactly `patience` evaluations after the best
    assert rec["stopped_step"] == points[-1]["step"] == points[best]["step"] + patience * every
    assert len(seen) == len(points)
    kept = weights(out)
    for k, v in kept.items():
        torch.testing.assert_close(v, seen[best][k].to(v.dtype))
    assert any(not torch.equal(v, seen[-1][k].to(v.dtype)) for k, v in kept.items())  # not the last weights
    assert not (cfg.out / "state" / "sft_best").exists() and not (cfg.out / "state" / "sft").exists()

    info = tracker.run_info(run_id)
    assert info["metrics"]["sft_plateau/score"] == points[best]["score"]
    assert info["metrics"]["sft_plateau/step"] == points[best]["step"]
    assert info["metrics"]["sft_plateau/train_s"] == points[best]["train_s"] > 0
    assert info["params"]["sft_plateau_metric"] == "em"

    # a re-run under the same config skips the stage
    assert stages.sft(cfg) == out and len(seen) == len(points)


def test_a_killed_plateau_stage_resumes_with_its_evaluations(tmp_path, monkeypatch):
    """Killed right after its first resumable state (step 4, two evaluations in), the stage resumes
    there and ends with the evaluations, the stop and the weights of the run that was not killed."""
    flags = ["data.val_per_type=2", "sft.plateau.enabled=true", "sft.plateau.eval_every_steps=2",
             "sft.plateau.patience=2", "sft.plateau.max_epochs=40", "sft.warmup_steps=2", "eval.curve_size=3",
             "sft.checkpoint_every=4"]
    a, b = tiny_cfg(tmp_path / "a", *flags), tiny_cfg(tmp_path / "b", *flags)
    for cfg in (a, b):
        stages.prepare(cfg)
    stages.sft(a)

    class Killed(Exception):
        pass

    real = stages.sft_loop

    def dying_loop(*args, on_step=None, **kw):
        def wrapped(step, total, m):
            stop = on_step(step, total, m)
            if (b.out / "state" / "sft" / "meta.json").exists():
                raise Killed
            return stop
        return real(*args, on_step=wrapped, **kw)

    monkeypatch.setattr(stages, "sft_loop", dying_loop)
    with pytest.raises(Killed):
        stages.sft(b)
    monkeypatch.setattr(stages, "sft_loop", real)
    assert json.loads((b.out / "state" / "sft" / "meta.json").read_text())["step"] == 4
    stages.sft(b)
    ra, rb = (json.loads((c.out / "metrics" / "sft_plateau.json").read_text()) for c in (a, b))
    strip = lambda r: [(p["step"], p["score"]) for p in r["points"]]  # noqa: E731 (times differ)
    assert strip(ra) == strip(rb)
    assert ra["best"]["step"] == rb["best"]["step"] and ra["stopped_step"] == rb["stopped_step"]
    wa, wb = weights(a.out / "checkpoints" / "sft"), weights(b.out / "checkpoints" / "sft")
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=1e-5, atol=1e-6)


def test_plateau_is_chosen_on_the_validation_split(tmp_path):
    with pytest.raises(ValueError, match=r"sft.plateau: is chosen on the val split; eval.curve_split is 'test'"):
        tiny_cfg(tmp_path, "data.val_per_type=2", "sft.plateau.enabled=true", "eval.curve_split=test")
    with pytest.raises(ValueError, match=r"sft.plateau: is chosen on the val split, which the data has none of"):
        tiny_cfg(tmp_path, "sft.plateau.enabled=true", "data.val_per_type=0")


# ------------------------------------------------------------------------------ pass@k
def test_pass_at_k_is_the_unbiased_estimator():
    assert pass_at_k(5, 0, 1) == 0.0 and pass_at_k(5, 5, 3) == 1.0
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4)  # c / n
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)  # 1 - C(3,2)/C(5,2)
    assert pass_at_k(16, 1, 16) == 1.0 and pass_at_k(16, 1, 4) == pytest.approx(4 / 16)
    with pytest.raises(ValueError, match="k <= n"):
        pass_at_k(4, 1, 16)


def _episode(em: float) -> Trajectory:
    t = Trajectory(task_id="x", group_id=0)
    t.metric_aggs = {"em": "mean"}
    t.metrics = {"em": em}
    return t


def test_pass_at_k_by_hops_counts_each_task_s_rounds():
    tasks = [{"id": "a", "hops": 1}, {"id": "b", "hops": 2}]
    # 4 rounds of [a, b]: a solved in 1 of 4, b in 4 of 4
    trajs = [_episode(em) for round_ in [(1, 1), (0, 1), (0, 1), (0, 1)] for em in round_]
    out = pass_at_k_by_hops(trajs, tasks, [1, 2])
    assert out["1hop"] == {"pass@1": 0.25, "pass@2": 0.5, "pass_samples": 4}
    assert out["2hop"]["pass@1"] == 1.0 and out["all"]["pass@1"] == pytest.approx(0.625)


def test_evaluation_reports_pass_at_k_beside_greedy(tmp_path):
    cfg = tiny_cfg(tmp_path, "sft.epochs=0.05", "eval.pass_k=[1, 2]", "eval.max_per_hop=2", "eval.hops=[1, 2]")
    stages.prepare(cfg)
    sft = stages.sft(cfg)
    res = stages.evaluate(cfg, checkpoints={"sft": str(sft)})
    for split in ("test", "test_1hop", "test_2hop"):
        row = res[split]["sft"]
        assert {"em", "pass@1", "pass@2"} <= set(row) and row["pass_samples"] == 2
        assert 0 <= row["pass@1"] <= row["pass@2"] <= 1
    table = comparison_markdown(res, "test", "test_2hop")  # what `agent-r1 table` prints
    row = res["test"]["sft"]
    assert f"| sft | {row['em']:.3f} | {row['pass@1']:.3f} | {row['pass@2']:.3f} |" in table.splitlines()
    with pytest.raises(ValueError, match=r"eval.pass_samples: 4 samples per task cannot give pass@k for k=16"):
        tiny_cfg(tmp_path, "eval.pass_k=[1, 16]", "eval.pass_samples=4")
