"""The agent loop: many episodes advance together, one batched generation per turn."""

from __future__ import annotations

from collections.abc import Callable

from agent_r1.context import ContextManager
from agent_r1.rollout.engine import RolloutEngine, SamplingParams
from agent_r1.trajectory import Step, Trajectory


def run_episodes(
    engine: RolloutEngine,
    make_env: Callable[[], object],
    tasks: list[dict],
    context: ContextManager,
    params: SamplingParams,
    group_ids: list[int] | None = None,
    max_context_tokens: int | None = None,
    on_turn: Callable[[int, int], None] | None = None,
) -> list[Trajectory]:
    """Run one episode per task to completion and return their trajectories.

    Each turn, the contexts of the episodes still running go to the engine in one batch; each
    sampled turn is decoded only to be parsed by its environment (the trajectory keeps the ids);
    episodes that end drop out of the batch. An episode whose next turn would not fit in
    ``max_context_tokens`` is ended with ``stop_reason="token_budget"``; ``on_turn(turn,
    n_active)`` reports progress.
    """
    tok = context.tokenizer
    engine.reset()  # nothing kept from an earlier batch (the weights may have changed since)
    envs = [make_env() for _ in tasks]
    ctxs = [context.start(env.reset(task)) for env, task in zip(envs, tasks)]
    trajs = [
        Trajectory(task_id=str(task.get("id", i)), group_id=group_ids[i] if group_ids else i)
        for i, task in enumerate(tasks)
    ]
    active = list(range(len(tasks)))
    turn = 0
    while active:
        if on_turn:
            on_turn(turn, len(active))
        contexts = [context.context_ids(ctxs[i]) for i in active]
        gens = engine.generate(contexts, params)
        still = []
        for i, ctx_ids, gen in zip(active, contexts, gens):
            text = tok.decode(gen.ids, skip_special_tokens=False)
            if gen.finished:
                text = text[: text.rfind(tok.eos_token)]
            res = envs[i].step(text, context_tokens=len(ctx_ids) + len(gen.ids))
            info = res.info
            trajs[i].steps.append(
                Step(
                    context_ids=ctx_ids,
                    action_ids=gen.ids,
                    action_logprobs=gen.logprobs,
                    action_text=text,
                    tool_calls=info.get("tool_calls", []),
                    observation=res.observation,
                    reward=float(res.reward),
                    format_error=bool(info.get("format_error", False)),
                    tool_errors=int(info.get("tool_errors", 0)),
                    truncated=not gen.finished,
                )
            )
            if res.done:
                trajs[i].final_reward = float(info.get("final_reward", 0.0))
                trajs[i].metrics = _episode_metrics(envs[i], info)
                continue
            context.observe(ctxs[i], gen.ids, res.observation)
            if max_context_tokens and len(context.context_ids(ctxs[i])) + params.max_new_tokens > max_context_tokens:
                # The next turn cannot fit in the context: end the episode here.
                res = envs[i].end("token_budget")
                trajs[i].final_reward = float(res.info.get("final_reward", 0.0))
                trajs[i].metrics = _episode_metrics(envs[i], res.info)
                continue
            still.append(i)
        active = still
        turn += 1
    return trajs


def _episode_metrics(env, info: dict) -> dict:
    m = dict(getattr(env, "metrics", {}))
    for key in ("em", "f1", "answer", "found_gold", "gold_recall", "stop_reason"):
        if key in info:
            m[key] = info[key]
    return m
