"""The pipeline's stages and their one sequence: prepare → sft → train (RL) → (control) →
evaluate → register.

Each stage is a plain function of the typed config: it reads the files the stage before wrote
under ``<output_dir>`` (:mod:`agent_r1.pipeline.state` has the layout), writes its own, and
reports metrics to a :class:`StageLog`. :func:`run_pipeline` is the sequence: ``agent-r1
train`` runs it directly, the Prefect flows run it with a :class:`~agent_r1.pipeline.runner.Runner`
that makes each stage (and each phase of an RL iteration) a task, and ``agent-r1 stage <name>``
(what dvc.yaml calls) runs one of :data:`STAGES`.

Long stages save a resumable state (weights, optimizer, RNG, progress) every few steps,
atomically; re-running a killed stage continues from the last one if the config that shaped it
is unchanged, and a stage finished under the same config is skipped.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import time
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

import torch

from agent_r1.atomic import replace_dir
from agent_r1.checkpoints import trained_settings
from agent_r1.config import ConfigError, EnvConfig, RunConfig
from agent_r1.data.synthetic import load_split
from agent_r1.learner import Learner
from agent_r1.learner.distributed import barrier, is_main
from agent_r1.models import TAGS, build_tiny_model, default_device, load_model
from agent_r1.pipeline import health
from agent_r1.pipeline.control import control
from agent_r1.pipeline.curves import CURVE_METRICS
from agent_r1.pipeline.promote import register
from agent_r1.pipeline.ranks import check_ranks, on_main
from agent_r1.pipeline.record import NULL_LOG, Recorder, StageLog
from agent_r1.pipeline.rl_driver import rl_methods, train
from agent_r1.pipeline.runner import DIRECT, Runner
from agent_r1.pipeline.score_cache import baseline_key, cached_score, store_score
from agent_r1.pipeline.state import (checkpoint_dir, computed_precision, sft_learner_config, data_version, fingerprint, history_path,
                                     is_complete, mark_complete, record_settings, resumable, save_state, trained_with,
                                     write_json)
from agent_r1.evaluate import pass_at_k_by_hops, summarize_by_hops
from agent_r1.progress import Progress
from agent_r1.rollout import play_policy
from agent_r1.tracking import is_registry_uri
from agent_r1.run import (Agent, curve_agent, curve_tasks, eval_tasks, evaluate_agent, flat_eval, heldout_point, initial_model, make_tools,
                          oracle_demonstrations, prepare_data, selection_problems)
from agent_r1.sft import Plateau, sft as sft_loop
from agent_r1.transcripts import transcripts

log = logging.getLogger(__name__)

# What `agent-r1 stage <name>` runs, and dvc.yaml's stages, in the order of :func:`run_pipeline`.
STAGES = ("prepare", "sft", "train", "evaluate", "register")


# ------------------------------------------------------------------------------ stages
def prepare(cfg: RunConfig, stage_log: StageLog = NULL_LOG) -> dict:
    """Write the dataset (parquet) and return its version and size. With N ranks rank 0 writes it
    while the others wait."""
    return on_main(_prepare, cfg, stage_log)


def _prepare(cfg: RunConfig, stage_log: StageLog) -> dict:
    data_dir = prepare_data(cfg)
    problems = selection_problems(cfg, data_dir)  # before any model loads
    if problems:
        raise ConfigError("\n".join(problems))
    info = {"data_version": data_version(data_dir)}
    for split in dict.fromkeys(("train", "val", cfg.eval.split)):
        if (data_dir / f"{split}.parquet").exists():  # a single HotpotQA file has no training split
            info[f"{split}_questions"] = len(load_split(data_dir, split))
    stage_log.params(info)
    return info


# The rl.learner settings SFT's optimizer uses (its lr is sft.lr; it trains every weight): what
# its fingerprint and dvc.yaml's sft params track, so RL-only settings leave the SFT checkpoint current.
SFT_OPTIMIZER_KEYS = tuple(f"rl.learner.{k}" for k in ("weight_decay", "grad_clip", "zero_stage", "micro_batch_tokens"))


def _check_vocabulary(cfg: RunConfig, tokenizer) -> None:
    """The tiny model's tokenizer got the ``model.tiny.vocab_size`` BPE tokens asked for (BPE
    stops early when the task's text has no pair left to merge)."""
    if cfg.model.name_or_path:
        return
    got = len(tokenizer) - len(TAGS)  # the tool-call and answer tags are added after BPE
    if got < cfg.model.tiny.vocab_size:
        raise ConfigError(f"model.tiny.vocab_size: {cfg.model.tiny.vocab_size} tokens asked, but the task's text "
                          f"gives the tokenizer only {got} (no pair left to merge); set it to at most {got}")


