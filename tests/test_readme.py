"""Every command in the README's ```bash blocks runs as written.

Fast: each command parses under its real parser (the `agent-r1` click commands, DVC's argument
parser, the Makefile's targets, the flow modules exist). Slow: the commands run, in README
order, in a scratch copy of the project (git + DVC, tests/test_dvc.py's scratch repository plus
flows/ and a `.venv` link to this venv) whose `default` and `tiny` pipelines have the tiny sizes,
with the venv off PATH as on a fresh shell; then the README's ```python block runs there against
the agent `make run` registered. `make run` runs its Makefile recipe; a command that already ran
(the recipe's own) runs once; the commands in SKIP (servers, the test suite itself) are only
parsed. The links and the names the docs use are checked by tests/test_docs.py.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from agent_r1.config import parse_overrides
from agent_r1.dicts import deep_merge
from tests.test_dvc import BIN, ROOT, TINY, _env, ran, repo_pipeline, scratch_repo

# what a README command may be skipped for in the slow run (matched against the command's start)
SKIP = {
    "make test": "the test suite itself",
    ".venv/bin/agent-r1 mlflow-ui": "a server that runs until stopped",
    "PREFECT_HOME=.prefect PREFECT_SERVER_ANALYTICS_ENABLED=false .venv/bin/prefect server start": "a server (tests/test_flows.py starts one)",
    ".venv/bin/agent-r1 evaluate outputs/code-tiny/rl/grpo --data": "run as written by tests/test_evaluate.py, on a "
                                                                    "checkpoint and a file of rows it writes",
}


def readme_commands() -> list[str]:
    """The command lines of the README's ```bash blocks (comments stripped), in order."""
    blocks = re.findall(r"^```bash\n(.*?)^```", (ROOT / "README.md").read_text(), flags=re.S | re.M)
    lines = [line.strip() for block in blocks for line in block.splitlines()]
    return [" ".join(shlex.split(line, comments=True)) if "#" in line else line
            for line in lines if line and not line.startswith("#")]


def _argv(line: str) -> list[str]:
    """The program and its arguments: leading VAR=value assignments and a trailing & dropped."""
    argv = shlex.split(line, comments=True)
    while argv and re.match(r"^[A-Z_]+=", argv[0]):
        argv = argv[1:]
    return argv[:-1] if argv[-1] == "&" else argv


def _make_targets() -> set[str]:
    return set(re.findall(r"^([a-z][\w-]*):", (ROOT / "Makefile").read_text(), flags=re.M))


@pytest.mark.parametrize("line", readme_commands())
def test_readme_command_parses(line):
    argv = _argv(line)
    program, args = argv[0], argv[1:]
    if "--config" in args and not (ROOT / args[args.index("--config") + 1]).exists():
        pytest.skip(f"{args[args.index('--config') + 1]} is not in this checkout")
    if program == "make":
        assert set(args) <= _make_targets(), f"{line}: no such make target"
    elif program == "export":
        assert all("=" in a for a in args)
    elif program == ".venv/bin/agent-r1":
        from typer.main import get_command

        from agent_r1.cli import app

        group = get_command(app)
        name, *rest = args
        with group.make_context("agent-r1", [name]) as ctx:
            command = group.get_command(ctx, name)
            assert command is not None, f"{line}: no command {name!r}"
            command.make_context(name, rest, parent=ctx)  # a bad option or argument raises
    elif program == ".venv/bin/dvc":
        from dvc.cli import parse_args

        parse_args(args)  # exits on a bad command or option
    elif program == ".venv/bin/python":
        assert args[0] == "-m" and importlib.util.find_spec(args[1]) is not None, line
    elif program == ".venv/bin/pip":
        import tomllib

        extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
        assert args[:2] == ["install", "-e"] and re.fullmatch(r"\.\[(\w+)\]", args[2]), line
        assert args[2][2:-1] in extras, f"{line}: no extra {args[2][2:-1]!r} in pyproject.toml"
    elif program == ".venv/bin/prefect":
        assert (BIN / "prefect").exists()
    else:
        pytest.fail(f"README command of an unknown form (extend this test): {line}")


def test_skips_name_readme_commands():
    """Every skip still matches a README command: a removed command takes its skip with it."""
    commands = readme_commands()
    assert all(any(c.startswith(s) for c in commands) for s in SKIP), [s for s in SKIP if not any(c.startswith(s) for c in commands)]


def _make_recipe(target: str) -> list[str]:
    """The Makefile recipe of ``target`` with $(BIN) = .venv/bin and no $(ARGS)."""
    recipe = re.search(rf"^{target}:.*\n((?:\t.*\n)+)", (ROOT / "Makefile").read_text(), flags=re.M).group(1)
    return [line.strip().replace("$(BIN)", ".venv/bin").replace("$(ARGS)", "").strip() for line in recipe.splitlines()]


