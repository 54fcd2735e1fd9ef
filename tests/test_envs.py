import json
import threading

import pandas as pd
import pytest

from agent_r1.envs import ENVS, HermesParser, MultiHopQAEnv, ToolEnv, get_parser
from agent_r1.envs.parsers import ToolCall
from agent_r1.tools import SearchIndex, ToolOutput, make_search_tool, tool

CORPUS = pd.DataFrame(
    {
        "doc_id": [0, 1, 2, 3],
        "title": ["Mona Lisa", "Louvre", "Danube", "Berlin Wall"],
        "text": [
            "A portrait by Leonardo da Vinci, kept at the Louvre.",
            "The Louvre is an art museum in Paris.",
            "A river flowing through Vienna and Budapest.",
            "A barrier that divided Berlin from 1961 to 1989.",
        ],
    }
)
TASK = {
    "question": "In which city is the museum that keeps the Mona Lisa?",
    "answers": ["Paris"],
    "gold_titles": ["Mona Lisa", "Louvre"],
}


@pytest.fixture(scope="module")
def search():
    return make_search_tool(SearchIndex(CORPUS), top_k=1)


def call(name, **arguments):
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def test_malformed_turns_never_crash_the_episode(search):
    release, hang_ended = threading.Event(), threading.Event()

    @tool(name="search", timeout_s=0.2, max_output_chars=40)
    def flaky_search(query: str) -> ToolOutput:
        """Search, except that "boom" raises and "hang" hangs.

        Args:
            query: The query.
        """
        if query == "boom":
            raise RuntimeError("index offline")
        if query == "hang":  # until the test releases it: the step must not wait for it
            release.wait(60)
            hang_ended.set()
        return search.fn(query)

    env = MultiHopQAEnv(flaky_search, max_turns=10, retrieval_bonus=0.5, format_penalty=-0.1)
    env.reset(TASK)
    turns = [
        ('<tool_call>{"name": "search", "arguments": {"query": }</tool_call>', "Error: invalid JSON in <tool_call>"),
        (call("serch", query="Louvre"), "Error: unknown tool 'serch'. Available tools: search"),
        (call("search", q="Louvre"), "Error: invalid arguments for tool 'search': unknown argument 'q'"),
        (call("search", query="boom"), "Error: tool 'search' raised RuntimeError: index offline"),
        (call("search", query="hang"), "Error: tool 'search' timed out after 0.2 s"),
        (call("search", query="Mona Lisa portrait"), "(1) Mona Lisa: A portrait by Leonardo"),
    ]
    rewards = []
    for text, expected in turns:
        res = env.step(text)
        assert not res.done
        assert len(res.observation) == 1 and res.observation[0]["role"] == "tool"
        assert res.observation[0]["content"].startswith(expected)
        rewards.append(res.reward)
    assert not hang_ended.is_set()  # the hanging call's step returned at its timeout
    release.set()
    assert res.info.truncated == 1 and res.observation[0]["content"].endswith("chars]")
    assert rewards == [-0.1, -0.1, -0.1, 0.0, 0.0, 0.5]

    end = env.step("<answer>Paris</answer>")
    assert end.done and end.observation == [] and end.info.stop_reason == "answer"
    assert end.info.final_reward == 1.0 and end.info.metrics["em"] == 1.0 and end.info.metrics["found_gold"] == 1
    assert env.metrics == {"turns": 7, "tool_calls": 3, "format_errors": 3, "tool_errors": 2,
                           "timeouts": 1, "truncated_tool_outputs": 1}
    with pytest.raises(RuntimeError, match="finished episode"):
        env.step("<answer>Paris</answer>")
    env.reset(TASK)
    assert set(env.metrics.values()) == {0}


def test_step_info_flags(search):
    env = ToolEnv([search])
    env.reset({"prompt": "hi"})
    info = env.step(call("search", query=7)).info
    assert info.format_error and info.tool_calls == [{"name": "search", "arguments": {"query": 7}}]
    assert info.errors == ["invalid arguments for tool 'search': argument 'query' must be string, got integer"]
    assert (info.answer, info.tool_errors, info.timed_out, info.truncated) == (None, 0, 0, 0)