# What shapes the plateau's validation evaluations besides sft.plateau (tracked with sft.plateau.enabled)
PLATEAU_KEYS = ("eval.curve_size", "eval.curve_split", "eval.temperature")


def sft(cfg: RunConfig, stage_log: StageLog = NULL_LOG, progress: Progress | None = None) -> Path:
    """Build (or load) the model and run the oracle cold start; write ``checkpoints/sft``.

    With ``sft.plateau.enabled`` it trains up to ``max_epochs``, evaluating the held-out curve's
    validation tasks every ``eval_every_steps``, stops ``patience`` evaluations after the best
    one, and writes the best one's weights (:class:`_PlateauWatch`; the record:
    ``metrics/sft_plateau.json``)."""
    progress = progress or Progress.null()
    plateau = cfg.sft.plateau
    fp = fingerprint(cfg, "data", "model", "env", "sft", *SFT_OPTIMIZER_KEYS, *(PLATEAU_KEYS if plateau.enabled else ()))
    if is_complete(checkpoint_dir(cfg, "sft"), fp):  # e.g. a flow re-run after a crash in RL
        log.info("sft: %s is up to date for this config; skipping", checkpoint_dir(cfg, "sft"))
        return checkpoint_dir(cfg, "sft")
    torch.manual_seed(cfg.seed)
    data_dir = cfg.out / "data"
    tools = make_tools(cfg, data_dir)
    state_dir = cfg.out / "state" / "sft"
    resume = resumable(state_dir, fp)
    model, tokenizer = _sft_start(cfg, data_dir, tools, state_dir if resume else None)
    agent = Agent(model, tokenizer, tools, cfg)
    learner = Learner(model, sft_learner_config(cfg), precision=cfg.model.precision)
    start, history, client = 0, [], {}
    if resume:
        client = learner.load_state(state_dir)
        start, history = client["step"], client["history"]
        log.info("sft: resuming at step %d from %s", start, state_dir)
    demos = oracle_demonstrations(cfg, agent, agent.context(), load_split(data_dir, "train"))
    stage_log.params({"demonstrations": len(demos)})
    every = cfg.sft.checkpoint_every
    watch = _PlateauWatch(cfg, curve_agent(agent, cfg), learner, tokenizer, client.get("plateau", []), stage_log, progress) \
        if plateau.enabled else None

    with progress.task("sft", total=None) as report:
        def on_step(step: int, total: int, m: dict) -> bool:
            history.append({"step": step, **m})
            report(f"step {step}/{total} loss {m['sft_loss']:.3f}", step / total)
            if step % 50 == 0 or step == total:
                stage_log.metrics(m, step)
            stop = watch is not None and watch(step, total)
            if step % every == 0 and step < total and not stop:  # the tokenizer only where the first attempt trained it
                save_state(learner, state_dir, fp, {"step": step, "history": history,
                                                   "plateau": watch.plateau.points if watch else []},
                           None if cfg.model.name_or_path else tokenizer)
            return stop

        sft_loop(learner, demos, tokenizer.pad_token_id, plateau.max_epochs if watch else cfg.sft.epochs,
                 cfg.sft.batch_size, cfg.sft.lr, cfg.sft.warmup_steps, cfg.seed, on_step=on_step, start_step=start)
    out = checkpoint_dir(cfg, "sft")
    if watch is None:
        learner.save(out, tokenizer)
        if is_main():
            (cfg.out / "metrics" / "sft_plateau.json").unlink(missing_ok=True)  # the record of an earlier config
    else:
        watch.finish(out, history[-1]["step"])
    record_settings(out, trained_with(cfg))
    write_json(cfg.out / "metrics" / "sft_history.json", history[::10] + history[-1:])
    mark_complete(out, fp)
    if is_main():
        shutil.rmtree(state_dir, ignore_errors=True)
    return out


