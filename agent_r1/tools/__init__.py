"""Tools the agent can call: typed functions with derived JSON schemas, the registry, the
built-in search, and the tools of MCP servers (``{name: mcp, ...}``)."""

from agent_r1.tools.base import Tool, ToolOutput, ToolResult, run_tool, tool, validate_arguments
from agent_r1.tools.mcp import MCPConfigError, MCPToolError, close_servers, mcp_tools
from agent_r1.tools.python import SandboxUnavailable, python_tool
from agent_r1.tools.registry import TOOLS, build_tools, get_tool, register_tool, resolve_tool
from agent_r1.tools.search import SearchIndex, make_search_tool

__all__ = [
    "MCPConfigError",
    "MCPToolError",
    "TOOLS",
    "SandboxUnavailable",
    "SearchIndex",
    "Tool",
    "ToolOutput",
    "ToolResult",
    "build_tools",
    "close_servers",
    "get_tool",
    "make_search_tool",
    "mcp_tools",
    "python_tool",
    "register_tool",
    "resolve_tool",
    "run_tool",
    "tool",
    "validate_arguments",
]
