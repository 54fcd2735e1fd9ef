"""The pipeline's stages: prepare → sft → train (RL) → evaluate → register.

Each is a plain function of the typed config: it reads the files the stage before wrote under
``<output_dir>``, writes its own, and reports metrics to a :class:`StageLog`. The CLI
(``agent-r1 stage <name>``), ``dvc.yaml`` and the Prefect flows all call these functions.

Layout under ``<output_dir>``::

    data/{corpus,train,test}.parquet          prepare
    checkpoints/sft/                          sft        (Hugging Face folder)
    rl/<method>/                              train      (method: grpo, ppo, rloo, ...)
    metrics/sft_history.json                  sft        (DVC plots)
    metrics/train/<method>.json               train      (per-iteration RL metrics; DVC plots)
    metrics/eval.json                         evaluate   (split -> method -> metrics; DVC metrics)
    metrics/register.json                     register   (version, alias, why)
    state/                                    resume points (never a DVC output)

Long stages save a resumable state (weights, optimizer, RNG, progress) every few steps,
atomically; re-running a killed stage continues from the last one if the config that shaped it
is unchanged.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import time
from pathlib import Path

import torch

from agent_r1.config import RunConfig
from agent_r1.data.synthetic import load_split
from agent_r1.learner import Learner, ValueModel
from agent_r1.models import build_tiny_model, load_model
from agent_r1.pipeline.record import NULL_LOG, StageLog
from agent_r1.progress import Progress
from agent_r1.rl import NEEDS_CRITIC, annotate, method_name, parse_method, rollout, rollout_stats, update
from agent_r1.rollout import HFEngine
from agent_r1.run import Agent, evaluate_agent, flat_eval, initial_model, make_tools, oracle_demonstrations, prepare_data, tasks_for
from agent_r1.sft import sft as sft_loop
from agent_r1.transcripts import transcripts

log = logging.getLogger(__name__)

STAGES = ("prepare", "sft", "train", "evaluate", "register")


# ------------------------------------------------------------------------------ helpers
def _write_json(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1, sort_keys=True))
    tmp.replace(path)


def fingerprint(cfg: RunConfig, *sections: str) -> str:
    """A hash of the config sections (dotted paths) that shape a stage's result; a resume needs
    it unchanged."""
    def get(path: str):
        node = cfg.model_dump(mode="json")
        for key in path.split("."):
            node = node[key]
        return node

    return hashlib.sha256(json.dumps([cfg.seed] + [get(s) for s in sections], sort_keys=True).encode()).hexdigest()[:16]


def data_version(data_dir: Path) -> str:
    """md5 over the data files, the same content hash idea DVC uses for the ``data`` output."""
    h = hashlib.md5()
    for f in sorted(Path(data_dir).glob("*.parquet")):
        h.update(f.name.encode())
        h.update(hashlib.md5(f.read_bytes()).digest())
    return h.hexdigest()


def rl_method(cfg: RunConfig) -> str:
    return method_name(cfg.rl.algorithm, cfg.rl.loss_mask, cfg.rl.adv_mask)


def rl_methods(cfg: RunConfig) -> list[str]:
    """The RL methods the pipeline trains: ``methods`` (a comparison) or just ``rl.algorithm``."""
    return list(cfg.methods) or [rl_method(cfg)]


def for_method(cfg: RunConfig, method: str) -> RunConfig:
    """The config that trains ``method`` (its estimator and masks; everything else shared)."""
    return cfg.model_copy(update={"rl": cfg.rl.model_copy(update=parse_method(method))})


SUPERVISED = ("base", "sft", "sft_control")


def checkpoint_dir(cfg: RunConfig, method: str) -> Path:
    """``checkpoints/<base|sft|sft_control>``; an RL method's agent is in ``rl/<method>``.

    All RL results share the ``rl/`` folder (one DVC output whatever the algorithm), so
    ``dvc exp run -S ...rl.algorithm=rloo`` needs no change to dvc.yaml.
    """
    return cfg.out / ("checkpoints" if method in SUPERVISED else "rl") / method


def _resumable(state_dir: Path, fp: str) -> bool:
    meta = state_dir / "meta.json"
    if not meta.exists():
        return False
    if json.loads(meta.read_text()).get("fingerprint") == fp:
        return True
    log.warning("%s was written under a different config; starting the stage afresh", state_dir)
    return False


def _complete(out_dir: Path, fp: str) -> bool:
    """Did a finished stage write ``out_dir`` under this same config? (Then a re-run skips it.)"""
    marker = out_dir / "agent_r1_stage.json"
    return marker.exists() and json.loads(marker.read_text()).get("fingerprint") == fp


def _mark_complete(out_dir: Path, fp: str) -> None:
    _write_json(out_dir / "agent_r1_stage.json", {"fingerprint": fp})


def _save_state(learner: Learner, state_dir: Path, fp: str, client: dict, tokenizer=None) -> None:
    learner.save_state(state_dir, client, tokenizer)
    _write_json(state_dir / "meta.json", {"fingerprint": fp, "step": client["step"]})


# ------------------------------------------------------------------------------ stages
def prepare(cfg: RunConfig, stage_log: StageLog = NULL_LOG) -> dict:
    """Write the dataset (parquet) and return its version and size."""
    data_dir = prepare_data(cfg)
    info = {"data_version": data_version(data_dir)}
    for split in ("train", cfg.eval.split):
        if (data_dir / f"{split}.parquet").exists():  # a single HotpotQA file has no training split
            info[f"{split}_questions"] = len(load_split(data_dir, split))
    stage_log.params(info)
    return info


# The rl.learner settings SFT's optimizer uses (its lr is sft.lr; it trains every weight): what
# its fingerprint and dvc.yaml's sft params track, so RL-only settings leave the SFT checkpoint current.
SFT_OPTIMIZER_KEYS = tuple(f"rl.learner.{k}" for k in ("weight_decay", "grad_clip", "zero_stage", "micro_batch_tokens",
                                                       "loss_agg"))


def sft(cfg: RunConfig, stage_log: StageLog = NULL_LOG, progress: Progress | None = None) -> Path:
    """Build (or load) the model and run the oracle cold start; write ``checkpoints/sft``."""
    progress = progress or Progress.null()
    fp = fingerprint(cfg, "data", "model", "env", "sft", *SFT_OPTIMIZER_KEYS)
    if _complete(checkpoint_dir(cfg, "sft"), fp):  # e.g. a flow re-run after a crash in RL
        log.info("sft: %s is up to date for this config; skipping", checkpoint_dir(cfg, "sft"))
        return checkpoint_dir(cfg, "sft")
    torch.manual_seed(cfg.seed)
    data_dir = cfg.out / "data"
    tools = make_tools(cfg, data_dir)
    state_dir = cfg.out / "state" / "sft"
    resume = _resumable(state_dir, fp)
    if resume and not cfg.model.name_or_path:  # the tokenizer was trained by the first attempt
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(state_dir)
        model = build_tiny_model(cfg.model.tiny, tokenizer, seed=cfg.model.seed)
    else:
        model, tokenizer = initial_model(cfg, data_dir, tools)
        if not cfg.model.name_or_path:  # the untrained tiny model: the base_tool_call baseline
            from agent_r1.learner import save_hf_checkpoint

            save_hf_checkpoint(model, checkpoint_dir(cfg, "base"), tokenizer)
        else:  # the baseline is the configured model itself; the folder names it (a DVC output)
            _write_json(checkpoint_dir(cfg, "base") / "agent_r1_base.json", {"name_or_path": cfg.model.name_or_path})
    agent = Agent(model, tokenizer, tools, cfg)
    learner = Learner(model, cfg.rl.learner.model_copy(update={"lr": cfg.sft.lr, "lora_rank": 0}), precision=cfg.model.precision)
    start, history = 0, []
    if resume:
        client = learner.load_state(state_dir)
        start, history = client["step"], client["history"]
        log.info("sft: resuming at step %d from %s", start, state_dir)
    demos = oracle_demonstrations(cfg, agent, agent.context(), load_split(data_dir, "train"))
    stage_log.params({"demonstrations": len(demos)})
    every = cfg.sft.checkpoint_every

    with progress.task("sft", total=None) as report:
        def on_step(step: int, total: int, m: dict) -> None:
            history.append({"step": step, **m})
            report(f"step {step}/{total} loss {m['sft_loss']:.3f}", step / total)
            if step % 50 == 0 or step == total:
                stage_log.metrics(m, step)
            if step % every == 0 and step < total:
                _save_state(learner, state_dir, fp, {"step": step, "history": history}, tokenizer)

        sft_loop(learner, demos, tokenizer.pad_token_id, cfg.sft.epochs, cfg.sft.batch_size, cfg.sft.lr,
                 cfg.sft.warmup_steps, cfg.seed, on_step=on_step, start_step=start)
    out = learner.save(checkpoint_dir(cfg, "sft"), tokenizer)
    _write_json(cfg.out / "metrics" / "sft_history.json", history[::10] + history[-1:])
    _mark_complete(out, fp)
    shutil.rmtree(state_dir, ignore_errors=True)
    return out


def _load_start(cfg: RunConfig, tracker=None) -> tuple[torch.nn.Module, object]:
    """RL's starting model: ``rl.init_from`` (a folder or ``models:/...``) or ``checkpoints/sft``."""
    src = cfg.rl.init_from or str(checkpoint_dir(cfg, "sft"))
    if src.startswith(("models:/", "runs:/")):
        if tracker is None:
            raise ValueError(f"rl.init_from={src!r} needs MLflow tracking to resolve")
        src = str(tracker.load_agent(src, cfg.out / "state" / "init_model"))
    if not Path(src, "config.json").exists():
        raise FileNotFoundError(f"RL start model {src} not found: run the sft stage first (or set rl.init_from)")
    return load_model(src)


