"""Agent-R1's GRPO against TRL's GRPOTrainer (``tools=[search]``), side by side, back to back.

    pip install -e ".[peers]"                  # TRL, pinned (an optional extra, never a core dependency)
    python bench/peer_trl.py                   # the tiny from-scratch model
    python bench/peer_trl.py --model smollm2   # SmolLM2-135M-Instruct (the default pretrained model)
    python bench/peer_trl.py --steps 3 --questions 4 --group-size 4 --turns 3

Both sides get the same model (same initial weights), the same chat template (TRL's Qwen2.5
ChatML template, which renders tool schemas, tool calls and tool results; SmolLM2's own template
cannot), the same system prompt and questions of the synthetic multi-hop world (2-hop training
questions, in the same order: step k trains on questions k*Q .. k*Q+Q-1), the same search tool
(the project's BM25 index; both sides see its schema from one Python function) and the same
settings: group size, questions per step, max_new_tokens per turn, turn limit, temperature 1,
learning rate, fp32, no KL term (no reference model), one optimizer step per batch of rollouts
(so neither side runs a separate old-log-prob pass).

The episodes follow one rule on both sides, TRL's: a turn with a tool call gets the tool's result
and another turn, up to the turn limit; a turn without one ends the episode. (Agent-R1's own
environment also answers a malformed turn with an error message and goes on; here that would give
it more turns than TRL, so its environment ends the episode there too.) An untrained model rarely
calls a tool, so its episodes are mostly one turn long: the ``turns/episode`` column says how
many turns each side ran.

- ours: ``agent_r1.pipeline.rl_driver`` (the RL stage's driver: batched rollout through ``HFEngine``
  with the KV cache kept across turns, GRPO advantages, the DeepSpeed learner's update);
- TRL: ``GRPOTrainer(..., tools=[search])`` with ``max_tool_calling_iterations = turns - 1``,
  ``generation_kwargs={"max_new_tokens": ...}`` (per turn), transformers generation (no vLLM).

Each side runs in its own subprocess (so peak RSS is its own): one untimed warm-up step, then
``--steps`` timed steps. The table shows seconds per RL step (and its rollout / update parts), wall and
this process's CPU seconds (on a shared core the CPU seconds are the work done, the wall seconds
add the waits),
generated tokens per second of rollout, trained tokens (prompt + completion, no padding) per second
of update, turns per episode and peak RSS; the last line is
``ratio_trl_over_ours_step_time: X.XX`` (> 1: ours is faster).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from importlib import resources
from pathlib import Path

TRL_VERSION = "1.16.0"  # what pyproject's [peers] extra pins and this bench was measured with
MISSING_TRL = (f"bench/peer_trl.py needs TRL: pip install -e \".[peers]\" (installs trl=={TRL_VERSION}; "
               "with the CPU torch pin: add -c constraints-cpu.txt)")


def model_arg(value: str) -> str:
    if value in ("tiny", "smollm2") or Path(value, "config.json").is_file():
        return value
    raise argparse.ArgumentTypeError(f"{value!r}: not tiny, smollm2 or a checkpoint folder with a config.json")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=model_arg, default="tiny",
                   help="tiny, smollm2, or a checkpoint folder (e.g. one that learned the tool format under this bench's Qwen2.5 template)")
    p.add_argument("--steps", type=int, default=3, help="timed RL steps per side (after one warm-up step)")
    p.add_argument("--questions", type=int, default=4, help="questions per RL step")
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=48, help="per turn")
    p.add_argument("--turns", type=int, default=3, help="turn limit per episode")
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--reward", choices=["em+tiebreak", "em"], default="em+tiebreak",
                   help="em: the answer's exact match alone (an untrained model almost never earns it, every group "
                        "ties, and ours skips the update of rows whose advantage is zero while TRL computes them); "
                        "em+tiebreak (default): plus 0.01 x the last turn's length in characters / 500 (at most 0.01), "
                        "so every row has an advantage and both sides train on every row")
    p.add_argument("--warmup-sft", type=int, default=0, metavar="STEPS",
                   help="first, STEPS SFT steps (8 demonstrations each) on oracle episodes of 1- and 2-hop questions "
                        "of another world, rendered with this bench's template and tool schema; both sides start from "
                        "that checkpoint, so the model calls the tool and episodes run several turns (0: off)")
    p.add_argument("--no-share-prefix", dest="share_prefix", action="store_false",
                   help="ours: run every row's prompt in the update (LearnerConfig.share_prefix off), as TRL does")
    p.add_argument("--precision", choices=["auto", "fp32", "bf16"], default="auto",
                   help="ours: model.precision, as in a pipeline (auto: the rollout in bf16 on a CPU with native bf16 "
                        "for a model of 10M+ parameters, the update in fp32; agent_r1.models.rollout_precision); "
                        "TRL computes in fp32 on a CPU")
    p.add_argument("--sides", nargs="+", choices=["ours", "trl"], default=["ours", "trl"],
                   help="which sides to run, in this order")
    p.add_argument("--side", choices=["ours", "trl", "warmup"], help=argparse.SUPPRESS)  # a child process runs one side
    p.add_argument("--out", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def have_trl() -> bool:
    return importlib.util.find_spec("trl") is not None


# ------------------------------------------------------------------------------ the shared setup
def chat_template() -> str:
    """TRL's Qwen2.5 ChatML template: tool-capable, and one TRL knows how to parse tool calls from."""
    return resources.files("trl").joinpath("chat_templates/qwen2_5.jinja").read_text()


