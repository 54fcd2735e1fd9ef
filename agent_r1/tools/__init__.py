"""Tools the agent can call: typed functions with derived JSON schemas, and the built-in search."""

from agent_r1.tools.base import (
    TOOLS,
    Tool,
    ToolOutput,
    ToolResult,
    get_tool,
    register_tool,
    run_tool,
    tool,
    validate_arguments,
)
from agent_r1.tools.search import SearchIndex, make_search_tool

__all__ = [
    "TOOLS",
    "SearchIndex",
    "Tool",
    "ToolOutput",
    "ToolResult",
    "get_tool",
    "make_search_tool",
    "register_tool",
    "run_tool",
    "tool",
    "validate_arguments",
]
