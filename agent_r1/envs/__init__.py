"""Environments: `ToolEnv` (parse a turn, run its tool calls, observe, reward), task envs, the
registry that a config's ``env.name`` reads, and the typed episode metrics."""

from agent_r1.envs.metrics import Metric, MetricError, aggregate
from agent_r1.envs.parsers import PARSERS, HermesParser, ParsedTurn, ToolCall, ToolCallParser, get_parser
from agent_r1.envs.code import CodeEnv
from agent_r1.envs.qa import MultiHopQAEnv, NaiveRAGEnv
from agent_r1.envs.registry import ENVS, env_tools, get_env, make_env_factory, register_env
from agent_r1.envs.text_game import TextWorldEnv
from agent_r1.envs.tool_env import EnvStep, StepInfo, ToolEnv, no_tool_env

register_env("code")(CodeEnv)
register_env("multihop_qa")(MultiHopQAEnv)
register_env("naive_rag")(NaiveRAGEnv)
register_env("textworld")(TextWorldEnv)

__all__ = [
    "CodeEnv",
    "ENVS",
    "PARSERS",
    "EnvStep",
    "StepInfo",
    "HermesParser",
    "Metric",
    "MetricError",
    "MultiHopQAEnv",
    "NaiveRAGEnv",
    "ParsedTurn",
    "ToolCall",
    "ToolCallParser",
    "TextWorldEnv",
    "ToolEnv",
    "aggregate",
    "env_tools",
    "get_env",
    "get_parser",
    "make_env_factory",
    "no_tool_env",
    "register_env",
]
