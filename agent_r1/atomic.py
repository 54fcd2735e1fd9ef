"""Atomic writes: a reader (or a resumed run) sees the old file or folder or the new one, never half."""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def replace_dir(tmp: Path, path: Path) -> None:
    """Move the finished folder ``tmp`` to ``path``."""
    old = None
    if path.exists():
        old = path.with_name(f".{path.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(path, old)
    os.replace(tmp, path)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
