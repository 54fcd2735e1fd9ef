from agent_r1.rollout.engine import Generation, HFEngine, RolloutEngine, SamplingParams
from agent_r1.rollout.loop import run_episodes

__all__ = ["Generation", "HFEngine", "RolloutEngine", "SamplingParams", "run_episodes"]
