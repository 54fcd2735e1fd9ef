"""The pieces a run is made of: data, the agent (model + tools + env + context), the tiny
model, oracle demonstrations, evaluation. The stages in :mod:`agent_r1.pipeline` string them
together."""

from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch

from agent_r1.config import RunConfig
from agent_r1.context import make_context_manager
from agent_r1.data import SPLITS, DataError, load_hotpotqa, write_corpus, write_questions
from agent_r1.data.synthetic import generate, load_corpus, load_split
from agent_r1.envs import ToolEnv, env_tools, make_env_factory
from agent_r1.evaluate import summarize_by_hops
from agent_r1.models import build_tiny_model, load_model, train_tokenizer
from agent_r1.progress import Progress
from agent_r1.rollout import HFEngine, SamplingParams, run_episodes
from agent_r1.sft import demonstration, oracle_episode
from agent_r1.tools import SearchIndex, Tool, make_search_tool

log = logging.getLogger(__name__)


# ------------------------------------------------------------------------------ data
def prepare_data(cfg: RunConfig) -> Path:
    """Write corpus.parquet, train.parquet and test.parquet under ``<output_dir>/data``.

    ``data.source: hotpotqa`` reads ``data.path``: a folder with ``train.jsonl`` and
    ``dev.jsonl`` (the dev questions become the test split) or one file (test split only, no
    training questions: no train.parquet, for evaluation alone). The corpus is every context paragraph of the loaded questions.

    ``data.source: jsonl`` reads a folder ``data.path`` with ``corpus.jsonl``, ``train.jsonl``
    and ``test.jsonl`` in agent_r1.data's schema (CORPUS_COLUMNS, QUESTION_COLUMNS; ``split``
    may be left out), e.g. a custom task's data (examples/city_facts).
    """
    out = cfg.out / "data"
    if cfg.data.source == "synthetic":
        generate(cfg.data.world()).write(out)
        return out
    if cfg.data.source == "jsonl":
        return _prepare_jsonl(Path(cfg.data.path), out)
    if not cfg.data.path:
        raise ValueError("data.path must name a HotpotQA file or folder when data.source is 'hotpotqa'")
    src = Path(cfg.data.path)
    files = {"train": src / "train.jsonl", "test": src / "dev.jsonl"} if src.is_dir() else {"test": src}
    missing = [str(f) for f in files.values() if not f.exists()]
    if missing:
        raise FileNotFoundError(f"data.path: not found: {', '.join(missing)}")
    questions, corpora = {}, []
    for split, f in files.items():
        questions[split], corpus = load_hotpotqa(f, split=split)
        corpora.append(corpus)
    corpus = pd.concat(corpora).drop_duplicates("title").reset_index(drop=True)
    corpus["doc_id"] = [f"hotpotqa-{i:06d}" for i in range(len(corpus))]
    out.mkdir(parents=True, exist_ok=True)
    corpus.to_parquet(out / "corpus.parquet", index=False)
    for split, df in questions.items():
        df.to_parquet(out / f"{split}.parquet", index=False)
    return out


def _read_jsonl(path: Path) -> pd.DataFrame:
    if not path.exists():
        raise FileNotFoundError(f"data.path: not found: {path}")
    rows = []
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise DataError(f"{path}: line {i}: not JSON: {e.msg}") from None
            if not isinstance(rows[-1], dict):
                raise DataError(f"{path}: line {i}: expected a JSON object")
    return pd.DataFrame(rows)


def _prepare_jsonl(src: Path, out: Path) -> Path:
    """corpus/train/test .jsonl of ``src`` → validated parquet under ``out``."""
    tables = {name: _read_jsonl(src / f"{name}.jsonl") for name in ("corpus", *SPLITS)}
    out.mkdir(parents=True, exist_ok=True)
    write_corpus(tables.pop("corpus"), out / "corpus.parquet")
    for split, df in tables.items():
        write_questions(df.assign(split=split) if "split" not in df else df, out / f"{split}.parquet")
    return out


def tasks_for(df: pd.DataFrame, hops: list[int], limit: int | None = None, seed: int = 0, qtypes: list[str] = ()) -> list[dict]:
    """Rows with the given hop counts (or question types) as task dicts, at most ``limit`` per group."""
    groups = [df["hops"] == h for h in hops] + [(df["qtype"] == q) & ~df["hops"].isin(hops) for q in qtypes]
    parts = []
    for sel in groups:
        part = df[sel]
        if limit is not None and len(part) > limit:
            part = part.sample(n=limit, random_state=seed)
        parts.append(part)
    if not parts:
        return []
    out = pd.concat(parts).to_dict("records")
    for t in out:
        for k in ("answers", "gold_titles", "search_chain"):
            if k in t:
                t[k] = list(t[k])
    return out


