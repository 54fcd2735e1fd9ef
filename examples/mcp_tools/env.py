"""The mcp_tools environment: convert a time of day between time zones with ``convert_time``, a
tool of the MCP server ``mcp-server-time`` (from PyPI; the config's ``env.tools`` starts it).

The environment does not know the tool is an MCP server's: it sees an agent `Tool` named
``convert_time``, whose schema is the one the server lists. It declares
  - ``TASK_FIELDS``: its task rows' fields (``data/*.jsonl``);
  - ``METRICS``: ``em`` and ``converted`` (the episode asked the server for the question's
    conversion, and got it);
  - ``final_reward``: exact match of the HH:MM answer, -1 for a turn that is not a
    well-formed answer;
  - ``oracle_turns``: the SFT cold start's demonstrations, one call and the answer.
"""

from __future__ import annotations

import json

from agent_r1.envs import Metric, ToolEnv, register_env
from agent_r1.rewards import exact_match, is_well_formed_answer


@register_env("time_zones")
class TimeZonesEnv(ToolEnv):
    """Tasks are rows with ``question``, ``answers`` (HH:MM) and the conversion it asks for:
    ``source_timezone``, ``time`` and ``target_timezone``."""

    TASK_FIELDS = ("question", "answers", "source_timezone", "time", "target_timezone")
    DEFAULT_SYSTEM_PROMPT = (  # env.system_prompt: default (for a pretrained chat model)
        "Answer the question about time zones. Convert with "
        '<tool_call>{"name": "convert_time", "arguments": {"source_timezone": "...", "time": "HH:MM", '
        '"target_timezone": "..."}}</tool_call>, then give only the time as <answer>HH:MM</answer>.'
    )
    METRICS = {
        "em": Metric("exact match of the answer (HH:MM)"),
        "converted": Metric("share of episodes that asked the server for the question's conversion and got it"),
    }

    def __init__(self, tools, **kw):
        super().__init__(tools, **kw)
        self.converted = False

    def reset(self, task: dict) -> list[dict]:
        self.converted = False
        return super().reset(task)

    def step_reward(self, parsed, results) -> float:
        for call, result in results:
            if call.name == "convert_time" and call.arguments == _conversion(self.task) and result.error is None:
                self.converted = True
        return 0.0

    def final_reward(self, answer: str | None, action_text: str) -> tuple[float, dict]:
        em = exact_match(answer, self.task["answers"])
        well_formed = answer is not None and is_well_formed_answer(action_text)
        return (em if well_formed else -1.0), {"em": em, "converted": float(self.converted)}

    def oracle_turns(self, task: dict) -> list[str]:
        """Ask the server for the conversion, then answer with the time."""
        call = {"name": "convert_time", "arguments": _conversion(task)}
        return [f"<tool_call>{json.dumps(call)}</tool_call>", f"<answer>{task['answers'][0]}</answer>"]


def _conversion(task: dict) -> dict:
    return {key: task[key] for key in ("source_timezone", "time", "target_timezone")}
