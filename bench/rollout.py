"""Rollout throughput: batched episodes (HFEngine) vs one episode at a time (plain model.generate).

    python bench/rollout.py                       # default tiny model, N=64, batch sizes 16/32/64
    python bench/rollout.py --hidden 384 --layers 6 --heads 6 --kv-heads 2 --ffn 1024
    python bench/rollout.py --n 32 --batch-sizes 8 32 --repeats 5 --threads 1
    python bench/rollout.py --model smollm2 --precisions fp32 bf16 --n 16 --serial-n 4 --batch-sizes 16 --threads 1

    python bench/rollout.py --engines hf vllm      # HFEngine vs a vLLM server on SmolLM2 (make vllm first)
    python bench/rollout.py --engines hf --precisions fp32 bf16 --pipeline code --workloads pipeline

``--engines hf vllm`` compares the rollout engines instead (:func:`compare_engines`): the pipeline's
model (SmolLM2-135M, weights fp32) behind each engine as the pipeline builds it
(``agent_r1.rollout.build.make_engine``), in each of ``--precisions``, one after the other, on (1) the
``--pipeline``'s RL rollout (``default`` or ``code``): its environment, tools, prompt and sampling,
8 tasks x group 8 = 64 episodes of up to 3 turns, and (2) a long-context workload: 16 histories of
1,000-1,200 tokens, 3 turns each, every turn appending its ids and a ~100-token observation. It reports
episodes/s, new tokens/s, prefill reuse, wall and CPU time per engine and workload, the log-prob gap
to the fp32 learner, and the machine's limit on the same work (:func:`bound`: every token's matmul
FLOPs at the measured matmul rate, and the weight-streaming bound) with each engine's fraction of it;
the last line is ``ratio_<engine>_over_hf_episodes_per_s`` for the pipeline workload. ``--smoke``
runs the same on the tiny pipeline's untrained model at the smallest sizes (a test that it runs).

Otherwise it builds the offline pipeline's model (``TinyModelConfig``, randomly initialised) with a BPE
tokenizer trained on the synthetic QA world's text, and N contexts of 100-200 tokens (varied
lengths, cut from that text and ending in an assistant-turn header). Then, per repeat and side by
side in the same process:

- mode A: ``HFEngine(model, tok, max_batch_size=bs).generate(contexts, SamplingParams(...))`` —
  all N contexts, left-padded into batches of ``bs``, one ``model.generate`` per batch;
- mode B: a plain loop of ``model.generate`` on one context at a time (batch 1, no padding, no
  scores), same sampling settings (temperature 1, top_p 1, no top-k, ``max_new_tokens``).

An untrained model rarely samples the end-of-turn token, so by default both modes are forced to a
fixed length (``generation_config.min_new_tokens = max_new_tokens``, which masks eos until then):
the token counts of both modes are then equal and exactly N x max_new_tokens. ``--no-force-length``
lets eos end a sequence early (counted tokens stop at eos, inclusive).

``--model smollm2`` runs the packaged SmolLM2-135M-Instruct (its own tokenizer) instead of the
tiny model; ``--precisions fp32 bf16`` adds the HFEngine rows once per compute precision (bf16
autocast; mode B stays fp32).

Extra rows: ``B'`` runs HFEngine with max_batch_size=1 (the engine's own per-episode cost, with
its log-probs); ``sorted by length`` feeds HFEngine the same N contexts sorted by length so
each batch is left-padded less (``--no-sorted`` skips). (HFEngine runs its own sampling loop, not
``model.generate``: its length is forced by giving it an end-of-turn id no token has.) KV reuse
across turns is measured by ``bench/kv_reuse.py``.

eps/s = episodes (one generated turn each) per second of wall time; tok/s = generated tokens per
second (prompt tokens are not counted). ``ratio`` = eps/s of the row / eps/s of mode B, computed
per repeat (A and B measured back to back, the order of the rows alternating between repeats),
then the median over the repeats is printed — over the *quiet* repeats (no other process busy
while any of its rows ran, ``--quiet``) when there are any.

On a shared machine: each repeat line says how many cores other processes kept busy, and how long
a 1M-float multiply took (~0.05 ms normally; several ms means torch's OpenMP threads spin-wait for
a core another process holds, which slows every op by a scheduler time slice: the script then
prints a warning and does not judge the goal). ``--omp-wait-policy passive`` sets OMP_WAIT_POLICY
before torch loads, which removes that stall (and costs ~10-20% on a quiet machine); ``--budget-s``
bounds the run time.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import time
from dataclasses import dataclass

from machine import (
    apply_omp_wait_policy,
    cpu_snapshot,
    elementwise_probe,
    matmul_flops,
    others_cores,
    read_bandwidth,
    warn_if_spinning,
)

if __name__ == "__main__":
    apply_omp_wait_policy()  # before torch loads

import torch

from agent_r1.data.synthetic import WorldConfig, generate
from agent_r1.models import (
    IM_END,
    IM_START,
    TinyModelConfig,
    build_tiny_model,
    train_tokenizer,
)
from agent_r1.rollout.engine import HFEngine, SamplingParams


def parse_args(argv=None):
    d = TinyModelConfig()
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=["tiny", "smollm2"], default="tiny",
                   help="the tiny from-scratch model (sized by the model flags) or SmolLM2-135M-Instruct")
    p.add_argument("--precisions", nargs="+", choices=["fp32", "bf16"], default=["fp32"],
                   help="HFEngine compute precision(s) (with --engines: every engine's); each adds its own rows")
    p.add_argument("--n", type=int, default=64, help="number of contexts / episodes for mode A")
    p.add_argument("--serial-n", type=int, default=16,
                   help="contexts run one at a time for mode B per repeat (a subset of the N; its rate is per episode)")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[16, 32, 64], help="HFEngine max_batch_size values")
    p.add_argument("--min-ctx", type=int, default=100)
    p.add_argument("--max-ctx", type=int, default=200)
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--no-force-length", action="store_true", help="let eos end a sequence before max_new_tokens")
    p.add_argument("--no-sorted", dest="sorted", action="store_false",
                   help="skip the rows that feed HFEngine the contexts sorted by length (less left padding)")
    p.add_argument("--no-engine-bs1", dest="engine_bs1", action="store_false",
                   help="skip the row that runs HFEngine with max_batch_size=1 on the serial subset")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="torch.set_num_threads (default: all cores)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quiet", type=float, default=0.25,
                   help="a repeat counts as quiet when other processes used fewer cores than this during each of "
                        "its rows; medians use the quiet repeats when there are any")
    p.add_argument("--budget-s", type=float, default=120.0,
                   help="stop repeating after this many seconds (the first repeat always completes; a later one "
                        "that runs over is dropped)")
    p.add_argument("--omp-wait-policy", choices=["passive", "active"],
                   help="set OMP_WAIT_POLICY before torch loads (default: the environment's; libgomp spins, then sleeps)")
    p.add_argument("--engines", nargs="+", choices=["hf", "vllm"],
                   help="compare these rollout engines (each in every --precisions) on the pipeline's model instead")
    p.add_argument("--pipeline", choices=["default", "code"], default="default",
                   help="with --engines: the pipeline whose RL rollout is the pipeline workload")
    p.add_argument("--tasks", type=int, help="with --engines: tasks of the pipeline workload (default: the pipeline's "
                                             "rl.tasks_per_iteration; each a group of rl.group_size episodes)")
    p.add_argument("--workloads", nargs="+", choices=["pipeline", "long-context"], default=["pipeline", "long-context"],
                   help="with --engines: the workloads to run")
    p.add_argument("--mm", type=int, default=2048, help="with --engines: the size of the matmul that measures the "
                                                        "machine's rate")
    p.add_argument("--long-n", type=int, default=16, help="with --engines: histories of the long-context workload")
    p.add_argument("--smoke", action="store_true",
                   help="with --engines: the tiny pipeline's untrained model, 2 questions x group 2, histories of 200-300 "
                        "tokens (a test that the script runs, in seconds; not a measurement)")
    g = p.add_argument_group("model (defaults: TinyModelConfig)")
    g.add_argument("--vocab", type=int, default=d.vocab_size)
    g.add_argument("--hidden", type=int, default=d.hidden_size)
    g.add_argument("--layers", type=int, default=d.num_layers)
    g.add_argument("--heads", type=int, default=d.num_heads)
    g.add_argument("--kv-heads", type=int, default=d.num_kv_heads)
    g.add_argument("--ffn", type=int, default=d.intermediate_size)
    return p.parse_args(argv)


def make_contexts(tok, texts: list[str], n: int, lo: int, hi: int, seed: int) -> list[list[int]]:
    """N contexts of lo..hi tokens: a user turn of corpus text + an assistant-turn header."""
    rng = random.Random(seed)
    stream: list[int] = []
    for t in texts:
        stream += tok(t + "\n")["input_ids"]
    head = tok(f"{IM_START}user\n")["input_ids"]
    tail = tok(f"{IM_END}\n{IM_START}assistant\n")["input_ids"]
    out = []
    for _ in range(n):
        length = rng.randint(lo, hi)
        body = length - len(head) - len(tail)
        start = rng.randrange(0, len(stream) - body)
        out.append(head + stream[start : start + body] + tail)
    return out


def serial_generate(model, contexts, params: SamplingParams, eos_id: int, pad_id: int) -> int:
    """Mode B: one plain ``model.generate`` per context; returns generated tokens (to eos, inclusive)."""
    tokens = 0
    model.eval()
    with torch.no_grad():
        for c in contexts:
            ids = torch.tensor([c])
            res = model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                do_sample=params.temperature > 0,
                temperature=params.temperature if params.temperature > 0 else None,
                top_p=params.top_p if params.temperature > 0 else None,
                top_k=None,
                max_new_tokens=params.max_new_tokens,
                eos_token_id=eos_id,
                pad_token_id=pad_id,
            )
            new = res[0, len(c) :].tolist()
            tokens += new.index(eos_id) + 1 if eos_id in new else len(new)
    return tokens


def _engines_setup(args, out):
    """(config, model folder, model, tokenizer) of the engine comparison: the ``--pipeline``'s model
    (SmolLM2, weights fp32), or with ``--smoke`` its tiny pipeline's untrained model at the smallest sizes."""
    from agent_r1.config import load_config
    from agent_r1.learner import save_hf_checkpoint
    from agent_r1.models import load_model, resolve_model
    from agent_r1.run import initial_model, make_tools, prepare_data

    overrides = {"output_dir": str(out), "env": {"max_turns": 3}}
    if args.smoke:  # a test of the script: the tiny model (head size 32, as vLLM's CPU attention needs), 2 x 2 episodes
        overrides |= {"rl": {"tasks_per_iteration": 2, "group_size": 2}}
        cfg = load_config("tiny" if args.pipeline == "default" else f"{args.pipeline}-tiny", overrides=overrides)
        prepare_data(cfg)
        model, tok = initial_model(cfg, out / "data", make_tools(cfg, out / "data"))
        path = save_hf_checkpoint(model, out / "model", tok)
    else:  # the long-context workload's histories (up to ~1,600 tokens) need more than the pipeline's budget
        overrides["rollout"] = {"vllm": {"max_model_len": 2048}}
        if args.tasks:
            overrides["rl"] = {"tasks_per_iteration": args.tasks}
        cfg = load_config(args.pipeline, overrides=overrides)
        prepare_data(cfg)
        path = resolve_model(cfg.model.name_or_path)
        model, tok = load_model(path)
    return cfg, path, model.eval(), tok


