"""Choosing and constructing a run's rollout engine: :func:`make_engine` builds the engine
``rollout.engine`` names (starting a vLLM server where the run serves its own), and
:func:`vllm_server` / :func:`vllm_server_args` are that server and its options."""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path

import torch

from agent_r1.config import RunConfig
from agent_r1.models import default_device, resolve_precision
from agent_r1.rollout.engine import HFEngine, RolloutEngine

log = logging.getLogger(__name__)


def make_engine(cfg: RunConfig, model: torch.nn.Module, tokenizer, model_path: str | Path) -> RolloutEngine:
    """The rollout engine ``rollout.engine`` names: ``hf`` shares ``model`` with the learner (in the precision
    :func:`~agent_r1.models.rollout_precision` gives ``model.precision``); ``vllm``
    serves ``model_path`` (a folder of the same weights) from a server started here (options:
    :func:`vllm_server_args`; on N ranks, by rank 0 for every rank), or uses the one at
    ``rollout.vllm.url``."""
    if cfg.rollout.engine == "hf":
        engine = HFEngine(model, tokenizer, precision=cfg.model.precision)
        log.info("rollout: the hf engine computes in %s (model.precision: %s)%s", engine.computes_in,
                 cfg.model.precision, "" if engine.exact else "; the update weighs its episodes by "
                 f"rl.learner.off_policy_correction ({cfg.rl.learner.off_policy_correction})")
        return engine
    from agent_r1.rollout.vllm_engine import VLLMEngine, shared_engine

    vc = cfg.rollout.vllm
    kw = {"max_concurrency": vc.max_concurrency, "request_timeout_s": vc.request_timeout_s,
          "weights_dir": vc.weights_dir}
    if vc.url:  # refused when started from tied embeddings (agent-r1 vllm-model writes an untied folder)
        return VLLMEngine(tokenizer.eos_token_id, url=vc.url, **kw)
    # one server for every rank: rank 0 starts it (from an untied copy), the others connect to its url
    return shared_engine(lambda: _started_engine(cfg, model, tokenizer, model_path, kw),
                         lambda url: VLLMEngine(tokenizer.eos_token_id, url=url, ours=True, **kw))


def _started_engine(cfg: RunConfig, model: torch.nn.Module, tokenizer, model_path: str | Path, kw: dict) -> RolloutEngine:
    """A vLLM engine with a server of its own, started here from a served copy of ``model_path``."""
    from agent_r1.rollout.vllm_engine import VLLMEngine, served_copy, weights_of_this_process

    cfg.out.mkdir(parents=True, exist_ok=True)
    weights = served_copy(model_path, cfg.rollout.vllm.weights_dir)
    try:
        server = vllm_server(cfg, weights, model.config, remove_when_orphaned=[weights_of_this_process(weights)])
    except BaseException:  # the engine owns the copy only once it exists
        shutil.rmtree(weights.parent, ignore_errors=True)
        raise
    t0 = time.perf_counter()
    engine = VLLMEngine(tokenizer.eos_token_id, server=server, weights=weights, **kw)
    log.info("rollout: vLLM server %s healthy after %.1f s (log: %s)", server.url, time.perf_counter() - t0,
             server.log_path)
    return engine


def vllm_server(cfg: RunConfig, weights: Path, model_config, remove_when_orphaned: list[str] = ()):
    """The vLLM server (not started yet) a run with ``cfg`` serves ``weights`` (an untied HF
    folder) from: ``rollout.vllm``'s Python, KV cache and start timeout, :func:`vllm_server_args`
    from ``model_config``, its log in ``<output_dir>/vllm-server.log``."""
    from agent_r1.rollout.vllm_server import ROOT, VLLMServer

    vc = cfg.rollout.vllm
    python = Path(vc.python) if Path(vc.python).is_absolute() else ROOT / vc.python
    return VLLMServer(weights, python=python, args=vllm_server_args(cfg, model_config),
                      env={"VLLM_CPU_KVCACHE_SPACE": f"{vc.kv_cache_gb:g}"}, startup_timeout_s=vc.startup_timeout_s,
                      log_path=cfg.out / "vllm-server.log", remove_when_orphaned=list(remove_when_orphaned))


def vllm_server_args(cfg: RunConfig, model_config) -> list[str]:
    """The options of the vLLM server this run starts: its dtype is what the run computes in
    (:func:`~agent_r1.models.resolve_precision` of ``model.precision`` on this machine's device),
    its context length ``rollout.vllm.max_model_len`` or, when null, ``env.max_context_tokens`` (no
    episode's context grows past it) capped by the ``max_position_embeddings`` of ``model_config``
    (the model's HF config)."""
    from agent_r1.rollout.vllm_engine import server_args

    vc = cfg.rollout.vllm
    dtype = {"fp32": "float32", "bf16": "bfloat16"}[resolve_precision(cfg.model.precision, default_device())]
    positions = getattr(model_config, "max_position_embeddings", None) or cfg.env.max_context_tokens
    max_model_len = vc.max_model_len or min(cfg.env.max_context_tokens, positions)
    return server_args(dtype, max_model_len, (["--enforce-eager"] if vc.enforce_eager else []) + list(vc.extra_args))
