"""The rollout-engine interface and its default Hugging Face implementation, :class:`HFEngine`
(its parts: ``kv_store``, ``prefill``, ``kv_cache``, ``decode`` and ``sampling`` beside this module;
``reference`` holds the plain engine it is tested against).

An engine takes a batch of context token ids and returns, for each, the token ids it sampled
and their log-probs under the sampling distribution (after temperature and top-p). The learner
trains on exactly those ids (token in, token out).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from agent_r1.models import autocast, cache_kwarg, resolve_precision, rollout_precision
from agent_r1.rollout.decode import DecodeLoop
from agent_r1.rollout.kv_cache import decode_cache, prefix_cache
from agent_r1.rollout.kv_store import Kept, KVStore
from agent_r1.rollout.prefill import PrefillPlan, plan_prefill
from agent_r1.rollout.sampling import SamplingParams, context_generators


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

    # the engine's weights are not known to be the learner's when a run starts (a server run elsewhere,
    # rollout.vllm.url): the trainer syncs them first
    syncs_at_start: bool = False

    @property
    def exact(self) -> bool:
        """Does it sample with the learner's numbers (its log-probs the learner's, to fp32 rounding)? An
        engine that does not (another precision, another kernel library) has its episodes weighed by the
        update's off-policy correction (``rl.learner.off_policy_correction``), as episodes sampled ahead are."""
        return True

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
    """The engine stopped answering or answers with failures (a server that crashed or was killed,
    HTTP 5xx, a truncated or malformed answer): :meth:`RolloutEngine.restart` may bring it back."""


class HFEngine(RolloutEngine):
    """Batched sampling with a ``transformers`` causal LM in process, sharing the policy module
    with the learner.

    **KV reuse across turns.** After each call the engine keeps every sequence's KV cache
    (context + generated ids) in its :class:`~agent_r1.rollout.kv_store.KVStore`. When a later
    context starts with a kept sequence — the full-history context manager only appends an
    observation and the next assistant header — only the appended tokens are prefilled; a context
    that rewrote its history (a sliding window) matches nothing and is prefilled in full.
    Identical new contexts (a GRPO group's shared prompt) are prefilled once. ``stats()`` reports
    the share of context tokens reused. The ids and log-probs are those of a full prefill: reuse
    changes only what is recomputed (:class:`~agent_r1.rollout.reference.ReferenceEngine`, which
    samples one context at a time without any of it, draws the same ids: each context samples
    from its own generator, see :func:`~agent_r1.rollout.sampling.context_generators`).

    Contexts go in batches of up to ``max_batch_size``. A batch is laid out right-aligned: each
    row's kept prefix sits in the cache, the tokens after it are the input, and the shorter rows
    are left-padded (masked, with positions counted from each row's first real token). The
    prefill runs in groups of rows with similar numbers of new tokens, each padded only to its own
    longest (:func:`~agent_r1.rollout.prefill.plan_prefill`); the decode steps then run on one
    cache of the whole batch (:class:`~agent_r1.rollout.decode.DecodeLoop`), from which rows whose
    turn has ended leave once they are half of it.
    """

    def __init__(self, model: torch.nn.Module, tokenizer, max_batch_size: int = 64, precision: str = "auto",
                 reuse_kv: bool = True):
        self.model = model
        self.eos_id = tokenizer.eos_token_id
        self.pad_id = tokenizer.pad_token_id
        self.max_batch_size = max_batch_size
        self.precision = precision  # the setting (model.precision); it computes in rollout_precision's answer
        self._cache_kw = cache_kwarg(model) if model is not None else "past_key_values"
        self.store = KVStore(enabled=reuse_kv)

    @property
    def reuse_kv(self) -> bool:
        return self.store.enabled

    @property
    def computes_in(self) -> str:
        """``fp32`` or ``bf16``: :func:`~agent_r1.models.rollout_precision` of the setting (``auto``: bf16 for
        a model of 10M parameters or more on a CPU with native bf16, where the learner computes in fp32)."""
        return rollout_precision(self.precision, self.model)

    @property
    def exact(self) -> bool:
        return self.computes_in == resolve_precision(self.precision, next(self.model.parameters()).device)

    def reset(self) -> None:
        self.store.reset()

    def stats(self) -> dict:
        return self.store.stats()

    @torch.no_grad()
    def generate(self, contexts: list[list[int]], params: SamplingParams) -> list[Generation]:
        device = next(self.model.parameters()).device
        generators = context_generators(len(contexts), params, device)
        kept: list[Kept] = []
        out: list[Generation] = []
        was_training = self.model.training
        self.model.eval()
        try:
            for i in range(0, len(contexts), self.max_batch_size):
                sl = slice(i, i + self.max_batch_size)
                out += self._generate_batch(contexts[sl], params, generators and generators[sl], kept, device)
        finally:
            self.model.train(was_training)
        self.store.keep(kept)
        return out

    def _forward(self, ids, mask, pos, cache, **kw) -> torch.Tensor:
        """The next-token logits [B, V] after ``ids``, the cache updated in place."""
        return self.model(input_ids=ids, attention_mask=mask, position_ids=pos, **{self._cache_kw: cache},
                          use_cache=True, **kw).logits[:, -1]

    def _generate_batch(self, contexts, params: SamplingParams, generators, kept: list[Kept], device) -> list[Generation]:
        plan = plan_prefill(contexts, [self.store.match(c) for c in contexts])
        self.store.count(sum(map(len, contexts)), plan.prefill_tokens)
        starts = [plan.width - len(c) for c in contexts] if self.store.enabled else None
        with autocast(self.computes_in, device):
            cache, logits, mask, pos = self._prefill(plan, params.max_new_tokens, device)
            # (eos_id read per call: bench/rollout.py sets it to -1 to force every turn's length)
            out = DecodeLoop(self._forward, self.eos_id, self.pad_id).run(cache, logits, mask, pos, params, generators,
                                                                          starts)
        if out.kv is not None:  # the last sampled id never ran: it starts the next context's new part
            kept += [Kept(c + g[:-1], kv) for c, g, kv in zip(contexts, out.ids, out.kv)]
        return [Generation(g, lp, g[-1] == self.eos_id) for g, lp in zip(out.ids, out.logprobs)]

    def _prefill(self, plan: PrefillPlan, room: int, device):
        """The decode cache of every context of the batch (``room`` spare columns), the next-token
        logits [contexts, V], the attention mask [contexts, width] and the last positions [contexts, 1]."""
        ids, mask, pos = (t.to(device) for t in plan.layout(self.pad_id))
        T, caches, logits = plan.width, [], []
        for g in plan.groups:  # the rows' kept prefixes sit in the cache, the tokens after them are the input
            caches.append(prefix_cache([plan.rows[r] for r in g.rows], g, room if plan.direct else 0, device))
            logits.append(self._forward(ids[g.rows, T - g.new:], mask[g.rows, T - g.width:], pos[g.rows, T - g.new:],
                                        caches[-1], logits_to_keep=1))
        if plan.direct:  # the group's cache is the decode cache
            cache = caches[0]
        else:  # one decode cache row per context (a group's shared prompt expanded)
            cache = decode_cache(plan.groups, caches, plan.row_of, T, room)
        sel = torch.tensor(plan.row_of, device=device)
        return cache, torch.cat(logits)[plan.logit_rows()], mask[sel], pos[sel, -1:]
