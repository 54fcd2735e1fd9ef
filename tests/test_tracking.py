"""Tracking against a real MLflow: a SQLite file and an artifact folder in tmp_path, no mocks."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

import pytest
import torch

from agent_r1.checkpoints import SETTINGS_FILE, trained_settings
from agent_r1.learner.learner import save_hf_checkpoint
from agent_r1.models import load_model
from agent_r1.tracking import Tracker, configure, flatten
from tests.procs import until, waits_for_lock

ROOT = Path(__file__).resolve().parents[1]

CONFIG = {"name": "demo", "rl": {"learner": {"lr": 1e-5, "zero_stage": 0}, "groups": [1, 2]}, "long": "x" * 7000}


@pytest.fixture
def tracker(tmp_path):
    return Tracker(f"sqlite:///{tmp_path}/m.db", experiment="test")


def test_flatten_and_default_uri(tmp_path, monkeypatch):
    assert flatten({"a": {"b": 1, "c": {"d": None}}, "e": [1, "x"]}) == {"a.b": "1", "a.c.d": "None", "e": '[1, "x"]'}
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert configure(tmp_path) == f"sqlite:///{tmp_path}/mlruns/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow:5000")
    assert configure(tmp_path) == "http://mlflow:5000"


def test_a_new_sqlite_store_is_created_by_one_process_at_a_time(tmp_path):
    """Two runs started at once on a new store broke each other's table migration (``duplicate
    column name: step``): the second waits for the first's lock, then opens the finished store."""
    db = tmp_path / "mlruns" / "mlflow.db"
    code = f"from agent_r1.tracking import Tracker; Tracker('sqlite:///{db}', experiment='e'); print('opened')"
    db.parent.mkdir()
    with open(f"{db}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a first process opening the store
        child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                                 env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert until(lambda: waits_for_lock(child.pid) or child.poll() is not None, 120)
        assert child.poll() is None, "the second process opened the store while the first held it"
        assert not db.exists()
        fcntl.flock(lock, fcntl.LOCK_UN)
    assert child.wait(120) == 0 and child.stdout.read() == "opened\n"
    assert Tracker(f"sqlite:///{db}", experiment="e").client.get_experiment_by_name("e") is not None


def test_params_flattened_and_resume(tracker, tmp_path):
    run = tracker.start_pipeline_run("p", CONFIG, tags={"pipeline": "demo"})
    info = tracker.run_info(run)
    assert info["params"]["rl.learner.lr"] == "1e-05"
    assert info["params"]["rl.groups"] == "[1, 2]"
    assert len(info["params"]["long"]) == 6000  # MLflow's limit
    assert info["tags"]["pipeline"] == "demo" and info["status"] == "RUNNING"
    artifact_location = tracker.client.get_experiment(tracker.experiment_id).artifact_location
    assert artifact_location == (tmp_path / "artifacts").as_uri()  # next to the database

    tracker.end_run(run, "FAILED")
    assert tracker.start_pipeline_run("p", CONFIG, run_id=run) == run  # same params: fine
    assert tracker.run_info(run)["status"] == "RUNNING"
    changed = {**CONFIG, "rl": {"learner": {"lr": 2e-5, "zero_stage": 0}, "groups": [1, 2]}}
    with pytest.raises(ValueError, match="rl.learner.lr"):
        tracker.start_pipeline_run("p", changed, run_id=run)
    # an unknown run id starts a new run
    assert tracker.start_pipeline_run("p", CONFIG, run_id="0" * 32) != run


def test_stage_runs_reused_on_resume(tracker):
    parent = tracker.start_pipeline_run("p", {})
    train = tracker.stage_run(parent, "train")
    tracker.end_run(train, "KILLED")
    evaluate = tracker.stage_run(parent, "evaluate")
    assert tracker.stage_run(parent, "train") == train
    assert tracker.run_info(train)["status"] == "RUNNING"
    assert tracker.child_runs(parent) == {"train": train, "evaluate": evaluate}
    assert tracker.run_info(train)["tags"]["mlflow.parentRunId"] == parent


def test_metrics_history_and_curves(tracker, tmp_path):
    run = tracker.start_pipeline_run("p", {})
    history = [{"iteration": i, "reward": 0.1 * i, "eval/em": 0.5, "note": "x"} for i in range(1, 4)]
    for h in history:
        tracker.log_metrics(
            run, {**h, "nested": {"a": 1}, "nan": float("nan"), "flag": True, "bad:name?": 2}, step=h["iteration"]
        )
    steps, values = zip(*tracker.metric_history(run, "reward"))
    assert steps == (1, 2, 3) and values == pytest.approx([0.1, 0.2, 0.3])
    metrics = tracker.run_info(run)["metrics"]
    assert set(metrics) == {"iteration", "reward", "eval/em", "bad_name_"}
    assert tracker.metric_history(run, "bad:name?") == [(1, 2.0), (2, 2.0), (3, 2.0)]

    tracker.log_curves(run, history, ["reward", "eval/em", "absent"])
    tracker.log_dict(run, {"a": 1}, "cfg.json")
    tracker.log_text(run, "hello", "samples/t.txt")
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "f.txt").write_text("f")
    tracker.log_artifact(run, tmp_path / "folder", "extra")
    local = Path(tracker.client.download_artifacts(run, "", str(tmp_path / "dl")))
    assert (local / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (local / "extra/folder/f.txt").read_text() == "f"
    assert (local / "samples/t.txt").read_text() == "hello"


def test_runs_logged_from_threads(tracker):
    """Prefect runs tasks in worker threads: every call names its run, so threads don't mix."""
    parent = tracker.start_pipeline_run("p", {})
    stages = ["a", "b", "c"]

    def work(stage):
        run = tracker.stage_run(parent, stage)
        for step in range(3):
            tracker.log_metrics(run, {"loss": ord(stage) + step}, step=step)
        tracker.end_run(run)
        return run

    with ThreadPoolExecutor(3) as pool:
        runs = dict(zip(stages, pool.map(work, stages)))
    assert tracker.child_runs(parent) == runs
    for stage, run in runs.items():
        assert tracker.metric_history(run, "loss") == [(s, ord(stage) + s) for s in range(3)]
        assert tracker.run_info(run)["status"] == "FINISHED"


def test_register_load_and_aliases(tracker, tmp_path, tok, make_model):
    assert tracker.alias_version("agent", "champion") is None  # no model yet
    parent = tracker.start_pipeline_run("p", {})
    run = tracker.stage_run(parent, "register")
    tracker.log_metrics(run, {"eval/em": 0.25})
    model = make_model(seed=3, std=0.3).eval()
    ckpt = save_hf_checkpoint(model, tmp_path / "ckpt", tok)
    (ckpt / SETTINGS_FILE).write_text(json.dumps({"pipeline": "demo", "env": {"max_turns": 2}}))

    version = tracker.log_agent(run, ckpt, "agent", tags={"pipeline": "demo"})
    assert tracker.alias_version("agent", "champion") is None  # model exists, alias does not
    challenger = tracker.alias_version("agent", "challenger")
    assert challenger == {"version": version, "run_id": run, "tags": {"pipeline": "demo"}, "metrics": {"eval/em": 0.25}}

    folder = tracker.load_agent("models:/agent@challenger", tmp_path / "loaded")
    assert trained_settings(folder) == {"pipeline": "demo", "env": {"max_turns": 2}}  # the env it was trained with
    loaded, loaded_tok = load_model(folder)
    ids = torch.tensor([tok.encode("Which river flows through Vienna?")])
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids.to(loaded.device)).logits.cpu(), model(ids).logits)
    assert loaded_tok.chat_template == tok.chat_template
    assert (tracker.load_agent(f"models:/agent/{version}") / "model.safetensors").exists()
    assert (tracker.load_agent(f"runs:/{run}/agent") / "config.json").exists()

    version2 = tracker.log_agent(run, ckpt, "agent")
    assert version2 != version and tracker.alias_version("agent", "challenger")["version"] == version2
    tracker.set_alias("agent", "champion", version)
    tracker.set_alias("agent", "champion", version2)
    tracker.set_version_tag("agent", version2, "promoted", True)
    champion = tracker.alias_version("agent", "champion")
    assert champion["version"] == version2 and champion["tags"] == {"promoted": "True"}
