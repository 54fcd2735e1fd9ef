import time

import pandas as pd
import pytest

from agent_r1.tools import (
    TOOLS,
    SearchIndex,
    ToolOutput,
    get_tool,
    make_search_tool,
    register_tool,
    run_tool,
    tool,
)


@tool(timeout_s=1.0, max_output_chars=50)
def lookup(key: str, limit: int = 3, exact: bool = False, tags: list[str] | None = None) -> ToolOutput:
    """Look a key up in the table.

    Args:
        key: The key to look up.
        limit: How many rows to return.
        exact: Match the key exactly.
        tags: Only rows with these tags.
    """
    if key == "boom":
        raise ValueError("no such table")
    if key == "flood":
        return "x" * 1234 + "y" * 50
    if key == "hang":
        time.sleep(60)
    return ToolOutput(f"{key}:{limit}", {"rows": limit})


def test_schema_is_derived_from_hints_and_docstring():
    fn = lookup.schema["function"]
    assert lookup.schema["type"] == "function"
    assert fn["name"] == "lookup" and fn["description"] == "Look a key up in the table."
    props = fn["parameters"]["properties"]
    assert props["key"] == {"type": "string", "description": "The key to look up."}
    assert props["limit"]["type"] == "integer" and props["exact"]["type"] == "boolean"
    assert props["tags"] == {"type": "array", "items": {"type": "string"}, "nullable": True,
                             "description": "Only rows with these tags."}
    assert fn["parameters"]["required"] == ["key"]


def test_tool_name_override_and_registry():
    def ping(host: str) -> str:
        """Ping a host.

        Args:
            host: Host name.
        """
        return "pong"

    t = tool(ping, name="net_ping")
    assert t.name == "net_ping" and t.schema["function"]["name"] == "net_ping"
    try:
        assert register_tool(t) is t and get_tool("net_ping") is t
        assert register_tool(t) is t  # re-registering the same tool is fine
        with pytest.raises(ValueError, match="already registered"):
            register_tool(tool(ping, name="net_ping"))
        with pytest.raises(KeyError, match="net_ping"):  # the message lists the known names
            get_tool("net_pong")
    finally:
        TOOLS.pop("net_ping", None)


def test_run_tool_ok_returns_text_and_info():
    r = run_tool(lookup, {"key": "a", "limit": 2, "tags": None})
    assert (r.text, r.info, r.error, r.truncated, r.timed_out) == ("a:2", {"rows": 2}, None, False, False)


@pytest.mark.parametrize(
    "args, message",
    [
        ({"key": "a", "limit": "2"}, "argument 'limit' must be integer, got string"),
        ({"key": "a", "limit": True}, "argument 'limit' must be integer, got boolean"),
        ({"key": "a", "tags": ["x", 1]}, "argument 'tags' item 1 must be string, got integer"),
        ({"limit": 2}, "missing required argument 'key'"),
        ({"key": "a", "colour": "red"}, "unknown argument 'colour' (expected: key, limit, exact, tags)"),
        (["a"], "arguments must be a JSON object, got array"),
    ],
)
def test_run_tool_rejects_bad_arguments(args, message):
    r = run_tool(lookup, args)
    assert r.error == f"invalid arguments for tool 'lookup': {message}"
    assert r.text == f"Error: {r.error}"


def test_run_tool_catches_exceptions():
    r = run_tool(lookup, {"key": "boom"})
    assert r.error == "tool 'lookup' raised ValueError: no such table"
    assert not r.timed_out


def test_run_tool_times_out_a_hanging_tool():
    hang = tool(lookup.fn, name="slow", timeout_s=0.2)
    start = time.perf_counter()
    r = run_tool(hang, {"key": "hang"})
    assert time.perf_counter() - start < 30  # not the tool's 60 s
    assert r.timed_out and r.error == "tool 'slow' timed out after 0.2 s"


def test_run_tool_truncates_floods_with_a_marker():
    r = run_tool(lookup, {"key": "flood"})
    assert r.truncated and r.error is None
    assert r.text == "x" * 50 + "… [truncated 1234 chars]"


def test_run_tool_coerces_output_to_text():
    def count(n: int, raw: bool = False) -> int:
        """Count.

        Args:
            n: A number.
            raw: Return bytes.
        """
        return b"caf\xc3\xa9 \xff" if raw else n

    assert run_tool(tool(count), {"n": 1}).text == "1"
    r = run_tool(tool(count), {"n": 1, "raw": True})
    assert (r.text, r.error) == ("café \ufffd", None)  # decoded, not "b'caf\\xc3...'"


