"""Every script under bench/ runs, as a user runs it (``.venv``'s Python, from the repository
root), at smoke scale: the tiny model and the smallest arguments its ``--help`` offers. The
numbers are not asserted, only that the script ran to its result line: a renamed or removed
function of the package (``rl_driver.rollout``, a ``TrainBatch`` read as a dict) breaks a
script here, not on a user's machine.

Scripts tested elsewhere are in ``ELSEWHERE``; ``test_every_bench_file_is_covered`` fails on a
new bench file that neither list names. The runs that need more than seconds (whole pipeline
runs, a vLLM server) are slow; the vLLM one needs ``.venv-vllm`` (``make vllm``), as
tests/test_vllm.py does: skipped without it, a failure under ``CI=true``.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
TINY_MODEL = ["--hidden", "32", "--layers", "1", "--heads", "2", "--kv-heads", "1", "--ffn", "64", "--vocab", "300"]

# script -> (arguments, a line its output must hold); run in seconds
SMOKE = {
    "rollout.py": (["--n", "4", "--serial-n", "2", "--batch-sizes", "2", "4", "--min-ctx", "20", "--max-ctx", "40",
                    "--max-new-tokens", "4", "--repeats", "1", "--threads", "1", "--budget-s", "30", *TINY_MODEL],
                   "goal: batched/serial ratio"),
    # the built-in engine in fp32 and bf16 beside each other, each a fraction of the machine's limit, and the ratio
    "rollout.py --engines hf": (["--engines", "hf", "--precisions", "fp32", "bf16", "--smoke", "--long-n", "2",
                                 "--threads", "1", "--mm", "128"], "ratio_hf_bf16_over_hf_episodes_per_s: "),
    "kv_reuse.py": (["--model", "tiny", "--episodes", "2", "--turns", "2", "--max-new-tokens", "4", "--repeats", "1",
                     "--threads", "1"], "ratio_wall_full_over_reuse:"),
    "learner.py": (["--models", "32,1,2,1,64", "--batch", "2", "--seq", "32", "--prompt", "4", "--steps", "1",
                    "--repeats", "1", "--warmup", "0", "--threads", "1", "--mm", "64", "--mm-reps", "1",
                    "--breakdown-reps", "1", "--budget-s", "30"], "goal: MFU"),
    # the same SFT steps in fp32 and bf16 from the same start: losses, gradients, CPU time
    "precision.py": (["--model", "tiny", "--steps", "2", "--batch", "2", "--seq", "32", "--prompt", "4"],
                     "within tolerance (loss gap <= "),
    # one whole tiny pipeline run (agent-r1 train --nproc 1) at its test sizes: ~10 s
    "scaling.py": (["--ranks", "1", "--iterations", "2", "--tasks", "2", "--group-size", "2"],
                   "ratio_1_over_1_ranks_s_per_iteration:"),
}
# run by the tests below with arguments they build (a model folder, a finished run), or slow
BUILT = {"shared_prefix.py", "kv_reuse.py --run", "pipeline_overhead.py", "rollout.py --engines hf vllm",
         "async_rollout.py"}
ELSEWHERE = {
    "gpu_learning.sh": "tests/bench/test_bench_gpu_learning.py",
    "peer_trl.py": "tests/bench/test_bench_peer_trl.py",
    "sandbox.py": "tests/test_code_task.py",
    "machine.py": "tests/bench/test_bench.py",  # the scripts' shared helper, not a script: test_machine_helpers
    "README.md": "tests/bench/test_bench.py",  # the results, not a script
}


def bench(script: str, args: list[str], cwd: Path = ROOT, timeout: float = 300) -> str:
    """Run ``bench/<script> args`` with ``.venv``'s Python; its stdout."""
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT),
                        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180"}  # a busy machine (default 20 s)
    r = subprocess.run([sys.executable, str(BENCH / script), *args], cwd=cwd, env=env, capture_output=True, text=True,
                       timeout=timeout)
    out = r.stdout + r.stderr
    assert r.returncode == 0, f"bench/{script} {' '.join(args)} failed ({r.returncode}):\n{out[-4000:]}"
    return r.stdout


def test_every_bench_file_is_covered():
    covered = {name.split()[0] for name in [*SMOKE, *BUILT]} | set(ELSEWHERE)
    files = {p.name for p in BENCH.iterdir() if p.is_file()}
    assert files <= covered, f"bench files no test runs (add them to tests/bench/test_bench.py): {sorted(files - covered)}"
    for name, test in ELSEWHERE.items():
        assert name in (ROOT / test).read_text(), f"{test} does not run bench/{name}"


@pytest.mark.parametrize("name", sorted(SMOKE))
def test_bench_script_runs_at_smoke_scale(name):
    args, line = SMOKE[name]
    assert line in bench(name.split()[0], args)


