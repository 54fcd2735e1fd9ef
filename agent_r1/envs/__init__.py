"""Environments: `ToolEnv` (parse a turn, run its tool calls, observe, reward) and task envs."""

from agent_r1.envs.parsers import PARSERS, HermesParser, ParsedTurn, ToolCall, ToolCallParser, get_parser
from agent_r1.envs.qa import MultiHopQAEnv, NaiveRAGEnv
from agent_r1.envs.tool_env import EnvStep, ToolEnv

ENVS: dict[str, type[ToolEnv]] = {"multihop_qa": MultiHopQAEnv, "naive_rag": NaiveRAGEnv}

__all__ = [
    "ENVS",
    "PARSERS",
    "EnvStep",
    "HermesParser",
    "MultiHopQAEnv",
    "NaiveRAGEnv",
    "ParsedTurn",
    "ToolCall",
    "ToolCallParser",
    "ToolEnv",
    "get_parser",
]
