"""Name → entry registries for advantage estimators and policy losses.

An entry carries what the RL driver and the learner need to use it, so a new estimator or loss
is one registered function, with no edit anywhere else:

- an :class:`Estimator` says whether it needs a learned critic (values), whether it needs
  groups of samples of one task (a group baseline), when a group whose episodes all got the
  same reward gets advantage 0 (what ``rl.dynamic_sampling`` needs), the name results are
  reported under, and its own settings (its keyword-only parameters, set by
  ``rl.advantage_settings``);
- a :class:`PolicyLoss` names the learner settings (``rl.learner.*``) it takes; the defaults of
  its function's parameters are the values those settings take when a config does not set them.

Registration happens when `agent_r1.algorithms` is imported (its `__init__` imports the modules
that define them), so look-ups through the package always see every built-in. A config may also
name a user's function by import path (``my_pkg.estimators:fn`` or ``path/to/file.py:fn``):
importing it runs its ``@register_…`` decorator, and :func:`registered_name` gives the name it
was registered under (what the config then holds).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable

from agent_r1.registry import is_import_path, load_object

TIED_GROUPS = ("always", "outcome", "never")  # Estimator.zero_when_tied


def _keyword_settings(fn: Callable) -> dict[str, Any]:
    """The keyword-only parameters of ``fn`` and their defaults."""
    return {p.name: p.default for p in inspect.signature(fn).parameters.values()
            if p.kind is inspect.Parameter.KEYWORD_ONLY}


@dataclass(frozen=True)
class Estimator:
    """A registered advantage estimator: `fn(inp: AdvantageInputs, **settings) -> (advantages, returns)`."""

    name: str
    fn: Callable
    needs_critic: bool = False  # reads AdvantageInputs.values: the driver builds a critic (value head)
    needs_groups: bool = False  # a baseline over the samples of one task: rl.group_size must be > 1
    report_name: str = ""  # the name results are reported under (gae: "ppo"); default: `name`
    settings: dict[str, Any] = field(default_factory=dict)  # keyword-only parameters → defaults
    # when a group whose episodes all got the same reward gets advantage 0 on every token: "always" (a group
    # baseline: grpo, rloo), "outcome" (on the final reward alone with gamma 1: gigpo, whose step returns differ
    # otherwise), "never" (batch whitening or a critic keep a signal); rl.dynamic_sampling is refused where not
    zero_when_tied: str = "never"

    def __call__(self, inp, **settings):
        return self.fn(inp, **settings)


@dataclass(frozen=True)
class PolicyLoss:
    """A registered policy loss: `fn(logprobs, old_logprobs, advantages, mask, agg=..., **settings) -> (loss, metrics)`.

    ``settings`` names the learner settings (fields of ``LearnerConfig``) it is called with,
    as keyword arguments of the same names; ``agg`` is always ``rl.learner.loss_agg``."""

    name: str
    fn: Callable
    settings: tuple[str, ...] = ()

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)

    def kwargs(self, learner_cfg) -> dict[str, Any]:
        """The keyword arguments this loss takes from a learner config."""
        return {"agg": learner_cfg.loss_agg} | {k: getattr(learner_cfg, k) for k in self.settings}

    def defaults(self) -> dict[str, Any]:
        """The learner settings this loss takes (``loss_agg`` for ``agg``) → its function's defaults for them:
        what ``LearnerConfig`` uses where the config does not set them (gspo: its paper's clip range and
        aggregation)."""
        params = inspect.signature(self.fn).parameters
        return {("loss_agg" if k == "agg" else k): params[k].default for k in ("agg", *self.settings)
                if k in params and params[k].default is not inspect.Parameter.empty}


ADVANTAGES: dict[str, Estimator] = {}
POLICY_LOSSES: dict[str, PolicyLoss] = {}


def _add(table: dict, kind: str, entry) -> None:
    if entry.name in table:
        raise ValueError(f"{kind} {entry.name!r} is already registered")
    table[entry.name] = entry


def _get(table: dict, kind: str, name: str):
    if name not in table:
        raise KeyError(f"unknown {kind} {name!r}; known: {', '.join(sorted(table))}")
    return table[name]


def register_advantage(name: str, *, needs_critic: bool = False, needs_groups: bool = False,
                       report_name: str | None = None, zero_when_tied: str = "never") -> Callable[[Callable], Callable]:
    """Register `fn(inp: AdvantageInputs, *, setting=default, ...) -> (advantages, returns)` as `name`.

    ``needs_critic``: the estimator reads ``inp.values`` (the RL driver then trains a critic);
    ``needs_groups``: it compares the samples of one task (``rl.group_size`` must be > 1);
    ``report_name``: the method name results are reported under (default ``name``);
    ``zero_when_tied``: when a group whose episodes all got the same reward gets advantage 0 on
    every token (``always``, ``outcome``: on the final reward alone with gamma 1, or ``never``;
    see :class:`Estimator`). The function's keyword-only parameters are its settings
    (``rl.advantage_settings``).
    """
    if zero_when_tied not in TIED_GROUPS:
        raise ValueError(f"zero_when_tied must be one of {', '.join(TIED_GROUPS)}, got {zero_when_tied!r}")

    def decorator(fn: Callable) -> Callable:
        _add(ADVANTAGES, "advantage", Estimator(name, fn, needs_critic, needs_groups, report_name or name,
                                                _keyword_settings(fn), zero_when_tied))
        return fn

    return decorator


def register_policy_loss(name: str, *, settings: tuple[str, ...] = ()) -> Callable[[Callable], Callable]:
    """Register `fn(logprobs, old_logprobs, advantages, mask, agg, **settings) -> (loss, metrics)` as
    `name`; ``settings`` are the ``rl.learner`` fields it is called with (same-named keywords)."""
    def decorator(fn: Callable) -> Callable:
        _add(POLICY_LOSSES, "policy loss", PolicyLoss(name, fn, tuple(settings)))
        return fn

    return decorator


def get_advantage(name: str) -> Estimator:
    """The advantage estimator registered as `name` (callable like its function); KeyError
    listing the known names otherwise."""
    return _get(ADVANTAGES, "advantage", name)


def get_policy_loss(name: str) -> PolicyLoss:
    """The policy loss registered as `name` (callable like its function); KeyError listing the
    known names otherwise."""
    return _get(POLICY_LOSSES, "policy loss", name)


def registered_name(spec: str, kind: str = "advantage") -> str:
    """The registered name ``spec`` stands for: ``spec`` itself, or, for an import path, the name
    the function it names was registered under (importing its module registered it). ``kind``:
    ``advantage`` or ``policy loss``. ValueError (what a config validator reports) when the path
    does not import or names a function that was never registered."""
    table = ADVANTAGES if kind == "advantage" else POLICY_LOSSES
    decorator = "register_advantage" if kind == "advantage" else "register_policy_loss"
    return registered_in(spec, kind, table, decorator, lambda entry: entry.fn)


def registered_in(spec: str, kind: str, table: dict, decorator: str, registered=lambda entry: entry) -> str:
    """The name ``spec`` stands for in ``table`` (name → entry; ``registered(entry)``: the function or
    class registered): ``spec`` itself, or, for an import path, the name what it names was registered
    under with ``@<decorator>`` (importing it registered it). ValueError (what a config validator
    reports) when the path does not import or names something never registered."""
    if not is_import_path(spec):
        return spec
    try:
        obj = load_object(spec, kind)
    except ImportError as e:
        raise ValueError(str(e)) from None
    for name, entry in table.items():
        if registered(entry) is obj:
            return name
    raise ValueError(f"{kind} {spec!r}: {getattr(obj, '__name__', obj)!r} is not registered; decorate it with "
                     f"@{decorator}(\"name\") from agent_r1.algorithms")
