"""Rollouts ahead of the learner: the same RL run with the vLLM engine at rl.max_staleness η = 0, 1, 2.

    python bench/async_rollout.py                          # tiny model at bench sizes, 6 iterations of 8 x 4
    python bench/async_rollout.py --init-from outputs/tiny/checkpoints/sft --tasks 16 --group-size 8   # tiny, as it is
    python bench/async_rollout.py --pipeline code --init-from outputs/code/checkpoints/sft --iterations 4  # SmolLM2
    python bench/async_rollout.py --smoke                  # seconds of RL (the suite runs this)

The data and the SFT checkpoint are made once (``agent-r1 stage prepare`` and ``stage sft``, or
``--init-from`` a checkpoint); then
each row is ``agent-r1 stage train -s rollout.engine=vllm -s rl.max_staleness=η`` from that
checkpoint, with the same tasks, seeds and number of episodes. The rows share one vLLM server, started
once with the options a row's run would start its own with (``rollout.vllm.url``: each run syncs its start
weights into it first, which also empties its prefix cache). From
``metrics/train/grpo.json``: the mean wall time of an iteration after the first (the first has
nothing to overlap with), the total RL time, the share of it the learner waited for rollouts, the
largest staleness, and the
reward of every iteration. Rows run one after the other on the same machine.

Read it with the machine in mind: at η ≥ 1 the server samples the next batch while the learner
updates, which gains wall time only when the two do not fight for the same cores. On a 2-core CPU
they do. The anchors' gains were measured on GPUs (README).

Its last line is ``async_speedup_eta1_over_eta0: X.XX`` (η = 0's mean iteration time over η = 1's).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# the tiny model at a size vLLM's CPU attention takes (head size 32), fp32 on every CPU
TINY = ["data.n_films=24", "data.n_directors=8", "data.n_studios=4", "sft.worlds=1", "sft.epochs=4",
        "model.precision=fp32", "model.tiny.num_layers=2", "model.tiny.hidden_size=64", "model.tiny.num_heads=2",
        "model.tiny.num_kv_heads=1", "model.tiny.intermediate_size=128", "model.tiny.vocab_size=400"]
SMOKE = ["sft.epochs=0.2", "sft.worlds=0", "rollout.vllm.kv_cache_gb=1"]


def stage(name: str, pipeline: str, out: Path, settings: list[str]) -> float:
    """``agent-r1 stage NAME`` (untracked); its wall seconds."""
    sets = [x for s in [f"output_dir={out}", *settings] for x in ("-s", s)]
    cmd = [sys.executable, "-m", "agent_r1.cli", "stage", name, "-p", pipeline, "--config", "pipelines.yaml",
           "--no-track", *sets]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=os.environ | {"PYTHONPATH": str(ROOT)}, capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"stage {name} failed ({' '.join(settings[-3:])}):\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    return time.perf_counter() - t0


def shared_server(pipeline: str, out: Path, settings: list[str]):
    """The VLLMServer (not started yet) of every row, as a row's run would start its own: from the untied
    copy of RL's start model, with that run's options (a server's start is outside the measured time)."""
    from transformers import AutoConfig

    from agent_r1.config import load_config, parse_overrides
    from agent_r1.pipeline.rl_driver import start_path
    from agent_r1.rollout.build import vllm_server
    from agent_r1.rollout.vllm_engine import served_model

    cfg = load_config(pipeline, ROOT / "pipelines.yaml", parse_overrides([f"output_dir={out}", *settings]))
    folder = served_model(start_path(cfg), out / "served")
    return vllm_server(cfg, folder, AutoConfig.from_pretrained(folder))


def row(pipeline: str, out: Path, settings: list[str], eta: int) -> dict:
    wall = stage("train", pipeline, out, settings + [f"rl.max_staleness={eta}"])
    history = json.loads((out / "metrics" / "train" / "grpo.json").read_text())
    later = history[1:] or history
    return {"iteration_s": statistics.fmean(h["time/iteration_s"] for h in later),
            "rl_s": sum(h["time/iteration_s"] for h in history),
            "wait_share": sum(h["time/rollout_wait_s"] for h in later) / sum(h["time/iteration_s"] for h in later),
            "staleness_max": max(h["rollout/staleness_max"] for h in history),
            "reward": [h["reward_mean"] for h in history], "wall_s": wall}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pipeline", default="tiny", help="tiny (at bench sizes) or a pipeline of pipelines.yaml as it is")
    ap.add_argument("--etas", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--iterations", type=int, default=6)
    ap.add_argument("--tasks", type=int, default=8, help="questions per iteration")
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--init-from", help="RL's start model (rl.init_from; a checkpoint of --pipeline as it is): skips "
                    "the sft stage")
    ap.add_argument("--smoke", action="store_true", help="the smallest run (the suite's)")
    ap.add_argument("-s", "--set", action="append", default=[], help="another override for every stage")
    a = ap.parse_args()
    if 0 not in a.etas or 1 not in a.etas:
        ap.error("--etas must include 0 and 1 (the last line compares them)")
    # the tiny pipeline at bench sizes, unless RL starts from a checkpoint of the pipeline as it is
    base = (TINY if a.pipeline == "tiny" and not a.init_from else []) + (SMOKE if a.smoke else []) + a.set
    if a.init_from:
        base.append(f"rl.init_from={Path(a.init_from).resolve()}")
    rl = ["rollout.engine=vllm", "rl.algorithm=grpo", f"rl.iterations={a.iterations}",
          f"rl.tasks_per_iteration={a.tasks}", f"rl.group_size={a.group_size}", "rl.checkpoint_every=1000"]
    print(f"{os.cpu_count()} CPU cores, load average {os.getloadavg()[0]:.1f}; pipeline {a.pipeline}, "
          f"{a.iterations} iterations of {a.tasks} x {a.group_size} episodes", flush=True)
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out"
        for name in ("prepare",) if a.init_from else ("prepare", "sft"):
            print(f"stage {name}: {stage(name, a.pipeline, out, base):.0f} s", flush=True)
        with shared_server(a.pipeline, out, base + rl) as server:
            for eta in a.etas:
                rows[eta] = row(a.pipeline, out, base + rl + [f"rollout.vllm.url={server.url}"], eta)
                print(f"eta {eta}: {rows[eta]['iteration_s']:.2f} s/iteration, rewards "
                      f"{' '.join(f'{r:.3f}' for r in rows[eta]['reward'])}", flush=True)
    print(f"{'eta':>3}  {'s/iteration':>11}  {'RL s':>7}  {'waiting share':>13}  {'max staleness':>13}  "
          f"{'mean reward':>11}  {'last reward':>11}")
    for eta, r in rows.items():
        print(f"{eta:>3}  {r['iteration_s']:>11.2f}  {r['rl_s']:>7.1f}  {r['wait_share']:>13.2f}  "
              f"{r['staleness_max']:>13}  {statistics.fmean(r['reward']):>11.3f}  {r['reward'][-1]:>11.3f}")
    print(f"load average {os.getloadavg()[0]:.1f} after the runs")
    for eta in a.etas:
        if eta > 1:
            print(f"async_speedup_eta{eta}_over_eta0: {rows[0]['iteration_s'] / rows[eta]['iteration_s']:.2f}")
    print(f"async_speedup_eta1_over_eta0: {rows[0]['iteration_s'] / rows[1]['iteration_s']:.2f}")


if __name__ == "__main__":
    main()
