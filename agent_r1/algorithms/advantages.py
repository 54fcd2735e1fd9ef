"""Advantage estimators: pure functions from per-token rewards to per-token advantages.

Batches are [B, T], right-padded; each row is one trajectory packed as prompt, then alternating
action tokens (model turns) and observation tokens (tool outputs). Every estimator takes an
`AdvantageInputs` and returns `(advantages, returns)`, both [B, T] and exactly 0 where `mask` is 0.
Rewards are read on masked (action) tokens only: the caller puts the final reward on the last
action token of the trajectory and each step reward on the last action token of its step. A KL
penalty to the reference is not in these rewards: it is a term of the loss (``rl.learner.kl_coef``,
:func:`agent_r1.algorithms.kl_penalty`).

Group baselines (grpo, grpo_no_std, rloo, reinforce_pp_baseline, gigpo) compare EPISODES, not rows.
An episode that is not one prefix chain (a sliding window, summaries) is several rows, one per step,
sharing an `episode_ids` entry; each step row carries its return-to-go (undiscounted) at its last
action token. An episode's score is its total reward (final + step rewards). Group size, mean, std
and leave-one-out are taken over the episodes of a group, and each row gets its episode's
advantage, so a group's baseline does not depend on how many steps its episodes were cut into
(DESIGN.md contract 12).

Ties stay ties. Scores and gigpo's step returns are computed in float64 from `step_rewards`, each
episode's per-step rewards (the same list on each of its rows, from `to_sequences`), summed from
the last step back in one fixed order: episodes with equal step rewards get bit-equal scores and
returns whatever their layout (one prefix-chain row or step rows) and token counts. Group
statistics are taken on the values minus their group's least one, so a group whose values are all
equal gets advantage exactly 0 under every norm. (A float32 sum over a row's tokens is not
layout-free: 0.1 + 0.2 + 0.3 + 0.7 sums to 1.29999995 on a row of 1, 1, 1 action tokens and to
1.30000007 on one of 8, 1, 9, and (x - mean) / (std + 1e-6) makes that 1-ulp spread an advantage
of 0.1.)
Without `step_rewards` the scores are the float64 reward sums of each episode's first row (the
whole trajectory, or the first step's return-to-go), and step rows' step rewards are recovered as
differences of their returns-to-go.

References: GAE — Schulman et al. 2016, "High-Dimensional Continuous Control Using Generalized
Advantage Estimation" (arXiv:1506.02438); GRPO — Shao et al. 2024, "DeepSeekMath" (arXiv:2402.03300);
Dr. GRPO — Liu et al. 2025, "Understanding R1-Zero-Like Training: A Critical Perspective"
(arXiv:2503.20783); RLOO — Ahmadian et al. 2024, "Back to Basics: Revisiting REINFORCE Style
Optimization for Learning from Human Feedback in LLMs" (arXiv:2402.14740), after Kool et al. 2019;
REINFORCE++ — Hu 2025, "REINFORCE++: A Simple and Efficient Approach for Aligning Large Language
Models" (arXiv:2501.03262); GiGPO — Feng et al. 2025, "Group-in-Group Policy Optimization for LLM Agent
Training" (arXiv:2505.10978).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from agent_r1.algorithms.registry import register_advantage


@dataclass
class AdvantageInputs:
    token_rewards: Tensor  # [B,T] float: final + step rewards, on action tokens (KL is a loss term, not here)
    mask: Tensor  # [B,T] float/bool advantage mask: 1 on action tokens, 0 on prompt/observation/pad
    group_ids: Tensor  # [B] long; same id = same task (group baselines)
    values: Tensor | None = None  # [B,T] critic values (gae, step_gae)
    step_ids: Tensor | None = None  # [B,T] long: turn index of each action token, -1 elsewhere
    # [B] long: the episode of each row (its step rows share it); None: each row is an episode
    episode_ids: Tensor | None = None
    # [B,T] long: the state key its step started from, as an id (same id = same state), -1 where none (gigpo)
    anchor_ids: Tensor | None = None
    # [B,S] float64: the reward of each step of the row's episode, the final reward added to its last step's, 0 after
    # it (TrainBatch.step_rewards); None: scores and step returns are read from token_rewards
    step_rewards: Tensor | None = None
    gamma: float = 1.0
    lam: float = 1.0
    eps: float = 1e-6  # floor in the std / variance denominators
    # sums a list of floats over every part of the batch (each rank's: agent_r1.learner.distributed.all_reduce);
    # None: these rows are the whole batch. Batch whitening takes its statistics through it.
    reduce: Callable[[list[float]], list[float]] | None = None


def masked_whiten(x: Tensor, mask: Tensor, eps: float = 1e-6,
                  reduce: Callable[[list[float]], list[float]] | None = None) -> Tensor:
    """`(x - mean) / sqrt(var + eps)` over the masked entries of the whole batch; 0 elsewhere.

    The variance is Bessel-corrected (unbiased, torch's default), and taken as 0 for fewer than
    two masked entries. Mean and variance are taken in float64, in two passes (count and sum, then
    the sum of squared deviations from the mean), each summed over the batch's parts by `reduce`
    (None: `x` is the whole batch); so N ranks, each whitening its rows with an all-reduce, get
    the advantages one process gets over all the rows.
    """
    m = mask.bool()
    reduce = reduce or list
    xd = torch.where(m, x.double(), 0)
    n, total = reduce([float(m.sum()), float(xd.sum())])
    mean = total / max(n, 1.0)
    (sq,) = reduce([float(torch.where(m, (xd - mean) ** 2, 0).sum())])
    var = sq / max(n - 1, 1.0)
    return torch.where(m, (xd - mean) / math.sqrt(var + eps), 0).to(x.dtype)


def _masked_gae(rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float) -> Tensor:
    """GAE along dim 1 that visits only masked positions; 0 at the others.

    The recursion steps from one masked position to the next masked position of the same row,
    so unmasked positions give neither reward nor value, and the value after a row's last masked
    position is 0. With `values = 0, lam = 1` it is the discounted return-to-go.
    """
    adv = torch.zeros_like(rewards)
    next_value = rewards.new_zeros(rewards.shape[0])
    next_adv = rewards.new_zeros(rewards.shape[0])
    for t in reversed(range(rewards.shape[1])):
        m = mask[:, t]
        a = rewards[:, t] + gamma * next_value - values[:, t] + gamma * lam * next_adv
        adv[:, t] = torch.where(m, a, 0)
        next_value = torch.where(m, values[:, t], next_value)
        next_adv = torch.where(m, a, next_adv)
    return adv


def _require(x: Tensor | None, field: str, estimator: str) -> Tensor:
    if x is None:
        raise ValueError(f"advantage {estimator!r} needs AdvantageInputs.{field}")
    return x


def _episodes(inp: AdvantageInputs) -> tuple[Tensor, Tensor, Tensor]:
    """The batch's episodes: `(episode of each row [B] in 0..E-1, first row of each episode [E], group id of each
    episode [E])`.

    Without `episode_ids` each row is an episode. An episode's first row is its row with the smallest step id
    (ties: the first such row); without `step_ids`, its first row in the batch.
    """
    B = inp.group_ids.shape[0]
    rows = torch.arange(B, device=inp.group_ids.device)
    if inp.episode_ids is None:
        return rows, rows, inp.group_ids
    _, ep = torch.unique(inp.episode_ids, return_inverse=True)
    key = rows  # sorts the rows of an episode: by first step id (none: last), then by row
    if inp.step_ids is not None:
        steps = inp.step_ids.long()
        key = torch.where(steps >= 0, steps, int(steps.max()) + 1).amin(-1) * B + rows
    first = key.new_full((int(ep.max()) + 1,), int(key.max()) + 1).scatter_reduce_(0, ep, key, "amin") % B
    if not torch.equal(inp.group_ids[first][ep], inp.group_ids):
        raise ValueError("AdvantageInputs: the rows of an episode have different group ids")
    return ep, first, inp.group_ids[first]


def _returns(rewards: Tensor, gamma: float, exists: Tensor | None = None) -> Tensor:
    """[E, S] discounted returns-to-go of per-step `rewards` [E, S] over the steps that exist (`exists`; None:
    all), added from the last step back in one fixed order, so equal rewards give bit-equal returns."""
    G = torch.zeros_like(rewards)
    later = rewards.new_zeros(rewards.shape[0])
    for k in reversed(range(rewards.shape[1])):
        now = rewards[:, k] + gamma * later
        later = now if exists is None else torch.where(exists[:, k], now, later)
        G[:, k] = later
    return G


def _scores(inp: AdvantageInputs) -> tuple[Tensor, Tensor, Tensor]:
    """Each episode's score, float64: `(scores [E], group ids [E], episode of each row [B] in 0..E-1)`.

    A score is the episode's total reward (final + step rewards): the undiscounted return from its first
    step of `step_rewards` (the module's docstring: ties stay ties). Without `step_rewards`, the float64 sum
    of the rewards on the action tokens of the episode's first row (`_episodes`): all of them for a
    prefix-chain row, the first step's return-to-go for step rows (`to_sequences`).
    """
    ep, first, groups = _episodes(inp)
    if inp.step_rewards is not None:
        scores = _returns(inp.step_rewards[first].double(), 1.0)[:, :1].sum(-1)
    else:
        scores = torch.where(inp.mask.bool(), inp.token_rewards.double(), 0).sum(-1)[first]
    return scores, groups, ep


def _minus_group_min(x: Tensor, keys: Tensor) -> Tensor:
    """``x`` [N] minus the least ``x`` of its group (same ``keys`` [N]): exactly 0 on a group whose values are
    all equal, whatever rounding its mean would have."""
    _, inv = torch.unique(keys, return_inverse=True)
    low = x.new_full((int(inv.max()) + 1,), float("inf")).scatter_reduce_(0, inv, x, "amin")
    return x - low[inv]


def _group_size_and_sum(x: Tensor, group_ids: Tensor) -> tuple[Tensor, Tensor]:
    """For each entry of `x` [N] (an episode's score): the size of its group and the sum of `x` over its group."""
    _, inv = torch.unique(group_ids, return_inverse=True)
    n = x.new_zeros(int(inv.max()) + 1).index_add_(0, inv, torch.ones_like(x))
    total = x.new_zeros(n.shape).index_add_(0, inv, x)
    return n[inv], total[inv]


@register_advantage("gae", needs_critic=True, report_name="ppo")
def gae(inp: AdvantageInputs, *, whiten: bool = True) -> tuple[Tensor, Tensor]:
    """Token-level GAE (Schulman et al. 2016) over action tokens only (Agent-R1's advantage mask).

    Observation tokens are skipped: the next value of a turn's last action token is the value at
    the first action token of the next turn, and 0 after the trajectory's last action token.
    `returns = advantages + values`; the advantages are then whitened over the batch's action
    tokens (`masked_whiten`), on by default.
    """
    values = _require(inp.values, "values", "gae")
    m = inp.mask.bool()
    adv = _masked_gae(inp.token_rewards, values, m, inp.gamma, inp.lam)
    returns = torch.where(m, adv + values, 0)
    return (masked_whiten(adv, m, inp.eps, inp.reduce) if whiten else adv), returns


@register_advantage("step_gae", needs_critic=True, report_name="ppo_step")
def step_gae(inp: AdvantageInputs, *, whiten: bool = True) -> tuple[Tensor, Tensor]:
    """Step-level GAE: each model turn is one step.

    Step reward = sum of the rewards on the step's action tokens; step value = value at the
    step's first action token; GAE runs over the steps of each row, and each step's advantage
    and return (`advantage + step value`) is given to all of its tokens. Advantages are then
    whitened over the batch's action tokens (`masked_whiten`), on by default.
    """
    values = _require(inp.values, "values", "step_gae")
    step_ids = _require(inp.step_ids, "step_ids", "step_gae").long()
    m = inp.mask.bool()
    if (m & (step_ids < 0)).any():
        raise ValueError("step_gae: every masked token needs a step id >= 0")
    B, T = m.shape
    S = int(torch.where(m, step_ids, -1).max()) + 1  # steps per row (at most)
    idx = torch.where(m, step_ids, S)  # column S collects the unmasked tokens
    rewards = torch.where(m, inp.token_rewards, 0)
    step_rewards = rewards.new_zeros(B, S + 1).scatter_add_(1, idx, rewards)[:, :S]
    pos = torch.arange(T, device=m.device).expand(B, T)
    first = torch.full((B, S + 1), T, device=m.device).scatter_reduce_(1, idx, pos, "amin")[:, :S]
    exists = first < T
    step_values = values.gather(1, first.clamp(max=T - 1))
    step_adv = _masked_gae(step_rewards, step_values, exists, inp.gamma, inp.lam)
    step_ret = torch.where(exists, step_adv + step_values, 0)
    # the zero column appended at S is what the unmasked tokens gather
    adv = F.pad(step_adv, (0, 1)).gather(1, idx)
    returns = F.pad(step_ret, (0, 1)).gather(1, idx)
    return (masked_whiten(adv, m, inp.eps, inp.reduce) if whiten else adv), returns


def _group_normalised(x: Tensor, keys: Tensor, scale: bool, eps: float) -> Tensor:
    """``x`` [N] minus the mean of its group (same ``keys`` [N]), divided by the group's std
    (Bessel-corrected) + ``eps`` when ``scale``; 0 for a group of one, and exactly 0 for a group
    whose values are all equal (taken on ``x`` minus its group's least value)."""
    x = _minus_group_min(x, keys)
    n, total = _group_size_and_sum(x, keys)
    centred = x - total / n
    if scale:
        _, sq = _group_size_and_sum(centred**2, keys)
        centred = centred / ((sq / (n - 1).clamp(min=1)).sqrt() + eps)
    return torch.where(n > 1, centred, 0)


def _grpo(inp: AdvantageInputs, scale: bool) -> tuple[Tensor, Tensor]:
    m = inp.mask.bool()
    scores, groups, ep = _scores(inp)
    adv = torch.where(m, _group_normalised(scores, groups, scale, inp.eps)[ep][:, None], 0).to(inp.token_rewards.dtype)
    return adv, adv


@register_advantage("grpo", needs_groups=True, zero_when_tied="always")
def grpo(inp: AdvantageInputs) -> tuple[Tensor, Tensor]:
    """GRPO (Shao et al. 2024): `(score - group mean) / (group std + eps)` on every action token.

    score = the episode's total reward (step rewards included; `_scores`); mean and std are over
    the episodes of the group, std Bessel-corrected (unbiased, torch's default); every row of an
    episode gets its episode's advantage; a group of one episode gets 0. No critic, so returns =
    advantages.
    """
    return _grpo(inp, scale=True)


@register_advantage("grpo_no_std", needs_groups=True, zero_when_tied="always")
def grpo_no_std(inp: AdvantageInputs) -> tuple[Tensor, Tensor]:
    """Dr. GRPO (Liu et al. 2025): `score - group mean`, without the std division; otherwise as `grpo`."""
    return _grpo(inp, scale=False)


@register_advantage("rloo", needs_groups=True, zero_when_tied="always")
def rloo(inp: AdvantageInputs) -> tuple[Tensor, Tensor]:
    """RLOO (Ahmadian et al. 2024): `score - mean of the other scores in the group` on every action token.

    score and "other" are per episode, as in `grpo`; a group of one episode gets 0; returns = advantages.
    """
    m = inp.mask.bool()
    scores, groups, ep = _scores(inp)
    scores = _minus_group_min(scores, groups)  # a group of equal scores: exactly 0
    n, total = _group_size_and_sum(scores, groups)
    loo = torch.where(n > 1, scores - (total - scores) / (n - 1).clamp(min=1), 0)
    adv = torch.where(m, loo[ep][:, None], 0).to(inp.token_rewards.dtype)
    return adv, adv


@register_advantage("reinforce_pp")
def reinforce_pp(inp: AdvantageInputs, *, whiten: bool = True) -> tuple[Tensor, Tensor]:
    """REINFORCE++ (Hu 2025): discounted return-to-go over action tokens (gamma per action token,
    observation tokens skipped; `lam` unused), whitened over the batch's action tokens
    (`masked_whiten`), on by default. returns = the return-to-go.
    """
    m = inp.mask.bool()
    rtg = _masked_gae(inp.token_rewards, torch.zeros_like(inp.token_rewards), m, inp.gamma, 1.0)
    return (masked_whiten(rtg, m, inp.eps, inp.reduce) if whiten else rtg), rtg


@register_advantage("reinforce_pp_baseline", needs_groups=True)
def reinforce_pp_baseline(inp: AdvantageInputs, *, whiten: bool = True) -> tuple[Tensor, Tensor]:
    """REINFORCE++-baseline (Hu 2025): each row's own `reinforce_pp` return-to-go minus the mean of
    the episode scores of its group (score as in `grpo`, one per episode), then whitened as in
    `reinforce_pp`. returns = the return-to-go.
    """
    m = inp.mask.bool()
    rtg = _masked_gae(inp.token_rewards, torch.zeros_like(inp.token_rewards), m, inp.gamma, 1.0)
    scores, groups, ep = _scores(inp)
    n, total = _group_size_and_sum(scores, groups)
    adv = torch.where(m, rtg - (total / n)[ep][:, None].to(rtg.dtype), 0)
    return (masked_whiten(adv, m, inp.eps, inp.reduce) if whiten else adv), rtg


@register_advantage("gigpo", needs_groups=True, zero_when_tied="outcome")
def gigpo(inp: AdvantageInputs, *, step_advantage_weight: float = 1.0, norm: str = "std") -> tuple[Tensor, Tensor]:
    """GiGPO (Feng et al. 2025, arXiv:2505.10978): episode advantage + w · step advantage, on each
    action token of a step.

    - Episode advantage: ``grpo``'s (``norm: std``) or ``grpo_no_std``'s (``norm: mean``), over the
      episodes of the group.
    - Step advantage: the steps of a group's episodes that start from the same state
      (``anchor_ids``, from the environment's ``state_key``) form an anchor group; a step's
      discounted return-to-go ``G_k = sum_j>=k gamma^(j-k) R_j`` (``R_j``: step j's rewards, the
      final reward on the last step; gamma = ``rl.gamma``, per step) minus the anchor group's mean,
      divided by its std (Bessel-corrected) + eps with ``norm: std``. A step alone in its anchor
      group, or without a state key, gets 0.
    - ``w`` = ``step_advantage_weight`` (the paper's default 1; 0: the episode advantage alone).

    Steps are read from ``step_ids``: a prefix-chain row holds every step of its episode, a step
    row (``to_sequences``) one. ``R_j`` comes from ``step_rewards`` in float64 (the module's
    docstring: ties stay ties), so both forms, and a group that mixes them, get the same
    advantages; without it, from the tokens (a step row's R_j is the difference of its
    return-to-go and the next one's). Without
    ``step_ids`` or ``anchor_ids`` (an environment without state keys) it is the episode advantage
    alone. returns = advantages.
    """
    if norm not in ("std", "mean"):
        raise ValueError(f"gigpo: norm must be 'std' or 'mean', got {norm!r}")
    m = inp.mask.bool()
    episode_adv, _ = _grpo(inp, scale=norm == "std")
    if inp.step_ids is None or inp.anchor_ids is None:  # no state keys: no step shares an anchor group
        return episode_adv, episode_adv
    steps, anchors = inp.step_ids.long(), inp.anchor_ids.long()
    ep, first, groups = _episodes(inp)
    on = m & (steps >= 0)
    E, S = int(ep.max()) + 1, int(torch.where(on, steps, -1).max()) + 1
    if S == 0:
        return episode_adv, episode_adv
    flat = torch.where(on, ep[:, None] * S + steps, E * S)  # slot E*S collects the other tokens
    exists = torch.zeros(E * S + 1, dtype=torch.bool, device=m.device).index_fill_(0, flat[on], True)
    anchor = torch.full((E * S + 1,), -1, dtype=torch.long, device=m.device).scatter_reduce_(
        0, flat.flatten(), torch.where(on, anchors, -1).flatten(), "amax")
    exists, anchor = exists[:-1].view(E, S), anchor[:-1].view(E, S)
    if inp.step_rewards is not None:  # R_k: each episode's step rewards, as they were recorded
        rewards = F.pad(inp.step_rewards[first].double(), (0, S))[:, :S]
    else:  # read from the tokens; an episode of several rows is step rows: R_k = rtg_k - rtg_(k+1)
        rewards_on = torch.where(on, inp.token_rewards.double(), 0).flatten()
        y = rewards_on.new_zeros(E * S + 1).index_add_(0, flat.flatten(), rewards_on)[:-1].view(E, S)
        step_rows = torch.bincount(ep, minlength=E) > 1
        rewards = torch.where(step_rows[:, None], y - F.pad(y[:, 1:], (0, 1)), y)
    G = _returns(rewards, inp.gamma, exists)
    # anchor groups: (task group, state) pairs; a step without a key is a group of its own
    lone = -1 - torch.arange(E * S, device=m.device).view(E, S)
    pairs = torch.stack([groups[:, None].expand(E, S)[exists], torch.where(anchor >= 0, anchor, lone)[exists]], 1)
    _, keys = torch.unique(pairs, dim=0, return_inverse=True)
    step_adv = torch.zeros_like(G)
    step_adv[exists] = _group_normalised(G[exists], keys, norm == "std", inp.eps)
    per_token = F.pad(step_adv.flatten(), (0, 1))[flat]
    adv = torch.where(m, episode_adv + step_advantage_weight * per_token, 0).to(inp.token_rewards.dtype)
    return adv, adv
