"""The package's shape: no import cycle inside agent_r1, no function over 80 lines, one module
that imports MLflow, and one implementation of the RL iteration."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "agent_r1"
MAX_FUNCTION_LINES = 60


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _imports(name: str, path: Path, modules: dict[str, Path], deferred: bool) -> set[str]:
    """The agent_r1 modules ``name`` imports at module level (with ``deferred``, also inside
    functions), with the packages a dotted import runs the ``__init__`` of."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text())
    targets = set()
    for node in (ast.walk(tree) if deferred else tree.body):
        if isinstance(node, ast.Import):
            targets |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from .x import y
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets |= {f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names}
    out = set()
    for target in targets:
        parts = target.split(".")
        for i in range(1, len(parts) + 1):  # importing a.b.c runs a/__init__ and a/b/__init__ first
            prefix = ".".join(parts[:i])
            # ... except the packages the importer is inside (they are already being imported)
            if prefix in modules and prefix != name and not name.startswith(prefix + "."):
                out.add(prefix)
    return out


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def import_graph(deferred: bool = False) -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules, deferred) for name, path in modules.items()}


def test_the_cycle_finder_finds_a_cycle():
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


@pytest.mark.parametrize("deferred", [False, True], ids=["module-level", "with-imports-in-functions"])
def test_no_import_cycle_inside_agent_r1(deferred):
    """Module-level cycles fail at import time, depending on what is imported first; a cycle
    through an import deferred into a function (config.py and rl.py had one) is the same
    knot, only hidden."""
    graph = import_graph(deferred)
    assert "agent_r1.config" in graph["agent_r1.pipeline.rl_driver"]  # the graph sees real imports
    assert ("agent_r1.tracking" in graph["agent_r1.cli"]) is deferred  # cli imports it in a function
    cycle = _find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_no_function_over_60_lines():
    long = []
    for path in sorted([*PACKAGE.rglob("*.py"), *(PACKAGE.parent / "flows").rglob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name} ({n} lines)")
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(long)


def test_only_tracking_imports_mlflow():
    importers = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            if any(n == "mlflow" or n.startswith("mlflow.") for n in names):
                importers.append(_module_name(path))
    assert set(importers) == {"agent_r1.tracking"}


def test_one_implementation_of_the_rl_iteration():
    """Each phase of the iteration has one definition (agent_r1/pipeline/rl_driver.py), and the
    phases are called in one place, RLTrainer.step, which the flow's runner wraps as tasks."""
    phases = {"sample_episodes", "build_train_batch", "update_policy", "end_iteration"}
    defined, callers = [], []
    for path in sorted(PACKAGE.parent.glob("*/**/*.py")):
        if any(p.startswith(".venv") for p in path.parts) or "tests" in path.parts:  # .venv, .venv-vllm
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if node.name in phases:
                    defined.append(f"{path.relative_to(PACKAGE.parent)}:{node.name}")
                named = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
                if phases <= named:
                    callers.append(f"{path.relative_to(PACKAGE.parent)}:{node.name}")
    assert sorted(defined) == sorted(f"agent_r1/pipeline/rl_driver.py:{p}" for p in phases)
    assert callers == ["agent_r1/pipeline/rl_driver.py:step"]

def test_one_free_port_function():
    """The free-port helper is defined once (agent_r1/ports.py), not copied per module."""
    defs = [f"{_module_name(p)}.{node.name}" for p in sorted(PACKAGE.rglob("*.py")) for node in ast.walk(ast.parse(p.read_text()))
            if isinstance(node, ast.FunctionDef) and node.name.lstrip("_") == "free_port"]
    assert defs == ["agent_r1.ports.free_port"], defs
