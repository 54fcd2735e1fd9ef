"""Prefect flows: the pipeline's stages as Prefect tasks. Orchestration only, no RL logic.

- :func:`flows.training.training_flow`: prepare → sft → per RL iteration (sample_episodes →
  build_train_batch → update_policy → end_iteration) → evaluate → register.
- :func:`flows.evaluation.evaluation_flow`: held-out evaluation of the pipeline's checkpoints or
  of registered agents (``models:/agent-r1@champion``).
- :func:`flows.retrain.retraining_flow`: newest data → RL from the current champion →
  evaluate new agent and champion on the same tasks → promote only a strictly better agent.
- ``python -m flows.deploy``: serves the three as deployments of a Prefect server (the
  retraining one on a cron schedule).

Every flow reads the same typed config as the CLI and DVC (``pipelines.yaml`` + overrides) and
calls the stage functions of :mod:`agent_r1.pipeline`; the stages resume from
``<output_dir>/state/``, so re-running a killed flow continues where it stopped.
"""

import logging
import os

from agent_r1.pipeline.env import contain

# Before Prefect is first imported: its settings are read once, at import.
contain()
os.environ.setdefault("PREFECT_LOGGING_EXTRA_LOGGERS", "agent_r1")  # stage log lines in the Prefect UI
# stage functions also log outside flow runs (e.g. a test calling them after importing flows)
os.environ.setdefault("PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW", "ignore")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
for noisy in ("bm25s", "DeepSpeed", "deepspeed", "torch.distributed"):
    logging.getLogger(noisy).setLevel(logging.WARNING)
if logging.getLogger("agent_r1").level == logging.NOTSET:
    logging.getLogger("agent_r1").setLevel(logging.INFO)  # e.g. "rl: resuming after iteration 3"
