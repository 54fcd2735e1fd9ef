"""MCP servers as agent tools (agent_r1/tools/mcp.py), against real servers, no mocks: the demo
server of tests/mcp_servers/ over stdio and over streamable HTTP, and mcp-server-time from PyPI.

Each test closes the servers it started (the `closed` fixture), and the stdio ones check that
no server process is left, by a marker unique to the test in the server's command line."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from agent_r1.envs import ToolEnv
from agent_r1.ports import free_port
from agent_r1.tools import MCPConfigError, Tool, build_tools, close_servers, mcp_tools, run_tool
from agent_r1.tools import mcp as mcp_module
from tests.procs import children_of, live, until, watchdogs_of

ROOT = Path(__file__).resolve().parents[1]
DEMO = str(Path(__file__).resolve().parent / "mcp_servers" / "demo_server.py")
HOSTILE = str(Path(__file__).resolve().parent / "mcp_servers" / "hostile_server.py")


def _processes(marker: str) -> list[int]:
    """Live processes with `marker` in their command line or environment."""
    return live(lambda p: marker.encode() in p.cmdline + p.environ)


def _gone(marker: str, within_s: float = 30.0) -> bool:
    return until(lambda: not _processes(marker), within_s)


def _hanging(tools: dict, key: str, n: int) -> bool:
    """Whether the server is in `n` `hang` calls with `key` (within a deadline)."""
    return until(lambda: run_tool(tools["waiting"], {"key": key}).text == str(n))


def _http_server(marker: str) -> tuple[subprocess.Popen, str]:
    """The demo server over streamable HTTP on a free port of 127.0.0.1, once it accepts connections."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, DEMO, "--http", str(port), marker],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc, f"http://127.0.0.1:{port}/mcp"
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("the demo HTTP server did not start")


@pytest.fixture
def marker():
    """A unique argument for a test's stdio servers; none is left when the test ends."""
    mark = f"mcp-test-{uuid.uuid4().hex[:12]}"
    yield mark
    close_servers()
    assert _gone(mark), f"server processes left: {_processes(mark)}"


@pytest.fixture(scope="module")
def http_url():
    proc, url = _http_server(f"mcp-test-http-{uuid.uuid4().hex[:8]}")
    yield url
    proc.kill()
    proc.wait()


@pytest.fixture(params=["stdio", "http"])
def demo(request, marker):
    """The settings of an mcp entry for the demo server, over each transport."""
    if request.param == "stdio":
        return {"command": sys.executable, "args": [DEMO, marker]}
    return {"url": request.getfixturevalue("http_url")}


def _tools(**settings) -> dict:
    return {t.name: t for t in mcp_tools(**settings)}


def test_every_listed_tool_becomes_an_agent_tool_with_the_servers_schema(demo):
    tools = _tools(**demo)
    assert set(tools) == {"add", "echo", "whoami", "whereami", "fail_soft", "fail_hard", "picture", "hang", "waiting",
                          "release", "spawn", "die"}
    add = tools["add"]
    assert add.description == "Add two integers." and add.thread_safe
    assert add.parameters["properties"].keys() == {"a", "b"} and add.parameters["required"] == ["a", "b"]
    assert add.schema["function"]["parameters"] == add.parameters  # what the chat template shows
    result = run_tool(add, {"a": 2, "b": 40})
    assert (result.text, result.error, result.info) == ("42", None, {"structured": {"result": 42}})
    assert run_tool(tools["echo"], {"text": "héllo\nworld"}).text == "héllo\nworld"
    # the server's schema validates the model's arguments before any call
    invalid = run_tool(add, {"a": "2", "b": 1}).error
    assert invalid == "invalid arguments for tool 'add': argument 'a' must be integer, got string"
    assert "missing required argument 'b'" in run_tool(add, {"a": 1}).error


def test_errors_are_tool_errors_and_other_content_is_described(demo):
    tools = _tools(**demo)
    soft = run_tool(tools["fail_soft"], {"reason": "no such city"})  # isError
    assert soft.error == "tool 'fail_soft' raised MCPToolError: Error executing tool fail_soft: no such city"
    assert soft.text == "Error: " + soft.error
    hard = run_tool(tools["fail_hard"], {})  # a JSON-RPC error
    assert hard.error.endswith("raised MCPToolError: the server answered with error -32603: the demo server refuses")
    assert run_tool(tools["picture"], {}).text == "a pixel:\n[image: image/png, 67 bytes]"
    assert run_tool(tools["add"], {"a": 1, "b": 1}).text == "2"  # the server is fine after all that


