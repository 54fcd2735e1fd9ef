"""The agent loop: many episodes advance together, one batched generation per turn."""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from agent_r1.context import ContextManager
from agent_r1.envs.metrics import MetricError
from agent_r1.memory import release_freed
from agent_r1.rollout.engine import RolloutEngine, SamplingParams
from agent_r1.tools.base import _describe
from agent_r1.trajectory import Step, Trajectory

if TYPE_CHECKING:
    from agent_r1.envs import StepInfo, ToolEnv

log = logging.getLogger(__name__)
MAX_STEP_THREADS = 32  # environments stepped at once (each mostly waits on its tools)


@dataclass
class Prefix:
    """Where an episode starts other than at its prompt: ``turns`` (action ids and text, e.g. a
    demonstration's first steps) are played through the environment and the context first, and
    ``tokens`` start the first sampled turn, which the engine continues. Both are context: no step
    records them as sampled."""

    turns: list[tuple[list[int], str]] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)


def run_episodes(engine: RolloutEngine, make_env: Callable[[], ToolEnv], tasks: list[dict], context: ContextManager,
                 params: SamplingParams, group_ids: list[int] | None = None, max_context_tokens: int | None = None,
                 on_turn: Callable[[int, int], None] | None = None,
                 prefixes: list[Prefix | None] | None = None) -> list[Trajectory]:
    """Run one episode per task to completion and return their trajectories.

    Each turn, the contexts of the episodes still running go to the engine in one batch; each
    sampled turn is decoded only to be parsed by its environment (the trajectory keeps the ids);
    episodes that end drop out of the batch. An episode whose next turn would not fit in
    ``max_context_tokens`` is ended with ``stop_reason="token_budget"``; ``on_turn(turn,
    n_active)`` reports progress. An episode whose last ``env.max_format_errors`` turns were all
    format errors ends there (:func:`format_errors_end`).

    An episode whose prompt leaves no room for a first turn of ``max_new_tokens`` never reaches
    the engine: it ends before its first turn (``stop_reason="token_budget"``, no step, so no
    training row) with ``final_reward`` 0, not what the environment's ``final_reward`` gives a
    missing answer (which may be negative); its metrics are the environment's. When that is
    every episode's prompt, :class:`ContextBudgetError` (a config problem).

    An episode whose environment raises (in ``reset``, ``step`` or while its observation is
    added to the context) ends there with ``stop_reason="env_error"`` and the error in its
    ``error``; the other episodes go on. A :class:`MetricError` (the environment reported a
    metric it does not declare) is a bug in the environment and is raised.

    A finished trajectory has its ``stop_reason`` and ``answer``; its ``metrics`` hold the
    environment's counters and the metrics its ``final_reward`` reported; ``metric_aggs`` says how
    each declared metric aggregates over a batch (agent_r1/envs/metrics.py).

    ``prefixes`` (one per task, None for none) start episodes from a :class:`Prefix` (see :func:`_start`).
    """
    release_freed()  # the heap pages freed since the last batch (an update's activations) back to the OS
    engine.reset()  # nothing kept from an earlier batch (the weights may have changed since)
    envs = [make_env() for _ in tasks]
    trajs = [Trajectory(task_id=str(task.get("id", i)), group_id=group_ids[i] if group_ids else i)
             for i, task in enumerate(tasks)]
    ctxs, active, pending = _start(envs, trajs, tasks, context, params, max_context_tokens, prefixes)
    turn = 0
    while active:
        if on_turn:
            on_turn(turn, len(active))
        contexts = [context.context_ids(ctxs[i]) + pending.get(i, []) for i in active]
        gens = engine.generate(contexts, params)
        texts = [_decoded(context.tokenizer, gen, pending.get(i, [])) for i, gen in zip(active, gens)]
        steps = _steps([envs[i] for i in active], texts, [len(c) + len(g.ids) for c, g in zip(contexts, gens)])
        still = []
        for i, ctx_ids, gen, text, res in zip(active, contexts, gens, texts, steps):
            try:
                if isinstance(res, BaseException):
                    raise res
                key, res = res
                if _advance(envs[i], ctxs[i], trajs[i], ctx_ids, gen, text, key, res, context, params, max_context_tokens,
                            pending.pop(i, [])):
                    still.append(i)
            except MetricError:
                raise
            except Exception as e:  # noqa: BLE001 - contain the episode, keep the batch
                _env_error(trajs[i], envs[i], e)
        active = still
        turn += 1
    return trajs


