"""Outside processes that belong to the run (DESIGN.md, contract 11): the one way this code starts
a server (vLLM, an MCP server, the game server) that must stop with the trainer, however the
trainer ends, SIGKILL included.

`start` runs the command under a watchdog — this file run as a script — that leads a process group
(a session) of its own holding the command and whatever it starts:

- the watchdog ends the whole group (SIGTERM, then SIGKILL after ``grace_s`` to every other
  process of it) when the trainer is gone (it polls its parent's pid: ``PR_SET_PDEATHSIG`` on the
  watchdog would fire when the *thread* that started it ends, e.g. a Prefect task's or a rollout
  worker's), when it gets SIGTERM, or when the command exits; then it exits with the command's own
  status: its exit code, or death by the same signal (the returncode of `start`'s process is the
  command's, e.g. 3, or -15 for a command that SIGTERM ended);
- the command dies with the watchdog (`die_with`: ``PR_SET_PDEATHSIG``, set by the watchdog's
  one thread), should the watchdog itself be SIGKILLed (a ``pkill -9`` that matches it);
- `stop` ends the group from the trainer: SIGTERM, then SIGKILL after ``grace_s``, then reaps
  the watchdog. It signals the group only while the watchdog is unreaped, so its pid (the group's
  id) cannot have been reused.
- ``remove_when_orphaned``: paths (globs) of the trainer's that the watchdog removes once the
  trainer is gone (the vLLM weights it wrote to ``/dev/shm``), so that its SIGKILL leaves none;
- ``max_line_bytes``: the command's stdout passes through the watchdog, and a line longer than this
  (a flood without a newline) ends the group, with a line on stderr saying why, instead of
  being buffered by the reader without limit. Wherever the line falls in a read, every line
  before it is passed on whole, and of it exactly its first ``max_line_bytes`` bytes.

Code that starts the process itself (the MCP SDK) runs `watched` (the command line) in a session
of its own. Processes forked by the command (game processes) call `die_with` themselves.

Standard library only: the watchdog runs under other Pythons (the vLLM environment's), as
``python -I lifetime.py --watch PARENT [--grace S] [--max-line-bytes N] [--remove GLOB]... -- COMMAND...``.
"""

from __future__ import annotations

import ctypes
import functools
import glob
import os
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

_SCRIPT = str(Path(__file__).resolve())


def watched(cmd: list[str], *, python: str | os.PathLike = sys.executable, grace_s: float = 10.0,
            max_line_bytes: int | None = None, remove_when_orphaned: list[str] = ()) -> list[str]:
    """The command line that runs `cmd` under the watchdog, tied to this process; whoever starts it
    must give it a session of its own (``start_new_session=True``)."""
    options = ["--grace", f"{grace_s:g}"] + (["--max-line-bytes", str(max_line_bytes)] if max_line_bytes else [])
    options += [x for pattern in remove_when_orphaned for x in ("--remove", str(pattern))]
    return [str(python), "-I", _SCRIPT, "--watch", str(os.getpid()), *options, "--", *map(str, cmd)]


def start(cmd: list[str], *, python: str | os.PathLike = sys.executable, grace_s: float = 10.0,
          max_line_bytes: int | None = None, remove_when_orphaned: list[str] = (), **popen) -> subprocess.Popen:
    """Start `cmd` under the watchdog (see the module docstring); `popen` are `subprocess.Popen`'s
    other arguments (``stdout``, ``env``, ``cwd``, ``pass_fds``: they reach `cmd`). The returned
    process is the watchdog, the group's leader; end it with `stop`."""
    line = watched(cmd, python=python, grace_s=grace_s, max_line_bytes=max_line_bytes,
                   remove_when_orphaned=remove_when_orphaned)
    return subprocess.Popen(line, start_new_session=True, **popen)


