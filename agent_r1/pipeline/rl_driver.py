"""The RL driver: the one implementation of an RL iteration, :func:`sample_episodes` →
:func:`build_train_batch` → :func:`update_policy` → :func:`end_iteration`, and the train stage
built on it.

:class:`RLTrainer` steps through the iterations; ``agent-r1 train``, ``agent-r1 stage train``
(``dvc repro``) and the Prefect flows all run :meth:`RLTrainer.run`, the flows with a
:class:`~agent_r1.pipeline.runner.Runner` that makes each phase function a task of the same
name. Build one from parts
(a learner, an engine, an environment factory, tasks) for a task of your own, or from a
pipeline config with :meth:`RLTrainer.from_config`.

What an estimator needs (a critic, groups, its settings) comes from its registry entry
(:mod:`agent_r1.algorithms.registry`): a new estimator needs no edit here. The method ``rft``
(rejection-sampling fine-tuning) runs in the same loop: episodes of the same tasks (every method of
a run draws the same tasks each iteration), then an SFT step on the action tokens of those whose
final reward reaches ``rl.rft_threshold`` (:func:`rft_batch`). A demonstration method
(``rl.demos``, :mod:`agent_r1.algorithms.demos`) acts through its hooks: more episodes after the
rollout, a step after the update, its state at the end of the iteration.

With ``eval.every`` the trainer draws the held-out curve: at iteration 0 (the start model), every
``eval.every`` iterations and at the last, greedy episodes on the same held-out tasks
(:func:`~agent_r1.run.curve_tasks`), logged as ``heldout/<metric>`` against episodes seen.
"""

from __future__ import annotations

import json
import logging
import shutil
import statistics
import time
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from agent_r1.algorithms import AdvantageInputs, get_advantage, make_demo_method
from agent_r1.algorithms.demos import mark_members, sampled
from agent_r1.config import RFT, ConfigError, HealthConfig, RLConfig, RunConfig, parse_method, val_hint
from agent_r1.context import ContextManager
from agent_r1.envs.metrics import aggregate
from agent_r1.data.synthetic import load_split
from agent_r1.learner import Learner, ValueModel
from agent_r1.learner.distributed import all_reduce, any_rank, gathered, is_main
from agent_r1.memory import peak_rss_gb, release_freed, rss_gb
from agent_r1.models import load_model
from agent_r1.pipeline import health
from agent_r1.pipeline.ahead import RolloutsAhead, iteration_generator
from agent_r1.pipeline.curriculum import Curriculum
from agent_r1.pipeline.ranks import rollout_shards
from agent_r1.pipeline.record import NULL_LOG, StageLog
from agent_r1.pipeline.runner import DIRECT, Runner
from agent_r1.pipeline.state import (checkpoint_dir, fingerprint, history_path, is_complete,
                                     mark_complete, record_settings, resumable, save_state, trained_with, write_json)
from agent_r1.progress import Progress
from agent_r1.rollout import EngineDied, RolloutEngine, SamplingParams, run_episodes
from agent_r1.rollout.build import make_engine
from agent_r1.run import Agent, curve_agent, curve_tasks, demo_pool, heldout_point, make_tools, tasks_for
from agent_r1.sft import demonstration
from agent_r1.tracking import is_registry_uri
from agent_r1.trajectory import TrainBatch, Trajectory, collate, save_parquet, to_sequences
from agent_r1.transcripts import transcripts

log = logging.getLogger(__name__)


# ------------------------------------------------------------------------------ the phases
# One function per phase of an RL iteration. RLTrainer.step calls them through a Runner: directly,
# or (the Prefect flow) as tasks named after them.
def sample_episodes(trainer: "RLTrainer") -> list[Trajectory]:
    """This iteration's tasks (``tasks_per_iteration``, drawn with the iteration's own generator,
    :func:`~agent_r1.pipeline.ahead.iteration_generator`: every method of a run, and a resumed run,
    draws the same tasks at the same iteration, whatever its updates draw) and
    ``group_size`` sampled episodes of each; episodes of one task share a group id. With N ranks,
    this rank's shards of the tasks (:func:`~agent_r1.pipeline.ranks.rollout_shards`). A rollout
    engine that dies is restarted once and the batch retried with the same seeds
    (:func:`_with_one_restart`). With ``rl.max_staleness`` ≥ 1 the episodes were sampled ahead, while
    the learner updated (:mod:`agent_r1.pipeline.ahead`): this waits for them."""
    cfg = trainer.cfg
    trainer.t_start = time.perf_counter()
    if cfg.max_staleness:
        got = trainer.rollouts_ahead().take(trainer.iteration)
        trainer.batch_tasks, trainer.rollout_s, trainer.engine_stats = got.tasks, got.rollout_s, got.engine_stats
        trainer.rollout_wait_s = time.perf_counter() - trainer.t_start
        return got.trajs
    trainer.batch_tasks = _draw_tasks(trainer, iteration_generator(trainer.seed, trainer.iteration))
    rng = torch.get_rng_state()

    def run() -> list[Trajectory]:  # this rank's shards of the batch (all of it in one process), from the same seeds
        torch.set_rng_state(rng)
        trajs = rollout_shards(lambda part: _episodes(trainer, part), trainer.batch_tasks, cfg.rollout_shards)
        return trajs + (_demo_episodes(trainer, trajs) if trainer.demos is not None else [])

    trajs = _with_one_restart(trainer, run)
    for t in trajs:
        t.policy_version = trainer.iteration
    trainer.engine_stats = trainer.engine.stats()
    trainer.rollout_s = trainer.rollout_wait_s = time.perf_counter() - trainer.t_start
    return trajs


