"""The store of sequences :class:`~agent_r1.rollout.engine.HFEngine` kept from its last call:
a later context that extends one reuses its keys and values instead of prefilling them."""

from __future__ import annotations

from dataclasses import dataclass

import torch

KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values [kv_heads, len, head_dim]


@dataclass
class Kept:
    """One sequence's ids and KV cache."""

    ids: list[int]
    kv: KV


class KVStore:
    """The sequences kept from the last :meth:`HFEngine.generate` call (context + sampled ids), and
    the prefill counters behind ``stats()``. Disabled (``enabled=False``), it keeps nothing and
    matches nothing, and still counts."""

    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self.reset()

    def reset(self) -> None:
        self._kept: dict[tuple[int, ...], Kept] = {}
        self.context_tokens = self.prefill_tokens = 0

    def match(self, ctx: list[int]) -> Kept | None:
        """The longest kept sequence that ``ctx`` starts with (and extends by at least a token)."""
        best = None
        for k in self._kept.values():
            if len(k.ids) < len(ctx) and (best is None or len(k.ids) > len(best.ids)) and ctx[: len(k.ids)] == k.ids:
                best = k
        return best

    def keep(self, kept: list[Kept]) -> None:
        """Keep these sequences instead of the earlier ones (whose caches the weights may have outdated)."""
        self._kept = {tuple(k.ids): k for k in kept} if self.enabled else {}

    def count(self, context_tokens: int, prefill_tokens: int) -> None:
        self.context_tokens += context_tokens
        self.prefill_tokens += prefill_tokens

    def stats(self) -> dict:
        c, p = self.context_tokens, self.prefill_tokens
        return {"prefill_tokens": p, "prefill_reused_share": 1 - p / c if c else 0.0}
