"""Losses and log-prob helpers: pure functions over [B, T] token tensors.

`mask` is the loss mask (1 on action tokens). Policy losses are registered by name and share the
signature `fn(logprobs, old_logprobs, advantages, mask, ...) -> (loss, metrics)`, where metrics
maps names to Python floats.
"""

from __future__ import annotations

import torch
from torch import Tensor

from agent_r1.algorithms.registry import register_policy_loss

AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")
KL_KINDS = ("k1", "k2", "k3")  # estimators of `kl_penalty`


def aggregate(x: Tensor, mask: Tensor, mode: str) -> Tensor:
    """Reduce [B, T] `x` over its masked entries to a scalar.

    - `token-mean`: sum(x * mask) / sum(mask) — every token weighs the same;
    - `seq-mean-token-mean`: mean over sequences of each sequence's token mean;
    - `seq-mean-token-sum`: mean over sequences of each sequence's token sum.
    The sequence modes average over the sequences with at least one masked token. An empty mask
    gives 0.
    """
    if mode not in AGG_MODES:
        raise ValueError(f"unknown aggregation mode {mode!r}; known: {', '.join(AGG_MODES)}")
    m = mask.bool()
    x = torch.where(m, x, 0)
    if mode == "token-mean":
        return x.sum() / m.sum().clamp(min=1)
    n = m.sum(-1)
    per_seq = x.sum(-1)
    if mode == "seq-mean-token-mean":
        per_seq = per_seq / n.clamp(min=1)
    return per_seq.sum() / (n > 0).sum().clamp(min=1)


def _ratio(logprobs: Tensor, old_logprobs: Tensor) -> Tensor:
    # the log-ratio is clamped to [-20, 20] so a stale token cannot overflow exp
    return torch.exp((logprobs - old_logprobs).clamp(-20.0, 20.0))


def _approx_kl(logprobs: Tensor, old_logprobs: Tensor, mask: Tensor) -> float:
    """Token mean of `old_logprobs - logprobs` (k1 estimate of KL(old || new))."""
    return aggregate((old_logprobs - logprobs).detach(), mask, "token-mean").item()


@register_policy_loss("ppo", settings=("clip_low", "clip_high", "dual_clip"))
def ppo_clip_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = 3.0,
    agg: str = "token-mean",
) -> tuple[Tensor, dict[str, float]]:
    """PPO clipped surrogate (Schulman et al. 2017, "Proximal Policy Optimization Algorithms",
    arXiv:1707.06347), `max(-A * r, -A * clip(r, 1 - clip_low, 1 + clip_high))`.

    With `dual_clip = c` (> 1; None disables), the loss of a token with A < 0 is capped at
    `-c * A` (Ye et al. 2020), so a huge ratio on a bad token cannot dominate the batch.
    Metrics (token means over the mask): `clipfrac` (the clipped term is the active one),
    `approx_kl`, `dual_clip_frac` (the cap is the active one).
    """
    m = mask.bool()
    ratio = _ratio(logprobs, old_logprobs)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1 - clip_low, 1 + clip_high)
    loss = torch.maximum(unclipped, clipped)
    capped = torch.zeros_like(m)
    if dual_clip is not None:
        if dual_clip <= 1:
            raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
        cap = -advantages * dual_clip
        capped = (advantages < 0) & (loss > cap)
        loss = torch.where(capped, cap, loss)
    metrics = {
        "clipfrac": aggregate((clipped > unclipped).float(), m, "token-mean").item(),
        "approx_kl": _approx_kl(logprobs, old_logprobs, m),
        "dual_clip_frac": aggregate(capped.float(), m, "token-mean").item(),
    }
    return aggregate(loss, m, agg), metrics


@register_policy_loss("gspo", settings=("clip_low", "clip_high"))
def gspo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_low: float = 3e-4,
    clip_high: float = 4e-4,
    agg: str = "seq-mean-token-mean",
) -> tuple[Tensor, dict[str, float]]:
    """GSPO (Zheng et al. 2025, "Group Sequence Policy Optimization", arXiv:2507.18071), in its
    GSPO-token form: the PPO clipped surrogate with the sequence-level ratio
    ``s = exp(mean over the row's masked tokens of (logp - old))`` on every token of the row, as
    ``s_t = sg(s) * exp(logp_t - sg(logp_t))``: its value is ``s``, its gradient ``s * grad logp_t``,
    so a row whose tokens share one advantage gets GSPO's gradient
    ``s * A * mean_t grad logp_t`` (with ``agg: seq-mean-token-mean``, the paper's). The clip range is
    ``[1 - clip_low, 1 + clip_high]`` on ``s``: the paper's 3e-4 and 4e-4, not PPO's 0.2. These
    defaults, and ``agg``'s, are what ``rl.learner`` uses where the config leaves them unset.
    A row is the sequence: a whole episode for a prefix-chain row, one turn for a step row.
    Metrics: ``clipfrac`` (token share of rows whose clipped term is active), ``approx_kl``.
    """
    m = mask.bool()
    n = m.sum(-1, keepdim=True).clamp(min=1)
    seq_log_ratio = (torch.where(m, logprobs - old_logprobs, 0).sum(-1, keepdim=True) / n).clamp(-20.0, 20.0)
    ratio = torch.exp(seq_log_ratio.detach() + logprobs - logprobs.detach())
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1 - clip_low, 1 + clip_high)
    loss = torch.maximum(unclipped, clipped)
    metrics = {
        "clipfrac": aggregate((clipped > unclipped).float(), m, "token-mean").item(),
        "approx_kl": _approx_kl(logprobs, old_logprobs, m),
    }
    return aggregate(loss, m, agg), metrics