def _episodes(trainer: "RLTrainer", tasks: list[dict], generator: torch.Generator | None = None) -> list[Trajectory]:
    """``group_size`` episodes of each task, a group per task, with seeds drawn from ``generator``
    (None: torch's global generator)."""
    cfg = trainer.cfg
    params = SamplingParams(cfg.temperature, cfg.top_p, trainer.max_new_tokens, generator)
    reps = [t for t in tasks for _ in range(cfg.group_size)]
    groups = [i for i in range(len(tasks)) for _ in range(cfg.group_size)]
    return run_episodes(trainer.engine, trainer.make_env, reps, trainer.context, params, groups,
                        trainer.max_context_tokens)


def _demo_episodes(trainer: "RLTrainer", trajs: list[Trajectory]) -> list[Trajectory]:
    """The demonstration method's episodes for this rank's groups (:meth:`DemoMethod.episodes`),
    sampled like the others."""
    cfg = trainer.cfg
    params = SamplingParams(cfg.temperature, cfg.top_p, trainer.max_new_tokens)
    tasks = {str(t["id"]): t for t in trainer.batch_tasks}
    return trainer.demos.episodes(trajs, lambda ids, groups, prefixes: run_episodes(
        trainer.engine, trainer.make_env, [tasks[i] for i in ids], trainer.context, params, groups,
        trainer.max_context_tokens, prefixes=prefixes))


def _sample_ahead(trainer: "RLTrainer", j: int, generator: torch.Generator) -> tuple[list[Trajectory], list[dict]]:
    """Iteration ``j``'s tasks and episodes for :class:`~agent_r1.pipeline.ahead.RolloutsAhead`, both
    drawn from ``generator`` (the iteration's own)."""
    tasks = _draw_tasks(trainer, generator)
    return _episodes(trainer, tasks, generator), tasks


def _draw_tasks(trainer: "RLTrainer", generator: torch.Generator) -> list[dict]:
    """``tasks_per_iteration`` of the trainer's tasks, drawn without replacement with ``generator``
    (with ``rl.curriculum`` on, weighted by it: :class:`~agent_r1.pipeline.curriculum.Curriculum`)."""
    k = trainer.cfg.tasks_per_iteration
    if trainer.curriculum is not None:
        return [trainer.tasks[i] for i in trainer.curriculum.draw(k, generator)]
    pick = torch.randperm(len(trainer.tasks), generator=generator)[:k].tolist()
    return [trainer.tasks[i] for i in pick]


def _with_one_restart(trainer: "RLTrainer", run) -> list[Trajectory]:
    """``run()``; when the engine dies (:class:`EngineDied`) on any rank, every rank restarts it
    together (rank 0 restarts the one server) and the ranks whose rollout died run it again (``run``
    samples from the same seeds each time). A second death, on any rank, ends the run on every
    rank."""
    died = None
    try:
        trajs = run()
    except EngineDied as e:
        trajs, died = [], e
    if not any_rank(died is not None):
        return trajs
    log.warning("RL %s: the rollout engine died (%s); restarting it and retrying the batch", trainer.method,
                died or "on another rank")
    trainer.engine.restart()
    again = None
    if died is not None:
        try:
            trajs = run()
        except EngineDied as e:
            again = e
    if any_rank(again is not None):
        where = f"; the last resumable state is {trainer.files.state}: run the same command again to resume" \
            if trainer.files is not None else ""
        raise RuntimeError(f"the rollout engine died twice in iteration {trainer.iteration + 1} "
                           f"({again or 'on another rank'}){where}") from again
    return trajs


