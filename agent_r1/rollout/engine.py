"""The rollout-engine interface and its default Hugging Face implementation.

An engine takes a batch of context token ids and returns, for each, the token ids it sampled
and their log-probs under the sampling distribution (after temperature and top-p). The learner
trains on exactly those ids (token in, token out).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from agent_r1.models import autocast, cache_kwarg


class _GrowingLayer(DynamicLayer):
    """A cache layer whose keys and values are views of buffers with spare columns: a decode step
    writes its column in place instead of ``torch.cat``-copying the whole cache (which took 172
    of a 429 ms decode step at 500 cached columns, batch 32, SmolLM2, one CPU thread).
    ``reorder_cache`` selects rows of the buffers; keys and values replaced from outside (e.g.
    by ``crop``) are copied into fresh buffers."""

    SPARE = 64  # columns added when a buffer is full

    def __init__(self, room: int = SPARE):
        super().__init__()
        self.room = room  # spare columns a new buffer gets

    def adopt(self, keys: torch.Tensor, values: torch.Tensor, n: int) -> None:
        """Hold the first ``n`` columns of the buffers [B, H, capacity, D]; the rest is room."""
        # (set here, not by lazy_initialization, whose signature differs across transformers 5.x)
        self.is_initialized, self.device, self.dtype = True, keys.device, keys.dtype
        self._k, self._v = keys, values
        self.keys, self.values = keys[:, :, :n], values[:, :, :n]
        self._view = self.keys

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Keep rows ``beam_idx`` of the buffers, room included (one copy)."""
        if self.is_initialized and self._view is self.keys:
            idx = beam_idx.to(self._k.device)
            self.adopt(self._k.index_select(0, idx), self._v.index_select(0, idx), self.keys.shape[-2])
        else:
            super().reorder_cache(beam_idx)

    def update(self, key_states, value_states, *args, **kwargs):
        n, m = (self.keys.shape[-2] if self.is_initialized else 0), key_states.shape[-2]
        # first call, keys replaced from outside, or no room left
        if not self.is_initialized or self._view is not self.keys or n + m > self._k.shape[-2]:
            B, H, _, D = key_states.shape
            k = key_states.new_empty((B, H, n + m + self.room, D))
            v = torch.empty_like(k)
            if n:
                k[:, :, :n], v[:, :, :n] = self.keys, self.values
            self.adopt(k, v, n)
        self._k[:, :, n:n + m] = key_states
        self._v[:, :, n:n + m] = value_states
        self.adopt(self._k, self._v, n + m)
        return self.keys, self.values


def _growing_cache(layers: list[_GrowingLayer] | None = None, room: int = _GrowingLayer.SPARE) -> DynamicCache:
    """A cache of ``layers``, or of :class:`_GrowingLayer` created as the model asks for them."""
    cache = DynamicCache()
    cache.layer_class_to_replicate = lambda: _GrowingLayer(room)
    cache.layers = list(layers or [])
    return cache


def _prefill_groups(lengths: list[int], overhead: int = 64) -> list[list[int]]:
    """Rows grouped for prefill, each group padded only to its own longest row: rows sorted by
    length, cut where (padded tokens + ``overhead`` tokens per forward pass) is least. One group
    keeps the rows' order."""
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    sizes = [lengths[r] for r in order]
    cost, cut = [0] + [float("inf")] * len(order), [0] * (len(order) + 1)
    for j in range(1, len(order) + 1):  # the last group is order[i:j], padded to sizes[j - 1]
        for i in range(j):
            c = cost[i] + (j - i) * sizes[j - 1] + overhead
            if c < cost[j]:
                cost[j], cut[j] = c, i
    groups, j = [], len(order)
    while j:
        groups.append(order[cut[j]:j])
        j = cut[j]
    return groups if len(groups) > 1 else [list(range(len(order)))]


@dataclass
class SamplingParams:
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0
    max_new_tokens: int = 64


@dataclass
class Generation:
    ids: list[int]
    logprobs: list[float]
    finished: bool  # ended with the end-of-turn token (False: cut at max_new_tokens)


