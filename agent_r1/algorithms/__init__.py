"""Pure tensor functions for RL on agent trajectories: advantage estimators and losses,
registered by name (`get_advantage`, `get_policy_loss`)."""

from agent_r1.algorithms.advantages import (
    AdvantageInputs,
    gae,
    grpo,
    grpo_no_std,
    masked_whiten,
    reinforce_pp,
    reinforce_pp_baseline,
    rloo,
    step_gae,
)
from agent_r1.algorithms.losses import (
    AGG_MODES,
    aggregate,
    entropy_from_logits,
    kl_penalty,
    logprobs_from_logits,
    ppo_clip_loss,
    vanilla_pg_loss,
    value_loss,
)
from agent_r1.algorithms.registry import (
    ADVANTAGES,
    POLICY_LOSSES,
    get_advantage,
    get_policy_loss,
    register_advantage,
    register_policy_loss,
)

__all__ = [
    "ADVANTAGES",
    "AGG_MODES",
    "POLICY_LOSSES",
    "AdvantageInputs",
    "aggregate",
    "entropy_from_logits",
    "gae",
    "get_advantage",
    "get_policy_loss",
    "grpo",
    "grpo_no_std",
    "kl_penalty",
    "logprobs_from_logits",
    "masked_whiten",
    "ppo_clip_loss",
    "register_advantage",
    "register_policy_loss",
    "reinforce_pp",
    "reinforce_pp_baseline",
    "rloo",
    "step_gae",
    "vanilla_pg_loss",
    "value_loss",
]