def build_train_batch(learner: Learner, trajs: list[Trajectory], cfg: RLConfig, pad_id: int, exact: bool = True) -> TrainBatch:
    """The trajectories packed into a :class:`~agent_r1.trajectory.TrainBatch` with what the
    update needs: the critic's values, advantages and returns (from the estimator
    ``cfg.algorithm`` with its ``cfg.advantage_settings``), the policy's log-probs before the
    update and the reference's.

    Episodes that an environment error ended (``stop_reason="env_error"``) have no true reward
    and are left out; if that leaves none, the environment is broken and this raises. With
    ``cfg.process_rewards`` off the step rewards are left out: the final reward alone is trained on.
    ``cfg.dynamic_sampling`` zeroes the loss mask of the groups whose advantages are all 0 (:func:`_drop_flat_groups`);
    ``cfg.overlong_filter`` that of the episodes that ended for its reasons.
    Their counts (every rank's) go to ``batch.info``, and so does, when the environment gives state keys
    (``Step.state_key``), the share of steps that start from a state another step of their group starts from
    (``rollout/shared_state_steps``: the steps gigpo's step advantage can compare).
    Episodes sampled ahead (``cfg.max_staleness``) or by an engine that is not ``exact`` (:attr:`RolloutEngine.exact`)
    carry their sampling log-probs as the behaviour the off-policy correction weighs by. For ``rft``: :func:`rft_batch`."""
    trajs = [t for t in trajs if t.stop_reason != "env_error"]
    if not trajs:
        raise RuntimeError("every episode of the batch ended with an environment error (see the log)")
    if cfg.algorithm == RFT:
        return rft_batch(trajs, cfg, pad_id)
    if not cfg.process_rewards:  # the final reward alone (the episodes keep their step rewards, for the logs)
        trajs = [replace(t, steps=[replace(s, reward=0.0) for s in t.steps]) for t in trajs]
    info = {}
    keyed = Counter((t.group_id, s.state_key) for t in trajs for s in t.steps if s.state_key is not None)
    shared, n = all_reduce([sum(c for c in keyed.values() if c > 1), keyed.total()])  # every rank, keyed steps or not
    if n:
        info["rollout/shared_state_steps"] = shared / n
    # episode id = the trajectory's index on this rank: a rank holds whole groups (rollout_shards)
    batch = collate([s for i, t in enumerate(trajs) for s in to_sequences(t, i)], pad_id, cfg.loss_mask, cfg.adv_mask)
    batch.info = info
    mark_members(batch, trajs)  # a demonstration in its group: trained on, never counted as sampled
    if cfg.overlong_filter:
        cut = torch.tensor([t.stop_reason in cfg.overlong_filter for t in trajs])
        batch.loss_mask = batch.loss_mask * ~cut[batch.episode_ids][:, None]
        n_cut, n = all_reduce([float(cut.sum()), len(trajs)])
        info["dapo/overlong_episodes"] = n_cut / n
    if cfg.max_staleness or not exact:  # sampled ahead, or with other numbers: the update corrects for it
        batch.behaviour_logprobs = batch.sample_logprobs
    values = learner.values(batch) if learner.critic is not None else None
    inputs = AdvantageInputs(token_rewards=batch.token_rewards, mask=batch.adv_mask, group_ids=batch.group_ids,
                             values=values, step_ids=batch.step_ids, episode_ids=batch.episode_ids,
                             anchor_ids=batch.anchor_ids, step_rewards=batch.step_rewards, gamma=cfg.gamma, lam=cfg.lam,
                             reduce=all_reduce)  # batch whitening's statistics: over every rank's rows
    # computed in float64 (the batch's rewards), trained on in float32
    batch.advantages, batch.returns = (x.float() for x in get_advantage(cfg.algorithm)(inputs, **cfg.advantage_settings))
    if cfg.dynamic_sampling:
        _drop_flat_groups(batch)
    batch.old_values = values
    # old log-probs only where the update will need them (rows that can carry a gradient), and
    # not at all when the update is a single step: then they are the update's own, detached
    if not learner.single_step:
        batch.old_logprobs = learner.logprobs(batch, rows=learner.policy_rows(batch))
    if learner.reference is not None and learner.cfg.kl_coef > 0:
        batch.ref_logprobs = learner.logprobs(batch, learner.reference)
    return batch


def _drop_flat_groups(batch: TrainBatch) -> None:
    """DAPO's dynamic sampling (``rl.dynamic_sampling``): the groups whose advantages are 0 on every token (with the
    estimators the config allows it for, exactly the groups whose episodes all got the same reward) get loss mask 0,
    unless every group of every rank is such a group. Decided on every rank's counts, so N ranks drop what one
    process drops; their share is ``batch.info["dapo/zero_variance_groups"]``."""
    _, group = torch.unique(batch.group_ids, return_inverse=True)
    signal = torch.zeros(int(group.max()) + 1).index_add_(0, group, (batch.advantages != 0).any(1).float()) > 0
    n_flat, n_groups = all_reduce([float((~signal).sum()), float(len(signal))])
    batch.info["dapo/zero_variance_groups"] = n_flat / n_groups
    if n_flat < n_groups:
        batch.loss_mask = batch.loss_mask * signal[group][:, None]