def test_a_call_past_its_timeout_is_a_timed_out_tool_error_and_the_server_goes_on(demo):
    tools = _tools(**demo, timeout_s=1.0)
    result = run_tool(tools["hang"], {"seconds": 600})
    assert result.timed_out and result.error == "tool 'hang' timed out after 1 s"
    assert run_tool(tools["add"], {"a": 1, "b": 2}).text == "3"


def test_calls_from_many_threads_at_once(demo):
    tools = _tools(**demo, timeout_s=600)
    key = uuid.uuid4().hex
    with ThreadPoolExecutor(9) as pool:
        hanging = pool.submit(run_tool, tools["hang"], {"seconds": 600, "key": key})
        assert _hanging(tools, key, 1)

        def work(i: int) -> tuple[str, str]:
            return run_tool(tools["add"], {"a": i, "b": 1000}).text, run_tool(tools["echo"], {"text": f"t{i}"}).text

        results = list(pool.map(work, range(40)))
        assert results == [(str(i + 1000), f"t{i}") for i in range(40)]
        assert not hanging.done()  # they were all answered while a call was in flight (it waits for release)
        run_tool(tools["release"], {"key": key})
        assert hanging.result().text == "woke up"


def test_include_exclude_and_prefix(demo):
    assert set(_tools(**demo, include=["add", "echo"])) == {"add", "echo"}
    assert set(_tools(**demo, exclude=["die", "hang", "waiting", "release", "spawn"])) == {
        "add", "echo", "whoami", "whereami", "fail_soft", "fail_hard", "picture"}
    tools = _tools(**demo, include=["add"], prefix="demo_")
    assert list(tools) == ["demo_add"]
    assert run_tool(tools["demo_add"], {"a": 3, "b": 4}).text == "7"  # called by the server's name
    with pytest.raises(MCPConfigError, match=r"include names tools the server does not list: sub \(it lists: add, "):
        mcp_tools(**demo, include=["add", "sub"])


def test_two_servers_with_one_tool_name_need_a_prefix(marker, http_url):
    stdio = {"name": "mcp", "command": sys.executable, "args": [DEMO, marker], "include": ["add", "echo"]}
    http = {"name": "mcp", "url": http_url, "include": ["add"]}
    with pytest.raises(ValueError, match=r"^two tools share a name: add \(of \['add', 'echo', 'add'\]\); rename one, "
                                         r"or give an mcp entry a prefix"):
        build_tools([stdio, http])
    assert [t.name for t in build_tools([stdio, http | {"prefix": "web_"}])] == ["add", "echo", "web_add"]


def test_stdio_settings_env_and_cwd(marker, tmp_path):
    tools = _tools(command=sys.executable, args=[DEMO, marker], cwd=str(tmp_path), env={"DEMO_VALUE": 7})
    assert run_tool(tools["whereami"], {"variable": "DEMO_VALUE"}).text == f"{tmp_path} DEMO_VALUE=7"
    # through the registry too: `env` is the server's, not the config's env section
    entry = {"name": "mcp", "command": sys.executable, "args": [DEMO, marker, "2"], "env": {"DEMO_VALUE": "x"}}
    whereami = next(t for t in build_tools([entry], env=object()) if t.name == "whereami")
    assert run_tool(whereami, {"variable": "DEMO_VALUE"}).text.endswith(" DEMO_VALUE=x")


def test_a_server_is_shared_by_the_entries_naming_it_and_stops_when_closed(marker):
    first = _tools(command=sys.executable, args=[DEMO, marker])
    again = _tools(command=sys.executable, args=[DEMO, marker], include=["whoami"])  # a later stage's tools
    pid = run_tool(first["whoami"], {}).text
    assert run_tool(again["whoami"], {}).text == pid and _processes(marker)
    close_servers()
    assert _gone(marker)
    closed = run_tool(first["add"], {"a": 1, "b": 1})
    assert closed.error.endswith(f"{DEMO} {marker}` was closed")


def test_a_lost_server_is_restarted_once_then_its_tools_fail(marker):
    tools = _tools(command=sys.executable, args=[DEMO, marker])
    pid = run_tool(tools["whoami"], {}).text
    with ThreadPoolExecutor(3) as pool:  # calls of other threads in flight when the server dies
        in_flight = [pool.submit(run_tool, tools["hang"], {"seconds": 600, "key": "dies"}) for _ in range(3)]
        assert _hanging(tools, "dies", 3)
        first = run_tool(tools["die"], {})
        lost = [f.result() for f in in_flight]
    assert "was lost during the call (its last stderr line: demo server: dying (asked to)); it was restarted" \
        in first.error
    assert all(r.error.endswith("; it was restarted") for r in lost)  # one restart for all of them
    restarted = run_tool(tools["whoami"], {}).text
    assert restarted.isdigit() and restarted != pid
    assert run_tool(tools["add"], {"a": 1, "b": 1}).text == "2"
    second = run_tool(tools["die"], {})
    assert second.error.endswith("it had been restarted once already: "
                                 "its tools are unavailable for the rest of the run")
    after = run_tool(tools["add"], {"a": 1, "b": 1})
    assert after.error.endswith("was lost again after its restart: its tools are unavailable for the rest of the run")
    assert _gone(marker)