def _sft_start(cfg: RunConfig, data_dir: Path, tools, resume_from: Path | None):
    """The model and tokenizer SFT starts from: for a resumed tiny model the tokenizer its first
    attempt trained (``resume_from``); else :func:`initial_model`, whose untrained state is also
    written as the ``base`` baseline (for a hub model, a file naming it)."""
    if resume_from is not None and not cfg.model.name_or_path:  # the tokenizer was trained by the first attempt
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(resume_from)
        return build_tiny_model(cfg.model.tiny, tokenizer, seed=cfg.model.seed), tokenizer
    model, tokenizer = initial_model(cfg, data_dir, tools)
    _check_vocabulary(cfg, tokenizer)
    if not cfg.model.name_or_path:  # the untrained tiny model: the base_tool_call baseline
        from agent_r1.learner import save_hf_checkpoint

        save_hf_checkpoint(model, checkpoint_dir(cfg, "base"), tokenizer)
        record_settings(checkpoint_dir(cfg, "base"), trained_with(cfg))
    else:  # the baseline is the configured model itself; the folder names it (a DVC output)
        write_json(checkpoint_dir(cfg, "base") / "agent_r1_base.json", {"name_or_path": cfg.model.name_or_path})
    return model, tokenizer


class _PlateauWatch:
    """The SFT stage's validation curve (``sft.plateau``): called after every optimizer step, it
    evaluates every ``eval_every_steps`` (and at the last step), saves the weights of a new best
    evaluation to ``best_dir`` and says when to stop (:class:`~agent_r1.sft.Plateau`)."""

    def __init__(self, cfg: RunConfig, agent: Agent, learner: Learner, tokenizer, points: list[dict],
                 stage_log: StageLog, progress: Progress):
        self.cfg, self.agent, self.learner, self.tokenizer = cfg, agent, learner, tokenizer
        self.stage_log, self.progress = stage_log, progress
        self.plateau = Plateau(cfg.sft.plateau.patience, points)
        self.tasks = curve_tasks(cfg)
        self.best_dir = cfg.out / "state" / "sft_best"
        # training time so far, the evaluations left out (a resumed run goes on from its last point)
        self.t0, self.eval_s = time.perf_counter() - (points[-1]["train_s"] if points else 0.0), 0.0

    def __call__(self, step: int, total: int) -> bool:
        if step % self.cfg.sft.plateau.eval_every_steps and step != total:
            return False
        train_s = time.perf_counter() - self.t0 - self.eval_s
        point = heldout_point(self.agent, self.tasks, self.progress, f"sft plateau @ step {step}")
        self.eval_s += point["eval_s"]
        metric = next(k for k in CURVE_METRICS if k in point)  # the held-out curve's metric
        steps_per_epoch = total / self.cfg.sft.plateau.max_epochs
        best, stop = self.plateau.add(step, point[metric], ceiling=1.0 if metric in ("won", "em") else None,
                                      metric=metric, epoch=round(step / steps_per_epoch, 4), train_s=round(train_s, 2))
        if best:
            self.learner.save(self.best_dir, self.tokenizer)
        self.stage_log.metrics({f"sft_val/{metric}": point[metric], "sft_val/train_s": train_s}, step)
        log.info("sft plateau: step %d, val %s %.3f (best %.3f at step %d)", step, metric, point[metric],
                 self.plateau.best["score"], self.plateau.best["step"])
        return stop

    def finish(self, out: Path, last_step: int) -> None:
        """The best evaluation's weights to ``out``; the record ``metrics/sft_plateau.json`` (also in
        MLflow): the best evaluation (step, epoch, score, training time to it), where training
        stopped, and every evaluation."""
        if is_main():
            replace_dir(self.best_dir, out)
        barrier()
        best = self.plateau.best
        record = self.cfg.out / "metrics" / "sft_plateau.json"
        write_json(record, {"metric": best["metric"], "split": self.cfg.eval.curve_split, "tasks": len(self.tasks),
                            "patience": self.plateau.patience, "best": best, "stopped_step": last_step,
                            "points": self.plateau.points})
        self.stage_log.artifact(record)
        self.stage_log.metrics({"sft_plateau/score": best["score"], "sft_plateau/step": best["step"],
                                "sft_plateau/epoch": best["epoch"], "sft_plateau/train_s": best["train_s"],
                                "sft_plateau/stopped_step": last_step})
        self.stage_log.params({"sft_plateau_metric": best["metric"], "sft_plateau_step": best["step"]})


