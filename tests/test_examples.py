"""examples/city_facts end to end, and a user's own environment and tool from a temp module,
both run through what `agent-r1 train` runs (the tiny model; in this process, as a flow worker
runs a pipeline) to a finished eval.json holding the environment's own metrics; and
examples/mcp_tools, whose tool is an MCP server from PyPI. (`agent-r1 train` itself, with a
config in another folder, is run as a command by tests/test_tasks.py.)"""

from __future__ import annotations

import importlib.util
import json
import textwrap
import threading
from pathlib import Path

import pytest

from agent_r1.tools import run_tool
from tests.procs import live

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "city_facts"
MCP_EXAMPLE = ROOT / "examples" / "mcp_tools"
# a small tiny model and a short run: the plumbing, not the learning
TINY = ["model.tiny.hidden_size=32", "model.tiny.num_layers=1", "model.tiny.num_heads=2", "model.tiny.num_kv_heads=1",
        "model.tiny.intermediate_size=64", "model.tiny.vocab_size=320", "sft.epochs=0.5", "rl.iterations=1",
        "rl.tasks_per_iteration=2", "rl.group_size=2", "eval.max_per_hop=3"]


def _train(config: Path, pipeline: str, out: Path, tracker=None) -> dict:
    """The pipeline ``pipeline`` of ``config`` (tiny sizes) as ``agent-r1 train`` runs it, in this process
    (``tracker``: MLflow, else none, as --no-track); the finished eval.json."""
    from agent_r1.config import load_config, parse_overrides
    from agent_r1.pipeline import run_all

    run_all(load_config(pipeline, config, parse_overrides([f"output_dir={out}", *TINY])), tracker)
    return json.loads((out / "metrics" / "eval.json").read_text())


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"city_facts_{name}", EXAMPLE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_calc_does_arithmetic_and_nothing_else():
    calc = _load("tools").calc
    assert run_tool(calc, {"expression": "5200 - 6100"}).text == "-900"
    assert run_tool(calc, {"expression": "(3 + 4) * 2 / 4"}).text == "3.5"
    for bad in ("__import__('os').system('true')", "open('x')", "2 ** 1000", "x + 1", "'a' * 3"):
        result = run_tool(calc, {"expression": bad})
        assert result.error is not None and "raised" in result.error, bad


def test_city_facts_oracle_scores_full_marks(tmp_path):
    from agent_r1.config import load_config
    from agent_r1.envs import make_env_factory
    from agent_r1.run import make_tools, prepare_data, tasks_for
    from agent_r1.data import load_split

    cfg = load_config("city_facts", EXAMPLE / "pipelines.yaml", {"output_dir": str(tmp_path)})
    data_dir = prepare_data(cfg)
    env = make_env_factory(cfg.env, make_tools(cfg, data_dir))()
    for task in tasks_for(load_split(data_dir, "test"), [1, 2], limit=2):
        env.reset(task)
        for text in env.oracle_turns(task):
            res = env.step(text)
        assert res.done and res.info.final_reward == 1.0, task
        assert res.info.metrics == {"em": 1.0, "lookup_hit": 1.0, "calc_calls": float(task["hops"] == 2)}
        assert res.info.answer.lstrip("-").isdigit()


@pytest.mark.slow
def test_city_facts_example_trains_end_to_end_and_reports_its_metrics(tmp_path):
    """The example's pipeline (tiny sizes), with MLflow tracking: the env's own metrics reach
    eval.json, the RL history and MLflow."""
    import mlflow

    from agent_r1.tracking import Tracker

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    results = _train(EXAMPLE / "pipelines.yaml", "city_facts", tmp_path / "out", Tracker(uri=uri, project_dir=tmp_path))
    for method in ("base_tool_call", "sft", "grpo"):
        for key in ("lookup_hit", "calc_calls", "em"):
            assert key in results["test"][method] and key in results["test_2hop"][method], (method, key)
    history = json.loads((tmp_path / "out" / "metrics" / "train" / "grpo.json").read_text())
    assert {"lookup_hit", "calc_calls", "em"} <= set(history[0])
    mlflow.set_tracking_uri(uri)
    runs = mlflow.search_runs(search_all_experiments=True)
    columns = set(runs.columns)
    assert "metrics.test/grpo/lookup_hit" in columns and "metrics.lookup_hit" in columns, sorted(columns)


MODULE = '''
from agent_r1.envs import Metric, ToolEnv
from agent_r1.tools import tool


@tool(thread_safe=True)
def shout(text: str) -> str:
    """Repeat a text in capitals.

    Args:
        text: The text to shout.
    """
    return text.upper()


class ShoutEnv(ToolEnv):
    """Answer with the shouted word; the shout tool shouts it."""

    METRICS = {"shouts": Metric("shout calls in the episode", agg="mean"),
               "shouts_total": Metric("shout calls in all the episodes", agg="sum")}

    def reset(self, task):
        self.shouts = 0
        return super().reset(task)

    def step_reward(self, parsed, results):
        self.shouts += sum(call.name == "shout" for call, _ in results)
        return 0.0

    def final_reward(self, answer, action_text):
        return float(answer == self.task["answers"][0]), {"shouts": self.shouts, "shouts_total": self.shouts}

    def oracle_turns(self, task):
        word = task["search_chain"][0]
        return ['<tool_call>{"name": "shout", "arguments": {"text": "%s"}}</tool_call>' % word,
                "<answer>%s</answer>" % word.upper()]
'''


