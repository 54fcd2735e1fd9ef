"""The learner's shared prefix on RL-shaped batches: one optimizer step with it on and off.

    python bench/shared_prefix.py                      # SmolLM2-135M-Instruct, 2 groups of 8
    python bench/shared_prefix.py --groups 4 --group-size 4 --continuation 160 --repeats 3

A batch is what GRPO trains on: ``--groups`` questions of the synthetic world, each rendered with
the model's chat template and the default system prompt, ``--group-size`` samples per question
whose ``--continuation`` tokens (actions and observations, random ids here) carry the loss. Every
row starts with the system prompt and each group with its question, so the learner
(``LearnerConfig.share_prefix``) runs the columns every row of a micro-batch shares once.
The script times ``Learner.sft_step`` (forward, backward, AdamW) with ``share_prefix`` off and
on, alternating, on the same weights and batch, and prints both, their ratio and the largest
log-prob difference (the sharing is exact up to float rounding).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch

from agent_r1.data.synthetic import WorldConfig, generate
from agent_r1.envs.qa import DEFAULT_SYSTEM_PROMPT
from agent_r1.learner import Learner, LearnerConfig, token_logprobs
from agent_r1.models import load_model
from agent_r1.trajectory import Sequence, collate


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m-instruct", help="a packaged model's name or a checkpoint folder")
    p.add_argument("--groups", type=int, default=2)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--continuation", type=int, default=120, help="tokens after the prompt (loss on all of them)")
    p.add_argument("--repeats", type=int, default=3, help="timed steps per setting (after one warm-up each)")
    p.add_argument("--threads", type=int, default=1)
    return p.parse_args(argv)


def make_batch(tok, groups: int, size: int, continuation: int, seed: int = 0) -> dict:
    questions = generate(WorldConfig(seed=seed, n_films=40, n_directors=12)).questions["question"].tolist()[:groups]
    g = torch.Generator().manual_seed(seed)
    rows = []
    for q in questions:
        prompt = tok.apply_chat_template([{"role": "system", "content": DEFAULT_SYSTEM_PROMPT}, {"role": "user", "content": q}],
                                         add_generation_prompt=True, tokenize=True, return_dict=False)
        rows += [(list(prompt), torch.randint(100, len(tok), (continuation,), generator=g).tolist()) for _ in range(size)]
    seqs = [Sequence(ids=p + c, action=[0] * len(p) + [1] * len(c), step_ids=[-1] * len(p) + [0] * len(c),
                     rewards=[0.0] * (len(p) + len(c)), sample_logprobs=[0.0] * (len(p) + len(c)), group_id=0,
                     prompt_len=len(p)) for p, c in rows]
    return collate(seqs, tok.pad_token_id), statistics.fmean(len(p) for p, _ in rows)


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    model, tok = load_model(args.model, device="cpu")
    batch, prompt_tokens = make_batch(tok, args.groups, args.group_size, args.continuation)
    tokens = int(batch.attention_mask.sum())
    learners = {share: Learner(copy.deepcopy(model), LearnerConfig(lr=1e-7, share_prefix=share, micro_batch_tokens=1 << 20),
                               precision="fp32") for share in (False, True)}
    with torch.no_grad():
        lp = {s: token_logprobs(lr.model, batch.input_ids, batch.attention_mask, positions=batch.loss_mask, share_prefix=s)
              for s, lr in learners.items()}
    times: dict[bool, list[float]] = {False: [], True: []}
    for rep in range(args.repeats + 1):
        for share, learner in learners.items():
            t0 = time.perf_counter()
            learner.sft_step(batch)
            if rep:  # the first round warms up
                times[share].append(time.perf_counter() - t0)
    off, on = statistics.median(times[False]), statistics.median(times[True])
    print(f"model {args.model}; {args.groups} groups x {args.group_size} rows; prompt {prompt_tokens:.0f} tokens "
          f"(system prompt + question) + {args.continuation} continuation; {tokens} tokens per step; "
          f"{args.threads} thread(s); median of {args.repeats}")
    print(f"share_prefix off: {off:.2f} s/step ({tokens / off:.0f} tok/s)")
    print(f"share_prefix on:  {on:.2f} s/step ({tokens / on:.0f} tok/s)")
    print(f"max |log-prob difference|: {float((lp[True] - lp[False]).abs().max()):.2e}")
    print(f"ratio_off_over_on: {off / on:.2f}")


if __name__ == "__main__":
    main()
