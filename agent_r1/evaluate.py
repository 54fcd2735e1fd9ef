"""Evaluating an agent: greedy episodes on held-out tasks, summarised overall and by hop count;
pass@k from sampled ones."""

from __future__ import annotations

import math
from collections import defaultdict

from agent_r1.envs.metrics import aggregate
from agent_r1.trajectory import Trajectory


def summarize(trajs: list[Trajectory], tasks: list[dict]) -> dict:
    """Over the episodes: every metric the environment declares (aggregated as declared: the
    mean of ``em``, ``f1``, ``tool_calls``...), and the reward, turns, format-error rate per turn,
    share of episodes with an answer, action tokens and environment errors."""
    n = len(trajs)
    if n == 0:
        return {"n": 0}
    turns = sum(len(t.steps) for t in trajs)
    out = aggregate(trajs) | {
        "n": n,
        "reward": sum(t.total_reward for t in trajs) / n,
        "turns": turns / n,
        "format_error_rate": sum(s.format_error for t in trajs for s in t.steps) / max(turns, 1),
        "answered": sum(bool(t.answer) for t in trajs) / n,
        "tokens": sum(t.num_action_tokens for t in trajs) / n,
        "env_errors": sum(t.stop_reason == "env_error" for t in trajs),  # scored as wrong
    }
    out = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in out.items()}
    # EM per question type: which compositions an agent answers (a hop count mixes several)
    by_type: dict[str, list[float]] = defaultdict(list)
    for t, task in zip(trajs, tasks):
        if "qtype" in task and "em" in t.metric_aggs:  # tasks with a type, an environment that reports em
            by_type[str(task["qtype"])].append(t.metrics.get("em", 0.0))
    out["em_by_qtype"] = {q: round(sum(v) / len(v), 4) for q, v in sorted(by_type.items())}
    return out


def summarize_by_hops(trajs: list[Trajectory], tasks: list[dict]) -> dict:
    """``{"all": {...}, "1hop": {...}, "2hop": {...}, ...}`` (hop counts where the tasks have them)."""
    groups: dict[int, list[int]] = defaultdict(list)
    for i, task in enumerate(tasks):
        if "hops" in task:  # a task without hop counts is only in "all"
            groups[int(task["hops"])].append(i)
    out = {"all": summarize(trajs, tasks)}
    for hops in sorted(groups):
        idx = groups[hops]
        out[f"{hops}hop"] = summarize([trajs[i] for i in idx], [tasks[i] for i in idx])
    return out


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimator of pass@k from ``n`` samples of which ``c`` are correct (Chen et al.
    2021, arXiv:2107.03374): 1 - C(n-c, k) / C(n, k), the chance that k of the n drawn without
    replacement hold a correct one."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n; got n={n}, c={c}, k={k}")
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def solved(t: Trajectory) -> bool:
    """Did the episode solve its task: its ``won`` or ``em`` (the first the environment reports)
    is 1, else its final reward is at least 1."""
    for name in ("won", "em"):
        if name in t.metric_aggs:
            return t.metrics.get(name, 0.0) >= 1.0
    return t.final_reward >= 1.0


def pass_at_k_by_hops(trajs: list[Trajectory], tasks: list[dict], ks: list[int]) -> dict:
    """``{"all": {"pass@k": ...}, "<h>hop": {...}}``: the mean over tasks of :func:`pass_at_k`, with
    ``trajs`` n rounds of ``tasks`` (episode ``j * len(tasks) + i`` is round j's of task i)."""
    n = len(trajs) // len(tasks)
    correct = [sum(solved(trajs[j * len(tasks) + i]) for j in range(n)) for i in range(len(tasks))]
    groups: dict[str, list[int]] = {"all": list(range(len(tasks)))}
    for i, task in enumerate(tasks):
        if "hops" in task:
            groups.setdefault(f"{int(task['hops'])}hop", []).append(i)
    return {g: {f"pass@{k}": round(sum(pass_at_k(n, correct[i], k) for i in idx) / len(idx), 4) for k in ks}
            | {"pass_samples": n} for g, idx in groups.items()}


def retrieval_recall(index, tasks: list[dict], ks: tuple[int, ...] = (1, 2, 5, 10)) -> dict:
    """Recall@k of the gold documents when searching with the raw question (Naive RAG's
    retrieval), overall and by question type: ``{"all": {"recall@1": ...}, "<qtype>": {...}}``."""
    groups: dict[str, list[dict]] = defaultdict(list)
    for t in tasks:
        groups["all"].append(t)
        groups[str(t.get("qtype", "?"))].append(t)
    out = {}
    for name, group in groups.items():
        queries, gold = [t["question"] for t in group], [list(t["gold_titles"]) for t in group]
        out[name] = {f"recall@{k}": round(index.recall_at_k(queries, gold, k), 4) for k in ks} | {"n": len(group)}
    return out


METHOD_ORDER = ["naive_rag", "no_tool", "base_tool_call", "sft", "sft_control", "rft", "ppo", "grpo", "reinforce_pp",
                "reinforce_pp_baseline", "rloo"]