class RLTrainer:
    """The RL stage, one iteration at a time: rollout → annotate → update → end_iteration.

    ``run()`` loops over them (the CLI and DVC path); the Prefect training flow calls the four
    pieces itself so each is a task. Every ``rl.checkpoint_every`` iterations the learner state,
    RNG and history are saved atomically; constructing the trainer again resumes from there.
    """

    def __init__(self, cfg: RunConfig, stage_log: StageLog = NULL_LOG, tracker=None):
        self.cfg, self.log = cfg, stage_log
        self.method = rl_method(cfg)
        self.fp = fingerprint(cfg, "data", "model", "env", "sft", "rl")
        self.complete = _complete(checkpoint_dir(cfg, self.method), self.fp) and history_path(cfg, self.method).exists()
        if self.complete:  # finished before under this config (a re-run after a later crash)
            log.info("rl: %s is up to date for this config; skipping", checkpoint_dir(cfg, self.method))
            self.iteration, self.history = cfg.rl.iterations, json.loads(history_path(cfg, self.method).read_text())
            return
        data_dir = cfg.out / "data"
        model, self.tokenizer = _load_start(cfg, tracker)
        self.agent = Agent(model, self.tokenizer, make_tools(cfg, data_dir), cfg)
        self.context = self.agent.context()
        lc = cfg.rl.learner
        reference = _load_start(cfg, tracker)[0] if lc.kl_coef > 0 else None
        critic = ValueModel(_load_start(cfg, tracker)[0]) if cfg.rl.algorithm in NEEDS_CRITIC else None
        self.learner = Learner(model, lc, reference=reference, critic=critic, precision=cfg.model.precision)
        self.engine = HFEngine(model, self.tokenizer, precision=cfg.model.precision)
        self.tasks = tasks_for(load_split(data_dir, "train"), cfg.rl.hops, seed=cfg.seed, qtypes=cfg.rl.qtypes)
        if not self.tasks:
            raise ValueError(f"no training questions with rl.hops={cfg.rl.hops} or rl.qtypes={cfg.rl.qtypes} "
                             f"in {data_dir}/train.parquet")
        self.rng = torch.Generator().manual_seed(cfg.seed)
        torch.manual_seed(cfg.seed)
        self.iteration, self.history = 0, []
        self.state_dir = cfg.out / "state" / f"rl_{self.method}"
        if _resumable(self.state_dir, self.fp):
            client = self.learner.load_state(self.state_dir)
            self.iteration, self.history = client["step"], client["history"]
            self.rng.set_state(client["rng"])
            torch.set_rng_state(client["torch_rng"])
            log.info("rl: resuming after iteration %d from %s", self.iteration, self.state_dir)
        self._t0 = time.perf_counter()

    @property
    def done(self) -> bool:
        return self.iteration >= self.cfg.rl.iterations

    def rollout(self) -> list:
        r = self.cfg.rl
        pick = torch.randperm(len(self.tasks), generator=self.rng)[: r.tasks_per_iteration].tolist()
        self._batch_tasks = [self.tasks[i] for i in pick]
        self._t0 = time.perf_counter()
        trajs = rollout(self.engine, self.agent.make_env, self._batch_tasks, self.context, r,
                        self.cfg.env.max_new_tokens, self.cfg.env.max_context_tokens)
        self._t_rollout = time.perf_counter() - self._t0
        return trajs

    def annotate(self, trajs: list) -> dict:
        return annotate(self.learner, trajs, self.cfg.rl, self.tokenizer.pad_token_id)

    def update(self, batch: dict) -> dict:
        return update(self.learner, batch, self.rng)

    def end_iteration(self, trajs: list, stats: dict) -> dict:
        """Record the iteration's metrics; save a resumable state when due."""
        self.iteration += 1
        stats = {**stats, **rollout_stats(trajs), **{f"rollout/{k}": v for k, v in self.engine.stats().items()},
                 "iteration": self.iteration,
                 "time/rollout_s": self._t_rollout, "time/iteration_s": time.perf_counter() - self._t0}
        self.history.append(stats)
        self.log.metrics(stats, self.iteration)
        if self.iteration == 1 or self.iteration % (5 * self.cfg.rl.checkpoint_every) == 0:
            self.log.text(transcripts(trajs, self._batch_tasks, limit=4), f"rollouts/iteration_{self.iteration:05d}.md")
        if self.iteration % self.cfg.rl.checkpoint_every == 0 and not self.done:
            client = {"step": self.iteration, "history": self.history, "rng": self.rng.get_state(),
                      "torch_rng": torch.get_rng_state()}
            _save_state(self.learner, self.state_dir, self.fp, client)
        return stats

    def step(self) -> dict:
        trajs = self.rollout()
        return self.end_iteration(trajs, self.update(self.annotate(trajs)))

    def finish(self) -> Path:
        if self.complete:
            return checkpoint_dir(self.cfg, self.method)
        out = self.learner.save(checkpoint_dir(self.cfg, self.method), self.tokenizer)
        _write_json(history_path(self.cfg, self.method), self.history)
        _mark_complete(out, self.fp)
        self.log.curves(self.history, ["reward_mean", "em", "tool_calls", "policy/entropy", "policy/kl"], "curves.png")
        shutil.rmtree(self.state_dir, ignore_errors=True)
        return out

    def run(self, progress: Progress | None = None) -> Path:
        total = self.cfg.rl.iterations
        with (progress or Progress.null()).task(f"rl {self.method}", total=total) as report:
            while not self.done:
                s = self.step()
                report(f"it {self.iteration}/{total} reward {s['reward_mean']:.3f} em {s.get('em', float('nan')):.3f} "
                       f"calls {s['tool_calls']:.2f}", self.iteration / max(total, 1))
        return self.finish()


