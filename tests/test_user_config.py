"""A user's own config file: paths relative to the file that names them, ``extends`` across
files and of packaged pipelines, ``runtime.threads``; hostile inputs rejected with one line
naming the key; tools that return no text or overrun their timeout holding the GIL."""

from __future__ import annotations

import textwrap
import time
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from agent_r1.cli import app
from agent_r1.config import ConfigError, load_config, parse_overrides
from agent_r1.tools import run_tool, tool

ROOT = Path(__file__).resolve().parents[1]

ENV = '''
from agent_r1.envs import ToolEnv


class MyEnv(ToolEnv):
    TASK_FIELDS = ("sentence",)
'''


def _user_files(tmp_path: Path) -> Path:
    """code/env.py, data/ and conf/pipelines.yaml naming them relative to conf/."""
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "env.py").write_text(ENV)
    (tmp_path / "data").mkdir()
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "pipelines.yaml").write_text(textwrap.dedent("""\
        pipelines:
          mine:
            extends: agent-r1:tiny
            data: {source: jsonl, path: ../data}
            env: {name: ../code/env.py:MyEnv, tools: [{name: ../code/env.py:nothing, timeout_s: 1}], max_context_tokens: 128,
                  max_new_tokens: 16}
            sft: {worlds: 0}
            eval: {baselines: []}
        """))
    return conf / "pipelines.yaml"


def test_paths_are_relative_to_the_config_file_and_extends_names_a_packaged_pipeline(tmp_path, monkeypatch):
    config = _user_files(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    with pytest.raises(ConfigError, match=r"has no attribute 'nothing'"):  # the env file is found: its tool is not
        load_config("mine", config)
    config.write_text(config.read_text().replace(", tools: [{name: ../code/env.py:nothing, timeout_s: 1}]", ""))
    cfg = load_config("mine", config)
    assert Path(cfg.data.path).resolve() == (tmp_path / "data").resolve()
    assert cfg.env.name.endswith(":MyEnv") and Path(cfg.env.name.rpartition(":")[0]).resolve() == tmp_path / "code" / "env.py"
    tiny = load_config("tiny", ROOT / "pipelines.yaml")
    assert cfg.model.tiny == tiny.model.tiny and cfg.rl.iterations == tiny.rl.iterations  # tiny's settings
    assert cfg.name == "mine" and cfg.output_dir == "outputs/mine" and cfg.sft.worlds == 0  # its own
    # an override's path stays relative to the working directory
    cfg = load_config("mine", config, parse_overrides(["data.path=here"]))
    assert cfg.data.path == "here"


def test_extends_names_a_pipeline_of_another_file_whose_paths_are_relative_to_it(tmp_path):
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "pipelines.yaml").write_text(
        "pipelines:\n  b:\n    data: {source: jsonl, path: shared_data}\n    eval: {baselines: []}\n    sft: {worlds: 0}\n")
    (tmp_path / "child.yaml").write_text("pipelines:\n  c:\n    extends: base/pipelines.yaml:b\n    rl: {iterations: 3}\n")
    cfg = load_config("c", tmp_path / "child.yaml")
    assert Path(cfg.data.path) == tmp_path / "base" / "shared_data" and cfg.rl.iterations == 3
    (tmp_path / "child.yaml").write_text("pipelines:\n  c:\n    extends: base/pipelines.yaml:nope\n")
    with pytest.raises(ConfigError, match=r"extends 'base/pipelines.yaml:nope', which is not defined; defined in .*base/pipelines.yaml: \['b'\]"):
        load_config("c", tmp_path / "child.yaml")
    (tmp_path / "child.yaml").write_text("pipelines:\n  c:\n    extends: child.yaml:c\n")
    with pytest.raises(ConfigError, match=r"in a cycle: c -> c"):
        load_config("c", tmp_path / "child.yaml")


def test_extends_with_a_packaged_pipelines_bare_name_says_the_form_it_needs(tmp_path):
    (tmp_path / "p.yaml").write_text("pipelines:\n  mine:\n    extends: tiny\n")
    with pytest.raises(ConfigError, match=r"extends 'tiny', which is not defined; .*'tiny' is a packaged pipeline: "
                                          r"write extends: agent-r1:tiny$"):
        load_config("mine", tmp_path / "p.yaml")
    (tmp_path / "p.yaml").write_text("pipelines:\n  mine:\n    extends: nope\n")
    with pytest.raises(ConfigError, match=r"packaged pipelines \(agent-r1:<name>\): \[.*'default'.*'tiny'\]$"):
        load_config("mine", tmp_path / "p.yaml")


def test_runtime_threads_sets_torchs_threads():
    from agent_r1.pipeline.stages import use_runtime

    before = torch.get_num_threads()
    try:
        use_runtime(load_config("tiny", ROOT / "pipelines.yaml", parse_overrides(["runtime.threads=1"])))
        assert torch.get_num_threads() == 1
        torch.set_num_threads(2)
        use_runtime(load_config("tiny", ROOT / "pipelines.yaml"))  # null: torch's own setting stays
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    with pytest.raises(ConfigError, match=r"runtime.threads: Input should be greater than or equal to 1"):
        load_config("tiny", ROOT / "pipelines.yaml", parse_overrides(["runtime.threads=0"]))


