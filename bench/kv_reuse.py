"""KV reuse across turns: multi-turn episodes with HFEngine(reuse_kv=True) vs a full prefill of
every turn (reuse_kv=False), side by side, same seed.

    python bench/kv_reuse.py                                   # SmolLM2-135M-Instruct (the default model)
    python bench/kv_reuse.py --model tiny                       # the tiny from-scratch model
    python bench/kv_reuse.py --episodes 32 --turns 3 --repeats 2
    python bench/kv_reuse.py --data hotpotqa                   # real HotpotQA questions and search results
    python bench/kv_reuse.py --run outputs/default             # the pipeline's own RL rollout from its SFT agent

The workload is what the full-history context manager builds: each episode starts from a real
question of the synthetic world under the default system prompt; after each sampled turn a search
result (a corpus document, as the tool renders it) is appended as a ``tool`` message with the
next assistant header (``--data hotpotqa``: dev questions of the shipped HotpotQA data, and as
observations the search tool's real output for a question, top 2 paragraphs cut at the
environment's 1,200 characters, as the ``hotpotqa`` pipeline sees them); ``--turns`` turns per episode; the engine sees exactly the contexts the
agent loop would give it. Both modes sample with the same seed: the script checks that they
sampled the same ids. It prints prefill tokens per episode, wall time per episode, and the
ratios, measured back to back (the order alternates between repeats; medians are reported).

``--run OUT`` measures the RL stage's rollout itself instead: the pipeline's (``--pipeline``)
environment, tools, prompt, group size, questions per iteration, sampling and turn limits, from
the SFT agent in ``OUT/checkpoints/sft`` over ``OUT/data`` (a finished ``agent-r1 train`` run);
each repeat draws the iteration's questions as the trainer does.
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
    p.add_argument("--run", metavar="OUT", help="measure the RL stage's rollout from OUT/checkpoints/sft over OUT/data")
    p.add_argument("--pipeline", default="default", help="with --run: the pipeline whose env and rl settings to use")
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


def pipeline_rollout(args):
    """The RL stage's rollout (``rl_driver.sample_episodes``: ``group_size`` episodes of each of
    ``tasks_per_iteration`` questions, through ``run_episodes``) from a run's SFT agent: one runner per mode."""
    from agent_r1.config import load_config
    from agent_r1.data.synthetic import load_split
    from agent_r1.models import load_model
    from agent_r1.rollout import run_episodes
    from agent_r1.run import Agent, make_tools, tasks_for

    out = Path(args.run)
    cfg = load_config(args.pipeline, overrides={"output_dir": str(out)})
    model, tok = load_model(str(out / "checkpoints" / "sft"))
    model.eval()
    agent = Agent(model, tok, make_tools(cfg, out / "data"), cfg)
    tasks = tasks_for(load_split(out / "data", "train"), cfg.rl.hops, seed=cfg.seed, qtypes=cfg.rl.qtypes)
    cm = agent.context()

    params = SamplingParams(cfg.rl.temperature, cfg.rl.top_p, cfg.env.max_new_tokens)

    def run(engine, seed):
        pick = torch.randperm(len(tasks), generator=torch.Generator().manual_seed(seed))[: cfg.rl.tasks_per_iteration]
        reps = [tasks[i] for i in pick for _ in range(cfg.rl.group_size)]
        groups = [k for k in range(len(pick)) for _ in range(cfg.rl.group_size)]
        torch.manual_seed(seed)
        t0 = time.perf_counter()
        trajs = run_episodes(engine, agent.make_env, reps, cm, params, groups, cfg.env.max_context_tokens)
        return time.perf_counter() - t0, trajs

    title = (f"{out / 'checkpoints' / 'sft'}: the {args.pipeline!r} pipeline's RL rollout, {cfg.rl.tasks_per_iteration} "
             f"questions x group {cfg.rl.group_size}, max_new_tokens {cfg.env.max_new_tokens}, ≤ {cfg.env.max_turns} turns")
    return model, tok, run, title


def measure(engines: dict, run, repeats: int, seed: int) -> tuple[dict, dict, dict]:
    """``run(engine, seed) -> (seconds, result)`` for every engine, ``repeats`` times, the order
    alternating between repeats: the times per engine, each engine's last stats, the results
    by (engine, repeat)."""
    times, stats, results = {k: [] for k in engines}, {}, {}
    for r in range(repeats):
        for name in (list(engines) if r % 2 == 0 else list(engines)[::-1]):
            dt, results[(name, r)] = run(engines[name], seed + r)
            times[name].append(dt)
            stats[name] = engines[name].stats()
    return times, stats, results


def print_ratios(engines: dict, ids: dict, stats: dict, times: dict, repeats: int) -> None:
    """For each reuse engine and its full-prefill twin: same ids?, and the two ratios."""
    for a in (name for name in engines if name.startswith("reuse")):
        b = a.replace("reuse", "full prefill")
        tag = a.removeprefix("reuse").removeprefix(", ")
        suffix = f"_{tag}" if tag else ""
        same = all(ids[(a, r)] == ids[(b, r)] for r in range(repeats))
        print(f"same sampled ids with and without reuse{f' ({tag})' if tag else ''}: {same}")
        print(f"ratio_prefill_tokens_full_over_reuse{suffix}: {stats[b]['prefill_tokens'] / stats[a]['prefill_tokens']:.2f}")
        print(f"ratio_wall_full_over_reuse{suffix}: {statistics.median(times[b]) / statistics.median(times[a]):.2f}")


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.run:
        return main_run(args)
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
    times, stats, ids = measure(engines, lambda eng, seed: episodes(eng, cm, prompts, docs, args.turns, params, seed),
                                args.repeats, args.seed)

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
    print_ratios(engines, ids, stats, times, args.repeats)


def main_run(args) -> None:
    model, tok, run, title = pipeline_rollout(args)
    engines = {"reuse": HFEngine(model, tok, reuse_kv=True), "full prefill": HFEngine(model, tok, reuse_kv=False)}
    times, stats, trajs = measure(engines, run, args.repeats, args.seed)
    ids = {key: [[s.action_ids for s in t.steps] for t in ts] for key, ts in trajs.items()}

    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{title}, {torch.get_num_threads()} threads (median of {args.repeats})")
    for col in ("mode", "episodes", "turns / episode", "sampled tokens / turn", "prefill tokens / episode (last repeat)",
                "reused share", "s / rollout"):
        table.add_column(col, justify="left" if col == "mode" else "right")
    for name in engines:
        turns = [len(t) for t in ids[(name, args.repeats - 1)]]
        n, sampled = len(turns), sum(len(a) for t in ids[(name, args.repeats - 1)] for a in t)
        table.add_row(name, str(n), f"{sum(turns) / n:.2f}", f"{sampled / sum(turns):.1f}",
                      f"{stats[name]['prefill_tokens'] / n:.0f}", f"{stats[name]['prefill_reused_share']:.2f}",
                      f"{statistics.median(times[name]):.1f}")
    Console(width=160).print(table)
    print_ratios(engines, ids, stats, times, args.repeats)


if __name__ == "__main__":
    main()
