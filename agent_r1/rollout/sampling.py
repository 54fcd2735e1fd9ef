"""Sampling parameters, the sampler every in-process engine uses, and per-context seeding."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class SamplingParams:
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0
    max_new_tokens: int = 64
    # where the per-call seeds are drawn from (None: torch's global generator); a rollout running
    # beside the learner (rl.max_staleness ≥ 1) draws from its own, so that its seeds do not depend on
    # what the learner draws meanwhile
    generator: torch.Generator | None = None


def context_generators(n: int, params: SamplingParams, device) -> list[torch.Generator] | None:
    """One random generator per context (``None`` when greedy: nothing is drawn), seeded
    ``base + i`` from one draw of torch's global generator, like the vLLM engine's per-request
    seeds: a seeded run samples the same ids again, however the contexts are batched, which
    rows leave the batch early, and whether they are sampled one at a time."""
    if params.temperature <= 0:
        return None
    base = int(torch.randint(0, 2**62, (1,), generator=params.generator))
    return [torch.Generator(device).manual_seed(base + i) for i in range(n)]


def sample(logits: torch.Tensor, params: SamplingParams,
           generators: list[torch.Generator] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Next tokens for ``logits`` [B, V] and their log-probs under the distribution sampled from.
    Row b draws its random numbers from ``generators[b]`` (default: torch's global generator)."""
    logits = logits.float()
    if params.temperature <= 0:
        ids = logits.argmax(-1)
        return ids, F.log_softmax(logits, -1).gather(-1, ids[:, None]).squeeze(-1)
    logits = logits / params.temperature
    if params.top_p < 1.0:  # nucleus: drop the tail whose mass lies beyond top_p
        probs, order = F.softmax(logits, -1).sort(-1, descending=True)
        drop = probs.cumsum(-1) - probs >= params.top_p
        logits = logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    logp = F.log_softmax(logits, -1)
    # the exponential race (what torch.multinomial does for one draw: the largest p / E, E ~ Exp(1),
    # is a draw from p), with E = -log U drawn ~4x faster than torch's exponential_ (which took 50
    # of a 52 ms torch.multinomial call at batch 32 x 49k, a sixth of a SmolLM2 decode step); one
    # generator per row costs the same as one draw for the batch (8.5 vs 8.3 ms at 32 x 49k, CPU)
    u = torch.empty_like(logp)
    if generators is None:
        u.uniform_()
    else:
        for row, g in zip(u, generators, strict=True):
            row.uniform_(generator=g)
    ids = (logp.exp() / u.log_().neg_()).argmax(-1)
    return ids, logp.gather(-1, ids[:, None]).squeeze(-1)
