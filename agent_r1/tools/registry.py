"""The tool registry, and the tools of a config.

``TOOLS`` maps a name to a :class:`Tool` or to a *tool factory*: a callable that returns a
`Tool` (or a list of them), for a tool that needs something built first (the search tool needs
its index). A factory is called with the settings given in the config and, if it declares
parameters of these names, ``data_dir`` (the prepared dataset folder, a `Path`), ``env`` (the
``env`` section of the config) and ``split`` (the split whose questions the tools serve, where it
matters: the val split searches documents of its own; else None)::

    @register_tool                       # a Tool, by its own name
    @tool
    def calc(expression: str) -> str: ...

    @register_tool(name="lookup")        # a factory, by the given name
    def lookup_tool(data_dir: Path, max_rows: int = 5) -> Tool: ...

In a config, ``env.tools`` lists registered names or import paths (``module:attr``,
``path/to/file.py:attr``) of the same two kinds, each a string or a mapping with ``name`` and
the factory's settings::

    env:
      tools:
        - search                                  # registered: BM25 over corpus.parquet
        - {name: search, top_k: 3}                # ... with a setting
        - examples/city_facts/tools.py:calc       # a Tool in a file
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent_r1.registry import is_import_path, load_object
from agent_r1.tools.base import Tool

ToolFactory = Callable[..., "Tool | list[Tool]"]
TOOLS: dict[str, Tool | ToolFactory] = {}


def register_tool(entry: Tool | ToolFactory | None = None, *, name: str | None = None):
    """Add a `Tool` (under its name) or a tool factory (under ``name``, default its
    ``__name__``) to `TOOLS`; returns it, so it works as a decorator, with or without
    ``name=``. A different entry under a taken name is an error."""

    def add(e: Tool | ToolFactory):
        key = name or (e.name if isinstance(e, Tool) else getattr(e, "__name__", None))
        if not isinstance(e, Tool) and not callable(e):
            raise TypeError(f"register_tool takes a Tool or a function returning one, got {type(e).__name__}")
        if TOOLS.get(key, e) is not e:
            raise ValueError(f"a different tool named '{key}' is already registered")
        TOOLS[key] = e
        return e

    return add if entry is None else add(entry)


def get_tool(name: str) -> Tool | ToolFactory:
    """The registered tool (or factory) called `name`; KeyError listing the known names otherwise."""
    try:
        return TOOLS[name]
    except KeyError:
        raise KeyError(f"unknown tool '{name}'; registered tools: {sorted(TOOLS) or 'none'} "
                       "(or give an import path, module:name or path/to/file.py:name)") from None


def resolve_tool(name: str) -> Tool | ToolFactory:
    """A registered name or an import path → the `Tool` or factory it names."""
    entry = load_object(name, "tool") if is_import_path(name) else get_tool(name)
    if not isinstance(entry, Tool) and not callable(entry):
        raise TypeError(f"tool {name!r} is a {type(entry).__name__}: expected a Tool (made with @tool) "
                        "or a function returning one")
    return entry


def _spec(spec: str | dict) -> tuple[str, dict[str, Any]]:
    if isinstance(spec, str):
        return spec, {}
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise ValueError(f"a tool entry must be a name or a mapping with 'name' and settings, got {spec!r}")
    return spec["name"], {k: v for k, v in spec.items() if k != "name"}


def build_tools(specs: list[str | dict], data_dir: Path | None = None, env: Any = None,
                split: str | None = None) -> list[Tool]:
    """The tools a config lists (see the module docstring), in order; names must be unique."""
    tools: list[Tool] = []
    for spec in specs:
        name, settings = _spec(spec)
        entry = resolve_tool(name)
        if isinstance(entry, Tool):
            if settings:
                raise ValueError(f"tool {name!r} is a ready Tool and takes no settings, got {sorted(settings)}")
            made = entry
        else:
            params = inspect.signature(entry).parameters
            context = {k: v for k, v in (("data_dir", data_dir), ("env", env), ("split", split)) if k in params}
            made = entry(**settings, **context)
        made = made if isinstance(made, list) else [made]
        if not all(isinstance(t, Tool) for t in made):
            raise TypeError(f"tool factory {name!r} returned {made!r}: expected a Tool or a list of Tools")
        tools += made
    names = [t.name for t in tools]
    if len(set(names)) < len(names):
        shared = sorted({n for n in names if names.count(n) > 1})
        raise ValueError(f"two tools share a name: {', '.join(shared)} (of {names}); rename one, or give an mcp "
                         "entry a prefix for its tools' names, e.g. {name: mcp, ..., prefix: 'time_'}")
    return tools
