"""What the pipeline does differently on N ranks (DESIGN.md contract 8), in the few functions the
stages call; each one is the plain single-process behaviour when there is one rank.

- :func:`check_ranks`: starts the process group and names, before any model loads, the settings
  N ranks cannot run;
- vLLM rollouts: one server for every rank, started by rank 0 unless ``rollout.vllm.url`` names
  one; rank 0 alone syncs the weights after each update, every rank waiting for it
  (:func:`agent_r1.rollout.vllm_engine.shared_engine`, ``VLLMEngine.sync_weights``);
- :func:`on_main`: a stage that runs once (data preparation): rank 0 runs it, the others wait for
  its result (or its error);
- :func:`rollout_shards`: an RL iteration's questions cut into ``rl.rollout_shards`` shards of
  whole groups (group-relative advantages stay exact), spread over the ranks, each sampled from
  a seed of its own.

The learner's all-reduce and rank-0-only writes are in :mod:`agent_r1.learner` and
:mod:`agent_r1.pipeline.state`; evaluation shards its episodes in :func:`agent_r1.run.evaluate_agent`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from agent_r1.config import ConfigError, RunConfig
from agent_r1.learner.distributed import broadcast_object, init_distributed, is_main, rank, world_size
from agent_r1.learner.learner import ds_config

log = logging.getLogger(__name__)


def check_ranks(cfg: RunConfig, control: bool = False) -> None:
    """With N > 1 ranks: start the process group (so that every later stage can wait for the
    others) and reject what N ranks cannot run."""
    n = world_size()
    if n == 1:
        return
    problems = []
    shards = cfg.rl.rollout_shards or n
    if shards < n:
        problems.append(f"rl.rollout_shards: {shards} shards cannot keep {n} ranks busy (at least {n}, or null: one per rank)")
    if cfg.rl.tasks_per_iteration < shards:
        problems.append(f"rl.tasks_per_iteration: {cfg.rl.tasks_per_iteration} questions cannot fill {shards} rollout "
                        f"shards (a question's group stays on one rank)")
    if ds_config(cfg.rl.learner)["zero_optimization"].get("stage", 0) == 3 and cfg.rollout.engine == "hf":
        problems.append("rl.learner ZeRO-3 on several ranks: every HF generate call would gather the weights, in "
                        "lock-step on every rank; use rollout.engine: vllm (or ZeRO 0-2)")
    if cfg.rl.max_staleness:
        problems.append("rl.max_staleness: rollouts ahead of the learner run in one process (one learner rank beside "
                        "the server); use --nproc 1 or rl.max_staleness: 0")
    if control:
        problems.append("--control on several ranks: the SFT-only control trains for a wall time, which ranks "
                        "cannot agree on step by step; run it in one process")
    if problems:
        raise ConfigError("\n".join(problems))
    init_distributed()
    log.info("rank %d of %d", rank(), n)


def on_main(fn: Callable, *args, **kwargs):
    """``fn(*args, **kwargs)`` on rank 0 only; every rank returns its result, or raises its error."""
    if world_size() == 1:
        return fn(*args, **kwargs)
    result = error = None
    if is_main():
        try:
            result = fn(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - re-raised below, on every rank
            error = e
    result, error = broadcast_object((result, error))
    if error is not None:
        raise error
    return result


def rollout_shards(run: Callable[[list[dict]], list], tasks: list[dict], shards: int | None) -> list:
    """``run(part)`` (the rollout of some questions, their groups numbered from 0) over this rank's
    shards of ``tasks``, with the group ids renumbered to be those of ``tasks``.

    ``tasks`` is cut into ``shards`` contiguous shards (``rl.rollout_shards``; None: one per
    rank); rank r runs a contiguous run of them, after rank r-1's, so the ranks' trajectories in
    rank order are in the order one process would have them. With more than one shard, each is
    sampled from a seed of its own (a base seed drawn from torch's global RNG, the same draw on
    every rank, plus the shard's index), and the global RNG is then left as after that one draw
    on every rank: a shard's episodes are the same whichever rank runs it and whatever else that
    rank runs, so a fixed ``rl.rollout_shards`` samples the same episodes on 1 rank or on any
    number of ranks up to it. One shard (one process, ``rollout_shards`` unset): torch's RNG as it is.
    """
    world = world_size()
    n = shards or world
    if n == 1:
        return run(tasks)
    if len(tasks) < n:
        raise ConfigError(f"rl.tasks_per_iteration: {len(tasks)} questions per iteration cannot fill {n} rollout shards")
    base = int(torch.randint(2**62, (1,)))
    after = torch.get_rng_state()
    bounds = [len(tasks) * k // n for k in range(n + 1)]
    r = rank()
    out = []
    for k in range(n * r // world, n * (r + 1) // world):
        torch.manual_seed(base + k)
        trajs = run(tasks[bounds[k]: bounds[k + 1]])
        for t in trajs:
            t.group_id += bounds[k]
        out += trajs
    torch.set_rng_state(after)
    return out
