"""A cgroup v2 of the call's own: ``memory.max`` (``call_memory_mb``), no swap and ``pids.max``
for all its processes together, made only inside this process's own cgroup, and only where that
cgroup delegates the memory and pids controllers (lists them in its ``cgroup.subtree_control``,
as a root cgroup can) and is writable. A cgroup beside this process's would sit outside the
limits of whatever holds it (a systemd service's ``MemoryMax``), so none is made there."""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from agent_r1.sandbox.limits import Limits

CONTROLLERS = ("memory", "pids")


def own_cgroup() -> str | None:
    """This process's cgroup v2 folder, where cgroup v2 is mounted, else None."""
    try:
        own = next(line[3:] for line in Path("/proc/self/cgroup").read_text().splitlines() if line.startswith("0::"))
        mount = next(fields[4] for fields in map(str.split, Path("/proc/self/mountinfo").read_text().splitlines())
                     if fields[fields.index("-") + 1] == "cgroup2")
    except (OSError, StopIteration, ValueError):
        return None
    return os.path.normpath(os.path.join(mount, own.strip().lstrip("/")))


def delegated_cgroup() -> tuple[str | None, str | None]:
    """This process's own cgroup v2 folder, if calls' cgroups can be made in it (see the module
    docstring), and None; else None and why not, in words."""
    own = own_cgroup()
    if own is None:
        return None, "no cgroup v2 is mounted"
    try:
        delegated = Path(own, "cgroup.subtree_control").read_text().split()
    except OSError as e:
        return None, f"this process's cgroup {own} cannot be read ({e.strerror})"
    if missing := [c for c in CONTROLLERS if c not in delegated]:
        return None, (f"this process's cgroup {own} delegates no {' and '.join(missing)} controller "
                      f"(its cgroup.subtree_control: {' '.join(delegated) or 'empty'})")
    if not os.access(own, os.W_OK):
        return None, f"this process's cgroup {own} is not writable"
    return own, None


@contextmanager
def call_cgroup(parent: str | None, limits: Limits) -> Iterator[str | None]:
    """A fresh cgroup under `parent` holding the call's memory (``call_memory_mb``, no swap where
    swap is accounted) and processes, removed after the call; None when `parent` is None."""
    if parent is None:
        yield None
        return
    folder = tempfile.mkdtemp(prefix="agent-r1-sandbox-", dir=parent)
    try:
        settings = {"memory.max": limits.call_memory_mb << 20, "pids.max": limits.max_processes + 2}  # + bwrap, pid 1
        if os.path.exists(os.path.join(folder, "memory.swap.max")):
            settings["memory.swap.max"] = 0
        for name, value in settings.items():
            Path(folder, name).write_text(str(value))
        yield folder
    finally:
        os.rmdir(folder)  # every process of the call is gone by now


def enter(folder: str) -> list[str]:
    """The argv of a shell that moves itself into cgroup `folder`, then execs its arguments."""
    return ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', f"{folder}/cgroup.procs"]


def unusable(parent: str, limits: Limits) -> str | None:
    """Why a call cannot run in a cgroup made in `parent` (made, its limits written, a shell moved
    into it the way a call's is), in words; None if it can."""
    try:
        with call_cgroup(parent, limits) as folder:
            moved = subprocess.run([*enter(folder), "true"], capture_output=True, text=True, env={})
    except OSError as e:
        return f"{e.strerror}: {e.filename}"
    if moved.returncode:
        return (moved.stderr.strip().splitlines() or [f"exit status {moved.returncode}"])[-1]
    return None
