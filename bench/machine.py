"""Shared by the bench scripts: how busy the rest of this (shared, 2-core) machine is.

Import it before ``import torch``: ``apply_omp_wait_policy`` must set OMP_WAIT_POLICY before
torch's OpenMP runtime loads, and this module only imports torch inside ``elementwise_probe``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time


def apply_omp_wait_policy() -> None:
    """Honour ``--omp-wait-policy passive|active`` from argv (OpenMP reads it once, at load)."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--omp-wait-policy", choices=["passive", "active"])
    if policy := pre.parse_known_args()[0].omp_wait_policy:
        os.environ["OMP_WAIT_POLICY"] = policy.upper()


def cpu_snapshot() -> tuple[float, float, float]:
    """(wall s, whole-machine busy CPU s, this process's CPU s), to tell how busy the rest of the machine was."""
    try:
        with open("/proc/stat") as f:
            user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in f.readline().split()[1:9])
        busy = (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError):
        busy = float("nan")
    t = os.times()
    return time.perf_counter(), busy, t.user + t.system


def others_cores(start: tuple[float, float, float]) -> float:
    """Average number of cores other processes kept busy since ``start``."""
    end = cpu_snapshot()
    return max(0.0, ((end[1] - start[1]) - (end[2] - start[2])) / (end[0] - start[0]))


def elementwise_probe(n: int = 1 << 20, reps: int = 20) -> float:
    """Median microseconds of an in-place multiply of n floats: ~0.1 ms when memory-bound; ~a scheduler
    time slice (several ms) when torch's OpenMP threads spin-wait for a core another process holds."""
    import torch

    x = torch.ones(n)
    x.mul_(1.0)
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        x.mul_(1.0)
        out.append(time.perf_counter() - t0)
    return 1e6 * statistics.median(out)


def matmul_flops(n: int, reps: int, dtype=None) -> float:
    """Median FLOP/s of an n x n @ n x n matmul of ``dtype`` (default fp32; after one warm-up)."""
    import torch

    a, b = torch.randn(n, n, dtype=dtype or torch.float32), torch.randn(n, n, dtype=dtype or torch.float32)
    a @ b
    rates = []
    for _ in range(reps):
        t0 = time.perf_counter()
        a @ b
        rates.append(2 * n**3 / (time.perf_counter() - t0))
    return statistics.median(rates)


def read_bandwidth(mb: int = 256, reps: int = 5) -> float:
    """Median bytes/s of summing an ``mb`` MB fp32 tensor (a memory read the size of a model's weights)."""
    import torch

    x = torch.ones(mb * 2**20 // 4)
    x.sum()
    rates = []
    for _ in range(reps):
        t0 = time.perf_counter()
        x.sum()
        rates.append(x.numel() * 4 / (time.perf_counter() - t0))
    return statistics.median(rates)


def warn_if_spinning(us: float) -> str:
    if us < 2000:
        return ""
    return (f"WARNING: a 1M-float multiply took {us / 1000:.1f} ms (~0.05 ms normally): torch's OpenMP threads are "
            "waiting for a core another process holds, and every parallel op pays a scheduler time slice. "
            "Numbers from this run are not representative; re-run when the machine is quiet, or with "
            "--omp-wait-policy passive (or --threads 1).")