def base_model_path(cfg: RunConfig) -> str:
    """The model before any training: the configured hub model, or the tiny model's init."""
    return cfg.model.name_or_path or str(checkpoint_dir(cfg, "base"))


def default_methods(cfg: RunConfig) -> dict[str, str]:
    """What the evaluate stage scores: the baselines, the SFT start and the RL result."""
    methods = {}
    if "base_tool_call" in cfg.eval.baselines:
        methods["base_tool_call"] = base_model_path(cfg)
    if "naive_rag" in cfg.eval.baselines:  # the paper's baseline: the base model, not our SFT
        methods["naive_rag"] = base_model_path(cfg)
    if "no_tool" in cfg.eval.baselines:
        methods["no_tool"] = base_model_path(cfg)
    methods |= {b: "" for b in POLICY_BASELINES if b in cfg.eval.baselines}  # no model
    methods["sft"] = str(checkpoint_dir(cfg, "sft"))
    return methods | {m: str(checkpoint_dir(cfg, m)) for m in rl_methods(cfg)}


def evaluate(cfg: RunConfig, stage_log: StageLog = NULL_LOG, progress: Progress | None = None,
             checkpoints: dict[str, str] | None = None, tracker=None, merge: bool = False,
             env_set: Collection[str] | None = None) -> dict:
    """Greedy held-out evaluation of each method; writes ``metrics/eval.json``.

    ``checkpoints`` maps method name → a checkpoint folder, a hub id or a registry URI
    (``models:/<name>@<alias>``, resolved through ``tracker``); default :func:`default_methods`.
    The method ``naive_rag`` is scored with the Naive RAG protocol, ``no_tool`` as one direct
    answer with no tool, ``random`` and ``oracle`` without a model (:func:`policy_turns`), every
    other one as an agent with the config's tools, in the env settings the checkpoint was trained
    with where it records them, but for the keys of ``env_set`` (None, the pipeline's own stage:
    every key is the config's, and a warning names the recorded ones that differ;
    :func:`trained_config`). The tasks are :func:`~agent_r1.run.eval_tasks`. With ``merge`` the
    results are added to an existing eval.json of the same rows (``metrics/eval_data.json`` records
    their version; one of other rows is replaced, with a warning). With ``eval.every``, the held-out
    curves too (:func:`heldout_curves`); with ``eval.pass_k``, each model's pass@k beside its greedy
    scores (:func:`sampled_pass_at_k`).
    """
    checkpoints = checkpoints if checkpoints is not None else default_methods(cfg)
    data_dir = cfg.out / "data"
    test = load_split(data_dir, cfg.eval.split)
    tasks = eval_tasks(cfg, test)
    if not tasks:
        raise ConfigError(f"eval.hops: no {cfg.eval.split} task with eval.hops={cfg.eval.hops} in {cfg.data.path or data_dir}")
    path = cfg.out / "metrics" / "eval.json"
    rows = {"data_version": data_version(data_dir), "split": cfg.eval.split}
    results = _earlier_results(path, rows) if merge else {}
    tools = _tools_by_env(data_dir, cfg.eval.split)
    model = None
    for method, src in checkpoints.items():
        model, by_hops, text = _score(cfg, method, src, tools, tasks, progress, tracker, model, env_set)
        for split, metrics in flat_eval(by_hops, cfg.eval.split).items():
            results.setdefault(split, {})[method] = metrics
            flat = {k: v for k, v in metrics.items() if k != "em_by_qtype"}
            flat |= {f"em_{q}": v for q, v in metrics.get("em_by_qtype", {}).items()}
            stage_log.metrics({f"{split}/{method}/{k}": v for k, v in flat.items()})
        stage_log.text(text, f"transcripts/{method}.md")
    if cfg.curve_every:
        results |= heldout_curves(cfg, checkpoints, stage_log, progress, tracker, env_set)
    write_json(path, results)
    write_json(path.with_name("eval_data.json"), rows)
    stage_log.artifact(path)
    if model is not None:
        write_json(path.with_name("model.json"), model_card(cfg, model))
    return results


