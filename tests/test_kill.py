"""A training run killed with SIGKILL at random points, in SFT and in RL, during checkpoint
writes too, resumes into the same MLflow run with nothing corrupt, and ends with the same
metrics and weights as a run that was never interrupted.

Each kill is one ``agent-r1 train`` process (about 10 s on two busy cores, most of it imports),
so the number of kill points is a setting: ``AGENT_R1_KILL_POINTS`` (default 5; half in SFT,
half in RL); the uninterrupted reference runs the same stages in this process. The points are
drawn from a seeded generator: the first of each phase lands while a resumable state is being
written, the last SFT one while the SFT checkpoint is written, the others at a random delay
after the process has written a new state (so every restart makes progress).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.machine_metrics import of_the_run

ROOT = Path(__file__).resolve().parents[1]
KILL_POINTS = int(os.environ.get("AGENT_R1_KILL_POINTS", "5"))
SETTINGS = [
    # SFT: 24 steps (1.8 epochs of one world's 108 demonstrations; nine worlds took ~4 s a process to write)
    "data.n_films=24", "data.n_directors=8", "data.n_studios=4", "sft.worlds=1", "sft.epochs=1.8", "sft.checkpoint_every=2",
    "rl.iterations=10", "rl.checkpoint_every=1", "rl.tasks_per_iteration=2", "rl.group_size=2", "eval.max_per_hop=3",
    "model.tiny.num_layers=1", "model.tiny.hidden_size=32", "model.tiny.num_heads=2", "model.tiny.num_kv_heads=1",
    "model.tiny.intermediate_size=64", "model.tiny.vocab_size=400",
]


def _start(root: Path, log) -> subprocess.Popen:
    env = os.environ | {"OMP_NUM_THREADS": "1", "MLFLOW_TRACKING_URI": f"sqlite:///{root / 'mlflow.db'}",
                        "MLFLOW_DISABLE_TELEMETRY": "true", "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    sets = [x for s in [f"output_dir={root / 'out'}", *SETTINGS] for x in ("-s", s)]
    cmd = [sys.executable, "-m", "agent_r1.cli", "train", "-p", "tiny", "--config", "pipelines.yaml", *sets]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)


def _schedule(n: int, rng: random.Random) -> list[tuple[str, str, float]]:
    """(phase, trigger, delay) per kill: triggers "write" (a state is being written), "final" (the
    SFT checkpoint is being written) and "after" (``delay`` s after this process wrote a state)."""
    n_sft = (n + 1) // 2
    sft = ["write"] + ["after"] * max(n_sft - 2, 0) + (["final"] if n_sft > 1 else [])
    rl = (["write"] + ["after"] * (n - n_sft - 1)) if n > n_sft else []
    # delays shorter than about two states apart, so the states last for every kill point
    return [("sft", t, rng.uniform(0, 0.15)) for t in sft] + [("rl_grpo", t, rng.uniform(0, 0.3)) for t in rl]


def _step(state: Path) -> int | None:
    try:
        return json.loads((state / "meta.json").read_text())["step"]
    except (OSError, ValueError):
        return None


def _kill_at(proc: subprocess.Popen, out: Path, phase: str, trigger: str, delay: float) -> bool:
    """Wait for the kill point, then SIGKILL; False if the process ended first."""
    state = out / "state" / phase
    temp = {"write": (state.parent, f".{phase}.*"), "final": (out / "checkpoints", ".sft.*")}.get(trigger)
    before = set(temp[0].glob(temp[1])) if temp else set()  # temp folders earlier kills left
    start_step = _step(state)
    while proc.poll() is None:
        if temp and set(temp[0].glob(temp[1])) - before:
            break
        if trigger == "after" and _step(state) not in (None, start_step):
            time.sleep(delay)
            break
        time.sleep(0.002)
    else:
        return False
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return True


def _reference(root: Path) -> None:
    """The uninterrupted run: what ``agent-r1 train`` runs with the same settings, in this process."""
    from agent_r1.config import load_config, parse_overrides
    from agent_r1.pipeline import run_all
    from agent_r1.tracking import Tracker

    root.mkdir(parents=True)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in the killed run's processes (OMP_NUM_THREADS=1): the same sums, bit for bit
    try:
        run_all(load_config("tiny", ROOT / "pipelines.yaml", parse_overrides([f"output_dir={root / 'out'}", *SETTINGS])),
                Tracker(uri=f"sqlite:///{root / 'mlflow.db'}", project_dir=root))
    finally:
        torch.set_num_threads(threads)


def _run(root: Path, kills: list[tuple[str, str, float]]) -> list[str]:
    """Train under ``root``, killed at each point of ``kills``, then to the end; returns the
    kill points that were reached."""
    root.mkdir(parents=True, exist_ok=True)
    reached = []
    with open(root / "log.txt", "w") as log:
        for phase, trigger, delay in [*kills, (None, None, 0.0)]:
            proc = _start(root, log)
            if trigger is None or not _kill_at(proc, root / "out", phase, trigger, delay):
                assert proc.wait(timeout=300) == 0, (root / "log.txt").read_text()[-3000:]
                return reached
            reached.append(f"{phase}:{trigger}")
            state = root / "out" / "state" / phase
            assert not (state / "meta.json").exists() or _step(state) is not None  # never half a file
    return reached


def _mlflow(root: Path) -> dict:
    from agent_r1.tracking import Tracker

    tracker = Tracker(f"sqlite:///{root / 'mlflow.db'}")
    runs = tracker.client.search_runs([tracker.experiment_id])
    pipelines = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert len(pipelines) == 1, [r.info.run_name for r in pipelines]  # every restart reopened it
    out = {"pipeline": pipelines[0].info.status}
    for name, run_id in tracker.child_runs(pipelines[0].info.run_id).items():
        info = tracker.run_info(run_id)
        out[name] = (info["status"], of_the_run(info["metrics"]))
    return out


def _results(root: Path) -> dict:
    out = root / "out"
    history = [of_the_run(h) for h in json.loads((out / "metrics" / "train" / "grpo.json").read_text())]
    return {"eval": json.loads((out / "metrics" / "eval.json").read_text()), "rl": history,
            "sft": json.loads((out / "metrics" / "sft_history.json").read_text()),
            "register": json.loads((out / "metrics" / "register.json").read_text())}


@pytest.mark.slow
@pytest.mark.parametrize("kill_points", [KILL_POINTS])
def test_a_run_killed_at_random_points_resumes_to_the_uninterrupted_result(kill_points, tmp_path):
    t0 = time.perf_counter()
    _reference(tmp_path / "reference")
    kills = _schedule(kill_points, random.Random(kill_points))
    reached = _run(tmp_path / "killed", kills)
    assert len(reached) == kill_points, reached  # every kill point was hit, in SFT and in RL

    ref, got = _results(tmp_path / "reference"), _results(tmp_path / "killed")
    assert got["eval"] == ref["eval"] and got["register"]["score"] == ref["register"]["score"]
    assert [h["iteration"] for h in got["rl"]] == list(range(1, 11))
    for a, b in zip(got["rl"] + got["sft"], ref["rl"] + ref["sft"]):
        assert a.keys() == b.keys() and all(a[k] == pytest.approx(b[k], rel=1e-4, abs=1e-6) for k in a), (a, b)
    for ckpt in ("checkpoints/sft", "rl/grpo"):
        wa, wb = (load_file(str(r / "out" / ckpt / "model.safetensors")) for r in (tmp_path / "killed", tmp_path / "reference"))
        assert all(torch.allclose(wa[k], wb[k], rtol=1e-4, atol=1e-6) for k in wb), ckpt

    ref_runs, got_runs = _mlflow(tmp_path / "reference"), _mlflow(tmp_path / "killed")
    assert got_runs.keys() == ref_runs.keys() and got_runs["pipeline"] == "FINISHED"
    for stage in set(ref_runs) - {"pipeline"}:
        (status, metrics), (_, expected) = got_runs[stage], ref_runs[stage]
        assert status == "FINISHED" and metrics.keys() == expected.keys(), stage
        assert all(metrics[k] == pytest.approx(expected[k], rel=1e-4, abs=1e-6) for k in metrics), stage
    assert not [p.name for p in (tmp_path / "killed" / "out" / "state").iterdir()]  # no state left behind
    print(f"{kill_points} kill points {reached} in {time.perf_counter() - t0:.0f} s")