def test_a_lost_http_server_gives_tool_errors():
    proc, url = _http_server(f"mcp-test-http-{uuid.uuid4().hex[:8]}")
    try:
        tools = _tools(url=url, include=["add", "die"])
        assert run_tool(tools["add"], {"a": 1, "b": 1}).text == "2"
        lost = run_tool(tools["die"], {})  # the server exits: reconnecting fails
        assert f"the mcp server {url} was lost during the call; its restart failed (could not connect: " in lost.error
        assert "its tools are unavailable for the rest of the run" in run_tool(tools["add"], {"a": 1, "b": 1}).error
    finally:
        proc.kill()
        proc.wait()
        close_servers()


def test_config_problems_are_one_line_each(marker, http_url):
    cases = {
        "mcp entry: give `command` (a stdio server) or `url` (a streamable HTTP server), not neither": {},
        "mcp entry: give `command` (a stdio server) or `url` (a streamable HTTP server), not both":
            {"command": "x", "url": http_url},
        "mcp entry: unknown setting(s) comand; known: command, args, env,": {"comand": "x"},
        f"mcp server {http_url}: args, env, cwd and max_message_bytes are settings of a stdio server":
            {"url": http_url, "args": ["a"]},
        "mcp server `python3`: max_message_bytes must be a positive number of bytes, got 0":
            {"command": "python3", "max_message_bytes": 0},
        "mcp server `no-such-mcp-server --x`: command 'no-such-mcp-server' not found (looked on PATH and beside":
            {"command": "no-such-mcp-server", "args": ["--x"]},
        "mcp server `python3`: args must be a list, got 'demo.py'": {"command": "python3", "args": "demo.py"},
        f"mcp server {http_url}: timeout_s must be a positive number of seconds, got 0": {"url": http_url,
                                                                                          "timeout_s": 0},
        f"mcp server `{sys.executable} {DEMO} {marker} --fail-at-start`: exited while starting (its last stderr "
        "line: demo server: cannot start (asked to fail))": {"command": sys.executable,
                                                             "args": [DEMO, marker, "--fail-at-start"]},
        f"mcp server http://127.0.0.1:{free_port()}/mcp: could not connect: ": "unreachable",
    }
    for expected, settings in cases.items():
        if settings == "unreachable":
            settings = {"url": expected.split()[2].rstrip(":")}
        with pytest.raises(MCPConfigError) as caught:
            mcp_tools(**settings)
        message = str(caught.value)
        assert message.startswith(expected) and "\n" not in message, (expected, message)


def test_a_server_that_does_not_answer_at_start_times_out(marker):
    with pytest.raises(MCPConfigError, match=r"`: did not answer within 0.5 s while starting \(startup_timeout_s\) "
                                             r"\(it wrote nothing to stderr\)$"):
        mcp_tools(command=sys.executable, args=["-c", "import time; time.sleep(60)", marker], startup_timeout_s=0.5)


CHILD = """
import sys, threading
from agent_r1.tools import build_tools, run_tool
tools = {t.name: t for t in build_tools([{"name": "mcp", "command": sys.executable, "args": [%r, %r]}])}
threading.Thread(target=run_tool, args=(tools["hang"], {"seconds": 600, "key": "k"}), daemon=True).start()
while run_tool(tools["waiting"], {"key": "k"}).text != "1":
    pass
print(run_tool(tools["whoami"], {}).text, run_tool(tools["spawn"], {}).text, flush=True)
threading.Event().wait()
"""


def test_a_sigkilled_trainer_leaves_no_server(marker):
    """The trainer is killed (no atexit, no close) while a call is in flight, and the server has
    started a process of its own: the watchdog ends the server's whole process group. (Without
    it, the demo server exits when its stdin closes, but the process it started stays.)"""
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(CHILD % (DEMO, marker))], cwd=ROOT,
                             stdout=subprocess.PIPE, text=True)
    try:
        server, spawned = map(int, child.stdout.readline().split())
        assert {server, spawned} <= set(_processes(marker))
    finally:
        child.kill()
        child.wait()
    assert _gone(marker), f"left: {_processes(marker)}"


