"""Name → function registries for advantage estimators and policy losses.

Registration happens when `agent_r1.algorithms` is imported (its `__init__` imports the modules
that define them), so look-ups through the package always see every built-in.
"""

from __future__ import annotations

from typing import Callable

ADVANTAGES: dict[str, Callable] = {}
POLICY_LOSSES: dict[str, Callable] = {}


def _register(table: dict[str, Callable], kind: str, name: str) -> Callable[[Callable], Callable]:
    def decorator(fn: Callable) -> Callable:
        if name in table:
            raise ValueError(f"{kind} {name!r} is already registered")
        table[name] = fn
        return fn

    return decorator


def _get(table: dict[str, Callable], kind: str, name: str) -> Callable:
    if name not in table:
        raise KeyError(f"unknown {kind} {name!r}; known: {', '.join(sorted(table))}")
    return table[name]


def register_advantage(name: str) -> Callable[[Callable], Callable]:
    """Register `fn(inp: AdvantageInputs) -> (advantages, returns)` under `name`."""
    return _register(ADVANTAGES, "advantage", name)


def register_policy_loss(name: str) -> Callable[[Callable], Callable]:
    """Register `fn(logprobs, old_logprobs, advantages, mask, ...) -> (loss, metrics)` as `name`."""
    return _register(POLICY_LOSSES, "policy loss", name)


def get_advantage(name: str) -> Callable:
    """The advantage estimator registered as `name`; KeyError listing the known names otherwise."""
    return _get(ADVANTAGES, "advantage", name)


def get_policy_loss(name: str) -> Callable:
    """The policy loss registered as `name`; KeyError listing the known names otherwise."""
    return _get(POLICY_LOSSES, "policy loss", name)
