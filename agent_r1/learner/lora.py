"""LoRA for the learner: low-rank adapters on a causal LM's linear layers, merged on save.

``add_lora`` freezes every parameter of the model and replaces each ``torch.nn.Linear`` inside
its decoder layers (attention and MLP projections) with a :class:`LoRALinear`, whose output is
``base(x) + scale * x A^T B^T`` with ``B`` zero at the start (the model is unchanged until the
first step). Only ``A`` and ``B`` train: the backward pass skips the frozen weights' gradients (a
third of a full fine-tuning step's compute) and the optimizer holds a few hundred thousand
numbers instead of the whole model's. The embeddings and LM head stay frozen.

Checkpoints stay plain Hugging Face folders: :func:`merged` temporarily puts a ``Linear`` with
the merged weight ``W + scale * B A`` back in every adapted slot, so ``save_pretrained`` writes
the architecture the evaluation and the registry load, with no adapter code needed to read it.
"""

from __future__ import annotations

import contextlib
import math

import torch


class LoRALinear(torch.nn.Module):
    def __init__(self, base: torch.nn.Linear, rank: int, alpha: float):
        super().__init__()
        self.base = base.requires_grad_(False)
        self.scale = alpha / rank
        self.lora_a = torch.nn.Parameter(torch.empty(rank, base.in_features, dtype=base.weight.dtype))
        self.lora_b = torch.nn.Parameter(torch.zeros(base.out_features, rank, dtype=base.weight.dtype))
        torch.nn.init.kaiming_uniform_(self.lora_a, a=math.sqrt(5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + (x @ self.lora_a.t().to(x.dtype)) @ self.lora_b.t().to(x.dtype) * self.scale

    def merged_linear(self) -> torch.nn.Linear:
        b = self.base
        out = torch.nn.Linear(b.in_features, b.out_features, bias=b.bias is not None, dtype=b.weight.dtype,
                              device=b.weight.device)
        with torch.no_grad():
            out.weight.copy_(b.weight + self.scale * (self.lora_b @ self.lora_a).to(b.weight.dtype))
            if b.bias is not None:
                out.bias.copy_(b.bias)
        return out


def _slots(model: torch.nn.Module, kind: type):
    for name, module in model.named_modules():
        for child_name, child in module.named_children():
            if isinstance(child, kind):
                yield module, child_name, child, f"{name}.{child_name}" if name else child_name


def add_lora(model: torch.nn.Module, rank: int, alpha: float) -> int:
    """Freeze ``model`` and adapt every Linear of its decoder layers in place; returns the
    number of adapted layers (0 is an error: nothing would train)."""
    model.requires_grad_(False)
    body = model.get_decoder() if hasattr(model, "get_decoder") else model
    targets = [(parent, attr, child) for parent, attr, child, _ in _slots(body, torch.nn.Linear)]
    if not targets:
        raise ValueError(f"LoRA found no Linear layer to adapt in {type(model).__name__}")
    for parent, attr, child in targets:
        setattr(parent, attr, LoRALinear(child, rank, alpha))
    return len(targets)


def has_lora(model: torch.nn.Module) -> bool:
    return any(isinstance(m, LoRALinear) for m in model.modules())


@contextlib.contextmanager
def merged(model: torch.nn.Module):
    """Within the block, ``model`` has plain Linear layers holding the merged weights (for
    ``save_pretrained``); the adapters are put back after it."""
    slots = list(_slots(model, LoRALinear))
    try:
        for parent, attr, child, _ in slots:
            setattr(parent, attr, child.merged_linear())
        yield model
    finally:
        for parent, attr, child, _ in slots:
            setattr(parent, attr, child)
