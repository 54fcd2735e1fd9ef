"""A uid of the call's own (as root): RLIMIT_NPROC counts a uid's processes, so no two calls on
the machine may share one. Uids `UID_BASE` .. `UID_BASE` + `UID_COUNT` - 1 are claimed with a lock
file each (``flock``), in a folder only this user may write."""

from __future__ import annotations

import fcntl
import os
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

from agent_r1.sandbox.limits import SandboxUnavailable

UID_BASE = 60000  # uids UID_BASE .. UID_BASE + UID_COUNT - 1 must belong to no real user
UID_COUNT = 1000


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
        raise SandboxUnavailable(f"the uid lock folder {path} is not a plain folder ({e.strerror}); remove it") from None
    found = os.fstat(fd)
    if found.st_uid != os.geteuid() or found.st_mode & 0o077:
        os.close(fd)
        raise SandboxUnavailable(f"the uid lock folder {path} has owner uid {found.st_uid} and mode "
                                 f"{stat.S_IMODE(found.st_mode):04o}, not uid {os.geteuid()} and 0700; remove it")
    return fd


@contextmanager
def claimed_uid(needed: bool) -> Iterator[int | None]:
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
