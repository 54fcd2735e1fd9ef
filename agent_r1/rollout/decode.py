"""The decode loop of :class:`~agent_r1.rollout.engine.HFEngine`: sample a token for every row,
append it (one forward pass on the cache), and let rows whose turn has ended leave the batch."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from agent_r1.rollout.kv_cache import row_kv
from agent_r1.rollout.kv_store import KV
from agent_r1.rollout.sampling import SamplingParams, sample

# (input ids [B, 1], attention mask [B, columns], positions [B, 1], cache) -> next-token logits [B, V]
Forward = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, DynamicCache], torch.Tensor]


@dataclass
class Decoded:
    ids: list[list[int]]  # per context: the ids sampled, the ending eos included
    logprobs: list[list[float]]
    kv: list[KV] | None  # per context: keys and values of the context and of its ids but the last


@dataclass
class _Rows:
    """The rows still in the decode batch."""

    live: torch.Tensor  # the context of each row
    done: torch.Tensor  # its turn has ended
    mask: torch.Tensor  # attention mask over the cache's columns
    pos: torch.Tensor  # position of its last token [rows, 1]
    generators: list[torch.Generator] | None

    def select(self, rows: torch.Tensor) -> None:
        self.live, self.done, self.mask, self.pos = self.live[rows], self.done[rows], self.mask[rows], self.pos[rows]
        if self.generators is not None:
            self.generators = [self.generators[r] for r in rows.tolist()]

    def extend(self) -> None:
        self.mask = torch.cat([self.mask, torch.ones_like(self.mask[:, :1])], 1)
        self.pos = self.pos + 1


class DecodeLoop:
    """Samples one turn for every context of a prefilled batch. Each step samples a token per row
    (:func:`~agent_r1.rollout.sampling.sample`, row b from ``generators[b]``) and runs it through
    ``forward``; rows whose turn has ended (eos) stay, sampling padding, until they are half of the
    batch, then leave it together (the cache keeps the other rows: one copy)."""

    def __init__(self, forward: Forward, eos_id: int, pad_id: int):
        self.forward, self.eos_id, self.pad_id = forward, eos_id, pad_id

    def run(self, cache: DynamicCache, logits: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor,
            params: SamplingParams, generators: list[torch.Generator] | None = None,
            starts: list[int] | None = None) -> Decoded:
        """``cache`` holds the contexts right-aligned in its first ``mask.shape[1]`` columns, ``logits``
        [C, V] their next-token logits, ``pos`` [C, 1] the positions of their last tokens. With
        ``starts`` (the column where each context begins), each context's keys and values are copied
        out as it leaves the batch."""
        C, width, device = len(logits), mask.shape[1], logits.device
        rows = _Rows(torch.arange(C, device=device), torch.zeros(C, dtype=torch.bool, device=device), mask, pos,
                     generators)
        ids = torch.full((C, params.max_new_tokens), self.pad_id, dtype=torch.long, device=device)
        lps = torch.zeros((C, params.max_new_tokens), device=device)
        length = torch.full((C,), params.max_new_tokens, device=device)  # ids sampled, eos included
        kv = [None] * C if starts is not None else None
        for step in range(params.max_new_tokens):
            tok, lp = sample(logits, params, rows.generators)
            tok = tok.masked_fill(rows.done, self.pad_id)
            ids[rows.live, step], lps[rows.live, step] = tok, lp
            ended = (tok == self.eos_id) & ~rows.done
            length[rows.live[ended]] = step + 1
            rows.done |= ended
            if bool(rows.done.all()) or step == params.max_new_tokens - 1:
                break
            if 2 * int(rows.done.sum()) >= len(rows.done):  # half the rows have ended: they leave
                _copy_kv(kv, starts, rows, rows.done, length, cache, width)
                stay = (~rows.done).nonzero().squeeze(1)
                cache.reorder_cache(stay)
                tok = tok[stay]
                rows.select(stay)
            rows.extend()
            logits = self.forward(tok[:, None], rows.mask, rows.pos, cache)
        _copy_kv(kv, starts, rows, torch.ones_like(rows.done), length, cache, width)
        n = length.tolist()
        return Decoded([g[:k] for g, k in zip(ids.tolist(), n)], [g[:k] for g, k in zip(lps.tolist(), n)], kv)


def _copy_kv(kv: list | None, starts: list[int] | None, rows: _Rows, leaving: torch.Tensor, length: torch.Tensor,
             cache: DynamicCache, width: int) -> None:
    """``kv[i]`` for each leaving row's context i: its cache columns from ``starts[i]`` to before its
    last sampled id (which never ran)."""
    if kv is None:
        return
    for r in leaving.nonzero().squeeze(1).tolist():
        i = int(rows.live[r])
        kv[i] = row_kv(cache, r, starts[i], width + int(length[i]) - 1)
