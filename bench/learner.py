"""Learner throughput: tokens/s and model-FLOP utilisation of ``Learner.sft_step`` (DeepSpeed).

    python bench/learner.py                                # tiny default + hidden 384 / 6 layers
    python bench/learner.py --models tiny --batch 16 --seq 512 --threads 1 2
    python bench/learner.py --models 256,4,4,2,768 --steps 3 --repeats 5 --profile
    python bench/learner.py --models smollm2 --precisions fp32 bf16 --batch 4 --threads 1   # SmolLM2-135M

For each model (``tiny`` = ``TinyModelConfig`` defaults; ``h384l6`` = hidden 384, 6 layers, 6/2
heads, ffn 1024; or ``HIDDEN,LAYERS,HEADS,KV_HEADS,FFN``; or ``smollm2`` = the packaged
SmolLM2-135M-Instruct with its own tokenizer) the script builds the model and tokenizer, packs ``--batch`` sequences of exactly ``--seq`` tokens of corpus text (so there is no
padding; the loss mask covers every token after a ``--prompt``-token prefix), wraps the model in
``Learner(model, LearnerConfig())`` (DeepSpeed, ZeRO 0, AdamW, grad clipping) and times
``sft_step(batch)`` = forward + backward + optimizer step. The batch is one micro-batch when
batch x seq <= ``micro_batch_tokens`` (8192 by default, as in LearnerConfig).

Model FLOPs per step (the usual estimate, e.g. PaLM appendix B / Megatron):

    FLOPs = tokens x (6 N + 12 L d T)

with N = non-embedding parameters + the LM head's d x V (the head is tied to the embedding but
its matmul is real work; the embedding lookup is not), L layers, d hidden size, T sequence length
(the attention score/value matmuls, counted as if not causal). All tokens of the batch count,
including the prompt prefix (they go through forward and backward too).

``--precisions fp32 bf16`` times each model under each compute precision (the learner's
``precision``: bf16 autocast, fp32 master weights and optimizer state).

The reference rate is a large ``torch.matmul`` of the row's dtype (``--mm`` x ``--mm`` @ ``--mm`` x
``--mm``, 2 mm^3 FLOPs each; bf16 operands for a bf16 row) measured in the same process with the same thread count, right before and right
after each model's timing; MFU = achieved FLOP/s / median matmul FLOP/s. On a shared machine the
two matmul measurements show how much the load moved while the model was timed.

The breakdown (on by default, ``--no-breakdown`` skips it) also times the pieces of one step
separately with the learner's own engine (forward+loss, ``engine.backward``, ``engine.step``) and
the same step in plain PyTorch (no DeepSpeed: ``loss.backward``, ``clip_grad_norm_``,
``AdamW.step``) on a copy of the model; ``--profile`` prints the top operators of one ``sft_step``
by self CPU time.

On a shared machine the table shows how many cores other processes kept busy while each row was
timed and how long a 1M-float multiply took (~0.05 ms normally; several ms means torch's OpenMP
threads spin-wait for a core another process holds — every parallel op then pays a scheduler time
slice and the script warns instead of judging the goal). ``--omp-wait-policy passive`` sets
OMP_WAIT_POLICY before torch loads, which removes that stall; ``--budget-s`` bounds the run time.
"""

from __future__ import annotations

import argparse
import copy
import functools
import logging
import os
import platform
import statistics
import time
import warnings

from machine import (
    apply_omp_wait_policy,
    cpu_snapshot,
    elementwise_probe,
    matmul_flops,
    others_cores,
    warn_if_spinning,
)

if __name__ == "__main__":
    apply_omp_wait_policy()  # before torch loads

import torch

from agent_r1.data.synthetic import WorldConfig, generate
from agent_r1.models import TinyModelConfig, build_tiny_model, train_tokenizer
from agent_r1.trajectory import Sequence, collate

SMOLLM2 = "smollm2"  # the packaged SmolLM2-135M-Instruct (agent_r1.models.load_model)
PRESETS = {
    "tiny": TinyModelConfig(),
    "h384l6": TinyModelConfig(hidden_size=384, num_layers=6, num_heads=6, num_kv_heads=2, intermediate_size=1024),
}


