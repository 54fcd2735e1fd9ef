"""Models and tokenizers: a tiny offline model built from a config, or any Hugging Face causal LM.

With no network the default pipeline trains a byte-level BPE tokenizer on the task's own text
(with a chat template that has a ``tool`` role) and builds a small Qwen2-style model from a
config. With ``model.name_or_path`` set, both come from that folder or hub id instead.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch
from pydantic import BaseModel, ConfigDict
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast, Qwen2Config

from agent_r1.checkpoints import validate_checkpoint

# Chat markers. The tags are added tokens so that a tool call or an answer costs one token to
# open and one to close, which matters for a tiny model's short context.
IM_START, IM_END, PAD = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
TAGS = ["<tool_call>", "</tool_call>", "<answer>", "</answer>"]

# A Qwen-style template. Tool observations use their own ``tool`` role; when ``tools`` are
# passed their JSON schemas are listed in the system turn.
CHAT_TEMPLATE = (
    "{%- if tools or messages[0].role == 'system' %}<|im_start|>system\n"
    "{%- if messages[0].role == 'system' %}{{ messages[0].content }}{% endif %}"
    "{%- if tools %}\nTools:{% for t in tools %}\n{{ t | tojson }}{% endfor %}{% endif %}"
    "<|im_end|>\n{% endif %}"
    "{%- for m in messages %}{% if m.role != 'system' %}"
    "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
    "{% endif %}{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


class TinyModelConfig(BaseModel):
    """Shape of the model built from scratch when no pretrained model is configured."""

    model_config = ConfigDict(extra="forbid")

    vocab_size: int = 2048
    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 384
    max_position_embeddings: int = 1024
    rope_theta: float = 10000.0


def train_tokenizer(texts: Iterable[str], vocab_size: int = 2048) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer on ``texts`` and give it the chat template.

    A space before a capital letter is a token of its own, so a name is the same token ids
    wherever it stands: after a space in a document or question, after ``"`` in a tool call's
    query, after ``<answer>``. With GPT-2's pre-tokenizer alone, " Vamem" in a document and
    "Vamem" in an answer are different tokens, and a small model must learn that pair for every
    name instead of learning to copy; the isolated spaces cost ~6% more tokens.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r" (?=\p{Lu})"), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False),
    ])
    tok.decoder = decoders.ByteLevel()
    specials = [PAD, IM_START, IM_END]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=IM_END, pad_token=PAD, bos_token=None, unk_token=None
    )
    fast.add_tokens(TAGS)
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_tiny_model(cfg: TinyModelConfig, tokenizer, seed: int = 0) -> torch.nn.Module:
    """A randomly initialised Qwen2-style causal LM sized by ``cfg``."""
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        max_position_embeddings=cfg.max_position_embeddings,
        rope_theta=cfg.rope_theta,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def default_device() -> torch.device:
    """The GPU when there is one (evaluation, the frozen reference and rollouts run there), else the CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def load_model(path: str | Path, dtype: torch.dtype = torch.float32, device: torch.device | str | None = None):
    """Load a causal LM and its tokenizer from a folder or hub id (checkpoints are such folders),
    on ``device`` (default: :func:`default_device`)."""
    validate_checkpoint(path)  # a local folder: config, weights and tokenizer present and consistent
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype).to(device or default_device())
    return model, tokenizer


def count_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
