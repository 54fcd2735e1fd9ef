"""Shared fixtures: a tiny tokenizer and model and a small search corpus.

Everything here is small enough for a 2-core CPU: the tokenizer has ~300 tokens and the model
~30k parameters. DeepSpeed's process group is started once per process (by the first Learner)
and reused by every later one.
"""

from __future__ import annotations

import json
import os

import pandas as pd
import pytest
import torch

from agent_r1.models import TinyModelConfig, build_tiny_model, train_tokenizer

# `make test` runs the suite on two pytest-xdist workers (-n 2 --dist loadgroup). A file's tests stay
# on one worker, in order (a module's fixture, e.g. its server, starts once); the files of a group
# below share one worker too, because they must not overlap: vLLM servers (memory; tests that count
# every server on the machine), mcp-server-time processes and the sandbox user's processes (counted
# machine-wide by their tests).
GROUPS = {
    "vllm": ("test_vllm.py", "test_vllm_async.py", "test_vllm_url.py",
             "test_bench.py::test_rollout_engines_hf_and_vllm", "test_bench.py::test_async_rollout"),
    "mcp": ("test_mcp.py", "test_examples.py"),
    "sandbox": ("test_sandbox.py", "test_code_task.py", "test_curves.py::test_code_tiny",
                "test_evaluate.py::test_the_readme_command"),
}


def xdist_group(nodeid: str) -> str:
    """The worker group of a test: its group in ``GROUPS``, else its file."""
    path, _, test = nodeid.partition("::")
    name = f"{path.rsplit('/', 1)[-1]}::{test}"
    return next((g for g, prefixes in GROUPS.items() if name.startswith(prefixes)), name.split("::")[0])


def pytest_collection_modifyitems(items):
    """The groups with the most slow tests first (with --no-loadscope-reorder the workers take the
    groups in this order: the longest start first), in file order within each."""
    groups = [xdist_group(item.nodeid) for item in items]
    slow = {g: 0 for g in groups}
    for item, group in zip(items, groups):
        slow[group] += item.get_closest_marker("slow") is not None
    items[:] = [item for _, _, item in sorted(zip((-slow[g] for g in groups), range(len(items)), items))]


def pytest_xdist_make_scheduler(config, log):
    """``--dist loadgroup`` by ``xdist_group``, read from each test's id in the controller. (xdist's own
    loadgroup reads an ``xdist_group`` mark that it writes into the test ids, which pytest 9.2's test
    ids no longer take: pytest-dev/pytest-xdist#1386; every test was then spread on its own.)"""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_group(nodeid)

    return GroupScheduling(config, log)


# The tests' vLLM servers (every one inherits this environment) run their model in the engine core
# process instead of a third process: on a CPU, vLLM then keeps its single-process executor (uni), and a
# server starts on ~20% less CPU (measured: 31 s -> 25 s; each process imports torch and vLLM anew). The
# servers' contract is unchanged: the API server, the engine core (VLLM::EngineCore), the watchdog.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

# Tiny matrices gain nothing from intra-op threads, and on a busy machine every op of a
# multi-threaded torch waits for its threads to be scheduled (~10 ms per op instead of ~10 µs).
# The processes the tests start inherit one thread too: two workers of two-thread processes on two
# cores spin in OpenMP's barriers (the textworld-tiny pipeline: 129 s of CPU with the default, 48 s
# with one thread, beside one other busy process).
torch.set_num_threads(1)
os.environ.setdefault("OMP_NUM_THREADS", "1")

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


@pytest.fixture(scope="session", autouse=True)
def own_agent_r1_cache(tmp_path_factory):
    """The suite's cache folder (``AGENT_R1_CACHE``, also for the processes tests start): the
    evaluations of one session share their baselines' scores there, never with the user's cache,
    whose scores came from other code (agent_r1/pipeline/score_cache.py). No test uses a packaged model."""
    before = os.environ.get("AGENT_R1_CACHE")
    os.environ["AGENT_R1_CACHE"] = str(tmp_path_factory.mktemp("agent-r1-cache"))
    yield
    if before is None:
        os.environ.pop("AGENT_R1_CACHE", None)
    else:
        os.environ["AGENT_R1_CACHE"] = before


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

    return Learner(make_model(seed=1, std=0.3), LearnerConfig(zero_stage=0), precision="fp32")


@pytest.fixture(scope="session")
def corpus():
    return CORPUS


@pytest.fixture(scope="session")
def tasks():
    return TASKS


def char_split_ids(tok, text: str) -> list[int]:
    """``text`` as one token per character: a sequence that re-encoding would merge."""
    return [tok.convert_tokens_to_ids(t) for ch in text for t in tok.tokenize(ch)]


@pytest.fixture(scope="session")
def split_ids():
    return char_split_ids
