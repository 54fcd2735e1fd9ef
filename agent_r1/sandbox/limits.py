"""The typed values of the sandbox: the limits of one call, what the call did, and the error of a
machine that lacks a layer."""

from __future__ import annotations

from dataclasses import dataclass


class SandboxUnavailable(RuntimeError):
    """This machine lacks a layer of the sandbox (the message names it, and the opt-out if any)."""


@dataclass(frozen=True)
class Limits:
    """The limits of one call. ``output_bytes``: how much of each of stdout and stderr is kept
    (the head of stdout, the tail of stderr); the rest is read and dropped."""

    timeout_s: float = 10.0
    cpu_s: int = 10
    memory_mb: int = 512
    max_processes: int = 32
    disk_mb: int = 64
    call_memory_mb: int = 2048
    output_bytes: int = 8000

    def __post_init__(self):
        if not (isinstance(self.timeout_s, (int, float)) and self.timeout_s > 0):
            raise ValueError(f"timeout_s must be a number of seconds > 0, got {self.timeout_s!r}")
        for name in ("cpu_s", "memory_mb", "max_processes", "disk_mb", "call_memory_mb", "output_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")


@dataclass(frozen=True)
class Outcome:
    """What one call did. ``reason``: finished, timed out, CPU limit, out of memory or killed."""

    stdout: str
    stderr: str
    exit_code: int | None  # None when the sandbox killed it at the wall-clock limit
    reason: str
    signal: str | None
    wall_s: float
    stdout_cut: bool
    stderr_cut: bool
