"""The pieces a run is made of: data, the agent (model + search + env + context), the tiny
model, oracle demonstrations, evaluation. The stages in :mod:`agent_r1.pipeline` string them
together."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch

from agent_r1.config import RunConfig
from agent_r1.context import make_context_manager
from agent_r1.data import load_hotpotqa
from agent_r1.data.synthetic import generate, load_corpus, load_split
from agent_r1.envs import MultiHopQAEnv
from agent_r1.envs.qa import DEFAULT_SYSTEM_PROMPT
from agent_r1.evaluate import summarize_by_hops
from agent_r1.models import build_tiny_model, load_model, train_tokenizer
from agent_r1.progress import Progress
from agent_r1.rollout import HFEngine, SamplingParams, run_episodes
from agent_r1.sft import demonstration
from agent_r1.tools import SearchIndex, make_search_tool

log = logging.getLogger(__name__)


# ------------------------------------------------------------------------------ data
def prepare_data(cfg: RunConfig) -> Path:
    """Write corpus.parquet, train.parquet and test.parquet under ``<output_dir>/data``.

    ``data.source: hotpotqa`` reads ``data.path``: a folder with ``train.jsonl`` and
    ``dev.jsonl`` (the dev questions become the test split) or one file (test split only, no
    training questions: no train.parquet, for evaluation alone). The corpus is every context paragraph of the loaded questions.
    """
    out = cfg.out / "data"
    if cfg.data.source == "synthetic":
        generate(cfg.data.world()).write(out)
        return out
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
    """Everything an episode needs: model, tokenizer, search tool, env factory, context manager."""

    model: torch.nn.Module
    tokenizer: object
    search: object
    cfg: RunConfig
    env_cls: type[MultiHopQAEnv] = MultiHopQAEnv  # NaiveRAGEnv for the Naive RAG baseline

    def make_env(self) -> MultiHopQAEnv:
        e = self.cfg.env
        return self.env_cls(
            search_tool=self.search,
            max_turns=e.max_turns,
            max_context_tokens=e.max_context_tokens,
            reward_scheme=e.reward_scheme,
            answer_metric=e.answer_metric,
            retrieval_bonus=e.retrieval_bonus,
            format_penalty=e.format_penalty,
            system_prompt=DEFAULT_SYSTEM_PROMPT if e.system_prompt == "default" else e.system_prompt,
        )

    def context(self):
        tools = [self.search.schema] if self.cfg.env.tools_in_prompt else None
        kw = {"window": self.cfg.env.window} if self.cfg.env.context == "sliding_window" else {}
        return make_context_manager(self.cfg.env.context, self.tokenizer, tools, **kw)


def make_search(cfg: RunConfig, data_dir: Path):
    index = SearchIndex(load_corpus(data_dir))
    return make_search_tool(index, top_k=cfg.env.top_k, timeout_s=cfg.env.tool_timeout_s, max_output_chars=cfg.env.max_output_chars)


def initial_model(cfg: RunConfig, data_dir: Path, search) -> tuple[torch.nn.Module, object]:
    """The configured pretrained model, or a tiny model + a tokenizer trained on the task's text."""
    if cfg.model.name_or_path:
        return load_model(cfg.model.name_or_path)
    corpus = load_corpus(data_dir)
    train = load_split(data_dir, "train")
    texts = list(corpus["text"]) + list(corpus["title"]) + list(train["question"])
    # A few rendered demonstrations so the chat and tool-call syntax get their own merges.
    from agent_r1.sft import oracle_turns

    for task in tasks_for(train, sorted(train["hops"].unique()), limit=20, seed=cfg.seed):
        texts += [text + "".join(o["content"] for o in obs) for text, obs in oracle_turns(task, search)]
    tokenizer = train_tokenizer(texts, vocab_size=cfg.model.tiny.vocab_size)
    return build_tiny_model(cfg.model.tiny, tokenizer, seed=cfg.model.seed), tokenizer


def oracle_demonstrations(cfg: RunConfig, agent: Agent, context, train_df: pd.DataFrame) -> list:
    """Tokenized oracle episodes for the cold start.

    With ``sft.worlds == 0`` they cover the training split. With ``sft.worlds = k`` they come
    from k freshly generated synthetic worlds (seeds disjoint from the data seed, each with its
    own search index): every fact is drawn afresh (with two-word names no entity even recurs;
    single-word names recur with other facts), so a small model cannot memorise its way
    through them, nor through RL's or evaluation's entities, and has to learn to read.
    """
    sources = [(train_df, agent.search)]
    if cfg.sft.worlds:
        sources = []
        for k in range(cfg.sft.worlds):
            world = generate(dataclasses.replace(cfg.data.world(), seed=cfg.data.seed + 1000 + k))
            tool = make_search_tool(SearchIndex(world.corpus), top_k=cfg.env.top_k, timeout_s=cfg.env.tool_timeout_s,
                                    max_output_chars=cfg.env.max_output_chars)
            sources.append((world.questions, tool))
    demos = []
    for df, tool in sources:
        tasks = tasks_for(df, cfg.sft.hops, seed=cfg.seed, qtypes=cfg.sft.qtypes)
        for qtype, n in cfg.sft.scarce.items():
            tasks += tasks_for(df, [], limit=n, seed=cfg.seed, qtypes=[qtype])
        for t in tasks:
            demos.append(demonstration(t, agent.make_env().reset(t), tool, context))
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
