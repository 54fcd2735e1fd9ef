"""Cold start: supervised fine-tuning on oracle demonstrations.

RL cannot discover tool use from random weights. The environment's oracle writes the
demonstration (``ToolEnv.oracle_turns``; for multi-hop QA: one search per entity on the
question's search chain, then the answer), played through the environment so that the real
tools write the observations (real BM25 results). Demonstrations are tokenized
the same way rollouts are (the context manager renders prompts and observations), packed with
the same code, and only the assistant turns carry loss.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from agent_r1.context import ContextManager
from agent_r1.trajectory import Step, Trajectory, collate, to_sequences


def oracle_episode(env, task: dict) -> tuple[list[dict], list[tuple[str, list[dict]]]]:
    """The opening messages and the (assistant text, observation messages) turns of the
    environment's oracle for `task` (``env.oracle_turns``), played through ``env.step`` so the
    real tools write the observations; no turns when the environment has no oracle for it."""
    messages, played = _played_oracle(env, task)
    return messages, [(text, res.observation) for text, res in played]


def _played_oracle(env, task: dict) -> tuple[list[dict], list[tuple[str, object]]]:
    """The opening messages and the (assistant text, ``EnvStep``) of each oracle turn played."""
    messages = env.reset(task)
    played = []
    for text in env.oracle_turns(task) or []:
        res = env.step(text)
        played.append((text, res))
        if res.done:
            break
    return messages, played


def demonstration(env, task: dict, context: ContextManager) -> Trajectory | None:
    """One oracle episode (:func:`oracle_episode`) tokenized exactly as a rollout would have
    seen it, with the rewards the environment gave it (step rewards, and the final reward and
    stop reason when the oracle ended the episode); None when the environment has no oracle
    turns for the task."""
    messages, played = _played_oracle(env, task)
    if not played:
        return None
    tok = context.tokenizer
    ctx = context.start(messages)
    traj = Trajectory(task_id=str(task["id"]), group_id=0)
    for text, res in played:
        ids = tok.encode(text, add_special_tokens=False) + [tok.eos_token_id]
        traj.steps.append(Step(context_ids=context.context_ids(ctx), action_ids=ids, action_logprobs=[0.0] * len(ids),
                               action_text=text, observation=res.observation, reward=float(res.reward)))
        if res.observation:
            context.observe(ctx, ids, res.observation)
        if res.done:
            traj.final_reward, traj.stop_reason, traj.answer = float(res.info.final_reward), res.info.stop_reason, res.info.answer
    return traj


def length_grouped_batches(lengths: torch.Tensor, batch_size: int, generator: torch.Generator, window: int = 64) -> list[list[int]]:
    """One epoch's batches: a random permutation, cut into windows of ``window`` batches; inside a
    window rows are sorted by length before being cut into batches, and the batch order is
    shuffled again. Batches hold sequences of similar length (random ones pad ~30% of the
    tokens of the default demonstrations, these <1%), while which sequences share a window
    stays random. A leftover of fewer than ``batch_size`` rows is dropped (fewer rows than
    ``batch_size`` in all make one batch)."""
    perm = torch.randperm(len(lengths), generator=generator)
    if len(perm) < batch_size:
        return [perm.tolist()]
    perm = perm[: len(perm) - len(perm) % batch_size]
    batches = []
    for chunk in perm.split(window * batch_size):
        chunk = chunk[torch.argsort(lengths[chunk], stable=True)]
        batches += [b.tolist() for b in chunk.split(batch_size)]
    return [batches[i] for i in torch.randperm(len(batches), generator=generator).tolist()]


def sft(
    learner,
    demos: list[Trajectory],
    pad_id: int,
    epochs: float,
    batch_size: int,
    lr: float,
    warmup_steps: int = 0,
    seed: int = 0,
    on_step: Callable[[int, int, dict], bool | None] | None = None,
    start_step: int = 0,
) -> list[dict]:
    """Train on ``demos`` for ``epochs`` passes (fractions allowed) in length-grouped batches
    (:func:`length_grouped_batches`); linear warmup, cosine decay. ``on_step(step, total, metrics)``
    is called after every optimizer step; when it returns True training stops there.

    The batch order of every epoch is a fixed function of ``seed`` and the epoch, so a run
    resumed at ``start_step`` (with the optimizer state restored) sees exactly the batches the
    uninterrupted run would have.
    """
    seqs = [s for d in demos for s in to_sequences(d)]
    lengths = torch.tensor([len(s.ids) for s in seqs])
    steps_per_epoch = max(1, len(seqs) // batch_size)
    total = max(1, round(epochs * steps_per_epoch))
    opt = learner.engine.optimizer
    history, batches, epoch = [], None, -1
    for step in range(start_step, total):
        if step // steps_per_epoch != epoch:
            epoch = step // steps_per_epoch
            batches = length_grouped_batches(lengths, batch_size, torch.Generator().manual_seed(seed * 100_003 + epoch))
        rows = batches[step % steps_per_epoch]
        scale = (step + 1) / warmup_steps if step < warmup_steps else 0.5 * (1 + math.cos(math.pi * (step - warmup_steps) / max(1, total - warmup_steps)))
        for group in opt.param_groups:
            group["lr"] = lr * scale
        metrics = learner.sft_step(collate([seqs[r] for r in rows], pad_id))
        history.append(metrics)
        if on_step and on_step(step + 1, total, metrics):
            break
    return history


class Plateau:
    """Early stopping on a validation curve: :meth:`add` one evaluation's score (higher is better)
    at a training step; training stops ``patience`` evaluations after the best one (the first of
    equal scores) unless a later one beats it, or at once when a score reaches the metric's
    ``ceiling`` (nothing can beat it). ``points`` (resumable) holds every evaluation."""

    def __init__(self, patience: int, points: list[dict] | None = None):
        self.patience, self.points = patience, list(points or [])

    @property
    def best(self) -> dict | None:
        """The evaluation with the highest score (the first of equal ones)."""
        return max(self.points, key=lambda p: p["score"], default=None)

    def add(self, step: int, score: float, ceiling: float | None = None, **extra) -> tuple[bool, bool]:
        """Record an evaluation; returns (it is the new best, training should stop now)."""
        self.points.append({"step": step, "score": float(score), **extra})
        best = self.points.index(self.best)
        at_ceiling = ceiling is not None and self.best["score"] >= ceiling
        return best == len(self.points) - 1, at_ceiling or len(self.points) - 1 - best >= self.patience
