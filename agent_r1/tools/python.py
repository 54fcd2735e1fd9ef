"""The ``python`` tool: model-written Python run in an operating-system sandbox.

Every limit is held by the kernel, never by Python code running beside the model's (docs/sandbox.md
has the table with the settings, their defaults and the opt-outs):

- **Sandbox.** bubblewrap (``bwrap``, 0.7 or later) starts the code in new pid, network, IPC, UTS
  and mount namespaces, with its own session (no terminal to inject keys into). bwrap itself starts
  with an empty environment, so no process of the sandbox (its pid 1 included) holds the trainer's.
- **Identity.** As root, ``setpriv`` inside the sandbox switches to a uid of the call's own
  (60000 and up, claimed with a lock file, so no two calls on the machine share one) and drops
  every capability; as another user, the code runs as that user in a new user namespace.
- **Wall clock.** The tool kills the sandbox at ``timeout_s``: SIGKILL to its pid 1, which takes
  every process of the pid namespace with it, daemons and double forks included.
- **CPU, memory, processes, file size, open files.** rlimits set by ``prlimit`` just before the
  interpreter starts: RLIMIT_CPU (SIGXCPU at ``cpu_s``), RLIMIT_AS (allocations fail: MemoryError),
  RLIMIT_NPROC (counted per uid, hence the call's own uid; for a non-root user, per user
  namespace), RLIMIT_FSIZE, RLIMIT_NOFILE, and no core files.
- **The call's memory.** Where a cgroup v2 folder (this process's, or its parent) is writable and
  delegates the memory and pids controllers, each call runs in a cgroup of its own (``memory.max`` = ``call_memory_mb``,
  no swap, ``pids.max``), removed after the call. Everywhere, every process of the sandbox has
  ``oom_score_adj`` 1000, so the OOM killer takes it before the trainer.
- **Files.** The sandbox sees the system directories and the interpreter's prefix read-only, and a
  fresh tmpfs at ``/tmp`` (the working directory, ``disk_mb`` in size) that vanishes with the call.
  Nothing else of the host is there: not the repository, not the host's ``/tmp``, not ``/home``.
- **Network.** The network namespace has only its own loopback: no route out, and the host's
  loopback services are out of reach.
- **Syscall filter.** A seccomp program refuses a user namespace (inside one, code could mount a
  tmpfs of any size), ``memfd_create`` and SysV shared memory (memory outside the address space
  that RLIMIT_AS would not count), the keyrings, io_uring, bpf, perf events, ptrace and
  process_vm_readv/writev.

The machine is checked once per process (by running the sandbox): where it lacks a layer, the
factory raises one line naming the layer and the setting that accepts running without it, if any.
"""

from __future__ import annotations

import errno
import fcntl
import functools
import json
import os
import platform
import re
import select
import selectors
import shutil
import signal
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from agent_r1.tools.base import Tool, ToolOutput
from agent_r1.tools.registry import register_tool

