"""ToolEnv: parses a model turn into tool calls, runs them, and returns observations and rewards.

One `step` is one model turn. Nothing the model writes and nothing a tool does raises out of
`step` (DESIGN.md, contract 3): a malformed turn or a failing tool becomes a "tool" message that
explains the problem, flagged in `info` and counted in `metrics`, and the episode goes on. That
holds for an exception in the parser (a format error) and in `step_reward` (a tool error: it
scores what the tools returned); observations are always valid UTF-8 text, error messages and
tool names in them are capped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from agent_r1.envs.metrics import Metric, check_metrics
from agent_r1.envs.parsers import ParsedTurn, ToolCall, ToolCallParser, get_parser
from agent_r1.rewards import extract_answer
from agent_r1.tools.base import Tool, ToolResult, _describe, _truncate, as_text, run_tool, validate_arguments


@dataclass
class StepInfo:
    """What one step did, beside its observation and reward."""

    tool_calls: list[dict] = field(default_factory=list)  # {"name", "arguments"} of each call parsed
    answer: str | None = None  # the answer the turn gave, if it gave one
    format_error: bool = False  # a bad call, unknown tool or bad arguments (the format penalty applies)
    tool_errors: int = 0  # calls that failed (raised, timed out, could not be scored)
    timed_out: int = 0  # calls stopped by their timeout
    truncated: int = 0  # tool outputs cut at the tool's max_output_chars
    errors: list[str] = field(default_factory=list)  # every problem, as shown to the model
    # set on the step that ends the episode
    stop_reason: str | None = None  # "answer", "max_turns", "token_budget", "format_errors"
    final_reward: float = 0.0
    metrics: dict[str, float] = field(default_factory=dict)  # final_reward's declared metrics


@dataclass
class EnvStep:
    # chat messages {"role": "tool", "name", "content"}: one per tool call, named after the tool,
    # and one per format problem not tied to a call, named "error"
    observation: list[dict]
    reward: float  # step reward (format penalty + process reward)
    done: bool
    info: StepInfo = field(default_factory=StepInfo)


_MAX_NAME_CHARS, _MAX_ERROR_CHARS = 64, 500  # a tool name / an error message as shown to the model


def _message(name: str, content: str) -> dict:
    """A "tool" chat message, with the (model-chosen) name capped and both made valid UTF-8."""
    return {"role": "tool", "name": as_text(_truncate(name, _MAX_NAME_CHARS)[0]), "content": as_text(content)}


class ToolEnv:
    """A multi-turn tool-use environment.

    A step parses the turn; then:
      - a well-formed answer ends the episode (``stop_reason="answer"``);
      - else, if ``context_tokens >= max_context_tokens``, the episode ends (``"token_budget"``)
        and the turn is neither judged nor run: it was cut off by the budget, and the final
        reward already scores the missing answer;
      - else the turn is judged: parse errors (bad JSON, unclosed tag, call and answer together,
        neither) mean no call of the turn runs; an unknown tool, invalid arguments, or calls
        beyond ``max_tool_calls_per_turn`` fail individually while the other calls run. Any of
        these makes the turn a format error (``format_penalty`` added to its reward);
      - the turn that reaches ``max_turns`` without an answer ends the episode (``"max_turns"``);
      - the rollout loop ends an episode whose last ``max_format_errors`` turns were all format
        errors (``"format_errors"``; :func:`agent_r1.rollout.loop.format_errors_end`), whatever the
        environment; None: no such limit.

    Subclasses declare the fields of their tasks in ``TASK_FIELDS``, build prompts in `reset`
    and rewards in `step_reward` / `final_reward`, declare the metrics ``final_reward`` reports in ``METRICS`` (agent_r1/envs/metrics.py: every one
    reaches the training metrics, the evaluation summary and MLflow), may give oracle turns for
    the SFT cold start in `oracle_turns`, and are built from a config by `from_config`.
    """

    # The counters every episode keeps (``self.metrics``); a subclass declares its own metrics.
    METRICS: ClassVar[dict[str, Metric]] = {
        "turns": Metric("model turns in the episode"),
        "tool_calls": Metric("tool calls run in the episode"),
        "format_errors": Metric("turns with a format error (bad call, unknown tool, bad arguments)"),
        "tool_errors": Metric("tool calls that failed (raised, timed out, could not be scored)"),
        "timeouts": Metric("tool calls stopped by their timeout"),
        "truncated_tool_outputs": Metric("tool outputs cut at the tool's max_output_chars"),
    }
    # The fields every task row must have (checked when the data is prepared, naming the file and
    # line); a row's other fields reach `reset` too, as written. ToolEnv's own `reset` shows the
    # task's ``prompt`` or ``question``.
    TASK_FIELDS: ClassVar[tuple[str, ...]] = ()
    DEFAULT_TOOLS: ClassVar[list[str | dict]] = []  # the tools when the config's env.tools is null
    DEFAULT_SYSTEM_PROMPT: ClassVar[str | None] = None  # env.system_prompt: "default"
    data_dir: Any = None  # the prepared data's folder (make_env_factory sets it): where a task's files are

    @classmethod
    def declared_metrics(cls) -> dict[str, Metric]:
        """``METRICS`` of this class and of its bases (a subclass's declaration wins)."""
        out: dict[str, Metric] = {}
        for klass in reversed(cls.__mro__):
            out |= vars(klass).get("METRICS", {})
        return out

    @classmethod
    def from_config(cls, tools: list[Tool], cfg: Any) -> ToolEnv:
        """The environment for the config's ``env`` section ``cfg`` (agent_r1.config.EnvConfig)
        with ``tools``: the turn limits, the system prompt and ``cfg.kwargs``. A subclass with
        settings of its own overrides this (see MultiHopQAEnv) or takes them from ``kwargs``."""
        return cls(tools, **cls.common_settings(cfg) | cfg.kwargs)

    @classmethod
    def common_settings(cls, cfg: Any) -> dict:
        """The constructor arguments every ToolEnv takes, from the config's ``env`` section
        (``env.kwargs`` may override them)."""
        prompt = cls.DEFAULT_SYSTEM_PROMPT if cfg.system_prompt == "default" else cfg.system_prompt
        return {"max_turns": cfg.max_turns, "max_context_tokens": cfg.max_context_tokens,
                "format_penalty": cfg.format_penalty, "system_prompt": prompt, "max_format_errors": cfg.max_format_errors}

    def __init__(
        self,
        tools: list[Tool],
        parser: str | ToolCallParser = "hermes",
        max_turns: int = 4,
        max_tool_calls_per_turn: int = 2,
        max_context_tokens: int | None = None,
        system_prompt: str | None = None,
        format_penalty: float = 0.0,
        max_format_errors: int | None = None,
    ):
        self.tools = {t.name: t for t in tools}
        self.parser = get_parser(parser) if isinstance(parser, str) else parser
        self.max_turns = max_turns
        self.max_tool_calls_per_turn = max_tool_calls_per_turn
        self.max_context_tokens = max_context_tokens
        self.system_prompt = system_prompt
        self.format_penalty = format_penalty
        self.max_format_errors = max_format_errors  # the rollout loop ends an episode after that many in a row
        self.task: dict = {}
        self.metrics: dict[str, int] = dict.fromkeys(ToolEnv.METRICS, 0)
        self.done = False

    @property
    def tool_schemas(self) -> list[dict]:
        """The tools' function schemas, for ``apply_chat_template(..., tools=...)``."""
        return [t.schema for t in self.tools.values()]

    def reset(self, task: dict) -> list[dict]:
        """Start an episode; returns the initial chat messages (system prompt, if any, and the
        task's ``prompt`` or ``question`` as the user message)."""
        self.task = task
        self.metrics = dict.fromkeys(ToolEnv.METRICS, 0)
        self.done = False
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return system + [{"role": "user", "content": task.get("prompt") or task["question"]}]

    def step(self, action_text: str, context_tokens: int | None = None) -> EnvStep:
        """Apply one model turn (see the class docstring). `context_tokens` is the length of the
        context plus this turn, as counted by the rollout loop."""
        if self.done:
            raise RuntimeError("step() called on a finished episode; call reset() first")
        self.metrics["turns"] += 1
        try:
            parsed = self.parser.parse(action_text)
        except Exception as e:  # noqa: BLE001 - a parser (pluggable) that fails on some text
            parsed = ParsedTurn(errors=[f"the turn could not be parsed ({type(e).__name__})"])
        info = StepInfo(tool_calls=[{"name": c.name, "arguments": c.arguments} for c in parsed.tool_calls])
        if parsed.answer is not None and not parsed.errors:
            info.answer = parsed.answer
            reward, observation = self._step_reward(parsed, [], info)
            self.metrics["tool_errors"] += info.tool_errors
            return self._finish(observation, reward, info, "answer", action_text)
        if None not in (self.max_context_tokens, context_tokens) and context_tokens >= self.max_context_tokens:
            return self._finish([], 0.0, info, "token_budget", action_text)

        observation, results = self._run_turn(parsed, info)
        reward, failed = self._step_reward(parsed, results, info)
        observation += failed
        reward += self.format_penalty if info.format_error else 0.0
        m = self.metrics
        m["tool_calls"] += len(results)
        m["format_errors"] += int(info.format_error)
        m["tool_errors"] += info.tool_errors
        m["timeouts"] += info.timed_out
        m["truncated_tool_outputs"] += info.truncated
        if self.metrics["turns"] >= self.max_turns:
            return self._finish(observation, reward, info, "max_turns", action_text)
        return EnvStep(observation, reward, False, info)

    def _run_turn(
        self, parsed: ParsedTurn, info: StepInfo
    ) -> tuple[list[dict], list[tuple[ToolCall, ToolResult]]]:
        """Run the turn's valid calls; returns the observation and the (call, result) pairs run.
        Records every problem in ``info.errors``, format problems in ``info.format_error``."""

        def error(message: str, name: str = "error") -> dict:
            message = _truncate(message, _MAX_ERROR_CHARS)[0]
            info.errors.append(message)
            info.format_error = True
            return _message(name, f"Error: {message}")

        if parsed.errors:
            return [error(e) for e in parsed.errors], []
        observation, results = [], []
        calls = parsed.tool_calls[: self.max_tool_calls_per_turn]
        for call in calls:
            tool = self.tools.get(call.name)
            if tool is None:
                known = ", ".join(self.tools)
                observation.append(error(f"unknown tool '{call.name}'. Available tools: {known}", call.name))
                continue
            if (problem := validate_arguments(tool.parameters, call.arguments)) is not None:
                observation.append(error(f"invalid arguments for tool '{call.name}': {problem}", call.name))
                continue
            result = run_tool(tool, call.arguments)
            results.append((call, result))
            observation.append(_message(call.name, result.text))
            if result.error is not None:
                info.errors.append(result.error)
                info.tool_errors += 1
            info.timed_out += result.timed_out
            info.truncated += result.truncated
        if len(parsed.tool_calls) > len(calls):
            extra = len(parsed.tool_calls) - len(calls)
            limit = self.max_tool_calls_per_turn
            observation.append(error(f"at most {limit} tool calls per turn; ignored the last {extra}"))
        return observation, results

    def _step_reward(
        self, parsed: ParsedTurn, results: list[tuple[ToolCall, ToolResult]], info: StepInfo
    ) -> tuple[float, list[dict]]:
        """`step_reward` and no message; or, when it fails (say, on malformed ``info`` from a
        tool), 0, a tool error in `info` and an error message for the observation."""
        try:
            return float(self.step_reward(parsed, results)), []
        except Exception as e:  # noqa: BLE001 - what the tools returned could not be scored
            message = f"the tool results could not be scored: {_describe(e, _MAX_ERROR_CHARS)}"
            info.errors.append(message)
            info.tool_errors += 1
            return 0.0, [_message("error", f"Error: {message}")]

    def state_key(self) -> str | None:
        """A key of the state the next step starts from, the same for the same state (the rollout records it on
        each step: ``Step.state_key``); the gigpo estimator compares the steps of a task's episodes that start
        from the same key. None (the default): no state is shared between steps."""
        return None

    def end(self, stop_reason: str) -> EnvStep:
        """End the episode without a turn (the rollout loop's call when the next turn cannot fit, or
        after ``max_format_errors`` format errors in a row)."""
        if self.done:
            raise RuntimeError("end() called on a finished episode")
        return self._finish([], 0.0, StepInfo(), stop_reason, "")

    def _finish(
        self, observation: list[dict], reward: float, info: StepInfo, stop_reason: str, action_text: str
    ) -> EnvStep:
        self.done = True
        info.final_reward, metrics = self.final_reward(info.answer, action_text)
        info.stop_reason, info.metrics = stop_reason, check_metrics(type(self), metrics)
        return EnvStep(observation, reward, True, info)

    def step_reward(self, parsed: ParsedTurn, results: list[tuple[ToolCall, ToolResult]]) -> float:
        """Process reward of a turn from the calls that ran (the format penalty is added apart)."""
        return 0.0

    def final_reward(self, answer: str | None, action_text: str) -> tuple[float, dict[str, float]]:
        """Outcome reward when the episode ends (`answer` is None without one) and the episode's
        values of metrics declared in ``METRICS`` (an undeclared name raises MetricError)."""
        return 0.0, {}

    def oracle_turns(self, task: dict) -> list[str] | None:
        """The assistant turns an oracle would write for `task` (tool calls, then the answer),
        for the SFT cold start: the SFT stage plays them through `step`, so the real tools give
        the observations. None: this environment gives no demonstration for the task."""
        return None


def answer_turn(env: ToolEnv, action_text: str) -> EnvStep:
    """A one-turn episode's step: the turn is the answer, its ``<answer>`` content, else its first
    non-blank line (for a base model never taught the tag)."""
    if env.done:
        raise RuntimeError("step() called on a finished episode; call reset() first")
    env.metrics["turns"] += 1
    answer = extract_answer(action_text)
    if answer is None:
        answer = next((line.strip() for line in action_text.splitlines() if line.strip()), None)
    return env._finish([], 0.0, StepInfo(answer=answer), "answer", action_text)


NO_TOOL_SYSTEM_PROMPT = "Give only the final answer as <answer>...</answer>."


def no_tool_env(env_cls: type[ToolEnv]) -> type[ToolEnv]:
    """The ``no_tool`` baseline's environment: ``env_cls``'s tasks, rewards and metrics, but no
    tool and one turn, which is the answer (:func:`answer_turn`), under a system prompt that
    asks for it."""

    class NoTool(env_cls):
        TOOLS_IN_PROMPT = False

        @classmethod
        def from_config(cls, tools: list[Tool], cfg: Any) -> ToolEnv:
            env = super().from_config(tools, cfg)  # built as the task's env is (it may need a tool to)
            env.tools, env.max_turns, env.system_prompt = {}, 1, NO_TOOL_SYSTEM_PROMPT
            return env

        def step(self, action_text: str, context_tokens: int | None = None) -> EnvStep:
            return answer_turn(self, action_text)

    NoTool.__name__ = NoTool.__qualname__ = f"NoTool{env_cls.__name__}"
    return NoTool