def _earlier_results(path: Path, rows: dict) -> dict:
    """The eval.json at ``path`` to merge into: {} when there is none, or when it scored other rows
    than ``rows`` (its ``eval_data.json`` says so; it is then replaced, and the log says why)."""
    if not path.exists():
        return {}
    stamp = path.with_name("eval_data.json")
    earlier = json.loads(stamp.read_text()) if stamp.exists() else rows  # an eval.json from before the stamp
    if earlier != rows:
        log.warning("%s scored other rows (%s split, data version %s; now %s split, %s): replaced, not merged",
                    path, earlier.get("split"), earlier.get("data_version"), rows["split"], rows["data_version"])
        return {}
    return json.loads(path.read_text())


def _tools_by_env(data_dir: Path, split: str):
    """``tools(cfg)``: the tools of ``cfg``'s env for ``split``'s questions, built once per env section."""
    built: dict[str, list] = {}

    def tools(cfg: RunConfig) -> list:
        key = cfg.env.model_dump_json()
        if key not in built:
            built[key] = make_tools(cfg, data_dir, split)
        return built[key]

    return tools


def trained_config(cfg: RunConfig, src: str, env_set: Collection[str] | None = None, method: str = "",
                   warn: bool = True) -> RunConfig:
    """``cfg`` with the env settings the checkpoint folder ``src`` was trained with (its
    :data:`~agent_r1.checkpoints.SETTINGS_FILE`), except the keys of ``env_set`` (those the user set,
    e.g. ``-s env.max_turns=2``; None: every key, for a pipeline's own checkpoints); ``cfg`` itself for
    a checkpoint without them (a hub model). Where the two differ, a warning (unless not ``warn``)
    names each key, the value used and the other one."""
    settings = trained_settings(src) if src and Path(src).is_dir() else None  # "": a baseline without a model
    if settings is None:
        return cfg
    trained, given = settings["env"], cfg.env.model_dump(mode="json")
    keep = set(given) if env_set is None else set(env_set)
    differ = [k for k in given if k in trained and trained[k] != given[k]]
    if not differ:
        return cfg

    def show(v) -> str:
        text = repr(v)
        return text if len(text) <= 60 else text[:57] + "..."

    parts = [f"env.{k}={show(given[k])} as given (trained: {show(trained[k])})" for k in differ if k in keep]
    taken = [k for k in differ if k not in keep]
    if taken:
        parts.append(", ".join(f"env.{k}={show(trained[k])} as trained (pipeline {cfg.name!r}: {show(given[k])})"
                               for k in taken) + " (-s env.<key>=<value> overrides one)")
    if warn:
        log.warning("%s was trained under pipeline %r with env settings other than those of pipeline %r; evaluated "
                    "with %s", f"{method} ({src})" if method else src, settings.get("pipeline"), cfg.name, "; ".join(parts))
    if not taken:
        return cfg
    env = EnvConfig.model_validate({**given, **{k: trained[k] for k in taken}})
    return cfg.model_copy(update={"env": env})


