"""An MCP server that misbehaves, for the tests of agent_r1/tools/mcp.py, built on the SDK's
low-level `Server` (which sends what the handlers return, unchecked):

- ``bad_output``: declares an ``outputSchema`` (``{n: integer}``) and returns ``{"n": "seven"}``;
- ``anything``: an input schema with a boolean subschema (``"properties": {"x": true}``);
- ``strings``: an input schema with only ``additionalProperties`` (``{"type": "string"}``);
- ``flood``: writes a line without end to its stdout, the wire (past the SDK's guard that points
  fd 1 at stderr while serving);
- ``noisy``: writes ``megabytes`` MB to stderr, then ``noisy: done``;
- ``ok``: answers ``ok``.

    python hostile_server.py [MARKER]     # stdio; any argument is ignored
"""

from __future__ import annotations

import os
import sys

import anyio
import mcp_types as types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

WIRE = os.dup(1)  # the stdout the client reads, before stdio_server moves fd 1

TOOLS = [
    types.Tool(name="bad_output", description="Returns content that breaks its own output schema.",
               input_schema={"type": "object", "properties": {}},
               output_schema={"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}),
    types.Tool(name="anything", description="Takes x of any type.", input_schema={"type": "object",
                                                                                 "properties": {"x": True}}),
    types.Tool(name="strings", description="Takes any string arguments.",
               input_schema={"type": "object", "additionalProperties": {"type": "string"}}),
    types.Tool(name="flood", description="Writes a line without end to stdout.",
               input_schema={"type": "object", "properties": {}}),
    types.Tool(name="noisy", description="Writes to stderr.",
               input_schema={"type": "object", "properties": {"megabytes": {"type": "integer"}}}),
    types.Tool(name="ok", description="Answers ok.", input_schema={"type": "object", "properties": {}}),
]


async def list_tools(ctx, params) -> types.ListToolsResult:
    return types.ListToolsResult(tools=TOOLS)


async def call_tool(ctx, params) -> types.CallToolResult:
    args = params.arguments or {}
    if params.name == "bad_output":
        return types.CallToolResult(content=[types.TextContent(type="text", text="seven")],
                                    structured_content={"n": "seven"})
    if params.name == "flood":
        chunk = b"x" * 65536
        while True:
            await anyio.to_thread.run_sync(os.write, WIRE, chunk)
    if params.name == "noisy":
        for _ in range(args.get("megabytes", 1) * 16):
            sys.stderr.write("n" * 65535 + "\n")
        print("noisy: done", file=sys.stderr, flush=True)
    text = "ok" if params.name in ("ok", "noisy") else " ".join(f"{k}={v!r}" for k, v in sorted(args.items()))
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)])


server = Server("hostile", on_list_tools=list_tools, on_call_tool=call_tool)


async def main() -> None:
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


if __name__ == "__main__":
    anyio.run(main)