def rft_kept(t: Trajectory, cfg: RLConfig) -> bool:
    """Rejection sampling: an episode RFT fine-tunes on (final reward ≥ ``rl.rft_threshold``)."""
    return t.stop_reason != "env_error" and t.final_reward >= cfg.rft_threshold


def rft_batch(trajs: list[Trajectory], cfg: RLConfig, pad_id: int) -> TrainBatch:
    """RFT's batch: every episode packed, the loss mask kept on the action tokens of the kept ones
    (:func:`rft_kept`) and cleared on the rest, so the update (:meth:`Learner.sft_step`) is the SFT
    step on the kept episodes' action tokens, normalised over them."""
    seqs = [(s, rft_kept(t, cfg)) for i, t in enumerate(trajs) for s in to_sequences(t, i)]
    batch = collate([s for s, _ in seqs], pad_id, cfg.loss_mask, cfg.adv_mask)
    batch.loss_mask = batch.loss_mask * torch.tensor([keep for _, keep in seqs], dtype=batch.loss_mask.dtype)[:, None]
    return batch


def update_policy(trainer: "RLTrainer", batch: TrainBatch) -> dict:
    """The learner's update (with its throughput: tokens of the rows it ran per s), then its new
    weights to the engine (a vLLM server; nothing to do for an engine that shares the learner's
    weights). An engine that dies in the sync is restarted once and synced again. With
    ``rl.max_staleness`` ≥ 1 the weights are written and handed to the rollout thread, which loads
    them between two batches."""
    t0 = time.perf_counter()
    update = _rft_update(trainer.learner, batch) if trainer.cfg.algorithm == RFT else trainer.learner.update(batch, trainer.rng)
    stats = batch.info | update
    stats["train_tokens_per_s"] = stats["update/tokens"] / max(time.perf_counter() - t0, 1e-9)
    if trainer.demos is not None:  # e.g. relift's SFT step, before the weights reach the engine
        stats |= trainer.demos.after_update(trainer.learner, trainer.iteration + 1, trainer.tokenizer.pad_token_id)
    if trainer.cfg.max_staleness:  # the rollout thread loads them before its next batch
        t0 = time.perf_counter()
        path = trainer.engine.new_weights_path()
        try:
            trainer.write_weights(path)
        except BaseException:
            shutil.rmtree(path.parent, ignore_errors=True)
            raise
        trainer.rollouts_ahead().publish(path, trainer.iteration + 1)
        stats["time/weight_write_s"] = time.perf_counter() - t0
        return stats
    try:
        sync_s = trainer.engine.sync_weights(trainer.write_weights)
    except EngineDied as e:
        log.warning("RL %s: the rollout engine died during the weight sync (%s); restarting it", trainer.method, e)
        trainer.engine.restart()
        sync_s = trainer.engine.sync_weights(trainer.write_weights)
    if sync_s:
        stats["time/weight_sync_s"] = sync_s
    return stats


def _rft_update(learner: Learner, batch: TrainBatch) -> dict:
    """RFT's update: one SFT step on this rank's kept rows (plain NLL on their action tokens: no
    ratio, no clipping, no KL), the only rows it runs; none when no rank kept an episode."""
    kept = batch.loss_mask.sum(1) > 0
    tokens = float(batch.attention_mask[kept].sum())
    if not any_rank(bool(kept.any())):
        return {"update/tokens": 0}
    stats = learner.sft_step(batch, rows=kept.nonzero().squeeze(1))
    return {"rft/nll": stats["sft_loss"], "update/tokens": int(all_reduce([tokens])[0])}