def _score(cfg: RunConfig, method: str, src: str, tools, tasks: list[dict], progress, tracker, model=None,
           env_set: Collection[str] | None = None, pass_k: bool = True):
    """``method`` (a baseline without a model, or a checkpoint's model) on ``tasks``, with
    ``tools(cfg)`` (:func:`_tools_by_env`): the model (``model`` for a baseline without one and for a
    score read from the cache), the summary by hop count (with ``pass_k``, a model's ``eval.pass_k``
    too) and the transcripts of some episodes. An untrained baseline (``eval.baselines``) comes from
    the score cache when it holds it (:mod:`~agent_r1.pipeline.score_cache`, ``eval.cache_baselines``),
    and goes there when it is computed."""
    key = None
    if cfg.eval.cache_baselines and method in cfg.eval.baselines and not is_registry_uri(src):
        key = baseline_key(trained_config(cfg, str(src), env_set, warn=False), method, str(src), tasks, pass_k)
        if (hit := cached_score(method, key, len(tasks))) is not None:
            return model, hit["by_hops"], hit["transcripts"]
    if method in POLICY_BASELINES:
        trajs = play_policy(Agent(None, None, tools(cfg), cfg).make_env, tasks, policy_turns(method, cfg.seed))
        by_hops = summarize_by_hops(trajs, tasks)
    else:
        model, by_hops, trajs = _evaluate_model(cfg, method, str(src), tools, tasks, progress, tracker, env_set, pass_k)
    text = transcripts(trajs, tasks, limit=12)
    if key is not None:
        store_score(key, by_hops, text)
    return model, by_hops, text


def heldout_curves(cfg: RunConfig, checkpoints: dict[str, str], stage_log: StageLog = NULL_LOG,
                   progress: Progress | None = None, tracker=None, env_set: Collection[str] | None = None) -> dict:
    """The held-out curves of the trained methods and the SFT-only control (``metrics/heldout/``)
    beside the baselines (``eval.baselines``) of ``checkpoints`` scored on the same curve tasks: the figure
    ``metrics/curves.png`` (also an MLflow artifact) and eval.json's rows
    ``{"curve_<split>": {method: {<metric>_auc, <metric>_final, ...}}}``; nothing without curves."""
    from agent_r1.pipeline.curves import curve_metric, draw, read_curves, summary

    curves = read_curves(cfg.out / "metrics" / "heldout", rl_methods(cfg) + ["sft_control"])
    if not curves:
        return {}
    metric, tasks = curve_metric(curves), curve_tasks(cfg)
    tools = _tools_by_env(cfg.out / "data", cfg.eval.curve_split)
    baselines = {}
    for method, src in checkpoints.items():
        if method in cfg.eval.baselines:
            _, by_hops, _ = _score(cfg, method, src, tools, tasks, progress, tracker, env_set=env_set, pass_k=False)
            baselines[method] = float(by_hops["all"].get(metric, 0.0))
    split = f"curve_{cfg.eval.curve_split}"
    path = draw(curves, baselines, metric, f"{cfg.name}: held-out {metric}, {len(tasks)} {cfg.eval.curve_split} tasks",
                cfg.out / "metrics" / "curves.png")
    stage_log.artifact(path)
    return {split: summary(curves, baselines, metric, len(tasks))}


def checkpoint_folder(cfg: RunConfig, method: str, src: str, tracker=None) -> str:
    """``src`` as a local folder where it is a registry URI (``models:/...``, ``runs:/...``: downloaded
    through ``tracker`` into ``state/eval_models/<method>``); else ``src`` itself."""
    if not is_registry_uri(src):
        return src
    if tracker is None:
        raise ValueError(f"evaluating {src} needs MLflow tracking")
    return str(tracker.load_agent(src, cfg.out / "state" / "eval_models" / method))


def _evaluate_model(cfg: RunConfig, method: str, src: str, tools, tasks: list[dict], progress, tracker,
                    env_set: Collection[str] | None = None, pass_k: bool = True):
    """A checkpoint's (or registry URI's) model as ``method`` on ``tasks``, in the env settings it
    was trained with (:func:`trained_config`): the model, the summary by hop count (with ``pass_k``,
    :func:`sampled_pass_at_k` of ``eval.pass_k`` added) and the episodes."""
    from agent_r1.envs import NaiveRAGEnv, get_env, no_tool_env

    src = checkpoint_folder(cfg, method, src, tracker)
    cfg = trained_config(cfg, src, env_set, method)
    model, tokenizer = load_model(src)
    env_cls = {"naive_rag": NaiveRAGEnv, "no_tool": no_tool_env(get_env(cfg.env.name))}.get(method, Agent.env_cls)
    agent = Agent(model, tokenizer, tools(cfg), cfg, env_cls)
    by_hops, trajs = evaluate_agent(agent, tasks, progress, f"eval {method}")
    if pass_k and cfg.eval.pass_k:
        for group, scores in sampled_pass_at_k(agent, tasks, progress, method).items():
            by_hops[group] |= scores
    return model, by_hops, trajs