def parse_model(spec: str) -> tuple[str, TinyModelConfig]:
    if spec in PRESETS or spec == SMOLLM2:
        return spec, PRESETS.get(spec)
    h, l, nh, kv, ffn = (int(x) for x in spec.split(","))
    return f"h{h}l{l}", TinyModelConfig(hidden_size=h, num_layers=l, num_heads=nh, num_kv_heads=kv, intermediate_size=ffn)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=["tiny", "h384l6"],
                   help="presets (tiny, h384l6, smollm2) or HIDDEN,LAYERS,HEADS,KV_HEADS,FFN")
    p.add_argument("--precisions", nargs="+", choices=["fp32", "bf16"], default=["fp32"],
                   help="the learner's compute precision(s); each row's MFU is against a matmul of the same dtype")
    p.add_argument("--batch", type=int, default=32, help="sequences per step")
    p.add_argument("--seq", type=int, default=256, help="tokens per sequence (packed, no padding)")
    p.add_argument("--prompt", type=int, default=32, help="leading tokens of each sequence outside the loss mask")
    p.add_argument("--micro-batch-tokens", type=int, default=8192, help="LearnerConfig.micro_batch_tokens")
    p.add_argument("--zero-stage", type=int, default=0)
    p.add_argument("--steps", type=int, default=1, help="timed sft_steps per repeat")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--threads", type=int, nargs="+", default=[os.cpu_count()],
                   help="torch.set_num_threads values to try (default: number of cores)")
    p.add_argument("--mm", type=int, default=2048, help="size of the reference fp32 matmul")
    p.add_argument("--mm-reps", type=int, default=5)
    p.add_argument("--no-breakdown", dest="breakdown", action="store_false")
    p.add_argument("--breakdown-reps", type=int, default=1)
    p.add_argument("--profile", action="store_true", help="print the top operators of one sft_step per model")
    p.add_argument("--profile-rows", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quiet", type=float, default=0.25,
                   help="a repeat counts as quiet when other processes used fewer cores than this; step time is the "
                        "median of the quiet repeats when there are any")
    p.add_argument("--budget-s", type=float, default=120.0,
                   help="after this many seconds, stop timing repeats (at least one per model) and skip the "
                        "breakdown/profile")
    p.add_argument("--omp-wait-policy", choices=["passive", "active"],
                   help="set OMP_WAIT_POLICY before torch loads (default: the environment's; libgomp spins, then sleeps)")
    return p.parse_args(argv)


def model_flops_per_token(model, seq: int) -> tuple[float, int]:
    """6 N + 12 L d T, N = non-embedding params + LM head (d x V)."""
    cfg = model.config
    emb = model.get_input_embeddings().weight.numel()
    head = model.get_output_embeddings().weight.numel()
    total = sum(p.numel() for p in model.parameters())
    tied = model.get_input_embeddings().weight is model.get_output_embeddings().weight
    n = total - emb + (head if tied else 0)
    return 6 * n + 12 * cfg.num_hidden_layers * cfg.hidden_size * seq, n


def make_batch(tok, texts, batch: int, seq: int, prompt: int) -> dict:
    stream: list[int] = []
    for t in texts:
        stream += tok(t + "\n")["input_ids"]
        if len(stream) >= batch * seq:
            break
    while len(stream) < batch * seq:
        stream += stream
    seqs = []
    for i in range(batch):
        ids = stream[i * seq : (i + 1) * seq]
        action = [0] * prompt + [1] * (seq - prompt)
        seqs.append(Sequence(ids=ids, action=action, step_ids=[0 if a else -1 for a in action],
                             rewards=[0.0] * seq, sample_logprobs=[0.0] * seq, group_id=i, prompt_len=prompt))
    return collate(seqs, tok.pad_token_id)