def _start(envs: list, trajs: list[Trajectory], tasks: list[dict], context: ContextManager, params: SamplingParams,
           max_context_tokens: int | None, prefixes: list[Prefix | None] | None) -> tuple[dict, list[int], dict]:
    """Reset every episode's environment and play its prefix's turns: the contexts of those that
    start, the indices of those that go to the engine (not the ones whose reset raised, nor
    those whose prompt leaves no room for a turn: :func:`_no_room`, ended here before their first
    turn, unrewarded) and the prefix tokens that begin their first sampled turn.

    A prefix's turns are played through the environment and the context before the first sampled
    turn (their step rewards are not the episode's); its tokens begin that turn: the environment
    reads the prefix tokens and the sampled ones as one turn, while the step records the prefix
    tokens as context and only the sampled ones as its action."""
    prefixes = prefixes or [None] * len(tasks)
    ctxs, active = {}, []
    for i, (env, task, prefix) in enumerate(zip(envs, tasks, prefixes)):
        try:
            ctxs[i] = context.start(env.reset(task))
            for ids, text in prefix.turns if prefix is not None else []:
                res = env.step(text)
                if res.done:
                    raise ValueError(f"a prefix of {len(prefix.turns)} turns ends the episode of task {trajs[i].task_id}")
                context.observe(ctxs[i], ids, res.observation)
            active.append(i)
        except MetricError:
            raise
        except Exception as e:  # noqa: BLE001 - one broken task must not cost the batch
            _env_error(trajs[i], envs[i], e)
    for i in _no_room(ctxs, context, params, max_context_tokens):
        active.remove(i)
        try:
            _finish(trajs[i], envs[i], envs[i].end("token_budget").info)
            trajs[i].final_reward = 0.0  # unrewarded, whatever the env scores a missing answer
        except MetricError:
            raise
        except Exception as e:  # noqa: BLE001 - as in a step
            _env_error(trajs[i], envs[i], e)
    return ctxs, active, {i: list(p.tokens) for i, p in enumerate(prefixes) if p is not None and p.tokens}


def play_policy(make_env: Callable[[], ToolEnv], tasks: list[dict], turn: Callable[[ToolEnv, dict, int], str]) -> list[Trajectory]:
    """One episode per task played by a policy that is not a model: ``turn(env, task, k)`` writes
    the k-th turn as text (the ``random`` and ``oracle`` baselines). Episodes end and are contained
    as in :func:`run_episodes`; their steps have no token ids, and no token budget applies."""
    trajs = []
    for i, task in enumerate(tasks):
        traj, env = Trajectory(task_id=str(task.get("id", i)), group_id=i), make_env()
        try:
            env.reset(task)
            while not env.done:
                text = turn(env, task, len(traj.steps))
                res = env.step(text)
                traj.steps.append(Step(context_ids=[], action_ids=[], action_logprobs=[], action_text=text,
                                       tool_calls=res.info.tool_calls, observation=res.observation, reward=float(res.reward),
                                       format_error=res.info.format_error, tool_errors=res.info.tool_errors))
                if res.done:
                    _finish(traj, env, res.info)
                elif format_errors_end(traj, env):
                    _finish(traj, env, env.end("format_errors").info)
        except MetricError:
            raise
        except Exception as e:  # noqa: BLE001 - contain the episode, keep the others
            _env_error(traj, env, e)
        trajs.append(traj)
    return trajs


class ContextBudgetError(ValueError):
    """No episode's prompt leaves room for a turn within the context budget (a config problem)."""


def _no_room(ctxs: dict, context: ContextManager, params: SamplingParams, max_context_tokens: int | None) -> list:
    """The episodes (keys of ``ctxs``) whose prompt leaves no room for a turn of ``max_new_tokens``
    within ``max_context_tokens``: an error when that is every episode's, else a warning (they end
    before their first turn, with 'token_budget', reward 0 and no step to train on)."""
    if not max_context_tokens or not ctxs:
        return []
    sizes = {i: len(context.context_ids(c)) for i, c in ctxs.items()}
    full = [i for i, n in sizes.items() if n + params.max_new_tokens > max_context_tokens]
    if not full:
        return []
    tools = f" ({len(context.tools)} tool schemas in it)" if getattr(context, "tools", None) else ""
    if len(full) == len(sizes):
        raise ContextBudgetError(f"the prompt of every task is at least {min(sizes.values())} tokens{tools}; with max_new_tokens="
                         f"{params.max_new_tokens} that is more than max_context_tokens={max_context_tokens}: every episode "
                         "would end before its first turn. Raise the budget (env.max_context_tokens) or shorten the prompt")
    log.warning("%d of %d prompts leave no room for a turn of max_new_tokens=%d within max_context_tokens=%d: those "
                "episodes end before their first turn (token_budget, reward 0, not trained on)", len(full), len(sizes),
                params.max_new_tokens, max_context_tokens)
    return full


