"""Tools the agent can call: typed functions with derived JSON schemas, the registry, and the
built-in search."""

from agent_r1.tools.base import Tool, ToolOutput, ToolResult, run_tool, tool, validate_arguments
from agent_r1.tools.registry import TOOLS, build_tools, get_tool, register_tool, resolve_tool
from agent_r1.tools.search import SearchIndex, make_search_tool

__all__ = [
    "TOOLS",
    "SearchIndex",
    "Tool",
    "ToolOutput",
    "ToolResult",
    "build_tools",
    "get_tool",
    "make_search_tool",
    "register_tool",
    "resolve_tool",
    "run_tool",
    "tool",
    "validate_arguments",
]
