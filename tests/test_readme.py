"""Every command in the README's ```bash blocks runs as written.

Fast: each command parses under its real parser (the `agent-r1` click commands, DVC's argument
parser, the Makefile's targets, the flow modules exist). Slow: the commands run, in README
order, in a scratch copy of the project (git + DVC, tests/test_dvc.py's scratch repository plus
flows/ and a `.venv` link to this venv) whose `default` and `tiny` pipelines have the tiny sizes,
with the venv off PATH as on a fresh shell. `make run` runs its Makefile recipe; the commands in
SKIP (servers, the test suite itself) are only parsed.
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
    "PREFECT_HOME=.prefect .venv/bin/prefect server start": "a server (tests/test_flows.py serves flows.deploy)",
    "export ": "sets the API URL for the served deployments",
    ".venv/bin/python -m flows.deploy": "serves until stopped (tests/test_flows.py::test_served_deployments_run_from_the_api)",
    ".venv/bin/agent-r1 train --config examples/": "its own test runs the example (tests/test_examples.py)",
    ".venv/bin/agent-r1 train -p default": "GPU commands of 'Scaling out' (tests/test_distributed.py runs 2 CPU ranks)",
    ".venv/bin/python -m torch.distributed.run": "two GPU nodes (tests/test_distributed.py runs 2 nodes on 127.0.0.1)",
    ".venv/bin/pip install": "this venv is installed with the extra (make install: the dev extra has it)",
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


@pytest.mark.slow
@pytest.mark.timeout(2400)  # three pipeline runs, evaluations, a DVC experiment: 15 min on the 2-core machine at load 8
def test_readme_commands_run_at_tiny_scale(tmp_path):
    tiny = deep_merge(repo_pipeline(), parse_overrides(TINY))
    repo = scratch_repo(tmp_path, tiny)
    # `code` as the repository writes it, on the tiny model at code-tiny's sizes
    code = deep_merge(repo_pipeline("code") | {"extends": "default"},
                      {k: v for k, v in repo_pipeline("code-tiny").items() if k != "extends"})
    textworld = deep_merge(repo_pipeline("textworld") | {"extends": "default"},  # likewise at textworld-tiny's sizes
                           {k: v for k, v in repo_pipeline("textworld-tiny").items() if k != "extends"})
    pipelines = {"default": tiny, "tiny": copy.deepcopy(tiny), "code": code, "textworld": textworld}  # no YAML alias: `dvc exp run -S` edits one
    (repo / "pipelines.yaml").write_text(yaml.safe_dump({"pipelines": pipelines}, sort_keys=False))
    shutil.copytree(ROOT / "flows", repo / "flows", ignore=shutil.ignore_patterns("__pycache__"))
    (repo / ".venv").symlink_to(BIN.parent)
    env = {k: v for k, v in _env(tmp_path).items() if not k.startswith(("PREFECT_", "MLFLOW_"))}
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if Path(p) != BIN)  # not activated
    env["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"] = "180"  # a busy machine (the default is 20 s)
    outputs = repo / "outputs" / "default"
    log = []

    def run(line: str) -> str:
        start = time.monotonic()
        r = subprocess.run(["bash", "-c", line], cwd=repo, env=env, capture_output=True, text=True, timeout=900)
        out = r.stdout + r.stderr
        log.append(f"$ {line}  ({time.monotonic() - start:.1f} s)\n{out}")
        (tmp_path / "readme.log").write_text("\n".join(log))
        assert r.returncode == 0, f"README command failed ({r.returncode}): {line}\n{out[-5000:]}"
        return out

    for line in readme_commands():
        if any(line.startswith(s) for s in SKIP):
            continue
        if line.startswith("make "):
            for recipe_line in _make_recipe(line.split()[1]):
                if recipe_line.startswith(".venv/bin/"):  # not the install steps: this venv is installed
                    run(recipe_line)
            continue
        if line.startswith(".venv/bin/dvc exp run"):
            kept = {p: p.stat().st_mtime_ns for p in (outputs / "data" / "train.parquet", outputs / "checkpoints" / "sft" / "config.json")}
            (outputs / "state" / "keep").write_text("resume points live here")  # not an output: DVC leaves it
        out = run(line)
        if line.startswith(".venv/bin/dvc repro"):
            # the flow of `make run` recorded its outputs; `agent-r1 evaluate` since merged into
            # eval.json, so evaluate and register may run again, but nothing trains
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
    assert (repo / "dvc.lock").exists() and (repo / "outputs" / "tiny" / "metrics" / "eval.json").exists()


def _anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to dashes."""
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in re.findall(r"^#+ (.*)$", markdown, flags=re.M)}


@pytest.mark.parametrize("page", ["README.md", *sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md"))])
def test_links_stay_in_the_repository_and_resolve(page):
    """No link leaves the repository; every linked file and heading exists (examples/ comes with
    stream `extend`'s merge)."""
    source = ROOT / page
    for target in re.findall(r"\]\(([^)\s]+)\)", source.read_text()):
        assert "://" not in target, f"{page}: link outside the repository: {target}"
        path, _, anchor = target.partition("#")
        linked = (source.parent / path).resolve() if path else source
        assert linked.is_relative_to(ROOT), f"{page}: {target} is outside the repository"
        if not linked.exists() and path.startswith("examples/"):
            continue
        assert linked.exists(), f"{page}: {target} does not exist"
        if anchor:
            assert anchor in _anchors(linked.read_text()), f"{page}: no heading #{anchor} in {path or page}"


@pytest.mark.slow
def test_readme_python_example_runs_as_written(tmp_path):
    """The README's ```python block (RLTrainer from parts) runs in a fresh directory and prints
    the two iterations' metrics."""
    import ast
    import sys
    import textwrap

    blocks = re.findall(r"^( *)```python\n(.*?)^\1```", (ROOT / "README.md").read_text(), flags=re.S | re.M)
    assert len(blocks) == 1
    code = textwrap.dedent(blocks[0][1])
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                          env=os.environ | {"PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    history = ast.literal_eval(proc.stdout.strip().splitlines()[-1])
    assert [it for it, _, _ in history] == [1, 2]
    assert all(0.0 <= reward <= 1.0 and 0.0 <= em <= 1.0 for _, reward, em in history)  # the sum's EM, as a reward