def readme_python() -> list[str]:
    """The README's ```python blocks."""
    return re.findall(r"^```python\n(.*?)^```", (ROOT / "README.md").read_text(), flags=re.S | re.M)


@pytest.mark.slow
@pytest.mark.timeout(1800)  # one pipeline run, reruns that reuse it, a DVC experiment
def test_readme_commands_run_at_tiny_scale(tmp_path):
    tiny = deep_merge(repo_pipeline(), parse_overrides(TINY))
    repo = scratch_repo(tmp_path, tiny)
    pipelines = {"default": tiny, "tiny": copy.deepcopy(tiny)}  # no YAML alias: `dvc exp run -S` edits one
    (repo / "pipelines.yaml").write_text(yaml.safe_dump({"pipelines": pipelines}, sort_keys=False))
    shutil.copytree(ROOT / "flows", repo / "flows", ignore=shutil.ignore_patterns("__pycache__"))
    (repo / ".venv").symlink_to(BIN.parent)
    env = {k: v for k, v in _env(tmp_path).items() if not k.startswith(("PREFECT_", "MLFLOW_"))}
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if Path(p) != BIN)  # not activated
    env["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"] = "180"  # a busy machine (the default is 20 s)
    outputs = repo / "outputs" / "default"
    trained = [outputs / "checkpoints" / "sft" / "config.json", outputs / "rl" / "grpo" / "config.json"]
    log, done = [], set()

    def run(line: str, program: list[str] | None = None) -> str:
        start = time.monotonic()
        r = subprocess.run(program or ["bash", "-c", line], cwd=repo, env=env, capture_output=True, text=True, timeout=900)
        out = r.stdout + r.stderr
        log.append(f"$ {line}  ({time.monotonic() - start:.1f} s)\n{out}")
        (tmp_path / "readme.log").write_text("\n".join(log))
        assert r.returncode == 0, f"README command failed ({r.returncode}): {line}\n{out[-5000:]}"
        done.add(line)
        return out

    for line in readme_commands():
        if any(line.startswith(s) for s in SKIP) or line in done:  # a server; or ran already (make run's recipe)
            continue
        if line.startswith("make "):
            for recipe_line in _make_recipe(line.split()[1]):
                if recipe_line.startswith(".venv/bin/"):  # not the install steps: this venv is installed
                    run(recipe_line)
            first_run = {p: p.stat().st_mtime_ns for p in trained}
            continue
        if line.startswith(".venv/bin/dvc exp run"):
            # what make run and the reruns left: nothing trained again since make run
            assert {p: p.stat().st_mtime_ns for p in trained} == first_run
            kept = {p: p.stat().st_mtime_ns for p in (outputs / "data" / "train.parquet", trained[0])}
            (outputs / "state" / "keep").write_text("resume points live here")  # not an output: DVC leaves it
        out = run(line)
        if line.startswith(".venv/bin/dvc repro"):
            # the flow of `make run` recorded its outputs; evaluate and register may run again
            # (the reruns merged into eval.json), but nothing trains
            assert set(ran(out)) <= {"evaluate", "register"}, out
        elif line.startswith(".venv/bin/dvc exp run"):
            assert ran(out) == ["train", "evaluate", "register"], out
            assert {p: p.stat().st_mtime_ns for p in kept} == kept and (outputs / "state" / "keep").exists()
            assert "rloo" in json.loads((outputs / "metrics" / "eval.json").read_text())["test"]
            # the experiment's metrics are readable from its commit (outputs/ is git-ignored: cached outs)
            shown = subprocess.run([str(repo / ".venv" / "bin" / "dvc"), "exp", "show", "--json"], cwd=repo, env=env, capture_output=True, text=True, check=True)
            rows = json.loads(shown.stdout)
            exps = [e["data"] for row in rows for group in row.get("experiments") or [] for e in group["revs"]]
            assert [e["metrics"]["outputs/default/metrics/eval.json"]["data"] for e in exps] == [
                json.loads((outputs / "metrics" / "eval.json").read_text())]
            assert exps[0]["params"]["pipelines.yaml"]["data"]["pipelines"]["default"]["rl"]["algorithm"] == "rloo"
    assert (repo / "dvc.lock").exists()
    # the README's Python: load the registered champion and talk to it
    for code in readme_python():
        run(code.splitlines()[0] + " ...", [str(repo / ".venv" / "bin" / "python"), "-c", code])
    assert (repo / "agent").is_dir()  # where the Python block downloaded the agent
