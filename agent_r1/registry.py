"""Finding user code by name: ``"package.module:Name"`` or ``"path/to/file.py:Name"``.

The environment (``env.name``) and the tools (``env.tools``) of a config are registered names
or such import paths; this module imports them. A file path is relative to the working
directory; the file is imported once per process, as a module of its own.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from pathlib import Path


def is_import_path(name: str) -> bool:
    return ":" in name


def load_object(spec: str, what: str = "object"):
    """The object ``spec`` names (``module:attr`` or ``file.py:attr``); ImportError naming
    ``what`` and ``spec`` when the module cannot be imported (whatever it raised) or lacks the
    attribute."""
    module_name, _, attr = spec.rpartition(":")
    if not module_name or not attr:
        raise ImportError(f"{what} {spec!r}: expected 'package.module:Name' or 'path/to/file.py:Name'")
    try:
        module = _import_file(Path(module_name)) if module_name.endswith(".py") else importlib.import_module(module_name)
    except Exception as e:  # noqa: BLE001 - user code: a syntax error, a failing import, ...
        raise ImportError(f"{what} {spec!r}: cannot import {module_name!r}: {type(e).__name__}: {e}") from e
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ImportError(f"{what} {spec!r}: {module_name!r} has no attribute {attr!r}") from None


def _import_file(path: Path):
    path = path.resolve()
    if not path.is_file():
        raise ImportError(f"no file {path}")
    name = f"agent_r1_user.{path.stem}_{hashlib.sha1(str(path).encode()).hexdigest()[:8]}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before running it: dataclasses and pickling look it up
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def named_class(name: str, table: dict[str, type], base: type, what: str) -> type:
    """The ``base`` subclass ``name`` names: a key of ``table`` or an import path. KeyError listing
    ``table`` for an unknown name; TypeError when the object named is not such a class."""
    if is_import_path(name):
        cls = load_object(name, what)
    elif name in table:
        cls = table[name]
    else:
        raise KeyError(f"unknown {what} {name!r}; registered: {sorted(table)} "
                       "(or give an import path, module:Class or path/to/file.py:Class)")
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise TypeError(f"{what} {name!r} is {cls!r}, not a {base.__name__} subclass")
    return cls
