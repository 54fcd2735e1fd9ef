from agent_r1.rollout.engine import EngineDied, Generation, HFEngine, RolloutEngine, SamplingParams
from agent_r1.rollout.loop import play_policy, run_episodes
from agent_r1.rollout.scripted import ScriptedEngine

__all__ = ["EngineDied", "Generation", "HFEngine", "RolloutEngine", "SamplingParams", "ScriptedEngine", "play_policy", "run_episodes"]
