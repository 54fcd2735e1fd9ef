"""MCP servers as agent tools: an ``env.tools`` entry ``{name: mcp, ...}`` makes every tool an
MCP (Model Context Protocol) server lists an agent `Tool`, through the official ``mcp`` SDK::

    env:
      tools:
        - {name: mcp, command: mcp-server-time, args: [--local-timezone, UTC]}   # stdio
        - {name: mcp, url: "http://127.0.0.1:8000/mcp", prefix: "web_"}          # streamable HTTP

Each tool keeps the server's name (after ``prefix``), description and input schema (so
`run_tool` validates the model's arguments against it and the chat template shows it); a call's
text content is the observation, other content one line each ("[image: image/png, 1234 bytes]").
A result the server flags ``isError``, a JSON-RPC error, a result that breaks the tool's own
``outputSchema`` or the protocol, a timeout and a server lost during the call are tool errors
(`MCPToolError`, which `run_tool` turns into "Error: ..."), never crashes. docs/mcp.md has every
setting.

Lifecycle, one `MCPServerConnection` per server (entries with the same command or url share it):

- start: the first entry that names the server connects to it, on an asyncio event loop in a
  thread of the connection's own; the tools are listed once, and the Tools (``thread_safe``)
  submit their calls to that loop (``asyncio.run_coroutine_threadsafe``), from any number of
  threads at once. A stdio server runs under agent_r1/lifetime.py's watchdog (the SDK starts
  the watchdog, in a session of its own): it dies with the trainer, SIGKILL included, and with
  the watchdog; the watchdog passes on the server's stdout and ends the server when a line (a
  JSON-RPC message) grows past ``max_message_bytes``. Its stderr goes to a pipe of which the last
  64 KiB are kept (`_StderrTail`); the errors quote its last line.
- restart once: when the server is lost (a stdio server exits, an HTTP server stops answering),
  the call that noticed fails, and the connection reconnects at once (a new process for stdio)
  and lists the tools again; when it is lost a second time (or cannot reconnect) its tools
  fail with the reason for the rest of the run.
- stop: `MCPServerConnection.close`, `close_servers` (every open connection; a pipeline run
  calls it when it ends) and, at the trainer's exit, ``atexit``: the SDK closes a stdio server's
  stdin, then ends its process group (SIGTERM, SIGKILL).
"""

from __future__ import annotations

import asyncio
import atexit
import json
import math
import os
import shlex
import shutil
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent_r1 import lifetime
from agent_r1.tools.base import Tool, ToolOutput
from agent_r1.tools.registry import register_tool


class MCPConfigError(ValueError):
    """A problem with an ``{name: mcp, ...}`` entry or with starting its server, in one line."""


class MCPToolError(RuntimeError):
    """A call that failed on the server's side: an ``isError`` result, a JSON-RPC error, a result
    refused (against the tool's ``outputSchema``), a timeout, or the server lost during the call
    (or for good)."""


@dataclass(frozen=True)
class ServerSpec:
    """Where a server is: a stdio ``command`` (with ``args``, ``env``, ``cwd``) or a streamable
    HTTP ``url``. Hashable: connections are shared by spec."""

    command: str | None = None
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    cwd: str | None = None
    url: str | None = None
    startup_timeout_s: float = 30.0
    max_message_bytes: int = 8 << 20

    @property
    def label(self) -> str:
        """How messages name the server: ``mcp server `cmd args``` or ``mcp server <url>``."""
        return f"mcp server `{shlex.join([self.command, *self.args])}`" if self.command else f"mcp server {self.url}"

    def executable(self) -> str:
        """The command's path: as given when it has a folder (relative to ``cwd``), else looked
        up on PATH, then beside the running Python (a venv's bin/, where pip puts a server)."""
        if os.sep in self.command:
            path = Path(self.cwd or ".", self.command)
            found = os.path.abspath(path) if path.is_file() and os.access(path, os.X_OK) else None
        else:
            found = shutil.which(self.command) or shutil.which(self.command, path=str(Path(sys.executable).parent))
        if found is None:
            raise MCPConfigError(f"{self.label}: command {self.command!r} not found (looked on PATH and beside "
                                 f"{sys.executable}); install the server or give its full path")
        return found

    def client(self, executable: str | None, errlog):
        """An (unentered) ``mcp.Client`` for the server; a stdio server's `executable` is run under
        the watchdog (agent_r1/lifetime.py), its stderr written to `errlog`."""
        from mcp import Client, StdioServerParameters
        from mcp.client.stdio import stdio_client

        if self.url:
            return Client(self.url)
        command = lifetime.watched([executable, *self.args], grace_s=2.0, max_line_bytes=self.max_message_bytes)
        params = StdioServerParameters(command=command[0], args=command[1:], cwd=self.cwd, env=dict(self.env))
        return Client(stdio_client(params, errlog=errlog))


