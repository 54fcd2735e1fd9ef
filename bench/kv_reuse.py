"""KV reuse across turns: multi-turn episodes with HFEngine(reuse_kv=True) vs a full prefill of
every turn (reuse_kv=False), side by side, same seed.

    python bench/kv_reuse.py                                   # SmolLM2-135M-Instruct (the default model)
    python bench/kv_reuse.py --model tiny                       # the tiny from-scratch model
    python bench/kv_reuse.py --episodes 32 --turns 3 --repeats 2
    python bench/kv_reuse.py --data hotpotqa                   # real HotpotQA questions and search results

The workload is what the full-history context manager builds: each episode starts from a real
question of the synthetic world under the default system prompt; after each sampled turn a search
result (a corpus document, as the tool renders it) is appended as a ``tool`` message with the
next assistant header (``--data hotpotqa``: dev questions of the shipped HotpotQA data, and as
observations the search tool's real output for a question, top 2 paragraphs cut at the
environment's 1,200 characters, as the ``hotpotqa`` pipeline sees them); ``--turns`` turns per episode; the engine sees exactly the contexts the
agent loop would give it. Both modes sample with the same seed: the script checks that they
sampled the same ids. It prints prefill tokens per episode, wall time per episode, and the
ratios, measured back to back (the order alternates between repeats; medians are reported).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from agent_r1.context import ContextManager
from agent_r1.data.synthetic import WorldConfig, generate
from agent_r1.envs.qa import DEFAULT_SYSTEM_PROMPT
from agent_r1.rollout import HFEngine, SamplingParams


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m-instruct", help="a model name_or_path, or 'tiny'")
    p.add_argument("--data", choices=["synthetic", "hotpotqa"], default="synthetic",
                   help="synthetic: the default world, one corpus document per observation; hotpotqa: data/hotpotqa dev "
                        "questions, the search tool's top-2 output per observation (~4x longer)")
    p.add_argument("--episodes", type=int, default=32)
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--precisions", nargs="+", choices=["fp32", "bf16"], default=["fp32"],
                   help="compute precision(s) of the engine (bf16 autocast); each adds a reuse and a full-prefill row")
    return p.parse_args(argv)


def load(name: str, world):
    if name != "tiny":
        from agent_r1.models import load_model

        return load_model(name, device="cpu")
    from agent_r1.models import TinyModelConfig, build_tiny_model, train_tokenizer

    texts = list(world.corpus["text"]) + list(world.questions["question"])
    tok = train_tokenizer(texts, vocab_size=4096)
    return build_tiny_model(TinyModelConfig(vocab_size=4096), tok), tok


def workload(args, world) -> tuple[list[str], list[str]]:
    """The episodes' questions and the observations appended after their turns."""
    if args.data == "synthetic":
        docs = [f"(1) {t}: {x}" for t, x in zip(world.corpus["title"][:64], world.corpus["text"][:64])]
        return list(world.questions["question"][: args.episodes]), docs
    from agent_r1.config import EnvConfig
    from agent_r1.data.hotpotqa import load_hotpotqa
    from agent_r1.tools import SearchIndex, make_search_tool
    from agent_r1.tools.base import run_tool

    questions, corpus = load_hotpotqa(Path(__file__).resolve().parents[1] / "data" / "hotpotqa" / "dev.jsonl")
    questions = list(questions["question"][: max(args.episodes, 64)])
    tool = make_search_tool(SearchIndex(corpus), top_k=2, max_output_chars=EnvConfig().max_output_chars)
    return questions[: args.episodes], [run_tool(tool, {"query": q}).text for q in questions]


def episodes(engine, cm, prompts, docs, turns, params, seed) -> tuple[float, list]:
    """Wall time and every turn's sampled ids."""
    engine.reset()
    torch.manual_seed(seed)
    ctxs = [cm.start(m) for m in prompts]
    sampled = []
    t0 = time.perf_counter()
    for turn in range(turns):
        gens = engine.generate([cm.context_ids(c) for c in ctxs], params)
        sampled.append([g.ids for g in gens])
        if turn + 1 < turns:
            for i, (c, g) in enumerate(zip(ctxs, gens)):
                cm.observe(c, g.ids, [{"role": "tool", "name": "search", "content": docs[(i + turn) % len(docs)]}])
    return time.perf_counter() - t0, sampled


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    world = generate(WorldConfig(seed=args.seed, name_words=1, n_films=800, n_directors=260))
    model, tok = load(args.model, world)
    model.eval()
    questions, docs = workload(args, world)
    prompts = [[{"role": "system", "content": DEFAULT_SYSTEM_PROMPT}, {"role": "user", "content": q}] for q in questions]
    cm = ContextManager(tok)
    params = SamplingParams(temperature=1.0, max_new_tokens=args.max_new_tokens)
    engines = {}
    for prec in args.precisions:
        tag = "" if args.precisions == ["fp32"] else f", {prec}"
        engines[f"reuse{tag}"] = HFEngine(model, tok, reuse_kv=True, precision=prec)
        engines[f"full prefill{tag}"] = HFEngine(model, tok, reuse_kv=False, precision=prec)
    for eng in engines.values():
        episodes(eng, cm, prompts[:2], docs, 2, params, args.seed)  # warm-up
    times = {k: [] for k in engines}
    stats, ids = {}, {}
    for r in range(args.repeats):
        for name in (list(engines) if r % 2 == 0 else list(engines)[::-1]):
            dt, sampled = episodes(engines[name], cm, prompts, docs, args.turns, params, args.seed + r)
            times[name].append(dt)
            stats[name], ids[(name, r)] = engines[name].stats(), sampled
    pairs = [(name, name.replace("reuse", "full prefill")) for name in engines if name.startswith("reuse")]

    from rich.console import Console
    from rich.table import Table

    n = len(prompts)
    table = Table(title=f"{args.model}, {args.data}: {n} episodes x {args.turns} turns, max_new_tokens {args.max_new_tokens}, "
                        f"{torch.get_num_threads()} threads (median of {args.repeats})")
    for col in ("mode", "prefill tokens / episode", "reused share", "s / episode", "s / turn (all episodes)"):
        table.add_column(col, justify="left" if col == "mode" else "right")
    for name in engines:
        t = statistics.median(times[name])
        table.add_row(name, f"{stats[name]['prefill_tokens'] / n:.0f}", f"{stats[name]['prefill_reused_share']:.2f}",
                      f"{t / n:.3f}", f"{t / args.turns:.1f}")
    Console(width=140).print(table)
    for a, b in pairs:
        tag = a.removeprefix("reuse").removeprefix(", ")
        suffix = f"_{tag}" if tag else ""
        same = all(ids[(a, r)] == ids[(b, r)] for r in range(args.repeats))
        print(f"same sampled ids with and without reuse{f' ({tag})' if tag else ''}: {same}")
        print(f"ratio_prefill_tokens_full_over_reuse{suffix}: {stats[b]['prefill_tokens'] / stats[a]['prefill_tokens']:.2f}")
        print(f"ratio_wall_full_over_reuse{suffix}: {statistics.median(times[b]) / statistics.median(times[a]):.2f}")


if __name__ == "__main__":
    main()