@pytest.mark.parametrize(
    "text, error",
    [
        (call("search", query="x") + "<answer>Paris</answer>", "both a tool call and an answer"),
        ("Let me think.", "no tool call or answer found"),
        ('<tool_call>{"name": "search", "arguments": {"query": "x"}}', "unclosed <tool_call>"),
        ("<answer>Paris", "unclosed <answer>"),
        ('<tool_call>{"arguments": {}}</tool_call>', 'string "name"'),
        ('<tool_call>{"name": "search", "arguments": "x"}</tool_call>', '"arguments" of tool \'search\''),
    ],
)
def test_format_errors_do_not_end_the_episode(search, text, error):
    env = MultiHopQAEnv(search, format_penalty=-0.5)
    env.reset(TASK)
    res = env.step(text)
    assert not res.done and res.info.format_error and res.reward == -0.5
    assert error in res.observation[0]["content"] and env.metrics["tool_calls"] == 0


def test_hermes_parser_accepts_whitespace_and_several_calls():
    text = 'Searching.\n<tool_call>\n{"name": "search",\n "arguments": {"query": "a\nb"}}\n</tool_call>\n<tool_call>{"name": "f"}</tool_call>'
    turn = HermesParser().parse(text)
    assert turn.tool_calls == [ToolCall("search", {"query": "a\nb"}), ToolCall("f", {})]
    assert turn.answer is None and turn.errors == []
    assert HermesParser().parse("<answer> x </answer> <answer>Paris</answer>").answer == "Paris"
    assert isinstance(get_parser("hermes"), HermesParser)
    with pytest.raises(KeyError, match="hermes"):
        get_parser("json")


def test_several_tool_calls_give_several_messages(search):
    env = MultiHopQAEnv(search, max_tool_calls_per_turn=2)
    env.reset(TASK)
    res = env.step(call("search", query="Louvre") + "\n" + call("search", query="Danube"))
    assert [m["name"] for m in res.observation] == ["search", "search"]
    assert res.observation[0]["content"].startswith("(1) Louvre") and "Danube" in res.observation[1]["content"]
    assert not res.info.format_error and env.metrics["tool_calls"] == 2

    res = env.step(call("search", query="a") + call("search", query="b") + call("search", query="c"))
    assert len(res.observation) == 3 and res.info.format_error
    assert res.observation[2]["content"] == "Error: at most 2 tool calls per turn; ignored the last 1"
    assert env.metrics["tool_calls"] == 4


def test_max_turns_ends_the_episode(search):
    env = MultiHopQAEnv(search, max_turns=2)
    env.reset(TASK)
    assert not env.step(call("search", query="Louvre")).done
    res = env.step(call("search", query="Mona Lisa"))
    assert res.done and res.info.stop_reason == "max_turns"
    assert len(res.observation) == 1  # the last turn's calls still run
    assert res.info.final_reward == -1.0 and res.info.metrics["em"] == 0.0 and res.info.metrics["f1"] == 0.0
    assert res.info.answer is None and res.info.metrics["search_recall"] == 1.0


def test_token_budget_ends_the_episode(search):
    env = MultiHopQAEnv(search, max_context_tokens=100, format_penalty=-0.5)
    env.reset(TASK)
    assert not env.step(call("search", query="Louvre"), context_tokens=99).done
    res = env.step("cut off mid-sentence", context_tokens=100)
    assert res.done and res.info.stop_reason == "token_budget" and res.observation == []
    assert res.reward == 0.0 and not res.info.format_error  # a cut-off turn is not judged
    assert res.info.final_reward == -1.0
    env.reset(TASK)  # an answer in the turn that fills the budget still counts
    res = env.step("<answer>Paris</answer>", context_tokens=500)
    assert res.info.stop_reason == "answer" and res.info.final_reward == 1.0


@pytest.mark.parametrize(
    "text, kwargs, reward, em",
    [
        ("<answer>Paris</answer>", {}, 1.0, 1.0),
        ("It is <answer> paris. </answer>", {}, 1.0, 1.0),
        ("<answer>Lyon</answer>", {}, 0.0, 0.0),
        ("<answer>Lyon</answer><answer>Paris</answer>", {}, -1.0, 1.0),  # two answers: ill-formed
        ("<answer>Lyon</answer><answer>Paris</answer>", {"format_score": 0.2}, -0.8, 1.0),
        ("<answer>Paris France</answer>", {"answer_metric": "f1"}, 2 / 3, 0.0),
        ("<answer>Paris France</answer>", {"reward_scheme": "answer_plus_format"}, 0.1, 0.0),
    ],
)
def test_qa_final_reward(search, text, kwargs, reward, em):
    env = MultiHopQAEnv(search, **kwargs)
    env.reset(TASK)
    res = env.step(text)
    assert res.done and res.info.final_reward == pytest.approx(reward) and res.info.metrics["em"] == em