def end_iteration(trainer: "RLTrainer", trajs: list[Trajectory], stats: dict) -> dict:
    """Record the iteration's metrics (of every rank's episodes); add a point to the held-out
    curve when one is due (:meth:`RLTrainer.heldout_point`), then the run's health alarms
    (:mod:`~agent_r1.pipeline.health`, which compare the training reward with the held-out one);
    save a resumable state every ``rl.checkpoint_every``."""
    trajs = gathered(trajs)
    staleness = [trainer.iteration - t.policy_version for t in trajs]  # versions behind the learner it trained
    if max(staleness) > trainer.cfg.max_staleness:
        raise AssertionError(f"iteration {trainer.iteration + 1} trained on episodes {max(staleness)} versions old "
                             f"(rl.max_staleness: {trainer.cfg.max_staleness})")
    trainer.iteration += 1
    it, cfg = trainer.iteration, trainer.cfg
    every, trajs = trajs, sampled(trajs)  # the policy's own episodes: no demonstration in them
    if trainer.demos is not None:
        stats = {**stats, **trainer.demos.after_iteration(every)}
    if trainer.curriculum is not None:
        stats = {**stats, **trainer.curriculum.update(trajs)}
    stats = {**stats, **rollout_stats(trajs), **{f"rollout/{k}": v for k, v in trainer.engine_stats.items()},
             "rollout/staleness_mean": statistics.fmean(staleness), "rollout/staleness_max": max(staleness),
             "iteration": it, "time/rollout_s": trainer.rollout_s, "time/rollout_wait_s": trainer.rollout_wait_s,
             "time/iteration_s": time.perf_counter() - trainer.t_start,
             # the update's freed activations back to the OS first: rss_gb is what the run holds between updates
             "memory/released_gb": release_freed(), "memory/rss_gb": rss_gb(), "memory/peak_rss_gb": peak_rss_gb()}
    if cfg.algorithm == RFT:
        stats["rft/kept_fraction"] = sum(rft_kept(t, cfg) for t in trajs) / len(trajs)
    start = [p for p in trainer.curve if p["iteration"] == 0 and "reward" in p] if it == 1 else []
    if start:  # the start model's held-out reward: the alarms' first held-out point (this iteration sampled from it)
        stats[health.HELDOUT_START] = start[0]["reward"]
    if trainer.curve_due():  # logged at step = episodes seen; the history keeps the held-out reward for health
        point = trainer.heldout_point(stats["time/iteration_s"])
        if "reward" in point:
            stats[health.HELDOUT_REWARD] = point["reward"]
    if trainer.curve:  # the held-out points' share of the RL stage so far (docs/running.md)
        heldout_s = sum(p.get("eval_s", 0.0) for p in trainer.curve)
        rl_s = sum(h["time/iteration_s"] for h in trainer.history) + stats["time/iteration_s"]
        stats["time/heldout_share"] = heldout_s / max(heldout_s + rl_s, 1e-9)
    stats = health.watch(trainer.history, stats, trajs, trainer.health, trainer.log)
    trainer.history.append(stats)
    trainer.log.metrics({k: v for k, v in stats.items() if k not in (health.HELDOUT_REWARD, health.HELDOUT_START)}, it)
    if it == 1 or it % (5 * cfg.checkpoint_every) == 0:  # a sample of the rollouts, to read and to replay
        trainer.log.text(transcripts(every, trainer.batch_tasks, limit=4), f"rollouts/iteration_{it:05d}.md")
        if trainer.files is not None and is_main():
            save_parquet(every, trainer.files.rollouts / f"iteration_{it:05d}.parquet")
    if trainer.files is not None and it % cfg.checkpoint_every == 0 and not trainer.done:
        client = {"step": it, "history": trainer.history, "curve": trainer.curve, "rng": trainer.rng.get_state(),
                  "torch_rng": torch.get_rng_state(), "curriculum": trainer.curriculum and trainer.curriculum.state(),
                  "demos": trainer.demos and trainer.demos.state()}
        save_state(trainer.learner, trainer.files.state, trainer.files.fingerprint, client)
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
        "env_errors": sum(t.stop_reason == "env_error" for t in trajs) / len(trajs),
    }


# ------------------------------------------------------------------------------ methods
def rl_methods(cfg: RunConfig) -> list[str]:
    """The RL methods the pipeline trains: ``methods`` (a comparison) or just ``rl.algorithm``."""
    return list(cfg.methods) or [cfg.rl.method]


def for_method(cfg: RunConfig, method: str) -> RunConfig:
    """The config that trains ``method`` (its estimator, masks, process rewards and demonstration
    method: :func:`~agent_r1.config.parse_method`; everything else shared)."""
    return cfg.model_copy(update={"rl": cfg.rl.model_copy(update=parse_method(method))})


# ------------------------------------------------------------------------------ the driver
CURVE_KEYS = ("eval.every", "eval.curve_size", "eval.curve_split", "eval.temperature")  # what shapes the curve


def curve_path(cfg: RunConfig, method: str) -> Path:
    """A method's held-out curve: its points (``[]`` without ``eval.every``)."""
    return cfg.out / "metrics" / "heldout" / f"{method}.json"


@dataclass(frozen=True)
class RLFiles:
    """Where a pipeline's RL run writes: the agent, the per-iteration metrics, the resumable
    state, some iterations' rollouts (parquet, :func:`~agent_r1.trajectory.load_parquet`), the
    held-out curve's points, and the fingerprint of the config they belong to."""

    checkpoint: Path
    history: Path
    state: Path
    rollouts: Path
    fingerprint: str
    curve: Path | None = None
    settings: dict | None = None  # what the agent records it was trained with (state.trained_with)

    @classmethod
    def of(cls, cfg: RunConfig) -> "RLFiles":
        method = cfg.rl.method
        return cls(checkpoint_dir(cfg, method), history_path(cfg, method), cfg.out / "state" / f"rl_{method}",
                   cfg.out / "rollouts" / method, fingerprint(cfg, "data", "model", "env", "sft", "rl", *CURVE_KEYS),
                   curve_path(cfg, method), trained_with(cfg))

    def complete(self) -> bool:
        """Finished before under this config (then a re-run skips it)."""
        return is_complete(self.checkpoint, self.fingerprint) and self.history.exists()