def sampled_pass_at_k(agent: Agent, tasks: list[dict], progress=None, method: str = "") -> dict:
    """pass@k for each k of ``eval.pass_k`` by hop count (:func:`~agent_r1.evaluate.pass_at_k_by_hops`):
    ``eval.pass_samples`` (default the largest k) episodes of every task sampled at the training
    temperature (``rl.temperature``)."""
    cfg = agent.cfg
    n = cfg.eval.pass_samples or max(cfg.eval.pass_k)
    at_train_t = cfg.model_copy(update={"eval": cfg.eval.model_copy(update={"temperature": cfg.rl.temperature})})
    _, trajs = evaluate_agent(dataclasses.replace(agent, cfg=at_train_t), tasks * n, progress, f"pass@k {method}")
    return pass_at_k_by_hops(trajs, tasks, cfg.eval.pass_k)


POLICY_BASELINES = ("random", "oracle")  # eval.baselines played without a model


def policy_turns(method: str, seed: int):
    """The turns of a baseline without a model: ``random`` a uniformly random turn of those the
    environment lists (``admissible_turns``), ``oracle`` the environment's oracle turns."""
    import random

    rng = random.Random(seed)

    def turn(env, task: dict, k: int) -> str:
        if method == "random":
            return rng.choice(env.admissible_turns() or [""])
        oracle = env.oracle_turns(task) or []
        return oracle[k] if k < len(oracle) else ""

    return turn


def model_card(cfg: RunConfig, model: torch.nn.Module) -> dict:
    """What was trained (``metrics/model.json``, beside eval.json)."""
    from agent_r1.models import count_parameters

    return {"name_or_path": cfg.model.name_or_path or "tiny (built from model.tiny, trained from scratch)",
            "architecture": type(model).__name__, "parameters": count_parameters(model),
            "precision": computed_precision(cfg), "precision_setting": cfg.model.precision}


# ------------------------------------------------------------------------------ the sequence
@dataclass(frozen=True)
class Plan:
    """Which stages one pass of :func:`run_pipeline` runs, and how.

    ``sft``: run the cold start (retraining from a champion does not). ``control``: also the
    SFT-only control, evaluated beside the rest. ``register``: register the RL agent (needs a
    tracker). ``checkpoints``: what evaluate scores (default :func:`default_methods`).
    ``champion``: the registered champion's URI (retraining); the gate compares the new agent
    with its score on the same held-out tasks (``checkpoints`` must include it as ``champion``).
    """

    sft: bool = True
    control: bool = False
    register: bool = True
    checkpoints: dict[str, str] | None = None
    champion: str | None = None


def use_runtime(cfg: RunConfig) -> None:
    """Apply ``runtime``: torch's CPU threads (``runtime.threads``; null leaves torch's default)."""
    if cfg.runtime.threads:
        torch.set_num_threads(cfg.runtime.threads)


def run_pipeline(cfg: RunConfig, plan: Plan = Plan(), tracker=None, progress: Progress | None = None,
                 runner: Runner = DIRECT) -> dict:
    """:func:`run_stages`, then (also when it raises) the stop of the MCP servers its tools
    started: the servers belong to the run, also in a process that outlives it (a flow worker)."""
    from agent_r1.tools import close_servers

    try:
        return run_stages(cfg, plan, tracker, progress, runner)
    finally:
        close_servers()