def setup(args):
    """Model, tokenizer (with the shared template), tasks, the search tool and its schema function."""
    import torch

    from agent_r1.config import EnvConfig
    from agent_r1.data.synthetic import WorldConfig, generate
    from agent_r1.models import TinyModelConfig, build_tiny_model, load_model, train_tokenizer
    from agent_r1.run import tasks_for
    from agent_r1.tools import SearchIndex, make_search_tool
    from agent_r1.tools.base import run_tool

    torch.manual_seed(args.seed)
    world = generate(WorldConfig(seed=args.seed, name_words=1, n_films=800, n_directors=260))  # the tiny pipeline's world
    if args.model != "tiny":
        model, tok = load_model("smollm2-135m-instruct" if args.model == "smollm2" else args.model, device="cpu")
    else:
        texts = list(world.corpus["text"]) + list(world.corpus["title"]) + list(world.questions["question"])
        tok = train_tokenizer(texts, vocab_size=4096)
        model = build_tiny_model(TinyModelConfig(vocab_size=4096), tok, seed=args.seed)
    tok.chat_template = chat_template()
    n = (args.steps + 1) * args.questions
    tasks = tasks_for(world.questions, [2])[:n]
    if len(tasks) < n:
        raise ValueError(f"the world has {len(tasks)} 2-hop questions; {n} needed")
    env = EnvConfig()
    tool = make_search_tool(SearchIndex(world.corpus), top_k=1, timeout_s=env.tool_timeout_s,
                            max_output_chars=env.max_output_chars)

    def search(query: str) -> str:
        """Search the knowledge base for passages relevant to a query.

        Args:
            query: Keywords or a question naming what to look up, e.g. an entity and the fact wanted.
        """
        return run_tool(tool, {"query": query}).text

    return model, tok, tasks, tool, search


def reward(text: str, golds: list[str], kind: str) -> float:
    """The episode's reward on both sides, from its last turn's text."""
    from agent_r1.rewards import answer_score, extract_answer

    score = answer_score(extract_answer(text), golds, "em")
    if kind == "em+tiebreak":
        score += 0.01 * min(len(text), 500) / 500
    return score


def clocks() -> tuple[float, float]:
    """(wall s, this process's CPU s): on a shared core, CPU time is the work done, wall time includes the waits."""
    return time.perf_counter(), time.process_time()


def phases(t0, t1, t2) -> dict:
    """Wall and CPU seconds of the rollout (t0..t1), the update (t1..t2) and the step."""
    return {"rollout_s": t1[0] - t0[0], "update_s": t2[0] - t1[0], "step_s": t2[0] - t0[0],
            "rollout_cpu": t1[1] - t0[1], "update_cpu": t2[1] - t1[1], "step_cpu": t2[1] - t0[1]}


PROMPT_TOKENS = 320  # about the longest first prompt: the system turn with the tool schema, and a question


def max_context(model) -> int:
    """Ours: the context limit (prompt + every turn); TRL: this less PROMPT_TOKENS for the completion."""
    return min(2048, model.config.max_position_embeddings)