def history_path(cfg: RunConfig, method: str) -> Path:
    return cfg.out / "metrics" / "train" / f"{method}.json"


def train(cfg: RunConfig, stage_log: StageLog = NULL_LOG, progress: Progress | None = None, tracker=None,
          methods: list[str] | None = None) -> list[Path]:
    """RL from the SFT checkpoint (or ``rl.init_from``) for each method (default
    :func:`rl_methods`); writes ``rl/<method>``."""
    if not cfg.methods:
        return [RLTrainer(cfg, stage_log, tracker).run(progress)]
    out = []
    for m in methods or cfg.methods:  # a comparison: one nested MLflow run per method, side by side
        child = stage_log.child(m)
        out.append(RLTrainer(for_method(cfg, m), child, tracker).run(progress))
        child.end()
    return out


def base_model_path(cfg: RunConfig) -> str:
    """The model before any training: the configured hub model, or the tiny model's init."""
    return cfg.model.name_or_path or str(checkpoint_dir(cfg, "base"))


def default_methods(cfg: RunConfig) -> dict[str, str]:
    """What the evaluate stage scores: the baselines, the SFT start and the RL result."""
    methods = {}
    if "base_tool_call" in cfg.eval.baselines:
        methods["base_tool_call"] = base_model_path(cfg)
    if "naive_rag" in cfg.eval.baselines:
        methods["naive_rag"] = str(checkpoint_dir(cfg, "sft"))
    methods["sft"] = str(checkpoint_dir(cfg, "sft"))
    return methods | {m: str(checkpoint_dir(cfg, m)) for m in rl_methods(cfg)}