class RolloutEngine(ABC):
    """Generates one model turn for many contexts at once.

    The contract of :meth:`generate`: one :class:`Generation` per context, in order; every
    generation holds at most ``max_new_tokens`` ids; a finished one (``finished=True``) ends
    with the end-of-turn (eos) token and holds no eos before it, an unfinished one was cut at
    ``max_new_tokens`` and holds no eos; ``logprobs[k]`` is the log-probability of ``ids[k]``
    under the distribution it was sampled from (temperature and top-p applied; greedy: the
    untempered one). :class:`~agent_r1.rollout.scripted.ScriptedEngine` plays fixed turns
    under the same contract (for tests and docs).
    """

    @abstractmethod
    def generate(self, contexts: list[list[int]], params: SamplingParams) -> list[Generation]: ...

    def reset(self) -> None:
        """Forget anything kept between calls (``run_episodes`` calls it before a batch of
        episodes: the weights may have changed since the last one)."""

    def stats(self) -> dict:
        """Counters since the last :meth:`reset` (e.g. prefill tokens reused)."""
        return {}

    def sync_weights(self, write) -> float:
        """Bring the learner's current weights to the engine before the next rollout; ``write(folder)``
        writes them as a Hugging Face folder. An engine that shares the policy module with the learner
        (:class:`HFEngine`) has nothing to do. Returns the seconds taken."""
        return 0.0

    def restart(self) -> None:
        """Recover from :class:`EngineDied` (a server engine starts its server again)."""
        raise NotImplementedError(f"{type(self).__name__} cannot restart")

    def close(self) -> None:
        """Release what the engine holds (a server process)."""


class EngineDied(RuntimeError):
    """The engine stopped answering (a server that crashed or was killed): :meth:`RolloutEngine.restart`
    may bring it back."""


def sample(logits: torch.Tensor, params: SamplingParams) -> tuple[torch.Tensor, torch.Tensor]:
    """Next tokens for ``logits`` [B, V] and their log-probs under the distribution sampled from."""
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
    # of a 52 ms torch.multinomial call at batch 32 x 49k, a sixth of a SmolLM2 decode step)
    ids = (logp.exp() / torch.rand_like(logp).log_().neg_()).argmax(-1)
    return ids, logp.gather(-1, ids[:, None]).squeeze(-1)


@dataclass
class _Kept:
    """One sequence's KV cache (per layer: keys, values [kv_heads, len, head_dim]) and its ids."""

    ids: list[int]
    kv: list[tuple[torch.Tensor, torch.Tensor]]


