"""This process's resident memory, and handing the heap pages it has freed back to the OS.

glibc's malloc keeps freed memory for reuse: after the first large tensor is freed its mmap
threshold rises (up to 32 MB), so an update's activations land on the heap, and a heap below a
live allocation never shrinks. A 135M model's TextWorld update (8192-token micro-batches) thus
left a process at 7-10 GB for the rest of the run, where 3 GB was live. Handing the free pages
back when a batch of episodes starts (:func:`release_freed`) costs ~30 ms and the next update's
page faults; a fixed mmap threshold would release at every free instead, and cost the rollout
15 % more CPU time (docs/pretrained.md).
"""

from __future__ import annotations

import ctypes
import ctypes.util
from functools import cache

GB = 1e9


def _status_gb(key: str) -> float:
    """A size line of /proc/self/status, in GB (0.0 where there is no /proc)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024 / GB
    except OSError:
        pass
    return 0.0


def rss_gb() -> float:
    """This process's resident set size now."""
    return _status_gb("VmRSS")


def peak_rss_gb() -> float:
    """The largest resident set size this process has had."""
    return _status_gb("VmHWM")


@cache
def _malloc_trim():
    """glibc's malloc_trim, or None (musl, macOS, Windows)."""
    try:
        return getattr(ctypes.CDLL(ctypes.util.find_library("c") or None), "malloc_trim", None)
    except OSError:
        return None


def release_freed() -> float:
    """Hand the heap's free pages back to the OS (glibc's ``malloc_trim(0)``; a no-op without
    glibc). Returns how much the resident set shrank, in GB."""
    trim = _malloc_trim()
    if trim is None:
        return 0.0
    before = rss_gb()
    trim(0)
    return max(before - rss_gb(), 0.0)