class RLTrainer:
    """The RL iterations, one at a time (:meth:`step` is one iteration of the phase functions
    above, :meth:`run` all of them): the state the phases share.

    ``learner`` trains the policy that ``engine`` samples from (an :class:`HFEngine` shares the
    learner's weights; a vLLM engine gets a copy of them at every sync, after each update);
    ``make_env()`` gives a fresh environment per episode; each iteration samples
    ``cfg.tasks_per_iteration`` of ``tasks`` (a task without an ``"id"`` is named by its index),
    with a generator of its own seeded by ``seed`` and the iteration, and ``cfg.group_size``
    episodes of each; the trainer's generator (seeded by ``seed``) draws the updates'
    mini-batches. With ``files``, every
    ``cfg.checkpoint_every`` iterations the learner state, RNG and history are saved
    atomically, constructing the trainer again resumes from there, and :meth:`finish` writes
    the agent and its metrics. ``health`` holds the thresholds of the run's alarms. ``demo_pool``:
    the ids of the tasks whose demonstrations the demonstration method may use (None: every task's).

    ``heldout(progress, label)`` gives one point of the held-out curve (a dict of metrics: see
    :func:`~agent_r1.run.heldout_point`), taken at iteration 0, every ``every`` iterations and at
    the last; the points (:attr:`curve`) resume with the rest.
    """

    def __init__(self, learner: Learner, engine: RolloutEngine, make_env, tasks: list[dict], context: ContextManager,
                 cfg: RLConfig, *, max_new_tokens: int, max_context_tokens: int | None = None, seed: int = 0,
                 stage_log: StageLog = NULL_LOG, files: RLFiles | None = None, heldout=None, every: int = 0,
                 health: HealthConfig = HealthConfig(), demo_pool: set[str] | None = None):
        if cfg.algorithm != RFT and get_advantage(cfg.algorithm).needs_critic and learner.critic is None:
            raise ValueError(f"estimator {cfg.algorithm!r} needs a critic: give the Learner critic=ValueModel(...)")
        if not tasks:
            raise ValueError("RLTrainer: no tasks to train on")
        tasks = [t if "id" in t else {**t, "id": str(i)} for i, t in enumerate(tasks)]  # one id per task, everywhere
        self.learner, self.engine, self.make_env, self.tasks, self.context = learner, engine, make_env, tasks, context
        self.cfg, self.log, self.files, self.health = cfg, stage_log, files, health
        self.max_new_tokens, self.max_context_tokens = max_new_tokens, max_context_tokens
        self.method = cfg.method
        self.tokenizer = context.tokenizer
        self.rng = torch.Generator().manual_seed(seed)
        torch.manual_seed(seed)
        self.iteration, self.history, self.curve = 0, [], []
        self.heldout, self.every = heldout, every if heldout is not None else 0
        self.progress: Progress | None = None  # run()'s, for the held-out points' progress lines
        self.curriculum = Curriculum(len(tasks), cfg.curriculum) if cfg.curriculum.enabled else None
        self.demos = None  # the demonstration method (rl.demos), with the oracle demonstration of demo_pool's tasks
        if cfg.demos:
            by_id = {str(t["id"]): t for t in tasks}
            self.demos = make_demo_method(cfg.demos, lambda task_id: demonstration(make_env(), by_id[task_id], context),
                                          cfg.demo_settings, demo_pool, by_id)
        if files is not None and resumable(files.state, files.fingerprint):
            client = self.learner.load_state(files.state)
            self.iteration, self.history, self.curve = client["step"], client["history"], client.get("curve", [])
            if self.curriculum is not None and client.get("curriculum"):
                self.curriculum.load(client["curriculum"])
            if self.demos is not None and client.get("demos"):
                self.demos.load(client["demos"])
            self.rng.set_state(client["rng"])
            torch.set_rng_state(client["torch_rng"])
            log.info("RL %s: resuming after iteration %d of %d from %s", self.method, self.iteration, cfg.iterations,
                     files.state)
            self.engine.sync_weights(self.write_weights)  # the engine started from the start model
        elif engine.syncs_at_start:  # a server run elsewhere serves whatever it was given last
            self.engine.sync_weights(self.write_weights)
        self.seed = seed
        self.batch_tasks: list[dict] = []  # this iteration's tasks
        self.t_start, self.rollout_s = time.perf_counter(), 0.0  # this iteration's start, its rollout's time
        self.rollout_wait_s = 0.0  # how long the iteration waited for its rollout (less than it took, when ahead)
        self.engine_stats: dict = {}  # the rollout engine's counters of this iteration's rollout
        self._ahead = None  # the rollout thread (rl.max_staleness ≥ 1), started by the first rollout

    @classmethod
    def from_config(cls, cfg: RunConfig, stage_log: StageLog = NULL_LOG, tracker=None) -> "RLTrainer":
        """The pipeline's RL run: the start model (``rl.init_from`` or ``checkpoints/sft``), a
        reference when ``kl_coef > 0``, a critic when the estimator needs one, the training
        questions of ``rl.hops`` / ``rl.qtypes``; resumes from ``state/`` when it can."""
        data_dir = cfg.out / "data"
        train_df = load_split(data_dir, "train")
        tasks = tasks_for(train_df, cfg.rl.hops, seed=cfg.seed, qtypes=cfg.rl.qtypes)
        if not tasks:  # before any model loads
            raise ConfigError(f"rl.hops / rl.qtypes: no training questions with rl.hops={cfg.rl.hops} or "
                              f"rl.qtypes={cfg.rl.qtypes} in {cfg.data.path or 'the data'}")
        start = start_path(cfg, tracker)
        model, tokenizer = load_model(start)
        agent = Agent(model, tokenizer, make_tools(cfg, data_dir), cfg)
        lc, rft = cfg.rl.learner, cfg.rl.algorithm == RFT
        reference = load_model(start)[0] if lc.kl_coef > 0 and not rft else None
        critic = ValueModel(load_model(start)[0]) if not rft and get_advantage(cfg.rl.algorithm).needs_critic else None
        learner = Learner(model, lc, reference=reference, critic=critic, precision=cfg.model.precision)
        heldout = None
        if cfg.eval.every and not cfg.curve_every:
            log.warning("eval.every: no held-out curve: the data has no val split (%s, or set eval.curve_split)",
                        val_hint(cfg))
        if cfg.curve_every:
            held, held_agent = curve_tasks(cfg), curve_agent(agent, cfg)
            heldout = lambda progress, label: heldout_point(held_agent, held, progress, label)  # noqa: E731
        never = [name for name, it in health.first_chances(cfg).items() if it is None]
        if never:
            log.info("RL %s: health alarms that cannot be raised in %d iterations: %s (docs/health.md)", cfg.rl.method,
                     cfg.rl.iterations, ", ".join(never))
        engine = make_engine(cfg, model, tokenizer, start)
        try:
            return cls(learner, engine, agent.make_env, tasks, agent.context(), cfg.rl,
                       max_new_tokens=cfg.env.max_new_tokens, max_context_tokens=cfg.env.max_context_tokens,
                       seed=cfg.seed, stage_log=stage_log, files=RLFiles.of(cfg), heldout=heldout, every=cfg.curve_every,
                       health=cfg.health, demo_pool=demo_pool(cfg, train_df) if cfg.rl.demos else None)
        except BaseException:
            engine.close()
            raise

    @property
    def done(self) -> bool:
        return self.iteration >= self.cfg.iterations

    def curve_due(self) -> bool:
        """A held-out point is due at this iteration (0, every ``every``, the last) and not taken yet."""
        it = self.iteration
        due = self.every and (it % self.every == 0 or it == self.cfg.iterations)
        return bool(due) and not any(p["iteration"] == it for p in self.curve)

    def heldout_point(self, current_s: float = 0.0) -> dict:
        """Evaluate the held-out curve's tasks now; log the point (``heldout/<metric>`` at step =
        episodes seen, with ``heldout/iteration`` and ``heldout/wall_s``: the training time so far,
        the curve's own time left out) and keep it in :attr:`curve`."""
        it = self.iteration
        metrics = self.heldout(self.progress, f"heldout {self.method} @ iteration {it}")
        point = {"iteration": it, "episodes": it * self.cfg.tasks_per_iteration * self.cfg.group_size,
                 "wall_s": sum(h["time/iteration_s"] for h in self.history) + current_s, **metrics}
        self.curve.append(point)
        self.log.metrics({f"heldout/{k}": v for k, v in point.items() if k != "episodes"}, point["episodes"])
        shown = ", ".join(f"{k} {metrics[k]:.3f}" for k in ("em", "won", "reward") if k in metrics)
        log.info("RL %s: held-out point at iteration %d (%d episodes): %s", self.method, it, point["episodes"], shown)
        return point

    def write_weights(self, folder: Path) -> None:
        self.learner.save(folder, self.tokenizer)

    def rollouts_ahead(self):
        """The rollout thread of ``rl.max_staleness`` ≥ 1 (started at the first call), sampling from
        this iteration on."""
        if self._ahead is None:
            self._ahead = RolloutsAhead(self.engine, lambda j, g: _sample_ahead(self, j, g), self.iteration,
                                        self.cfg.iterations, self.cfg.max_staleness, self.seed)
        return self._ahead

    def close(self) -> None:
        """Stop the rollout thread (its requests in flight aborted) and release the engine (stop a
        vLLM server this run started)."""
        try:
            if self._ahead is not None:
                self._ahead.close()
        finally:
            self.engine.close()

    def step(self, runner: Runner = DIRECT) -> dict:
        """One RL iteration; returns its metrics."""
        trajs = runner.phase(self, sample_episodes, self)
        batch = runner.phase(self, build_train_batch, self.learner, trajs, self.cfg, self.tokenizer.pad_token_id,
                             self.engine.exact)
        return runner.phase(self, end_iteration, self, trajs, runner.phase(self, update_policy, self, batch))

    def finish(self) -> Path | None:
        """Write the agent, its per-iteration metrics and the complete marker (with ``files``)."""
        if self.files is None:
            return None
        out = self.learner.save(self.files.checkpoint, self.tokenizer)
        if self.files.settings is not None:
            record_settings(out, self.files.settings)
        write_json(self.files.history, self.history)
        if self.files.curve is not None:
            write_json(self.files.curve, self.curve)
        mark_complete(out, self.files.fingerprint)
        self.log.curves(self.history, ["reward_mean", "em", "won", "tool_calls", "policy/entropy", "policy/kl"], "curves.png")
        if is_main():
            shutil.rmtree(self.files.state, ignore_errors=True)
        return out

    def run(self, progress: Progress | None = None, runner: Runner = DIRECT) -> Path | None:
        """Every remaining iteration, then :meth:`finish`."""
        total = self.cfg.iterations
        self.progress = progress
        if self.curve_due():  # iteration 0: the start model
            self.heldout_point()
        with (progress or Progress.null()).task(f"rl {self.method}", total=total) as report:
            report(f"iteration {self.iteration}/{total}", self.iteration / max(total, 1))
            while not self.done:
                s = self.step(runner)
                shown = ", ".join(f"{k.replace('_', ' ')} {s[k]:.3f}" for k in ("em", "won", "tool_calls", "turns") if k in s)
                report(f"iteration {self.iteration}/{total}, reward {s['reward_mean']:.3f}, {shown}", self.iteration / max(total, 1))
        return runner.stage("rl-finish", RLTrainer.finish, self)


