"""Parsers that split a model turn into tool calls and a final answer; the format is pluggable."""

from __future__ import annotations

import json
import re
from itertools import accumulate
from dataclasses import dataclass, field
from typing import Protocol

from agent_r1.rewards import extract_answer


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict


@dataclass(frozen=True)
class ParsedTurn:
    """What a turn asks for. `errors` are format problems; a turn with errors must not be acted on
    as if it were well formed (the env runs none of its calls and does not end on its answer)."""

    tool_calls: list[ToolCall] = field(default_factory=list)
    answer: str | None = None
    errors: list[str] = field(default_factory=list)


class ToolCallParser(Protocol):
    def parse(self, text: str) -> ParsedTurn: ...


class HermesParser:
    """Hermes / Qwen format: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (any
    number per turn) and ``<answer>...</answer>`` (the last one counts) for the final answer.

    Errors: invalid JSON (also JSON nested deeper than ``MAX_JSON_DEPTH`` and numbers Python
    refuses, such as integers of more than 4300 digits), a call that is not an object or lacks a
    string "name", "arguments" that are not an object (missing arguments mean ``{}``), an
    unclosed ``<tool_call>`` or ``<answer>``, both tool calls and an answer in one turn, and
    neither.
    """

    _CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)

    def parse(self, text: str) -> ParsedTurn:
        calls, errors = [], []
        for body in self._CALL.findall(text):
            obj, problem = _load_json(body)
            if problem is not None:
                errors.append(f"invalid JSON in <tool_call>: {problem}")
                continue
            if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
                errors.append('a tool call must be a JSON object with a string "name"')
                continue
            arguments = obj.get("arguments", {})
            if not isinstance(arguments, dict):
                errors.append(f'"arguments" of tool \'{obj["name"]}\' must be a JSON object')
                continue
            calls.append(ToolCall(obj["name"], arguments))
        if "<tool_call>" in self._CALL.sub("", text):
            errors.append("unclosed <tool_call> (missing </tool_call>)")

        answer = extract_answer(text)
        if answer is None and "<answer>" in text:
            errors.append("unclosed <answer> (missing </answer>)")
        has_call = bool(calls) or "<tool_call>" in text
        if answer is not None and has_call:
            errors.append("both a tool call and an answer in one turn; do one or the other")
        if answer is None and not has_call and not errors:
            errors.append(
                'no tool call or answer found; call a tool with <tool_call>{"name": ..., "arguments": {...}}'
                "</tool_call> or answer with <answer>...</answer>"
            )
        return ParsedTurn(tool_calls=calls, answer=answer, errors=errors)


MAX_JSON_DEPTH = 32  # deepest nesting of a tool call's JSON; more is an error, not a RecursionError


_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_NESTING = {"[": 1, "{": 1, "]": -1, "}": -1}


def _depth(body: str) -> int:
    """How deep ``[``/``{`` nest in `body` outside JSON strings (0 when there are few)."""
    if body.count("[") + body.count("{") <= MAX_JSON_DEPTH:
        return 0
    brackets = _NOT_BRACKET.sub("", _JSON_STRING.sub("", body))
    return max(accumulate(map(_NESTING.__getitem__, brackets)), default=0)


def _load_json(body: str) -> tuple[object, str | None]:
    """The JSON value of a <tool_call> body, or None and why it is not acceptable."""
    if _depth(body) > MAX_JSON_DEPTH:
        return None, f"nested deeper than {MAX_JSON_DEPTH} levels"
    try:
        return json.loads(body, strict=False), None  # strict=False: allow raw newlines in strings
    except json.JSONDecodeError as e:
        return None, f"{e.msg} (line {e.lineno} column {e.colno})"
    except (ValueError, RecursionError) as e:  # e.g. an integer of more than 4300 digits
        return None, str(e)[:200]


PARSERS: dict[str, type] = {"hermes": HermesParser}


def get_parser(name: str) -> ToolCallParser:
    """A new parser of the registered format `name`."""
    try:
        return PARSERS[name]()
    except KeyError:
        raise KeyError(f"unknown tool-call format '{name}'; known formats: {sorted(PARSERS)}") from None
