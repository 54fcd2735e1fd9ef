"""Nested dicts: the one merge the config files and the DeepSpeed config both use."""

from __future__ import annotations


def deep_merge(base: dict, over: dict) -> dict:
    """``over`` merged into a copy of ``base``, nested sections key by key (``over`` wins)."""
    out = dict(base)
    for k, v in over.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out
