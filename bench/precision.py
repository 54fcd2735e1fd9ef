"""The update in bf16 against fp32: the same steps from the same start, losses, gradients and CPU time.

    python bench/precision.py                              # SmolLM2-135M, 10 SFT steps of 8 x 256 tokens
    python bench/precision.py --model tiny --steps 3       # the offline pipeline's tiny model

Two learners (``Learner``: DeepSpeed, AdamW, gradient clipping, fp32 master weights) start from
copies of the same model, one computing its forward and backward passes in fp32, the other under
bf16 autocast (``model.precision: bf16``), and take the same ``--steps`` SFT steps on the same
batches (``--batch`` packed sequences of ``--seq`` tokens of the synthetic QA world's text, the loss
on every token after a ``--prompt``-token prefix), alternating step by step. A third learner, the
floor, takes the same steps in fp32 with each batch split into two micro-batches: the same sums in
another order, so its distance from the fp32 learner is what float rounding alone does to the run.
For each step the script prints the losses (each the loss before that step's update), their gaps
relative to fp32's, and each step's CPU seconds (``time.process_time``: the process's own CPU time,
which other processes on a shared machine move less than the wall time).

Before any step, on the first batch, it also compares the gradients of both precisions at the same
weights: the SFT loss's, and a GRPO-shaped policy-gradient loss's (advantages of +1 and -1 on
alternating rows; ``rl.learner.policy_loss`` at its default, ratio 1): their cosine and the
relative difference of their norms.

The result lines:

    loss_rel_gap_max: G                          (max over steps of |loss_bf16 - loss_fp32| / loss_fp32)
    grad_cosine_sft: C   grad_cosine_pg: C
    ratio_bf16_over_fp32_tokens_per_cpu_s: R     (median step CPU s of fp32 / of bf16)
    within tolerance (loss gap <= T, cosines >= C): yes|no

The tolerance (``--tolerance``, ``--min-cosine``) is the one docs/running.md states for the update
in bf16.
"""

from __future__ import annotations

import argparse
import copy
import logging
import os
import platform
import statistics
import time
import warnings

import torch

from agent_r1.data.synthetic import WorldConfig, generate
from agent_r1.models import TinyModelConfig, build_tiny_model, native_bf16_cpu, train_tokenizer
from learner import make_batch  # bench/learner.py: packed sequences of corpus text, the loss after a prefix

TOLERANCE = 0.01  # |loss_bf16 - loss_fp32| / loss_fp32 at every step
MIN_COSINE = 0.99  # of the bf16 gradient with the fp32 one at the same weights
FLOOR = "fp32, 2 micro-batches"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2", help="smollm2 (the packaged SmolLM2-135M-Instruct) or tiny")
    p.add_argument("--steps", type=int, default=10, help="SFT steps of each learner")
    p.add_argument("--batch", type=int, default=8, help="sequences per step")
    p.add_argument("--seq", type=int, default=256, help="tokens per sequence (packed, no padding)")
    p.add_argument("--prompt", type=int, default=32, help="leading tokens of each sequence outside the loss mask")
    p.add_argument("--lr", type=float, default=1e-5, help="the learners' learning rate (the default pipeline's: SFT 5e-5, RL 5e-6)")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    p.add_argument("--tolerance", type=float, default=TOLERANCE)
    p.add_argument("--min-cosine", type=float, default=MIN_COSINE)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def batches(tok, texts: list[str], n: int, batch: int, seq: int, prompt: int) -> list:
    """``n`` batches of ``batch`` packed sequences: consecutive rows of ``learner.py``'s packing of ``texts``."""
    rows = make_batch(tok, texts, n * batch, seq, prompt)
    return [rows.select(torch.arange(b * batch, (b + 1) * batch)) for b in range(n)]


def gradient(model, batch, precision: str, loss_kind: str) -> torch.Tensor:
    """The flattened gradient of ``loss_kind`` (``sft`` or ``pg``) on ``batch`` at ``model``'s weights."""
    from agent_r1.algorithms import aggregate, get_policy_loss
    from agent_r1.learner.learner import LearnerConfig, token_logprobs
    from agent_r1.models import autocast

    model.zero_grad(set_to_none=True)
    with autocast(precision, "cpu"):
        logp = token_logprobs(model, batch.input_ids, batch.attention_mask, positions=batch.loss_mask)
        if loss_kind == "sft":
            loss = -aggregate(logp, batch.loss_mask, "token-mean")
        else:
            sign = (1.0 - 2.0 * (torch.arange(len(batch)) % 2))[:, None]  # +1, -1, +1, ...
            cfg = LearnerConfig()
            policy_loss = get_policy_loss(cfg.policy_loss)
            loss, _ = policy_loss(logp, logp.detach(), sign * batch.loss_mask, batch.loss_mask,
                                  **policy_loss.kwargs(cfg))
    loss.backward()
    grad = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    model.zero_grad(set_to_none=True)
    return grad


