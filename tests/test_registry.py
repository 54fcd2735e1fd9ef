"""Environments and tools by name and import path; typed episode metrics."""

from __future__ import annotations

import pytest

from agent_r1.config import ConfigError, EnvConfig, load_config
from agent_r1.context import ContextManager
from agent_r1.envs import ENVS, Metric, MetricError, MultiHopQAEnv, ToolEnv, get_env, make_env_factory, register_env
from agent_r1.envs.registry import env_tools
from agent_r1.pipeline.rl_driver import rollout_stats
from agent_r1.rollout import SamplingParams, ScriptedEngine, run_episodes
from agent_r1.tools import TOOLS, Tool, build_tools, register_tool, tool

ENV_FILE = '''
from agent_r1.envs import Metric, ToolEnv


class CountEnv(ToolEnv):
    METRICS = {"calls": Metric("tool calls", agg="sum"), "longest": Metric("longest answer", agg="max")}

    def final_reward(self, answer, action_text):
        return 1.0, {"calls": self.metrics["tool_calls"], "longest": len(answer or "")}


NOT_AN_ENV = 3
'''


@tool(thread_safe=True)
def echo(text: str) -> str:
    """Echo a text.

    Args:
        text: What to echo.
    """
    return text


def test_envs_resolve_by_registered_name_module_path_and_file_path(tmp_path, monkeypatch):
    (tmp_path / "countenv.py").write_text(ENV_FILE)
    assert get_env("multihop_qa") is MultiHopQAEnv and ENVS["multihop_qa"] is MultiHopQAEnv
    by_file = get_env(f"{tmp_path / 'countenv.py'}:CountEnv")
    assert by_file is get_env(f"{tmp_path / 'countenv.py'}:CountEnv")  # imported once
    monkeypatch.syspath_prepend(str(tmp_path))
    assert get_env("countenv:CountEnv").declared_metrics().keys() >= {"calls", "longest", "turns"}
    with pytest.raises(KeyError, match="unknown environment 'nope'.*multihop_qa"):
        get_env("nope")
    with pytest.raises(ImportError, match="has no attribute 'Missing'"):
        get_env("countenv:Missing")
    with pytest.raises(ImportError, match="cannot import 'no_such_module'"):
        get_env("no_such_module:Env")
    (tmp_path / "broken.py").write_text("def oops(:\n")
    with pytest.raises(ImportError, match="broken.py'.*SyntaxError"):
        get_env(f"{tmp_path / 'broken.py'}:Env")
    with pytest.raises(TypeError, match="not a ToolEnv subclass"):
        get_env("countenv:NOT_AN_ENV")


def test_register_env_and_register_tool_refuse_a_second_class_under_a_name():
    @register_env("test_counting")
    class Counting(ToolEnv):
        pass

    try:
        assert get_env("test_counting") is Counting and register_env("test_counting")(Counting) is Counting
        with pytest.raises(ValueError, match="already registered"):
            register_env("test_counting")(type("Other", (ToolEnv,), {}))
        with pytest.raises(TypeError, match="ToolEnv subclass"):
            register_env("test_str")(str)
    finally:
        ENVS.pop("test_counting", None)


def test_tools_from_names_paths_and_factories_with_settings(tmp_path):
    calls = []

    @register_tool(name="test_prefixed")
    def factory(data_dir, prefix: str = ">") -> Tool:
        calls.append((data_dir, prefix))
        return Tool(fn=lambda text: f"{prefix}{text}", name="prefixed", description="", parameters=echo.parameters)

    try:
        tools = build_tools([f"{__name__}:echo", {"name": "test_prefixed", "prefix": "#"}], data_dir=tmp_path)
        assert [t.name for t in tools] == ["echo", "prefixed"] and calls == [(tmp_path, "#")]
        with pytest.raises(ValueError, match="takes no settings"):
            build_tools([{"name": f"{__name__}:echo", "top_k": 2}])
        with pytest.raises(ValueError, match="share a name"):
            build_tools([f"{__name__}:echo", f"{__name__}:echo"])
        with pytest.raises(KeyError, match="unknown tool 'nope'"):
            build_tools(["nope"])
        with pytest.raises(TypeError, match="expected a Tool"):
            build_tools([f"{__name__}:ENV_FILE"])
    finally:
        TOOLS.pop("test_prefixed", None)


