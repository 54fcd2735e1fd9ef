"""The `code` task: generated problems, the CodeEnv, the no_tool baseline, and environments
stepped side by side when their tools are thread-safe."""

import subprocess
import sys
import time

import pytest

from agent_r1.context import ContextManager
from agent_r1.data.code_tasks import KINDS, CodeTaskConfig, generate_code_tasks
from agent_r1.envs import CodeEnv, ToolEnv, no_tool_env
from agent_r1.models import train_tokenizer
from agent_r1.rollout import SamplingParams, ScriptedEngine, run_episodes
from agent_r1.tools import Tool, ToolOutput, tool


def test_splits_are_seeded_disjoint_and_cover_every_kind():
    cfg = CodeTaskConfig(seed=3, n_train=30, n_test=6)
    a, b = generate_code_tasks(cfg), generate_code_tasks(cfg)
    assert a == b  # seeded
    assert generate_code_tasks(CodeTaskConfig(seed=4, n_train=30, n_test=6)) != a
    assert {r["qtype"] for r in a["test"]} == set(KINDS)
    assert len(a["train"]) == 30 * len(KINDS) and len(a["test"]) == 6 * len(KINDS)
    assert not {r["question"] for r in a["train"]} & {r["question"] for r in a["test"]}
    assert len({r["id"] for r in a["train"] + a["test"]}) == 36 * len(KINDS)
    assert len(generate_code_tasks(CodeTaskConfig(n_train=200, n_test=20))["train"]) == 200 * len(KINDS)  # `code`'s size


def test_each_reference_program_prints_its_gold_answer():
    rows = generate_code_tasks(CodeTaskConfig(seed=1, n_train=1, n_test=2))["test"]
    for row in rows:
        out = subprocess.run([sys.executable, "-I", "-S", "-c", row["code"]], capture_output=True, text=True, timeout=30)
        assert out.stdout.strip() == row["answers"][0], row
    assert max(len(r["answers"][0]) for r in rows if r["qtype"] == "arithmetic") >= 6  # not a head sum


def test_test_problems_beyond_the_training_ranges_leave_train_and_val_as_they_are():
    import re

    cfg = CodeTaskConfig(seed=2, n_train=40, n_test=3, n_val=2)
    plain, beyond = generate_code_tasks(cfg), generate_code_tasks(CodeTaskConfig(**{**cfg.__dict__, "test_range": "beyond"}))
    assert beyond["train"] == plain["train"] and beyond["val"] == plain["val"]
    assert len(beyond["test"]) == 3 * len(KINDS) and not {r["question"] for r in beyond["test"]} & {
        r["question"] for r in plain["test"] + plain["train"]}
    top = lambda row: max(int(n) for n in re.findall(r"\d+", row["question"]))  # noqa: E731
    for kind in KINDS:  # every kind's largest number is past every training problem's
        assert min(top(r) for r in beyond["test"] if r["qtype"] == kind) > max(
            top(r) for r in plain["train"] + plain["test"] if r["qtype"] == kind), kind
    for row in beyond["test"][::3]:  # one of each kind: the program still prints the answer
        out = subprocess.run([sys.executable, "-I", "-S", "-c", row["code"]], capture_output=True, text=True, timeout=60)
        assert out.stdout.strip() == row["answers"][0], row
    from agent_r1.config import ConfigError, load_config, parse_overrides

    with pytest.raises(ConfigError, match="data.test_range: beyond draws the code task's test problems; data.source synthetic"):
        load_config("tiny", "pipelines.yaml", parse_overrides(["data.test_range=beyond"]))
    assert load_config("code-tiny", "pipelines.yaml", parse_overrides(["data.test_range=beyond"])).data.test_range == "beyond"


def test_too_many_problems_for_a_kind_is_one_clear_error():
    with pytest.raises(ValueError, match="only .* distinct problems"):
        generate_code_tasks(CodeTaskConfig(n_train=10_000, n_test=1, kinds=("fibonacci",)))
    with pytest.raises(ValueError, match=r"kinds \['nope'\] are unknown"):
        generate_code_tasks(CodeTaskConfig(kinds=("nope",)))


@tool(thread_safe=True)
def python(code: str) -> ToolOutput:
    """Run a program (this test's stand-in: the real one is sandboxed).

    Args:
        code: The program.
    """
    out = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, timeout=30)
    return ToolOutput(out.stdout + out.stderr, {"exit_code": out.returncode})


def _run(env_cls, turns: list, tasks: list[dict], tools=(python,)):
    tok = train_tokenizer([t["question"] for t in tasks] + turns, vocab_size=400)
    make_env = lambda: env_cls.from_config(list(tools), _EnvCfg())  # noqa: E731
    return run_episodes(ScriptedEngine(tok, [[t] * len(tasks) if isinstance(t, str) else t for t in turns]),
                        make_env, tasks, ContextManager(tok), SamplingParams(max_new_tokens=200))


class _EnvCfg:
    max_turns, max_context_tokens, format_penalty, system_prompt, kwargs = 3, None, 0.0, "default", {}
    max_format_errors = None


