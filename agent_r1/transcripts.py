"""Readable transcripts of episodes: question, each turn's action and observation, answer, reward."""

from __future__ import annotations

from agent_r1.trajectory import Trajectory


def transcript(traj: Trajectory, task: dict | None = None) -> str:
    """One episode as markdown (what the agent wrote, what the tools returned, how it scored)."""
    lines = [f"### {traj.task_id}"]
    if task:  # a QA task's question and answers; another task's own fields
        shown = {k: v for k, v in task.items() if k not in ("id", "split")}
        lines.append(f"**Question:** {task['question']}" if "question" in task else f"**Task:** {shown!r}"[:500])
        answers = task.get("answers")
        if answers:
            lines.append(f"**Gold:** {', '.join(map(str, answers)) if isinstance(answers, list) else answers}")
    for i, step in enumerate(traj.steps, 1):
        flags = [f for f, on in (("format error", step.format_error), ("cut at max_new_tokens", step.hit_max_new_tokens),
                                 (f"{step.tool_errors} tool error(s)", step.tool_errors)) if on]
        head = f"**Turn {i}**" + (f" ({', '.join(flags)})" if flags else "") + (f" step reward {step.reward:+.2f}" if step.reward else "")
        lines += ["", head, "", "```", step.action_text.strip() or "(empty)", "```"]
        for obs in step.observation:
            lines += [f"> **{obs.get('name') or obs.get('role', 'tool')}:** " + str(obs.get("content", "")).replace("\n", "\n> ")]
    m = traj.metrics
    scores = "".join(f"{name} {m[key]:{fmt}} · " for key, name, fmt in (("em", "EM", ".0f"), ("f1", "F1", ".2f")) if key in m)
    lines += ["", f"**Answer:** {traj.answer!r} · {scores}reward {traj.total_reward:.2f} · tool calls {m.get('tool_calls', 0)}"]
    return "\n".join(lines)


def transcripts(trajs: list[Trajectory], tasks: list[dict] | None = None, limit: int = 8) -> str:
    by_id = {str(t["id"]): t for t in tasks or [] if "id" in t}  # (a task without an id shows its turns only)
    return "\n\n---\n\n".join(transcript(t, by_id.get(t.task_id)) for t in trajs[:limit]) + "\n"