def timed(fn, n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n


def breakdown(learner, batch: dict, reps: int) -> dict[str, float]:
    """Median seconds of forward+loss / engine.backward / engine.step in the learner's engine."""
    from agent_r1.algorithms import aggregate
    from agent_r1.learner.learner import token_logprobs

    eng = learner.engine
    eng.train()
    out = {"forward+loss": [], "engine.backward": [], "engine.step": []}
    for _ in range(reps):
        t0 = time.perf_counter()
        logp = token_logprobs(learner.model, batch.input_ids, batch.attention_mask)
        loss = -aggregate(logp, batch.loss_mask, "token-mean")
        t1 = time.perf_counter()
        eng.backward(loss)
        t2 = time.perf_counter()
        eng.step()
        t3 = time.perf_counter()
        out["forward+loss"].append(t1 - t0)
        out["engine.backward"].append(t2 - t1)
        out["engine.step"].append(t3 - t2)
    return {k: statistics.median(v) for k, v in out.items()}


def plain_torch(model, batch: dict, reps: int, lr: float, clip: float) -> dict[str, float]:
    """The same step without DeepSpeed, on ``model`` (a copy): fwd+loss / backward / clip+AdamW."""
    from agent_r1.algorithms import aggregate
    from agent_r1.learner.learner import token_logprobs

    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    out = {"forward+loss": [], "backward": [], "clip+AdamW.step": []}
    for i in range(reps + 1):  # first iteration warms the optimizer state up
        t0 = time.perf_counter()
        logp = token_logprobs(model, batch.input_ids, batch.attention_mask)
        loss = -aggregate(logp, batch.loss_mask, "token-mean")
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        t3 = time.perf_counter()
        if i:
            out["forward+loss"].append(t1 - t0)
            out["backward"].append(t2 - t1)
            out["clip+AdamW.step"].append(t3 - t2)
    return {k: statistics.median(v) for k, v in out.items()}


def main(argv=None) -> None:
    args = parse_args(argv)
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore")
    from rich.console import Console
    from rich.table import Table

    from agent_r1.learner.learner import Learner, LearnerConfig

    console = Console(width=170)
    world = generate(WorldConfig(seed=args.seed))
    texts = list(world.corpus["text"]) + list(world.corpus["title"]) + list(world.questions["question"])
    tok = train_tokenizer(texts, vocab_size=TinyModelConfig().vocab_size)
    batch = tiny_batch = make_batch(tok, texts, args.batch, args.seq, args.prompt)
    tokens = args.batch * args.seq
    console.print(
        f"machine: {platform.machine()}, os.cpu_count()={os.cpu_count()}, torch {torch.__version__}, "
        f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}; "
        f"batch {args.batch} x {args.seq} = {tokens} tokens/step (loss on {int(batch.loss_mask.sum())}), "
        f"micro_batch_tokens={args.micro_batch_tokens}, ZeRO {args.zero_stage}; "
        f"{args.repeats} repeats x {args.steps} steps after {args.warmup} warm-up"
    )
    main_rows, extra, worst_probe, contended_rows = [], [], 0.0, 0
    t_start = time.perf_counter()
    snap = cpu_snapshot()
    for spec in args.models:
        name, cfg = parse_model(spec)
        batch = tiny_batch
        if cfg is None:  # smollm2
            from agent_r1.models import load_model

            model, smol_tok = load_model("smollm2-135m-instruct", device="cpu")
            batch = make_batch(smol_tok, texts, args.batch, args.seq, args.prompt)
        else:
            cfg = cfg.model_copy(update={"max_position_embeddings": max(cfg.max_position_embeddings, args.seq)})
            model = build_tiny_model(cfg, tok, seed=args.seed)
        plain_copy = copy.deepcopy(model) if args.breakdown else None
        lcfg = LearnerConfig(micro_batch_tokens=args.micro_batch_tokens, zero_stage=args.zero_stage)
        learner = Learner(model, lcfg)
        fpt, n_mm = model_flops_per_token(learner.model, args.seq)
        step_flops = fpt * tokens
        for threads, precision in ((t, p) for t in args.threads for p in args.precisions):
            torch.set_num_threads(threads)
            learner.precision = precision
            mm_dtype = torch.bfloat16 if precision == "bf16" else torch.float32
            for _ in range(args.warmup):
                learner.sft_step(batch)
            s0 = cpu_snapshot()
            mm_before = matmul_flops(args.mm, args.mm_reps, mm_dtype)
            times, quiet = [], []
            for _ in range(args.repeats):
                r0 = cpu_snapshot()
                times.append(timed(functools.partial(learner.sft_step, batch), args.steps))
                quiet.append(others_cores(r0) < args.quiet)
                if time.perf_counter() - t_start > args.budget_s:
                    break
            all_times = times
            times = [t for t, q in zip(times, quiet) if q] or times  # the quiet repeats when there are any
            contended_rows += not any(quiet)
            mm_after = matmul_flops(args.mm, args.mm_reps, mm_dtype)
            others = others_cores(s0)
            probe = elementwise_probe()
            step = statistics.median(times)
            mm = statistics.median([mm_before, mm_after])
            achieved = step_flops / step
            main_rows.append([
                name, precision, f"{n_mm / 1e6:.2f}M", str(threads), f"{step:.3f}", f"{min(all_times):.3f}-{max(all_times):.3f} ({sum(quiet)}/{len(quiet)})",
                f"{tokens / step:,.0f}", f"{step_flops / 1e9:.1f}", f"{achieved / 1e9:.1f}",
                f"{mm_before / 1e9:.0f} / {mm_after / 1e9:.0f}", f"{100 * achieved / mm:.0f}%", f"{others:.2f}", f"{probe:.0f}",
            ])
            console.print(f"{name}, {precision}, {threads} threads: done ({time.perf_counter() - t_start:.0f} s)")
            worst_probe = max(worst_probe, probe)
            over = time.perf_counter() - t_start > args.budget_s
            if over:
                console.print(f"time budget of {args.budget_s:.0f} s spent: skipping the breakdown/profile of {name}")
            if args.breakdown and not over and precision == args.precisions[0]:
                b0 = cpu_snapshot()
                ds = breakdown(learner, batch, args.breakdown_reps)
                pt = plain_torch(plain_copy, batch, args.breakdown_reps, lcfg.lr, lcfg.grad_clip)
                b_others = others_cores(b0)
                ds_total, pt_total = sum(ds.values()), sum(pt.values())
                for (k1, v1), (k2, v2) in zip(ds.items(), pt.items()):
                    extra.append([name, str(threads), f"{k1} | {k2}", f"{v1:.3f}", f"{100 * v1 / ds_total:.0f}%",
                                  f"{v2:.3f}", f"{100 * v2 / pt_total:.0f}%", ""])
                extra.append([name, str(threads), "total", f"{ds_total:.3f}", "", f"{pt_total:.3f}",
                              f"DS/plain {ds_total / pt_total:.2f}x", f"{b_others:.2f}"])
        if args.profile and time.perf_counter() - t_start <= args.budget_s:
            from torch.profiler import ProfilerActivity, profile

            torch.set_num_threads(args.threads[-1])
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                learner.sft_step(batch)
            console.print(f"[bold]{name}: top operators of one sft_step by self CPU time "
                          f"({args.threads[-1]} threads)[/bold]")
            console.print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.profile_rows,
                                                    max_name_column_width=48))
        del learner, model, plain_copy

    table = Table(title=f"Learner.sft_step throughput (median over quiet repeats of {args.steps} step(s) each)")
    for col in ("model", "dtype", "N (6N term)", "threads", "step s", "min-max (quiet/all repeats)", "tokens/s", "GFLOP/step",
                "GFLOP/s", "matmul GFLOP/s before / after", "MFU vs matmul", "other procs' cores", "1M mul_ us"):
        table.add_column(col, justify="left" if col == "model" else "right")
    for r in main_rows:
        table.add_row(*r)
    console.print(table)
    if extra:
        t2 = Table(title="Where a step's time goes: DeepSpeed engine vs the same step in plain PyTorch (median s)")
        for col in ("model", "threads", "phase (DeepSpeed | plain)", "DeepSpeed s", "share", "plain torch s", "share",
                    "other procs' cores"):
            t2.add_column(col, justify="left" if col.startswith(("model", "phase")) else "right")
        for r in extra:
            t2.add_row(*r)
        console.print(t2)
    console.print(f"other processes kept {others_cores(snap):.2f} of {os.cpu_count()} cores busy during the run")
    msg = warn_if_spinning(worst_probe)
    if msg:
        console.print(msg)
    if contended_rows:
        console.print(f"NOTE: {contended_rows} row(s) had another process using >= {args.quiet} cores in every "
                      "repeat; their step times are from a contended machine.")
        msg = msg or "contended"
    mfus = ", ".join(f"{r[0]} {r[1]} ({r[3]} threads) {r[10]}" for r in main_rows)
    verdict = f"not judged: see the warning/note ({mfus})" if msg else mfus
    console.print(f"goal: MFU >= 40% of the same-dtype matmul rate -> {verdict}")


if __name__ == "__main__":
    main()
