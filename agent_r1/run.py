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

from agent_r1.config import ConfigError, RunConfig, explicit_qtypes
from agent_r1.context import PolicySummarizer, make_context_manager
from agent_r1.data import (ALL_SPLITS, SPLITS, DataError, load_hotpotqa, task_records, validate_questions, write_corpus,
                           write_tasks)
from agent_r1.data.code_tasks import CodeTaskConfig, write_code_tasks
from agent_r1.data.text_games import write_text_games
from agent_r1.data.synthetic import generate, load_corpus, load_split, split_corpus_name
from agent_r1.envs import MultiHopQAEnv, ToolEnv, env_tools, get_env, make_env_factory
from agent_r1.evaluate import summarize_by_hops
from agent_r1.learner.distributed import gathered, my_share
from agent_r1.models import build_tiny_model, load_model, train_tokenizer
from agent_r1.progress import Progress
from agent_r1.rollout import HFEngine, SamplingParams, run_episodes
from agent_r1.sft import demonstration, oracle_episode
from agent_r1.tools import SearchIndex, Tool, make_search_tool

log = logging.getLogger(__name__)


# ------------------------------------------------------------------------------ data
def prepare_data(cfg: RunConfig) -> Path:
    """Write corpus.parquet, train.parquet and test.parquet under ``<output_dir>/data``, and for the
    generated sources (synthetic, code, textworld) the validation split val.parquet
    (``data.val_per_type``, ``data.games.val_games``), disjoint from both.

    ``data.source: hotpotqa`` reads ``data.path``: a folder with ``train.jsonl`` and
    ``dev.jsonl`` (the dev questions become the test split) or one file (test split only, no
    training questions: no train.parquet, for evaluation alone). The corpus is every context paragraph of the loaded questions.

    ``data.source: jsonl`` reads a folder ``data.path`` with ``test.jsonl``, ``train.jsonl`` (task
    rows; without it no train.parquet, for evaluation alone) and, when a tool reads one,
    ``corpus.jsonl`` (CORPUS_COLUMNS); or one .jsonl file of task rows (the test split only). Each
    row reaches the environment's ``reset`` as written; it must have the fields the environment
    declares (``TASK_FIELDS``: a QA environment needs the QA fields, another only its own). Errors
    name the .jsonl file and its line, before any model loads.
    """
    out = cfg.out / "data"
    if cfg.data.source == "synthetic":
        generate(cfg.data.world()).write(out)
        return out
    if cfg.data.source == "code":
        d = cfg.data
        return write_code_tasks(CodeTaskConfig(seed=d.seed, n_train=d.questions_per_type or 200, n_test=d.test_per_type,
                                               n_val=d.val_per_type, test_range=d.test_range), out)
    if cfg.data.source == "textworld":
        return write_text_games(cfg.data.games, cfg.data.seed, out)
    if cfg.data.source == "jsonl":
        return _prepare_jsonl(Path(cfg.data.path), out, get_env(cfg.env.name))
    if not cfg.data.path:
        raise ValueError("data.path must name a HotpotQA file or folder when data.source is 'hotpotqa'")
    src = Path(cfg.data.path)
    files = {"train": src / "train.jsonl", "test": src / "dev.jsonl"} if src.is_dir() else {"test": src}
    missing = [str(f) for f in files.values() if not f.exists()]
    if missing:
        raise FileNotFoundError(f"data.path: not found: {', '.join(missing)}")
    folders = [str(f) for f in files.values() if f.is_dir()]
    if folders:
        raise DataError(f"data.path: {', '.join(folders)} is a folder, not a HotpotQA .jsonl/.json file")
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


def _read_jsonl(path: Path) -> tuple[list[dict], list[int]]:
    """The JSON objects of a .jsonl file and their line numbers (blank lines skipped)."""
    if not path.exists():
        raise FileNotFoundError(f"data.path: not found: {path}")
    if not path.is_file():
        raise DataError(f"{path}: is a folder, not a .jsonl file")
    rows, lines = [], []
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not UTF-8 text: {e.reason}") from None
    for i, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise DataError(f"{path}: line {i}: not JSON: {e.msg}") from None
            if not isinstance(rows[-1], dict):
                raise DataError(f"{path}: line {i}: expected a JSON object")
            lines.append(i)
    return rows, lines


