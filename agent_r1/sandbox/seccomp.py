"""The syscall filter: a seccomp program (classic BPF, as ``bwrap --seccomp`` reads it) that
refuses what the other layers would not hold.

- a user namespace (inside one, code could mount a tmpfs of any size, past the disk cap);
- ``memfd_create`` and SysV shared memory (memory outside the address space RLIMIT_AS counts);
- the keyrings (the trainer's session keyring), io_uring, ``bpf``, ``perf_event_open`` (large
  kernel surfaces code has no use for), ``ptrace`` and ``process_vm_readv``/``writev`` (other
  processes of the call's uid);
- any syscall of another ABI (i386, x32).
"""

from __future__ import annotations

import errno
import struct

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
_CLONE_NEWUSER = 0x10000000


def syscall_filter(machine: str) -> bytes | None:
    """The seccomp program for `machine` (``platform.machine()``), or None where its syscall
    numbers are not known here. It refuses (EPERM) the `DENIED_SYSCALLS`, a clone that makes a
    user namespace and any syscall of another ABI (i386, x32); clone3, whose flags a filter cannot
    read, answers ENOSYS, so the C library falls back to clone."""
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