@dataclass
class _Session:
    """One connection to the server (a restart makes a new one): the entered client, the event
    that ends it, and the task that holds it open."""

    client: Any
    stop: asyncio.Event
    task: asyncio.Task


_GONE = "its tools are unavailable for the rest of the run"


class _StderrTail:
    """A stdio server's stderr: a pipe (`errlog`, the server's end, stays open here for the
    connection's life, so restarts share it), read as it comes and before each error message;
    only its last `size` bytes are kept."""

    def __init__(self, size: int = 64 << 10):
        read, write = os.pipe()
        os.set_blocking(read, False)
        self.fd, self.size, self.kept, self.closed = read, size, bytearray(), False
        self.errlog = open(write, "w")
        self._lock = threading.Lock()

    def drain(self) -> None:
        with self._lock:
            while not self.closed:
                try:
                    chunk = os.read(self.fd, 1 << 16)
                except BlockingIOError:
                    return
                self.kept += chunk
                del self.kept[:-self.size]
                if not chunk:
                    return

    def last_line(self) -> str | None:
        self.drain()
        lines = [line.strip() for line in self.kept.decode(errors="replace").splitlines() if line.strip()]
        return lines[-1] if lines else None

    def close(self) -> None:
        with self._lock:
            if not self.closed:
                self.closed = True
                os.close(self.fd)
                self.errlog.close()