@dataclass
class Work:
    """What one workload asked of an engine: episodes, generated tokens, the tokens a model must run at least
    once (every context token not already computed for the same episode or group, and every generated one), and
    the sequences in flight at once (the decode batch)."""

    episodes: int
    generated: int
    processed: int
    batch: int


def _computed_tokens(trajs) -> int:
    """The context tokens of ``trajs`` a model must run once: a group's shared prompt once, then per turn
    the tokens after what the episode's previous turn already computed (its context and action)."""
    firsts, n = set(), 0
    for t in trajs:
        prev = None
        for s in t.steps:
            if prev is None:
                if tuple(s.context_ids) not in firsts:
                    firsts.add(tuple(s.context_ids))
                    n += len(s.context_ids)
            else:
                common = next((k for k, (a, b) in enumerate(zip(prev, s.context_ids)) if a != b),
                              min(len(prev), len(s.context_ids)))
                n += len(s.context_ids) - common
            prev = s.context_ids + s.action_ids
    return n


def matmul_params(model) -> tuple[int, int]:
    """(the weights of the transformer's linear layers, the LM head's): a token's forward pass is
    2 x the first in matmul FLOPs, plus 2 x the second where its next-token logits are needed."""
    head = model.get_output_embeddings().weight.numel()
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    return linear - head, head


