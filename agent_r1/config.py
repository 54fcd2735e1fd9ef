"""Typed configuration. Every key is declared here; an unknown key or a bad value is rejected
with a message naming it (pydantic ``extra="forbid"`` plus field constraints)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PositiveInt, ValidationError, model_validator

from agent_r1.learner.learner import LearnerConfig
from agent_r1.models import TinyModelConfig


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DataConfig(_Strict):
    source: Literal["synthetic", "hotpotqa"] = "synthetic"
    path: str | None = None  # hotpotqa: a folder with train.jsonl + dev.jsonl, or one .jsonl/.json file
    # synthetic world (see agent_r1.data.synthetic.WorldConfig)
    seed: int = 0
    n_films: int = Field(2400, ge=4)
    n_directors: int = Field(800, ge=2)
    n_studios: int = Field(20, ge=2)
    n_cities: int = Field(24, ge=2)
    heldout_fraction: float = Field(0.25, gt=0, lt=1)
    questions_per_type: int | None = Field(None, ge=1)  # None: one question per eligible entity
    name_words: Literal[1, 2] = 2  # words per entity name (1: a bigger single-word inventory)

    def world(self):
        from agent_r1.data.synthetic import WorldConfig

        return WorldConfig(**self.model_dump(exclude={"source", "path"}))


class ModelConfig(_Strict):
    # a folder, a hub id, or a packaged model (agent_r1.models.PACKAGED_MODELS: smollm2-135m-instruct);
    # None: a tiny model built from `tiny`, tokenizer trained here
    name_or_path: str | None = None
    # compute precision of every forward pass (rollout, evaluation, learner) under autocast;
    # weights and optimizer state stay fp32. auto: bf16 where the hardware computes it natively
    precision: Literal["auto", "fp32", "bf16"] = "auto"
    tiny: TinyModelConfig = TinyModelConfig()
    seed: int = 0


class EnvConfig(_Strict):
    max_turns: int = Field(4, ge=1)
    max_context_tokens: int = Field(1024, ge=64)
    max_new_tokens: int = Field(48, ge=1)
    top_k: int = Field(2, ge=1)  # passages per search
    context: Literal["full", "sliding_window"] = "full"
    window: int = Field(2, ge=1)
    reward_scheme: Literal["agent_r1", "answer_only", "answer_plus_format"] = "agent_r1"
    answer_metric: Literal["em", "f1"] = "em"
    retrieval_bonus: float = 0.2  # process reward per gold document first retrieved
    format_penalty: float = Field(0.0, le=0)
    # "default": the env's built-in instruction; null: no system turn (the tiny model learns the
    # protocol from demonstrations and saves the tokens); any other text is used as it is.
    system_prompt: str | None = None
    tools_in_prompt: bool = False  # list tool schemas in the system turn (hub chat models want this)
    tool_timeout_s: float = Field(5.0, gt=0)
    max_output_chars: int = Field(1200, ge=50)


class SFTConfig(_Strict):
    # Which questions the oracle demonstrates: every question with one of `hops`, plus the
    # question types in `qtypes`. The default shows single searches and ONE two-hop
    # composition (film → studio); the other compositions are left for RL to discover.
    hops: list[int] = [1]
    qtypes: list[str] = ["studio_city_of_film"]
    # Question types demonstrated only this many times per source (world or training split):
    # scarce demonstrations that RL, with many more questions and a reward, has to make up for.
    scarce: dict[str, PositiveInt] = {}
    worlds: int = Field(0, ge=0)  # >0: demonstrations from this many fresh worlds (see run.py)
    epochs: float = Field(1.5, gt=0)
    batch_size: int = Field(8, ge=1)
    lr: float = Field(3e-3, gt=0)
    warmup_steps: int = Field(50, ge=0)
    checkpoint_every: int = Field(500, ge=1)  # optimizer steps between resumable states


class RLConfig(_Strict):
    algorithm: str = "grpo"  # an advantage estimator name (see agent_r1.algorithms)
    # Which questions RL trains on: every training question with one of `hops`, plus the
    # question types in `qtypes` (e.g. hops: [] and qtypes: the compositions SFT never showed).
    hops: list[int] = [2]
    qtypes: list[str] = []
    iterations: int = Field(100, ge=0)
    tasks_per_iteration: int = Field(16, ge=1)
    group_size: int = Field(8, ge=1)
    temperature: float = Field(1.0, gt=0)
    top_p: float = Field(1.0, gt=0, le=1)
    gamma: float = Field(1.0, ge=0, le=1)
    lam: float = Field(1.0, ge=0, le=1)
    loss_mask: bool = True
    adv_mask: bool = True
    # Where RL starts: null = this pipeline's SFT checkpoint; else a folder or a registry URI
    # (models:/<name>@<alias>), e.g. the current champion when retraining.
    init_from: str | None = None
    checkpoint_every: int = Field(10, ge=1)  # iterations between resumable states
    learner: LearnerConfig = LearnerConfig()


class EvalConfig(_Strict):
    split: str = "test"
    hops: list[int] = [1, 2, 3]
    max_per_hop: int = Field(100, ge=1)
    temperature: float = Field(0.0, ge=0)  # 0: greedy
    # Evaluated next to the trained agents: naive_rag (retrieve once with the question, answer
    # in one turn, with the SFT weights) and base_tool_call (the model before any training, with
    # the tools: for a hub model the instruct model itself, for the tiny model its random init).
    baselines: list[Literal["naive_rag", "base_tool_call"]] = ["naive_rag", "base_tool_call"]


class RegisterConfig(_Strict):
    model_name: str = "agent-r1"  # the MLflow registered model
    # The gate: the new agent becomes `champion` only if eval.json[split][method][metric] beats
    # the current champion's score on the same held-out tasks; otherwise it stays `challenger`.
    split: str = "test"
    metric: Literal["em", "f1", "reward"] = "em"


class RunConfig(_Strict):
    name: str = "default"
    seed: int = 0
    output_dir: str = "outputs/default"
    data: DataConfig = DataConfig()
    model: ModelConfig = ModelConfig()
    env: EnvConfig = EnvConfig()
    sft: SFTConfig = SFTConfig()
    rl: RLConfig = RLConfig()
    eval: EvalConfig = EvalConfig()
    registry: RegisterConfig = RegisterConfig()
    # A comparison pipeline trains several RL methods from the same SFT start with the same
    # budget and seed: names as reported (ppo, grpo, reinforce_pp, reinforce_pp_baseline, rloo,
    # <method>_no_loss_mask, <method>_no_adv_mask). Empty: only rl.algorithm.
    methods: list[str] = []

    @model_validator(mode="after")
    def _check(self):
        from agent_r1.algorithms import ADVANTAGES

        from agent_r1.rl import parse_method

        if self.rl.algorithm not in ADVANTAGES:
            raise ValueError(f"rl.algorithm: unknown estimator {self.rl.algorithm!r}; known: {sorted(ADVANTAGES)}")
        for m in self.methods:
            if parse_method(m)["algorithm"] not in ADVANTAGES:
                raise ValueError(f"methods: unknown method {m!r}; known algorithms: {sorted(ADVANTAGES)} "
                                 "(ppo = gae), optionally with _no_loss_mask or _no_adv_mask")
        if self.data.source == "synthetic":
            from agent_r1.data.synthetic import QTYPES

            for key, names in (("sft.qtypes", self.sft.qtypes), ("sft.scarce", self.sft.scarce),
                               ("rl.qtypes", self.rl.qtypes)):
                unknown = sorted(set(names) - set(QTYPES))
                if unknown:
                    raise ValueError(f"{key}: unknown question type(s) {unknown}; known: {', '.join(QTYPES)}")
            full = sorted(q for q in self.sft.scarce if q in self.sft.qtypes or QTYPES[q][0] in self.sft.hops)
            if full:
                raise ValueError(f"sft.scarce: {full} already demonstrated in full by sft.hops or sft.qtypes")
        if self.sft.worlds and self.data.source != "synthetic":
            raise ValueError("sft.worlds: fresh demonstration worlds exist only for data.source 'synthetic'")
        if self.env.max_new_tokens >= self.env.max_context_tokens:
            raise ValueError("env.max_new_tokens must be smaller than env.max_context_tokens")
        return self

    @property
    def out(self) -> Path:
        return Path(self.output_dir)


class ConfigError(ValueError):
    pass


def _format(err: ValidationError, where: str) -> str:
    lines = [f"invalid config {where}:"]
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"]) or "(root)"
        lines.append(f"  {key}: {e['msg']}")
    return "\n".join(lines)


def _set_dotted(d: dict, dotted: str, value) -> None:
    keys = dotted.split(".")
    for k in keys[:-1]:
        d = d.setdefault(k, {})
        if not isinstance(d, dict):
            raise ConfigError(f"override {dotted!r}: {k!r} is not a section")
    d[keys[-1]] = value


def parse_overrides(items: list[str]) -> dict:
    """``["rl.iterations=5", "env.top_k=3"]`` → nested dict (values parsed as YAML scalars)."""
    out: dict = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like key.path=value")
        key, raw = item.split("=", 1)
        _set_dotted(out, key.strip(), yaml.safe_load(raw))
    return out


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _resolve(pipelines: dict, name: str, path: Path, seen: tuple = ()) -> dict:
    """A pipeline's keys, on top of the pipeline it ``extends`` (deep merge)."""
    if name in seen:
        raise ConfigError(f"{path}: pipelines extend each other in a cycle: {' -> '.join(seen + (name,))}")
    raw = dict(pipelines[name] or {})
    base = raw.pop("extends", None)
    if base is None:
        return raw
    if base not in pipelines:
        raise ConfigError(f"{path}: pipeline {name!r} extends {base!r}, which is not defined; defined: {sorted(pipelines)}")
    return _merge({k: v for k, v in _resolve(pipelines, base, path, seen + (name,)).items() if k not in ("name", "output_dir")}, raw)


def load_config(pipeline: str = "default", path: str | Path = "pipelines.yaml", overrides: dict | None = None) -> RunConfig:
    """Read pipeline ``pipeline`` from ``path`` (if the file exists), apply overrides, validate."""
    raw: dict = {}
    path = Path(path)
    if path.exists():
        doc = yaml.safe_load(path.read_text()) or {}
        pipelines = doc.get("pipelines", {})
        if pipeline not in pipelines:
            raise ConfigError(f"{path}: no pipeline named {pipeline!r}; defined: {sorted(pipelines)}")
        raw = _resolve(pipelines, pipeline, path)
    elif pipeline != "default":
        raise ConfigError(f"{path} not found (needed for pipeline {pipeline!r})")
    raw = _merge({"name": pipeline, "output_dir": f"outputs/{pipeline}"}, raw)
    raw = _merge(raw, overrides or {})
    try:
        return RunConfig.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(_format(e, f"for pipeline {pipeline!r} ({path})")) from None