# ------------------------------------------------------------------------------ the format warm-up
def warmup_sft(args, folder: str) -> None:
    """``--warmup-sft``: teach the model this bench's tool-call format (Agent-R1's SFT on oracle
    demonstrations, rendered exactly as both sides render episodes); save it to ``folder``."""
    from transformers.utils import get_json_schema

    from agent_r1.context import ContextManager
    from agent_r1.data.synthetic import WorldConfig, generate
    from agent_r1.envs import MultiHopQAEnv
    from agent_r1.learner import Learner, LearnerConfig
    from agent_r1.run import tasks_for
    from agent_r1.sft import demonstration, sft
    from agent_r1.tools import SearchIndex, make_search_tool

    model, tok, _tasks, _tool, search = setup(args)
    world = generate(WorldConfig(seed=args.seed + 1, name_words=1, n_films=800, n_directors=260))  # not the bench's questions
    tool = make_search_tool(SearchIndex(world.corpus), top_k=1)
    env = MultiHopQAEnv(tool, max_turns=args.turns, max_context_tokens=max_context(model))
    context = ContextManager(tok, tools=[get_json_schema(search)])
    tasks = tasks_for(world.questions, [1, 2], 4 * args.warmup_sft, args.seed)
    demos = [d for t in tasks if (d := demonstration(env, t, context)) is not None]
    learner = Learner(model, LearnerConfig(lr=5e-5), precision="fp32")
    epochs = args.warmup_sft * 8 / len(demos)
    hist = sft(learner, demos, tok.pad_token_id, epochs, batch_size=8, lr=5e-5, warmup_steps=2, seed=args.seed,
               on_step=lambda step, total, m: print(f"warm-up SFT step {step}/{total} loss {m['sft_loss']:.3f}", flush=True))
    learner.save(folder, tok)
    print(f"warm-up SFT: {len(hist)} steps on {len(demos)} demonstrations, loss {hist[0]['sft_loss']:.3f} -> "
          f"{hist[-1]['sft_loss']:.3f}", flush=True)


# ------------------------------------------------------------------------------ ours
def run_ours(args) -> dict:
    import torch
    from transformers.utils import get_json_schema

    from agent_r1.config import RLConfig
    from agent_r1.context import ContextManager
    from agent_r1.envs import MultiHopQAEnv
    from agent_r1.envs.qa import DEFAULT_SYSTEM_PROMPT
    from agent_r1.learner import Learner, LearnerConfig
    from agent_r1.models import resolve_precision
    from agent_r1.pipeline.rl_driver import build_train_batch
    from agent_r1.rollout import HFEngine, SamplingParams, run_episodes

    class StopWithoutToolCall(MultiHopQAEnv):
        """TRL's episode rule (a turn without a tool call ends the episode) and the bench's reward."""

        def final_reward(self, answer, action_text):
            return reward(action_text, self.task["answers"], args.reward), super().final_reward(answer, action_text)[1]

        def step(self, action_text, context_tokens=None):
            out = super().step(action_text, context_tokens)
            if out.done or out.info.tool_calls:
                return out
            return self._finish([], out.reward, out.info, "no_tool_call", action_text)

    model, tok, tasks, tool, search = setup(args)
    cfg = RLConfig(group_size=args.group_size, tasks_per_iteration=args.questions,
                   learner=LearnerConfig(lr=args.lr, mini_batches=1, ppo_epochs=1, share_prefix=args.share_prefix))
    learner = Learner(model, cfg.learner, precision=args.precision)
    engine = HFEngine(model, tok, precision=args.precision)
    context = ContextManager(tok, tools=[get_json_schema(search)])
    limit = max_context(model)
    print(f"ours: the rollout in {engine.computes_in}, the update in "
          f"{resolve_precision(args.precision, next(model.parameters()).device)} (model.precision {args.precision})"
          + ("" if engine.exact else ", its episodes weighed by the off-policy correction"), flush=True)

    def make_env():
        return StopWithoutToolCall(tool, max_turns=args.turns, max_context_tokens=limit,
                                   system_prompt=DEFAULT_SYSTEM_PROMPT)

    gen = torch.Generator().manual_seed(args.seed)
    params = SamplingParams(cfg.temperature, cfg.top_p, args.max_new_tokens)
    groups = [i for i in range(args.questions) for _ in range(cfg.group_size)]
    steps = []
    for k in range(args.steps + 1):  # RLTrainer.step's phases (agent_r1.pipeline.rl_driver) on fixed questions, timed
        batch_tasks = tasks[k * args.questions : (k + 1) * args.questions]
        t0 = clocks()
        reps = [t for t in batch_tasks for _ in range(cfg.group_size)]
        trajs = run_episodes(engine, make_env, reps, context, params, groups, limit)
        t1 = clocks()
        stats = learner.update(build_train_batch(learner, trajs, cfg, tok.pad_token_id, engine.exact), gen)
        t2 = clocks()
        steps.append({**phases(t0, t1, t2), "gen_tokens": sum(t.num_action_tokens for t in trajs),
                      "train_tokens": stats["update/tokens"],
                      "turns": statistics.fmean(len(t.steps) for t in trajs)})
    return {"steps": steps[1:], "episodes": args.questions * args.group_size}


