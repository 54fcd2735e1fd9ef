"""Step and Trajectory records — the seam between rollout and learning — and their packing
into the learner's :class:`TrainBatch`.

A trajectory is a list of steps, one per model turn. Each step keeps the exact context ids the
policy saw and the exact action ids it sampled (with their sampling log-probs), so the learner
trains on those ids and never re-tokenizes text. Trajectories round-trip to parquet (one row per
step): the RL stage stores some iterations' rollouts (``outputs/<pipeline>/rollouts/``) to be read
in pandas and replayed.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields, replace
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
    # the environment's key of the state the step started from (ToolEnv.state_key; None: none): steps of a
    # group's episodes with the same key are compared with each other (the gigpo estimator)
    state_key: str | None = None


@dataclass
class Trajectory:
    task_id: str
    group_id: int
    steps: list[Step] = field(default_factory=list)
    final_reward: float = 0.0
    # how the episode ended: "answer", "max_turns", "token_budget" (the environment's), "format_errors"
    # (env.max_format_errors format errors in a row: agent_r1/rollout/loop.py), or
    # "env_error" (the environment raised; ``error`` says what, and it is not trained on)
    stop_reason: str = ""
    answer: str | None = None  # the answer the environment read from the last turn, if any
    error: str | None = None
    # the episode's counters and the metrics its environment declares, all numbers
    metrics: dict[str, float] = field(default_factory=dict)
    # the metrics the environment declares, name -> how a batch aggregates them (envs/metrics.py)
    metric_aggs: dict[str, str] = field(default_factory=dict)
    # the policy that sampled it: how many updates its weights had seen (rl.max_staleness bounds how
    # far it may lag the learner's when an update trains on it)
    policy_version: int = 0
    # how the task's demonstration took part (agent_r1.algorithms.demos): "" sampled by the policy; "prefix" started
    # from the first ``demo_prefix`` steps (or, for a one-step demonstration, tokens) of it, which are context, not
    # sampled; "member" the demonstration itself, an off-policy member of its group
    demo: str = ""
    demo_prefix: int = 0

    @property
    def total_reward(self) -> float:
        return self.final_reward + sum(s.reward for s in self.steps)

    @property
    def num_action_tokens(self) -> int:
        return sum(len(s.action_ids) for s in self.steps)


_JSON_COLS = ("tool_calls", "observation")
_TRAJ_JSON = ("metrics", "metric_aggs")


def to_frame(trajectories: list[Trajectory]) -> pd.DataFrame:
    """One row per step; the trajectory's fields repeat on each of its rows (a trajectory with no
    step, ended before its first turn, has no row)."""
    rows = []
    for t_idx, traj in enumerate(trajectories):
        head = {k: v for k, v in asdict(traj).items() if k != "steps"}
        head.update({k: json.dumps(head[k]) for k in _TRAJ_JSON}, traj_index=t_idx)
        for s_idx, step in enumerate(traj.steps):
            row = asdict(step) | head | {"step_index": s_idx}
            row.update({col: json.dumps(row[col]) for col in _JSON_COLS})
            rows.append(row)
    return pd.DataFrame(rows)


def from_frame(df: pd.DataFrame) -> list[Trajectory]:
    if df.empty:
        return []
    trajectories = []
    for _, rows in df.sort_values(["traj_index", "step_index"]).groupby("traj_index", sort=True):
        first = rows.iloc[0]
        traj = Trajectory(task_id=str(first.task_id), group_id=int(first.group_id),
                          final_reward=float(first.final_reward), stop_reason=str(first.stop_reason),
                          answer=None if pd.isna(first.answer) else str(first.answer),
                          error=None if pd.isna(first.error) else str(first.error),
                          policy_version=int(first.get("policy_version", 0)),
                          demo=str(first.get("demo", "")), demo_prefix=int(first.get("demo_prefix", 0)),
                          **{k: json.loads(first[k]) for k in _TRAJ_JSON})
        for rec in rows.to_dict("records"):
            kw = {k: rec[k] for k in Step.__dataclass_fields__ if k in rec}  # older files lack state_key
            kw.update({col: json.loads(kw[col]) for col in _JSON_COLS})
            kw["context_ids"] = [int(x) for x in kw["context_ids"]]
            kw["action_ids"] = [int(x) for x in kw["action_ids"]]
            kw["action_logprobs"] = [float(x) for x in kw["action_logprobs"]]
            kw["reward"], kw["tool_errors"] = float(kw["reward"]), int(kw["tool_errors"])
            kw["format_error"], kw["hit_max_new_tokens"] = bool(kw["format_error"]), bool(kw["hit_max_new_tokens"])
            kw["state_key"] = None if pd.isna(kw.get("state_key")) else str(kw["state_key"])
            traj.steps.append(Step(**kw))
        trajectories.append(traj)
    return trajectories


def save_parquet(trajectories: list[Trajectory], path: str | Path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
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
    # the episode the sequence came from, >= 0 and unique in a batch (its step rows share it); None: an
    # episode of its own
    episode_id: int | None = None
    state_keys: list[str | None] = field(default_factory=list)  # the state key of each step id of its episode
    # the reward of each step id of its episode, the final reward added to the last step's (the same list on every
    # row of the episode); None: not known (the estimators then read `rewards`)
    step_rewards: list[float] | None = None


def _is_prefix_chain(traj: Trajectory) -> bool:
    for prev, nxt in zip(traj.steps, traj.steps[1:]):
        seen = prev.context_ids + prev.action_ids
        if nxt.context_ids[: len(seen)] != seen:
            return False
    return True


def to_sequences(traj: Trajectory, episode_id: int | None = None) -> list[Sequence]:
    """Training sequences for one trajectory, each with ``episode_id``.

    When every step's context extends the previous step's context + action (full history), the
    whole trajectory is ONE sequence: the last context plus the last action, with every step's
    action tokens marked. Otherwise (sliding window, summaries) each step is its own sequence —
    exactly the context the policy saw plus its action — carrying its return-to-go (its own and
    later step rewards plus the final reward) at its last action token, undiscounted: the first
    step's row carries the episode's total reward. Either way every sequence also carries the
    episode's step rewards (``Sequence.step_rewards``), from which the group baselines compute
    scores and returns the same way whatever the layout.
    """
    steps = [s for s in traj.steps if s.action_ids]
    if not steps:
        return []
    keys = [s.state_key for s in steps]
    step_rewards = [s.reward for s in steps]
    step_rewards[-1] += traj.final_reward
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
            rewards[start + len(s.action_ids) - 1] = step_rewards[k]
        return [Sequence(ids, action, step_ids, rewards, logps, traj.group_id, len(steps[0].context_ids), episode_id,
                         keys, step_rewards)]

    out = []
    returns = [0.0] * len(steps)
    to_go = 0.0
    for k in reversed(range(len(steps))):
        to_go = step_rewards[k] + to_go
        returns[k] = to_go
    for k, (s, ret) in enumerate(zip(steps, returns)):
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
                episode_id=episode_id,
                state_keys=keys,
                step_rewards=step_rewards,
            )
        )
    return out


@dataclass
class TrainBatch:
    """What the learner trains on: ``B`` sequences right-padded to ``T`` tokens, on the CPU (the
    learner moves each micro-batch to its device). Masks are float32; rewards are float64 (the
    Python floats exactly, so sums of equal rewards stay equal).

    From :func:`collate` (the rollout):

    - ``input_ids`` [B, T] long: the tokens, ``pad_id`` after each sequence;
    - ``attention_mask`` [B, T] long: 1 on each sequence's tokens;
    - ``action_mask`` [B, T]: 1 on the tokens the policy sampled;
    - ``loss_mask`` [B, T]: the tokens the policy loss covers (``action_mask``; with ``rl.loss_mask``
      off every token after the prompt);
    - ``adv_mask`` [B, T]: the tokens advantages are computed over (likewise, ``rl.adv_mask``);
    - ``step_ids`` [B, T] long: the model turn of each action token, -1 elsewhere;
    - ``token_rewards`` [B, T]: rewards at the token that earned them;
    - ``sample_logprobs`` [B, T]: the rollout engine's log-probs of the sampled tokens, 0 elsewhere;
    - ``group_ids`` [B] long: the task group of each sequence;
    - ``episode_ids`` [B] long: the episode each sequence came from (the step rows of an episode
      that is not one prefix chain share it; group baselines count episodes, not rows); a
      sequence without one (``Sequence.episode_id`` None) gets an id of its own, ``-1 - row``;
    - ``anchor_ids`` [B, T] long: on each action token, the state key its step started from (``Step.state_key``)
      as an integer, the same for the same key within the batch; -1 where the step has none.
    - ``step_rewards`` [B, S] float64: the reward of each step of the row's episode, the final reward added to
      the last step's, 0 after its last step (``Sequence.step_rewards``; None when a sequence has none).

    From :func:`~agent_r1.pipeline.rl_driver.build_train_batch` (None until then, or when not needed):

    - ``advantages``, ``returns`` [B, T];
    - ``old_values`` [B, T]: the critic's values (estimators with a critic);
    - ``old_logprobs`` [B, T]: the policy's log-probs before the update, on the rows that can carry
      a gradient (not computed for a single-step update, whose ratio is 1);
    - ``ref_logprobs`` [B, T]: the frozen reference's log-probs (``kl_coef > 0``);
    - ``behaviour_logprobs`` [B, T]: ``sample_logprobs`` when the episodes may come from an older
      policy than the learner's (``rl.max_staleness`` ≥ 1) or from an engine that is not exact
      (``RolloutEngine.exact``: another precision): the update corrects for it
      (``rl.learner.off_policy_correction``);
    - ``demo_mask`` [B, T]: 1 on the demonstrated tokens of an off-policy member of a group (``Trajectory.demo``
      "member"): in the loss mask, not in the action mask (not sampled), trained with their own weight
      (:func:`~agent_r1.algorithms.losses.with_demonstrated_tokens`);
    - ``info``: counts of how the batch was built (``rl.dynamic_sampling``, ``rl.overlong_filter``), logged with
      the update's metrics.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    action_mask: torch.Tensor
    loss_mask: torch.Tensor
    adv_mask: torch.Tensor
    step_ids: torch.Tensor
    token_rewards: torch.Tensor
    sample_logprobs: torch.Tensor
    group_ids: torch.Tensor
    episode_ids: torch.Tensor
    anchor_ids: torch.Tensor | None = None
    step_rewards: torch.Tensor | None = None
    advantages: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    old_values: torch.Tensor | None = None
    old_logprobs: torch.Tensor | None = None
    ref_logprobs: torch.Tensor | None = None
    behaviour_logprobs: torch.Tensor | None = None
    demo_mask: torch.Tensor | None = None
    info: dict[str, float] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.input_ids)

    def select(self, rows: torch.Tensor, device: torch.device | None = None) -> "TrainBatch":
        """Rows ``rows``, cut to the longest of them, on ``device``."""
        T = int(self.attention_mask[rows].sum(1).max())
        return replace(self, **{f.name: (v[rows, :T] if v.dim() == 2 and f.name != "step_rewards" else v[rows]).to(device)
                                for f in fields(self) if isinstance(v := getattr(self, f.name), torch.Tensor)})