def bound(model, precision: str, work: Work, flops_per_s: float, bytes_per_s: float) -> tuple[float, float]:
    """The machine's bound in generated tokens/s on ``work`` (weights in ``precision``): (every token's
    matmul FLOPs at the measured matmul rate, the weight-streaming bound: one read of the weights per decode
    step of ``work.batch`` sequences at the measured read bandwidth). Attention's own FLOPs are left out."""
    body, head = matmul_params(model)
    flops = 2 * body * work.processed + 2 * head * work.generated
    weight_bytes = (body + head) * (4 if precision == "fp32" else 2)
    return work.generated * flops_per_s / flops, work.batch * bytes_per_s / weight_bytes


def compare_engines(args) -> None:
    """The rollout engines side by side on the pipeline's model (see the module docstring)."""
    import shutil
    import tempfile
    from pathlib import Path

    from agent_r1.data.synthetic import load_split
    from agent_r1.rollout import run_episodes
    from agent_r1.run import Agent, make_tools, tasks_for

    out = Path(tempfile.mkdtemp(prefix="bench-rollout-engines."))
    try:
        cfg, path, model, tok = _engines_setup(args, out)
        agent = Agent(model, tok, make_tools(cfg, out / "data"), cfg)
        tasks = tasks_for(load_split(out / "data", "train"), cfg.rl.hops, seed=cfg.seed, qtypes=cfg.rl.qtypes)
        pick = torch.randperm(len(tasks), generator=torch.Generator().manual_seed(args.seed))[: cfg.rl.tasks_per_iteration]
        reps = [tasks[i] for i in pick for _ in range(cfg.rl.group_size)]  # the RL stage's groups
        groups = [k for k in range(len(pick)) for _ in range(cfg.rl.group_size)]
        world = generate(WorldConfig(seed=args.seed))
        texts = list(world.corpus["text"])
        lo, hi = (200, 300) if args.smoke else (1000, 1200)
        long_ctx = make_contexts(tok, texts, args.long_n, lo, hi, args.seed)
        observations = make_contexts(tok, texts, 3 * args.long_n, 90, 110, args.seed + 1)
        params = SamplingParams(cfg.rl.temperature, cfg.rl.top_p, cfg.env.max_new_tokens)
        print(f"machine: {platform.machine()} {platform.processor() or ''}, os.cpu_count()={os.cpu_count()}, torch "
              f"{torch.__version__}, threads {torch.get_num_threads()}\nmodel: {path} (weights fp32); pipeline "
              f"{cfg.name}: {len(pick)} tasks x group {cfg.rl.group_size} = {len(reps)} episodes, <= {cfg.env.max_turns} "
              f"turns, max_new_tokens {cfg.env.max_new_tokens}, temperature {cfg.rl.temperature}; long-context "
              f"workload: {args.long_n} histories of {lo}-{hi} tokens x 3 turns", flush=True)

        def pipeline(engine):
            torch.manual_seed(args.seed)
            trajs = run_episodes(engine, agent.make_env, reps, agent.context(), params, groups, cfg.env.max_context_tokens)
            gen = sum(len(s.action_ids) for t in trajs for s in t.steps)
            return Work(len(trajs), gen, gen + _computed_tokens(trajs), len(trajs)), trajs

        def long_context(engine):
            torch.manual_seed(args.seed)
            engine.reset()
            ctxs, new = [list(c) for c in long_ctx], 0
            processed = sum(map(len, ctxs))
            for turn in range(3):
                gens = engine.generate(ctxs, params)
                new += sum(len(g.ids) for g in gens)
                obs = observations[turn * len(ctxs):(turn + 1) * len(ctxs)]
                processed += sum(len(g.ids) for g in gens) + (sum(map(len, obs)) if turn < 2 else 0)
                ctxs = [c + g.ids + o for c, g, o in zip(ctxs, gens, obs)]
            return Work(len(ctxs), new, processed, len(ctxs)), None

        workloads = [(w, {"pipeline": pipeline, "long-context": long_context}[w]) for w in args.workloads]
        dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
        mm = {p: [matmul_flops(args.mm, 3, dtypes[p])] for p in args.precisions}
        bw = [read_bandwidth()]
        rows = {}
        for name in args.engines:
            for prec in args.precisions:
                label = name if prec == "fp32" else f"{name}_{prec}"
                rows[label] = (prec, _engine_rows(label, name, prec, cfg, model, tok, path, long_ctx, workloads))
        for p in args.precisions:
            mm[p].append(matmul_flops(args.mm, 3, dtypes[p]))
        bw.append(read_bandwidth())
    finally:
        shutil.rmtree(out, ignore_errors=True)
    rate = {p: max(v) for p, v in mm.items()}  # the machine's: another process only ever slows a measurement
    bytes_per_s = max(bw)
    print(f"the machine's rates (before / after the engines' rows): weights read {bw[0] / 1e9:.1f} / {bw[1] / 1e9:.1f} "
          f"GB/s; " + "; ".join(f"{p} {args.mm}^3 matmul {v[0] / 1e9:.0f} / {v[1] / 1e9:.0f} GFLOP/s" for p, v in mm.items()))
    for label, (prec, by_work) in rows.items():
        for wl, (work, wall, cpu, gap) in by_work.items():
            flops_bound, stream_bound = bound(model, prec, work, rate[prec], bytes_per_s)
            limit = min(flops_bound, stream_bound)
            tps = work.generated / wall
            # per CPU second of this process: what the rows ran at while they held a core (1 thread, a shared machine)
            per_cpu = f", per CPU s {work.generated / cpu / limit:.2f}" if torch.get_num_threads() == 1 else ""
            print(f"{label:9s} {wl:13s} episodes/s {work.episodes / wall:6.2f}  new tokens/s {tps:7.1f}  limit "
                  f"{limit:7.1f} tokens/s (matmul {flops_bound:.0f}, weight streaming {stream_bound:.0f}: {work.batch} "
                  f"in flight)  fraction of limit {tps / limit:.2f}{per_cpu}  (wall {wall:.1f} s, cpu {cpu:.1f} s, "
                  f"{work.generated} new of {work.processed} computed tokens"
                  + (f"; log-prob gap to the fp32 learner {gap:.4f}" if gap is not None else "") + ")")
    base = rows.get("hf", (None, {}))[1]
    for label, (_, by_work) in rows.items():
        if label == "hf" or not base:
            continue
        for wl in reversed(args.workloads):  # the pipeline's ratio last
            (work, wall, cpu, _), (bwork, bwall, bcpu, _) = by_work[wl], base[wl]
            key = f"ratio_{label}_over_hf_episodes_per_s" + ("" if wl == "pipeline" else "_long_context")
            if torch.get_num_threads() == 1:
                print(f"{key.replace('per_s', 'per_cpu_s')}: {(work.episodes / cpu) / (bwork.episodes / bcpu):.2f}")
            print(f"{key}: {(work.episodes / wall) / (bwork.episodes / bwall):.2f}")