def evaluate(cfg: RunConfig, stage_log: StageLog = NULL_LOG, progress: Progress | None = None,
             checkpoints: dict[str, str] | None = None, tracker=None, merge: bool = False) -> dict:
    """Greedy held-out evaluation of each method; writes ``metrics/eval.json``.

    ``checkpoints`` maps method name → a checkpoint folder, a hub id or a registry URI
    (``models:/<name>@<alias>``, resolved through ``tracker``); default :func:`default_methods`.
    The method ``naive_rag`` is scored with the Naive RAG protocol, every other one as an agent
    with the search tool. With ``merge`` the results are added to an existing eval.json.
    """
    from agent_r1.envs import NaiveRAGEnv

    checkpoints = checkpoints if checkpoints is not None else default_methods(cfg)
    data_dir = cfg.out / "data"
    tools = make_tools(cfg, data_dir)
    test = load_split(data_dir, cfg.eval.split)
    tasks = tasks_for(test, cfg.eval.hops, cfg.eval.max_per_hop, cfg.seed)
    if not tasks:
        raise ValueError(f"no {cfg.eval.split} questions with eval.hops={cfg.eval.hops} in {data_dir}")
    path = cfg.out / "metrics" / "eval.json"
    results: dict[str, dict] = json.loads(path.read_text()) if merge and path.exists() else {}
    for method, src in checkpoints.items():
        src = str(src)
        if src.startswith(("models:/", "runs:/")):
            if tracker is None:
                raise ValueError(f"evaluating {src} needs MLflow tracking")
            src = str(tracker.load_agent(src, cfg.out / "state" / "eval_models" / method))
        model, tokenizer = load_model(src)
        env_cls = NaiveRAGEnv if method == "naive_rag" else Agent.env_cls
        agent = Agent(model, tokenizer, tools, cfg, env_cls)
        by_hops, trajs = evaluate_agent(agent, tasks, progress, f"eval {method}")
        for split, metrics in flat_eval(by_hops, cfg.eval.split).items():
            results.setdefault(split, {})[method] = metrics
            flat = {k: v for k, v in metrics.items() if k != "em_by_qtype"}
            flat |= {f"em_{q}": v for q, v in metrics.get("em_by_qtype", {}).items()}
            stage_log.metrics({f"{split}/{method}/{k}": v for k, v in flat.items()})
        stage_log.text(transcripts(trajs, tasks, limit=12), f"transcripts/{method}.md")
    _write_json(path, results)
    stage_log.artifact(path)
    _write_json(path.with_name("model.json"), model_card(cfg, model))
    return results


