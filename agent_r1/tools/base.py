"""Tools: typed Python functions whose JSON schema is derived, run so that they never crash an episode.

A tool is a plain function with type hints and a Google-style docstring::

    @tool(timeout_s=5.0)
    def lookup(key: str) -> str:
        '''Look a key up in the table.

        Args:
            key: The key to look up.
        '''

`run_tool` validates the model's arguments against the derived schema, runs the function under
the tool's timeout, coerces its output to text and truncates it, and turns every failure into a
`ToolResult` with an `error` (DESIGN.md, contract 3): it never raises.

A tool runs in a forked worker process that is killed when its time is up, so the timeout holds
whatever the tool does (even C code that never releases the GIL); the fork costs a few
milliseconds, and what the tool changes in its worker's memory is lost with the worker. A tool
declared ``thread_safe=True`` runs in a thread of this process instead: microseconds, and state
it keeps between calls stays. Declare it for a fast tool that releases the GIL, because a thread
cannot be stopped (one that hangs is abandoned and keeps running in the background), and only
for one that several threads may call at once: when every tool of the episodes is thread-safe,
the rollout loop steps the episodes side by side (agent_r1/rollout/loop.py), so calls overlap
(the sandboxed ``python`` tool and MCP tools rely on this and bound their own concurrency).
"""

from __future__ import annotations

import multiprocessing
import numbers
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from transformers.utils import get_json_schema


@dataclass(frozen=True)
class ToolOutput:
    """What a tool function may return instead of a plain `str`: the text the model sees plus
    structured extras for rewards and metrics (e.g. the titles a search retrieved)."""

    text: str
    info: dict = field(default_factory=dict)


@dataclass(frozen=True)
class ToolResult:
    """The outcome of one tool call. On failure `error` holds the reason and `text` is
    ``"Error: <reason>"``, so `text` is always the observation to show the model."""

    text: str
    info: dict = field(default_factory=dict)
    error: str | None = None
    truncated: bool = False
    timed_out: bool = False