def _prepare_jsonl(src: Path, out: Path, env_cls: type[ToolEnv]) -> Path:
    """The .jsonl of ``src`` → validated parquet under ``out``: a folder's test.jsonl, its
    train.jsonl where there is one, and its corpus.jsonl where there is one; or one file of task
    rows (the test split). The task rows are kept as written (agent_r1.data.write_tasks)."""
    if src.is_file():
        files = {"test": src}
    elif src.is_dir():
        files = {split: src / f"{split}.jsonl" for split in SPLITS if split == "test" or (src / f"{split}.jsonl").exists()}
    else:
        raise FileNotFoundError(f"data.path: not found: {src} (a folder of test.jsonl, train.jsonl and optionally "
                                "corpus.jsonl, or one .jsonl file of task rows)")
    tables = {split: _read_jsonl(f) for split, f in files.items()}
    ids = [{str(r["id"]) for r in rows if "id" in r} for rows, _ in tables.values()]
    if len(ids) > 1 and (shared := set.intersection(*ids)):
        raise DataError(f"{files['test']}: {len(shared)} task id(s) also in {files['train']}, "
                        f"e.g. {min(shared)!r}: a task must be in one split only")
    out.mkdir(parents=True, exist_ok=True)
    for stale in ("corpus.parquet", split_corpus_name("val"), *(f"{s}.parquet" for s in ALL_SPLITS)):
        (out / stale).unlink(missing_ok=True)  # what an earlier prepare into this folder left
    if src.is_dir() and (src / "corpus.jsonl").exists():
        rows, _ = _read_jsonl(src / "corpus.jsonl")
        write_corpus(pd.DataFrame(rows), out / "corpus.parquet")
    qa = issubclass(env_cls, MultiHopQAEnv)
    for split, (rows, lines) in tables.items():
        source = str(files[split])
        write_tasks(rows, out / f"{split}.parquet", split, tuple(env_cls.TASK_FIELDS), source, lines)
        if qa:  # the QA fields' types, named by the line they are on
            validate_questions(pd.DataFrame(task_records(pd.read_parquet(out / f"{split}.parquet"))), source, lines)
    return out


def _select(df: pd.DataFrame, hops: list[int], qtypes) -> list[pd.Series]:
    """The row selections of ``hops`` and ``qtypes`` where the data has those fields: every row
    when it has neither (a filter belongs to the data that has its field)."""
    has_hops, has_qtype = "hops" in df.columns, "qtype" in df.columns
    if has_hops:
        not_hops = ~df["hops"].isin(hops)
        return [df["hops"] == h for h in hops] + ([(df["qtype"] == q) & not_hops for q in qtypes] if has_qtype else [])
    if has_qtype and qtypes:
        return [df["qtype"] == q for q in qtypes]
    return [pd.Series(True, index=df.index)]


def tasks_for(df: pd.DataFrame, hops: list[int], limit: int | None = None, seed: int = 0, qtypes: list[str] = ()) -> list[dict]:
    """Rows with the given hop counts (or question types) as task dicts, at most ``limit`` per
    group. Data without ``hops`` (or ``qtype``) is not filtered by them (see :func:`_select`)."""
    parts = []
    for sel in _select(df, hops, qtypes):
        part = df[sel]
        if limit is not None and len(part) > limit:
            part = part.sample(n=limit, random_state=seed)
        parts.append(part)
    if not parts:
        return []
    return task_records(pd.concat(parts))


def eval_tasks(cfg: RunConfig, df: pd.DataFrame) -> list[dict]:
    """The tasks evaluation scores: where the data has hop counts, the rows with one of
    ``eval.hops``, at most ``eval.max_per_hop`` of each (drawn with ``eval.seed``); every row where
    it has none. Logs how many rows the settings leave out, and which."""
    if "hops" not in df.columns:
        return tasks_for(df, cfg.eval.hops)
    tasks = tasks_for(df, cfg.eval.hops, cfg.eval.max_per_hop, cfg.eval.seed)
    if len(tasks) < len(df):
        selected = df["hops"].isin(cfg.eval.hops)
        why = [f"eval.hops {cfg.eval.hops} selects {int(selected.sum())}"] if not selected.all() else []
        capped = {int(h): n for h, n in df[selected]["hops"].value_counts().items() if n > cfg.eval.max_per_hop}
        why += [f"eval.max_per_hop={cfg.eval.max_per_hop} caps hop count(s) " + ", ".join(
            f"{h} ({n} rows)" for h, n in sorted(capped.items()))] if capped else []
        log.info("evaluation: %d of the %d %s rows are scored (%s)", len(tasks), len(df), cfg.eval.split, "; ".join(why))
    return tasks


def _source(cfg: RunConfig, split: str) -> str:
    """Where a split's rows came from, as the user named it (for error messages)."""
    if cfg.data.source in ("synthetic", "code", "textworld"):
        return f"the {cfg.data.source} {split} split"
    src = Path(cfg.data.path)
    if cfg.data.source == "hotpotqa":
        return str(src / {"train": "train.jsonl", "test": "dev.jsonl"}[split]) if src.is_dir() else str(src)
    return str(src / f"{split}.jsonl") if src.is_dir() else str(src)


