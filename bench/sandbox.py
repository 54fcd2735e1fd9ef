"""The ``python`` tool's cost: per-call overhead and calls per second at its concurrency bound.

    python bench/sandbox.py                       # 30 calls one at a time, then 64 at the bound
    python bench/sandbox.py --calls 100 --burst 256 --concurrency 4

- **Overhead.** The median wall time of ``print(1)`` through ``run_tool`` (the sandbox: bwrap,
  setpriv as root, prlimit, the interpreter), beside the floor: the same interpreter spawned
  directly, ``python3 -I -S -c 'print(1)'`` with its output captured. The two alternate call by
  call, so a busy spell of the machine hits both; the ratio is of the medians.
- **Throughput.** ``--burst`` calls of ``print(1)`` submitted at once from a thread pool of
  ``--concurrency`` workers (default: the CPU count, the tool's default bound) to a tool with
  that bound, and the same number of direct spawns the same way: calls per second.

Before the runs it prints the machine and how many cores other processes kept busy over one idle
second (the calls' own processes would count as "other" during the runs).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from machine import cpu_snapshot, others_cores

from agent_r1.sandbox import checked_sandbox
from agent_r1.tools import python_tool, run_tool

FLOOR = [os.path.realpath(sys.executable), "-I", "-S", "-c", "print(1)"]


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or "unknown CPU"


def floor_call() -> None:
    subprocess.run(FLOOR, stdin=subprocess.DEVNULL, capture_output=True, check=True)


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def overhead(tool, calls: int) -> tuple[float, float]:
    """Median seconds per call of the tool and of the floor, alternating."""
    sandboxed, floor = [], []
    for _ in range(calls):
        sandboxed.append(timed(lambda: run_tool(tool, {"code": "print(1)"})))
        floor.append(timed(floor_call))
    return statistics.median(sandboxed), statistics.median(floor)


def throughput(fn, burst: int, workers: int) -> float:
    """Calls per second of `burst` calls of `fn` from `workers` threads."""
    with ThreadPoolExecutor(workers) as pool:
        start = time.perf_counter()
        list(pool.map(lambda _: fn(), range(burst)))
        return burst / (time.perf_counter() - start)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=30, help="calls one at a time, for the overhead")
    ap.add_argument("--burst", type=int, default=64, help="calls submitted at once, for calls per second")
    ap.add_argument("--concurrency", type=int, default=os.cpu_count(), help="the tool's max_concurrency")
    a = ap.parse_args()
    sandbox = checked_sandbox()
    mode = "root, per-call uid from setpriv" if sandbox.setpriv else "non-root, the current user"
    bwrap_version = subprocess.run([sandbox.bwrap, "--version"], capture_output=True, text=True).stdout.strip()
    print(f"{cpu_model()}, {os.cpu_count()} cores, Linux {platform.release()}, {bwrap_version}, {mode}")
    start = cpu_snapshot()
    time.sleep(1)
    print(f"interpreter: {FLOOR[0]}; other processes kept {others_cores(start):.2f} cores busy, load average "
          f"{os.getloadavg()[0]:.2f}")
    tool = python_tool(max_concurrency=a.concurrency)
    for _ in range(3):  # warm the page cache and the interpreter's imports
        run_tool(tool, {"code": "print(1)"})
        floor_call()
    call_s, floor_s = overhead(tool, a.calls)
    print(f"per call (median of {a.calls}): sandboxed {1e3 * call_s:.1f} ms, floor {1e3 * floor_s:.1f} ms, "
          f"ratio {call_s / floor_s:.2f}, overhead {1e3 * (call_s - floor_s):.1f} ms")
    rate = throughput(lambda: run_tool(tool, {"code": "print(1)"}), a.burst, a.concurrency)
    floor_rate = throughput(floor_call, a.burst, a.concurrency)
    print(f"{a.burst} calls from {a.concurrency} threads (max_concurrency={a.concurrency}): sandboxed {rate:.0f} "
          f"calls/s, floor {floor_rate:.0f} calls/s")


if __name__ == "__main__":
    main()
