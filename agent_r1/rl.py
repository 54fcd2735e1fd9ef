"""One RL iteration: rollout → reward annotation → advantages → DeepSpeed update."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

from agent_r1.algorithms import AdvantageInputs, get_advantage
from agent_r1.config import RLConfig
from agent_r1.context import ContextManager
from agent_r1.envs.metrics import aggregate
from agent_r1.rollout import RolloutEngine, SamplingParams, run_episodes
from agent_r1.trajectory import Trajectory, collate, to_sequences

# Estimators that need a learned value function (a critic).
NEEDS_CRITIC = {"gae", "step_gae"}
# Names that results are reported under (the Agent-R1 paper's names).
METHOD_NAMES = {"gae": "ppo", "step_gae": "ppo_step"}


def parse_method(method: str) -> dict:
    """Inverse of :func:`method_name`: ``"ppo_no_adv_mask"`` → ``{"algorithm": "gae", ...}``."""
    masks = {"loss_mask": True, "adv_mask": True}
    for suffix, key in (("_no_loss_mask", "loss_mask"), ("_no_adv_mask", "adv_mask")):
        if method.endswith(suffix):
            method, masks[key] = method[: -len(suffix)], False
    algorithm = {v: k for k, v in METHOD_NAMES.items()}.get(method, method)
    return {"algorithm": algorithm, **masks}


def method_name(algorithm: str, loss_mask: bool = True, adv_mask: bool = True) -> str:
    name = METHOD_NAMES.get(algorithm, algorithm)
    if not loss_mask:
        return f"{name}_no_loss_mask"
    if not adv_mask:
        return f"{name}_no_adv_mask"
    return name


def rollout(engine: RolloutEngine, make_env, tasks: list[dict], context: ContextManager, cfg: RLConfig, max_new_tokens: int, max_context_tokens: int, on_turn=None) -> list[Trajectory]:
    """``group_size`` sampled episodes per task; episodes of one task share a group id."""
    reps = [t for t in tasks for _ in range(cfg.group_size)]
    groups = [i for i in range(len(tasks)) for _ in range(cfg.group_size)]
    params = SamplingParams(cfg.temperature, cfg.top_p, max_new_tokens)
    return run_episodes(engine, make_env, reps, context, params, groups, max_context_tokens, on_turn)


def annotate(learner, trajs: list[Trajectory], cfg: RLConfig, pad_id: int) -> dict:
    """Pack trajectories and add what the update needs: old/ref log-probs, values, advantages.

    Episodes that an environment error ended (``stop_reason="env_error"``) have no true reward
    and are left out; if that leaves none, the environment is broken and this raises."""
    trajs = [t for t in trajs if t.metrics.get("stop_reason") != "env_error"]
    if not trajs:
        raise RuntimeError("every episode of the batch ended with an environment error (see the log)")
    batch = collate([s for t in trajs for s in to_sequences(t)], pad_id, cfg.loss_mask, cfg.adv_mask)
    values = learner.values(batch) if learner.critic is not None else None
    adv, ret = get_advantage(cfg.algorithm)(
        AdvantageInputs(
            token_rewards=batch["token_rewards"],
            mask=batch["adv_mask"],
            group_ids=batch["group_ids"],
            values=values,
            step_ids=batch["step_ids"],
            gamma=cfg.gamma,
            lam=cfg.lam,
        )
    )
    batch.update(advantages=adv, returns=ret)
    if values is not None:
        batch["old_values"] = values
    # old log-probs only where the update will need them (rows that can carry a gradient), and
    # not at all when the update is a single step: then they are the update's own, detached
    if not learner.single_step:
        batch["old_logprobs"] = learner.logprobs(batch, rows=learner.policy_rows(batch))
    if learner.reference is not None and learner.cfg.kl_coef > 0:
        batch["ref_logprobs"] = learner.logprobs(batch, learner.reference)
    return batch


def update(learner, batch: dict, generator: torch.Generator | None = None) -> dict:
    """The learner's update, with its training throughput (tokens of the rows it ran per s)."""
    t0 = time.perf_counter()
    stats = learner.update(batch, generator)
    stats["train_tokens_per_s"] = stats["update/tokens"] / max(time.perf_counter() - t0, 1e-9)
    return stats


def rollout_stats(trajs: list[Trajectory]) -> dict:
    """Every metric the environment declares (aggregated as declared), plus reward and turns."""
    rewards = [t.total_reward for t in trajs]
    turns = sum(len(t.steps) for t in trajs)
    return aggregate(trajs) | {
        "reward_mean": statistics.fmean(rewards),
        "reward_std": statistics.pstdev(rewards),
        "format_error_rate": sum(s.format_error for t in trajs for s in t.steps) / max(turns, 1),
        "turns": turns / len(trajs),
        "env_errors": sum(t.metrics.get("stop_reason") == "env_error" for t in trajs) / len(trajs),
    }


def rl_iteration(learner, engine, make_env, tasks, context, cfg: RLConfig, max_new_tokens: int, max_context_tokens: int, pad_id: int, generator: torch.Generator | None = None, on_turn: Callable | None = None) -> tuple[dict, list[Trajectory]]:
    t0 = time.perf_counter()
    trajs = rollout(engine, make_env, tasks, context, cfg, max_new_tokens, max_context_tokens, on_turn)
    t1 = time.perf_counter()
    stats = update(learner, annotate(learner, trajs, cfg, pad_id), generator)
    t2 = time.perf_counter()
    stats |= rollout_stats(trajs)
    stats |= {"time/rollout_s": t1 - t0, "time/update_s": t2 - t1,
              "action_tokens": sum(t.num_action_tokens for t in trajs)}
    return stats, trajs
