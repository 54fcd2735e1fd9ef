"""`ScriptedEngine`: a rollout engine that plays fixed assistant turns.

For tests and docs: drive an environment through :func:`agent_r1.rollout.run_episodes` with
turns you wrote, no model needed (this example runs as a doctest, tests/test_scripted.py)::

    >>> from agent_r1.context import ContextManager
    >>> from agent_r1.envs import ToolEnv
    >>> from agent_r1.models import train_tokenizer
    >>> from agent_r1.rollout import SamplingParams, ScriptedEngine, run_episodes
    >>> from agent_r1.tools import tool
    >>> @tool(thread_safe=True)
    ... def lookup(city: str) -> str:
    ...     '''Look up a city's population.
    ...
    ...     Args:
    ...         city: The city's name.
    ...     '''
    ...     return {"Lorvik": "12000"}.get(city, "no such city")
    >>> tasks = [{"id": "q1", "question": "How many people live in Lorvik?"}]
    >>> tokenizer = train_tokenizer([t["question"] for t in tasks], vocab_size=300)
    >>> engine = ScriptedEngine(tokenizer, [
    ...     '<tool_call>{"name": "lookup", "arguments": {"city": "Lorvik"}}</tool_call>',  # turn 1
    ...     "<answer>12000</answer>",                                                     # turn 2
    ... ])
    >>> make_env = lambda: ToolEnv([lookup], max_turns=3)
    >>> trajs = run_episodes(engine, make_env, tasks, ContextManager(tokenizer), SamplingParams())
    >>> [step.observation for step in trajs[0].steps]
    [[{'role': 'tool', 'name': 'lookup', 'content': '12000'}], []]
    >>> trajs[0].answer, trajs[0].stop_reason, trajs[0].metrics["tool_calls"]
    ('12000', 'answer', 1)

``script[k]`` is what the ``k``-th ``generate`` call returns: one turn for every context, or a
list with one entry per context (the episodes still running, in order). A turn is text
(encoded, then the end-of-turn token appended: a finished turn) or token ids (used as given: a
turn that does not end with the end-of-turn token is an unfinished one, as if cut by
``max_new_tokens``), or None to sample that turn from ``model``. Calls past the script sample
every turn (with a model) or raise.

It keeps :class:`~agent_r1.rollout.engine.RolloutEngine`'s contract: a turn longer than
``max_new_tokens`` is cut there (and is then unfinished); log-probs are the turn's true
log-probs under ``model`` (teacher forcing, at the sampling temperature) when a model is given,
so scripted turns look exactly like sampled ones to the learner, else 0.0 per token.
"""

from __future__ import annotations

import torch

from agent_r1.rollout.engine import Generation, HFEngine, RolloutEngine, SamplingParams

Turn = str | list[int] | None


class ScriptedEngine(RolloutEngine):
    def __init__(self, tokenizer, script: list[Turn | list[Turn]], model: torch.nn.Module | None = None):
        self.tokenizer, self.script, self.model = tokenizer, script, model
        self.eos_id = tokenizer.eos_token_id
        self.hf = HFEngine(model, tokenizer) if model is not None else None
        self.calls = 0  # generate calls so far

    def _plan(self, n: int) -> list[Turn]:
        if self.calls >= len(self.script):
            if self.model is None:
                raise IndexError(f"the script has {len(self.script)} turns and no model to sample more from")
            return [None] * n
        plan = self.script[self.calls]
        if not isinstance(plan, list) or (plan and isinstance(plan[0], int)):  # one turn for every context
            return [plan] * n
        if len(plan) != n:
            raise ValueError(f"generate call {self.calls}: the script has {len(plan)} turns for {n} contexts")
        return plan

    def _ids(self, turn: str | list[int]) -> list[int]:
        if isinstance(turn, str):
            return self.tokenizer.encode(turn, add_special_tokens=False) + [self.eos_id]
        return list(turn)

    @torch.no_grad()
    def generate(self, contexts: list[list[int]], params: SamplingParams) -> list[Generation]:
        plan = self._plan(len(contexts))
        self.calls += 1
        free = [i for i, turn in enumerate(plan) if turn is None]
        if free and self.hf is None:
            raise ValueError("a scripted turn is None (sample it) but the engine has no model")
        sampled = dict(zip(free, self.hf.generate([contexts[i] for i in free], params))) if free else {}
        out = []
        for i, (ctx, turn) in enumerate(zip(contexts, plan)):
            if turn is None:
                out.append(sampled[i])
                continue
            ids = self._ids(turn)[: params.max_new_tokens]
            out.append(Generation(ids, self._logprobs(ctx, ids, params), bool(ids) and ids[-1] == self.eos_id))
        return out

    def _logprobs(self, ctx: list[int], ids: list[int], params: SamplingParams) -> list[float]:
        if self.model is None or not ids:
            return [0.0] * len(ids)
        from agent_r1.learner import token_logprobs  # the learner's own function: the same numbers

        full = torch.tensor([ctx + ids], device=next(self.model.parameters()).device)
        was = self.model.training
        self.model.eval()
        try:
            temp = params.temperature if params.temperature > 0 else 1.0
            return token_logprobs(self.model, full, torch.ones_like(full), temp)[0, len(ctx):].tolist()
        finally:
            self.model.train(was)

    def reset(self) -> None:
        if self.hf is not None:
            self.hf.reset()