def selection_problems(cfg: RunConfig, data_dir: Path) -> list[str]:
    """What sft.hops/qtypes, rl.hops/qtypes and eval.hops select in the prepared data: a filter
    on a field the data has must name values it has, and select something."""
    out = []
    splits = {"sft": "train", "rl": "train", "eval": cfg.eval.split}
    for section, split in splits.items():
        path = data_dir / f"{split}.parquet"
        if not path.exists() or (section == "sft" and cfg.sft.worlds):
            continue
        df = load_split(data_dir, split)
        sec = getattr(cfg, section)
        where = _source(cfg, split)
        qtypes = [q for key, names in explicit_qtypes(cfg).items() if key.startswith(section) for q in names]
        if "qtype" in df.columns and qtypes:
            bad = sorted(set(qtypes) - set(df["qtype"]))
            if bad:
                out.append(f"{section}.qtypes: {where} has no tasks of question type(s) {bad}; "
                           f"its types: {sorted(set(df['qtype']))}")
        if not tasks_for(df, sec.hops, qtypes=list(getattr(sec, "qtypes", []))) and not (section == "sft" and cfg.sft.scarce):
            have = sorted(set(int(h) for h in df["hops"])) if "hops" in df.columns else "none"
            out.append(f"{section}.hops / {section}.qtypes: select no task of {where} "
                       f"(hops {sec.hops}, qtypes {list(getattr(sec, 'qtypes', []))}; its hop counts: {have})")
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
        return make_env_factory(self.cfg.env, self.tools, self.env_cls, self.cfg.out / "data")()

    def context(self):
        shown = self.cfg.env.tools_in_prompt and getattr(self.env_cls, "TOOLS_IN_PROMPT", True)
        tools = [t.schema for t in self.tools] if shown else None
        kw = {"window": self.cfg.env.window} if self.cfg.env.context == "sliding_window" else {}
        kw |= self.cfg.env.context_kwargs
        if kw.get("summarize") == "policy":  # the summary is written by the model this agent runs
            if self.model is None:
                raise ValueError("env.context_kwargs.summarize: 'policy' needs a model to write the summaries")
            kw["summarize"] = PolicySummarizer(self.model, self.tokenizer)
        return make_context_manager(self.cfg.env.context, self.tokenizer, tools, **kw)


def make_tools(cfg: RunConfig, data_dir: Path, split: str | None = None) -> list[Tool]:
    """The tools of ``env.tools`` (default: the environment's), built over the prepared data for the
    questions of ``split`` (the val split searches documents of its own; None: train and test)."""
    return env_tools(cfg.env, data_dir, split=split)


def initial_model(cfg: RunConfig, data_dir: Path, tools: list[Tool]) -> tuple[torch.nn.Module, object]:
    """The configured pretrained model, or a tiny model + a tokenizer trained on the task's text:
    the corpus, the training questions and a few oracle episodes (so the chat and tool-call
    syntax get their own merges)."""
    if cfg.model.name_or_path:
        return load_model(cfg.model.name_or_path)
    train = load_split(data_dir, "train")
    texts = []
    if (data_dir / "corpus.parquet").exists():
        corpus = load_corpus(data_dir)
        texts += list(corpus["text"]) + list(corpus["title"])
    texts += list(train["question"]) if "question" in train.columns else [
        s for task in task_records(train) for s in _strings(task)]
    env = make_env_factory(cfg.env, tools, data_dir=data_dir)()
    hops = sorted(train["hops"].unique()) if "hops" in train.columns else []
    for task in tasks_for(train, hops, limit=20, seed=cfg.seed):
        texts += [text + "".join(o["content"] for o in obs) for text, obs in oracle_episode(env, task)[1]]
    tokenizer = train_tokenizer(texts, vocab_size=cfg.model.tiny.vocab_size)
    return build_tiny_model(cfg.model.tiny, tokenizer, seed=cfg.model.seed), tokenizer


def _strings(value) -> list[str]:
    """The text in a task (its string values, nested ones too), for the tiny model's tokenizer."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    return [s for v in value for s in _strings(v)] if isinstance(value, list) else []


def sft_tasks(cfg: RunConfig, df: pd.DataFrame) -> list[dict]:
    """The tasks of ``df`` the SFT cold start demonstrates: those of ``sft.hops`` and
    ``sft.qtypes``, plus ``sft.scarce``'s few of each of its question types."""
    tasks = tasks_for(df, cfg.sft.hops, seed=cfg.seed, qtypes=cfg.sft.qtypes)
    for qtype, n in cfg.sft.scarce.items():
        tasks += tasks_for(df, [], limit=n, seed=cfg.seed, qtypes=[qtype])
    return tasks


