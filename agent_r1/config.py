"""Typed configuration. Every key is declared here; an unknown key or a bad value is rejected
with a message naming it (pydantic ``extra="forbid"`` plus field constraints, finite floats, and
the checks of `RunConfig` that look across sections and at the registries), and so is a pipelines
file of the wrong shape, invalid YAML, or a key given twice."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PositiveInt, ValidationError, field_validator, model_validator

from agent_r1.algorithms import ADVANTAGES, AGG_MODES, DEMO_METHODS, KL_KINDS, POLICY_LOSSES, registered_name
from agent_r1.algorithms.demos import demo_settings, registered_demo_method
from agent_r1.data.code_tasks import KINDS as CODE_KINDS
from agent_r1.data.hotpotqa import HOTPOTQA_QTYPES
from agent_r1.data.synthetic import QTYPES, WorldConfig, name_capacity
from agent_r1.data.text_games import GamesConfig
from agent_r1.dicts import deep_merge
from agent_r1.learner.learner import LearnerConfig
from agent_r1.models import TinyModelConfig


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


_WORLD = WorldConfig()  # the synthetic world's defaults: declared once, in WorldConfig


class DataConfig(_Strict):
    source: Literal["synthetic", "hotpotqa", "jsonl", "code", "textworld"] = "synthetic"
    """Where the questions come from: a generated synthetic world, HotpotQA files, your own JSON-lines files (`data.path`), generated computation problems for the `code` environment (agent_r1/data/code_tasks.py), or TextWorld games made by tw-make for the `textworld` environment (`data.games`)."""
    path: str | None = None
    """hotpotqa: a folder with train.jsonl and dev.jsonl, or one .jsonl/.json file (a test split only); jsonl: a folder with test.jsonl, train.jsonl (task rows with the fields the environment's TASK_FIELDS names, passed to it as written; without train.jsonl the data serves evaluation alone) and, when a tool reads one, corpus.jsonl, or one .jsonl file of task rows (a test split only). In a config file, relative to that file."""
    # synthetic world: the fields (and defaults) of agent_r1.data.synthetic.WorldConfig
    seed: int = _WORLD.seed
    """Seed of the synthetic world (entities, facts, names, questions)."""
    n_films: int = Field(_WORLD.n_films, ge=4)
    """Films in the synthetic world (both sub-worlds together; at most what the name inventory can name: 1,000 with one-word names)."""
    n_directors: int = Field(_WORLD.n_directors, ge=2)
    """Directors in the synthetic world (each also gets a spouse)."""
    n_studios: int = Field(_WORLD.n_studios, ge=2)
    """Studios in the synthetic world."""
    n_cities: int = Field(_WORLD.n_cities, ge=2)
    """Cities the world's people and studios are placed in."""
    heldout_fraction: float = Field(_WORLD.heldout_fraction, gt=0, lt=1)
    """Share of every kind of entity held out for the test split (questions about unseen entities)."""
    questions_per_type: int | None = Field(_WORLD.questions_per_type, ge=1)  # None: one question per eligible entity
    """Cap on the questions of each question type per split; null: one per eligible entity. code: the training problems of each kind (null: 200)."""
    test_per_type: int = Field(40, ge=1)
    """code: the test problems of each kind (drawn apart from the training ones)."""
    test_range: Literal["train", "beyond"] = "train"
    """code: the ranges the test problems' parameters are drawn from: train (those of the training problems) or beyond (past them: longer numbers, later terms, larger bounds; the same questions and programs; train and val unchanged), a held-out variant beyond every demonstration."""
    name_words: Literal[1, 2] = _WORLD.name_words  # words per entity name (1: a bigger single-word inventory)
    """Words per made-up entity name (1: a larger inventory of single words)."""
    val_per_type: int = Field(_WORLD.val_per_type, ge=0)
    """The validation split (`val`, for choosing settings and the held-out curve, never the test split): synthetic: questions of each type from a small world of their own (its documents are searched by the val questions only: the train and test corpus is the same whatever this value); code: problems of each kind, drawn apart from train and test. Train and test are the same whatever its value; 0: no val split. textworld: `data.games.val_games`."""
    games: GamesConfig = GamesConfig()
    """textworld: the games tw-make generates (their seeds come from `data.seed`)."""

    def world(self) -> WorldConfig:
        return WorldConfig(**self.model_dump(exclude={"source", "path", "test_per_type", "test_range", "games"}))


class ModelConfig(_Strict):
    name_or_path: str | None = None
    """A packaged model (`smollm2-135m-instruct`), a local HF folder or a hub id; null: the tiny model built
    from `model.tiny`, its tokenizer trained on the task's text."""
    precision: Literal["auto", "fp32", "bf16"] = "auto"
    """Compute precision of every forward pass under autocast (weights and optimizer state stay fp32); auto:
    bf16 on a GPU that supports it; on a CPU, fp32 for the update (bf16 fwd+bwd measured slower, even with
    AVX512-BF16) and for the rollout bf16 where the CPU has native bf16 (AVX512-BF16 or AMX) and the model 10M
    parameters or more (SmolLM2 sampled 1.7-2.4x faster; its episodes then get rl.learner.off_policy_correction),
    else fp32. A run records what its update computed in (metrics/model.json, MLflow param `precision_computed`)."""
    tiny: TinyModelConfig = TinyModelConfig()
    """Shape of the tiny model built from scratch when `name_or_path` is null."""
    seed: int = 0
    """Seed of the tiny model's random initialisation."""

    @field_validator("name_or_path")
    @classmethod
    def _blank_is_none(cls, v: str | None) -> str | None:
        return v if v is None or v.strip() else None  # '' means no name: the tiny model, checked as such


class EnvConfig(_Strict):
    # the environment: a registered name (agent_r1.envs.ENVS: multihop_qa, naive_rag) or an
    # import path to a ToolEnv subclass, module:Class or path/to/file.py:Class
    name: str = "multihop_qa"
    """The environment: a registered name (multihop_qa, naive_rag, or one you register with @register_env) or an import path `module:Class` / `path/to/file.py:Class` (in a config file, relative to that file)."""
    # its tools (agent_r1/tools/registry.py): registered names or import paths, each a string or
    # a mapping {name: ..., <setting>: ...}; null: the environment's DEFAULT_TOOLS (QA: search)
    tools: list[str | dict[str, Any]] | None = None
    """The environment's tools: registered names or import paths, each a string or {name: ..., <setting>: ...}; null: the environment's DEFAULT_TOOLS (QA: search)."""
    kwargs: dict[str, Any] = {}  # more keyword arguments for the environment's constructor
    """More keyword arguments for the environment's constructor."""
    max_turns: int = Field(4, ge=1)
    """Assistant turns per episode before it is cut off."""
    max_format_errors: int | None = Field(2, ge=1)
    """An episode whose last this many turns were all format errors ends there (stop reason `format_errors`,
    scored as an episode without an answer), in training, evaluation and every baseline alike; null: only
    `max_turns` ends it."""
    max_context_tokens: int = Field(1024, ge=64)
    """Token budget of an episode's whole context (prompt, turns and observations)."""
    max_new_tokens: int = Field(48, ge=1)
    """Tokens the model may generate in one turn."""
    top_k: int = Field(2, ge=1)  # passages per search
    """Passages the search tool returns per query."""
    context: str = "full"
    """What the model sees each turn: `full` history, `sliding_window` (the prompt plus the last `window`
    turns), `summary` (older turns replaced by a summary once the history passes `context_kwargs.budget`
    tokens, default 512), or the import path of a ContextManager subclass (`module:Class`, `path/to/file.py:Class`)."""
    window: int = Field(2, ge=1)
    """Turns kept by the sliding_window context."""
    context_kwargs: dict[str, Any] = {}
    """More settings of the context manager's constructor (summary: budget, keep, and summarize: the import
    path of a function from the summarised turns' tool messages to text, or `policy`: the model writes it)."""
    reward_scheme: Literal["agent_r1", "answer_only", "answer_plus_format"] = "agent_r1"
    """How answer score and format combine into the outcome reward (agent_r1: ill-formed episodes score below
    any well-formed one)."""
    answer_metric: Literal["em", "f1"] = "em"
    """The answer score inside the reward: exact match or token F1."""
    retrieval_bonus: float = 0.2  # process reward per gold document first retrieved
    """Process reward for each gold document a search retrieves for the first time."""
    format_penalty: float = Field(0.0, le=0)
    """Reward added to a turn with a format error (0 or negative)."""
    # "default": the env's built-in instruction; null: no system turn (the tiny model learns the
    # protocol from demonstrations and saves the tokens); any other text is used as it is.
    system_prompt: str | None = None
    """System turn: `default` for the environment's built-in instruction, null for none, any other text as it
    is."""
    tools_in_prompt: bool = False  # list tool schemas in the system turn (hub chat models want this)
    """List the tool schemas in the system turn (hub chat models whose template renders tools want this)."""
    tool_timeout_s: float = Field(5.0, gt=0)
    """Seconds a tool call may run before it is stopped and answered with an error observation."""
    max_output_chars: int = Field(1200, ge=50)
    """Characters of a tool's output kept in the observation (the rest is truncated)."""


class PlateauConfig(_Strict):
    """SFT trained to its plateau on the validation curve (``sft.plateau``)."""

    enabled: bool = False
    """Train until the validation curve stops improving and keep its best checkpoint (the start of RL, RFT and the
    SFT-only control); the plateau's step, score and training time are recorded (metrics/sft_plateau.json, MLflow).
    Needs a val split and eval.curve_split: val. Off: `sft.epochs` passes."""
    eval_every_steps: int = Field(50, ge=1)
    """Optimizer steps between evaluations of the validation curve (and one at the last step): the same tasks as RL's
    held-out curve (`eval.curve_size` of the val split, greedy at `eval.temperature`), scored by its metric (won, em,
    else reward)."""
    patience: int = Field(3, ge=1)
    """Evaluations without a better score after the best one before training stops (at once when the score is 1, the
    most em or won can be); the best one's weights are the SFT checkpoint."""
    max_epochs: float = Field(10.0, gt=0)
    """Passes over the demonstrations at most (replaces `sft.epochs`; the learning-rate schedule spans them)."""


class SFTConfig(_Strict):
    # Which questions the oracle demonstrates: every question with one of `hops`, plus the
    # question types in `qtypes`. The default shows single searches and ONE two-hop
    # composition (film → studio); the other compositions are left for RL to discover.
    hops: list[PositiveInt] = [1]
    """Hop counts whose training questions the oracle demonstrates (where the data has `hops`; data without them is not filtered)."""
    qtypes: list[str] = ["studio_city_of_film"]
    """Further question types demonstrated in full (the default shows one two-hop composition, film → studio →
    city)."""
    # Question types demonstrated only this many times per source (world or training split):
    # scarce demonstrations that RL, with many more questions and a reward, has to make up for.
    scarce: dict[str, PositiveInt] = {}
    """Question types demonstrated only this many times per source (world or training split)."""
    worlds: int = Field(0, ge=0)  # >0: demonstrations from this many fresh worlds (see run.py)
    """0: demonstrations from the training split; k > 0: from k freshly generated synthetic worlds."""
    epochs: float = Field(1.5, gt=0)
    """Passes over the demonstrations."""
    batch_size: int = Field(8, ge=1)
    """Demonstrations per optimizer step."""
    lr: float = Field(3e-3, gt=0)
    """Peak learning rate of the cold start."""
    warmup_steps: int = Field(50, ge=0)
    """Optimizer steps of linear learning-rate warm-up."""
    checkpoint_every: int = Field(500, ge=1)  # optimizer steps between resumable states
    """Optimizer steps between resumable states (under outputs/<pipeline>/state/)."""
    plateau: PlateauConfig = PlateauConfig()
    """Imitation trained to its plateau: early stopping on the validation curve, keeping the best checkpoint."""


_SUFFIXES = (("_no_loss_mask", "loss_mask"), ("_no_adv_mask", "adv_mask"), ("_outcome", "process_rewards"))


def method_name(algorithm: str, loss_mask: bool = True, adv_mask: bool = True, process_rewards: bool = True,
                demos: str | None = None) -> str:
    """The name an RL method's results are reported under: the estimator's report name (gae →
    ``ppo``), with ``_no_loss_mask`` or ``_no_adv_mask`` for an ablated mask, ``_outcome`` for
    training on the final reward alone (``rl.process_rewards: false``), and ``+<demos>`` for a
    demonstration method (``rl.demos``)."""
    name = ADVANTAGES[algorithm].report_name if algorithm in ADVANTAGES else algorithm
    flags = {"loss_mask": loss_mask, "adv_mask": adv_mask, "process_rewards": process_rewards}
    return name + "".join(suffix for suffix, key in _SUFFIXES if not flags[key]) + (f"+{demos}" if demos else "")


def parse_method(method: str) -> dict:
    """Inverse of :func:`method_name`: ``"ppo_no_adv_mask"`` → ``{"algorithm": "gae", ...}``,
    ``"grpo_outcome+prefix"`` → ``{"algorithm": "grpo", "process_rewards": False, "demos": "prefix", ...}``."""
    method, _, demos = method.partition("+")
    flags = {"loss_mask": True, "adv_mask": True, "process_rewards": True, "demos": demos or None}
    for suffix, key in reversed(_SUFFIXES):
        if method.endswith(suffix):
            method, flags[key] = method[: -len(suffix)], False
    algorithm = {e.report_name: name for name, e in ADVANTAGES.items()}.get(method, method)
    return {"algorithm": algorithm, **flags}


RFT = "rft"  # rejection-sampling fine-tuning: a method of the RL loop with no advantage estimator


class CurriculumConfig(_Strict):
    enabled: bool = False
    """Draw the tasks whose recent episodes all succeeded or all failed (saturated: their group gives no
    signal) less often, by `saturated_weight`; off: every task equally often."""
    window: int = Field(2, ge=1)
    """A task is saturated when the episodes of its last `window` draws all succeeded or all failed."""
    saturated_weight: float = Field(0.1, gt=0, le=1)
    """Draw weight of a saturated task (the others weigh 1; tasks are drawn without replacement)."""
    success_reward: float = 1.0
    """An episode succeeds when its final reward reaches this value."""


class RLConfig(_Strict):
    algorithm: str = "grpo"  # an advantage estimator name (see agent_r1.algorithms)
    """Advantage estimator: a name registered in agent_r1.algorithms (grpo, gae, reinforce_pp, rloo, gigpo, ...) or the
    import path of a function registered with @register_advantage (`module:fn`, `path/to/file.py:fn`); or `rft`:
    rejection-sampling fine-tuning on episodes of the same tasks (see `rft_threshold`)."""

    @field_validator("algorithm")
    @classmethod
    def _algorithm(cls, v: str) -> str:
        return v if v == RFT else registered_name(v, "advantage")
    advantage_settings: dict[str, bool | int | float | str] = {}
    """The estimator's own settings (its keyword-only parameters), e.g. {whiten: false}."""
    # Which questions RL trains on: every training question with one of `hops`, plus the
    # question types in `qtypes` (e.g. hops: [] and qtypes: the compositions SFT never showed).
    hops: list[PositiveInt] = [2]
    """Hop counts of the training questions RL trains on (where the data has `hops`)."""
    qtypes: list[str] = []
    """Further question types RL trains on (e.g. compositions SFT never showed)."""
    iterations: int = Field(100, ge=0)
    """RL iterations (sample_episodes → build_train_batch → update_policy → end_iteration)."""
    tasks_per_iteration: int = Field(16, ge=1)
    """Questions sampled per iteration."""
    group_size: int = Field(8, ge=1)
    """Episodes sampled per question (the group of GRPO and RLOO)."""
    rollout_shards: int | None = Field(None, ge=1)
    """Rollout batches per iteration, each of whole groups and sampled from a seed of its own, spread over the ranks (null: one per rank, one batch in a single process). Fix it (a multiple of the ranks) and a run samples the same episodes on 1 rank or on N."""
    temperature: float = Field(1.0, gt=0)
    """Sampling temperature of the rollouts."""
    top_p: float = Field(1.0, gt=0, le=1)
    """Nucleus sampling cut-off of the rollouts."""
    gamma: float = Field(1.0, ge=0, le=1)
    """Discount factor of returns and GAE."""
    lam: float = Field(1.0, ge=0, le=1)
    """GAE lambda."""
    loss_mask: bool = True
    """Train only on the model's own tokens (false: the Agent-R1 ablation that also trains on observations)."""
    adv_mask: bool = True
    """Give advantages only to the model's own tokens (false: the ablation)."""
    process_rewards: bool = True
    """Train on the environment's step (process) rewards as well as the final reward; false: the final reward
    alone (the step rewards are still logged). A method named `<method>_outcome` sets it false."""
    dynamic_sampling: bool = False
    """DAPO's dynamic sampling, filtering form (Yu et al. 2025, arXiv:2503.14476): leave out of the update (loss mask
    0) the groups whose advantages are all 0, the groups whose episodes all got the same reward, so they do not dilute
    the loss's average; logged as dapo/zero_variance_groups (their share of every rank's groups). It is decided on
    every rank's counts: a batch of such groups alone, on every rank, is trained on whole. Refused for estimators
    whose equal-reward groups keep non-zero advantages (reinforce_pp, reinforce_pp_baseline, gae, step_gae; gigpo
    with step rewards or gamma < 1)."""
    overlong_filter: list[Literal["token_budget", "max_turns"]] = []
    """DAPO's overlong filtering: episodes that ended for one of these reasons (cut by the context budget, or by
    env.max_turns) get loss mask 0: no gradient of their own, while their reward still counts in their group's
    baseline; logged as dapo/overlong_episodes (their share)."""
    curriculum: CurriculumConfig = CurriculumConfig()
    """An adaptive task curriculum: tasks whose recent episodes all succeeded or all failed are drawn less often
    (curriculum/saturated_drawn: the share of the drawn tasks that were saturated)."""
    init_from: str | None = None
    """Where RL starts: null for this pipeline's SFT checkpoint, else a folder or a registry URI
    (models:/<name>@<alias>)."""
    checkpoint_every: int = Field(10, ge=1)  # iterations between resumable states
    """Iterations between resumable states."""
    rft_threshold: float = 1.0
    """Method `rft` (rejection-sampling fine-tuning): the final reward an episode needs to be kept and fine-tuned on
    (plain NLL on its action tokens); the other episodes are dropped (`rft/kept_fraction`)."""
    max_staleness: int = Field(0, ge=0)
    """η: how many updates a rollout may run ahead of the learner (rollout.engine: vllm, one process). 0: the
    synchronous loop (sample, update, sync the weights). η ≥ 1: the next iterations' episodes are sampled on the server
    while the learner updates; no episode an update trains on comes from a policy more than η updates older
    (rollout/staleness_mean, rollout/staleness_max), and the loss corrects for it (rl.learner.off_policy_correction)."""
    demos: str | None = None
    """Demonstrations inside RL (docs/algorithms.md): a method registered in agent_r1.algorithms.demos. prefix (R³,
    BREAD): a task whose group got no success gets episodes that start from the first steps of its demonstration (a
    prefix that is context, shortened as they succeed); member (LUFFY): the demonstration joins its group, off-policy,
    weighted by rl.learner.shaping_gamma; relift (ReLIFT): the demonstrations of failed groups go to an SFT buffer
    trained between RL updates. Or the import path of a class registered with @register_demo_method (`module:Cls`,
    `path/to/file.py:Cls`). Reported as <method>+<demos> (e.g. grpo+prefix); null: none."""

    @field_validator("demos")
    @classmethod
    def _demos(cls, v: str | None) -> str | None:
        return v if v is None else registered_demo_method(v)
    demo_settings: dict[str, bool | int | float | str] = {}
    """The demonstration method's own settings, e.g. {episodes: 2, shrink: 0.5} (prefix), {sft_every: 2} (relift)."""
    demo_pool: Literal["sft", "all"] = "sft"
    """Which tasks' demonstrations the demonstration method may use: sft, those the SFT cold start trained on
    (sft.hops, sft.qtypes, sft.scarce: the same as the SFT-only control, so the comparison with it is fair); all, the
    oracle's for every RL task. A task outside it gets none (demos/no_demo_share)."""
    learner: LearnerConfig = LearnerConfig()
    """The DeepSpeed learner's optimizer and loss settings."""

    @property
    def method(self) -> str:
        """The name this RL method's results are reported under (see :func:`method_name`)."""
        return method_name(self.algorithm, self.loss_mask, self.adv_mask, self.process_rewards, self.demos)


class VLLMConfig(_Strict):
    url: str | None = None
    """A vLLM server run elsewhere (e.g. http://gpu-host:8000, started from the folder `agent-r1 vllm-model`
    writes, with the command it prints); null: the pipeline starts one from .venv-vllm on a free port of
    127.0.0.1 and stops it at the end (on N ranks rank 0 starts it and every rank uses it)."""
    weights_dir: str | None = None
    """The folder the weight syncs are written to (created if missing; also the copy a started server starts
    from); the server reads them at the same path, so for a server run elsewhere (url) it must be a folder both
    machines see there (a shared filesystem); null: /dev/shm (memory), or the temp dir where there is none."""
    python: str = ".venv-vllm/bin/python"
    """The Python of the environment the server is started from (`make vllm` creates it); relative to the repo root."""
    max_model_len: int | None = Field(None, ge=16)
    """The started server's context length (prompt + new tokens); null: env.max_context_tokens (no episode's
    context grows past it) capped by the model's max_position_embeddings. A request's new tokens are capped
    to what is left of it."""
    kv_cache_gb: float = Field(2.0, gt=0)
    """KV cache memory of a CPU server in GiB (VLLM_CPU_KVCACHE_SPACE); on a GPU use extra_args (--gpu-memory-utilization)."""
    enforce_eager: bool = True
    """Skip vLLM's graph capture (--enforce-eager): the server starts in ~30 s instead of ~2 min on a CPU."""
    extra_args: list[str] = []
    """Further options of the vLLM server, e.g. [--gpu-memory-utilization, "0.5"]."""
    startup_timeout_s: float = Field(600.0, gt=0)
    """Seconds to wait for the started server's /health before failing with its last log lines."""
    request_timeout_s: float = Field(600.0, gt=0)
    """Seconds one completion request may take before the server counts as dead (restarted once)."""
    max_concurrency: int = Field(64, ge=1)
    """Completion requests in flight at once (one per context; the server batches them)."""


class RolloutConfig(_Strict):
    engine: Literal["hf", "vllm"] = "hf"
    """What samples the RL rollouts: hf (transformers in process, sharing the learner's weights) or vllm (a vLLM
    server, weights synced after every update; `make vllm` first)."""
    vllm: VLLMConfig = VLLMConfig()
    """The vLLM server (rollout.engine: vllm)."""


class EvalConfig(_Strict):
    split: Literal["train", "val", "test"] = "test"  # a split the prepare stage writes (data.ALL_SPLITS)
    """Split evaluated (one the prepare stage writes)."""
    every: int = Field(0, ge=0)
    """The held-out learning curve: every this many RL iterations, and at iteration 0 (the SFT start) and the last,
    evaluate the same `curve_size` tasks of `curve_split` greedily and log them to MLflow (`heldout/<metric>` against
    episodes seen, with `heldout/wall_s` and `heldout/iteration`); 0: no curve (nor on val when the data has no val
    split, e.g. HotpotQA files: the run says so)."""
    seed: int = 0
    """Draws the evaluated tasks (`max_per_hop` of each hop count) and the held-out curve's: the same for every run
    seed, so the seeds of a comparison are scored on the same tasks and an untrained baseline is scored once
    (`cache_baselines`)."""
    curve_size: int = Field(20, ge=1)
    """Tasks of the held-out curve (the same ones at every point, drawn with `eval.seed`)."""
    curve_split: Literal["train", "val", "test"] = "val"
    """Split the held-out curve evaluates (settings are chosen on val, never on test)."""
    hops: list[PositiveInt] = [1, 2, 3]
    """Hop counts evaluated, each reported as its own split (test_1hop, ...), where the data has `hops`."""
    max_per_hop: int = Field(100, ge=1)
    """Questions evaluated per hop count, where the data has hop counts (drawn with `eval.seed`; the evaluation
    says how many it leaves out); data without them is scored in full."""
    temperature: float = Field(0.0, ge=0)  # 0: greedy
    """Sampling temperature of evaluation (0: greedy)."""
    pass_k: list[PositiveInt] = []
    """pass@k beside the greedy scores, for these k (e.g. [1, 4, 16]): `pass_samples` episodes per evaluated task
    sampled at the training temperature (rl.temperature), scored with the unbiased estimator, reported as `pass@<k>`
    per method and hop count in eval.json. Costs `pass_samples` times the greedy evaluation of each model; []: off."""
    pass_samples: int | None = Field(None, ge=1)
    """Episodes sampled per task for pass@k (n ≥ every k); null: the largest of `pass_k`."""
    # Evaluated next to the trained agents: naive_rag (retrieve once with the question, answer
    # in one turn, with the base model: default_methods) and base_tool_call (the model before any training, with
    # the tools: for a hub model the instruct model itself, for the tiny model its random init).
    baselines: list[Literal["naive_rag", "base_tool_call", "no_tool", "random", "oracle"]] = ["naive_rag", "base_tool_call"]
    """Baselines evaluated next to the trained agents: naive_rag (one retrieval, then the answer),
    base_tool_call (the untrained model with the tools), no_tool (the untrained model answering
    directly, in one turn, with no tool), random (a uniformly random admissible turn each turn, for
    environments that list them: textworld) and oracle (the environment's oracle turns, the SFT
    demonstrations: textworld's walkthrough, the ceiling)."""
    cache_baselines: bool = True
    """Reuse an untrained baseline's score (every one of `baselines`) from the score cache, `$AGENT_R1_CACHE/scores`
    (default ~/.cache/agent-r1/scores), when the model's files, the data, the tasks and the settings that shape an
    episode are the same (docs/running.md); false: score them every time."""


class RegisterConfig(_Strict):
    model_name: str = "agent-r1"  # the MLflow registered model
    """The MLflow registered model the agent is registered as."""
    # The gate: the new agent becomes `champion` only if eval.json[split][method][metric] beats
    # the current champion's score on the same held-out tasks; otherwise it stays `challenger`.
    split: Literal["train", "test"] = "test"
    """eval.json split whose score decides promotion to champion."""
    metric: Literal["em", "f1", "reward"] = "em"
    """eval.json metric whose score decides promotion to champion."""


class HealthConfig(_Strict):
    """The alarms a run raises on itself (agent_r1/pipeline/health.py; docs/health.md). Each threshold's alarm is
    off when it is null."""

    patience: int = Field(3, ge=1)
    """Iterations in a row that a per-iteration signal (format errors, tool use, hung episodes) must be past its
    threshold before its alarm is raised."""
    format_error_rate: float | None = Field(0.5, ge=0, le=1)
    """Alarm `format_errors` (invalid tool calls in a row): the share of turns with a format error (bad call syntax,
    unknown tool, bad arguments; metric format_error_rate) is at least this, `patience` iterations in a row."""
    tool_use_drop: float | None = Field(0.5, gt=0, le=1)
    """Alarm `tool_collapse` (tool use collapsing): tool calls per episode (metric tool_calls) stay below this
    fraction of their mean over the first `baseline_iterations` iterations, `patience` iterations in a row. Not
    applicable where the episodes call no tool (an environment without tools, e.g. textworld): never raised there."""
    baseline_iterations: int = Field(3, ge=1)
    """The first iterations whose tool use is the level tool_use_drop compares with."""
    reward_gap: float | None = Field(0.2, gt=0)
    """Alarm `reward_divergence` (held-out and training reward moving apart): at a held-out point (metric
    heldout/reward), the training reward (reward_mean, averaged since the previous held-out point) minus the held-out
    reward has grown by more than this since the first held-out point, the start model's (against the first
    iteration's training reward). Without a held-out curve (eval.every) it is never raised."""
    hung_episode_rate: float | None = Field(0.1, ge=0, le=1)
    """Alarm `hung_episodes` (episodes that hang): the share of episodes in which a tool call was stopped by its
    timeout or which the environment ended with an error (e.g. a game engine that did not answer in time; metric
    hung_episodes) is at least this, `patience` iterations in a row."""


class RuntimeConfig(_Strict):
    threads: int | None = Field(None, ge=1)
    """Torch CPU threads of every stage (torch.set_num_threads); null: torch's default."""


class RunConfig(_Strict):
    name: str = "default"
    """Pipeline name (set from the pipelines.yaml entry)."""
    seed: int = 0
    """Seed of sampling, shuffling and task selection in every stage (but the evaluated and held-out curve tasks:
    `eval.seed`)."""
    output_dir: str = "outputs/default"
    """Folder every stage writes under (default outputs/<pipeline>)."""
    data: DataConfig = DataConfig()
    """The data set: synthetic world or HotpotQA."""
    model: ModelConfig = ModelConfig()
    """The policy model."""
    env: EnvConfig = EnvConfig()
    """The environment: turns, context, tools and reward."""
    sft: SFTConfig = SFTConfig()
    """The supervised cold start on oracle demonstrations."""
    rl: RLConfig = RLConfig()
    """End-to-end RL."""
    rollout: RolloutConfig = RolloutConfig()
    """The engine that samples the RL rollouts (hf or a vLLM server)."""
    eval: EvalConfig = EvalConfig()
    """Held-out evaluation."""
    registry: RegisterConfig = RegisterConfig()
    """MLflow model registration and the champion gate."""
    runtime: RuntimeConfig = RuntimeConfig()
    """How the process runs (threads); no effect on results beyond speed."""
    health: HealthConfig = HealthConfig()
    """The run's alarms on its own health (format errors, tool use, reward divergence, hung episodes) and their
    thresholds (docs/health.md); a resume does not compare them: changing one does not restart RL."""
    # A comparison pipeline trains several RL methods from the same SFT start with the same
    # budget and seed: names as reported (ppo, grpo, reinforce_pp, reinforce_pp_baseline, rloo,
    # <method>_no_loss_mask, <method>_no_adv_mask). Empty: only rl.algorithm.
    methods: list[str] = []
    """A comparison: RL methods trained from the same SFT start with the same budget, on the same tasks in every
    iteration (grpo, ppo, rloo, <method>_no_loss_mask, ...); empty: only rl.algorithm. The register stage registers (and
    the SFT-only control matches) rl.algorithm's method where it is listed, else the first."""

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
        if self.data.source == "synthetic":  # the world's counts fit its name inventory
            problems += [f"data.{k}: {getattr(self.data, k)} is more than the {n} names the inventory has with "
                         f"data.name_words={self.data.name_words}"
                         for k, n in name_capacity(self.data.name_words).items() if getattr(self.data, k) > n]
        if self.sft.worlds and self.data.source != "synthetic":
            problems.append("sft.worlds: fresh demonstration worlds exist only for data.source 'synthetic'")
        if self.data.source == "hotpotqa" and not self.data.path:
            problems.append("data.path: must name a HotpotQA file or folder when data.source is 'hotpotqa'")
        if self.data.source == "jsonl" and not self.data.path:
            problems.append("data.path: must name a folder of test/train/corpus .jsonl files, or one .jsonl file, when "
                            "data.source is 'jsonl'")
        if "textworld" in (self.data.source, self.env.name):
            from agent_r1.envs.text_game import INSTALL_HINT, textworld_available

            if not textworld_available():
                problems.append(f"{'data.source' if self.data.source == 'textworld' else 'env.name'}: {INSTALL_HINT}")
        if self.env.max_new_tokens >= self.env.max_context_tokens:
            problems.append("env.max_new_tokens must be smaller than env.max_context_tokens")
        problems += _vllm_problems(self) + _staleness_problems(self) + _val_problems(self)
        if self.eval.pass_k and self.eval.pass_samples and self.eval.pass_samples < max(self.eval.pass_k):
            problems.append(f"eval.pass_samples: {self.eval.pass_samples} samples per task cannot give pass@k for "
                            f"k={max(self.eval.pass_k)} (eval.pass_k); set it to at least {max(self.eval.pass_k)}")
        if problems:
            raise ValueError("\n".join(problems))
        return self

    @property
    def out(self) -> Path:
        return Path(self.output_dir)

    @property
    def curve_every(self) -> int:
        """``eval.every``, or 0 (no held-out curve) when ``eval.curve_split`` is val and the data
        has no val split (say HotpotQA files)."""
        return self.eval.every if self.eval.curve_split != "val" or has_val_split(self) else 0


def _estimator_problems(cfg: RunConfig) -> list[str]:
    """The estimator(s) exist, get the groups they need, and take the settings given."""
    if cfg.rl.algorithm not in ADVANTAGES and cfg.rl.algorithm != RFT:
        return [f"rl.algorithm: unknown estimator {cfg.rl.algorithm!r}; known: {sorted(ADVANTAGES)} (or {RFT})"]
    out = []
    algorithms = {cfg.rl.algorithm} | {parse_method(m)["algorithm"] for m in cfg.methods}
    for est in (ADVANTAGES[a] for a in sorted(algorithms) if a in ADVANTAGES):
        if est.needs_groups and cfg.rl.group_size < 2:
            out.append(f"rl.group_size: estimator {est.name!r} compares the samples of a task; "
                       f"it needs group_size >= 2, got {cfg.rl.group_size}")
        unknown = sorted(set(cfg.rl.advantage_settings) - set(est.settings))
        if unknown:
            out.append(f"rl.advantage_settings: estimator {est.name!r} has no setting(s) {unknown}; "
                       f"its settings: {sorted(est.settings) or 'none'}")
    if cfg.rl.dynamic_sampling and cfg.rl.group_size < 2:
        out.append(f"rl.dynamic_sampling: compares the episodes of a task; it needs group_size >= 2, got {cfg.rl.group_size}")
    if cfg.rl.dynamic_sampling:
        out += _dynamic_sampling_problems(cfg)
    return out + _demos_problems(cfg)


def _dynamic_sampling_problems(cfg: RunConfig) -> list[str]:
    """rl.dynamic_sampling leaves out the groups whose advantages are all 0: it needs estimators that give a group
    whose episodes all got the same reward 0 (``Estimator.zero_when_tied``), else such groups stay in."""
    runs = [(cfg.rl.algorithm, cfg.rl.process_rewards)] + [(f["algorithm"], f["process_rewards"])
                                                            for f in map(parse_method, cfg.methods)]
    out = []
    for name, process_rewards in dict.fromkeys(runs):
        if name not in ADVANTAGES:  # rft: no advantages
            continue
        tied = ADVANTAGES[name].zero_when_tied
        if tied == "never" or (tied == "outcome" and (process_rewards or cfg.rl.gamma < 1)):
            why = ("whitening over the batch or a critic" if tied == "never"
                   else "step rewards or rl.gamma < 1 make its step returns differ")
            out.append(f"rl.dynamic_sampling: estimator {name!r} gives a group whose episodes all got the same reward "
                       f"non-zero advantages ({why}), so it cannot leave such groups out; use grpo, grpo_no_std, rloo or "
                       f"gigpo_outcome with rl.gamma 1, or set rl.dynamic_sampling false")
    return out


def _demos_problems(cfg: RunConfig) -> list[str]:
    """``rl.demos`` (and each method's ``+<demos>``) names a registered method that takes ``rl.demo_settings``,
    with an estimator, in the synchronous loop."""
    named = {(m, parse_method(m)["demos"]) for m in cfg.methods} | {("rl.demos", cfg.rl.demos)}
    out = []
    for name in sorted({n for _, n in named if n}):
        if name not in DEMO_METHODS:
            where = "rl.demos" if ("rl.demos", name) in named else f"methods: {next(m for m, n in named if n == name)}"
            out.append(f"{where}: unknown demonstration method {name!r}; known: {', '.join(sorted(DEMO_METHODS))}")
            continue
        unknown = sorted(set(cfg.rl.demo_settings) - set(demo_settings(name)))
        if unknown:
            out.append(f"rl.demo_settings: demonstration method {name!r} has no setting(s) {unknown}; "
                       f"its settings: {sorted(demo_settings(name)) or 'none'}")
            continue
        try:  # the values, as the run will build the method
            DEMO_METHODS[name](lambda task_id: None, **cfg.rl.demo_settings)
        except (ValueError, TypeError) as e:
            out.append(str(e))
    if cfg.rl.demos and cfg.rl.algorithm == RFT:
        out.append(f"rl.demos: {cfg.rl.demos} puts demonstrations in the RL update; rl.algorithm {RFT} has none (use an "
                   "estimator, e.g. grpo)")
    if cfg.rl.demo_pool == "sft" and cfg.sft.worlds and any(n for _, n in named):
        out.append(f"rl.demo_pool: sft with sft.worlds={cfg.sft.worlds}: SFT's demonstrations come from fresh worlds, "
                   "none is of an RL task; use rl.demo_pool: all (or sft.worlds: 0)")
    if cfg.rl.demos and cfg.rl.max_staleness:
        out.append(f"rl.demos: {cfg.rl.demos} acts on each batch's results before the next is sampled; rollouts ahead "
                   "of the learner (rl.max_staleness ≥ 1) have not seen them; use rl.max_staleness: 0")
    return out


def _context_problems(cfg: RunConfig) -> list[str]:
    """``env.context`` names a context manager that takes ``env.context_kwargs``."""
    import inspect

    from agent_r1.context import get_context_manager

    try:
        cls = get_context_manager(cfg.env.context)
    except (ImportError, KeyError, TypeError) as e:
        return [f"env.context: {e.args[0] if e.args else e}"]
    params = inspect.signature(cls.__init__).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return []
    unknown = sorted(set(cfg.env.context_kwargs) - set(params) - {"self", "tokenizer", "tools"})
    return [f"env.context_kwargs: {cls.__name__} takes no setting {k!r}; it takes "
            f"{sorted(set(params) - {'self', 'tokenizer', 'tools'})}" for k in unknown]


def _choice_problems(cfg: RunConfig) -> list[str]:
    """Names that must be in a registry or a known set: estimators, methods, question types,
    the environment and its tools."""
    from agent_r1.envs.registry import config_problems

    out = config_problems(cfg.env) + _estimator_problems(cfg) + _context_problems(cfg)
    if not out and "naive_rag" in cfg.eval.baselines:
        from agent_r1.envs import MultiHopQAEnv, get_env

        if not issubclass(get_env(cfg.env.name), MultiHopQAEnv):
            out.append(f"eval.baselines: naive_rag is a multi-hop QA baseline; env.name {cfg.env.name!r} is not a "
                       "MultiHopQAEnv (leave naive_rag out of eval.baselines)")
    if not out and "random" in cfg.eval.baselines:
        from agent_r1.envs import get_env

        if not hasattr(get_env(cfg.env.name), "admissible_turns"):
            out.append(f"eval.baselines: random picks among the turns an environment lists (admissible_turns); "
                       f"env.name {cfg.env.name!r} lists none (leave random out of eval.baselines)")
    for m in cfg.methods:
        if parse_method(m)["algorithm"] not in (*ADVANTAGES, RFT):
            out.append(f"methods: unknown method {m!r}; known algorithms: {sorted(ADVANTAGES)} "
                       f"(ppo = gae) and {RFT}, optionally with _no_loss_mask or _no_adv_mask, and +<demos> "
                       f"({', '.join(sorted(DEMO_METHODS))})")
    if len(set(cfg.methods)) < len(cfg.methods):
        out.append(f"methods: a method is listed twice in {cfg.methods}")
    known = {"synthetic": tuple(QTYPES), "hotpotqa": HOTPOTQA_QTYPES, "code": tuple(CODE_KINDS)}.get(cfg.data.source)
    if known:  # jsonl: the data's own question types, checked when it is prepared
        for key, names in explicit_qtypes(cfg).items():
            unknown = sorted(set(names) - set(known))
            if unknown:
                out.append(f"{key}: unknown question type(s) {unknown} in {cfg.data.source} data; known: {', '.join(known)}")
    if cfg.data.source == "synthetic":
        full = sorted(q for q in cfg.sft.scarce if q in QTYPES and (q in cfg.sft.qtypes or QTYPES[q][0] in cfg.sft.hops))
        if full:
            out.append(f"sft.scarce: {full} already demonstrated in full by sft.hops or sft.qtypes")
    return out


def explicit_qtypes(cfg: RunConfig) -> dict[str, list[str]]:
    """The question-type filters a config sets (sft.qtypes, sft.scarce, rl.qtypes); the synthetic
    world's default (sft.qtypes: [studio_city_of_film]) applies only to data that has that type."""
    out = {}
    for section, key in ((cfg.sft, "qtypes"), (cfg.sft, "scarce"), (cfg.rl, "qtypes")):
        if key in section.model_fields_set or cfg.data.source == "synthetic":
            out[f"{'sft' if section is cfg.sft else 'rl'}.{key}"] = list(getattr(section, key))
    return out


def _hop_problems(cfg: RunConfig) -> list[str]:
    """Hop counts with no questions in the data source (they would fail, or select nothing, late).
    HotpotQA questions all have two hops: there a list fails only if it selects none."""
    if cfg.data.source == "synthetic":
        available = sorted({hops for hops, _, _ in QTYPES.values()})
        lists = {"sft.hops": cfg.sft.hops, "rl.hops": cfg.rl.hops, "eval.hops": cfg.eval.hops}
        bad = {key: sorted(set(hops) - set(available)) for key, hops in lists.items()}
    elif cfg.data.source == "hotpotqa":
        available, lists = [2], {"rl.hops": cfg.rl.hops, "eval.hops": cfg.eval.hops}
        bad = {key: sorted(hops) for key, hops in lists.items() if hops and 2 not in hops}
    else:  # jsonl: the hop counts are the data's own; code: none (hop filters select every task)
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


def _vllm_problems(cfg: RunConfig) -> list[str]:
    """An explicit ``rollout.vllm.max_model_len`` holds a whole episode (and, for the tiny model,
    fits its positions: vLLM refuses to start otherwise)."""
    n, t = cfg.rollout.vllm.max_model_len, cfg.model.tiny
    if cfg.rollout.engine != "vllm" or n is None:
        return []
    if n < cfg.env.max_context_tokens:
        return [f"rollout.vllm.max_model_len: {n} is shorter than env.max_context_tokens ({cfg.env.max_context_tokens})"]
    if cfg.model.name_or_path is None and n > t.max_position_embeddings:
        return [f"rollout.vllm.max_model_len: {n} is longer than the tiny model's positions "
                f"(model.tiny.max_position_embeddings: {t.max_position_embeddings}); null derives it"]
    return []


def has_val_split(cfg: RunConfig) -> bool:
    """The prepare stage writes a ``val`` split for this data."""
    d = cfg.data
    return {"synthetic": d.val_per_type, "code": d.val_per_type, "textworld": d.games.val_games}.get(d.source, 0) > 0


def _val_problems(cfg: RunConfig) -> list[str]:
    """eval.split names a split the data has (a held-out curve on a missing val split is off instead:
    :attr:`RunConfig.curve_every`); the SFT plateau is chosen on a val split; data.test_range draws
    the test split of the one source with parameter ranges (code)."""
    out = []
    if not has_val_split(cfg) and cfg.eval.split == "val":
        out.append(f"eval.split: val: the data has no val split ({val_hint(cfg)}), or choose another split")
    if cfg.sft.plateau.enabled:
        if not has_val_split(cfg):
            out.append(f"sft.plateau: is chosen on the val split, which the data has none of ({val_hint(cfg)})")
        if cfg.eval.curve_split != "val":
            out.append(f"sft.plateau: is chosen on the val split; eval.curve_split is {cfg.eval.curve_split!r} "
                       "(set val)")
    if cfg.data.test_range != "train" and cfg.data.source != "code":
        out.append(f"data.test_range: {cfg.data.test_range} draws the code task's test problems; data.source "
                   f"{cfg.data.source} has no parameter ranges (its held-out variants: eval.hops for QA, "
                   "data.games.test_quest_lengths for textworld)")
    return out


def val_hint(cfg: RunConfig) -> str:
    how = {"synthetic": "data.val_per_type", "code": "data.val_per_type", "textworld": "data.games.val_games"}
    return f"set {how[cfg.data.source]} > 0" if cfg.data.source in how else f"data.source {cfg.data.source} writes none"


def _staleness_problems(cfg: RunConfig) -> list[str]:
    """Rollouts ahead of the learner (``rl.max_staleness`` ≥ 1) run on a vLLM server, in one process."""
    if not cfg.rl.max_staleness:
        return []
    out = []
    if cfg.rollout.engine != "vllm":
        out.append("rl.max_staleness: rollouts ahead of the learner need rollout.engine: vllm (the hf engine samples "
                   "with the learner's own weights, which the update changes under it)")
    if cfg.rl.curriculum.enabled:
        out.append("rl.curriculum: the curriculum draws each iteration's tasks from the results before it, which "
                   "rollouts ahead of the learner (rl.max_staleness ≥ 1) have not seen; use rl.max_staleness: 0")
    if (cfg.rl.rollout_shards or 1) > 1:
        out.append("rl.rollout_shards: rollouts ahead of the learner (rl.max_staleness ≥ 1) sample each batch as one "
                   "shard; leave it null")
    if cfg.env.context_kwargs.get("summarize") == "policy":
        out.append("env.context_kwargs.summarize: 'policy' writes summaries with the learner's model, which the update "
                   "changes while rollouts run ahead (rl.max_staleness ≥ 1); use rl.max_staleness: 0 or another summarize")
    return out


def _learner_problems(cfg: RunConfig) -> list[str]:
    lc = cfg.rl.learner
    out = _finite("rl.learner", lc)
    if lc.temperature != cfg.rl.temperature:  # the log-probs of the update are those of the sampling distribution
        out.append(f"rl.learner.temperature: {lc.temperature} differs from rl.temperature ({cfg.rl.temperature}); "
                   "set both to the same value")
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
        if not all(part.strip() for part in key.split(".")):
            raise ConfigError(f"override {item!r}: {key.strip()!r} is not a key path (expected key.path=value)")
        _set_dotted(out, key.strip(), _yaml(raw, f"override {item!r}"))
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
            raise ConfigError(f"{path}: pipelines.{name}.extends: must be one pipeline's name; found {_kind(body['extends'])} "
                              "(a name, file.yaml:name or agent-r1:name)")
    return pipelines


PACKAGED = "agent-r1"  # `extends: agent-r1:tiny` names a pipeline of the packaged pipelines.yaml


def packaged_pipelines() -> Path:
    """The pipelines.yaml that comes with agent-r1: package data (agent_r1/pipelines.yaml) where
    it is installed so, else the repository's (an editable install)."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "pipelines.yaml", here.parent / "pipelines.yaml"):
        if candidate.is_file():
            return candidate.resolve()  # the link's target: its paths are relative to the repository
    raise ConfigError(f"extends {PACKAGED}:...: the packaged pipelines.yaml is not installed")


def _is_file_path(spec: str) -> bool:
    return spec.rpartition(":")[0].endswith(".py")


def _anchored(value: str, base: Path) -> str:
    """A relative path as seen from ``base`` (the config file's folder); absolute ones as they are."""
    return value if Path(value).is_absolute() else os.path.normpath(base / value)


def _anchor(body: dict, base: Path) -> dict:
    """A pipeline's paths made relative to its file's folder ``base``: ``data.path`` and the
    ``file.py:Name`` import paths of ``env.name``, ``env.tools``, ``env.context`` (and its
    ``summarize``), ``rl.algorithm`` and ``rl.learner.policy_loss``."""
    body = dict(body)

    def anchor_key(section: dict, key: str) -> dict:
        value = section.get(key)
        return section | {key: _anchored(value, base)} if isinstance(value, str) and _is_file_path(value) else section

    rl = body.get("rl")
    if isinstance(rl, dict):
        rl = anchor_key(rl, "algorithm")
        if isinstance(rl.get("learner"), dict):
            rl = rl | {"learner": anchor_key(rl["learner"], "policy_loss")}
        body["rl"] = rl
    data, env = body.get("data"), body.get("env")
    if isinstance(data, dict) and isinstance(data.get("path"), str) and data["path"]:
        body["data"] = data | {"path": _anchored(data["path"], base)}
    if isinstance(env, dict):
        env = dict(env)
        env = anchor_key(anchor_key(env, "name"), "context")
        if isinstance(env.get("context_kwargs"), dict):
            env["context_kwargs"] = anchor_key(env["context_kwargs"], "summarize")
        if isinstance(env.get("tools"), list):
            env["tools"] = [_anchored(t, base) if isinstance(t, str) and _is_file_path(t) else
                            t | {"name": _anchored(t["name"], base)} if isinstance(t, dict) and isinstance(t.get("name"), str)
                            and _is_file_path(t["name"]) else t for t in env["tools"]]
        body["env"] = env
    return body


def _resolve(pipelines: dict, name: str, path: Path, seen: tuple = ()) -> dict:
    """A pipeline's keys, on top of the pipeline it ``extends`` (deep merge): a pipeline of the
    same file (``name``), of another file (``other.yaml:name``, relative to this file) or a
    packaged one (``agent-r1:name``). Each file's paths are relative to that file."""
    if (path, name) in seen:
        chain = " -> ".join(n for _, n in seen + ((path, name),))
        raise ConfigError(f"{path}: pipelines extend each other in a cycle: {chain}")
    raw = _anchor(dict(pipelines[name] or {}), path.parent)
    base = raw.pop("extends", None)
    if base is None:
        return raw
    where, base_path, base_pipelines = base, path, pipelines
    if ":" in base:
        file, _, base = base.rpartition(":")
        base_path = packaged_pipelines() if file == PACKAGED else Path(_anchored(file, path.parent))
        base_pipelines = _read_pipelines(base_path)
    if base not in base_pipelines:
        packaged = sorted(_read_pipelines(packaged_pipelines()))
        hint = (f"; {base!r} is a packaged pipeline: write extends: {PACKAGED}:{base}" if base in packaged and where == base
                else f"; packaged pipelines ({PACKAGED}:<name>): {packaged}")
        raise ConfigError(f"{path}: pipeline {name!r} extends {where!r}, which is not defined; "
                          f"defined{'' if base_path == path else f' in {base_path}'}: {sorted(base_pipelines)}{hint}")
    parent = _resolve(base_pipelines, base, base_path, seen + ((path, name),))
    return deep_merge({k: v for k, v in parent.items() if k not in ("name", "output_dir")}, raw)


def load_config(pipeline: str = "default", path: str | Path | None = None, overrides: dict | None = None) -> RunConfig:
    """Read pipeline ``pipeline`` from the pipelines file ``path``, apply overrides, validate.

    A given ``path`` must exist. ``path=None`` reads ./pipelines.yaml if there is one, and else
    gives the built-in defaults (pipeline "default" only). In a file, ``data.path`` and the
    ``file.py:Name`` paths of ``env.name`` / ``env.tools`` are relative to that file's folder;
    in ``overrides``, to the working directory.
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
    raw = deep_merge({"name": pipeline, "output_dir": f"outputs/{pipeline}"}, raw)
    raw = deep_merge(raw, overrides or {})
    try:
        return RunConfig.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(_format(e, f"for pipeline {pipeline!r} ({path or 'built-in defaults'})")) from None
