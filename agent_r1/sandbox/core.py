"""The sandbox: how one call is started (the exec chain ``choom → bwrap → setpriv → prlimit →
interpreter``, in a cgroup of its own where there is one), run to its end, and read."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass

from agent_r1.sandbox import procio
from agent_r1.sandbox.cgroups import call_cgroup, enter
from agent_r1.sandbox.limits import Limits, Outcome
from agent_r1.sandbox.uids import claimed_uid

WORKDIR = "/tmp"  # inside the sandbox: the working directory, a fresh tmpfs
MAX_OPEN_FILES = 256


def reason(returncode: int, timed_out: bool, stderr: str) -> tuple[str, str | None]:
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
        args = [*(enter(cgroup) if cgroup else []), self.choom, "-n", "1000", "--", self.bwrap, "--unshare-pid",
                "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try", "--die-with-parent",
                "--new-session", "--setenv", "HOME", WORKDIR, "--setenv", "PATH", "/usr/bin:/bin"]
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
        with claimed_uid(self.setpriv is not None) as uid, call_cgroup(self.cgroup, self.limits) as cgroup:
            return self._run_as(uid, cgroup, code)

    def _start(self, uid: int | None, cgroup: str | None, code: str) -> tuple[subprocess.Popen, int]:
        """Start the sandbox; return it and the read end of its --info-fd. bwrap starts with an
        empty environment: its pid 1 stays in the sandbox, where the code could read its environ."""
        info_read, info_write = os.pipe()
        passed = [procio.data_fd(code.encode("utf-8", "replace")), info_write]
        if self.syscall_filter is not None:
            passed.append(procio.data_fd(self.syscall_filter))
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
            init = procio.sandbox_init(info_read, deadline)
            out, err, timed_out = procio.collect(proc, deadline, self.limits.output_bytes)
        finally:
            try:
                os.close(info_read)
                procio.end(proc, init)
            finally:
                proc.stdout.close()
                proc.stderr.close()
        why, signal_name = reason(proc.returncode, timed_out, err.text())
        return Outcome(stdout=out.text(), stderr=err.text(), exit_code=None if timed_out else proc.returncode,
                       reason=why, signal=signal_name, wall_s=time.monotonic() - start,
                       stdout_cut=out.cut, stderr_cut=err.cut)