class MCPServerConnection:
    """A client session with one MCP server, on an event loop in a background thread; see the
    module docstring for its lifecycle. ``tools`` are the tools the server listed at start."""

    def __init__(self, spec: ServerSpec):
        self.spec = spec
        self._executable = spec.executable() if spec.command else None  # before anything starts
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"mcp-{spec.command or spec.url}",
                                        daemon=True)
        self._thread.start()
        self._tail = _StderrTail() if spec.command else None
        if self._tail:
            self._loop.call_soon_threadsafe(self._loop.add_reader, self._tail.fd, self._tail.drain)
        self._lock = threading.Lock()
        self._restarts_left = 1
        self._failure: str | None = None  # why the tools fail for good (lost twice, closed)
        try:
            self._session, self.tools = self._open()
        except MCPConfigError as e:
            self.close()
            raise MCPConfigError(f"{spec.label}: {e}") from None

    def _open(self) -> tuple[_Session, list]:
        """Connect and list the tools; `MCPConfigError` saying why when the server cannot start."""
        from mcp.shared.exceptions import MCPError
        from mcp.types import CONNECTION_CLOSED

        try:
            return asyncio.run_coroutine_threadsafe(self._connect(), self._loop).result()
        except (Exception, BaseExceptionGroup) as e:  # noqa: BLE001 - the SDK's task groups' exception groups
            while isinstance(e, BaseExceptionGroup) and len(e.exceptions) == 1:
                e = e.exceptions[0]
            code = e.error.code if isinstance(e, MCPError) else None
            why = ("exited while starting" if code == CONNECTION_CLOSED and self.spec.command else
                   f"did not answer within {self.spec.startup_timeout_s:g} s while starting (startup_timeout_s)"
                   if isinstance(e, TimeoutError) else f"could not connect: {_one_line(e)}")
            raise MCPConfigError(why + self._stderr()) from None

    async def _connect(self) -> tuple[_Session, list]:
        ready: asyncio.Future = self._loop.create_future()
        stop = asyncio.Event()
        task = self._loop.create_task(self._hold(ready, stop))
        client, tools = await ready
        return _Session(client, stop, task), tools

    async def _hold(self, ready: asyncio.Future, stop: asyncio.Event) -> None:
        """Enter the client, list the tools (within ``startup_timeout_s`` in all), hand both to
        `ready`, and keep the session open until `stop` (or until the transport fails: an HTTP
        server gone ends it)."""
        import anyio

        try:
            with anyio.CancelScope(deadline=anyio.current_time() + self.spec.startup_timeout_s) as scope:
                async with self.spec.client(self._executable, self._tail and self._tail.errlog) as client:
                    tools, cursor = [], None
                    while True:
                        page = await client.list_tools(cursor=cursor)
                        tools += page.tools
                        if not (cursor := page.next_cursor):
                            break
                    scope.deadline = math.inf  # started: the session stays open
                    ready.set_result((client, tools))
                    await stop.wait()
            if scope.cancelled_caught and not ready.done():
                ready.set_exception(TimeoutError())
        except BaseException as e:  # noqa: BLE001 - reported to the starter; after the start, a lost server
            if not ready.done():
                ready.set_exception(e)

    def _stderr(self) -> str:
        """`` (its last stderr line: ...)`` of a stdio server, for error messages; "" for an HTTP
        server, or once closed."""
        if not self._tail or self._tail.closed:
            return ""
        line = self._tail.last_line()
        return f" (its last stderr line: {line[:300]})" if line else " (it wrote nothing to stderr)"

    def call(self, name: str, arguments: dict, timeout_s: float):
        """Call tool `name` (the server's name) and return the SDK's ``CallToolResult``; raises
        `MCPToolError` for a JSON-RPC error, a timeout or a lost server (restarting it once)."""
        session = self._current()
        coro = session.client.call_tool(name, arguments, read_timeout_seconds=timeout_s)
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(timeout_s + 5.0)  # the SDK's own timeout fires first
        except Exception as e:  # noqa: BLE001 - what the SDK raises when the server is lost varies
            future.cancel()
            raise MCPToolError(self._failed_call(e, session, timeout_s)) from None

    def _failed_call(self, e: Exception, session: _Session, timeout_s: float) -> str:
        """Why a call failed: a timeout, an error the server answered with (JSON-RPC), a result
        the SDK refused (it breaks the tool's ``outputSchema`` or the protocol), or else the
        server lost (restarted once, see `_lost`)."""
        from mcp.shared.exceptions import MCPError
        from mcp.types import CONNECTION_CLOSED, REQUEST_TIMEOUT
        from pydantic import ValidationError

        code = e.error.code if isinstance(e, MCPError) else None
        if code == REQUEST_TIMEOUT or isinstance(e, TimeoutError):
            return f"no answer from the {self.spec.label} within {timeout_s:g} s (timeout_s)"
        if code not in (None, CONNECTION_CLOSED):
            return f"the server answered with error {code}: {_one_line(e)}"
        if isinstance(e, ValidationError):
            return f"the server's answer is not a valid tool result: {_one_line(e)}"
        if isinstance(e, RuntimeError):  # the SDK's check of the result against the tool's outputSchema
            cause = e.__cause__
            if hasattr(cause, "message") and hasattr(cause, "json_path"):  # a jsonschema error
                return f"the result does not match the tool's outputSchema: {cause.message} (at {cause.json_path})"
            return f"the result was refused: {_one_line(e)}"
        return f"the {self.spec.label} was lost during the call{self._stderr()}; {self._lost(session)}"

    def _current(self) -> _Session:
        with self._lock:
            if self._session is None:
                raise MCPToolError(self._failure)
            if self._session.task.done():  # the transport ended by itself: the server is gone
                session = self._session
            else:
                return self._session
        raise MCPToolError(f"the {self.spec.label} was lost{self._stderr()}; {self._lost(session)}")

    def _lost(self, session: _Session) -> str:
        """Restart the server once after `session` was lost (unless another call did already);
        returns what became of it, for the error message."""
        with self._lock:
            if session is not self._session:
                return "it was restarted" if self._session is not None else self._failure
            self._session = None
            self._end(session)
            if self._restarts_left == 0:
                self._failure = f"the {self.spec.label} was lost again after its restart: {_GONE}"
                return f"it had been restarted once already: {_GONE}"
            self._restarts_left -= 1
            try:
                self._session, self.tools = self._open()
            except MCPConfigError as e:
                self._failure = f"the {self.spec.label} was lost and its restart failed ({e}): {_GONE}"
                return f"its restart failed ({e}): {_GONE}"
            return "it was restarted"

    def _end(self, session: _Session) -> None:
        async def end() -> None:
            session.stop.set()
            await asyncio.wait([session.task], timeout=15.0)

        asyncio.run_coroutine_threadsafe(end(), self._loop).result()

    def close(self) -> None:
        """End the session (a stdio server stops) and the loop's thread; idempotent."""
        with self._lock:
            session, self._session = getattr(self, "_session", None), None
            self._failure = f"the {self.spec.label} was closed"
        if session is not None:
            self._end(session)
        if self._thread.is_alive():
            if self._tail:
                self._loop.call_soon_threadsafe(self._loop.remove_reader, self._tail.fd)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5.0)
        if self._tail:
            self._tail.close()
        with _OPEN_LOCK:
            if _OPEN.get(self.spec) is self:
                del _OPEN[self.spec]


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return text[:300]