def run_stages(cfg: RunConfig, plan: Plan, tracker, progress: Progress | None, runner: Runner) -> dict:
    """The stage sequence, in this process, into one MLflow run (when ``tracker`` is given).

    Returns ``{"mlflow_run_id", "data_version", "health", "eval", "register", "timings"}`` (``health``:
    :func:`run_health`, also the pipeline run's MLflow tag ``health_alarms`` when any was raised); writes
    ``metrics/timings.json``. The train stage is not one call of ``runner``: each phase of each
    RL iteration is (:meth:`RLTrainer.run <agent_r1.pipeline.rl_driver.RLTrainer.run>`). With
    ``sft.plateau`` rank 0's result also has ``"sft_plateau"``: the best validation evaluation
    (step, epoch, score, training time).

    With N ranks (a launcher started N processes) every rank runs the sequence; rank 0 alone
    talks to MLflow (the others get no ``tracker``) and writes files (:mod:`.ranks`).
    """
    check_ranks(cfg, plan.control)
    tracker = tracker if is_main() else None
    use_runtime(cfg)
    log.info("pipeline %s: seed %d, %s, precision %s (model.precision: %s), %d torch threads, output %s",
             cfg.name, cfg.seed, default_device(), computed_precision(cfg), cfg.model.precision,
             torch.get_num_threads(), cfg.out)
    rec = Recorder(cfg, tracker)
    out = {"mlflow_run_id": rec.open(), "register": None}
    timings: dict[str, float] = {}
    t_all = time.perf_counter()
    with rec.timed_stage("prepare", timings) as slog:
        out["data_version"] = runner.stage("prepare", prepare, cfg, slog)["data_version"]
    if plan.sft:
        with rec.timed_stage("sft", timings) as slog:
            runner.stage("sft", sft, cfg, slog, progress)
        if cfg.sft.plateau.enabled and is_main():  # the plateau's best evaluation (metrics/sft_plateau.json)
            out["sft_plateau"] = json.loads((cfg.out / "metrics" / "sft_plateau.json").read_text())["best"]
    with rec.timed_stage("train", timings) as slog:
        train(cfg, slog, progress, tracker, runner=runner)
    out["health"] = run_health(cfg)
    if tracker is not None and (look := health.needs_a_look(out["health"])):
        tracker.set_tags(out["mlflow_run_id"], {health.TAG: look})
    checkpoints = plan.checkpoints
    if plan.control:
        t0 = time.perf_counter()
        runner.stage("control", control, cfg, progress=progress)
        timings["control_s"] = time.perf_counter() - t0
        checkpoints = (checkpoints or default_methods(cfg)) | {"sft_control": str(checkpoint_dir(cfg, "sft_control"))}
    with rec.timed_stage("evaluate", timings) as slog:
        out["eval"] = runner.stage("evaluate", evaluate, cfg, slog, progress, checkpoints, tracker)
    if plan.register and tracker is not None:
        r = cfg.registry
        champion_score = float(out["eval"][r.split]["champion"][r.metric]) if plan.champion else None
        with rec.timed_stage("register", timings):
            out["register"] = runner.stage("register", register, cfg, tracker, out["mlflow_run_id"], champion_score)
    timings["total_s"] = time.perf_counter() - t_all
    write_json(cfg.out / "metrics" / "timings.json", timings)
    rec.close()
    return out | {"timings": timings}


def timings_markdown(timings: dict[str, float]) -> str:
    """:func:`run_stages`' ``timings`` as a table: each stage's wall seconds, their sum, and the
    pipeline's whole wall time (the sum plus the work between stages: health, the record)."""
    stages = {k[: -len("_s")]: v for k, v in timings.items() if k != "total_s"}
    rows = ["| stage | seconds |", "|---|---:|"] + [f"| {name} | {s:.0f} |" for name, s in stages.items()]
    rows.append(f"| sum of stages | {sum(stages.values()):.0f} |")
    if "total_s" in timings:
        rows.append(f"| pipeline (wall) | {timings['total_s']:.0f} |")
    return "\n".join(rows)


def run_health(cfg: RunConfig) -> dict[str, list[str]]:
    """Each RL method's health alarms (:mod:`~agent_r1.pipeline.health`) raised while it trained,
    from its metrics history; with N ranks, rank 0's (the others get {})."""
    if not is_main():
        return {}
    return {m: health.raised(json.loads(history_path(cfg, m).read_text())) for m in rl_methods(cfg)}


def run_all(cfg: RunConfig, tracker=None, progress: Progress | None = None, with_control: bool = False) -> dict:
    """Every stage in order (``agent-r1 train``): :func:`run_pipeline` run directly."""
    return run_pipeline(cfg, Plan(control=with_control), tracker, progress)