def demo_pool(cfg: RunConfig, train_df: pd.DataFrame) -> set[str] | None:
    """The ids of the training tasks whose demonstrations RL's demonstration method may use
    (``rl.demo_pool``): ``sft``, the ones the SFT cold start trained on (:func:`sft_tasks`; none
    with ``sft.worlds``, whose demonstrations come from other worlds); ``all``: None, every task's."""
    if cfg.rl.demo_pool == "all":
        return None
    return set() if cfg.sft.worlds else {str(t["id"]) for t in sft_tasks(cfg, train_df)}


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
            world = generate(dataclasses.replace(cfg.data.world(), seed=cfg.data.seed + 1000 + k, val_per_type=0))
            search = make_search_tool(SearchIndex(world.corpus), top_k=cfg.env.top_k, timeout_s=cfg.env.tool_timeout_s,
                                      max_output_chars=cfg.env.max_output_chars)
            tools = [search if t.name == search.name else t for t in agent.tools]  # this world's search
            sources.append((world.questions, dataclasses.replace(agent, tools=tools)))
    demos, n_tasks = [], 0
    for df, source in sources:
        tasks = sft_tasks(cfg, df)
        n_tasks += len(tasks)
        env = source.make_env()
        demos += [d for t in tasks if (d := demonstration(env, t, context)) is not None]
    if not n_tasks:
        raise ConfigError(f"sft.hops / sft.qtypes: select no training task (hops {cfg.sft.hops}, qtypes {cfg.sft.qtypes})")
    if not demos:
        raise ValueError(f"the environment {cfg.env.name!r} gave no oracle demonstration for the sft.hops / sft.qtypes "
                         "questions: define its oracle_turns(task) for the SFT cold start")
    return demos


def evaluate_agent(agent: Agent, tasks: list[dict], progress: Progress | None = None, label: str = "eval") -> tuple[dict, list]:
    """Every task's episode and their metrics by hop count. With N ranks each runs its share of the
    tasks and every rank gets all the episodes back."""
    engine = HFEngine(agent.model, agent.tokenizer, precision=agent.cfg.model.precision)
    params = SamplingParams(temperature=agent.cfg.eval.temperature, max_new_tokens=agent.cfg.env.max_new_tokens)
    torch.manual_seed(agent.cfg.seed)
    with (progress or Progress.null()).task(label, total=None) as report:
        trajs = run_episodes(
            engine, agent.make_env, my_share(tasks), agent.context(), params,
            max_context_tokens=agent.cfg.env.max_context_tokens,
            on_turn=lambda turn, n: report(f"turn {turn + 1}: {n} episodes running"),
        )
    trajs = gathered(trajs)
    return summarize_by_hops(trajs, tasks), trajs


def curve_tasks(cfg: RunConfig) -> list[dict]:
    """The held-out curve's tasks: ``eval.curve_size`` of ``eval.curve_split``, drawn with
    ``eval.seed``: the same at every point of every method's curve, whatever the run's seed."""
    df = load_split(cfg.out / "data", cfg.eval.curve_split)
    return task_records(df.sample(n=min(cfg.eval.curve_size, len(df)), random_state=cfg.eval.seed).sort_index())


def curve_agent(agent: Agent, cfg: RunConfig) -> Agent:
    """``agent`` with its tools built for ``eval.curve_split``'s questions (the val split searches
    documents of its own)."""
    return dataclasses.replace(agent, tools=make_tools(cfg, cfg.out / "data", cfg.eval.curve_split))


def heldout_point(agent: Agent, tasks: list[dict], progress: Progress | None = None, label: str = "heldout") -> dict:
    """One point of a held-out curve: :func:`evaluate_agent` on ``tasks`` (greedy at
    ``eval.temperature``), its numeric metrics over all tasks with ``eval_s``, its time. Torch's
    random state is left as it was, so a run samples the same episodes with or without a curve."""
    import time

    t0 = time.perf_counter()
    with torch.random.fork_rng(devices=[torch.cuda.current_device()] if torch.cuda.is_available() else []):
        by_hops, _ = evaluate_agent(agent, tasks, progress, label)
    metrics = {k: v for k, v in by_hops["all"].items() if isinstance(v, (int, float)) and k != "n"}
    return metrics | {"eval_s": time.perf_counter() - t0}


# ------------------------------------------------------------------------------ the run
def flat_eval(by_hops: dict, split: str) -> dict:
    """``{split: metrics}`` plus one ``{split}_{k}hop`` entry per hop count."""
    out = {split: by_hops["all"]}
    out |= {f"{split}_{k}": v for k, v in by_hops.items() if k != "all"}
    return out
