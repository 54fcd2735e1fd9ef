"""`ReferenceEngine`: the rollout-engine contract in its plainest form, to test
:class:`~agent_r1.rollout.engine.HFEngine` against. One context at a time, a full forward pass
over the whole sequence for every sampled id: no KV cache, no padding, no batching, no prefix
reuse, no deduplication. It samples with the same :func:`~agent_r1.rollout.sampling.sample` and
the same per-context generators, so for a seed both engines draw the same ids."""

from __future__ import annotations

import torch

from agent_r1.models import autocast
from agent_r1.rollout.engine import Generation, RolloutEngine
from agent_r1.rollout.sampling import SamplingParams, context_generators, sample


class ReferenceEngine(RolloutEngine):
    def __init__(self, model: torch.nn.Module, tokenizer, precision: str = "auto"):
        self.model = model
        self.eos_id = tokenizer.eos_token_id
        self.precision = precision  # agent_r1.models.autocast
        self.reset()

    def reset(self) -> None:
        self.prefill_tokens = 0

    def stats(self) -> dict:
        return {"prefill_tokens": self.prefill_tokens, "prefill_reused_share": 0.0}

    @torch.no_grad()
    def generate(self, contexts: list[list[int]], params: SamplingParams) -> list[Generation]:
        device = next(self.model.parameters()).device
        generators = context_generators(len(contexts), params, device)
        was_training = self.model.training
        self.model.eval()
        try:
            with autocast(self.precision, device):
                out = [self._turn(c, params, generators and [generators[i]], device) for i, c in enumerate(contexts)]
        finally:
            self.model.train(was_training)
        self.prefill_tokens += sum(map(len, contexts))
        return out

    def _turn(self, ctx: list[int], params: SamplingParams, generators, device) -> Generation:
        ids, logprobs = [], []
        while len(ids) < params.max_new_tokens and (not ids or ids[-1] != self.eos_id):
            seq = torch.tensor([ctx + ids], device=device)
            logits = self.model(input_ids=seq, attention_mask=torch.ones_like(seq), use_cache=False).logits[:, -1]
            tok, lp = sample(logits, params, generators)
            ids.append(int(tok))
            logprobs.append(float(lp))
        return Generation(ids, logprobs, ids[-1] == self.eos_id)
