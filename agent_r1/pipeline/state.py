"""The files a pipeline run keeps under ``<output_dir>``: where each stage writes, fingerprints
of the config that shaped a result, complete markers and resumable states.

Layout::

    data/{corpus,train,test}.parquet          prepare
    checkpoints/{base,sft,sft_control}/       sft, control   (Hugging Face folders, with the env settings they
    rl/<method>/                              train           were trained with; method: grpo, ppo, rloo, ...)
    metrics/sft_history.json                  sft            (DVC plots)
    metrics/train/<method>.json               train          (per-iteration RL metrics; DVC plots)
    metrics/eval.json                         evaluate       (split -> method -> metrics; DVC metrics)
    metrics/eval_data.json                    evaluate       (the rows it scored: data version, split)
    metrics/register.json                     register       (version, alias, why)
    state/                                    resume points  (never a DVC output)
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

from agent_r1.config import RunConfig
from agent_r1.learner.distributed import is_main

log = logging.getLogger(__name__)

SUPERVISED = ("base", "sft", "sft_control")


def write_json(path: Path, obj) -> None:
    """``obj`` as JSON at ``path``, atomically (a temp file renamed over it). With N ranks, rank 0
    alone writes (metrics, state files, complete markers: the record is rank 0's)."""
    if not is_main():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1, sort_keys=True))
    tmp.replace(path)


def fingerprint(cfg: RunConfig, *sections: str) -> str:
    """A hash of the config sections (dotted paths) that shape a stage's result; a resume needs
    it unchanged."""
    def get(path: str):
        node = cfg.model_dump(mode="json")
        for key in path.split("."):
            node = node[key]
        return node

    return hashlib.sha256(json.dumps([cfg.seed] + [get(s) for s in sections], sort_keys=True).encode()).hexdigest()[:16]


def data_version(data_dir: Path) -> str:
    """md5 over the data files, the same content hash idea DVC uses for the ``data`` output."""
    h = hashlib.md5()
    for f in sorted(Path(data_dir).glob("*.parquet")):
        h.update(f.name.encode())
        h.update(hashlib.md5(f.read_bytes()).digest())
    return h.hexdigest()


def checkpoint_dir(cfg: RunConfig, method: str) -> Path:
    """``checkpoints/<base|sft|sft_control>``; an RL method's agent is in ``rl/<method>``.

    All RL results share the ``rl/`` folder (one DVC output whatever the algorithm), so
    ``dvc exp run -S ...rl.algorithm=rloo`` needs no change to dvc.yaml.
    """
    return cfg.out / ("checkpoints" if method in SUPERVISED else "rl") / method


def history_path(cfg: RunConfig, method: str) -> Path:
    """An RL method's per-iteration metrics."""
    return cfg.out / "metrics" / "train" / f"{method}.json"


def resumable(state_dir: Path, fp: str) -> bool:
    """Is there a resumable state in ``state_dir`` written under the config fingerprint ``fp``?"""
    meta = state_dir / "meta.json"
    if not meta.exists():
        return False
    if json.loads(meta.read_text()).get("fingerprint") == fp:
        return True
    log.warning("%s was written under a different config; starting the stage afresh", state_dir)
    return False


def is_complete(out_dir: Path, fp: str) -> bool:
    """Did a finished stage write ``out_dir`` under this same config? (Then a re-run skips it.)"""
    marker = out_dir / "agent_r1_stage.json"
    return marker.exists() and json.loads(marker.read_text()).get("fingerprint") == fp


def mark_complete(out_dir: Path, fp: str) -> None:
    write_json(out_dir / "agent_r1_stage.json", {"fingerprint": fp})


def trained_with(cfg: RunConfig) -> dict:
    """The settings a checkpoint records (:data:`~agent_r1.checkpoints.SETTINGS_FILE`): the
    pipeline's name and its ``env`` section (environment, tools, system prompt, context budget),
    what evaluation uses again (:func:`~agent_r1.checkpoints.trained_settings`)."""
    return {"pipeline": cfg.name, "env": cfg.env.model_dump(mode="json")}


def record_settings(folder: Path, settings: dict) -> None:
    """Write ``settings`` (:func:`trained_with`) into the checkpoint ``folder``."""
    from agent_r1.checkpoints import SETTINGS_FILE

    write_json(Path(folder) / SETTINGS_FILE, settings)


def save_state(learner, state_dir: Path, fp: str, client: dict, tokenizer=None) -> None:
    """The learner's resumable state plus ``client`` (progress, RNG), tagged with ``fp``."""
    learner.save_state(state_dir, client, tokenizer)
    write_json(state_dir / "meta.json", {"fingerprint": fp, "step": client["step"]})


def sft_learner_config(cfg: RunConfig):
    """The learner settings of SFT and the control: rl.learner's optimizer at ``sft.lr``, every
    weight trained (no LoRA), the loss a token mean over the action tokens (``rl.learner.loss_agg``
    is the RL update's: a policy loss's own, gspo's, leaves SFT as it was)."""
    return cfg.rl.learner.model_copy(update={"lr": cfg.sft.lr, "lora_rank": 0, "loss_agg": "token-mean"})


def computed_precision(cfg: RunConfig) -> str:
    """``fp32`` or ``bf16``: what this run's forward passes compute in on this machine (the
    setting ``model.precision`` may say ``auto``)."""
    from agent_r1.models import default_device, resolve_precision

    return resolve_precision(cfg.model.precision, default_device())