def test_machine_helpers():
    spec = importlib.util.spec_from_file_location("bench_machine", BENCH / "machine.py")
    machine = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(machine)
    start = machine.cpu_snapshot()
    assert machine.elementwise_probe(n=1024, reps=2) > 0
    assert machine.others_cores(start) >= 0
    assert machine.warn_if_spinning(10.0) == "" and "WARNING" in machine.warn_if_spinning(5000.0)
    assert machine.matmul_flops(32, 1) > 0 and machine.read_bandwidth(1, 1) > 0


def test_shared_prefix_runs_on_a_model_folder(tmp_path, tok, make_model):
    from agent_r1.learner import save_hf_checkpoint

    folder = save_hf_checkpoint(make_model(), tmp_path / "model", tok)
    out = bench("shared_prefix.py", ["--model", str(folder), "--groups", "1", "--group-size", "2",
                                     "--continuation", "8", "--repeats", "1"])
    assert "ratio_off_over_on:" in out


def test_kv_reuse_measures_a_runs_rollout(tmp_path):
    """``--run OUT``: the RL stage's rollout (groups of each question through run_episodes) from
    OUT/checkpoints/sft over OUT/data; here an untrained tiny model and a pipeline of 2 x 2 episodes."""
    from agent_r1.config import load_config
    from agent_r1.learner import save_hf_checkpoint
    from agent_r1.run import initial_model, make_tools, prepare_data

    (tmp_path / "pipelines.yaml").write_text(yaml.safe_dump({"pipelines": {"smoke": {
        "extends": "agent-r1:tiny", "env": {"max_turns": 2}, "rl": {"tasks_per_iteration": 2, "group_size": 2}}}}))
    cfg = load_config("smoke", tmp_path / "pipelines.yaml", {"output_dir": str(tmp_path / "out")})
    data = prepare_data(cfg)
    model, tok = initial_model(cfg, data, make_tools(cfg, data))
    save_hf_checkpoint(model, tmp_path / "out" / "checkpoints" / "sft", tok)
    out = bench("kv_reuse.py", ["--run", str(tmp_path / "out"), "--pipeline", "smoke", "--repeats", "1", "--threads", "1"],
                cwd=tmp_path)
    assert "ratio_wall_full_over_reuse:" in out and "same sampled ids with and without reuse: True" in out


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_pipeline_overhead_runs_one_iteration():
    """Four runs of the tiny model (core, MLflow, Prefect, DVC; no warm-up): under a minute."""
    out = bench("pipeline_overhead.py", ["--iterations", "1", "--repeats", "1", "--warmups", "0"], timeout=2400)
    assert "pipeline overhead" in out and "DVC" in out


def _vllm_python() -> Path:
    from agent_r1.rollout.vllm_server import DEFAULT_PYTHON

    return DEFAULT_PYTHON


def _needs_vllm() -> None:
    if not _vllm_python().exists():
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI: {_vllm_python()} is missing: `make test` builds it with `make vllm`")
        pytest.skip(f"no vLLM environment ({_vllm_python()}): run `make vllm`")


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_rollout_engines_hf_and_vllm_at_smoke_scale():
    """``bench/rollout.py --engines hf vllm`` (the README's vLLM/HF ratio) on the tiny model: a
    vLLM server started as the pipeline starts it, with the config's defaults."""
    _needs_vllm()
    out = bench("rollout.py", ["--engines", "hf", "vllm", "--smoke", "--long-n", "2", "--threads", "1", "--mm", "128"],
                timeout=1200)
    assert out.strip().splitlines()[-1].startswith("ratio_vllm_over_hf_episodes_per_s: ")
    assert out.count("fraction of limit") == 4  # each engine on each workload


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_async_rollout_compares_eta_0_1_2_at_smoke_scale():
    """``bench/async_rollout.py`` at smoke scale: the data and SFT once, then RL with the vLLM
    engine at η = 0, 1, 2; each row stays within its staleness bound; the last line is the ratio."""
    _needs_vllm()
    # 2 iterations: the first (nothing to overlap with) and one after it, each η's
    out = bench("async_rollout.py", ["--smoke", "--iterations", "2", "--tasks", "2", "--group-size", "2"], timeout=1200)
    rows = {int(line.split()[0]): line.split() for line in out.splitlines() if line[:3].strip() in ("0", "1", "2")}
    # the largest staleness stays within each row's bound (how far ahead the thread got depends on timing)
    assert sorted(rows) == [0, 1, 2] and all(int(rows[e][4]) <= e for e in rows) and rows[0][4] == "0", out
    assert out.strip().splitlines()[-1].startswith("async_speedup_eta1_over_eta0: ")
