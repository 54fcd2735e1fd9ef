"""The configuration reference (docs/config.md, ``agent-r1 show-config --doc``), generated from
the config classes: every field's type, default and constraints from pydantic, its description
from the string literal on the line after it (an attribute docstring, read with ``ast``)."""

from __future__ import annotations

import ast
import inspect
import json
import textwrap
import types
from typing import Annotated, Literal, Union, get_args, get_origin

import annotated_types as at
from pydantic import BaseModel

from agent_r1.config import RunConfig

_BOUNDS = ((at.Gt, "gt", ">"), (at.Ge, "ge", "≥"), (at.Lt, "lt", "<"), (at.Le, "le", "≤"))


def field_docs(cls: type[BaseModel]) -> dict[str, str]:
    """``{field: description}`` from the attribute docstrings of ``cls`` and its bases, each
    folded into one line."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not (isinstance(klass, type) and issubclass(klass, BaseModel)) or klass is BaseModel:
            continue
        body = ast.parse(textwrap.dedent(inspect.getsource(klass))).body[0].body
        for field, after in zip(body, body[1:]):
            if (isinstance(field, ast.AnnAssign) and isinstance(field.target, ast.Name)
                    and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                    and isinstance(after.value.value, str)):
                docs[field.target.id] = " ".join(after.value.value.split())
    return docs


def _type(t) -> str:
    origin, args = get_origin(t), get_args(t)
    if origin is Literal:
        return " | ".join(json.dumps(a) for a in args)
    if origin is Annotated:
        return _type(args[0])
    if origin in (Union, types.UnionType):
        return " | ".join(_type(a) for a in args)
    if origin is not None:
        return f"{origin.__name__}[{', '.join(_type(a) for a in args)}]"
    return "null" if t is type(None) else t.__name__


def _constraints(metadata: list) -> str:
    return ", ".join(f"{sign} {getattr(m, attr)}" for m in metadata for kind, attr, sign in _BOUNDS if isinstance(m, kind))


def _section(model: type[BaseModel]) -> bool:
    return isinstance(model, type) and issubclass(model, BaseModel)


def rows(model: type[BaseModel] = RunConfig, prefix: str = "") -> list[dict]:
    """One row per config key, depth first; a nested config class is a section row (``type``
    None) followed by its keys."""
    docs = field_docs(model)
    out = []
    for name, field in model.model_fields.items():
        key = prefix + name
        row = {"key": key, "description": docs.get(name, "")}
        if _section(field.annotation):
            out += [row | {"type": None, "default": None}] + rows(field.annotation, key + ".")
        else:
            bounds = _constraints(field.metadata)
            out.append(row | {"type": _type(field.annotation) + (f" ({bounds})" if bounds else ""),
                              "default": json.dumps(field.get_default(call_default_factory=True), ensure_ascii=False)})
    return out


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def markdown() -> str:
    """The reference: the top-level keys, then one table per section."""
    all_rows = rows()
    sections = [r for r in all_rows if r["type"] is None]
    header = ["| key | type | default | description |", "|---|---|---|---|"]

    def table(keys: list[dict]) -> list[str]:
        return header + [f"| `{r['key']}` | `{_cell(r['type'])}` | `{_cell(r['default'])}` | {_cell(r['description'])} |"
                         for r in keys if r["type"] is not None]

    lines = [
        "# Configuration reference",
        "",
        "Every key a pipeline in `pipelines.yaml` may set, with its built-in default. Generated from the",
        "field docstrings of the config classes (`agent_r1/config.py` and the classes it nests) by",
        "`agent-r1 show-config --doc`; regenerate with `make docs` (a test checks this file is current).",
        "Set a key in `pipelines.yaml`, or override it with `-s key=value` (CLI), `-S` (DVC) or the",
        "flows' `overrides` parameter; `agent-r1 show-config -p <pipeline>` prints a pipeline's values.",
        "A pipeline may `extends:` another: `name` (same file), `other.yaml:name` (relative to this file)",
        "or `agent-r1:name` (the packaged pipelines, e.g. `agent-r1:tiny`). In a file, `data.path` and the",
        "`file.py:Name` paths of `env.name` / `env.tools` are relative to that file; in `-s`, to the",
        "working directory.",
        "",
        "## Top level",
        "",
        *table([r for r in all_rows if "." not in r["key"]]),
    ]
    for s in sections:
        depth = s["key"].count(".") + 1
        keys = [r for r in all_rows if r["key"].startswith(s["key"] + ".") and r["key"].count(".") == depth]
        lines += ["", f"## `{s['key']}`", "", s["description"], "", *table(keys)]
    return "\n".join(lines) + "\n"