# ------------------------------------------------------------------------------ TRL
def run_trl(args) -> dict:
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from agent_r1.envs.qa import DEFAULT_SYSTEM_PROMPT

    model, tok, tasks, _tool, search = setup(args)
    ds = Dataset.from_list([{"prompt": [{"role": "system", "content": DEFAULT_SYSTEM_PROMPT},
                                        {"role": "user", "content": t["question"]}],
                             "answers": list(t["answers"])} for t in tasks])

    def last_turn_reward(completions, answers, **_):
        return [reward(next((m.get("content") or "" for m in reversed(msgs) if m["role"] == "assistant"), ""),
                       golds, args.reward) for msgs, golds in zip(completions, answers)]

    steps: list[dict] = []

    class Timed(GRPOTrainer):
        def _generate_and_score_completions(self, inputs):
            out = super()._generate_and_score_completions(inputs)
            cm = out["completion_mask"]
            sampled = cm * out["tool_mask"] if "tool_mask" in out else cm
            # turns = sampled segments: 1 + tool results inside the completion
            tool_seg = (cm * (1 - out["tool_mask"])) if "tool_mask" in out else torch.zeros_like(cm)
            starts = (tool_seg[:, 1:] > tool_seg[:, :-1]).sum() + (tool_seg[:, 0] > 0).sum()
            steps.append({"t1": clocks(), "gen_tokens": int(sampled.sum()),
                          "train_tokens": int(out["prompt_mask"].sum() + cm.sum()),
                          "turns": 1 + float(starts) / cm.shape[0]})
            return out

    class StepTimer(TrainerCallback):
        def on_step_begin(self, *a, **k):
            self.t0 = clocks()

        def on_step_end(self, *a, **k):
            steps[-1].update(phases(self.t0, steps[-1].pop("t1"), clocks()))

    n = args.questions * args.group_size
    with tempfile.TemporaryDirectory() as out_dir:
        cfg = GRPOConfig(
            output_dir=out_dir, use_cpu=True, bf16=False, fp16=False, seed=args.seed,
            per_device_train_batch_size=n, gradient_accumulation_steps=1, steps_per_generation=1,
            num_generations=args.group_size, num_iterations=1, beta=0.0, learning_rate=args.lr,
            lr_scheduler_type="constant", warmup_steps=0, max_grad_norm=1.0, weight_decay=0.0,
            temperature=1.0, top_p=1.0, top_k=0, max_completion_length=max_context(model) - PROMPT_TOKENS,
            generation_kwargs={"max_new_tokens": args.max_new_tokens},
            max_tool_calling_iterations=args.turns - 1, shuffle_dataset=False,
            max_steps=args.steps + 1, logging_steps=1, save_strategy="no", report_to="none",
            disable_tqdm=True, dataloader_num_workers=0,
        )
        trainer = Timed(model=model, reward_funcs=[last_turn_reward], args=cfg, train_dataset=ds,
                        processing_class=tok, tools=[search], callbacks=[StepTimer()])
        trainer.train()
    return {"steps": steps[1:], "episodes": n}