def start_path(cfg: RunConfig, tracker=None) -> str:
    """RL's starting model folder: ``rl.init_from`` (a folder or ``models:/...``) or ``checkpoints/sft``."""
    src = cfg.rl.init_from or str(checkpoint_dir(cfg, "sft"))
    if is_registry_uri(src):
        if tracker is None:
            raise ValueError(f"rl.init_from={src!r} needs MLflow tracking to resolve")
        src = str(tracker.load_agent(src, cfg.out / "state" / "init_model"))
    if not Path(src, "config.json").exists():
        raise FileNotFoundError(f"RL start model {src} not found: run the sft stage first (or set rl.init_from)")
    return src


# ------------------------------------------------------------------------------ the stage
def train(cfg: RunConfig, stage_log: StageLog = NULL_LOG, progress: Progress | None = None, tracker=None,
          methods: list[str] | None = None, runner: Runner = DIRECT) -> list[Path]:
    """RL from the SFT checkpoint (or ``rl.init_from``) for each method (default
    :func:`rl_methods`); writes ``rl/<method>``. A method finished before under the same
    config is skipped. A comparison (``methods``) gets one nested MLflow run per method."""
    out = []
    for method in methods or rl_methods(cfg):
        mcfg = for_method(cfg, method)
        files = RLFiles.of(mcfg)
        if files.complete():  # e.g. a re-run after a crash in a later stage
            log.info("rl: %s is up to date for this config; skipping", files.checkpoint)
            out.append(files.checkpoint)
            continue
        mlog = stage_log.child(method) if cfg.methods else stage_log
        trainer = runner.stage("rl-setup", RLTrainer.from_config, mcfg, mlog, tracker)
        try:
            out.append(trainer.run(progress, runner))
        finally:
            trainer.close()
        if mlog is not stage_log:
            mlog.end()
    return out


def matched_method(cfg: RunConfig) -> str:
    """The RL method the SFT-only control is matched with (its training time, its held-out curve)
    and the register stage registers: ``rl.algorithm``'s when the pipeline trains it, else the
    first of ``methods``."""
    methods = rl_methods(cfg)
    return cfg.rl.method if cfg.rl.method in methods else methods[0]


def rl_seconds(cfg: RunConfig) -> float:
    """The training time of :func:`matched_method`: its iterations' recorded wall time (also right
    when the train stage was skipped as complete, or resumed)."""
    method = matched_method(cfg)
    path = history_path(cfg, method)
    if not path.exists():
        raise ConfigError(f"the SFT-only control trains for RL's training time, but {method} has no training record "
                          f"({path}): train it first, or give the control its time (agent-r1 control --seconds)")
    return sum(h["time/iteration_s"] for h in json.loads(path.read_text()))
