"""Step and Trajectory records — the seam between rollout and learning — and their packing.

A trajectory is a list of steps, one per model turn. Each step keeps the exact context ids the
policy saw and the exact action ids it sampled (with their sampling log-probs), so the learner
trains on those ids and never re-tokenizes text. Trajectories round-trip to parquet (one row per
step) so a rollout can be stored, read in pandas and replayed.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pandas as pd
import torch


@dataclass
class Step:
    context_ids: list[int]
    action_ids: list[int]
    action_logprobs: list[float]
    action_text: str = ""
    tool_calls: list[dict] = field(default_factory=list)
    observation: list[dict] = field(default_factory=list)  # chat messages (role "tool")
    reward: float = 0.0  # step (process) reward
    format_error: bool = False
    tool_errors: int = 0
    hit_max_new_tokens: bool = False  # the generation stopped at max_new_tokens, its turn unended


@dataclass
class Trajectory:
    task_id: str
    group_id: int
    steps: list[Step] = field(default_factory=list)
    final_reward: float = 0.0
    metrics: dict = field(default_factory=dict)
    # the metrics the environment declares, name -> how a batch aggregates them (envs/metrics.py)
    metric_aggs: dict[str, str] = field(default_factory=dict)

    @property
    def total_reward(self) -> float:
        return self.final_reward + sum(s.reward for s in self.steps)

    @property
    def num_action_tokens(self) -> int:
        return sum(len(s.action_ids) for s in self.steps)


_JSON_COLS = ("tool_calls", "observation")


def to_frame(trajectories: list[Trajectory]) -> pd.DataFrame:
    """One row per step; trajectory fields repeat on each of its rows."""
    rows = []
    for t_idx, traj in enumerate(trajectories):
        for s_idx, step in enumerate(traj.steps):
            row = asdict(step)
            for col in _JSON_COLS:
                row[col] = json.dumps(row[col])
            row.update(
                traj_index=t_idx,
                step_index=s_idx,
                task_id=traj.task_id,
                group_id=traj.group_id,
                final_reward=traj.final_reward,
                metrics=json.dumps(traj.metrics),
                metric_aggs=json.dumps(traj.metric_aggs),
            )
            rows.append(row)
    return pd.DataFrame(rows)


def from_frame(df: pd.DataFrame) -> list[Trajectory]:
    if df.empty:
        return []
    trajectories = []
    step_fields = Step.__dataclass_fields__
    for _, rows in df.sort_values(["traj_index", "step_index"]).groupby("traj_index", sort=True):
        first = rows.iloc[0]
        traj = Trajectory(
            task_id=str(first.task_id),
            group_id=int(first.group_id),
            final_reward=float(first.final_reward),
            metrics=json.loads(first.metrics),
            metric_aggs=json.loads(first.metric_aggs) if "metric_aggs" in rows else {},  # (older files lack it)
        )
        for rec in rows.to_dict("records"):
            kw = {k: rec[k] for k in step_fields}
            for col in _JSON_COLS:
                kw[col] = json.loads(kw[col])
            kw["context_ids"] = [int(x) for x in kw["context_ids"]]
            kw["action_ids"] = [int(x) for x in kw["action_ids"]]
            kw["action_logprobs"] = [float(x) for x in kw["action_logprobs"]]
            kw["reward"], kw["tool_errors"] = float(kw["reward"]), int(kw["tool_errors"])
            kw["format_error"], kw["hit_max_new_tokens"] = bool(kw["format_error"]), bool(kw["hit_max_new_tokens"])
            traj.steps.append(Step(**kw))
        trajectories.append(traj)
    return trajectories


def save_parquet(trajectories: list[Trajectory], path: str | Path) -> None:
    to_frame(trajectories).to_parquet(path, index=False)


def load_parquet(path: str | Path) -> list[Trajectory]:
    return from_frame(pd.read_parquet(path))


# --------------------------------------------------------------------------------------------
# Packing into tensors


@dataclass
class Sequence:
    """One training sequence: token ids with per-token annotations (aligned to ``ids``)."""

    ids: list[int]
    action: list[int]  # 1 where the token was sampled by the policy
    step_ids: list[int]  # model-turn index of action tokens, -1 elsewhere
    rewards: list[float]  # reward placed at token positions
    sample_logprobs: list[float]  # rollout's log-probs on action tokens, 0 elsewhere
    group_id: int
    prompt_len: int


def _is_prefix_chain(traj: Trajectory) -> bool:
    for prev, nxt in zip(traj.steps, traj.steps[1:]):
        seen = prev.context_ids + prev.action_ids
        if nxt.context_ids[: len(seen)] != seen:
            return False
    return True


def to_sequences(traj: Trajectory) -> list[Sequence]:
    """Training sequences for one trajectory.

    When every step's context extends the previous step's context + action (full history), the
    whole trajectory is ONE sequence: the last context plus the last action, with every step's
    action tokens marked. Otherwise (sliding window, summaries) each step is its own sequence —
    exactly the context the policy saw plus its action — carrying its return-to-go (its own and
    later step rewards plus the final reward) at its last action token.
    """
    steps = [s for s in traj.steps if s.action_ids]
    if not steps:
        return []
    if _is_prefix_chain(traj):
        last = steps[-1]
        ids = last.context_ids + last.action_ids
        n = len(ids)
        action, step_ids = [0] * n, [-1] * n
        rewards, logps = [0.0] * n, [0.0] * n
        for k, s in enumerate(steps):
            start = len(s.context_ids)
            for j in range(len(s.action_ids)):
                action[start + j], step_ids[start + j] = 1, k
                logps[start + j] = s.action_logprobs[j]
            rewards[start + len(s.action_ids) - 1] += s.reward
        rewards[n - 1] += traj.final_reward
        return [Sequence(ids, action, step_ids, rewards, logps, traj.group_id, len(steps[0].context_ids))]

    out = []
    to_go = traj.final_reward
    returns = []
    for s in reversed(steps):
        to_go += s.reward
        returns.append(to_go)
    for k, (s, ret) in enumerate(zip(steps, reversed(returns))):
        c, a = len(s.context_ids), len(s.action_ids)
        rewards = [0.0] * (c + a)
        rewards[-1] = ret
        out.append(
            Sequence(
                ids=s.context_ids + s.action_ids,
                action=[0] * c + [1] * a,
                step_ids=[-1] * c + [k] * a,
                rewards=rewards,
                sample_logprobs=[0.0] * c + list(s.action_logprobs),
                group_id=traj.group_id,
                prompt_len=c,
            )
        )
    return out


def collate(seqs: list[Sequence], pad_id: int, loss_mask: bool = True, adv_mask: bool = True) -> dict[str, torch.Tensor]:
    """Right-pad sequences into a batch of tensors.

    ``loss_mask``/``adv_mask`` off (the Agent-R1 ablations) widen those masks from the action
    tokens to every non-padding token after the prompt, observations included.
    """
    B, T = len(seqs), max(len(s.ids) for s in seqs)
    batch = {
        "input_ids": torch.full((B, T), pad_id, dtype=torch.long),
        "attention_mask": torch.zeros(B, T, dtype=torch.long),
        "action_mask": torch.zeros(B, T),
        "step_ids": torch.full((B, T), -1, dtype=torch.long),
        "token_rewards": torch.zeros(B, T),
        "sample_logprobs": torch.zeros(B, T),
        "group_ids": torch.tensor([s.group_id for s in seqs], dtype=torch.long),
    }
    after_prompt = torch.zeros(B, T)
    for i, s in enumerate(seqs):
        n = len(s.ids)
        batch["input_ids"][i, :n] = torch.tensor(s.ids)
        batch["attention_mask"][i, :n] = 1
        batch["action_mask"][i, :n] = torch.tensor(s.action, dtype=torch.float)
        batch["step_ids"][i, :n] = torch.tensor(s.step_ids)
        batch["token_rewards"][i, :n] = torch.tensor(s.rewards)
        batch["sample_logprobs"][i, :n] = torch.tensor(s.sample_logprobs)
        after_prompt[i, s.prompt_len : n] = 1
    batch["loss_mask"] = batch["action_mask"] if loss_mask else after_prompt
    batch["adv_mask"] = batch["action_mask"] if adv_mask else after_prompt
    return batch