def _shout_data(folder: Path) -> None:
    words = ["apple", "river", "stone", "cloud", "ember", "maple", "otter", "quill", "tulip", "zebra"]
    folder.mkdir()
    rows = {"corpus": [{"doc_id": w, "title": w, "text": f"the word {w}"} for w in words]}
    for split, part in (("train", words[:7]), ("test", words[7:])):
        rows[split] = [{"id": f"{split}-{w}", "question": f"Shout the word {w}.", "answers": [w.upper()], "hops": 1,
                        "qtype": "shout", "gold_titles": [w], "search_chain": [w]} for w in part]
    for name, table in rows.items():
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in table))


@pytest.mark.slow
def test_an_environment_and_a_tool_from_a_temp_module_train_end_to_end(tmp_path, monkeypatch):
    """A new environment and tool, written in a module on the import path and named in a config by
    import path, trained end to end: eval.json and the RL history hold its metrics."""
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "shoutmod.py").write_text(MODULE)
    _shout_data(tmp_path / "data")
    config = tmp_path / "pipelines.yaml"
    config.write_text(textwrap.dedent(f"""\
        pipelines:
          shout:
            data: {{source: jsonl, path: {tmp_path / 'data'}}}
            env: {{name: "shoutmod:ShoutEnv", tools: ["shoutmod:shout"], max_turns: 3,
                   max_context_tokens: 256, max_new_tokens: 16}}
            model: {{tiny: {{max_position_embeddings: 256}}}}
            sft: {{hops: [1], qtypes: [], batch_size: 4}}
            rl: {{hops: [1]}}
            eval: {{hops: [1], baselines: []}}
        """))
    results = _train(config, "shout", tmp_path / "out")
    for method in ("sft", "grpo"):
        m = results["test"][method]
        assert m["n"] == 3 and "shouts" in m and "em" not in m  # its own metrics, not QA's
        assert m["shouts_total"] == pytest.approx(3 * m["shouts"])  # sum vs mean, as declared
    history = json.loads((tmp_path / "out" / "metrics" / "train" / "grpo.json").read_text())
    assert "shouts" in history[0] and "shouts_total" in history[0]


def _mcp_time_servers() -> set[int]:
    """The live processes of mcp-server-time (the server, or the watchdog that runs it)."""
    return set(live(lambda p: b"mcp-server-time" in p.cmdline))


def test_mcp_tools_oracle_agrees_with_the_server(tmp_path):
    """The oracle's call of mcp-server-time's convert_time answers every test question right:
    the data's answers are the server's, whatever the day."""
    from agent_r1.config import load_config
    from agent_r1.data import load_split
    from agent_r1.envs import make_env_factory
    from agent_r1.run import make_tools, prepare_data, tasks_for
    from agent_r1.tools import close_servers

    cfg = load_config("mcp_tools", MCP_EXAMPLE / "pipelines.yaml", {"output_dir": str(tmp_path)})
    data_dir = prepare_data(cfg)
    try:
        env = make_env_factory(cfg.env, make_tools(cfg, data_dir))()
        assert list(env.tools) == ["convert_time"]
        for task in tasks_for(load_split(data_dir, "test"), [1]):
            env.reset(task)
            for text in env.oracle_turns(task):
                res = env.step(text)
            assert res.done and res.info.final_reward == 1.0 and res.info.metrics == {"em": 1.0, "converted": 1.0}, task
    finally:
        close_servers()


@pytest.mark.slow
def test_mcp_tools_example_trains_end_to_end_and_stops_its_servers_when_it_returns(tmp_path):
    """The example's pipeline (tiny sizes, no MLflow) run by run_pipeline in this process, as a flow
    worker runs it: mcp-server-time runs while the pipeline does, eval.json holds the environment's
    metrics, and the server is gone when run_pipeline returns, while this process lives on (atexit
    is not what stops it)."""
    from agent_r1.config import load_config, parse_overrides
    from agent_r1.pipeline import Plan, run_pipeline
    from agent_r1.tools.mcp import _OPEN

    before, seen, done = _mcp_time_servers(), set(), threading.Event()

    def watch() -> None:
        while not done.wait(0.2):
            seen.update(_mcp_time_servers() - before)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        cfg = load_config("mcp_tools", MCP_EXAMPLE / "pipelines.yaml", parse_overrides([f"output_dir={tmp_path}", *TINY]))
        run_pipeline(cfg, Plan(register=False))
    finally:
        done.set()
        watcher.join()
    assert seen, "no mcp-server-time process ran during the pipeline"
    assert not _mcp_time_servers() - before and not _OPEN, "mcp-server-time processes left after the pipeline"
    results = json.loads((tmp_path / "metrics" / "eval.json").read_text())
    for method in ("base_tool_call", "sft", "grpo"):
        m = results["test"][method]
        assert m["n"] == 3 and {"em", "converted", "tool_calls", "tool_errors"} <= set(m), (method, sorted(m))
    history = json.loads((tmp_path / "metrics" / "train" / "grpo.json").read_text())
    assert {"em", "converted"} <= set(history[0])