def test_the_server_dies_with_a_sigkilled_watchdog(marker):
    """A `pkill -9` that matches the watchdog: the kernel kills the server (PR_SET_PDEATHSIG); the
    next call finds it lost and restarts it."""
    tools = _tools(command=sys.executable, args=[DEMO, marker])
    server = int(run_tool(tools["whoami"], {}).text)
    [watchdog] = [w for w in watchdogs_of(os.getpid()) if server in children_of(w)]
    os.kill(watchdog, signal.SIGKILL)
    assert until(lambda: server not in _processes(marker)), "the server outlived its SIGKILLed watchdog"
    assert until(lambda: run_tool(tools["add"], {"a": 1, "b": 1}).text == "2")  # restarted


def test_a_hostile_server_gives_tool_errors_and_the_episode_goes_on(marker):
    """Results that break the tool's own outputSchema, input schemas with a boolean subschema or
    only additionalProperties, a stderr flood and a stdout line without end: each is a tool error
    of its call (or no error at all), never a lost run."""
    tools = _tools(command=sys.executable, args=[HOSTILE, marker], max_message_bytes=1 << 16)
    for _ in range(3):  # not a lost server: no restart, not disabled after two
        bad = run_tool(tools["bad_output"], {})
        assert bad.error == "tool 'bad_output' raised MCPToolError: the result does not match the tool's " \
                            "outputSchema: 'seven' is not of type 'integer' (at $.n)"
    assert run_tool(tools["anything"], {"x": [1, {"a": None}]}).text == "x=[1, {'a': None}]"
    assert "unknown argument 'y' (expected: x)" in run_tool(tools["anything"], {"y": 1}).error
    assert run_tool(tools["strings"], {"b": "2", "a": "1"}).text == "a='1' b='2'"
    assert run_tool(tools["strings"], {"a": 1}).error == "invalid arguments for tool 'strings': argument 'a' must " \
                                                         "be string, got integer"
    broken = Tool(fn=lambda **_: "", name="broken", description="", parameters={"properties": ["x"]})
    assert run_tool(broken, {"x": 1}).error.startswith("invalid arguments for tool 'broken': its schema could not "
                                                       "be checked (TypeError: ")
    [connection] = mcp_module._OPEN.values()
    assert run_tool(tools["noisy"], {"megabytes": 4}).text == "ok"  # 4 MB of stderr, 64 KiB kept
    assert len(connection._tail.kept) <= 1 << 16 and connection._stderr() == " (its last stderr line: noisy: done)"

    env = ToolEnv(list(tools.values()), max_turns=3)
    env.reset({"id": "t", "question": "?", "answers": ["x"]})
    flood = env.step('<tool_call>{"name": "flood", "arguments": {}}</tool_call>')
    assert not flood.done and flood.info.tool_errors == 1
    assert flood.info.errors == [f"tool 'flood' raised MCPToolError: the mcp server `{sys.executable} {HOSTILE} "
                                 f"{marker}` was lost during the call (its last stderr line: agent-r1 watchdog: the "
                                 "process wrote a stdout line of more than 65536 bytes; ending its process group); "
                                 "it was restarted"]
    free = env.step('<tool_call>{"name": "anything", "arguments": {"x": true}}</tool_call>')
    assert not free.done and free.info.errors == [] and free.observation[0]["content"] == "x=True"


def test_mcp_server_time_from_pypi(marker):
    """A server this project did not write (pip install mcp-server-time): its tools, and calls
    whose answers do not depend on today's date."""
    tools = _tools(command="mcp-server-time", args=["--local-timezone", "UTC"], env={"TEST_MARKER": marker})
    assert set(tools) == {"get_current_time", "convert_time"}
    assert set(tools["convert_time"].parameters["required"]) == {"source_timezone", "time", "target_timezone"}
    now = run_tool(tools["get_current_time"], {"timezone": "UTC"})
    assert '"timezone": "UTC"' in now.text and "+00:00" in now.text and now.info["structured"]["timezone"] == "UTC"
    converted = run_tool(tools["convert_time"], {"source_timezone": "UTC", "time": "14:30",
                                                 "target_timezone": "Asia/Tokyo"})
    assert converted.info["structured"]["target"]["datetime"].endswith("T23:30:00+09:00")
    assert converted.info["structured"]["time_difference"] == "+9.0h"
    bad = run_tool(tools["get_current_time"], {"timezone": "Mars/Olympus"})
    assert bad.error is not None and "Invalid timezone" in bad.error