def test_retrieval_bonus_once_per_gold_document(search):
    env = MultiHopQAEnv(search, retrieval_bonus=0.25)
    env.reset(TASK)
    assert env.step(call("search", query="Louvre museum")).reward == 0.25
    assert env.step(call("search", query="Louvre museum")).reward == 0.0  # already found
    assert env.step(call("search", query="Danube") + call("search", query="Mona Lisa")).reward == 0.25
    end = env.step("<answer>Paris</answer>")
    assert end.info.metrics["found_gold"] == 2 and end.info.metrics["search_recall"] == 1.0
    env.reset(TASK)  # a new episode finds them afresh
    assert env.step(call("search", query="Louvre museum")).reward == 0.25


def test_reset_builds_the_prompt(search):
    messages = MultiHopQAEnv(search).reset(TASK)
    assert [m["role"] for m in messages] == ["system", "user"] and messages[1]["content"] == TASK["question"]
    assert len(messages[0]["content"].split()) <= 40
    assert ToolEnv([search]).reset({"prompt": "Hi"}) == [{"role": "user", "content": "Hi"}]
    assert ToolEnv([search]).tool_schemas == [search.schema]
    assert ENVS["multihop_qa"] is MultiHopQAEnv


# ------------------------------------------------------------------------------ hostile turns
class Unprintable(Exception):
    def __str__(self):
        raise RuntimeError("no message for you")


@tool(name="search", timeout_s=2.0, max_output_chars=100, thread_safe=True)
def hostile_search(query: str) -> ToolOutput:
    """A search tool that misbehaves on request: the query's prefix says how.

    Args:
        query: "<how>:<text>".
    """
    how = query.split(":", 1)[0]
    if how == "raise":
        raise ValueError(query)
    if how == "unprintable":
        raise Unprintable()
    if how == "bytes":
        return query.encode("utf-8", "surrogatepass") + b"\xff\xfe"
    if how == "number":
        return 42
    if how == "badinfo":
        return ToolOutput("x", [1, 2])  # info must be a dict
    if how == "badtitles":
        return ToolOutput("x", {"titles": [[1]]})  # the retrieval reward cannot hash a list
    if how == "huge":
        return "y" * 100_000
    return ToolOutput(query, {"titles": [query[-8:]]})  # echoes the query, lone surrogates included


RUNS = ("ok", "bytes", "number", "huge", "badtitles")  # calls that run without a tool error
FAILS = ("raise", "unprintable", "badinfo")  # calls that run and fail
BAD_CALLS = ("unknown", "wrong_args", "wrong_type")  # calls the env refuses (format error)
BAD_JSON = ("deep", "deep_in_string_ok", "huge_int", "broken", "not_object")  # the whole turn is refused


def _junk(rng, n):
    alphabet = "ab <>{}[]\":,\\/\n\t\x00é漢😀\ufffd" + "\ud800"
    return "".join(rng.choices(alphabet, k=n))


def _call_text(rng, kind):
    """One <tool_call> of `kind`; "deep_in_string_ok" is a valid call whose query holds brackets."""
    query = f"{kind}:{_junk(rng, rng.randrange(12))}"
    if kind == "unknown":
        return call("x" * rng.choice([3, 300] * 50 + [300_000]), query=query)
    if kind == "wrong_args":
        return call("search", q=query)
    if kind == "wrong_type":
        return call("search", query=rng.choice([5, None, ["a"], {"a": 1}, 1e308 * 10]))
    if kind == "deep":
        depth = rng.choice([40, 1000] * 50 + [100_000])
        return '<tool_call>{"name": "search", "arguments": {"query": ' + "[" * depth + "]" * depth + "}}</tool_call>"
    if kind == "deep_in_string_ok":
        return call("search", query="ok:" + "[{" * 600)
    if kind == "huge_int":
        return '<tool_call>{"name": "search", "arguments": {"query": ' + "9" * 5000 + "}}</tool_call>"
    if kind == "broken":
        return '<tool_call>{"name": "search", "arguments": {"query": </tool_call>'
    if kind == "not_object":
        return "<tool_call>[1, 2]</tool_call>"
    return call("search", query=query)


