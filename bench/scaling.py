"""Data-parallel scaling on this machine: the same RL run on 1 rank and on 2, per-iteration time.

    python bench/scaling.py                       # tiny model, 6 RL iterations of 8 questions x 4 episodes
    python bench/scaling.py --ranks 1 2 4 --iterations 10 --tasks 16

Each row is one ``agent-r1 train --nproc N --no-track`` (the tiny pipeline, the same global batch
and seed; ``rl.rollout_shards`` = the largest N, so every row samples the same episodes), each
rank with one torch thread (``OMP_NUM_THREADS=1``). From ``metrics/train/grpo.json``:
the median per-iteration wall time (``time/iteration_s``, sample_episodes + build_train_batch + update_policy), its rollout
part, and the speed-up over 1 rank. The first iteration is left out (it warms up allocators).

Read it with the machine in mind: N ranks need N free cores. On a 2-core machine that other
jobs share, 2 ranks can at best halve the time, and usually do not; a GPU machine with a rank
per GPU is where the ratio means something.
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
TINY = ["data.n_films=24", "data.n_directors=8", "data.n_studios=4", "sft.worlds=1", "sft.epochs=4",
        "eval.max_per_hop=1", "eval.hops=[2]", "model.precision=fp32", "model.tiny.num_layers=2",
        "model.tiny.hidden_size=64", "model.tiny.num_heads=2", "model.tiny.num_kv_heads=1",
        "model.tiny.intermediate_size=128", "model.tiny.vocab_size=400"]


def run(nproc: int, out: Path, settings: list[str]) -> dict:
    sets = [x for s in [f"output_dir={out}", *settings] for x in ("-s", s)]
    cmd = [sys.executable, "-m", "agent_r1.cli", "train", "-p", "tiny", "--config", "pipelines.yaml", "--no-track",
           "--nproc", str(nproc), *sets]
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"{nproc} ranks failed:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    history = json.loads((out / "metrics" / "train" / "grpo.json").read_text())[1:]
    return {"iteration_s": statistics.median(h["time/iteration_s"] for h in history),
            "rollout_s": statistics.median(h["time/rollout_s"] for h in history),
            "reward_mean": [round(h["reward_mean"], 4) for h in history], "wall_s": time.perf_counter() - t0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--iterations", type=int, default=6)
    ap.add_argument("--tasks", type=int, default=8, help="questions per iteration")
    ap.add_argument("--group-size", type=int, default=4)
    a = ap.parse_args()
    settings = TINY + [f"rl.iterations={a.iterations}", f"rl.tasks_per_iteration={a.tasks}",
                       f"rl.group_size={a.group_size}", f"rl.rollout_shards={max(a.ranks)}"]
    print(f"{os.cpu_count()} CPU cores, load average {os.getloadavg()[0]:.1f} before the runs")
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for n in a.ranks:
            rows[n] = run(n, Path(tmp) / f"ranks{n}", settings)
    base = rows[a.ranks[0]]["iteration_s"]
    print(f"{'ranks':>5}  {'s/iteration':>11}  {'rollout s':>9}  {'speed-up':>8}  {'run wall s':>10}")
    for n, r in rows.items():
        print(f"{n:>5}  {r['iteration_s']:>11.2f}  {r['rollout_s']:>9.2f}  {base / r['iteration_s']:>8.2f}  {r['wall_s']:>10.0f}")
    same = len({tuple(r["reward_mean"]) for r in rows.values()}) == 1
    print(f"ratio_{a.ranks[-1]}_over_{a.ranks[0]}_ranks_s_per_iteration: {rows[a.ranks[-1]]['iteration_s'] / base:.2f}")
    print(f"same rewards on every row: {same}; load average {os.getloadavg()[0]:.1f} after the runs")


if __name__ == "__main__":
    main()
