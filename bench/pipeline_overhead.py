"""What the pipeline tools cost: the same tiny pipeline run four ways, side by side.

    python bench/pipeline_overhead.py                 # tiny sizes, 30 RL iterations
    python bench/pipeline_overhead.py --iterations 60 --repeats 2

Rows (each a fresh process, so imports and start-up are counted the same way for all):

- ``core``: ``agent-r1 train --no-track`` — every stage in one process, no MLflow;
- ``+ MLflow``: ``agent-r1 train`` — the same, tracked in a fresh SQLite MLflow store and the
  agent registered;
- ``+ Prefect``: ``python -m flows.training`` — the Prefect flow on a fresh embedded server (a
  task per RL iteration piece), tracked in MLflow;
- ``DVC``: ``dvc repro`` in a scratch git repository with this project's ``dvc.yaml`` — five
  stage processes, tracked in MLflow.

An untimed warm-up run comes first (``--warmups``: the first process reads the code and libraries
from disk, the later ones from the page cache). The
best of ``--repeats`` is shown. ``overhead`` is the row's wall time minus ``core``'s; ``per RL it.`` divides it by the
iterations (an upper bound: part of it is fixed start-up). The default pipeline's share is
estimated as overhead / its wall time (``--default-wall-s``, measured by ``make run``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
TINY = {
    "data": {"n_films": 24, "n_directors": 8, "n_studios": 4},
    "model": {"name_or_path": None, "tiny": {"num_layers": 1, "hidden_size": 32, "num_heads": 2, "num_kv_heads": 1,
                       "intermediate_size": 64, "vocab_size": 400}},
    "sft": {"epochs": 0.2},
    "rl": {"tasks_per_iteration": 4, "group_size": 2},
    "eval": {"max_per_hop": 4},
}


def _merge(a: dict, b: dict) -> dict:
    out = dict(a)
    for k, v in b.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def project(tmp: Path, iterations: int) -> Path:
    """A scratch copy of the project (code, dvc.yaml, a tiny `default` pipeline) as a git repo."""
    repo = tmp / "repo"
    repo.mkdir()
    for name in ("dvc.yaml", ".dvcignore", ".gitignore"):
        shutil.copy(ROOT / name, repo / name)
    shutil.copytree(ROOT / "agent_r1", repo / "agent_r1", ignore=shutil.ignore_patterns("__pycache__"))
    default = yaml.safe_load((ROOT / "pipelines.yaml").read_text())["pipelines"]["default"]
    pipeline = _merge(default, _merge(TINY, {"rl": {"iterations": iterations}}))
    (repo / "pipelines.yaml").write_text(yaml.safe_dump({"pipelines": {"default": pipeline}}, sort_keys=False))
    env = environment(tmp)
    for cmd in (["git", "init", "-q"], ["git", "config", "user.name", "bench"],
                ["git", "config", "user.email", "bench@example.invalid"]):
        subprocess.run(cmd, cwd=repo, env=env, check=True)
    subprocess.run([str(BIN / "dvc"), "init", "-q"], cwd=repo, check=True,
                   env=env | {"DVC_SITE_CACHE_DIR": str(repo / ".dvc-site-cache")})
    shutil.copy(ROOT / ".dvc" / "config", repo / ".dvc" / "config")
    subprocess.run(["git", "add", "-A"], cwd=repo, env=env, check=True)
    subprocess.run(["git", "commit", "-qm", "bench"], cwd=repo, env=env, check=True)
    return repo


def environment(tmp: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "PREFECT_", "DVC_"))}
    return env | {"PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}", "DVC_NO_ANALYTICS": "1",
                  "MLFLOW_DISABLE_TELEMETRY": "true", "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                  "PREFECT_HOME": str(tmp / "prefect"), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}


def timed(cmd: list[str], repo: Path, env: dict, clean: list[str]) -> float:
    for name in clean:
        shutil.rmtree(repo / name, ignore_errors=True)
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{(r.stdout + r.stderr)[-4000:]}")
    return wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iterations", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--warmups", type=int, default=1, help="untimed runs first (0: none, a smoke run)")
    ap.add_argument("--default-wall-s", type=float, default=None, help="make run's wall time, for the share column")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        repo = project(tmp, args.iterations)
        env = environment(tmp)
        rows = {
            "core": (["agent-r1", "train", "--no-track"], []),
            "+ MLflow": (["agent-r1", "train"], ["mlruns"]),
            "+ Prefect": ([sys.executable, "-m", "flows.training"], ["mlruns"]),
            "DVC": (["dvc", "repro", "--no-run-cache", "-q"], ["mlruns"]),
        }
        walls: dict[str, list[float]] = {k: [] for k in rows}
        for _ in range(args.warmups):  # not timed
            timed(rows["core"][0], repo, env | {"PYTHONPATH": str(ROOT)}, ["outputs"])
        for _ in range(args.repeats):
            for name, (cmd, clean) in rows.items():
                # a fresh pipeline output and MLflow store for every row
                walls[name].append(timed(cmd, repo, env | {"PYTHONPATH": str(ROOT)}, clean + ["outputs"]))
    table = Table(title=f"pipeline overhead: tiny sizes, {args.iterations} RL iterations, {args.repeats} repeat(s)")
    for col in ("run", "wall s", "overhead s", "per RL it. ms", "x core") + (("share of default run",) if args.default_wall_s else ()):
        table.add_column(col, justify="right" if col != "run" else "left")
    core = min(walls["core"])
    for name, w in walls.items():
        best = min(w)
        over = best - core
        row = [name, f"{best:.1f}", f"{over:+.1f}", f"{1000 * over / args.iterations:.0f}", f"{best / core:.2f}"]
        if args.default_wall_s:
            row.append(f"{100 * over / args.default_wall_s:.1f} %")
        table.add_row(*row)
    Console().print(table)


if __name__ == "__main__":
    main()
