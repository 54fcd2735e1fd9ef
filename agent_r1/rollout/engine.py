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
    """Generates one model turn for many contexts at once."""

    @abstractmethod
    def generate(self, contexts: list[list[int]], params: SamplingParams) -> list[Generation]: ...


class HFEngine(RolloutEngine):
    """Batched ``transformers`` generation in process, sharing the policy module with the learner.

    Contexts are left-padded into batches of up to ``max_batch_size``; each batch is one
    ``generate`` call with a KV cache, so N episodes advance together in one forward per token.
    """

    def __init__(self, model: torch.nn.Module, tokenizer, max_batch_size: int = 64):
        self.model = model
        self.eos_id = tokenizer.eos_token_id
        self.pad_id = tokenizer.pad_token_id
        self.max_batch_size = max_batch_size

    @torch.no_grad()
    def generate(self, contexts: list[list[int]], params: SamplingParams) -> list[Generation]:
        out: list[Generation] = []
        for i in range(0, len(contexts), self.max_batch_size):
            out += self._generate_batch(contexts[i : i + self.max_batch_size], params)
        return out

    def _generate_batch(self, contexts: list[list[int]], params: SamplingParams) -> list[Generation]:
        L = max(len(c) for c in contexts)
        input_ids = torch.full((len(contexts), L), self.pad_id, dtype=torch.long)
        attn = torch.zeros_like(input_ids)
        for i, c in enumerate(contexts):
            input_ids[i, L - len(c) :] = torch.tensor(c)
            attn[i, L - len(c) :] = 1
        greedy = params.temperature <= 0
        was_training = self.model.training
        self.model.eval()
        device = next(self.model.parameters()).device
        res = self.model.generate(
            input_ids=input_ids.to(device),
            attention_mask=attn.to(device),
            do_sample=not greedy,
            temperature=None if greedy else params.temperature,
            top_p=None if greedy else params.top_p,
            top_k=None,
            max_new_tokens=params.max_new_tokens,
            eos_token_id=self.eos_id,
            pad_token_id=self.pad_id,
            output_scores=True,
            return_dict_in_generate=True,
        )
        self.model.train(was_training)
        new = res.sequences[:, L:]
        # scores are the processed logits the sampler drew from: [steps][B, V]
        logps = torch.stack([F.log_softmax(s.float(), dim=-1) for s in res.scores], dim=1)
        token_logps = logps.gather(-1, new.unsqueeze(-1)).squeeze(-1)
        gens = []
        for i in range(len(contexts)):
            ids = new[i].tolist()
            finished = self.eos_id in ids
            n = ids.index(self.eos_id) + 1 if finished else len(ids)
            gens.append(Generation(ids[:n], token_logps[i, :n].tolist(), finished))
        return gens