_OPEN: dict[ServerSpec, MCPServerConnection] = {}
_OPEN_LOCK = threading.RLock()  # a connection that fails to start closes itself inside `connect`


def connect(spec: ServerSpec) -> MCPServerConnection:
    """The open connection to the server `spec` names, started on first use (each stage of a
    run builds its tools anew; they share one server)."""
    with _OPEN_LOCK:
        if spec not in _OPEN:
            _OPEN[spec] = MCPServerConnection(spec)
        return _OPEN[spec]


def close_servers() -> None:
    """Close every open connection (their stdio servers stop); also run at exit."""
    for connection in list(_OPEN.values()):
        connection.close()


atexit.register(close_servers)


def _strings(value: Any, what: str, label: str) -> tuple[str, ...]:
    if not isinstance(value, (list, tuple)) or isinstance(value, str):
        raise MCPConfigError(f"{label}: {what} must be a list, got {value!r}")
    return tuple(str(v) for v in value)


def _spec(command, args, server_env, cwd, url, startup_timeout_s, max_message_bytes) -> ServerSpec:
    """The `ServerSpec` of an entry's settings; `MCPConfigError` for an impossible combination."""
    if (command is None) == (url is None):
        got = "both" if command is not None else "neither"
        raise MCPConfigError(f"mcp entry: give `command` (a stdio server) or `url` (a streamable HTTP server), "
                             f"not {got}")
    label = f"mcp server `{command}`" if command else f"mcp server {url}"
    if url is not None and (args or server_env or cwd or max_message_bytes is not None):
        raise MCPConfigError(f"{label}: args, env, cwd and max_message_bytes are settings of a stdio server "
                             "(command), not of a url")
    if server_env is not None and not isinstance(server_env, dict):
        raise MCPConfigError(f"{label}: env must be a mapping of variable names to values, got {server_env!r}")
    if cwd is not None and not Path(cwd).is_dir():
        raise MCPConfigError(f"{label}: cwd {cwd!r} is not a folder")
    if not (isinstance(startup_timeout_s, (int, float)) and startup_timeout_s > 0):
        raise MCPConfigError(f"{label}: startup_timeout_s must be a positive number of seconds, "
                             f"got {startup_timeout_s!r}")
    if max_message_bytes is not None and not (isinstance(max_message_bytes, int) and max_message_bytes > 0):
        raise MCPConfigError(f"{label}: max_message_bytes must be a positive number of bytes, "
                             f"got {max_message_bytes!r}")
    env = tuple(sorted((str(k), str(v)) for k, v in (server_env or {}).items()))
    return ServerSpec(command=command and str(command), args=_strings(args or [], "args", label), env=env,
                      cwd=cwd and str(cwd), url=url, startup_timeout_s=float(startup_timeout_s),
                      **({"max_message_bytes": max_message_bytes} if max_message_bytes is not None else {}))


