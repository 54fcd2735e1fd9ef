"""The score cache: an untrained baseline's evaluation, reused while what decides it is unchanged.

A baseline of ``eval.baselines`` (``base_tool_call``, ``naive_rag``, ``no_tool``: the model before
any training; ``random``, ``oracle``: no model) scores the same on every run that gives it the same
model, data, tasks and evaluation settings: a retrain, another RL setting, a rerun. Its summary and
transcripts are kept in ``<cache>/scores/<key>.json`` (``<cache>``: :func:`agent_r1.models.cache_root`,
``$AGENT_R1_CACHE`` or ``~/.cache/agent-r1``), the key a hash of

- the method, and the model's files (their bytes; a hub id that is not a local folder: its name);
- the data: every parquet file of the prepared data (the corpus the search tool reads too), the
  ``data`` section (what else the prepare stage wrote, e.g. game files) and the tasks scored;
- the settings that shape an episode: the ``env`` section, ``eval.temperature``, the precision the
  forward passes compute in (and whether the CPU has native bf16, which decides the rollout's:
  :func:`~agent_r1.models.rollout_precision`), the torch and transformers versions, and the run's seed where the
  episodes are sampled (``eval.temperature`` > 0, the ``random`` baseline, pass@k);
- with pass@k (``eval.pass_k``), its settings: the k, ``eval.pass_samples`` and ``rl.temperature``.

A change in any of them is another key: the score is computed again. ``eval.cache_baselines:
false`` turns the cache off; deleting the folder empties it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path

from agent_r1.config import RunConfig
from agent_r1.learner.distributed import broadcast_object, is_main
from agent_r1.models import cache_root, native_bf16_cpu, resolve_model
from agent_r1.pipeline.state import computed_precision, data_version

log = logging.getLogger(__name__)


def scores_dir() -> Path:
    return cache_root() / "scores"


def _sha(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


@functools.lru_cache(maxsize=8)
def _files_hash(folder: str, stamp: tuple) -> str:
    h = hashlib.sha256()
    for f in sorted(p for p in Path(folder).rglob("*") if p.is_file()):
        h.update(str(f.relative_to(folder)).encode())
        with f.open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def model_hash(src: str) -> str:
    """A hash of the model's files (a packaged model's converted folder, a checkpoint folder); a
    hub id that is not a local folder, or no model (""), is hashed by its name."""
    path = Path(resolve_model(src)) if src else None
    if path is None or not path.is_dir():
        return _sha(src)
    files = sorted(p for p in path.rglob("*") if p.is_file())
    stamp = tuple((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in files)  # hashed once per version
    return _files_hash(str(path), stamp)


def baseline_key(cfg: RunConfig, method: str, src: str, tasks: list[dict], pass_k: bool = False) -> str:
    """The cache key of baseline ``method`` (model ``src``) scored on ``tasks``, with ``pass_k`` its
    pass@k too (see the module docstring)."""
    import torch
    import transformers

    pass_k = pass_k and bool(cfg.eval.pass_k) and method not in ("random", "oracle")  # pass@k: a model's samples
    sampled = cfg.eval.temperature > 0 or method == "random" or pass_k
    parts = {"method": method, "model": model_hash(src),
             "data": data_version(cfg.out / "data"), "data_config": cfg.data.model_dump(mode="json"),
             "tasks": _sha(tasks), "env": cfg.env.model_dump(mode="json"), "temperature": cfg.eval.temperature,
             "precision": [computed_precision(cfg), native_bf16_cpu()], "seed": cfg.seed if sampled else None,
             "versions": [torch.__version__, transformers.__version__],
             "pass_k": [cfg.eval.pass_k, cfg.eval.pass_samples, cfg.rl.temperature] if pass_k else None}
    return _sha(parts)


def cached_score(method: str, key: str, n_tasks: int) -> dict | None:
    """The cached ``{"by_hops", "transcripts"}`` of ``key`` (rank 0's answer on every rank), or None."""
    path = scores_dir() / f"{key}.json"
    hit = None
    if path.exists():
        try:
            hit = json.loads(path.read_text())
        except ValueError:  # a damaged entry is computed again
            hit = None
    hit = broadcast_object(hit)
    if hit is not None:
        log.info("evaluate: %s on %d tasks: cached score used (%s), no episode run", method, n_tasks, path)
    return hit


def store_score(key: str, by_hops: dict, transcripts: str) -> None:
    """Keep a computed score under ``key``, atomically (a temp file of its own renamed over it: runs
    side by side may store the same key); rank 0 alone writes."""
    if not is_main():
        return
    folder = scores_dir()
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{key}.", dir=folder)
    with os.fdopen(fd, "w") as f:
        json.dump({"by_hops": by_hops, "transcripts": transcripts}, f)
    os.replace(tmp, folder / f"{key}.json")