def stop(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """End the process group `proc` leads: SIGTERM, SIGKILL after `grace_s` to what is left, then
    reap `proc`. Idempotent; once `proc` is reaped (its pid free for reuse) nothing is signalled."""
    if proc.returncode is None:
        _signal_group(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while _exited(proc.pid) is False and time.monotonic() < deadline:
            time.sleep(0.05)
        if _exited(proc.pid) is not None:  # not reaped: the (zombie) leader still holds the group's id
            _signal_group(proc.pid, signal.SIGKILL)
    proc.wait()


def die_with(parent: int) -> None:
    """Have the kernel SIGKILL this process when `parent` (its parent's pid, read before the fork)
    dies: ``PR_SET_PDEATHSIG``, for a `subprocess` ``preexec_fn`` or a freshly forked child; exit
    at once if `parent` is gone already. Linux only; elsewhere nothing. The signal comes when the
    parent *thread* ends: only for a child of a process's main thread."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:
        os._exit(1)


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _exited(pid: int) -> bool | None:
    """Whether our child `pid` has exited, without reaping it (it stays a zombie); None once it is
    reaped (by `Popen.poll`, say)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return None


# ------------------------------------------------------------------------------ the watchdog
def _relay(pipe: int, limit: int, why: list[str | None]) -> None:
    """Copy the command's stdout to ours; on a line longer than `limit` bytes (its newline not
    counted), pass on the lines before it and its first `limit` bytes, say so in `why` and stop."""
    line = 0  # bytes of the current line passed on so far
    while chunk := os.read(pipe, 65536):
        end, start = len(chunk), 0
        while start < len(chunk):  # each line (or piece of one) in the chunk
            newline = chunk.find(b"\n", start)
            stop = newline if newline >= 0 else len(chunk)
            if line + stop - start > limit:
                end = start + limit - line
                break
            line, start = (0, newline + 1) if newline >= 0 else (line + stop - start, len(chunk))
        try:
            view = memoryview(chunk)[:end]
            while view:
                view = view[os.write(1, view):]
        except OSError:  # the reader is gone
            return
        if end < len(chunk):
            why.append(f"the process wrote a stdout line of more than {limit} bytes")
            return


def _member(pid: int, group: int) -> tuple[int, int] | None:
    """(pid, start time) of process `pid` if it is a live (not zombie) member of process group `group`."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()  # state, ppid, pgrp, ... (the 3rd field of stat on)
    return (pid, int(fields[19])) if int(fields[2]) == group and fields[0] not in "ZXx" else None


def _kill_the_others() -> None:
    """SIGKILL every other process of this process group, this one spared, scanning /proc until a
    scan finds none not already killed (a process forked meanwhile is found by the next scan).
    Each is signalled through a pidfd opened before its group is read, so that a pid reused
    meanwhile is never signalled. Without pidfds (Python < 3.9, Linux < 5.3): the whole group,
    this process included."""
    me, killed = os.getpid(), set()
    while True:
        found = set()
        for pid in (int(e) for e in os.listdir("/proc") if e.isdigit() and int(e) != me):
            try:
                fd = os.pidfd_open(pid)
            except ProcessLookupError:
                continue
            except (AttributeError, OSError):  # no pidfds: the whole group; this process ends here
                os.killpg(0, signal.SIGKILL)
            try:
                if (key := _member(pid, me)) and key not in killed:
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
                    found.add(key)
            except ProcessLookupError:  # it ended meanwhile
                pass
            finally:
                os.close(fd)
        if not found:
            return
        killed |= found


def _exit_as(status: int) -> int:
    """The exit status that reports the command's `status` (a Popen returncode): itself, or, for a
    death by signal N, this process's own death by N (without a core file)."""
    if status >= 0:
        return status
    try:
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        signal.signal(-status, signal.SIG_DFL)
    except (OSError, ValueError):  # SIGKILL, SIGSTOP: no handler to reset
        pass
    os.kill(os.getpid(), -status)
    return 128 - status  # a signal whose default is not to end a process


def _watch(parent: int, cmd: list[str], grace_s: float, max_line_bytes: int | None, remove: list[str]) -> int:
    """Run `cmd` in this process group until it exits, `parent` dies, SIGTERM comes or (with
    `max_line_bytes`) its stdout has a line too long; then end the rest of the group and exit with
    the command's status."""
    why: list[str | None] = []  # why to end the group (None: asked to, by a signal; nothing to say)
    signal.signal(signal.SIGTERM, lambda *_: why.append(None))
    signal.signal(signal.SIGINT, lambda *_: why.append(None))
    child = subprocess.Popen(cmd, close_fds=False, preexec_fn=functools.partial(die_with, os.getpid()),
                             stdout=subprocess.PIPE if max_line_bytes else None)
    relay = None
    if max_line_bytes:
        relay = threading.Thread(target=_relay, args=(child.stdout.fileno(), max_line_bytes, why), daemon=True)
        relay.start()
    try:
        while child.poll() is None and not why and os.getppid() == parent:
            time.sleep(0.1)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the group's SIGTERM reaches this process too
        reason = why[0] if why else None if child.returncode is not None else f"its owner {parent} is gone"
        if reason:  # (a command that exited said why itself)
            print(f"agent-r1 watchdog: {reason}; ending its process group", file=sys.stderr, flush=True)
    except OSError:  # nobody reads our stderr any more (the owner's pipe)
        pass
    finally:
        os.killpg(0, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if os.getppid() != parent:
            for path in (p for pattern in remove for p in glob.glob(pattern)):
                shutil.rmtree(path, ignore_errors=True)
        _kill_the_others()  # whatever is left of the group (vLLM's engine core too)
    if relay is not None:  # what the command wrote before it ended (the group is gone: the pipe ends)
        relay.join(grace_s)
    return _exit_as(child.wait())


def _main(argv: list[str]) -> int:
    usage = "usage: lifetime.py --watch PARENT_PID [--grace S] [--max-line-bytes N] [--remove GLOB]... -- COMMAND..."
    if "--" not in argv or argv[:1] != ["--watch"] or len(argv[:argv.index("--")]) % 2:
        sys.exit(usage)
    options, cmd = argv[:argv.index("--")], argv[argv.index("--") + 1:]
    pairs = list(zip(options[2::2], options[3::2]))
    if not cmd or {k for k, _ in pairs} - {"--grace", "--max-line-bytes", "--remove"}:
        sys.exit(usage)
    values = dict(pairs)
    limit = int(values["--max-line-bytes"]) if "--max-line-bytes" in values else None
    remove = [v for k, v in pairs if k == "--remove"]
    return _watch(int(options[1]), cmd, float(values.get("--grace", 10.0)), limit, remove)


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