def _select(listed: list, include, exclude, label: str) -> list:
    """The listed tools `include` keeps (all when None) and `exclude` drops; a name that the
    server does not list is an error."""
    names = [t.name for t in listed]
    for what, chosen in (("include", include), ("exclude", exclude)):
        unknown = [n for n in _strings(chosen, what, label) if n not in names] if chosen is not None else []
        if unknown:
            raise MCPConfigError(f"{label}: {what} names tools the server does not list: {', '.join(unknown)} "
                                 f"(it lists: {', '.join(names)})")
    return [t for t in listed if (include is None or t.name in include) and t.name not in (exclude or ())]


@register_tool(name="mcp")
def mcp_tools(command: str | None = None, args: list[str] | None = None, cwd: str | None = None,
              url: str | None = None, include: list[str] | None = None, exclude: list[str] | None = None,
              prefix: str = "", timeout_s: float = 10.0, startup_timeout_s: float = 30.0,
              max_output_chars: int = 2000, max_message_bytes: int | None = None,
              **options: Any) -> list[Tool]:
    """The tools of one MCP server (docs/mcp.md): a stdio server's ``command`` with ``args``,
    ``env`` (variables added to the SDK's safe defaults: HOME, PATH, ...) and ``cwd``, or a
    streamable HTTP server's ``url``; ``include`` / ``exclude`` pick tools by the server's names,
    ``prefix`` is put before each name (two servers with a tool of the same name), ``timeout_s``
    bounds a call (seconds), ``startup_timeout_s`` the start (connecting and listing the tools),
    ``max_output_chars`` an observation, ``max_message_bytes`` a stdio server's message (a line of
    its stdout; default 8 MiB: past it the server is ended and restarted). ``env`` arrives in ``options``: a parameter named
    ``env`` would be given the config's env section (registry.py)."""
    server_env = options.pop("env", None)
    if options:
        raise MCPConfigError(f"mcp entry: unknown setting(s) {', '.join(sorted(options))}; known: command, args, "
                             "env, cwd, url, include, exclude, prefix, timeout_s, startup_timeout_s, max_output_chars, "
                             "max_message_bytes")
    spec = _spec(command, args, server_env, cwd, url, startup_timeout_s, max_message_bytes)
    if not (isinstance(timeout_s, (int, float)) and timeout_s > 0):
        raise MCPConfigError(f"{spec.label}: timeout_s must be a positive number of seconds, got {timeout_s!r}")
    connection = connect(spec)
    return [_make_tool(connection, t, str(prefix), float(timeout_s), int(max_output_chars))
            for t in _select(connection.tools, include, exclude, spec.label)]


def _make_tool(connection: MCPServerConnection, listed, prefix: str, timeout_s: float, max_output_chars: int) -> Tool:
    """An agent `Tool` calling the server's tool `listed` (an ``mcp.types.Tool``)."""

    def call(**arguments: Any) -> ToolOutput:
        result = connection.call(listed.name, arguments, timeout_s)
        text = _observation(result)
        if result.is_error:
            raise MCPToolError(text)
        return ToolOutput(text, {"structured": result.structured_content} if result.structured_content else {})

    return Tool(fn=call, name=prefix + listed.name, description=listed.description or listed.title or "",
                parameters=listed.input_schema, timeout_s=timeout_s, max_output_chars=max_output_chars,
                thread_safe=True)


def _observation(result) -> str:
    """A ``CallToolResult`` as text: text content as it is, other content one line each; with no
    content, the structured content as JSON."""
    if not result.content and result.structured_content is not None:
        return json.dumps(result.structured_content)
    return "\n".join(_describe_block(block) for block in result.content)


def _b64_size(data: str) -> int:
    return len(data.rstrip("=")) * 3 // 4


def _describe_block(block) -> str:
    """A content block as the model sees it: text as it is, anything else described in a line."""
    kind = getattr(block, "type", type(block).__name__)
    if kind == "text":
        return block.text
    if kind in ("image", "audio"):
        return f"[{kind}: {block.mime_type}, {_b64_size(block.data)} bytes]"
    if kind == "resource":
        r = block.resource
        size = f"{len(r.text)} chars" if hasattr(r, "text") else f"{_b64_size(r.blob)} bytes"
        return f"[resource: {r.uri}, {r.mime_type or 'no type'}, {size}]"
    if kind == "resource_link":
        return f"[resource link: {block.uri} ({block.name})]"
    return f"[{kind} content]"