def _engine_rows(label, name, precision, cfg, model, tok, path, long_ctx, workloads) -> dict:
    """One engine (as the pipeline builds it, with ``model.precision`` = ``precision``) through every workload:
    workload -> (Work, wall s, this process's CPU s, mean |sampling - fp32 learner| log-prob of the pipeline's
    sampled tokens)."""
    from agent_r1.learner import token_logprobs
    from agent_r1.rollout.build import make_engine

    ecfg = cfg.model_copy(update={"rollout": cfg.rollout.model_copy(update={"engine": name}),
                                  "model": cfg.model.model_copy(update={"precision": precision})})
    t0 = time.perf_counter()
    engine = make_engine(ecfg, model, tok, path)
    startup = time.perf_counter() - t0
    rows = {}
    try:
        engine.generate(long_ctx[:2], SamplingParams(1.0, 1.0, 4))  # warm-up
        for wl, fn in workloads:
            t0, c0 = time.perf_counter(), time.process_time()
            work, trajs = fn(engine)
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            gap = None
            if trajs:  # the learner's fp32 log-probs of what the engine sampled (its first 16 episodes)
                diffs = []
                with torch.no_grad():
                    for s in [s for t in trajs[:16] for s in t.steps]:
                        ids = torch.tensor([s.context_ids + s.action_ids])
                        lp = token_logprobs(model, ids, torch.ones_like(ids), cfg.rl.temperature if cfg.rl.temperature > 0
                                            else 1.0)[0, len(s.context_ids):]
                        diffs += (torch.tensor(s.action_logprobs) - lp).abs().tolist()
                gap = sum(diffs) / max(len(diffs), 1)
            rows[wl] = (work, wall, cpu, gap)
            print(f"{label:9s} {wl:13s} episodes/s {work.episodes / wall:6.2f}  new tokens/s {work.generated / wall:8.1f}"
                  f"  prefill reuse {engine.stats().get('prefill_reused_share', 0.0):.2f}  wall {wall:7.1f} s  cpu "
                  f"{cpu:7.1f} s  new tokens {work.generated}  (engine start {startup:.1f} s)", flush=True)
    finally:
        engine.close()
    return rows


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.engines:
        return compare_engines(args)
    cfg = TinyModelConfig(
        vocab_size=args.vocab, hidden_size=args.hidden, num_layers=args.layers, num_heads=args.heads,
        num_kv_heads=args.kv_heads, intermediate_size=args.ffn,
    )
    world = generate(WorldConfig(seed=args.seed))
    texts = list(world.corpus["text"]) + list(world.corpus["title"]) + list(world.questions["question"])
    if args.model == "smollm2":
        from agent_r1.models import load_model

        model, tok = load_model("smollm2-135m-instruct", device="cpu")
        model.eval()
        c = model.config
        cfg = TinyModelConfig(vocab_size=c.vocab_size, hidden_size=c.hidden_size, num_layers=c.num_hidden_layers,
                              num_heads=c.num_attention_heads, num_kv_heads=c.num_key_value_heads,
                              intermediate_size=c.intermediate_size)  # only to print its shape
    else:
        tok = train_tokenizer(texts, vocab_size=cfg.vocab_size)
        model = build_tiny_model(cfg, tok, seed=args.seed).eval()
    if not args.no_force_length:
        model.generation_config.min_new_tokens = args.max_new_tokens
    contexts = make_contexts(tok, texts, args.n, args.min_ctx, args.max_ctx, args.seed)
    serial = contexts[: args.serial_n]
    params = SamplingParams(temperature=args.temperature, top_p=1.0, max_new_tokens=args.max_new_tokens)
    eos, pad = tok.eos_token_id, tok.pad_token_id
    n_par = sum(p.numel() for p in model.parameters())
    lens = [len(c) for c in contexts]
    print(
        f"machine: {platform.machine()}, os.cpu_count()={os.cpu_count()}, torch {torch.__version__}, "
        f"threads={torch.get_num_threads()}, OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}, "
        f"1M-float mul_: {elementwise_probe():.0f} us\nmodel: {args.model} hidden={cfg.hidden_size} layers={cfg.num_layers} "
        f"heads={cfg.num_heads}/{cfg.num_kv_heads} ffn={cfg.intermediate_size} vocab={len(tok)} "
        f"params={n_par / 1e6:.2f}M\ncontexts: N={len(contexts)} lengths {min(lens)}-{max(lens)} "
        f"(mean {sum(lens) / len(lens):.0f}); max_new_tokens={args.max_new_tokens}, "
        f"temperature={args.temperature}, forced length={not args.no_force_length}; "
        f"mode B runs {len(serial)} contexts per repeat; {args.repeats} repeats",
        flush=True,
    )
    if msg := warn_if_spinning(elementwise_probe()):
        print(msg, flush=True)

    # (label, batch size shown, episodes, fn -> generated tokens)
    def engine_run(bs, ctxs, precision="fp32"):
        eng = HFEngine(model, tok, max_batch_size=bs, reuse_kv=False, precision=precision)
        if not args.no_force_length:
            eng.eos_id = -1  # no token ends a turn: every row runs max_new_tokens, as mode B's min_new_tokens

        def run():
            return sum(len(g.ids) for g in eng.generate(ctxs, params))

        return run

    sorted_ctx = sorted(contexts, key=len)
    modes = [("B: model.generate, 1 at a time", "1", len(serial), lambda: serial_generate(model, serial, params, eos, pad))]
    if args.engine_bs1:
        modes.append(("B': HFEngine, max_batch_size=1", "1", len(serial), engine_run(1, serial)))
    for bs in args.batch_sizes:
        for prec in args.precisions:
            tag = "" if args.precisions == ["fp32"] else f", {prec}"
            modes.append((f"A: HFEngine batched{tag}", str(bs), len(contexts), engine_run(bs, contexts, prec)))
            if args.sorted:
                modes.append((f"A: HFEngine batched, sorted by length{tag}", str(bs), len(contexts),
                              engine_run(bs, sorted_ctx, prec)))

    # warm-up (first-call allocations, lazy imports)
    HFEngine(model, tok, max_batch_size=4).generate(contexts[:4], params)

    results: dict[int, list[tuple[float, float]]] = {i: [] for i in range(len(modes))}  # (eps/s, tok/s)
    ratios: dict[int, list[float]] = {i: [] for i in range(len(modes))}
    clean: list[bool] = []  # per repeat: no other process busy while any of its rows ran
    t_start = time.perf_counter()
    snap = cpu_snapshot()
    worst_probe = elementwise_probe()
    for r in range(args.repeats):
        order = list(range(len(modes)))
        if r % 2:  # alternate the order so drift on a shared machine does not favour one mode
            order.reverse()
        rep: dict[int, tuple[float, float]] = {}
        busiest = 0.0
        for i in order:
            if r and time.perf_counter() - t_start > args.budget_s:
                break  # over budget mid-repeat: drop this partial repeat
            _, _, n_eps, fn = modes[i]
            torch.manual_seed(args.seed + r)
            s0 = cpu_snapshot()
            t0 = time.perf_counter()
            n_tok = fn()
            dt = time.perf_counter() - t0
            busiest = max(busiest, others_cores(s0))
            rep[i] = (n_eps / dt, n_tok / dt)
        if len(rep) < len(modes):
            print(f"time budget of {args.budget_s:.0f} s spent during repeat {r + 1}: dropped it", flush=True)
            break
        for i, rates in rep.items():
            results[i].append(rates)
            ratios[i].append(rates[0] / rep[0][0])
        clean.append(busiest < args.quiet)
        elapsed = time.perf_counter() - t_start
        probe = elementwise_probe()
        worst_probe = max(worst_probe, probe)
        print(f"repeat {r + 1}/{args.repeats} done ({elapsed:.0f} s; other processes up to {busiest:.2f} cores "
              f"during a row: {'quiet' if clean[-1] else 'CONTENDED'}; 1M-float mul_ {probe:.0f} us)", flush=True)
        if elapsed > args.budget_s and r + 1 < args.repeats:
            print(f"time budget of {args.budget_s:.0f} s spent: stopping after {r + 1} repeats", flush=True)
            break

    # Medians over the quiet repeats when there are any (all repeats otherwise).
    use = [k for k, ok in enumerate(clean) if ok] or list(range(len(clean)))
    contended_only = not any(clean)

    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"Rollout throughput (median of {len(use)} {'CONTENDED' if contended_only else 'quiet'} "
                        f"repeats of {len(clean)})")
    for col in ("mode", "N episodes", "batch size", "eps/s", "gen tok/s", "ratio vs B", "ratio min-max"):
        table.add_column(col, justify="left" if col == "mode" else "right")
    for i, (label, bs, n_eps, _) in enumerate(modes):
        eps = statistics.median(results[i][k][0] for k in use)
        tps = statistics.median(results[i][k][1] for k in use)
        rs = [ratios[i][k] for k in use]
        table.add_row(label, str(n_eps), bs, f"{eps:.2f}", f"{tps:.0f}", f"{statistics.median(rs):.1f}x",
                      f"{min(rs):.1f}-{max(rs):.1f}")
    Console(width=160).print(table)
    best = max(statistics.median(ratios[i][k] for k in use) for i in range(1, len(modes))) if len(modes) > 1 else 0
    print(f"other processes kept {others_cores(snap):.2f} of {os.cpu_count()} cores busy during the timed repeats; "
          f"1M-float mul_ now: {elementwise_probe():.0f} us")
    msg = warn_if_spinning(max(worst_probe, elementwise_probe()))
    if msg:
        print(msg)
    if contended_only:
        print(f"NOTE: every repeat had another process using >= {args.quiet} cores while a row ran; "
              "these medians are from a contended machine.")
    verdict = "not judged: see the warning" if msg or contended_only else ("met" if best >= 5 else "NOT met")
    print(f"goal: batched/serial ratio >= 5x -> best median ratio {best:.1f}x ({verdict})")


if __name__ == "__main__":
    main()