def test_the_default_env_gets_the_search_tool_and_its_config(tmp_path, corpus):
    from agent_r1.data import write_corpus

    write_corpus(corpus.assign(doc_id=corpus.doc_id.astype(str)), tmp_path / "corpus.parquet")
    cfg = EnvConfig(top_k=1, max_turns=3, system_prompt="default", retrieval_bonus=0.5)
    tools = env_tools(cfg, tmp_path)
    env = make_env_factory(cfg, tools)()
    assert isinstance(env, MultiHopQAEnv) and [t.name for t in tools] == ["search"]
    assert env.max_turns == 3 and env.retrieval_bonus == 0.5 and env.system_prompt == MultiHopQAEnv.DEFAULT_SYSTEM_PROMPT
    with pytest.raises(ValueError, match="needs a tool named 'search'"):
        make_env_factory(cfg, [echo])()


def test_config_names_a_bad_env_or_tool(tmp_path):
    with pytest.raises(ConfigError, match="env.name: unknown environment 'nope'"):
        load_config(overrides={"env": {"name": "nope"}})
    with pytest.raises(ConfigError, match="env.tools: unknown tool 'nope'"):
        load_config(overrides={"env": {"tools": ["search", "nope"]}})
    (tmp_path / "countenv2.py").write_text(ENV_FILE)
    with pytest.raises(ConfigError, match="naive_rag is a multi-hop QA baseline"):
        load_config(overrides={"env": {"name": f"{tmp_path / 'countenv2.py'}:CountEnv"}})
    cfg = load_config(overrides={"env": {"name": f"{tmp_path / 'countenv2.py'}:CountEnv", "tools": [f"{__name__}:echo"]},
                                 "eval": {"baselines": ["base_tool_call"]}})
    assert cfg.env.tools == [f"{__name__}:echo"]


class Declared(ToolEnv):
    METRICS = {"hits": Metric("hits", agg="sum"), "best": Metric("best", agg="max")}

    def final_reward(self, answer, action_text):
        return 0.0, {"hits": len(answer or ""), "best": len(answer or "")}


class Undeclared(ToolEnv):
    def final_reward(self, answer, action_text):
        return 0.0, {"surprise": 1.0}


def _run(tok, env_cls, answers):
    engine = ScriptedEngine(tok, [[f"<answer>{a}</answer>" for a in answers]])
    tasks = [{"id": str(i), "question": "q"} for i in range(len(answers))]
    return run_episodes(engine, lambda: env_cls([echo]), tasks, ContextManager(tok), SamplingParams(max_new_tokens=32))


def test_declared_metrics_aggregate_as_declared_into_rollout_stats_and_eval(tok):
    from agent_r1.evaluate import summarize

    trajs = _run(tok, Declared, ["ab", "abcd"])
    assert trajs[0].metrics["hits"] == 2.0 and trajs[0].metric_aggs["hits"] == "sum"
    stats = rollout_stats(trajs)
    assert stats["hits"] == 6.0 and stats["best"] == 4.0 and stats["turns"] == 1.0 and "em" not in stats
    assert summarize(trajs, [{}, {}])["hits"] == 6.0


def test_an_undeclared_metric_is_an_error_naming_it(tok):
    with pytest.raises(MetricError, match="'surprise', which it does not declare; add it to Undeclared.METRICS"):
        _run(tok, Undeclared, ["x"])
    with pytest.raises(ValueError, match="agg must be one of"):
        Metric("x", agg="median")
    from agent_r1.envs.metrics import check_metrics

    with pytest.raises(MetricError, match="hits='many': a metric must be a number"):
        check_metrics(Declared, {"hits": "many"})
