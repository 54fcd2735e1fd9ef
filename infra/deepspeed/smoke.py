"""Check a DeepSpeed config on this machine's launcher, backend and devices before a long run.

Every rank builds the same tiny model, wraps it with ``deepspeed.initialize`` exactly as
``agent_r1.learner.learner._initialize`` does (a client ``torch.optim.AdamW``, no ``optimizer``
block in the JSON), trains a few steps on rank-specific data with the learner's log-prob loss,
and then checks that the ranks agree on the weights (data parallelism really averaged the
gradients) and that the weights moved, for each config given. Exit status 0 means the configs,
the process group and the collectives work::

    # one machine, N GPUs (or N CPU processes with gloo)
    torchrun --standalone --nproc_per_node=N infra/deepspeed/smoke.py --config infra/deepspeed/*.json
    # the learner's own config for ZeRO stages (what `rl.learner.zero_stage` builds)
    torchrun --standalone --nproc_per_node=N infra/deepspeed/smoke.py --zero-stage 0 3

Unlike the learner today, this script moves its inputs to the engine's device, so it also runs
on GPUs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a file from any folder

from agent_r1.learner.distributed import init_distributed
from agent_r1.learner.learner import LearnerConfig, _ds_config, token_logprobs
from agent_r1.models import TinyModelConfig, build_tiny_model, train_tokenizer

TEXTS = [
    "the museum that keeps the portrait is in paris",
    "the river flows through vienna and budapest",
    "the tower was built in paris in 1889",
    "the wall divided berlin from 1961 to 1989",
]


def check(name: str, config: dict, tok, steps: int) -> bool:
    """Train a tiny model under ``config`` on every rank; rank 0 prints a JSON report."""
    import deepspeed
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    tiny = TinyModelConfig(
        hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=64, vocab_size=96
    )
    model = build_tiny_model(tiny, tok, seed=0)  # the same weights on every rank
    before = {n: p.detach().float().clone() for n, p in model.named_parameters()}
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    engine, *_ = deepspeed.initialize(model=model, optimizer=opt, config=config)

    ids = tok(TEXTS[rank % len(TEXTS)])["input_ids"]  # each rank sees different data
    batch = torch.tensor([ids, ids], device=engine.device)
    for _ in range(steps):
        for half in (batch[:1], batch[1:]):  # two micro-batches, one optimizer step (as the learner)
            loss = -token_logprobs(engine, half, torch.ones_like(half)).mean() / 2
            engine.backward(loss)
        engine.step()

    # ZeRO-3 partitions the weights: gather them on every rank (a no-op for stages 0-2)
    with deepspeed.zero.GatheredParameters(list(engine.module.parameters()), modifier_rank=None):
        state = {n: p.detach().float().cpu().clone() for n, p in engine.module.named_parameters()}
    moved = sum(not torch.allclose(before[k], v) for k, v in state.items())
    total = sum(float(v.double().sum()) for v in state.values())
    checksum = torch.tensor([total], dtype=torch.float64, device=engine.device)  # nccl wants GPU tensors
    sums = [torch.zeros_like(checksum) for _ in range(world)]
    dist.all_gather(sums, checksum)
    agree = all(torch.allclose(s, sums[0], rtol=0, atol=1e-6) for s in sums)
    if rank == 0:
        report = {
            "config": name,
            "world_size": world,
            "backend": dist.get_backend(),
            "device": str(engine.device),
            "zero_stage": engine.zero_optimization_stage(),
            "bf16": engine.bfloat16_enabled(),
            "offload": bool(engine.zero_cpu_offload()),
            "params_moved": f"{moved}/{len(before)}",
            "ranks_agree": agree,
            "last_loss": round(loss.item() * 2, 4),
        }
        print(json.dumps(report), flush=True)
    engine.destroy()
    return agree and moved > 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", type=Path, nargs="*", default=[], help="DeepSpeed JSON files (infra/deepspeed/*.json)")
    ap.add_argument("--zero-stage", type=int, nargs="*", default=[], choices=range(4),
                    help="the learner's built-in config for these ZeRO stages")  # fmt: skip
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args(argv)
    if not args.config and not args.zero_stage:
        ap.error("give --config FILE... and/or --zero-stage N...")
    configs = [(str(p), json.loads(p.read_text())) for p in args.config]
    configs += [(f"zero_stage={s}", _ds_config(LearnerConfig(zero_stage=s))) for s in args.zero_stage]

    import torch.distributed as dist

    torch.set_num_threads(1)
    init_distributed()
    tok = train_tokenizer(TEXTS * 20, vocab_size=96)
    results = [check(name, config, tok, args.steps) for name, config in configs]
    dist.barrier()
    dist.destroy_process_group()
    return 0 if all(results) else 1


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: under load, a gloo/shm thread still alive at exit can abort the
    # process ("terminate called without an active exception") after every check has passed.
    os._exit(code)