def _hostile_turn(rng):
    """A random turn and what it must do: (text, format_error, calls run, tool errors, answers)."""
    roll = rng.random()
    if roll < 0.08:
        return f"<answer>{_junk(rng, 5)}</answer>", False, 0, 0, True
    if roll < 0.16:
        text = _junk(rng, rng.choice([0, 10, 200_000 if rng.random() < 0.05 else 50]))
        text = text.replace("<", "(")  # no tags at all: neither a call nor an answer
        return text, True, 0, 0, False
    if roll < 0.2:
        return '<tool_call>{"name": "search"', True, 0, 0, False  # unclosed
    kinds = [rng.choice(RUNS + FAILS + BAD_CALLS + BAD_JSON + RUNS) for _ in range(rng.choice([1, 1, 2, 3]))]
    text = "".join(_call_text(rng, k) for k in kinds)
    if any(k in BAD_JSON and k != "deep_in_string_ok" for k in kinds):
        return text, True, 0, 0, False
    considered = kinds[:2]  # max_tool_calls_per_turn
    ran = [k for k in considered if k not in BAD_CALLS]
    errors = sum(k in FAILS for k in ran) + ("badtitles" in ran)  # a failed step reward: one per turn
    return text, len(kinds) > 2 or len(ran) < len(considered), len(ran), errors, False


def test_seeded_fuzz_of_hostile_turns_never_escapes_step_and_is_counted_exactly():
    import random

    rng = random.Random(1234)
    env = MultiHopQAEnv(hostile_search, max_turns=5, max_tool_calls_per_turn=2, retrieval_bonus=0.1)
    env.reset(TASK)
    expected = dict.fromkeys(("turns", "tool_calls", "format_errors", "tool_errors"), 0)
    episodes = 0
    for _ in range(10_000):
        text, format_error, ran, tool_errors, answers = _hostile_turn(rng)
        res = env.step(text)  # must not raise
        for key, n in zip(expected, (1, ran, format_error, tool_errors)):
            expected[key] += n
        for m in res.observation:
            assert set(m) == {"role", "name", "content"} and m["role"] == "tool"
            assert len(m["content"]) <= 600 and len(m["name"]) <= 100
            m["content"].encode("utf-8"), m["name"].encode("utf-8")  # valid UTF-8: the tokenizer takes it
        assert res.done == (answers or expected["turns"] == env.max_turns)
        assert {k: env.metrics[k] for k in expected} == expected, text[:300]
        assert env.metrics["timeouts"] == 0
        if res.done:
            episodes += 1
            env.reset(TASK)
            expected = dict.fromkeys(expected, 0)
    assert episodes > 1000


def test_model_chosen_names_and_messages_are_capped_in_observations(search):
    env = MultiHopQAEnv(search, max_turns=10)
    env.reset(TASK)
    res = env.step(call("x" * 300_000, query="a"))
    (message,) = res.observation
    assert res.info.format_error and len(message["name"]) < 100 and len(message["content"]) < 600
    assert message["content"].startswith("Error: unknown tool 'xxx") and "[truncated" in message["content"]
    res = env.step(call("search", **{"k" * 10_000: 1}))
    assert len(res.observation[0]["content"]) < 600


@pytest.mark.parametrize("body, problem", [
    ("[" * 1000 + "]" * 1000, "nested deeper than 32 levels"),
    ('{"name": "search", "arguments": {"query": ' + "1" * 5000 + "}}", "integer string conversion"),
])
def test_pathological_json_is_a_format_error(search, body, problem):
    env = MultiHopQAEnv(search)
    env.reset(TASK)
    res = env.step(f"<tool_call>{body}</tool_call>")
    assert not res.done and res.info.format_error and problem in res.observation[0]["content"]


def test_a_tool_result_that_cannot_be_scored_is_a_tool_error_and_the_episode_goes_on():
    env = MultiHopQAEnv(hostile_search, retrieval_bonus=0.5)
    env.reset(TASK)
    res = env.step(call("search", query="badtitles:x"))
    assert not res.done and res.reward == 0.0 and res.info.tool_errors == 1 and not res.info.format_error
    assert res.observation[-1]["content"].startswith("Error: the tool results could not be scored: TypeError")
    res = env.step(call("search", query="unprintable:x"))
    assert res.observation[0]["content"] == "Error: tool 'search' raised Unprintable: (its message could not be read)"
    assert env.metrics["tool_errors"] == 2 and env.metrics["tool_calls"] == 2


def test_a_parser_that_raises_gives_a_format_error(search):
    class Fragile:
        def parse(self, text):
            raise RecursionError("too deep")

    env = ToolEnv([search], parser=Fragile())
    env.reset({"prompt": "hi"})
    res = env.step("anything")
    assert res.info.format_error and "could not be parsed (RecursionError)" in res.observation[0]["content"]
