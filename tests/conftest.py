"""Shared fixtures: a tiny tokenizer and model, a small search corpus, and a scripted engine.

Everything here is small enough for a 2-core CPU: the tokenizer has ~300 tokens and the model
~30k parameters. DeepSpeed's process group is started once per process (by the first Learner)
and reused by every later one.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

from agent_r1.learner import token_logprobs
from agent_r1.models import TinyModelConfig, build_tiny_model, train_tokenizer
from agent_r1.rollout import Generation, HFEngine, RolloutEngine, SamplingParams

# Tiny matrices gain nothing from intra-op threads, and on a busy machine every op of a
# multi-threaded torch waits for its threads to be scheduled (~10 ms per op instead of ~10 µs).
torch.set_num_threads(1)

TINY = TinyModelConfig(
    hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=64, vocab_size=300
)

CORPUS = pd.DataFrame(
    {
        "doc_id": [0, 1, 2, 3, 4],
        "title": ["Mona Lisa", "Louvre", "Danube", "Berlin Wall", "Eiffel Tower"],
        "text": [
            "A portrait by Leonardo da Vinci, kept at the Louvre.",
            "The Louvre is an art museum in Paris.",
            "A river flowing through Vienna and Budapest.",
            "A barrier that divided Berlin from 1961 to 1989.",
            "A wrought-iron tower in Paris, built in 1889.",
        ],
    }
)
TASKS = [
    {
        "id": "mona",
        "question": "In which city is the museum that keeps the Mona Lisa?",
        "answers": ["Paris"],
        "gold_titles": ["Mona Lisa", "Louvre"],
    },
    {
        "id": "danube",
        "question": "Which river flows through Vienna?",
        "answers": ["Danube"],
        "gold_titles": ["Danube"],
    },
]


def _training_texts() -> list[str]:
    words = "the a of in is to and search answer query name arguments tool call Paris city river museum".split()
    texts = list(CORPUS.title) + list(CORPUS.text) + [t["question"] for t in TASKS]
    texts += [f"{w} {v} {i}" for i, (w, v) in enumerate(zip(words * 10, reversed(words * 10)))]
    texts += [
        json.dumps({"name": "search", "arguments": {"query": q}}) for q in ["Mona Lisa", "Louvre", "Danube river"]
    ]
    return texts * 3


@pytest.fixture(scope="session")
def tok():
    return train_tokenizer(_training_texts(), vocab_size=TINY.vocab_size)


@pytest.fixture(scope="session")
def make_model(tok):
    """A fresh tiny model; the same ``seed`` gives the same weights. ``std`` re-draws every
    matrix with that std: at the default init (0.02) a random model's next-token distribution
    is nearly flat and greedy decoding repeats one token, so tests of decoding use ``std=0.3``."""

    def make(seed: int = 0, std: float | None = None):
        model = build_tiny_model(TINY, tok, seed=seed)
        if std is not None:
            g = torch.Generator().manual_seed(seed)
            with torch.no_grad():
                for p in model.parameters():
                    if p.dim() == 2:
                        p.normal_(0.0, std, generator=g)
        return model

    return make


@pytest.fixture(scope="session")
def frozen_learner(make_model):
    """A stage-0 Learner that is NEVER updated: for log-probs and annotation only."""
    from agent_r1.learner import Learner, LearnerConfig

    return Learner(make_model(seed=1, std=0.3), LearnerConfig(zero_stage=0))


@pytest.fixture(scope="session")
def corpus():
    return CORPUS


@pytest.fixture(scope="session")
def tasks():
    return TASKS


def char_split_ids(tok, text: str) -> list[int]:
    """``text`` as one token per character: a sequence that re-encoding would merge."""
    return [tok.convert_tokens_to_ids(t) for ch in text for t in tok.tokenize(ch)]


class ScriptedEngine(RolloutEngine):
    """Plays fixed turns: ``script[call][i]`` is the ids returned to context ``i`` of the
    ``call``-th ``generate`` call, or None to sample it from ``model`` (through ``HFEngine``).
    Scripted ids get their true log-probs under ``model`` (teacher forcing), so they look
    exactly like sampled ones to the learner. Calls past the script sample everything."""

    def __init__(self, model, tok, script: list[list[list[int] | None]]):
        self.model, self.tok, self.script = model, tok, script
        self.hf = HFEngine(model, tok)
        self.calls = 0
        self.eos_id = tok.eos_token_id

    @torch.no_grad()
    def generate(self, contexts, params: SamplingParams):
        plan = self.script[self.calls] if self.calls < len(self.script) else [None] * len(contexts)
        self.calls += 1
        assert len(plan) == len(contexts), (len(plan), len(contexts))
        free = [i for i, p in enumerate(plan) if p is None]
        sampled = dict(zip(free, self.hf.generate([contexts[i] for i in free], params))) if free else {}
        out = []
        for i, (ctx, ids) in enumerate(zip(contexts, plan)):
            if ids is None:
                out.append(sampled[i])
                continue
            full = torch.tensor([ctx + ids], device=next(self.model.parameters()).device)
            temp = params.temperature if params.temperature > 0 else 1.0
            was = self.model.training
            self.model.eval()
            lp = token_logprobs(self.model, full, torch.ones_like(full), temp)[0, len(ctx) :]
            self.model.train(was)
            out.append(Generation(list(ids), lp.tolist(), bool(ids) and ids[-1] == self.eos_id))
        return out


@pytest.fixture(scope="session")
def scripted_engine():
    """The ScriptedEngine class (fixtures keep test files free of conftest imports)."""
    return ScriptedEngine


@pytest.fixture(scope="session")
def split_ids():
    return char_split_ids
