"""What the sandbox sees of the host's files: read-only views of the system directories, a few
system files and the interpreter's prefix (bwrap arguments). Nothing else of the host is there."""

from __future__ import annotations

import os
from pathlib import Path

SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
SYSTEM_FILES = ("/etc/ld.so.cache", "/etc/localtime")


def _inside(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def interpreter_mounts(prefix: str) -> list[str]:
    """bwrap arguments for read-only views of the system directories, a few system files and the
    interpreter's `prefix`."""
    args: list[str] = []
    bound = []
    for path in SYSTEM_DIRS:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
            bound.append(path)
    for path in [p for p in SYSTEM_FILES if os.path.exists(p)]:
        args += [*_parents(path), "--ro-bind", path, path]
    if not any(_inside(prefix, d) for d in bound):
        args += [*_parents(prefix), "--ro-bind", prefix, prefix]
    return args


def _parents(path: str) -> list[str]:
    """bwrap arguments making `path`'s parents 0755 (bwrap would make them 0700, which the
    sandbox's uid could not pass through, e.g. for an interpreter under /root)."""
    return [arg for parent in reversed(Path(path).parents[:-1]) for arg in ("--perms", "0755", "--dir", str(parent))]