def collate(seqs: list[Sequence], pad_id: int, loss_mask: bool = True, adv_mask: bool = True) -> TrainBatch:
    """Right-pad sequences into a :class:`TrainBatch`.

    ``loss_mask``/``adv_mask`` off (the Agent-R1 ablations) widen those masks from the action
    tokens to every non-padding token after the prompt, observations included.
    """
    B, T = len(seqs), max(len(s.ids) for s in seqs)
    input_ids = torch.full((B, T), pad_id, dtype=torch.long)
    attention_mask = torch.zeros(B, T, dtype=torch.long)
    action_mask, sample_logprobs, after_prompt = (torch.zeros(B, T) for _ in range(3))
    token_rewards = torch.zeros(B, T, dtype=torch.float64)
    step_ids = torch.full((B, T), -1, dtype=torch.long)
    anchor_ids = torch.full((B, T), -1, dtype=torch.long)
    anchors: dict[str, int] = {}
    for i, s in enumerate(seqs):
        n = len(s.ids)
        input_ids[i, :n] = torch.tensor(s.ids)
        attention_mask[i, :n] = 1
        action_mask[i, :n] = torch.tensor(s.action, dtype=torch.float)
        step_ids[i, :n] = torch.tensor(s.step_ids)
        token_rewards[i, :n] = torch.tensor(s.rewards, dtype=torch.float64)
        sample_logprobs[i, :n] = torch.tensor(s.sample_logprobs)
        after_prompt[i, s.prompt_len : n] = 1
        ids = [-1 if k < 0 or k >= len(s.state_keys) or s.state_keys[k] is None
               else anchors.setdefault(s.state_keys[k], len(anchors)) for k in s.step_ids]
        anchor_ids[i, :n] = torch.tensor(ids)
    step_rewards = None
    if all(s.step_rewards is not None for s in seqs):
        step_rewards = torch.zeros(B, max(len(s.step_rewards) for s in seqs), dtype=torch.float64)
        for i, s in enumerate(seqs):
            step_rewards[i, : len(s.step_rewards)] = torch.tensor(s.step_rewards, dtype=torch.float64)
    return TrainBatch(input_ids=input_ids, attention_mask=attention_mask, action_mask=action_mask,
                      loss_mask=action_mask if loss_mask else after_prompt,
                      adv_mask=action_mask if adv_mask else after_prompt, step_ids=step_ids, anchor_ids=anchor_ids,
                      token_rewards=token_rewards, step_rewards=step_rewards, sample_logprobs=sample_logprobs,
                      group_ids=torch.tensor([s.group_id for s in seqs], dtype=torch.long),
                      episode_ids=torch.tensor([-1 - i if s.episode_id is None else s.episode_id
                                                for i, s in enumerate(seqs)], dtype=torch.long))