# ------------------------------------------------------------------------------ the comparison
def child(args) -> None:
    import torch

    if os.environ.get("OMP_NUM_THREADS"):
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    if args.side == "warmup":
        return warmup_sft(args, args.out)
    res = (run_ours if args.side == "ours" else run_trl)(args)
    res["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    Path(args.out).write_text(json.dumps(res))


def summarize(res: dict) -> dict:
    s = res["steps"]
    keys = ("step_s", "rollout_s", "update_s", "step_cpu", "rollout_cpu", "update_cpu", "gen_tokens", "train_tokens")
    out = {k: sum(x[k] for x in s) / len(s) for k in keys}
    out |= {"gen_tok_s": out["gen_tokens"] / out["rollout_s"], "train_tok_s": out["train_tokens"] / out["update_s"],
            "turns": statistics.fmean(x["turns"] for x in s), "rss": res["peak_rss_mb"]}
    return out


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.steps < 1 or args.turns < 1 or args.warmup_sft < 0:
        sys.exit("--steps and --turns must be at least 1, --warmup-sft at least 0")
    if args.side:
        return child(args)
    if not have_trl():
        sys.exit(MISSING_TRL)
    import trl

    print(f"trl {trl.__version__}; model {args.model}; {args.questions} questions x group {args.group_size} per step; "
          f"max_new_tokens {args.max_new_tokens} per turn; <= {args.turns} turns; lr {args.lr}; ours model.precision {args.precision}, TRL fp32; "
          f"{args.steps} timed steps after 1 warm-up; OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}",
          flush=True)
    argv = list(argv if argv is not None else sys.argv[1:])
    warm = tempfile.TemporaryDirectory()
    if args.warmup_sft:  # in a child process too: DeepSpeed's environment would make TRL's accelerate go distributed
        proc = subprocess.run([sys.executable, __file__, *argv, "--side", "warmup", "--out", warm.name])
        if proc.returncode != 0:
            sys.exit("the warm-up SFT failed")
        argv += ["--model", warm.name, "--warmup-sft", "0"]  # the last occurrence wins
    results = {}
    for side in args.sides:
        with tempfile.NamedTemporaryFile(suffix=".json") as f:
            cmd = [sys.executable, __file__, *argv, "--side", side, "--out", f.name]
            t0 = time.perf_counter()
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                sys.exit(f"the {side} side failed:\n{proc.stderr[-4000:]}")
            results[side] = summarize(json.loads(Path(f.name).read_text()))
            print(f"{side}: done in {time.perf_counter() - t0:.0f} s", flush=True)

    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"GRPO step, {args.model}: Agent-R1 vs TRL {trl.__version__} (mean of {args.steps} steps)")
    cols = [("side", None), ("s / RL step", "step_s"), ("CPU s / step", "step_cpu"), ("rollout s", "rollout_s"),
            ("rollout CPU s", "rollout_cpu"), ("update s", "update_s"), ("update CPU s", "update_cpu"),
            ("gen tok / step", "gen_tokens"), ("gen tok/s", "gen_tok_s"), ("train tok / step", "train_tokens"),
            ("train tok/s", "train_tok_s"), ("turns / episode", "turns"), ("peak RSS MB", "rss")]
    for name, _ in cols:
        table.add_column(name, justify="left" if name == "side" else "right")
    for side, r in results.items():
        label = "ours (agent_r1 RLTrainer)" if side == "ours" else "TRL GRPOTrainer"
        table.add_row(label, *(("{:,.0f}" if k in ("gen_tokens", "gen_tok_s", "train_tokens", "train_tok_s", "rss")
                                else "{:.2f}").format(r[k]) for _, k in cols[1:]))
    Console(width=200).print(table)
    print("wall s include the waits for a core other processes hold; CPU s (this process, 1 thread) are the work done")
    if len(results) == 2:
        o, t = results["ours"], results["trl"]
        for phase in ("rollout", "update", "step"):
            print(f"ratio_trl_over_ours_{phase}_cpu: {t[phase + '_cpu'] / o[phase + '_cpu']:.2f}")
        for phase in ("rollout", "update"):
            print(f"ratio_trl_over_ours_{phase}: {t[phase + '_s'] / o[phase + '_s']:.2f}")
        print(f"ratio_trl_over_ours_step_time: {t['step_s'] / o['step_s']:.2f}")


if __name__ == "__main__":
    main()