def model_card(cfg: RunConfig, model: torch.nn.Module) -> dict:
    """What was trained (``metrics/model.json``, beside eval.json)."""
    from agent_r1.models import count_parameters

    return {"name_or_path": cfg.model.name_or_path or "tiny (built from model.tiny, trained from scratch)",
            "architecture": type(model).__name__, "parameters": count_parameters(model),
            "precision": cfg.model.precision}


def promotion(new_score: float, champion_score: float | None) -> tuple[bool, str]:
    """The gate: promote only a strictly better agent (or the first one)."""
    if champion_score is None:
        return True, f"no champion yet; the new agent ({new_score:.4f}) becomes champion"
    if new_score > champion_score:
        return True, f"new agent {new_score:.4f} beats champion {champion_score:.4f}"
    return False, f"new agent {new_score:.4f} does not beat champion {champion_score:.4f}; it stays challenger"


def register(cfg: RunConfig, tracker, run_id: str, champion_score: float | None = None, method: str | None = None) -> dict:
    """Log the trained agent to MLflow, register a version as ``challenger``; promote it to
    ``champion`` when its held-out score beats ``champion_score`` (the current champion's score
    on the same tasks; ``None`` = use the score recorded on the champion version).
    """
    method = method or rl_method(cfg)
    r = cfg.registry
    results = json.loads((cfg.out / "metrics" / "eval.json").read_text())
    try:
        score = float(results[r.split][method][r.metric])
    except KeyError:
        raise KeyError(f"metrics/eval.json has no {r.split}/{method}/{r.metric}: run the evaluate stage first") from None
    current = tracker.alias_version(r.model_name, "champion")
    if champion_score is None and current is not None:
        champion_score = float(current["tags"].get("score", "nan"))
    version = tracker.log_agent(run_id, checkpoint_dir(cfg, method), r.model_name, alias="challenger",
                                tags={"score": str(score), "metric": f"{r.split}/{r.metric}", "method": method})
    promote, why = promotion(score, champion_score)
    if promote:
        tracker.set_alias(r.model_name, "champion", version)
    out = {"model": r.model_name, "version": version, "alias": "champion" if promote else "challenger",
           "score": score, "champion_score": champion_score, "reason": why}
    _write_json(cfg.out / "metrics" / "register.json", out)
    return out