def compare_gradients(model, batch) -> dict[str, float]:
    out = {}
    for kind in ("sft", "pg"):
        g32, g16 = gradient(model, batch, "fp32", kind).double(), gradient(model, batch, "bf16", kind).double()
        out[f"grad_cosine_{kind}"] = float(torch.nn.functional.cosine_similarity(g32, g16, dim=0))
        out[f"grad_norm_rel_gap_{kind}"] = float((g16.norm() - g32.norm()).abs() / g32.norm())
    return out


def main(argv=None) -> None:
    args = parse_args(argv)
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore")
    from rich.console import Console
    from rich.table import Table

    from agent_r1.learner.learner import Learner, LearnerConfig

    console = Console(width=150)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    world = generate(WorldConfig(seed=args.seed))
    texts = list(world.corpus["text"]) + list(world.questions["question"])
    if args.model == "smollm2":
        from agent_r1.models import load_model

        model, tok = load_model("smollm2-135m-instruct", device="cpu")
    else:
        tok = train_tokenizer(texts, vocab_size=TinyModelConfig().vocab_size)
        model = build_tiny_model(TinyModelConfig(max_position_embeddings=max(512, args.seq)), tok, seed=args.seed)
    data = batches(tok, texts, args.steps, args.batch, args.seq, args.prompt)
    console.print(f"machine: {platform.machine()}, {os.cpu_count()} cores, native bf16: {native_bf16_cpu()}, "
                  f"torch {torch.__version__}, {args.threads} thread(s); {args.model}, {args.steps} SFT steps of "
                  f"{args.batch} x {args.seq} tokens, lr {args.lr}")
    grads = compare_gradients(model, data[0])
    # the floor: fp32 again, each batch in two micro-batches (the same sums in another order: float rounding alone)
    half = LearnerConfig(lr=args.lr, micro_batch_tokens=args.batch * args.seq // 2)
    learners = {"fp32": Learner(copy.deepcopy(model), LearnerConfig(lr=args.lr), precision="fp32"),
                "bf16": Learner(copy.deepcopy(model), LearnerConfig(lr=args.lr), precision="bf16"),
                FLOOR: Learner(copy.deepcopy(model), half, precision="fp32")}
    del model
    losses: dict[str, list[float]] = {p: [] for p in learners}
    cpu: dict[str, list[float]] = {p: [] for p in learners}
    for i, batch in enumerate(data):
        for p, learner in learners.items():
            t0 = time.process_time()
            losses[p].append(learner.sft_step(batch)["sft_loss"])
            cpu[p].append(time.process_time() - t0)
        console.print(f"step {i + 1}/{args.steps}: " + ", ".join(
            f"{p} loss {losses[p][-1]:.4f} ({cpu[p][-1]:.1f} CPU s)" for p in learners))

    table = Table(title="The same SFT steps from the same start (loss before each step's update; gaps relative to fp32's)")
    for col in ("step", "loss fp32", "loss bf16", "gap bf16", f"loss {FLOOR}", "gap (floor)", "CPU s fp32",
                "CPU s bf16"):
        table.add_column(col, justify="right")
    gap = {p: [abs(x - f) / f for f, x in zip(losses["fp32"], losses[p])] for p in ("bf16", FLOOR)}
    for i, f in enumerate(losses["fp32"]):
        table.add_row(str(i + 1), f"{f:.4f}", f"{losses['bf16'][i]:.4f}", f"{gap['bf16'][i]:.4f}",
                      f"{losses[FLOOR][i]:.4f}", f"{gap[FLOOR][i]:.4f}", f"{cpu['fp32'][i]:.2f}", f"{cpu['bf16'][i]:.2f}")
    console.print(table)
    gaps = gap["bf16"]
    tokens = args.batch * args.seq
    step_cpu = {p: statistics.median(cpu[p]) for p in ("fp32", "bf16")}
    ratio = step_cpu["fp32"] / step_cpu["bf16"]
    console.print(f"tokens per CPU s: fp32 {tokens / step_cpu['fp32']:.1f}, bf16 {tokens / step_cpu['bf16']:.1f}")
    console.print("gradients at the start, bf16 against fp32: " + ", ".join(f"{k} {v:.4f}" for k, v in grads.items()))
    console.print(f"loss_rel_gap_max: {max(gaps):.4f}   floor (fp32 in another summation order): {max(gap[FLOOR]):.4f}")
    console.print(f"grad_cosine_sft: {grads['grad_cosine_sft']:.4f}   grad_cosine_pg: {grads['grad_cosine_pg']:.4f}")
    console.print(f"ratio_bf16_over_fp32_tokens_per_cpu_s: {ratio:.2f}")
    ok = max(gaps) <= args.tolerance and min(grads["grad_cosine_sft"], grads["grad_cosine_pg"]) >= args.min_cosine
    console.print(f"within tolerance (loss gap <= {args.tolerance}, cosines >= {args.min_cosine}): {'yes' if ok else 'no'}")


if __name__ == "__main__":
    main()