@register_policy_loss("vanilla")
def vanilla_pg_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    agg: str = "token-mean",
) -> tuple[Tensor, dict[str, float]]:
    """Unclipped importance-weighted policy gradient, `-A * r`; metrics: `approx_kl`."""
    loss = -advantages * _ratio(logprobs, old_logprobs)
    return aggregate(loss, mask, agg), {"approx_kl": _approx_kl(logprobs, old_logprobs, mask)}


def with_demonstrated_tokens(policy_loss, logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor,
                             demo_mask: Tensor, gamma: float = 0.1, agg: str = "token-mean",
                             **settings) -> tuple[Tensor, dict[str, float]]:
    """A policy loss over sampled tokens and demonstrated ones (an off-policy member of a group):
    ``policy_loss(logprobs, old_logprobs, advantages, mask & ~demo, agg=agg, **settings)`` on the
    sampled tokens, and LUFFY's policy shaping on the demonstrated ones (Yan et al. 2025, "Learning
    to Reason under Off-Policy Guidance", arXiv:2504.14945): ``-A * f(pi)`` with
    ``f(pi) = pi / (pi + gamma)``, ``pi = exp(logprobs)``, no clip (the demonstration's own
    probability is taken as 1, so ``f`` is its importance weight, shaped). Its gradient is
    ``-A * gamma * pi / (pi + gamma)^2 * grad log pi``: larger on the tokens the policy finds
    unlikely than plain imitation's ``pi`` weighting would be. The two parts are averaged by
    their share of the aggregation's units (tokens for ``token-mean``, rows otherwise; a row is
    all demonstrated or all sampled), so the result is the aggregate over every loss token.
    Metrics: the policy loss's (of the sampled tokens) and ``demo_prob``, the mean pi of the
    demonstrated tokens."""
    m, d = mask.bool(), demo_mask.bool() & mask.bool()
    on, off = m & ~d, d
    loss_on, metrics = policy_loss(logprobs, old_logprobs, advantages, on, agg=agg, **settings)
    pi = logprobs.exp()
    loss_off = aggregate(-advantages * pi / (pi + gamma), off, agg)

    def units(x: Tensor) -> float:
        return float(x.sum()) if agg == "token-mean" else float((x.sum(-1) > 0).sum())

    n_on, n_off = units(on), units(off)
    loss = (loss_on * n_on + loss_off * n_off) / max(n_on + n_off, 1.0)
    return loss, metrics | {"demo_prob": aggregate(pi.detach(), off, "token-mean").item()}


def kl_penalty(logprobs: Tensor, ref_logprobs: Tensor, kind: str) -> Tensor:
    """Per-token estimate of KL(policy || ref) from samples of the policy.

    - `k1`: `logp - ref` (unbiased, can be negative);
    - `k2`: `0.5 * (logp - ref)^2` (biased, non-negative);
    - `k3`: `exp(ref - logp) - (ref - logp) - 1` (Schulman's unbiased, non-negative).

    (J. Schulman, "Approximating KL Divergence", 2020.) The learner adds ``kl_coef`` times its
    aggregate to the loss; it is never folded into the rewards.
    """
    log_ratio = logprobs - ref_logprobs
    if kind == "k1":
        return log_ratio
    if kind == "k2":
        return 0.5 * log_ratio**2
    if kind == "k3":
        return torch.exp(-log_ratio) + log_ratio - 1
    raise ValueError(f"unknown KL penalty kind {kind!r}; known: {', '.join(KL_KINDS)}")


def entropy_from_logits(logits: Tensor) -> Tensor:
    """[B, T, V] logits → [B, T] entropy, as `logsumexp(z) - sum(softmax(z) * z)`."""
    return torch.logsumexp(logits, -1) - (torch.softmax(logits, -1) * logits).sum(-1)


def logprobs_from_logits(logits: Tensor, labels: Tensor) -> Tensor:
    """[B, T, V] logits, [B, T] labels → [B, T] log-probs of the labels.

    Computed as `z[label] - logsumexp(z)`, so no [B, T, V] log-softmax is kept for backward.
    """
    return logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, -1)


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    clip: float = 0.2,
    agg: str = "token-mean",
) -> tuple[Tensor, dict[str, float]]:
    """Clipped value loss, `0.5 * max((v - R)^2, (v_clip - R)^2)`, with
    `v_clip = old + clamp(v - old, -clip, clip)`. Metrics: `vf_clipfrac`, the token mean of
    the clipped error being the larger one.
    """
    v_clip = old_values + (values - old_values).clamp(-clip, clip)
    err = (values - returns) ** 2
    err_clip = (v_clip - returns) ** 2
    loss = 0.5 * aggregate(torch.maximum(err, err_clip), mask, agg)
    return loss, {"vf_clipfrac": aggregate((err_clip > err).float(), mask, "token-mean").item()}
