"""The ``python`` tool: model-written Python run in an operating-system sandbox
(`agent_r1.sandbox`, docs/sandbox.md): its settings, the call, and what the model reads.

The factory checks the machine once per process (by running the sandbox): where it lacks a
layer, it raises one line naming the layer and the setting that accepts running without it, if
any.
"""

from __future__ import annotations

import os
import threading
from dataclasses import replace

from agent_r1.sandbox import EXIT_GRACE_S, Limits, Outcome, SandboxUnavailable, checked_sandbox
from agent_r1.tools.base import Tool, ToolOutput
from agent_r1.tools.registry import register_tool

_CUT = "… [truncated]"
_PARAMETERS = {
    "type": "object",
    "properties": {"code": {"type": "string", "description": "The Python program; print() what you want to see."}},
    "required": ["code"],
}


def _head(text: str, room: int, cut: bool) -> str:
    if len(text) <= room and not cut:
        return text
    return text[:max(0, room - len(_CUT))] + _CUT


def _tail(text: str, room: int, cut: bool) -> str:
    if len(text) <= room and not cut:
        return text
    keep = max(0, room - len(_CUT))
    return _CUT + (text[-keep:] if keep else "")


def _status(o: Outcome, limits: Limits) -> str:
    if o.reason == "finished":
        return f"exit status: {o.exit_code}"
    return {
        "timed out": f"stopped: timed out after {limits.timeout_s:g} s",
        "CPU limit": f"stopped: CPU time limit ({limits.cpu_s} s)",
        "out of memory": f"stopped: out of memory (limit {limits.memory_mb} MB)",
    }.get(o.reason, f"stopped: killed by {o.signal}")


def observation(o: Outcome, limits: Limits, max_output_chars: int) -> tuple[str, bool]:
    """What the model reads, and whether it was cut: the stdout alone when the program finished
    with exit status 0 and wrote nothing to stderr; else the stdout, a labelled stderr, and a
    status line. At most `max_output_chars`: stdout keeps its head, stderr its tail (where a
    traceback's error is)."""
    if o.reason == "finished" and o.exit_code == 0 and not o.stderr:
        text = _head(o.stdout, max_output_chars, o.stdout_cut)
        return text or "(no output)", text != o.stdout
    status = _status(o, limits)
    stdout, stderr = o.stdout.rstrip("\n"), o.stderr.rstrip("\n")
    room = max_output_chars - len(status) - len("\nstderr:\n\n")
    err_room = min(len(stderr), max(room // 2, room - len(stdout)))
    parts = [_head(stdout, room - err_room, o.stdout_cut), _tail(stderr, err_room, o.stderr_cut)]
    truncated = parts != [stdout, stderr]
    if parts[1]:
        parts[1] = "stderr:\n" + parts[1]
    return "\n".join([p for p in parts if p] + [status]), truncated


@register_tool(name="python")
def python_tool(timeout_s: float = 10.0, cpu_s: int = 10, memory_mb: int = 512, max_processes: int = 32,
                disk_mb: int = 64, max_output_chars: int = 2000, call_memory_mb: int = 2048,
                max_concurrency: int | None = None, queue_timeout_s: float = 60.0, bwrap: str = "bwrap",
                interpreter: str | None = None, allow_no_process_cap: bool = False,
                allow_no_syscall_filter: bool = False) -> Tool:
    """The ``python`` tool: each call runs the code in a fresh sandbox under these limits, at most
    `max_concurrency` (default: the CPU count) at once; a call waits up to `queue_timeout_s` for
    its turn. `interpreter`: the sandbox's Python (default: this process's own). Raises
    `SandboxUnavailable` (one line) where the machine lacks a layer."""
    if not (isinstance(max_output_chars, int) and max_output_chars >= 200):
        raise ValueError(f"python tool: max_output_chars must be a whole number >= 200, got {max_output_chars!r}")
    try:  # the sandbox keeps 4 bytes a character of each stream: UTF-8's widest
        limits = Limits(timeout_s=timeout_s, cpu_s=cpu_s, memory_mb=memory_mb, max_processes=max_processes,
                        disk_mb=disk_mb, call_memory_mb=call_memory_mb, output_bytes=4 * max_output_chars)
    except ValueError as e:
        raise ValueError(f"python tool: {e}") from None
    concurrency = (os.cpu_count() or 1) if max_concurrency is None else max_concurrency
    if not (isinstance(concurrency, int) and concurrency >= 1 and queue_timeout_s > 0):
        raise ValueError(f"python tool: max_concurrency must be >= 1 and queue_timeout_s > 0, got {max_concurrency!r} "
                         f"and {queue_timeout_s!r}")
    try:
        sandbox = checked_sandbox(bwrap, allow_no_process_cap, allow_no_syscall_filter, interpreter)
    except SandboxUnavailable as e:
        raise SandboxUnavailable(f"python tool: {e}") from None
    sandbox = replace(sandbox, limits=limits)
    slots = threading.BoundedSemaphore(concurrency)

    def python(code: str) -> ToolOutput:
        if not slots.acquire(timeout=queue_timeout_s):
            raise TimeoutError(f"no sandbox came free within {queue_timeout_s:g} s ({concurrency} calls run at once)")
        try:
            outcome = sandbox.run(code)
        finally:
            slots.release()
        text, truncated = observation(outcome, limits, max_output_chars)
        return ToolOutput(text, {"exit_code": outcome.exit_code, "reason": outcome.reason, "signal": outcome.signal,
                                 "wall_s": round(outcome.wall_s, 3), "truncated": truncated})

    description = (f"Run a Python 3 program and return what it prints (and its errors). Standard library only, no "
                   f"network, a fresh empty working directory each call; limits: {timeout_s:g} s, {memory_mb} MB.")
    return Tool(fn=python, name="python", description=description, parameters=_PARAMETERS,
                timeout_s=queue_timeout_s + timeout_s + 2 * EXIT_GRACE_S, max_output_chars=max_output_chars,
                thread_safe=True)