# ------------------------------------------------------------------------------ agent parts
@dataclass
class Agent:
    """Everything an episode needs: model, tokenizer, the tools, an environment factory, a
    context manager. The environment is the config's ``env.name`` unless ``env_cls`` says
    otherwise (NaiveRAGEnv for the Naive RAG baseline)."""

    model: torch.nn.Module
    tokenizer: object
    tools: list[Tool]
    cfg: RunConfig
    env_cls: type[ToolEnv] | None = None

    def make_env(self) -> ToolEnv:
        return make_env_factory(self.cfg.env, self.tools, self.env_cls)()

    def context(self):
        shown = self.cfg.env.tools_in_prompt and getattr(self.env_cls, "TOOLS_IN_PROMPT", True)
        tools = [t.schema for t in self.tools] if shown else None
        kw = {"window": self.cfg.env.window} if self.cfg.env.context == "sliding_window" else {}
        return make_context_manager(self.cfg.env.context, self.tokenizer, tools, **kw | self.cfg.env.context_kwargs)


def make_tools(cfg: RunConfig, data_dir: Path) -> list[Tool]:
    """The tools of ``env.tools`` (default: the environment's), built over the prepared data."""
    return env_tools(cfg.env, data_dir)


def initial_model(cfg: RunConfig, data_dir: Path, tools: list[Tool]) -> tuple[torch.nn.Module, object]:
    """The configured pretrained model, or a tiny model + a tokenizer trained on the task's text:
    the corpus, the training questions and a few oracle episodes (so the chat and tool-call
    syntax get their own merges)."""
    if cfg.model.name_or_path:
        return load_model(cfg.model.name_or_path)
    corpus = load_corpus(data_dir)
    train = load_split(data_dir, "train")
    texts = list(corpus["text"]) + list(corpus["title"]) + list(train["question"])
    env = make_env_factory(cfg.env, tools)()
    for task in tasks_for(train, sorted(train["hops"].unique()), limit=20, seed=cfg.seed):
        texts += [text + "".join(o["content"] for o in obs) for text, obs in oracle_episode(env, task)[1]]
    tokenizer = train_tokenizer(texts, vocab_size=cfg.model.tiny.vocab_size)
    return build_tiny_model(cfg.model.tiny, tokenizer, seed=cfg.model.seed), tokenizer


def oracle_demonstrations(cfg: RunConfig, agent: Agent, context, train_df: pd.DataFrame) -> list:
    """Tokenized oracle episodes for the cold start (the environment's ``oracle_turns``).

    With ``sft.worlds == 0`` they cover the training split. With ``sft.worlds = k`` they come
    from k freshly generated synthetic worlds (seeds disjoint from the data seed, each with its
    own search index): every fact is drawn afresh (with two-word names no entity even recurs;
    single-word names recur with other facts), so a small model cannot memorise its way
    through them, nor through RL's or evaluation's entities, and has to learn to read.
    Raises when the environment gives no demonstration at all.
    """
    sources = [(train_df, agent)]
    if cfg.sft.worlds:
        sources = []
        for k in range(cfg.sft.worlds):
            world = generate(dataclasses.replace(cfg.data.world(), seed=cfg.data.seed + 1000 + k))
            search = make_search_tool(SearchIndex(world.corpus), top_k=cfg.env.top_k, timeout_s=cfg.env.tool_timeout_s,
                                      max_output_chars=cfg.env.max_output_chars)
            tools = [search if t.name == search.name else t for t in agent.tools]  # this world's search
            sources.append((world.questions, dataclasses.replace(agent, tools=tools)))
    demos = []
    for df, source in sources:
        tasks = tasks_for(df, cfg.sft.hops, seed=cfg.seed, qtypes=cfg.sft.qtypes)
        for qtype, n in cfg.sft.scarce.items():
            tasks += tasks_for(df, [], limit=n, seed=cfg.seed, qtypes=[qtype])
        env = source.make_env()
        demos += [d for t in tasks if (d := demonstration(env, t, context)) is not None]
    if not demos:
        raise ValueError(f"the environment {cfg.env.name!r} gave no oracle demonstration for the sft.hops / sft.qtypes "
                         "questions: define its oracle_turns(task) for the SFT cold start")
    return demos


def evaluate_agent(agent: Agent, tasks: list[dict], progress: Progress | None = None, label: str = "eval") -> tuple[dict, list]:
    engine = HFEngine(agent.model, agent.tokenizer, precision=agent.cfg.model.precision)
    params = SamplingParams(temperature=agent.cfg.eval.temperature, max_new_tokens=agent.cfg.env.max_new_tokens)
    torch.manual_seed(agent.cfg.seed)
    with (progress or Progress.null()).task(label, total=None) as report:
        trajs = run_episodes(
            engine, agent.make_env, tasks, agent.context(), params,
            max_context_tokens=agent.cfg.env.max_context_tokens,
            on_turn=lambda turn, n: report(f"turn {turn + 1}: {n} episodes running"),
        )
    return summarize_by_hops(trajs, tasks), trajs


# ------------------------------------------------------------------------------ the run
def flat_eval(by_hops: dict, split: str) -> dict:
    """``{split: metrics}`` plus one ``{split}_{k}hop`` entry per hop count."""
    out = {split: by_hops["all"]}
    out |= {f"{split}_{k}": v for k, v in by_hops.items() if k != "all"}
    return out
