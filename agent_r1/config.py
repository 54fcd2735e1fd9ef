"""Typed configuration. Every key is declared here; an unknown key or a bad value is rejected
with a message naming it (pydantic ``extra="forbid"`` plus field constraints, finite floats, and
the checks of `RunConfig` that look across sections and at the registries), and so is a pipelines
file of the wrong shape, invalid YAML, or a key given twice."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PositiveInt, ValidationError, field_validator, model_validator

from agent_r1.learner.learner import LearnerConfig
from agent_r1.models import TinyModelConfig


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class DataConfig(_Strict):
    source: Literal["synthetic", "hotpotqa", "jsonl"] = "synthetic"
    # hotpotqa: a folder with train.jsonl + dev.jsonl, or one .jsonl/.json file;
    # jsonl: a folder with corpus.jsonl, train.jsonl, test.jsonl in agent_r1.data's schema
    path: str | None = None
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
    # the environment: a registered name (agent_r1.envs.ENVS: multihop_qa, naive_rag) or an
    # import path to a ToolEnv subclass, module:Class or path/to/file.py:Class
    name: str = "multihop_qa"
    # its tools (agent_r1/tools/registry.py): registered names or import paths, each a string or
    # a mapping {name: ..., <setting>: ...}; null: the environment's DEFAULT_TOOLS (QA: search)
    tools: list[str | dict[str, Any]] | None = None
    kwargs: dict[str, Any] = {}  # more keyword arguments for the environment's constructor
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
    hops: list[PositiveInt] = [1]
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
    hops: list[PositiveInt] = [2]
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
    split: Literal["train", "test"] = "test"  # a split the prepare stage writes (data.SPLITS)
    hops: list[PositiveInt] = [1, 2, 3]
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
    split: Literal["train", "test"] = "test"
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

    @field_validator("output_dir")
    @classmethod
    def _own_folder(cls, v: str) -> str:
        where = Path(v).resolve()
        if not v.strip() or where in (Path(where.anchor), Path.cwd().resolve(), Path.home().resolve()):
            raise ValueError(f"{v!r} is not a folder of its own (stages write and delete subfolders there)")
        return v

    @model_validator(mode="after")
    def _check(self):
        problems = _choice_problems(self) + _hop_problems(self) + _tiny_problems(self) + _learner_problems(self)
        if self.sft.worlds and self.data.source != "synthetic":
            problems.append("sft.worlds: fresh demonstration worlds exist only for data.source 'synthetic'")
        if self.data.source == "hotpotqa" and not self.data.path:
            problems.append("data.path: must name a HotpotQA file or folder when data.source is 'hotpotqa'")
        if self.data.source == "jsonl" and not self.data.path:
            problems.append("data.path: must name a folder of corpus/train/test .jsonl files when data.source is 'jsonl'")
        if self.env.max_new_tokens >= self.env.max_context_tokens:
            problems.append("env.max_new_tokens must be smaller than env.max_context_tokens")
        if problems:
            raise ValueError("\n".join(problems))
        return self

    @property
    def out(self) -> Path:
        return Path(self.output_dir)


def _choice_problems(cfg: RunConfig) -> list[str]:
    """Names that must be in a registry or a known set: estimators, methods, question types,
    the environment and its tools."""
    from agent_r1.algorithms import ADVANTAGES
    from agent_r1.envs.registry import config_problems
    from agent_r1.rl import parse_method

    out = config_problems(cfg.env)
    if not out and "naive_rag" in cfg.eval.baselines:
        from agent_r1.envs import MultiHopQAEnv, get_env

        if not issubclass(get_env(cfg.env.name), MultiHopQAEnv):
            out.append(f"eval.baselines: naive_rag is a multi-hop QA baseline; env.name {cfg.env.name!r} is not a "
                       "MultiHopQAEnv (leave naive_rag out of eval.baselines)")
    if cfg.rl.algorithm not in ADVANTAGES:
        out.append(f"rl.algorithm: unknown estimator {cfg.rl.algorithm!r}; known: {sorted(ADVANTAGES)}")
    for m in cfg.methods:
        if parse_method(m)["algorithm"] not in ADVANTAGES:
            out.append(f"methods: unknown method {m!r}; known algorithms: {sorted(ADVANTAGES)} "
                       "(ppo = gae), optionally with _no_loss_mask or _no_adv_mask")
    if len(set(cfg.methods)) < len(cfg.methods):
        out.append(f"methods: a method is listed twice in {cfg.methods}")
    if cfg.data.source == "synthetic":
        from agent_r1.data.synthetic import QTYPES

        for key, names in (("sft.qtypes", cfg.sft.qtypes), ("sft.scarce", cfg.sft.scarce), ("rl.qtypes", cfg.rl.qtypes)):
            unknown = sorted(set(names) - set(QTYPES))
            if unknown:
                out.append(f"{key}: unknown question type(s) {unknown}; known: {', '.join(QTYPES)}")
        full = sorted(q for q in cfg.sft.scarce if q in QTYPES and (q in cfg.sft.qtypes or QTYPES[q][0] in cfg.sft.hops))
        if full:
            out.append(f"sft.scarce: {full} already demonstrated in full by sft.hops or sft.qtypes")
    return out


def _hop_problems(cfg: RunConfig) -> list[str]:
    """Hop counts with no questions in the data source (they would fail, or select nothing, late).
    HotpotQA questions all have two hops: there a list fails only if it selects none."""
    if cfg.data.source == "synthetic":
        from agent_r1.data.synthetic import QTYPES

        available = sorted({hops for hops, _, _ in QTYPES.values()})
        lists = {"sft.hops": cfg.sft.hops, "rl.hops": cfg.rl.hops, "eval.hops": cfg.eval.hops}
        bad = {key: sorted(set(hops) - set(available)) for key, hops in lists.items()}
    elif cfg.data.source == "hotpotqa":
        available, lists = [2], {"rl.hops": cfg.rl.hops, "eval.hops": cfg.eval.hops}
        bad = {key: sorted(hops) for key, hops in lists.items() if hops and 2 not in hops}
    else:  # jsonl: the hop counts are the data's own
        bad, available = {}, []
    out = [f"{key}: no {cfg.data.source} questions with {hops} hops; available: {available}"
           for key, hops in bad.items() if hops]
    if not cfg.eval.hops:
        out.append("eval.hops: must name at least one hop count")
    return out


# The tiny model's shape (models.TinyModelConfig): smallest values. A byte-level BPE vocabulary
# holds the 256 byte symbols and the special tokens before its first merge.
_TINY_MIN = {"vocab_size": 260, "hidden_size": 1, "num_layers": 1, "num_heads": 1, "num_kv_heads": 1,
             "intermediate_size": 1, "max_position_embeddings": 1}


def _finite(section: str, model: BaseModel) -> list[str]:
    return [f"{section}.{k}: must be a finite number, got {v}" for k, v in model
            if isinstance(v, float) and not math.isfinite(v)]


def _tiny_problems(cfg: RunConfig) -> list[str]:
    t = cfg.model.tiny
    out = _finite("model.tiny", t) + [f"model.tiny.{k}: must be >= {low}, got {getattr(t, k)}"
                                      for k, low in _TINY_MIN.items() if getattr(t, k) < low]
    if out:
        return out
    if t.hidden_size % t.num_heads or (t.hidden_size // t.num_heads) % 2:
        out.append(f"model.tiny.hidden_size: {t.hidden_size} must be num_heads ({t.num_heads}) times an even head size")
    if t.num_heads % t.num_kv_heads:
        out.append(f"model.tiny.num_heads: {t.num_heads} must be a multiple of num_kv_heads ({t.num_kv_heads})")
    if not t.rope_theta > 0:
        out.append(f"model.tiny.rope_theta: must be > 0, got {t.rope_theta}")
    if cfg.model.name_or_path is None and t.max_position_embeddings < cfg.env.max_context_tokens:
        out.append(f"model.tiny.max_position_embeddings: {t.max_position_embeddings} is shorter than "
                   f"env.max_context_tokens ({cfg.env.max_context_tokens})")
    return out


def _learner_problems(cfg: RunConfig) -> list[str]:
    from agent_r1.algorithms import AGG_MODES, KL_KINDS, POLICY_LOSSES

    lc = cfg.rl.learner
    out = _finite("rl.learner", lc)
    for key, known in (("policy_loss", sorted(POLICY_LOSSES)), ("loss_agg", AGG_MODES), ("kl_kind", KL_KINDS)):
        if getattr(lc, key) not in known:
            out.append(f"rl.learner.{key}: unknown {getattr(lc, key)!r}; known: {', '.join(known)}")
    if not lc.clip_low < 1:  # the ratio is clipped to [1 - clip_low, 1 + clip_high]
        out.append(f"rl.learner.clip_low: must be < 1, got {lc.clip_low}")
    if lc.dual_clip is not None and not lc.dual_clip > 1:
        out.append(f"rl.learner.dual_clip: must be > 1 (or null to disable), got {lc.dual_clip}")
    return out


class ConfigError(ValueError):
    pass


def _format(err: ValidationError, where: str) -> str:
    """One line per problem (one line in all when there is one), each naming its dotted key."""
    problems = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"])
        message = str(e["ctx"]["error"]) if e["type"] == "value_error" else e["msg"]
        problems += [f"{key}: {m}" if key else m for m in message.splitlines()]
    if len(problems) == 1:
        return f"invalid config {where}: {problems[0]}"
    return "\n".join([f"invalid config {where}:"] + [f"  {p}" for p in problems])


class _Loader(yaml.SafeLoader):
    """PyYAML's SafeLoader, except that a key given twice in one mapping is an error (PyYAML
    keeps the last silently)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value if isinstance(node, yaml.MappingNode) else ():
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base` may be overridden
                continue
            key = self.construct_object(key_node, deep=deep)
            try:
                twice = key in seen
            except TypeError:  # unhashable: SafeLoader's own error follows
                continue
            if twice:
                raise ConfigError(f"line {key_node.start_mark.line + 1}: key {key!r} is given twice")
            seen.add(key)
        return super().construct_mapping(node, deep)


def _yaml(text: str, where: str):
    try:
        return yaml.load(text, Loader=_Loader)
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f"line {mark.line + 1} column {mark.column + 1}: " if mark else ""
        raise ConfigError(f"{where}: {at}invalid YAML: {getattr(e, 'problem', None) or e}") from None


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
        _set_dotted(out, key.strip(), _yaml(raw, f"override {item!r}"))
    return out


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _kind(value) -> str:
    names = {dict: "a mapping", list: "a list", str: "a string", type(None): "nothing (null)"}
    return names.get(type(value), f"a {type(value).__name__}")


def _read_pipelines(path: Path) -> dict:
    """The ``pipelines`` mapping of a pipelines file, every pipeline's shape checked."""
    try:
        text = path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except UnicodeDecodeError as e:
        line = e.object[: e.start].count(b"\n") + 1
        raise ConfigError(f"{path}: line {line}: not UTF-8 text (byte 0x{e.object[e.start]:02x})") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot be read: {e.strerror or e}") from None
    doc = _yaml(text, str(path))
    if not isinstance(doc, dict) or set(doc) != {"pipelines"}:
        found = sorted(map(str, doc)) if isinstance(doc, dict) else _kind(doc)
        raise ConfigError(f"{path}: expected a mapping with one key, 'pipelines'; found {found}")
    pipelines = doc["pipelines"]
    if not isinstance(pipelines, dict) or not pipelines:
        raise ConfigError(f"{path}: 'pipelines' must map pipeline names to their keys; found {_kind(pipelines)}")
    for name, body in pipelines.items():
        if not isinstance(name, str):
            raise ConfigError(f"{path}: pipeline name {name!r} is not a string")
        if body is not None and not isinstance(body, dict):
            raise ConfigError(f"{path}: pipelines.{name}: must be a mapping of config keys; found {_kind(body)}")
        if body and not isinstance(body.get("extends", ""), str):
            raise ConfigError(f"{path}: pipelines.{name}.extends: must be one pipeline's name; found {_kind(body['extends'])}")
    return pipelines


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


def load_config(pipeline: str = "default", path: str | Path | None = None, overrides: dict | None = None) -> RunConfig:
    """Read pipeline ``pipeline`` from the pipelines file ``path``, apply overrides, validate.

    A given ``path`` must exist. ``path=None`` reads ./pipelines.yaml if there is one, and else
    gives the built-in defaults (pipeline "default" only).
    """
    if path is None and Path("pipelines.yaml").exists():
        path = "pipelines.yaml"
    raw: dict = {}
    if path is not None:
        path = Path(path)
        pipelines = _read_pipelines(path)
        if pipeline not in pipelines:
            raise ConfigError(f"{path}: no pipeline named {pipeline!r}; defined: {sorted(pipelines)}")
        raw = _resolve(pipelines, pipeline, path)
    elif pipeline != "default":
        raise ConfigError(f"no pipelines file (./pipelines.yaml) defines pipeline {pipeline!r}")
    raw = _merge({"name": pipeline, "output_dir": f"outputs/{pipeline}"}, raw)
    raw = _merge(raw, overrides or {})
    try:
        return RunConfig.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(_format(e, f"for pipeline {pipeline!r} ({path or 'built-in defaults'})")) from None
