"""Rollout engines and the episode loop. The names below are imported on first use: a process that
needs only the vLLM server (:mod:`agent_r1.rollout.vllm_server`, a few stdlib modules) does not
import torch and transformers with the HF engine."""

from importlib import import_module

_MODULES = {"EngineDied": "engine", "Generation": "engine", "HFEngine": "engine", "RolloutEngine": "engine",
            "Prefix": "loop", "SamplingParams": "engine", "ScriptedEngine": "scripted", "make_engine": "build",
            "play_policy": "loop", "run_episodes": "loop"}

__all__ = ["EngineDied", "Generation", "HFEngine", "Prefix", "RolloutEngine", "SamplingParams", "ScriptedEngine",
           "make_engine", "play_policy", "run_episodes"]


def __getattr__(name: str):
    if name not in _MODULES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{_MODULES[name]}"), name)
