"""The environment registry, and the environment of a config.

``env.name`` in a config is a registered name (``multihop_qa``, ``naive_rag``, or one added
with ``@register_env("name")``) or an import path to a `ToolEnv` subclass (``module:Class`` or
``path/to/file.py:Class``). ``env.tools`` lists its tools (agent_r1/tools/registry.py; null:
the class's ``DEFAULT_TOOLS``), and ``env.kwargs`` the constructor arguments of its own.
:func:`make_env_factory` is the one place a pipeline builds environments.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from agent_r1.envs.tool_env import ToolEnv
from agent_r1.registry import named_class
from agent_r1.tools import Tool, build_tools

ENVS: dict[str, type[ToolEnv]] = {}


def register_env(name: str) -> Callable[[type[ToolEnv]], type[ToolEnv]]:
    """Class decorator: register a `ToolEnv` subclass under ``name`` (a different class under
    a taken name is an error)."""

    def add(cls: type[ToolEnv]) -> type[ToolEnv]:
        if not (isinstance(cls, type) and issubclass(cls, ToolEnv)):
            raise TypeError(f"register_env({name!r}) takes a ToolEnv subclass, got {cls!r}")
        if ENVS.get(name, cls) is not cls:
            raise ValueError(f"a different environment named {name!r} is already registered")
        ENVS[name] = cls
        return cls

    return add


def get_env(name: str) -> type[ToolEnv]:
    """The environment class ``name`` names: registered, or an import path."""
    return named_class(name, ENVS, ToolEnv, "environment")


def tool_specs(env_cfg, env_cls: type[ToolEnv] | None = None) -> list[str | dict]:
    """The tool entries of the config's ``env`` section: ``env.tools``, or the class's DEFAULT_TOOLS
    (``env_cls``, default: ``env.name``'s)."""
    if env_cfg.tools is not None:
        return env_cfg.tools
    return (env_cls or get_env(env_cfg.name)).DEFAULT_TOOLS


def env_tools(env_cfg, data_dir: Path | None, env_cls: type[ToolEnv] | None = None, split: str | None = None) -> list[Tool]:
    """The tools of the config's ``env`` section (:func:`tool_specs`) built for the questions of
    ``split`` (see agent_r1.tools.build_tools)."""
    return build_tools(tool_specs(env_cfg, env_cls), data_dir, env_cfg, split)


def make_env_factory(env_cfg, tools: list[Tool], env_cls: type[ToolEnv] | None = None,
                     data_dir: Path | None = None) -> Callable[[], ToolEnv]:
    """A function making a fresh environment per episode: ``env_cls`` (default: ``env.name``)
    built by its ``from_config`` with ``tools`` and the config's ``env`` section, its ``data_dir``
    the prepared data's folder (where a task's files are, e.g. textworld's games)."""
    cls = env_cls or get_env(env_cfg.name)

    def make() -> ToolEnv:
        env = cls.from_config(tools, env_cfg)
        env.data_dir = data_dir
        return env

    return make


def config_problems(env_cfg) -> list[str]:
    """What is wrong with ``env.name`` and ``env.tools`` (names that do not resolve), for the
    config's validation; building the tools needs the prepared data, so it waits until then."""
    from agent_r1.tools import resolve_tool

    try:
        cls = get_env(env_cfg.name)
    except (ImportError, KeyError, TypeError) as e:
        return [f"env.name: {e.args[0] if e.args else e}"]
    out = []
    for spec in tool_specs(env_cfg, cls):
        name = spec if isinstance(spec, str) else spec.get("name")
        if not isinstance(name, str):
            out.append(f"env.tools: an entry must be a name or a mapping with 'name', got {spec!r}")
            continue
        try:
            resolve_tool(name)
        except (ImportError, KeyError, TypeError) as e:
            out.append(f"env.tools: {e.args[0] if e.args else e}")
    return out