@tool(timeout_s=1.0, max_output_chars=80)
def misbehave(how: str) -> str:
    """Misbehave.

    Args:
        how: What to do.
    """
    import os
    import re

    if how == "regex":  # catastrophic backtracking: C code that holds the GIL for minutes
        return str(re.match(r"(a+)+$", "a" * 28 + "b"))
    if how == "exit":
        os._exit(3)
    if how == "unprintable":
        class Unprintable(Exception):
            def __str__(self):
                raise RuntimeError("no")

        raise Unprintable()
    if how == "unpicklable":
        return ToolOutput("x", {"f": lambda: 1})
    if how == "badinfo":
        return ToolOutput("x", ["titles"])
    if how == "surrogate":
        return "a\ud800b"
    return ToolOutput(b"\xff" * 200)


def test_a_tool_that_holds_the_gil_is_killed_at_its_timeout():
    start = time.perf_counter()
    r = run_tool(misbehave, {"how": "regex"})
    assert time.perf_counter() - start < 30  # not the regex's minutes
    assert r.timed_out and r.error == "tool 'misbehave' timed out after 1 s"


@pytest.mark.parametrize("how, error", [
    ("exit", "tool 'misbehave' exited (code 3) without a result"),
    ("unprintable", "tool 'misbehave' raised Unprintable: (its message could not be read)"),
    ("unpicklable", "tool 'misbehave' returned a result that cannot be sent back: "),
    ("badinfo", "tool 'misbehave' returned info of type list, expected a dict"),
])
def test_a_misbehaving_tool_gives_an_error_result(how, error):
    r = run_tool(misbehave, {"how": how})
    assert r.error.startswith(error) and r.text == f"Error: {r.error}" and not r.timed_out


def test_tool_text_is_valid_utf8_and_capped():
    assert run_tool(misbehave, {"how": "surrogate"}).text == "a?b"
    r = run_tool(misbehave, {"how": "bytes"})
    assert r.truncated and r.text == "\ufffd" * 80 + "… [truncated 120 chars]"


def test_thread_safe_tools_run_in_this_process_and_others_in_a_worker():
    import os

    def pid() -> str:
        """The process id."""
        return str(os.getpid())

    assert run_tool(tool(pid, thread_safe=True), {}).text == str(os.getpid())
    assert run_tool(tool(pid), {}).text != str(os.getpid())


CORPUS = pd.DataFrame(
    {
        "doc_id": [10, 11, 12, 13],
        "title": ["Eiffel Tower", "Louvre", "Berlin Wall", "Danube"],
        "text": [
            "A wrought-iron lattice tower in Paris, designed by Gustave Eiffel's company.",
            "The world's most-visited art museum, in Paris.",
            "A guarded concrete barrier that divided Berlin from 1961 to 1989.",
            "The second-longest river in Europe, flowing through Vienna and Budapest.",
        ],
    }
)


@pytest.fixture(scope="module")
def index():
    return SearchIndex(CORPUS)


def test_search_finds_the_titled_document(index):
    hits = index.search("Berlin Wall", k=2)
    assert hits[0]["title"] == "Berlin Wall" and hits[0]["doc_id"] == 12 and hits[0]["score"] > 0
    assert set(hits[0]) == {"doc_id", "title", "text", "score"}
    assert [h["title"] for h in index.search("river through Vienna", k=3)] == ["Danube"]  # score-0 docs dropped
    assert index.search("the of and", k=3) == []  # stop words only


def test_recall_at_k(index):
    queries = ["Eiffel tower Paris", "Danube river", "Louvre museum", "Berlin"]
    gold = [["Eiffel Tower"], ["Danube", "Berlin Wall"], ["Louvre"], ["Berlin Wall"]]
    # recalls at k=1: 1, 1/2, 1, 1 -> mean 0.875
    assert index.recall_at_k(queries, gold, k=1) == pytest.approx(0.875)
    assert index.recall_at_k(["Louvre"], [["Danube", "Louvre"]], k=4) == pytest.approx(0.5)


def test_search_tool_formats_passages_and_info(index):
    search = make_search_tool(index, top_k=2)
    assert search.name == "search" and search.parameters["required"] == ["query"]
    r = run_tool(search, {"query": "art museum Paris"})
    assert r.error is None
    assert r.text.startswith("(1) Louvre: The world's most-visited art museum, in Paris.\n(2) Eiffel Tower: ")
    assert r.info == {"titles": ["Louvre", "Eiffel Tower"], "doc_ids": [11, 10]}
    empty = run_tool(search, {"query": ""})
    assert empty.error is None and empty.text.startswith("No results") and empty.info["titles"] == []


@pytest.mark.parametrize("preset", [None, "cuda"])
def test_search_keeps_jax_on_the_cpu_unless_the_user_chose(preset):
    """bm25s runs a JAX op at import; on a GPU machine JAX would then take 75% of its memory."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    if preset:
        env["JAX_PLATFORMS"] = preset
    code = "import os, agent_r1.tools.search; print(os.environ.get('JAX_PLATFORMS'))"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == (preset or "cpu")
