"""The ``code`` environment: answer a computation problem by running Python (the ``python`` tool).

Tasks are rows of the ``code`` data (agent_r1/data/code_tasks.py): ``question``, ``answers``
(the number), ``qtype`` (the problem's kind) and ``code`` (a reference program). A turn calls
the tool, ``<tool_call>{"name": "python", "arguments": {"code": "print(...)"}}</tool_call>``,
and the observation is what the program printed (or its error); the episode ends with
``<answer>N</answer>``. The final reward is the exact match of the number (numbers compare as
numbers: "1,000" is "1000", "-3" is not "3"), -1 for a last turn that is not a well-formed
answer; no process reward. The oracle (the SFT cold start) runs the reference program and
answers with the number it prints.
"""

from __future__ import annotations

import json

from agent_r1.data.code_tasks import CODE_FIELDS
from agent_r1.envs.metrics import Metric
from agent_r1.envs.tool_env import ToolEnv
from agent_r1.rewards import exact_match, is_well_formed_answer

SYSTEM_PROMPT = (
    "Solve the problem by running Python: "
    '<tool_call>{"name": "python", "arguments": {"code": "print(...)"}}</tool_call>. '
    "Then give only the final number as <answer>...</answer>."
)


class CodeEnv(ToolEnv):
    """A computation problem, solved with the ``python`` tool (see the module docstring)."""

    TASK_FIELDS = CODE_FIELDS
    DEFAULT_TOOLS = ["python"]
    DEFAULT_SYSTEM_PROMPT = SYSTEM_PROMPT
    METRICS = {
        "em": Metric("exact match of the answer with the number"),
        "answered": Metric("episodes that ended with a well-formed answer"),
        "code_runs": Metric("python calls whose program finished with exit status 0"),
        "code_failures": Metric("python calls whose program failed (an exception, a limit, a timeout)"),
    }

    def __init__(self, tools, **kw):
        super().__init__(tools, **kw)
        self.runs = self.failures = 0

    def reset(self, task: dict) -> list[dict]:
        self.runs = self.failures = 0
        return super().reset(task)

    def step_reward(self, parsed, results) -> float:
        for call, result in results:
            ok = result.error is None and result.info.get("exit_code") == 0
            self.runs += ok
            self.failures += not ok
        return 0.0

    def final_reward(self, answer: str | None, action_text: str) -> tuple[float, dict]:
        em = exact_match(answer, self.task["answers"])
        well_formed = answer is not None and is_well_formed_answer(action_text)
        metrics = {"em": em, "answered": float(well_formed), "code_runs": self.runs, "code_failures": self.failures}
        return (em if well_formed else -1.0), metrics

    def oracle_turns(self, task: dict) -> list[str]:
        """Run the reference program, then answer with the gold number."""
        call = {"name": "python", "arguments": {"code": task["code"]}}
        return [f"<tool_call>{json.dumps(call)}</tool_call>", f"<answer>{task['answers'][0]}</answer>"]