def test_the_oracle_solves_the_task_and_a_wrong_number_scores_zero():
    task = generate_code_tasks(CodeTaskConfig(seed=2, n_train=1, n_test=1, kinds=("prime_sum",)))["test"][0]
    oracle = CodeEnv([python]).oracle_turns(task)
    (good,) = _run(CodeEnv, oracle, [task])
    assert good.steps[0].observation[0]["content"].strip() == task["answers"][0]
    assert good.final_reward == 1.0 and good.metrics["em"] == 1.0 and good.metrics["code_runs"] == 1
    (bad,) = _run(CodeEnv, ['<tool_call>{"name": "python", "arguments": {"code": "1/0"}}</tool_call>',
                            "<answer>12</answer>"], [task])
    assert bad.final_reward == 0.0 and bad.metrics["code_failures"] == 1 and bad.metrics["answered"] == 1.0
    (none,) = _run(CodeEnv, ["I think it is 12."] * 3, [task])
    assert none.final_reward == -1.0 and none.metrics["answered"] == 0.0


def test_the_no_tool_baseline_answers_in_one_turn_without_tools():
    task = generate_code_tasks(CodeTaskConfig(seed=2, n_train=1, n_test=1, kinds=("fibonacci",)))["test"][0]
    env = no_tool_env(CodeEnv).from_config([python], _EnvCfg())
    assert env.tools == {} and env.max_turns == 1 and "<answer>" in env.reset(task)[0]["content"]
    (t,) = _run(no_tool_env(CodeEnv), [f"{task['answers'][0]}\nbecause"], [task])
    assert t.answer == task["answers"][0] and t.metrics["em"] == 1.0 and len(t.steps) == 1  # first line
    (t,) = _run(no_tool_env(CodeEnv), [f"<answer>{task['answers'][0]}</answer>"], [task])
    assert t.final_reward == 1.0


def test_the_no_tool_baseline_works_for_an_env_built_around_its_tool(corpus, tasks):
    """MultiHopQAEnv needs its search tool to be built; its no_tool variant is built that way
    and then has none."""
    from agent_r1.config import load_config
    from agent_r1.envs import MultiHopQAEnv
    from agent_r1.tools import SearchIndex, make_search_tool

    env = no_tool_env(MultiHopQAEnv).from_config([make_search_tool(SearchIndex(corpus))], load_config("tiny").env)
    assert env.tools == {} and env.max_turns == 1
    task = tasks[0]
    assert env.reset(task)[0]["content"] == "Give only the final answer as <answer>...</answer>."
    step = env.step(f"<answer>{task['answers'][0]}</answer>")
    assert step.done and step.info.metrics["em"] == 1.0


def _probe(thread_safe: bool, log) -> Tool:
    def wait(seconds: float) -> str:
        """Wait, and log when (from a thread or a forked worker alike).

        Args:
            seconds: How long.
        """
        begin = time.monotonic()
        time.sleep(seconds)
        with open(log, "a") as f:
            f.write(f"{begin} {time.monotonic()}\n")
        return "done"

    return tool(wait, thread_safe=thread_safe)


@pytest.mark.parametrize("thread_safe", [True, False])
def test_episodes_call_thread_safe_tools_side_by_side(thread_safe, tmp_path):
    log = tmp_path / "calls"
    tasks = [{"id": str(i), "question": "wait"} for i in range(6)]
    turns = ['<tool_call>{"name": "wait", "arguments": {"seconds": 0.2}}</tool_call>', "<answer>x</answer>"]
    trajs = _run(ToolEnv, turns, tasks, tools=[_probe(thread_safe, log)])
    assert all(t.steps[0].observation[0]["content"] == "done" and t.answer == "x" for t in trajs)
    calls = sorted(tuple(map(float, line.split())) for line in log.read_text().splitlines())
    overlaps = sum(b[0] < a[1] for a, b in zip(calls, calls[1:]))
    # a thread-safe tool's calls overlap; a tool run in a forked worker (not declared thread-safe)
    # runs one call at a time
    assert len(calls) == 6 and (overlaps > 0 if thread_safe else overlaps == 0)


def test_the_sandbox_bench_runs(tmp_path):
    """bench/sandbox.py at its smallest (its numbers are for the README, not asserted)."""
    from pathlib import Path

    bench = Path(__file__).resolve().parents[1] / "bench" / "sandbox.py"
    out = subprocess.run([sys.executable, str(bench), "--calls", "2", "--burst", "4", "--concurrency", "2"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "ratio" in out.stdout and "calls/s" in out.stdout


def test_a_tool_the_machine_cannot_start_is_one_line_from_the_cli(tmp_path):
    from typer.testing import CliRunner

    from agent_r1.cli import app

    (tmp_path / "p.yaml").write_text(
        "pipelines:\n  s:\n    extends: agent-r1:code-tiny\n    env: {tools: [{name: python, bwrap: /nonexistent/bwrap}]}\n"
        "  m:\n    extends: agent-r1:code-tiny\n    env: {tools: [python, {name: mcp, command: no-such-server-xyz}]}\n")
    for name, message in (("s", "python tool: the sandbox layer is missing: bubblewrap not found at '/nonexistent/bwrap'"),
                          ("m", "mcp server `no-such-server-xyz`: command 'no-such-server-xyz' not found")):
        r = CliRunner().invoke(app, ["train", "--config", str(tmp_path / "p.yaml"), "-p", name, "--no-track",
                                     "-s", f"output_dir={tmp_path / name}"])
        assert r.exit_code == 1 and message in r.output and "Traceback" not in r.output, r.output
