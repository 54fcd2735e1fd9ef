"""The tests' one scanner of /proc: which live processes match, by command line, owner, parent,
process group, environment or where their stdout goes."""

from __future__ import annotations

import os
import time
from pathlib import Path


class Proc:
    """One process, read from /proc/PID as needed (any read may raise OSError: it ended)."""

    def __init__(self, pid: int):
        self.pid = pid
        stat = Path(f"/proc/{pid}/stat").read_text()
        fields = stat[stat.rindex(")") + 2:].split()  # after the command name: state, ppid, pgrp, ...
        self.state, self.ppid, self.pgid = fields[0], int(fields[1]), int(fields[2])

    @property
    def cmdline(self) -> bytes:
        """The arguments, each followed by a NUL byte."""
        return Path(f"/proc/{self.pid}/cmdline").read_bytes()

    @property
    def environ(self) -> bytes:
        return Path(f"/proc/{self.pid}/environ").read_bytes()

    @property
    def uid(self) -> int:
        status = Path(f"/proc/{self.pid}/status").read_text()
        return int(next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1])

    @property
    def stdout(self) -> Path:
        return Path(os.readlink(f"/proc/{self.pid}/fd/1"))


def live(match) -> list[int]:
    """The pids of the live (not zombie) processes for which ``match(Proc)`` is true."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                proc = Proc(int(entry))
                if proc.state != "Z" and match(proc):
                    out.append(proc.pid)
            except (OSError, ValueError):  # it ended meanwhile
                pass
    return out


def group(pgid: int) -> list[int]:
    """The live processes of process group ``pgid``."""
    return live(lambda p: p.pgid == pgid)


def children_of(parent: int) -> list[int]:
    return live(lambda p: p.ppid == parent)


def watchdogs_of(parent: int, serving: bytes = b"") -> set[int]:
    """The watchdogs (``lifetime.py --watch``) that ``parent`` started, of commands containing ``serving``."""
    return set(live(lambda p: f"lifetime.py\0--watch\0{parent}\0".encode() in p.cmdline and serving in p.cmdline))


def until(condition, within_s: float = 30.0) -> bool:
    """Whether ``condition()`` holds within ``within_s`` (polled)."""
    deadline = time.monotonic() + within_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)
    return condition()


def group_ends(pgid: int, within_s: float = 30.0) -> bool:
    """Whether process group ``pgid`` is gone within ``within_s`` (a server's, after its owner died)."""
    return until(lambda: not group(pgid), within_s)


def waits_for_lock(pid: int) -> bool:
    """Whether process ``pid`` is blocked waiting for a file lock (a ``->`` entry of /proc/locks)."""
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if len(fields) > 5 and fields[1] == "->" and fields[5] == str(pid):
            return True
    return False
