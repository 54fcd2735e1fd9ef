"""Untrusted code run in an operating-system sandbox (DESIGN.md, contract 10): the layers the
``python`` tool uses, usable by any tool or server that runs code it does not trust.

Every limit is held by the kernel, never by Python code running beside the untrusted code
(docs/sandbox.md has the table with the settings, their defaults and the opt-outs):

- **Sandbox** (`core`). bubblewrap (``bwrap``, 0.7 or later) starts the code in new pid,
  network, IPC, UTS and mount namespaces, with its own session (no terminal to inject keys into).
  bwrap itself starts with an empty environment, so no process of the sandbox (its pid 1
  included) holds the trainer's.
- **Identity** (`uids`). As root, ``setpriv`` inside the sandbox switches to a uid of the call's
  own (60000 and up, claimed with a lock file, so no two calls on the machine share one) and
  drops every capability; as another user, the code runs as that user in a new user namespace.
- **Wall clock** (`procio`). The sandbox is killed at ``timeout_s``: SIGKILL to its pid 1, which
  takes every process of the pid namespace with it, daemons and double forks included.
- **CPU, memory, processes, file size, open files** (`core`). rlimits set by ``prlimit`` just
  before the interpreter starts: RLIMIT_CPU (SIGXCPU at ``cpu_s``), RLIMIT_AS (allocations
  fail: MemoryError), RLIMIT_NPROC (counted per uid, hence the call's own uid; for a non-root
  user, per user namespace), RLIMIT_FSIZE, RLIMIT_NOFILE, and no core files.
- **The call's memory** (`cgroups`). Where this process's own cgroup v2 is writable and
  delegates the memory and pids controllers, each call runs in a cgroup of its own inside it
  (``memory.max`` = ``call_memory_mb``, no swap, ``pids.max``), removed after the call; elsewhere
  a warning names the missing layer. Everywhere, every process of the sandbox has
  ``oom_score_adj`` 1000, so the OOM killer takes it before the trainer.
- **Files** (`mounts`). The sandbox sees the system directories and the interpreter's prefix
  read-only, and a fresh tmpfs at ``/tmp`` (the working directory, ``disk_mb`` in size) that
  vanishes with the call. Nothing else of the host is there.
- **Network.** The network namespace has only its own loopback: no route out, and the host's
  loopback services are out of reach.
- **Syscall filter** (`seccomp`). No user namespace, ``memfd_create`` or SysV shared memory, no
  keyrings, io_uring, bpf, perf events, ptrace or process_vm_readv/writev.

`checked_sandbox` (`check`) checks the machine once per process by running the sandbox, and
raises `SandboxUnavailable`, one line naming the layer and the setting that accepts running
without it, if any. `Sandbox.run` runs one program and returns its `Outcome`.
"""

from agent_r1.sandbox.cgroups import call_cgroup, delegated_cgroup, own_cgroup
from agent_r1.sandbox.check import calls_cgroup, checked, checked_sandbox, fork_probe, found_sandbox
from agent_r1.sandbox.core import WORKDIR, Sandbox
from agent_r1.sandbox.limits import Limits, Outcome, SandboxUnavailable
from agent_r1.sandbox.procio import EXIT_GRACE_S
from agent_r1.sandbox.seccomp import DENIED_SYSCALLS, SYSCALLS, syscall_filter
from agent_r1.sandbox.uids import UID_BASE, UID_COUNT

__all__ = [
    "DENIED_SYSCALLS",
    "EXIT_GRACE_S",
    "SYSCALLS",
    "UID_BASE",
    "UID_COUNT",
    "WORKDIR",
    "Limits",
    "Outcome",
    "Sandbox",
    "SandboxUnavailable",
    "call_cgroup",
    "calls_cgroup",
    "checked",
    "checked_sandbox",
    "delegated_cgroup",
    "fork_probe",
    "found_sandbox",
    "own_cgroup",
    "syscall_filter",
]
