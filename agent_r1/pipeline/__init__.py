"""Pipeline stages (prepare, sft, train, evaluate, register): one implementation, called by the
CLI, by dvc.yaml and by the Prefect flows."""

from agent_r1.pipeline.record import NULL_LOG, Recorder, StageLog
from agent_r1.pipeline.stages import STAGES, RLTrainer, evaluate, prepare, register, run_all, sft, train

__all__ = ["NULL_LOG", "STAGES", "RLTrainer", "Recorder", "StageLog", "evaluate", "prepare", "register", "run_all", "sft", "train"]