def _decoded(tok, gen, prefix: list[int] = ()) -> str:
    """A sampled turn (after the ``prefix`` tokens that began it) as text, for its environment's
    parser (the trajectory keeps the ids)."""
    text = tok.decode(list(prefix) + gen.ids, skip_special_tokens=False)
    return text[: text.rfind(tok.eos_token)] if gen.finished else text


def _steps(envs: list, texts: list[str], context_tokens: list[int]) -> list:
    """Each environment's state key (``state_key``: the state the turn starts from) and ``step`` on
    its turn: side by side in threads when every tool of every environment is thread-safe (a
    sandboxed ``python`` call waits on its process, and many episodes call at once; the tool
    bounds its own concurrency), else one after another. An exception is returned in place of its
    episode's result, for the caller to contain."""

    def one(k: int):
        try:
            return envs[k].state_key(), envs[k].step(texts[k], context_tokens=context_tokens[k])
        except Exception as e:  # noqa: BLE001 - returned, contained by the caller
            return e

    threaded = len(envs) > 1 and all(t.thread_safe for env in envs for t in env.tools.values())
    if not threaded:
        return [one(k) for k in range(len(envs))]
    with ThreadPoolExecutor(min(len(envs), MAX_STEP_THREADS), thread_name_prefix="env-step") as pool:
        return list(pool.map(one, range(len(envs))))


def _advance(env, ctx, traj: Trajectory, ctx_ids: list[int], gen, text: str, key: str | None, res,
             context: ContextManager, params: SamplingParams, max_context_tokens: int | None,
             prefix: list[int] = ()) -> bool:
    """Record one sampled turn, the key of the state it started from and its environment step ``res`` in an
    episode; True while it goes on. ``prefix``: the tokens that began the turn (the end of ``ctx_ids``, not
    sampled)."""
    info = res.info
    traj.steps.append(
        Step(
            context_ids=ctx_ids,
            action_ids=gen.ids,
            action_logprobs=gen.logprobs,
            action_text=text,
            tool_calls=info.tool_calls,
            observation=res.observation,
            reward=float(res.reward),
            format_error=info.format_error,
            tool_errors=info.tool_errors,
            hit_max_new_tokens=not gen.finished,
            state_key=key,
        )
    )
    if res.done:
        _finish(traj, env, info)
        return False
    if format_errors_end(traj, env):
        _finish(traj, env, env.end("format_errors").info)
        return False
    context.observe(ctx, list(prefix) + gen.ids, res.observation)
    if max_context_tokens and len(context.context_ids(ctx)) + params.max_new_tokens > max_context_tokens:
        # The next turn cannot fit in the context: end the episode here.
        _finish(traj, env, env.end("token_budget").info)
        return False
    return True


def format_errors_end(traj: Trajectory, env) -> bool:
    """The rule that ends an episode which keeps failing its format, the same for every policy
    (a model, a baseline) and every environment: its last ``env.max_format_errors`` turns (the
    setting ``env.max_format_errors``) were all format errors. Such an episode ends with
    ``stop_reason="format_errors"`` and is scored as one without an answer; with the setting None
    (or 0) it never holds."""
    n = getattr(env, "max_format_errors", None)  # an environment built without ToolEnv.__init__ has none
    return bool(n) and len(traj.steps) >= n and all(s.format_error for s in traj.steps[-n:])


def _env_error(traj: Trajectory, env, e: Exception) -> None:
    """End an episode whose environment failed: no final reward, the error in its metrics."""
    error = _describe(e, 500)
    log.warning("episode %s ended by an environment error: %s", traj.task_id, error)
    traj.final_reward = 0.0
    traj.stop_reason, traj.error, traj.metrics = "env_error", error, dict(env.metrics)
    traj.metric_aggs = _aggs(env)


def _finish(traj: Trajectory, env, info: StepInfo) -> None:
    traj.final_reward = float(info.final_reward)
    traj.stop_reason, traj.answer = info.stop_reason, info.answer
    traj.metrics = {**env.metrics, **info.metrics}
    traj.metric_aggs = _aggs(env)


def _aggs(env) -> dict[str, str]:
    return {name: m.agg for name, m in type(env).declared_metrics().items()}