def rl_seconds(cfg: RunConfig) -> float:
    """The RL method's training time: its iterations' recorded wall time (also right when the
    train stage was skipped as complete, or resumed)."""
    return sum(h["time/iteration_s"] for h in json.loads(history_path(cfg, rl_method(cfg)).read_text()))


def control(cfg: RunConfig, seconds: float | None = None, progress: Progress | None = None) -> Path:
    """SFT alone for ``seconds`` (default: :func:`rl_seconds`) more from the SFT checkpoint
    (method ``sft_control``): the check that RL's gain is not just RL's extra training time."""
    seconds = rl_seconds(cfg) if seconds is None else seconds
    log.info("control: SFT for %.0f s, RL's training time", seconds)
    data_dir = cfg.out / "data"
    model, tokenizer = load_model(checkpoint_dir(cfg, "sft"))
    agent = Agent(model, tokenizer, make_tools(cfg, data_dir), cfg)
    learner = Learner(model, cfg.rl.learner.model_copy(update={"lr": cfg.sft.lr, "lora_rank": 0}), precision=cfg.model.precision)
    demos = oracle_demonstrations(cfg, agent, agent.context(), load_split(data_dir, "train"))
    deadline, seed = time.perf_counter() + seconds, cfg.seed

    class TimeUp(Exception):
        pass

    with (progress or Progress.null()).task("sft control", total=None) as report:
        def on_step(step: int, total: int, m: dict) -> None:
            report(f"loss {m['sft_loss']:.3f}")
            if time.perf_counter() >= deadline:
                raise TimeUp

        try:
            while True:  # passes over the demonstrations at a tenth of the cold start's lr
                seed += 1
                sft_loop(learner, demos, tokenizer.pad_token_id, 1.0, cfg.sft.batch_size, cfg.sft.lr * 0.1, 0, seed,
                         on_step=on_step)
        except TimeUp:
            pass
    return learner.save(checkpoint_dir(cfg, "sft_control"), tokenizer)


def run_all(cfg: RunConfig, tracker=None, progress: Progress | None = None, with_control: bool = False) -> dict:
    """Every stage in order, in this process, into one MLflow run (when ``tracker`` is given).

    Returns ``{"eval": eval.json, "timings": {...}, "register": ...}``. The Prefect training flow
    is the same sequence with each stage (and each RL iteration's pieces) as a task.
    """
    from agent_r1.pipeline.record import Recorder

    rec = Recorder(cfg, tracker)
    run_id = rec.open()
    timings: dict[str, float] = {}
    t_all = time.perf_counter()
    with rec.timed_stage("prepare", timings) as slog:
        prepare(cfg, slog)
    with rec.timed_stage("sft", timings) as slog:
        sft(cfg, slog, progress)
    with rec.timed_stage("train", timings) as slog:
        train(cfg, slog, progress, tracker)
    checkpoints = None
    if with_control:
        t0 = time.perf_counter()
        control(cfg, progress=progress)
        timings["control_s"] = time.perf_counter() - t0
        checkpoints = default_methods(cfg) | {"sft_control": checkpoint_dir(cfg, "sft_control")}
    with rec.timed_stage("evaluate", timings) as slog:
        results = evaluate(cfg, slog, progress, checkpoints)
    reg = None
    if tracker is not None:
        with rec.timed_stage("register", timings):
            reg = register(cfg, tracker, run_id)
    timings["total_s"] = time.perf_counter() - t_all
    _write_json(cfg.out / "metrics" / "timings.json", timings)
    rec.close()
    return {"eval": results, "timings": timings, "register": reg}
