"""An MCP server for the tests of agent_r1/tools/mcp.py, built with the SDK's `MCPServer`.

Its tools cover what a client meets: a plain result (``add``, ``echo``, ``whoami``,
``whereami``), an ``isError`` result (``fail_soft``: the SDK turns a raised `ToolError` into
one), a JSON-RPC error (``fail_hard`` raises `MCPError`), non-text content (``picture``), a call
that answers when released (``hang``, ``waiting``, ``release``: the tests synchronise on the
server's own state, not on time), one that starts a process of its own (``spawn``) and one that
kills the server (``die``)::

    python demo_server.py                    # stdio
    python demo_server.py --http PORT        # streamable HTTP on 127.0.0.1:PORT/mcp
    python demo_server.py --fail-at-start    # writes a reason to stderr and exits 2

Any other argument is ignored (the tests put a unique marker in the command line to find the
process).
"""

from __future__ import annotations

import os
import subprocess
import sys

from mcp.server.mcpserver import Image, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.shared.exceptions import MCPError

server = MCPServer("demo")
# the smallest PNG: a 1x1 transparent pixel
PIXEL = bytes.fromhex("89504e470d0a1a0a0000000d4948445200000001000000010806000000"
                      "1f15c4890000000d49444154789c6360000002000001e221bc330000000049454e44ae426082")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def echo(text: str) -> str:
    """Return the text unchanged."""
    return text


@server.tool()
def whoami() -> str:
    """The server's process id."""
    return str(os.getpid())


@server.tool()
def whereami(variable: str) -> str:
    """The server's working folder and the value of an environment variable."""
    return f"{os.getcwd()} {variable}={os.environ.get(variable)}"


@server.tool()
def fail_soft(reason: str) -> str:
    """Fail with an isError result."""
    raise ToolError(reason)


@server.tool()
def fail_hard() -> str:
    """Fail with a JSON-RPC error."""
    raise MCPError(code=-32603, message="the demo server refuses")


@server.tool()
def picture() -> list:
    """A caption and a 1x1 PNG."""
    return ["a pixel:", Image(data=PIXEL, format="png")]


_HANGING: dict[str, int] = {}  # key: how many `hang` calls wait on it now
_RELEASE: dict[str, object] = {}  # key: the anyio.Event `release` sets


@server.tool()
async def hang(seconds: float = 60.0, key: str = "") -> str:
    """Answer after `seconds`, or at once when `release` is called with `key`."""
    import anyio

    released = _RELEASE.setdefault(key, anyio.Event())
    _HANGING[key] = _HANGING.get(key, 0) + 1
    try:
        with anyio.move_on_after(seconds):
            await released.wait()
    finally:
        _HANGING[key] -= 1
    return "woke up"


@server.tool()
def waiting(key: str = "") -> int:
    """How many `hang` calls with `key` the server is in now."""
    return _HANGING.get(key, 0)


@server.tool()
def release(key: str = "") -> str:
    """End the `hang` calls with `key`, now and later."""
    import anyio

    _RELEASE.setdefault(key, anyio.Event()).set()
    return "released"


@server.tool()
def spawn() -> str:
    """Start a process of the server's own that sleeps (as npx starts node), with the server's
    arguments; returns its pid."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", *sys.argv[1:]])
    return str(child.pid)


@server.tool()
def die() -> str:
    """Kill the server process at once."""
    print("demo server: dying (asked to)", file=sys.stderr, flush=True)
    os._exit(3)


if __name__ == "__main__":
    if "--fail-at-start" in sys.argv:
        print("demo server: starting up", file=sys.stderr)
        sys.exit("demo server: cannot start (asked to fail)")
    if "--http" in sys.argv:
        server.run("streamable-http", port=int(sys.argv[sys.argv.index("--http") + 1]))
    else:
        server.run()
