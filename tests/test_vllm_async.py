"""``rl.max_staleness`` against a REAL vLLM server (``.venv-vllm``): the README's command, the tiny
pipeline with its rollouts one update ahead of the learner, tracked in MLflow, SIGKILLed mid-run
and resumed. Outside CI the module is skipped when ``.venv-vllm`` is missing; under ``CI=true``
that is a failure."""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

# test_vllm skips at import when .venv-vllm is missing (and fails under CI=true): so does this module
from tests.test_vllm import (README_ASYNC, _group, _group_ends, _scratch_tiny, _step_saved, _watchdog_of,
                              _watchdogs)

pytestmark = pytest.mark.slow


def _staleness_in_mlflow(db) -> list[float]:
    """The ``rollout/staleness_max`` values of every run tracked in ``db``."""
    from agent_r1.tracking import Tracker

    tracker = Tracker(f"sqlite:///{db}")
    runs = tracker.client.search_runs([tracker.experiment_id])
    return [m.value for r in runs for m in tracker.client.get_metric_history(r.info.run_id, "rollout/staleness_max")]


@pytest.mark.timeout(1800)
def test_the_readme_async_command_is_tracked_bounded_and_resumes_after_a_kill(tmp_path):
    """The README's ``.venv/bin/agent-r1 train -p tiny -s rollout.engine=vllm -s rl.max_staleness=1``,
    word for word with the defaults (tracked in MLflow), in a scratch folder whose `tiny` pipeline has
    test sizes and 3 RL iterations: SIGKILLed once iteration 1's state is saved, while the rollout
    thread samples ahead, it leaves no server; run again, it resumes from there and finishes. No
    update trained on episodes more than one version old, and the last one exactly one (MLflow's
    ``rollout/staleness_max``)."""
    _scratch_tiny(tmp_path, iterations=3)
    out, db = tmp_path / "outputs" / "tiny", tmp_path / "mlflow.db"
    env = os.environ | {"OMP_NUM_THREADS": "1", "MLFLOW_TRACKING_URI": f"sqlite:///{db}"}
    with open(tmp_path / "train.log", "w") as log:
        proc = subprocess.Popen(["bash", "-c", f"exec {README_ASYNC}"], cwd=tmp_path, env=env, stdout=log,
                                stderr=subprocess.STDOUT)
        try:
            t0 = time.monotonic()
            while _step_saved(out) < 1:
                assert proc.poll() is None, (tmp_path / "train.log").read_text()[-3000:]
                assert time.monotonic() - t0 < 1200, "no RL state of iteration 1 after 1200 s"
                time.sleep(0.05)
            server = _watchdog_of(proc.pid)
            assert server and len(_group(server)) >= 2, "no vLLM server serving the run"
        finally:
            proc.kill()
            proc.wait()
        assert _group_ends(server), "a vLLM server outlived its SIGKILLed trainer"
        killed_at = _step_saved(out)
        again = subprocess.run(["bash", "-c", README_ASYNC], cwd=tmp_path, env=env, stdout=log,
                               stderr=subprocess.STDOUT, timeout=1500)
    text = (tmp_path / "train.log").read_text()
    assert again.returncode == 0, text[-3000:]
    assert killed_at < 3 and f"resuming after iteration {killed_at} of 3" in text, text[-3000:]
    assert (out / "metrics" / "eval.json").exists()
    assert not _watchdogs(tmp_path), "a vLLM server outlived its run"
    history = json.loads((out / "metrics" / "train" / "grpo.json").read_text())
    assert [h["iteration"] for h in history] == [1, 2, 3]
    stale = [h["rollout/staleness_max"] for h in history]
    assert stale[0] == 0 and stale[killed_at] == 0 and stale[-1] == 1, stale  # a resumed run starts fresh
    tracked = _staleness_in_mlflow(db)
    assert tracked and max(tracked) == 1, tracked
    assert all("policy/is_weight_mean" in h for h in history)  # the loss weighed the episodes (tis)