def comparison_markdown(results: dict, in_domain: str, out_domain: str) -> str:
    """The Agent-R1-style table from eval.json: EM/F1 in-domain and out-of-domain, their mean,
    tool calls and valid-format rate per method (baselines first, ablations last)."""
    methods = list(results.get(in_domain, {}))
    methods.sort(key=lambda m: (METHOD_ORDER.index(m) if m in METHOD_ORDER else len(METHOD_ORDER), m))
    rows = [f"| method | {in_domain} EM | F1 | {out_domain} EM | F1 | mean EM | tool calls | valid format |",
            "|---|---|---|---|---|---|---|---|"]
    for m in methods:
        a, b = results[in_domain][m], results.get(out_domain, {}).get(m, {})
        mean = (a["em"] + b["em"]) / 2 if b else a["em"]
        rows.append(f"| {m} | {a['em']:.3f} | {a['f1']:.3f} | {b.get('em', float('nan')):.3f} | {b.get('f1', float('nan')):.3f} "
                    f"| {mean:.3f} | {a['tool_calls']:.2f} | {1 - a['format_error_rate']:.3f} |")
    return "\n".join(rows) + "\n" + pass_markdown(results[in_domain], in_domain) + \
        "".join(curve_markdown(results[k], k) for k in results if k.startswith("curve_"))


def pass_markdown(rows: dict, split: str) -> str:
    """The methods of one eval.json split that have pass@k (``eval.pass_k``) as a table: the greedy
    score (``won``, else ``em``) beside pass@k for each k; nothing when none has them."""
    methods = sorted((m for m in rows if any(k.startswith("pass@") for k in rows[m])),
                     key=lambda m: (METHOD_ORDER.index(m) if m in METHOD_ORDER else len(METHOD_ORDER), m))
    if not methods:
        return ""
    ks = sorted({int(k[len("pass@"):]) for m in methods for k in rows[m] if k.startswith("pass@")})
    metric = "won" if "won" in rows[methods[0]] else "em"
    out = [f"\n| method | {split} greedy {metric} | " + " | ".join(f"pass@{k}" for k in ks) + " |",
           "|---" * (len(ks) + 2) + "|"]
    out += [f"| {m} | {rows[m].get(metric, float('nan')):.3f} | " +
            " | ".join(f"{rows[m].get(f'pass@{k}', float('nan')):.3f}" for k in ks) + " |" for m in methods]
    return "\n".join(out) + "\n"


def curve_markdown(rows: dict, split: str) -> str:
    """eval.json's held-out curve rows (``curve_<split>``) as a table: each method's area under its
    curve (the mean over episodes seen) and final point; a baseline's is its score."""
    metric = next(k[: -len("_auc")] for k in next(iter(rows.values())) if k.endswith("_auc"))
    methods = sorted(rows, key=lambda m: (METHOD_ORDER.index(m) if m in METHOD_ORDER else len(METHOD_ORDER), m))
    out = [f"\n| method | {split} {metric} AUC | final | points |", "|---|---|---|---|"]
    out += [f"| {m} | {rows[m][metric + '_auc']:.3f} | {rows[m][metric + '_final']:.3f} | {rows[m]['points']} |" for m in methods]
    return "\n".join(out) + "\n"


def seed_report(results: list[dict], split: str = "test", rl: str = "grpo", wall_s: float | None = None,
                name: str | None = None) -> str:
    """Several seeds' eval.json (with ``sft``, ``rl`` and ``sft_control``): a markdown table of
    held-out EM per hop count (mean ± sd over the seeds), the goal checks, and a last line
    ``<name>: +X.XX ± Y.YY (control +Z.ZZ, N seeds, W s)`` (all hops, RL minus its SFT start;
    ``name`` defaults to ``<rl>_lift``)."""
    import statistics

    def stats(values: list[float]) -> tuple[float, float]:
        return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0

    splits = [split] + sorted(k for k in results[0] if k.startswith(f"{split}_") and k.endswith("hop"))
    methods = [m for m in METHOD_ORDER if all(m in r.get(split, {}) for r in results)]
    for need in ("sft", rl):
        if need not in methods:
            raise ValueError(f"eval.json of every seed needs method {need!r} in split {split!r}; found {methods}")
    rows = ["| split | " + " | ".join(methods) + " |", "|---" * (len(methods) + 1) + "|"]
    for s in splits:
        cells = [stats([r[s][m]["em"] for r in results]) for m in methods]
        rows.append(f"| {s} | " + " | ".join(f"{mu:.3f} ± {sd:.3f}" for mu, sd in cells) + " |")
    lift = stats([r[split][rl]["em"] - r[split]["sft"]["em"] for r in results])
    # the control where a seed ran it; "above the control" compares RL and control on those seeds
    controlled = [r for r in results if "sft_control" in r.get(split, {})]
    control = stats([r[split]["sft_control"]["em"] - r[split]["sft"]["em"] for r in controlled]) if controlled else None
    rl_there = stats([r[split][rl]["em"] - r[split]["sft"]["em"] for r in controlled]) if controlled else None
    worst = min(statistics.fmean(r[s][rl]["em"] - r[s]["sft"]["em"] for r in results) for s in splits[1:] or splits)
    checks = [f"lift >= +0.20: {'yes' if lift[0] >= 0.2 else 'no'}",
              f"above the control: {'yes' if control and rl_there[0] > control[0] else 'no'}",
              f"no hop count below SFT by more than 0.05: {'yes' if worst >= -0.05 else 'no'} (worst {worst:+.2f})"]
    last = f"{name or rl + '_lift'}: {lift[0]:+.2f} ± {lift[1]:.2f} (" + \
        (f"control {control[0]:+.2f}" if control else "no control")
    if controlled and len(controlled) < len(results):
        last += f" on {len(controlled)} of them, RL there {rl_there[0]:+.2f}"
    last += f", {len(results)} seeds" + (f", {wall_s:.0f} s)" if wall_s is not None else ")")
    return "\n".join(rows) + "\n\ngoal: " + "; ".join(checks) + "\n" + last + "\n"