UID_BASE = 60000  # uids UID_BASE .. UID_BASE + UID_COUNT - 1 must belong to no real user
UID_COUNT = 1000
WORKDIR = "/tmp"  # inside the sandbox: the working directory, a fresh tmpfs
MAX_OPEN_FILES = 256
EXIT_GRACE_S = 5.0  # how long a killed sandbox may take to be gone
_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_SYSTEM_FILES = ("/etc/ld.so.cache", "/etc/localtime")
_CLONE_NEWUSER = 0x10000000
MIN_BWRAP = (0, 7)  # --size
# platform.machine(): (AUDIT_ARCH_*, syscall numbers)
SYSCALLS = {
    "x86_64": (0xC000003E, {
        "unshare": 272, "memfd_create": 319, "shmget": 29, "add_key": 248, "request_key": 249, "keyctl": 250,
        "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "bpf": 321, "perf_event_open": 298,
        "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "clone3": 435, "clone": 56}),
    "aarch64": (0xC00000B7, {
        "unshare": 97, "memfd_create": 279, "shmget": 194, "add_key": 217, "request_key": 218, "keyctl": 219,
        "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "bpf": 280, "perf_event_open": 241,
        "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "clone3": 435, "clone": 220}),
}
DENIED_SYSCALLS = ("unshare", "memfd_create", "shmget", "add_key", "request_key", "keyctl", "io_uring_setup",
                   "io_uring_enter", "io_uring_register", "bpf", "perf_event_open", "ptrace", "process_vm_readv",
                   "process_vm_writev")


class SandboxUnavailable(RuntimeError):
    """This machine lacks a layer of the sandbox (the message names it, and the opt-out if any)."""


@dataclass(frozen=True)
class Limits:
    """The limits of one call (the factory's settings of the same names)."""

    timeout_s: float = 10.0
    cpu_s: int = 10
    memory_mb: int = 512
    max_processes: int = 32
    disk_mb: int = 64
    max_output_chars: int = 2000
    call_memory_mb: int = 2048

    def __post_init__(self):
        if not (isinstance(self.timeout_s, (int, float)) and self.timeout_s > 0):
            raise ValueError(f"python tool: timeout_s must be a number of seconds > 0, got {self.timeout_s!r}")
        for name in ("cpu_s", "memory_mb", "max_processes", "disk_mb", "max_output_chars", "call_memory_mb"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"python tool: {name} must be a whole number >= 1, got {value!r}")
        if self.max_output_chars < 200:
            raise ValueError(f"python tool: max_output_chars must be >= 200, got {self.max_output_chars}")


@dataclass(frozen=True)
class Outcome:
    """What one call did. ``reason``: finished, timed out, CPU limit, out of memory or killed."""

    stdout: str
    stderr: str
    exit_code: int | None  # None when the tool killed it at the wall-clock limit
    reason: str
    signal: str | None
    wall_s: float
    stdout_cut: bool
    stderr_cut: bool


def syscall_filter(machine: str) -> bytes | None:
    """The seccomp program (classic BPF, as ``bwrap --seccomp`` reads it) for `machine`, or None
    where its syscall numbers are not known here. It refuses (EPERM) the `DENIED_SYSCALLS`, a clone
    that makes a user namespace and any syscall of another ABI (i386, x32); clone3, whose flags a
    filter cannot read, answers ENOSYS, so the C library falls back to clone."""
    if machine not in SYSCALLS:
        return None
    arch, numbers = SYSCALLS[machine]
    ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    allow = 8 + len(DENIED_SYSCALLS)  # indices of the three returns; a jump target of 0 means "next"
    deny, nosys = allow + 1, allow + 2
    program = [
        (ld, 0, 0, 4),  # seccomp_data.arch
        (jeq, 0, deny, arch),
        (ld, 0, 0, 0),  # seccomp_data.nr
        (jge, deny, 0, 0x40000000),  # the x32 ABI
        *[(jeq, deny, 0, numbers[name]) for name in DENIED_SYSCALLS],
        (jeq, nosys, 0, numbers["clone3"]),
        (jeq, 0, allow, numbers["clone"]),
        (ld, 0, 0, 16),  # the low half of clone's first argument, its flags
        (jset, deny, allow, _CLONE_NEWUSER),
        (ret, 0, 0, 0x7FFF0000),  # SECCOMP_RET_ALLOW
        (ret, 0, 0, 0x00050000 | errno.EPERM),  # SECCOMP_RET_ERRNO
        (ret, 0, 0, 0x00050000 | errno.ENOSYS),
    ]
    return b"".join(struct.pack("=HBBI", code, jt and jt - i - 1, jf and jf - i - 1, k)
                    for i, (code, jt, jf, k) in enumerate(program))


def _inside(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def interpreter_mounts(prefix: str) -> list[str]:
    """bwrap arguments for read-only views of the system directories, a few system files and the
    interpreter's `prefix`."""
    args: list[str] = []
    bound = []
    for path in _SYSTEM_DIRS:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
            bound.append(path)
    for path in [p for p in _SYSTEM_FILES if os.path.exists(p)]:
        args += [*_parents(path), "--ro-bind", path, path]
    if not any(_inside(prefix, d) for d in bound):
        args += [*_parents(prefix), "--ro-bind", prefix, prefix]
    return args


def _parents(path: str) -> list[str]:
    """bwrap arguments making `path`'s parents 0755 (bwrap would make them 0700, which the
    sandbox's uid could not pass through, e.g. for an interpreter under /root)."""
    return [arg for parent in reversed(Path(path).parents[:-1]) for arg in ("--perms", "0755", "--dir", str(parent))]


def _lock_folder() -> int:
    """A descriptor of the folder of uid lock files, ``$TMPDIR/agent-r1-sandbox-uids``, made if
    missing. It must be this user's, mode 0700, and no symlink: in a shared /tmp, anyone else could
    plant one to hold every uid or to make root create files elsewhere."""
    path = os.path.join(tempfile.gettempdir(), "agent-r1-sandbox-uids")
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        raise SandboxUnavailable(f"python tool: the uid lock folder {path} is not a plain folder ({e.strerror}); "
                                 "remove it") from None
    found = os.fstat(fd)
    if found.st_uid != os.geteuid() or found.st_mode & 0o077:
        os.close(fd)
        raise SandboxUnavailable(f"python tool: the uid lock folder {path} has owner uid {found.st_uid} and mode "
                                 f"{stat.S_IMODE(found.st_mode):04o}, not uid {os.geteuid()} and 0700; remove it")
    return fd


@contextmanager
def _claimed_uid(needed: bool) -> Iterator[int | None]:
    """A uid no other call on this machine holds (a lock file per uid, flock-ed for the call), or
    None when `needed` is False."""
    if not needed:
        yield None
        return
    folder = _lock_folder()
    try:
        for uid in range(UID_BASE, UID_BASE + UID_COUNT):
            fd = os.open(str(uid), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=folder)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            try:
                yield uid
            finally:
                os.close(fd)
            return
    finally:
        os.close(folder)
    raise RuntimeError(f"all {UID_COUNT} sandbox uids from {UID_BASE} are in use")


def own_cgroup() -> str | None:
    """This process's cgroup v2 folder, where cgroup v2 is mounted, else None."""
    try:
        own = next(line[3:] for line in Path("/proc/self/cgroup").read_text().splitlines() if line.startswith("0::"))
        mount = next(fields[4] for fields in map(str.split, Path("/proc/self/mountinfo").read_text().splitlines())
                     if fields[fields.index("-") + 1] == "cgroup2")
    except (OSError, StopIteration, ValueError):
        return None
    return os.path.normpath(os.path.join(mount, own.strip().lstrip("/")))


def delegated_cgroup() -> str | None:
    """A cgroup v2 folder where this process can make cgroups with the memory and pids controllers
    (they are in its ``cgroup.subtree_control`` and it is writable): this process's own (as in a
    root cgroup), else its parent (the calls' cgroups beside this process's), else None."""
    own = own_cgroup()
    for folder in (own, os.path.dirname(own)) if own else ():
        try:
            controllers = Path(folder, "cgroup.subtree_control").read_text().split()
        except OSError:
            continue
        if {"memory", "pids"} <= set(controllers) and os.access(folder, os.W_OK):
            return folder
    return None


@contextmanager
def _call_cgroup(parent: str | None, limits: Limits) -> Iterator[str | None]:
    """A fresh cgroup under `parent` holding the call's memory (``call_memory_mb``, no swap) and
    processes, removed after the call; None when `parent` is None."""
    if parent is None:
        yield None
        return
    folder = tempfile.mkdtemp(prefix="agent-r1-sandbox-", dir=parent)
    try:
        settings = {"memory.max": limits.call_memory_mb << 20, "memory.swap.max": 0,
                    "pids.max": limits.max_processes + 2}  # + bwrap and the sandbox's pid 1
        for name, value in settings.items():
            if os.path.exists(os.path.join(folder, name)):
                Path(folder, name).write_text(str(value))
        yield folder
    finally:
        os.rmdir(folder)  # every process of the call is gone by now


def _data_fd(data: bytes) -> int:
    """An in-memory file holding `data`, at offset 0, for bwrap to read."""
    fd = os.memfd_create("agent-r1-sandbox")
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


class _Capture:
    """The first (or, with `tail`, the last) `keep` bytes of a stream, and whether any were cut."""

    def __init__(self, keep: int, tail: bool):
        self.keep, self.tail, self.data, self.cut = keep, tail, bytearray(), False

    def add(self, chunk: bytes) -> None:
        self.data += chunk
        if len(self.data) > self.keep:
            self.cut = True
            if self.tail:
                del self.data[:len(self.data) - self.keep]
            else:
                del self.data[self.keep:]

    def text(self) -> str:
        return self.data.decode("utf-8", "replace")


def _collect(proc: subprocess.Popen, deadline: float, keep: int) -> tuple[_Capture, _Capture, bool]:
    """Read stdout (its head) and stderr (its tail) until both close and the process exits, or
    until `deadline`; the flag says the deadline came first."""
    out, err = _Capture(keep, tail=False), _Capture(keep, tail=True)
    streams = {proc.stdout: out, proc.stderr: err}
    with selectors.DefaultSelector() as selector:
        for stream in streams:
            selector.register(stream, selectors.EVENT_READ)
        while selector.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                return out, err, True
            for key, _ in selector.select(left):
                chunk = os.read(key.fd, 1 << 16)
                if chunk:
                    streams[key.fileobj].add(chunk)
                else:
                    selector.unregister(key.fileobj)
    try:
        proc.wait(max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        return out, err, True
    return out, err, False


def _readable(fd: int, timeout_s: float) -> bool:
    """Whether `fd` is readable (or closed) within `timeout_s`; poll works for any descriptor
    number, where select stops at 1023."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(max(0, int(timeout_s * 1000))))


def _sandbox_init(info_fd: int, deadline: float) -> int | None:
    """A pidfd of the sandbox's pid 1, from what bwrap writes to --info-fd (None if bwrap wrote
    nothing, or pid 1 is already gone). When pid 1 is gone, so is every process of the sandbox."""
    data = b""
    while (left := deadline - time.monotonic()) > 0 and _readable(info_fd, left):
        chunk = os.read(info_fd, 4096)
        if not chunk:
            break
        data += chunk
    try:
        return os.pidfd_open(json.loads(data)["child-pid"])
    except (ValueError, KeyError, TypeError, ProcessLookupError):
        return None


def _end(proc: subprocess.Popen, init: int | None) -> None:
    """Kill what is left of the sandbox and wait until every process of it is gone."""
    try:
        if init is not None:
            try:
                signal.pidfd_send_signal(init, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.kill()
        proc.wait()
        if init is not None:
            _readable(init, EXIT_GRACE_S)
    finally:
        if init is not None:
            os.close(init)


def _reason(returncode: int, timed_out: bool, stderr: str) -> tuple[str, str | None]:
    """Why the program stopped, and the signal that stopped it. bwrap reports a death by signal
    N as exit status 128 + N."""
    if timed_out:
        return "timed out", "SIGKILL"
    if 128 < returncode <= 128 + signal.NSIG:
        try:
            name = signal.Signals(returncode - 128).name
        except ValueError:
            name = f"signal {returncode - 128}"
        return ("CPU limit" if name == "SIGXCPU" else "killed"), name
    # any line: the processes of one call write to one stderr, so another's traceback may come last
    if returncode != 0 and any(line.startswith("MemoryError") for line in stderr.splitlines()):
        return "out of memory", None
    return "finished", None


@dataclass(frozen=True)
class Sandbox:
    """How a call is started: the programs, the interpreter and its mounts, the layers, the limits."""

    bwrap: str
    prlimit: str
    choom: str
    setpriv: str | None  # as root: switches to the call's uid; None: the code runs as this process's user
    interpreter: str
    mounts: tuple[str, ...]
    syscall_filter: bytes | None  # None only with allow_no_syscall_filter
    cgroup: str | None = None  # the cgroup v2 folder each call gets a cgroup of its own in (delegated_cgroup)
    limits: Limits = Limits()

    def command(self, uid: int | None, code_fd: int, info_fd: int, filter_fd: int | None,
                cgroup: str | None = None) -> list[str]:
        """The argv of one call: (with a cgroup) a shell that moves itself into it, choom (the
        OOM killer takes the sandbox first), bwrap, then (as root) setpriv, then prlimit, then the
        interpreter."""
        lim = self.limits
        enter = ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', f"{cgroup}/cgroup.procs"] if cgroup else []
        args = [*enter, self.choom, "-n", "1000", "--", self.bwrap, "--unshare-pid", "--unshare-net", "--unshare-ipc",
                "--unshare-uts", "--unshare-cgroup-try", "--die-with-parent", "--new-session",
                "--setenv", "HOME", WORKDIR, "--setenv", "PATH", "/usr/bin:/bin"]
        if os.geteuid() != 0:
            args.append("--unshare-user")
        elif uid is None:
            args += ["--cap-drop", "ALL"]
        args += [*self.mounts, "--proc", "/proc", "--dev", "/dev", "--remount-ro", "/dev",
                 "--perms", "1777", "--size", str(lim.disk_mb << 20), "--tmpfs", WORKDIR,
                 "--file", str(code_fd), f"{WORKDIR}/main.py", "--chdir", WORKDIR, "--info-fd", str(info_fd)]
        if filter_fd is not None:
            args += ["--seccomp", str(filter_fd)]
        args.append("--")
        if uid is not None:
            args += [self.setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--inh-caps=-all",
                     "--bounding-set=-all", "--"]
        return args + [self.prlimit, f"--cpu={lim.cpu_s}:{lim.cpu_s + 1}", f"--as={lim.memory_mb << 20}",
                       f"--nproc={lim.max_processes}", f"--fsize={lim.disk_mb << 20}",
                       f"--nofile={MAX_OPEN_FILES}", "--core=0", "--",
                       self.interpreter, "-I", "-S", f"{WORKDIR}/main.py"]

    def run(self, code: str) -> Outcome:
        """Run `code` in a fresh sandbox; when this returns, no process of it is left."""
        with _claimed_uid(self.setpriv is not None) as uid, _call_cgroup(self.cgroup, self.limits) as cgroup:
            return self._run_as(uid, cgroup, code)

    def _start(self, uid: int | None, cgroup: str | None, code: str) -> tuple[subprocess.Popen, int]:
        """Start the sandbox; return it and the read end of its --info-fd. bwrap starts with an
        empty environment: its pid 1 stays in the sandbox, where the code could read its environ."""
        info_read, info_write = os.pipe()
        passed = [_data_fd(code.encode("utf-8", "replace")), info_write]
        if self.syscall_filter is not None:
            passed.append(_data_fd(self.syscall_filter))
        try:
            argv = self.command(uid, passed[0], info_write, passed[2] if len(passed) > 2 else None, cgroup)
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    pass_fds=passed, process_group=0, cwd="/", env={})
        except BaseException:
            os.close(info_read)
            raise
        finally:
            for fd in passed:
                os.close(fd)
        return proc, info_read

    def _run_as(self, uid: int | None, cgroup: str | None, code: str) -> Outcome:
        start = time.monotonic()
        deadline = start + self.limits.timeout_s
        proc, info_read = self._start(uid, cgroup, code)
        init = None
        try:
            init = _sandbox_init(info_read, deadline)
            out, err, timed_out = _collect(proc, deadline, 4 * self.limits.max_output_chars)
        finally:
            try:
                os.close(info_read)
                _end(proc, init)
            finally:
                proc.stdout.close()
                proc.stderr.close()
        reason, signal_name = _reason(proc.returncode, timed_out, err.text())
        return Outcome(stdout=out.text(), stderr=err.text(), exit_code=None if timed_out else proc.returncode,
                       reason=reason, signal=signal_name, wall_s=time.monotonic() - start,
                       stdout_cut=out.cut, stderr_cut=err.cut)


_CUT = "… [truncated]"


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


def observation(o: Outcome, limits: Limits) -> tuple[str, bool]:
    """What the model reads, and whether it was cut: the stdout alone when the program finished
    with exit status 0 and wrote nothing to stderr; else the stdout, a labelled stderr, and a
    status line. At most ``max_output_chars``: stdout keeps its head, stderr its tail (where a
    traceback's error is)."""
    limit = limits.max_output_chars
    if o.reason == "finished" and o.exit_code == 0 and not o.stderr:
        text = _head(o.stdout, limit, o.stdout_cut)
        return text or "(no output)", text != o.stdout
    status = _status(o, limits)
    stdout, stderr = o.stdout.rstrip("\n"), o.stderr.rstrip("\n")
    room = limit - len(status) - len("\nstderr:\n\n")
    err_room = min(len(stderr), max(room // 2, room - len(stdout)))
    parts = [_head(stdout, room - err_room, o.stdout_cut), _tail(stderr, err_room, o.stderr_cut)]
    truncated = parts != [stdout, stderr]
    if parts[1]:
        parts[1] = "stderr:\n" + parts[1]
    return "\n".join([p for p in parts if p] + [status]), truncated


_FORK_PROBE = """import os
try:
    pid = os.fork()
except OSError:
    print("capped")
else:
    if pid == 0:
        os._exit(0)
    print("forked")
"""


def fork_probe(sandbox: Sandbox) -> str:
    """Fork once under a cap of one process: "capped" where the process cap holds, "forked" where
    it does not, else the last line of what went wrong."""
    o = replace(sandbox, limits=Limits(max_processes=1)).run(_FORK_PROBE)
    if o.exit_code == 0:
        return o.stdout.strip()
    return (o.stderr.strip().splitlines() or [f"{o.reason}, exit status {o.exit_code}"])[-1]


def _missing(layer: str, why: str, opt_out: str | None) -> SandboxUnavailable:
    accept = f"set {opt_out}: true to run without it" if opt_out else "no setting runs code without it"
    return SandboxUnavailable(f"python tool: the {layer} layer is missing: {why}; {accept}")


def _interpreter(setting: str | None) -> tuple[str, str]:
    """The sandbox's interpreter (`setting`, else this process's own) and its prefix, refused in
    one line where the sandbox's uid cannot read them. The code runs with ``-I -S``, so any
    Python 3 serves."""
    path = os.path.realpath(setting or sys.executable)
    prefix = str(Path(path).parents[1]) if setting else os.path.realpath(sys.base_prefix)
    try:
        if os.geteuid() == 0:  # bwrap binds them as root; the call's own uid then runs them as "others"
            readable = all(os.stat(p).st_mode & 0o005 == 0o005 for p in (path, prefix)) and os.path.isfile(path)
        else:  # bwrap binds them as this user, who is the sandbox's user too
            readable = all(os.access(p, os.R_OK | os.X_OK) for p in (path, prefix)) and os.path.isfile(path)
    except OSError:
        readable = False
    if not readable:
        raise SandboxUnavailable(f"python tool: the sandbox's uid cannot read the interpreter {path} (missing or "
                                 "not readable); set interpreter: to a Python 3 it can read, e.g. /usr/bin/python3")
    return path, prefix


def _bwrap(setting: str) -> str:
    """The path of bubblewrap, refused in one line where it is missing or older than 0.7."""
    found = shutil.which(setting)
    if found is None:
        raise _missing("sandbox", f"bubblewrap not found at {setting!r} (apt-get install bubblewrap, or set bwrap: "
                       "to its path)", None)
    answer = subprocess.run([found, "--version"], capture_output=True, text=True, env={}).stdout.strip()
    version = re.search(r"(\d+)\.(\d+)[.\d]*", answer)
    if version is None or tuple(map(int, version.groups())) < MIN_BWRAP:
        raise _missing("sandbox", f"{found} is bubblewrap {version[0] if version else repr(answer)}, and 0.7 or "
                       "later is needed (for --size)", None)
    return found


def _programs(bwrap: str, allow_no_syscall_filter: bool, interpreter: str | None) -> Sandbox:
    """The sandbox's programs, interpreter, syscall filter and cgroup, found on this machine (not yet run)."""
    found = _bwrap(bwrap)
    names = ("prlimit", "choom", "setpriv") if os.geteuid() == 0 else ("prlimit", "choom")
    helpers = {name: shutil.which(name) for name in names}
    if absent := [name for name, path in helpers.items() if path is None]:
        raise _missing("resource limits", f"util-linux's {' and '.join(absent)} not found", None)
    machine = platform.machine()
    program = syscall_filter(machine)
    if program is None and not allow_no_syscall_filter:
        raise _missing("syscall filter", f"no seccomp filter for the {machine} architecture", "allow_no_syscall_filter")
    path, prefix = _interpreter(interpreter)
    return Sandbox(bwrap=found, prlimit=helpers["prlimit"], choom=helpers["choom"], setpriv=helpers.get("setpriv"),
                   interpreter=path, mounts=tuple(interpreter_mounts(prefix)), syscall_filter=program,
                   cgroup=delegated_cgroup())


@functools.lru_cache(maxsize=None)
def checked_sandbox(bwrap: str = "bwrap", allow_no_process_cap: bool = False,
                    allow_no_syscall_filter: bool = False, interpreter: str | None = None) -> Sandbox:
    """The sandbox with every layer this machine provides, checked by running it (once per process
    and settings). Raises `SandboxUnavailable` where a layer is missing and not opted out of."""
    sandbox = _programs(bwrap, allow_no_syscall_filter, interpreter)
    result = fork_probe(sandbox)
    if result == "capped":
        return sandbox
    if result == "forked":
        why = "RLIMIT_NPROC does not hold for the sandbox's user"
    else:  # the sandbox did not run: without the uid switch?
        plain = replace(sandbox, setpriv=None)
        plain_result = fork_probe(plain) if sandbox.setpriv else result
        if plain_result not in ("capped", "forked"):
            raise _missing("sandbox", f"bwrap cannot start it here ({plain_result})", None)
        sandbox, why = plain, f"cannot switch to an unprivileged uid ({result})"
    if not allow_no_process_cap:
        raise _missing("process cap", why, "allow_no_process_cap")
    return sandbox


_PARAMETERS = {
    "type": "object",
    "properties": {"code": {"type": "string", "description": "The Python program; print() what you want to see."}},
    "required": ["code"],
}


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
    limits = Limits(timeout_s, cpu_s, memory_mb, max_processes, disk_mb, max_output_chars, call_memory_mb)
    concurrency = (os.cpu_count() or 1) if max_concurrency is None else max_concurrency
    if not (isinstance(concurrency, int) and concurrency >= 1 and queue_timeout_s > 0):
        raise ValueError(f"python tool: max_concurrency must be >= 1 and queue_timeout_s > 0, got {max_concurrency!r} "
                         f"and {queue_timeout_s!r}")
    sandbox = replace(checked_sandbox(bwrap, allow_no_process_cap, allow_no_syscall_filter, interpreter), limits=limits)
    slots = threading.BoundedSemaphore(concurrency)

    def python(code: str) -> ToolOutput:
        if not slots.acquire(timeout=queue_timeout_s):
            raise TimeoutError(f"no sandbox came free within {queue_timeout_s:g} s ({concurrency} calls run at once)")
        try:
            outcome = sandbox.run(code)
        finally:
            slots.release()
        text, truncated = observation(outcome, limits)
        return ToolOutput(text, {"exit_code": outcome.exit_code, "reason": outcome.reason, "signal": outcome.signal,
                                 "wall_s": round(outcome.wall_s, 3), "truncated": truncated})

    description = (f"Run a Python 3 program and return what it prints (and its errors). Standard library only, no "
                   f"network, a fresh empty working directory each call; limits: {timeout_s:g} s, {memory_mb} MB.")
    return Tool(fn=python, name="python", description=description, parameters=_PARAMETERS,
                timeout_s=queue_timeout_s + timeout_s + 2 * EXIT_GRACE_S, max_output_chars=max_output_chars,
                thread_safe=True)