@pytest.mark.parametrize("overrides, message", [
    (["data.n_films=2000"], "data.n_films: 2000 is more than the 1000 names the inventory has with data.name_words=1"),
    (["data.n_studios=61"], "data.n_studios: 61 is more than the 60 names"),
    (["model.name_or_path=''", "model.tiny.max_position_embeddings=16"],
     "model.tiny.max_position_embeddings: 16 is shorter than env.max_context_tokens"),
    (["rl.qtypes=[bogus]"], "rl.qtypes: unknown question type(s) ['bogus'] in synthetic data"),
])
def test_hostile_values_are_one_line_naming_the_key(overrides, message):
    result = CliRunner().invoke(app, ["show-config", "--config", str(ROOT / "pipelines.yaml"),
                                      *[a for o in overrides for a in ("-s", o)]])
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1 and message in lines[0], result.output


def test_an_override_without_a_key_is_named():
    for bad in ("=5", "rl..iterations=5", ".x=1"):
        with pytest.raises(ConfigError, match=rf"override {bad!r}: .* is not a key path"):
            parse_overrides([bad])


def test_a_blank_model_name_is_the_tiny_model():
    cfg = load_config("tiny", ROOT / "pipelines.yaml", parse_overrides(["model.name_or_path=''"]))
    assert cfg.model.name_or_path is None


def test_the_sft_run_of_a_filter_that_selects_nothing_is_one_line(tmp_path):
    """A mismatched rl.hops (the ValueError of old, with a traceback) is a one-line error."""
    out = tmp_path / "out"
    sets = [a for s in [f"output_dir={out}", "data.n_films=24", "data.n_directors=8", "data.n_studios=4"] for a in ("-s", s)]
    assert CliRunner().invoke(app, ["stage", "prepare", "--no-track", "--config", str(ROOT / "pipelines.yaml"),
                                    "-p", "tiny", *sets]).exit_code == 0
    result = CliRunner().invoke(app, ["stage", "train", "--no-track", "--config", str(ROOT / "pipelines.yaml"),
                                      "-p", "tiny", *sets, "-s", "rl.hops=[]", "-s", "rl.qtypes=[]"])
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    assert lines[-1].startswith("error: rl.hops / rl.qtypes: no training questions with rl.hops=[]"), result.output


# ------------------------------------------------------------------------------ tools
def test_a_thread_safe_tool_that_holds_the_gil_past_its_timeout_is_a_timeout():
    @tool(timeout_s=0.2, thread_safe=True)
    def busy(n: int) -> str:
        """Add up numbers in C, never releasing the GIL.

        Args:
            n: How many.
        """
        return str(sum(range(n)))

    n = 10_000
    while True:  # a sum that takes 0.6 s of CPU here, however fast the machine (and so at least as long on the clock)
        t = time.thread_time()
        sum(range(n))
        if time.thread_time() - t > 0.6:
            break
        n *= 2
    result = run_tool(busy, {"n": n})
    assert result.timed_out and result.error == "tool 'busy' timed out after 0.2 s", result
    assert run_tool(busy, {"n": 10}).text == "45"  # a quick call is no timeout


def test_a_tool_returning_no_text_is_a_tool_error():
    from agent_r1.envs import ToolEnv
    from agent_r1.tools import ToolOutput

    def make(value):
        def odd(x: str) -> str:
            """Return something odd.

            Args:
                x: Anything.
            """
            return value() if callable(value) else value

        return tool(odd, thread_safe=True)

    def gen():
        yield "a"

    for value, kind in ((None, "NoneType"), (gen, "generator"), (ToolOutput(None), "NoneType"), (object(), "object")):
        result = run_tool(make(value), {"x": "a"})
        assert result.error == (f"tool 'odd' returned {kind}, expected text (a str, bytes or a number, or a ToolOutput)"), result
    assert run_tool(make(7), {"x": "a"}).text == "7" and run_tool(make(b"ok"), {"x": "a"}).text == "ok"

    env = ToolEnv([make(None)], max_turns=3)
    env.reset({"question": "q"})
    step = env.step('<tool_call>{"name": "odd", "arguments": {"x": "a"}}</tool_call>')
    assert step.info.tool_errors == 1 and env.metrics["tool_errors"] == 1
    assert step.observation[0]["content"].startswith("Error: tool 'odd' returned NoneType")


def test_the_packaged_pipelines_are_the_repositorys():
    """agent_r1/pipelines.yaml (package data, a link to ./pipelines.yaml) is what `agent-r1:<name>` reads."""
    from agent_r1.config import packaged_pipelines

    assert packaged_pipelines().read_text() == (ROOT / "pipelines.yaml").read_text()
    assert packaged_pipelines().parent == ROOT / "agent_r1" or packaged_pipelines() == ROOT / "pipelines.yaml"