@dataclass(frozen=True)
class Tool:
    """One capability the agent can call. `parameters` is the JSON schema of `fn`'s arguments."""

    fn: Callable[..., str | ToolOutput]  # text (str, bytes, a number) or a ToolOutput; anything else is an error
    name: str
    description: str
    parameters: dict
    timeout_s: float = 10.0
    max_output_chars: int = 2000
    thread_safe: bool = False  # run in a thread, not a worker process (see the module docstring)

    @property
    def schema(self) -> dict:
        """The function-tool dict for ``tokenizer.apply_chat_template(..., tools=[...])``."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


def tool(
    fn: Callable | None = None,
    *,
    name: str | None = None,
    timeout_s: float = 10.0,
    max_output_chars: int = 2000,
    thread_safe: bool = False,
) -> Tool | Callable[[Callable], Tool]:
    """Make a `Tool` from a typed function with a Google-style docstring; usable as ``@tool`` or
    ``@tool(timeout_s=...)``. Raises transformers' parsing errors if a hint or an argument's
    description is missing."""

    def make(f: Callable) -> Tool:
        spec = get_json_schema(f)["function"]
        return Tool(
            fn=f,
            name=name or spec["name"],
            description=spec["description"] or "",
            parameters=spec["parameters"],
            timeout_s=timeout_s,
            max_output_chars=max_output_chars,
            thread_safe=thread_safe,
        )

    return make if fn is None else make(fn)


_JSON_TYPES: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
    "null": lambda v: v is None,
}


def _json_type_name(value: Any) -> str:
    return next((t for t, check in _JSON_TYPES.items() if check(value)), type(value).__name__)


def _type_error(value: Any, schema: dict) -> str | None:
    """Why `value` does not match `schema` (type, nullable, enum, anyOf, array items), or None; a
    boolean schema allows anything (``true``) or nothing (``false``)."""
    if isinstance(schema, bool):
        return None if schema else "is not allowed"
    if value is None and schema.get("nullable"):
        return None
    if "anyOf" in schema:
        if any(_type_error(value, s) is None for s in schema["anyOf"]):
            return None
        return "matches none of its allowed types"
    types = schema.get("type")
    if types is not None:
        types = [types] if isinstance(types, str) else types
        if not any(_JSON_TYPES.get(t, lambda v: True)(value) for t in types):
            return f"must be {' or '.join(types)}, got {_json_type_name(value)}"
    if "enum" in schema and value not in schema["enum"]:
        return f"must be one of {schema['enum']}, got {value!r}"
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            if (err := _type_error(item, schema["items"])) is not None:
                return f"item {i} {err}"
    return None


def validate_arguments(parameters: dict, arguments: Any) -> str | None:
    """Check tool-call arguments against a tool's `parameters` schema; return the first problem
    (naming the argument) or None when they are valid. Never raises: a schema this check cannot
    read (an MCP server's) makes every call's arguments invalid, saying why."""
    try:
        return _arguments_problem(parameters, arguments)
    except Exception as e:  # noqa: BLE001 - any schema, however malformed, is one tool's problem
        return f"its schema could not be checked ({_describe(e, 200)})"


def _arguments_problem(parameters: dict, arguments: Any) -> str | None:
    if not isinstance(arguments, dict):
        return f"arguments must be a JSON object, got {_json_type_name(arguments)}"
    properties = parameters.get("properties", {})
    for key, value in arguments.items():
        # an argument the schema does not name is refused, unless additionalProperties allows it
        schema = properties[key] if key in properties else parameters.get("additionalProperties", False)
        if schema is False:
            return f"unknown argument '{key}' (expected: {', '.join(properties) or 'no arguments'})"
        if (err := _type_error(value, schema)) is not None:
            return f"argument '{key}' {err}"
    for key in parameters.get("required", []):
        if key not in arguments:
            return f"missing required argument '{key}'"
    return None


def _truncate(text: str, limit: int) -> tuple[str, bool]:
    if len(text) <= limit:
        return text, False
    return f"{text[:limit]}… [truncated {len(text) - limit} chars]", True


def as_text(value: Any) -> str:
    """`value` as text the tokenizer accepts: bytes decoded as UTF-8, anything else through
    ``str``, and unencodable characters (lone surrogates, e.g. from a JSON ``"\\ud800"``)
    replaced. Raises whatever ``str(value)`` raises."""
    if isinstance(value, (bytes, bytearray)):
        value = bytes(value).decode("utf-8", "replace")
    elif not isinstance(value, str):
        value = str(value)
    return value.encode("utf-8", "replace").decode("utf-8")


def _describe(e: BaseException, limit: int) -> str:
    """``"<Type>: <message>"`` of an exception, even one whose ``__str__`` fails."""
    try:
        message = as_text(str(e))
    except Exception:  # noqa: BLE001 - the tool's exception class is user code
        message = "(its message could not be read)"
    return f"{type(e).__name__}: {_truncate(message, limit)[0]}"


def _call(tool: Tool, arguments: dict) -> ToolResult:
    """Call the tool and make its output an observation; in the worker, so a slow ``str`` of a
    huge output is under the timeout too."""
    try:
        output = tool.fn(**arguments)
        text, info = (output.text, output.info) if isinstance(output, ToolOutput) else (output, {})
        if not isinstance(text, (str, bytes, bytearray, numbers.Number)):  # None, a generator, an object
            return _failure(f"tool '{tool.name}' returned {type(text).__name__}, expected text (a str, bytes or a "
                            "number, or a ToolOutput)")
        if not isinstance(info, dict):
            return _failure(f"tool '{tool.name}' returned info of type {type(info).__name__}, expected a dict")
        text, truncated = _truncate(as_text(text), tool.max_output_chars)
    except BaseException as e:  # noqa: BLE001 - any failure of user code becomes an observation
        return _failure(f"tool '{tool.name}' raised {_describe(e, tool.max_output_chars)}")
    return ToolResult(text=text, info=info, truncated=truncated)


def _timeout(tool: Tool) -> ToolResult:
    return _failure(f"tool '{tool.name}' timed out after {tool.timeout_s:g} s", timed_out=True)


def _in_thread(tool: Tool, arguments: dict) -> ToolResult:
    """Python cannot kill a thread: one that hangs past the timeout is abandoned (it keeps
    running in the background and dies with the process)."""
    box: list[tuple[ToolResult, float]] = []
    start = time.monotonic()
    worker = threading.Thread(target=lambda: box.append((_call(tool, arguments), time.monotonic() - start)),
                              name=f"tool-{tool.name}", daemon=True)
    worker.start()
    worker.join(tool.timeout_s)
    # A tool that holds the GIL keeps join from returning on time: a result it took longer than
    # the timeout to give is a timeout too.
    if not box or box[0][1] > tool.timeout_s:
        return _timeout(tool)
    return box[0][0]


def _child(conn, tool: Tool, arguments: dict) -> None:
    result = _call(tool, arguments)
    try:
        conn.send(result)
    except Exception as e:  # noqa: BLE001 - e.g. an info dict that cannot be pickled
        conn.send(_failure(f"tool '{tool.name}' returned a result that cannot be sent back: {_describe(e, 200)}"))


def _in_process(tool: Tool, arguments: dict) -> ToolResult:
    """Fork a worker (so closures and unpicklable tools work), wait for its result at most
    ``timeout_s``, and kill it either way."""
    ctx = multiprocessing.get_context("fork")
    receive, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(send, tool, arguments), name=f"tool-{tool.name}")
    proc.start()
    send.close()
    try:
        if not receive.poll(tool.timeout_s):
            return _timeout(tool)
        try:
            return receive.recv()
        except EOFError:  # the worker died without a result (os._exit, a crash in C code)
            proc.join(1.0)
            return _failure(f"tool '{tool.name}' exited (code {proc.exitcode}) without a result")
    finally:
        proc.kill()
        proc.join()
        receive.close()


def run_tool(tool: Tool, arguments: Any) -> ToolResult:
    """Validate `arguments`, call the tool under its timeout (in a worker process, or a thread
    when the tool is ``thread_safe``), and return a `ToolResult`. Never raises."""
    if (problem := validate_arguments(tool.parameters, arguments)) is not None:
        return _failure(f"invalid arguments for tool '{tool.name}': {problem}")
    try:
        return (_in_thread if tool.thread_safe else _in_process)(tool, arguments)
    except Exception as e:  # noqa: BLE001 - e.g. no memory left to fork a worker
        return _failure(f"tool '{tool.name}' could not be run: {_describe(e, 200)}")


def _failure(error: str, timed_out: bool = False) -> ToolResult:
    return ToolResult(text=f"Error: {error}", error=error, timed_out=timed_out)
