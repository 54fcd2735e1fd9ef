"""Multi-hop question answering with a search tool, scored by EM / F1 of the final answer."""

from __future__ import annotations

import json

from agent_r1.envs.metrics import Metric
from agent_r1.envs.parsers import ParsedTurn, ToolCall, ToolCallParser
from agent_r1.envs.tool_env import EnvStep, ToolEnv, answer_turn
from agent_r1.rewards import (
    answer_score,
    compose_reward,
    exact_match,
    f1_score,
    is_well_formed_answer,
    retrieval_reward,
)
from agent_r1.tools.base import Tool, ToolResult

DEFAULT_SYSTEM_PROMPT = (
    "Answer the question. Search as needed with "
    '<tool_call>{"name": "search", "arguments": {"query": "..."}}</tool_call>, '
    "then give only the final answer as <answer>...</answer>."
)


class MultiHopQAEnv(ToolEnv):
    """Tasks are rows with ``question``, ``answers`` (list) and ``gold_titles`` (list).

    Final reward: ``compose_reward(answer_score(answer, answers, answer_metric), well_formed,
    reward_scheme, format_score)``; an episode that ends without an answer scores as an
    ill-formed one. Process reward: ``retrieval_bonus`` for each gold document a search retrieves
    for the first time in the episode. Built from a config with the tools of ``env.tools``
    (default: ``search``), one of which must be named ``search``.
    """

    METRICS = {
        "em": Metric("exact match of the answer with a gold answer (0 without an answer)"),
        "f1": Metric("token F1 of the answer with the best gold answer"),
        "found_gold": Metric("gold documents the episode's searches retrieved"),
        "search_recall": Metric("share of the question's gold documents the searches retrieved"),
    }
    TASK_FIELDS = ("question", "answers", "hops", "qtype", "gold_titles", "search_chain")  # the QA fields
    DEFAULT_TOOLS = ["search"]
    DEFAULT_SYSTEM_PROMPT = DEFAULT_SYSTEM_PROMPT

    @classmethod
    def from_config(cls, tools: list[Tool], cfg) -> MultiHopQAEnv:
        search = [t for t in tools if t.name == "search"]
        if not search:
            raise ValueError(f"{cls.__name__} needs a tool named 'search'; env.tools gave {[t.name for t in tools]}")
        own = {"reward_scheme": cfg.reward_scheme, "answer_metric": cfg.answer_metric,
               "retrieval_bonus": cfg.retrieval_bonus}
        return cls(search[0], other_tools=[t for t in tools if t.name != "search"],
                   **cls.common_settings(cfg) | own | cfg.kwargs)

    def __init__(
        self,
        search_tool: Tool,
        reward_scheme: str = "agent_r1",
        answer_metric: str = "em",
        retrieval_bonus: float = 0.0,
        format_score: float = 0.0,
        system_prompt: str | None = DEFAULT_SYSTEM_PROMPT,
        parser: str | ToolCallParser = "hermes",
        max_turns: int = 4,
        max_tool_calls_per_turn: int = 2,
        max_context_tokens: int | None = None,
        format_penalty: float = 0.0,
        max_format_errors: int | None = None,
        other_tools: list[Tool] = (),
    ):
        super().__init__(
            [search_tool, *other_tools],
            parser=parser,
            max_turns=max_turns,
            max_tool_calls_per_turn=max_tool_calls_per_turn,
            max_context_tokens=max_context_tokens,
            system_prompt=system_prompt,
            format_penalty=format_penalty,
            max_format_errors=max_format_errors,
        )
        self.search_name = search_tool.name
        self.reward_scheme = reward_scheme
        self.answer_metric = answer_metric
        self.retrieval_bonus = retrieval_bonus
        self.format_score = format_score
        self.found_gold: set[str] = set()

    def reset(self, task: dict) -> list[dict]:
        self.found_gold = set()
        return super().reset(task)

    def step_reward(self, parsed: ParsedTurn, results: list[tuple[ToolCall, ToolResult]]) -> float:
        """``retrieval_bonus`` per gold title retrieved for the first time (updates `found_gold`)."""
        reward = 0.0
        for call, result in results:
            if call.name == self.search_name and result.error is None:
                r, self.found_gold = retrieval_reward(
                    result.info.get("titles", []), self.task["gold_titles"], self.found_gold, self.retrieval_bonus
                )
                reward += r
        return reward

    def final_reward(self, answer: str | None, action_text: str) -> tuple[float, dict]:
        golds = self.task["answers"]
        well_formed = answer is not None and is_well_formed_answer(action_text)
        reward = compose_reward(
            answer_score(answer, golds, self.answer_metric), well_formed, self.reward_scheme, self.format_score
        )
        n_gold = len(set(self.task["gold_titles"]))
        return reward, {
            "em": exact_match(answer, golds),
            "f1": f1_score(answer, golds),
            "found_gold": len(self.found_gold),
            "search_recall": len(self.found_gold) / n_gold if n_gold else 0.0,
        }

    def oracle_turns(self, task: dict) -> list[str]:
        """One search per entity of the task's ``search_chain``, then the first gold answer."""
        calls = [{"name": self.search_name, "arguments": {"query": entity}} for entity in task["search_chain"]]
        return [f"<tool_call>{json.dumps(c)}</tool_call>" for c in calls] + [f"<answer>{task['answers'][0]}</answer>"]


NAIVE_RAG_SYSTEM_PROMPT = "Answer the question from the passages. Give only the final answer as <answer>...</answer>."


class NaiveRAGEnv(MultiHopQAEnv):
    """The Naive RAG baseline as the Agent-R1 paper defines it: the passages the search tool
    retrieves once with the raw question (its top-k, rendered as an agent's search sees them) are
    written into the user message with the question, and the model answers in one turn, with no
    tool. Its own system prompt asks for ``<answer>...</answer>``; a turn without that tag is
    answered by its first non-blank line (the base model was never taught the tag).
    """

    TOOLS_IN_PROMPT = False  # the model sees passages, not a tool

    def __init__(self, search_tool: Tool, **kw):
        super().__init__(search_tool, **{**kw, "max_turns": 1, "system_prompt": NAIVE_RAG_SYSTEM_PROMPT})
        self.search_tool = search_tool

    def reset(self, task: dict) -> list[dict]:
        from agent_r1.tools import run_tool

        messages = super().reset(task)
        result = run_tool(self.search_tool, {"query": task["question"]})
        _, self.found_gold = retrieval_reward(result.info.get("titles", []), task["gold_titles"], set(), 0.0)
        messages[-1] = {"role": "user", "content": f"Passages:\n{result.text}\n\nQuestion: {task['question']}"}
        return messages

    def step(self, action_text: str, context_tokens: int | None = None) -> EnvStep:
        """The one turn is the answer: its ``<answer>`` content, else its first non-blank line."""
        return answer_turn(self, action_text)