class HFEngine(RolloutEngine):
    """Batched sampling with a ``transformers`` causal LM in process, sharing the policy module
    with the learner.

    **KV reuse across turns.** After each call the engine keeps every sequence's KV cache
    (context + generated ids). When a later context starts with a kept sequence — the
    full-history context manager only appends an observation and the next assistant header —
    only the appended tokens are prefilled; a context that rewrote its history (a sliding
    window) matches nothing and is prefilled in full. Identical new contexts (a GRPO group's
    shared prompt) are prefilled once. ``stats()`` reports the share of context tokens reused.
    The ids and log-probs are those of a full prefill: reuse changes only what is recomputed.

    Contexts go in batches of up to ``max_batch_size``. A batch is laid out right-aligned: each
    row's kept prefix sits in the cache, the tokens after it are the input, and the shorter rows
    are left-padded (masked, with positions counted from each row's first real token). The
    prefill runs in groups of rows with similar numbers of new tokens, each padded only to its own
    longest; the decode steps then run on one cache of the whole batch, from which rows whose turn
    has ended leave once they are half of it.
    """

    def __init__(self, model: torch.nn.Module, tokenizer, max_batch_size: int = 64, precision: str = "auto",
                 reuse_kv: bool = True):
        self.model = model
        self.eos_id = tokenizer.eos_token_id
        self.pad_id = tokenizer.pad_token_id
        self.max_batch_size = max_batch_size
        self.precision = precision  # agent_r1.models.autocast
        self.reuse_kv = reuse_kv
        self._cache_kw = cache_kwarg(model) if model is not None else "past_key_values"
        self.reset()

    def reset(self) -> None:
        self._kept: dict[tuple[int, ...], _Kept] = {}
        self._counts = {"context_tokens": 0, "prefill_tokens": 0}

    def stats(self) -> dict:
        c = self._counts
        return {"prefill_tokens": c["prefill_tokens"],
                "prefill_reused_share": 1 - c["prefill_tokens"] / c["context_tokens"] if c["context_tokens"] else 0.0}

    @torch.no_grad()
    def generate(self, contexts: list[list[int]], params: SamplingParams) -> list[Generation]:
        prefixes = [self._match(c) for c in contexts]
        kept: dict[tuple[int, ...], _Kept] = {}
        out: list[Generation] = []
        was_training = self.model.training
        self.model.eval()
        try:
            for i in range(0, len(contexts), self.max_batch_size):
                sl = slice(i, i + self.max_batch_size)
                out += self._generate_batch(contexts[sl], prefixes[sl], params, kept)
        finally:
            self.model.train(was_training)
        self._kept = kept if self.reuse_kv else {}
        return out

    def _match(self, ctx: list[int]) -> _Kept | None:
        """The longest kept sequence that ``ctx`` starts with (and extends by at least a token)."""
        best = None
        for k in self._kept.values():
            if len(k.ids) < len(ctx) and (best is None or len(k.ids) > len(best.ids)) and ctx[: len(k.ids)] == k.ids:
                best = k
        return best

    def _generate_batch(self, contexts, prefixes, params: SamplingParams, kept: dict) -> list[Generation]:
        device = next(self.model.parameters()).device
        # identical (prefix, new tokens) rows are computed once (a group's shared prompt)
        rows: dict[tuple, int] = {}
        index = [rows.setdefault((id(p), tuple(c)), len(rows)) for c, p in zip(contexts, prefixes)]
        uniq = {r: (contexts[i], prefixes[i]) for i, r in reversed(list(enumerate(index)))}
        u_ctx = [uniq[r][0] for r in range(len(rows))]
        u_pre = [uniq[r][1] for r in range(len(rows))]
        n_new = [len(c) - (len(p.ids) if p else 0) for c, p in zip(u_ctx, u_pre)]
        self._counts["context_tokens"] += sum(len(c) for c in contexts)
        self._counts["prefill_tokens"] += sum(n_new)

        B, T = len(u_ctx), max(len(c) for c in u_ctx)
        ids = torch.full((B, T), self.pad_id, dtype=torch.long)
        mask = torch.zeros((B, T), dtype=torch.long)
        for r, c in enumerate(u_ctx):
            ids[r, T - len(c):] = torch.tensor(c)
            mask[r, T - len(c):] = 1
        pos = (mask.cumsum(1) - 1).clamp(min=0)
        sel = torch.tensor(index)
        groups = _prefill_groups(n_new)
        direct = len(groups) == 1 and B == len(contexts)  # the group's cache is the decode cache
        with autocast(self.precision, device):
            # prefill each group of rows padded only to its longest new part (right-aligned: a row's
            # kept prefix sits in the cache, the tokens after it are the input)
            parts = []
            for g in groups:
                Tg, Ng = max(len(u_ctx[r]) for r in g), max(n_new[r] for r in g)
                cache = self._cache([u_ctx[r] for r in g], [u_pre[r] for r in g], Tg - Ng, Ng,
                                    params.max_new_tokens if direct else 0, device)
                logits = self.model(input_ids=ids[g, T - Ng:].to(device), attention_mask=mask[g, T - Tg:].to(device),
                                    position_ids=pos[g, T - Ng:].to(device), **{self._cache_kw: cache}, use_cache=True,
                                    logits_to_keep=1).logits[:, -1]
                parts.append((g, Tg, cache, logits))
            if not direct:  # one decode cache and logits row per context (a group's shared prompt expanded)
                cache, logits = self._assemble(parts, index, T, params.max_new_tokens)
            mask, pos = mask[sel].to(device), pos[sel, -1:].to(device)
            C, steps, kv = len(contexts), [], {}  # steps: (contexts of the batch rows, their ids, log-probs)
            live = torch.arange(C, device=device)  # the context of each batch row
            length = torch.full((C,), params.max_new_tokens, device=device)  # ids sampled, eos included
            done = torch.zeros(C, dtype=torch.bool, device=device)
            for step in range(params.max_new_tokens):
                tok, lp = sample(logits, params)
                tok = tok.masked_fill(done, self.pad_id)
                steps.append((live, tok, lp))
                ended = (tok == self.eos_id) & ~done
                length[live[ended]] = step + 1
                done |= ended
                if bool(done.all()) or step == params.max_new_tokens - 1:
                    break
                if 2 * int(done.sum()) >= len(done):  # half the rows have ended: they leave the batch
                    self._keep(kv, contexts, live[done], done.nonzero().squeeze(1), length, cache, T)
                    stay = (~done).nonzero().squeeze(1)
                    cache.reorder_cache(stay)
                    live, tok, mask, pos, done = live[stay], tok[stay], mask[stay], pos[stay], done[stay]
                mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
                pos = pos + 1
                logits = self.model(input_ids=tok[:, None], attention_mask=mask, position_ids=pos,
                                    **{self._cache_kw: cache}, use_cache=True).logits[:, -1]
            self._keep(kv, contexts, live, torch.arange(len(live), device=device), length, cache, T)
        gen_ids = torch.full((C, len(steps)), self.pad_id, dtype=torch.long, device=device)
        gen_lp = torch.zeros((C, len(steps)), device=device)
        for k, (rows, tok, lp) in enumerate(steps):
            gen_ids[rows, k], gen_lp[rows, k] = tok, lp.float()
        gens = []
        for i, (c, g, lp, n) in enumerate(zip(contexts, gen_ids.tolist(), gen_lp.tolist(), length.tolist())):
            gens.append(Generation(g[:n], lp[:n], g[n - 1] == self.eos_id))
            if self.reuse_kv:
                seq = c + g[: n - 1]
                kept[tuple(seq)] = _Kept(seq, kv[i])
        return gens

    def _keep(self, kv: dict, contexts, ctx_index, rows, length, cache: DynamicCache, T: int) -> None:
        """``kv[i]``: the keys and values of context i (at batch row ``rows[k]`` for
        ``i = ctx_index[k]``) and of every id sampled for it but the last (which never ran); the
        context is right-aligned at column T."""
        if not self.reuse_kv:
            return
        for i, r in zip(ctx_index.tolist(), rows.tolist()):
            a, b = T - len(contexts[i]), T + int(length[i]) - 1
            kv[i] = [(layer.keys[r, :, a:b].clone(), layer.values[r, :, a:b].clone()) for layer in cache.layers]

    def _cache(self, contexts, prefixes, P: int, N: int, room: int, device) -> DynamicCache:
        """A cache of P columns — each row's first ``len(ctx) - N`` tokens (from its kept prefix),
        right-aligned, zeros where the row is padded — with room for the N input tokens and
        ``room`` more."""
        if P == 0:
            return _growing_cache(room=room)
        first = next(p for p in prefixes if p is not None)
        layers = []
        for layer, (k0, v0) in enumerate(first.kv):
            H, D = k0.shape[0], k0.shape[2]
            keys = torch.zeros((len(contexts), H, P + N + room, D), dtype=k0.dtype, device=device)
            values = torch.zeros_like(keys)
            for r, (c, p) in enumerate(zip(contexts, prefixes)):
                n = len(c) - N  # this row's cached columns
                if n > 0:
                    keys[r, :, P - n:P] = p.kv[layer][0][:, :n]
                    values[r, :, P - n:P] = p.kv[layer][1][:, :n]
            layers.append(_GrowingLayer(room))
            layers[-1].adopt(keys, values, P)
        return _growing_cache(layers, room)

    @staticmethod
    def _assemble(parts, index: list[int], T: int, room: int) -> tuple[DynamicCache, torch.Tensor]:
        """The decode cache and next-token logits of every context: context i holds the prefill of
        unique row ``index[i]``, right-aligned in T columns (zeros where padded), with ``room`` more."""
        where = {r: (p, j) for p, (g, *_) in enumerate(parts) for j, r in enumerate(g)}
        logits = torch.stack([parts[where[r][0]][3][where[r][1]] for r in index])
        moves, device = [], logits.device  # per part: (its Tg, destination rows, source rows)
        for p, (g, Tg, *_) in enumerate(parts):
            dst = [i for i, r in enumerate(index) if where[r][0] == p]
            moves.append((Tg, torch.tensor(dst, device=device), torch.tensor([where[index[i]][1] for i in dst], device=device)))
        layers = []
        for li, l0 in enumerate(parts[0][2].layers):
            B, (_, H, _, D) = len(index), l0.keys.shape
            keys = l0.keys.new_zeros((B, H, T + room, D))
            values = torch.zeros_like(keys)
            for (Tg, dst, src), (_, _, cache, _) in zip(moves, parts):
                keys[dst, :, T - Tg:T] = cache.layers[li].keys[src]
                values[dst, :, T - Tg:T] = cache.layers[li].values[src]
            layers.append(_GrowingLayer(room))
            layers[-1].adopt(keys, values, T)
        return _growing_cache(layers, room), logits
