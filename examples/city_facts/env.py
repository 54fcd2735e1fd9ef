"""The city_facts environment: answer questions about cities with ``lookup`` and ``calc``.

A `ToolEnv` subclass shows each extension point of an environment:
  - ``TASK_FIELDS``: the fields its task rows must have (a row's other fields reach ``reset`` too);
  - ``METRICS``: the metrics it reports (they reach the RL metrics, eval.json and MLflow);
  - ``step_reward``: a process reward, ``lookup_bonus`` the first time a city the question is
    about is looked up;
  - ``final_reward``: the outcome reward, exact match of the answer (numbers compare as numbers:
    "-300" is not "300"), -1 for a turn that is not a well-formed answer;
  - ``oracle_turns``: the demonstrations of the SFT cold start;
  - ``register_env``: the name ``city_facts`` (a config may also name the class by its path).
The tools come from the config (``env.tools``); the environment only knows their names.
"""

from __future__ import annotations

import json

from agent_r1.envs import Metric, ToolEnv, register_env
from agent_r1.rewards import exact_match, is_well_formed_answer
from agent_r1.tools import run_tool


@register_env("city_facts")
class CityFactsEnv(ToolEnv):
    """Tasks are rows with ``question``, ``answers``, ``qtype`` and ``gold_titles`` (the
    cities the question is about)."""

    TASK_FIELDS = ("question", "answers", "qtype", "gold_titles")  # every row of data/*.jsonl has them
    DEFAULT_SYSTEM_PROMPT = (  # env.system_prompt: default (for a pretrained chat model)
        "Answer the question about cities. Look facts up with "
        '<tool_call>{"name": "lookup", "arguments": {"city": "..."}}</tool_call>, compute with '
        '<tool_call>{"name": "calc", "arguments": {"expression": "..."}}</tool_call>, '
        "then give only the final answer as <answer>...</answer>."
    )
    METRICS = {
        "em": Metric("exact match of the answer (numbers as numbers)"),
        "lookup_hit": Metric("share of the question's cities the episode looked up"),
        "calc_calls": Metric("calc calls in the episode"),
    }

    def __init__(self, tools, lookup_bonus: float = 0.1, **kw):
        super().__init__(tools, **kw)
        self.lookup_bonus = lookup_bonus
        self.looked_up: set[str] = set()
        self.calc_calls = 0

    def reset(self, task: dict) -> list[dict]:
        self.looked_up, self.calc_calls = set(), 0
        return super().reset(task)

    def step_reward(self, parsed, results) -> float:
        reward = 0.0
        for call, result in results:
            self.calc_calls += call.name == "calc"
            city = result.info.get("city") if call.name == "lookup" else None
            if city in self.task["gold_titles"] and city not in self.looked_up:
                self.looked_up.add(city)
                reward += self.lookup_bonus
        return reward

    def final_reward(self, answer: str | None, action_text: str) -> tuple[float, dict]:
        em = exact_match(answer, self.task["answers"])
        well_formed = answer is not None and is_well_formed_answer(action_text)
        metrics = {"em": em, "lookup_hit": len(self.looked_up) / len(set(self.task["gold_titles"])),
                   "calc_calls": self.calc_calls}
        return (em if well_formed else -1.0), metrics

    def oracle_turns(self, task: dict) -> list[str]:
        """Look up each city; for a difference, calc it from the looked-up populations; answer."""
        turns = [_call("lookup", city=c) for c in task["gold_titles"]]
        if task["qtype"] == "population_difference":
            a, b = (_population(run_tool(self.tools["lookup"], {"city": c}).text) for c in task["gold_titles"])
            turns.append(_call("calc", expression=f"{a} - {b}"))
        return turns + [f"<answer>{task['answers'][0]}</answer>"]


def _call(name: str, **arguments) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def _population(text: str) -> int:
    return int(text.split("population ")[1].split(",")[0])
