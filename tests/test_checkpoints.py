"""Checkpoints are checked before they are trusted: a folder that is missing a file, holds
truncated or garbage weights, weights of another shape or a tokenizer of another model is one
CheckpointError naming the file; a resumable state is read with torch.load(weights_only=True)."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from agent_r1.checkpoints import CheckpointError, validate_checkpoint
from agent_r1.learner import Learner, LearnerConfig, save_hf_checkpoint
from agent_r1.models import load_model


@pytest.fixture(scope="module")
def good(tmp_path_factory, make_model, tok):
    return save_hf_checkpoint(make_model(seed=3), tmp_path_factory.mktemp("ckpt") / "good", tok)


@pytest.fixture
def ckpt(good, tmp_path):
    return shutil.copytree(good, tmp_path / "ckpt")


def test_a_good_checkpoint_loads(good):
    validate_checkpoint(good)
    model, tokenizer = load_model(good, device="cpu")
    assert model.config.vocab_size == len(tokenizer)
    validate_checkpoint("Qwen/Qwen2.5-3B-Instruct")  # a hub id is left to transformers


def _weights(ckpt):
    return ckpt / "model.safetensors"


def _truncate(ckpt):
    data = _weights(ckpt).read_bytes()
    _weights(ckpt).write_bytes(data[: len(data) // 2])


def _drop_a_tensor(ckpt):
    tensors = load_file(str(_weights(ckpt)))
    tensors.pop("model.layers.1.mlp.up_proj.weight")
    save_file(tensors, str(_weights(ckpt)), metadata={"format": "pt"})


def _edit_config(**changes):
    def edit(ckpt):
        config = json.loads((ckpt / "config.json").read_text())
        (ckpt / "config.json").write_text(json.dumps(config | changes))
    return edit


def _big_tokenizer(ckpt):
    spec = json.loads((ckpt / "tokenizer.json").read_text())
    spec["added_tokens"].append({**spec["added_tokens"][-1], "id": 5000, "content": "<extra>"})
    (ckpt / "tokenizer.json").write_text(json.dumps(spec))


@pytest.mark.parametrize("damage, file, message", [
    (lambda c: (c / "tokenizer.json").unlink(), "tokenizer.json", "missing: the checkpoint has no tokenizer"),
    (lambda c: (c / "tokenizer.json").write_text("{oops"), "tokenizer.json", "not a tokenizer"),
    (_big_tokenizer, "tokenizer.json", "token ids up to 5000 do not fit the model's vocabulary"),
    (lambda c: (c / "config.json").unlink(), "config.json", "missing"),
    (lambda c: (c / "config.json").write_text("{oops"), "config.json", "not a usable model config"),
    (lambda c: _weights(c).unlink(), "model.safetensors", "missing: the checkpoint has no weights"),
    (_truncate, "model.safetensors", "not a readable safetensors file"),
    (lambda c: _weights(c).write_bytes(b"\x00garbage" * 100), "model.safetensors", "not a readable safetensors file"),
    (_edit_config(hidden_size=64), "model.safetensors", "tensor embed_tokens.weight has shape [304, 32] but config.json implies [304, 64]"),
    (_edit_config(num_hidden_layers=3), "config.json", "must be equal to the number of `layer_types` (2)"),
    (_edit_config(num_hidden_layers=3, layer_types=["full_attention"] * 3), "model.safetensors",
     "tensor(s) of the model are missing, e.g. layers.2"),
    (_drop_a_tensor, "model.safetensors", "1 tensor(s) of the model are missing, e.g. layers.1.mlp.up_proj.weight"),
])
def test_a_damaged_checkpoint_is_one_error_naming_the_file(ckpt, damage, file, message):
    damage(ckpt)
    with pytest.raises(CheckpointError) as err:
        load_model(ckpt, device="cpu")
    assert str(err.value).startswith(f"{ckpt / file}: ") and message in str(err.value)
    assert "\n" not in str(err.value)


def test_a_missing_folder_is_named(tmp_path):
    for missing in (tmp_path / "outputs" / "rl" / "grpo", "./outputs/rl"):
        with pytest.raises(CheckpointError, match="checkpoint folder not found"):
            load_model(missing)


def test_the_cli_shows_a_bad_checkpoint_as_one_line(ckpt):
    from agent_r1.cli import app

    (ckpt / "tokenizer.json").unlink()
    result = CliRunner().invoke(app, ["show", str(ckpt)])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert result.output.strip() == f"error: {ckpt / 'tokenizer.json'}: missing: the checkpoint has no tokenizer"


class _Planted:
    def __reduce__(self):
        import pathlib

        return (pathlib.Path.touch, (pathlib.Path(_Planted.marker),))


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_a_resumable_state_is_read_weights_only(stage, make_model, tmp_path):
    learner = Learner(make_model(seed=2), LearnerConfig(zero_stage=stage), precision="fp32")
    client = {"step": 3, "history": [{"loss": 1.5}], "rng": torch.get_rng_state()}
    learner.save_state(tmp_path / "state", client)
    restored = Learner(make_model(seed=9), LearnerConfig(zero_stage=stage), precision="fp32").load_state(tmp_path / "state")
    assert restored["step"] == 3 and restored["history"] == [{"loss": 1.5}]
    assert torch.equal(restored["rng"], client["rng"])

    # a state folder someone planted: loading it must not run its pickle
    _Planted.marker = str(tmp_path / "pwned")
    (model_file,) = (tmp_path / "state" / "policy").glob("*model_states.pt")
    torch.save({"module": _Planted()}, model_file)
    with pytest.raises(Exception, match="Weights only load failed"):
        Learner(make_model(seed=9), LearnerConfig(zero_stage=stage), precision="fp32").load_state(tmp_path / "state")
    assert not (tmp_path / "pwned").exists()
