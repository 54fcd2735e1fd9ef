"""Pipeline stages (prepare, sft, train, evaluate, register) and their one sequence, called by
the CLI, by dvc.yaml and by the Prefect flows; the RL driver (:mod:`.rl_driver`)."""

from agent_r1.pipeline.record import NULL_LOG, Recorder, StageLog
from agent_r1.pipeline.rl_driver import RLTrainer
from agent_r1.pipeline.stages import STAGES, Plan, evaluate, prepare, register, run_all, run_pipeline, sft, train

__all__ = ["NULL_LOG", "STAGES", "Plan", "RLTrainer", "Recorder", "StageLog", "evaluate", "prepare", "register",
           "run_all", "run_pipeline", "sft", "train"]
