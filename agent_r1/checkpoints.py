"""Checkpoints that are checked before they are trusted.

`validate_checkpoint` looks at a Hugging Face checkpoint folder before transformers loads it:
``config.json``, the weights (safetensors: every tensor the config implies, at its shape) and
a tokenizer whose ids fit the model's vocabulary. A problem raises `CheckpointError` with one
line naming the file, instead of a traceback from deep inside transformers, or worse, no error:
a folder without ``tokenizer.json`` loads as a 2-token tokenizer and evaluates to EM 0.

`trained_settings` reads the settings a pipeline recorded beside the weights (``SETTINGS_FILE``:
the env section it trained with), which evaluation uses again.

`load_deepspeed_state` restores a resumable learner state (a DeepSpeed checkpoint) with every
file read by ``torch.load(weights_only=True)``: DeepSpeed's own loader unpickles whatever the
file holds, so a planted ``state/`` folder could run code.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch


class CheckpointError(ValueError):
    """A checkpoint folder that cannot be used; the message names the file."""


# The settings a checkpoint was trained with (the pipeline's name, its env section), beside its weights.
SETTINGS_FILE = "agent_r1_settings.json"


def trained_settings(path: str | Path) -> dict | None:
    """The settings recorded in the checkpoint folder ``path`` (``{"pipeline": ..., "env": {...}}``),
    or None for a folder without them (a hub model, a checkpoint written elsewhere)."""
    f = Path(path) / SETTINGS_FILE
    if not f.is_file():
        return None
    try:
        settings = json.loads(f.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{f}: not JSON: {e}") from None
    if not isinstance(settings, dict) or not isinstance(settings.get("env"), dict):
        raise CheckpointError(f"{f}: expected an object with the env settings under 'env'")
    return settings


# Hub ids are "name" or "owner/name"; anything else that does not exist is a missing folder.
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")
# Files of tokenizers that transformers builds without a tokenizer.json (sentencepiece, BPE, BERT).
_SLOW_TOKENIZER_FILES = ("tokenizer.model", "spiece.model", "vocab.json", "vocab.txt")


def validate_checkpoint(path: str | Path) -> None:
    """Raise `CheckpointError` unless `path` is a usable checkpoint folder: config, weights and
    tokenizer present and consistent. A hub id that is not a local path is left to transformers."""
    folder = Path(path)
    if not folder.exists():
        if _HUB_ID.fullmatch(str(path)) and not str(path).startswith("."):
            return
        raise CheckpointError(f"{folder}: checkpoint folder not found")
    if not folder.is_dir():
        raise CheckpointError(f"{folder}: not a checkpoint folder")
    config = _config(folder)
    n_tokens = _tokenizer_size(folder)
    vocab = getattr(config.get_text_config(), "vocab_size", None)
    if n_tokens is not None and vocab is not None and n_tokens > vocab:
        raise CheckpointError(f"{folder / 'tokenizer.json'}: token ids up to {n_tokens - 1} do not fit the "
                              f"model's vocabulary of {vocab} (config.json): tokenizer and weights do not belong together")
    _check_weights(folder, config)


def _config(folder: Path):
    from transformers import AutoConfig

    f = folder / "config.json"
    if not f.is_file():
        raise CheckpointError(f"{f}: missing (a checkpoint folder holds config.json, the weights and a tokenizer)")
    try:
        return AutoConfig.from_pretrained(folder)
    except Exception as e:  # noqa: BLE001 - invalid JSON, an unknown model_type, ...
        raise CheckpointError(f"{f}: not a usable model config: {_one_line(e)}") from None


def _tokenizer_size(folder: Path) -> int | None:
    """1 + the largest token id of ``tokenizer.json`` (None for a tokenizer without one)."""
    f = folder / "tokenizer.json"
    if not f.exists():
        if any((folder / name).exists() for name in _SLOW_TOKENIZER_FILES):
            return None
        raise CheckpointError(f"{f}: missing: the checkpoint has no tokenizer")
    try:
        spec = json.loads(f.read_bytes())
        vocab = spec["model"]["vocab"]  # {token: id} (BPE, WordPiece) or [[token, score], ...] (Unigram)
        ids = list(vocab.values()) if isinstance(vocab, dict) else [len(vocab) - 1]
        ids += [int(t["id"]) for t in spec.get("added_tokens") or []]
        return max(ids) + 1
    except Exception as e:  # noqa: BLE001 - not JSON, or not a tokenizer's JSON
        raise CheckpointError(f"{f}: not a tokenizer: {_one_line(e)}") from None


def _weight_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.exists():
        try:
            names = sorted(set(json.loads(index.read_bytes())["weight_map"].values()))
        except Exception as e:  # noqa: BLE001
            raise CheckpointError(f"{index}: not a safetensors index: {_one_line(e)}") from None
        for name in names:
            if not (folder / name).is_file():
                raise CheckpointError(f"{folder / name}: missing (listed in {index.name})")
        return [folder / name for name in names]
    files = sorted(folder.glob("*.safetensors"))
    if not files and not any(folder.glob("pytorch_model*.bin")):
        raise CheckpointError(f"{folder / 'model.safetensors'}: missing: the checkpoint has no weights")
    return files


def _check_weights(folder: Path, config) -> None:
    """Every safetensors file readable, every tensor the config implies present at its shape."""
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    files = _weight_files(folder)
    if not files:  # only pytorch_model*.bin: transformers reads it with weights_only=True
        return
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    prefix = f"{model.base_model_prefix}."

    def key(name: str) -> str:  # checkpoints are written with and without the base model prefix
        return name.removeprefix(prefix)

    expected = {key(k): tuple(v.shape) for k, v in model.state_dict().items()}
    found: set[str] = set()
    for f in files:
        try:
            with safe_open(f, "pt") as st:
                shapes = {key(k): tuple(st.get_slice(k).get_shape()) for k in st.keys()}
        except Exception as e:  # noqa: BLE001 - truncated, garbage, not safetensors
            raise CheckpointError(f"{f}: not a readable safetensors file: {_one_line(e)}") from None
        for name, shape in shapes.items():
            if name in expected and shape != expected[name]:
                raise CheckpointError(f"{f}: tensor {name} has shape {list(shape)} but config.json implies "
                                      f"{list(expected[name])}")
        found |= set(shapes)
    tied = {key(k) for k in getattr(model, "_tied_weights_keys", None) or []} if config.get_text_config().tie_word_embeddings else set()
    missing = sorted(set(expected) - found - tied)
    if missing:
        raise CheckpointError(f"{files[0]}: {len(missing)} tensor(s) of the model are missing, e.g. {missing[0]}")


def _one_line(e: BaseException) -> str:
    return (" ".join(line.strip() for line in str(e).splitlines() if line.strip()) or type(e).__name__)[:300]


def _deepspeed_globals() -> list:
    """The DeepSpeed classes its ZeRO optimizer states pickle (found with
    ``torch.serialization.get_unsafe_globals_in_checkpoint``): allowed, and nothing else."""
    from deepspeed.runtime.fp16.loss_scaler import LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return [LossScaler, ZeroStageEnum, fragment_address]


def load_deepspeed_state(engine, path: str | Path, tag: str) -> dict:
    """``engine.load_checkpoint(path, tag)`` with every file read by ``torch.load(weights_only=True)``;
    returns the client state. A file that holds anything else fails to load, naming the class."""
    allowed = _deepspeed_globals()

    def load(file, map_location=None):
        with torch.serialization.safe_globals(allowed):
            return torch.load(file, map_location=map_location, weights_only=True)

    engine.checkpoint_engine.load = load  # DeepSpeed's TorchCheckpointEngine.load uses weights_only=False
    loaded, client = engine.load_checkpoint(str(path), tag=tag)
    if loaded is None:
        raise CheckpointError(f"{Path(path) / tag}: no DeepSpeed checkpoint to resume from")
    return client
