"""The ``code`` task: procedurally generated problems whose answers need exact computation.

Each problem is a number a 135M model cannot produce in its head (products of 3- and 4-digit
numbers, sums of primes, terms of sequences, counts over ranges), so an agent that answers
right has run code: the ``python`` tool (agent_r1/tools/python.py). Every task row carries the
reference program (``code``, a short one-liner that prints the answer: the SFT demonstration's
tool call) and its output as the gold answer, computed here by the same expression in Python.

Kinds (``qtype``), each drawn from its own parameter ranges:

- ``arithmetic``: ``a * b - c * d + e`` with 3- and 4-digit numbers;
- ``prime_sum``: the sum of the primes below ``n``;
- ``fibonacci``: the ``n``-th term of a Fibonacci-like sequence from two given terms;
- ``divisible_count``: how many integers in 1..n are divisible by ``a`` or ``b``;
- ``digit_sum``: the sum of the digits of ``a ** b``;
- ``collatz``: the steps from ``n`` to 1 of the Collatz map.

Splits are seeded and disjoint: the train and test problems come from one seeded stream of
distinct parameter draws, the first ``n_test`` of each kind to the test split. With ``test_range:
beyond`` the test problems are drawn instead from ranges past the training ones (:data:`BEYOND`:
longer numbers, later terms, larger bounds), with the same questions and programs, and the train
and val problems stay what they are with the default: a held-out variant that a model answering
from memory of its training numbers fails and a model that writes the program passes.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from agent_r1.data.synthetic import write_tasks

CODE_FIELDS = ("question", "answers", "qtype", "code")


def _primes_below(n: int) -> int:
    return sum(p for p in range(2, n) if all(p % d for d in range(2, int(p ** 0.5) + 1)))


def _fibonacci(a: int, b: int, n: int) -> int:
    for _ in range(n - 1):
        a, b = b, a + b
    return a


def _collatz(n: int) -> int:
    steps = 0
    while n != 1:
        n, steps = (n // 2 if n % 2 == 0 else 3 * n + 1), steps + 1
    return steps


# kind -> (draw parameters, question, reference program, answer)
_Kind = tuple[Callable[[random.Random], tuple], Callable[..., str], Callable[..., str], Callable[..., int]]
KINDS: dict[str, _Kind] = {
    "arithmetic": (
        lambda r: (r.randint(100, 999), r.randint(1000, 9999), r.randint(100, 999), r.randint(100, 999), r.randint(1000, 99999)),
        lambda a, b, c, d, e: f"What is {a} * {b} - {c} * {d} + {e}?",
        lambda a, b, c, d, e: f"print({a} * {b} - {c} * {d} + {e})",
        lambda a, b, c, d, e: a * b - c * d + e,
    ),
    "prime_sum": (
        lambda r: (r.randint(100, 3000),),
        lambda n: f"What is the sum of all prime numbers below {n}?",
        lambda n: f"print(sum(p for p in range(2, {n}) if all(p % d for d in range(2, int(p ** 0.5) + 1))))",
        _primes_below,
    ),
    "fibonacci": (
        lambda r: (r.randint(1, 9), r.randint(1, 9), r.randint(20, 60)),
        lambda a, b, n: f"A sequence starts {a}, {b}, and each next term is the sum of the previous two. What is term {n}?",
        lambda a, b, n: "a, b = %d, %d\nfor _ in range(%d):\n    a, b = b, a + b\nprint(a)" % (a, b, n - 1),
        _fibonacci,
    ),
    "divisible_count": (
        lambda r: (r.randint(1000, 99999), r.randint(3, 13), r.randint(14, 29)),
        lambda n, a, b: f"How many integers from 1 to {n} are divisible by {a} or {b}?",
        lambda n, a, b: f"print(sum(1 for i in range(1, {n} + 1) if i % {a} == 0 or i % {b} == 0))",
        lambda n, a, b: n // a + n // b - n // math.lcm(a, b),
    ),
    "digit_sum": (
        lambda r: (r.randint(2, 9), r.randint(30, 200)),
        lambda a, b: f"What is the sum of the digits of {a} to the power {b}?",
        lambda a, b: f"print(sum(int(c) for c in str({a} ** {b})))",
        lambda a, b: sum(int(c) for c in str(a ** b)),
    ),
    "collatz": (
        lambda r: (r.randint(30, 9999),),
        lambda n: f"How many steps does the Collatz sequence (n -> n/2 if n is even, else 3n+1) take from {n} to reach 1?",
        lambda n: f"n, s = {n}, 0\nwhile n != 1:\n    n, s = (n // 2 if n % 2 == 0 else 3 * n + 1), s + 1\nprint(s)",
        _collatz,
    ),
}


# kind -> its draw past the training ranges (test_range: beyond); each range starts above the training one
BEYOND: dict[str, Callable[[random.Random], tuple]] = {
    "arithmetic": lambda r: (r.randint(1000, 9999), r.randint(10000, 99999), r.randint(1000, 9999), r.randint(1000, 9999),
                             r.randint(100000, 999999)),
    "prime_sum": lambda r: (r.randint(3001, 20000),),
    "fibonacci": lambda r: (r.randint(10, 99), r.randint(10, 99), r.randint(61, 150)),
    "divisible_count": lambda r: (r.randint(100000, 999999), r.randint(3, 13), r.randint(14, 29)),
    "digit_sum": lambda r: (r.randint(2, 9), r.randint(201, 600)),
    "collatz": lambda r: (r.randint(10000, 999999),),
}


@dataclass(frozen=True)
class CodeTaskConfig:
    """``n_train``, ``n_test`` and ``n_val`` problems of each kind in ``kinds`` (default: all), from
    ``seed``; ``test_range``: ``train`` (the test problems from the training ranges) or ``beyond``."""

    seed: int = 0
    n_train: int = 200
    n_test: int = 40
    n_val: int = 0
    kinds: tuple[str, ...] = tuple(KINDS)
    test_range: str = "train"


def generate_code_tasks(cfg: CodeTaskConfig) -> dict[str, list[dict]]:
    """``{"train": rows, "test": rows}`` (and ``"val"`` with ``n_val``): each kind's first ``n_test``
    distinct draws are test problems, the next ``n_train`` train ones (no problem is in both). The
    val problems are drawn afterwards from a generator of their own, apart from both: train and
    test are the same with or without them. With ``test_range: beyond`` the test problems are
    drawn last, from :data:`BEYOND` and a generator of their own: train and val are unchanged."""
    unknown = sorted(set(cfg.kinds) - set(KINDS))
    if unknown:
        raise ValueError(f"code task kinds {unknown} are unknown; known: {sorted(KINDS)}")
    rng, val_rng = random.Random(cfg.seed), random.Random(f"{cfg.seed}-val")
    splits: dict[str, list[dict]] = {"train": [], "test": []} | ({"val": []} if cfg.n_val else {})
    seen: dict[str, set[tuple]] = {kind: set() for kind in cfg.kinds}

    def add(kind: str, split: str, params: tuple) -> None:
        _, question, program, answer = KINDS[kind]
        seen[kind].add(params)
        splits[split].append({"id": f"{split}-{kind}-{len(splits[split]):05d}", "question": question(*params),
                              "answers": [str(answer(*params))], "qtype": kind, "code": program(*params)})

    def draw_new(kind: str, draw: Callable[[random.Random], tuple], generator: random.Random, total: int) -> tuple:
        for _ in range(100 * total):
            if (params := draw(generator)) not in seen[kind]:
                return params
        raise ValueError(f"code task kind {kind!r}: only {len(seen[kind])} distinct problems for "
                         f"n_train + n_test + n_val = {total}")

    for kind in cfg.kinds:
        for k in range(cfg.n_train + cfg.n_test):
            add(kind, "test" if k < cfg.n_test else "train", draw_new(kind, KINDS[kind][0], rng, cfg.n_train + cfg.n_test))
    for kind in cfg.kinds:
        for _ in range(cfg.n_val):
            add(kind, "val", draw_new(kind, KINDS[kind][0], val_rng, cfg.n_train + cfg.n_test + cfg.n_val))
    if cfg.test_range == "beyond":  # the same train and val; the test problems drawn past their ranges
        splits["test"] = []
        beyond_rng = random.Random(f"{cfg.seed}-beyond")
        for kind in cfg.kinds:
            for _ in range(cfg.n_test):
                add(kind, "test", draw_new(kind, BEYOND[kind], beyond_rng, cfg.n_test))
    elif cfg.test_range != "train":
        raise ValueError(f"code test_range must be train or beyond, got {cfg.test_range!r}")
    return splits


def write_code_tasks(cfg: CodeTaskConfig, out: Path) -> Path:
    """The generated splits as ``<out>/{train,test,val}.parquet`` (task tables, agent_r1.data)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "corpus.parquet").unlink(missing_ok=True)
    (out / "val.parquet").unlink(missing_ok=True)
    for split, rows in generate_code_tasks(cfg).items():
        write_tasks(rows, out / f"{split}.parquet", split, CODE_FIELDS, f"the generated code {split} split")
    return out
