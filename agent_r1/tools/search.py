"""BM25 search over a corpus of titled passages (bm25s + PyStemmer), and the `search` tool."""

from __future__ import annotations

import os

# bm25s runs a JAX op at import when JAX is installed; on a GPU machine that makes JAX take 75%
# of the GPU's memory (seen: 62 GiB of an H100's 80 for a 1M-parameter run). Its top-k works on
# host arrays, so JAX stays on the CPU unless the user has chosen otherwise.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from pathlib import Path  # noqa: E402

import bm25s  # noqa: E402
import pandas as pd
import Stemmer

from agent_r1.tools.base import Tool, ToolOutput, tool
from agent_r1.tools.registry import register_tool


class SearchIndex:
    """A BM25 index over ``title + text`` of a corpus with columns ``doc_id, title, text``.

    Tokens are lower-cased, English stop words removed and Snowball-stemmed, for documents and
    queries alike.
    """

    def __init__(self, corpus: pd.DataFrame):
        missing = {"doc_id", "title", "text"} - set(corpus.columns)
        if missing:
            raise ValueError(f"corpus lacks columns {sorted(missing)}")
        if corpus.empty:
            raise ValueError("corpus is empty")
        self.docs: list[dict] = corpus[["doc_id", "title", "text"]].to_dict("records")
        self._stemmer = Stemmer.Stemmer("english")
        self._bm25 = bm25s.BM25()
        texts = [f"{d['title']}\n{d['text']}" for d in self.docs]
        self._bm25.index(self._tokenize(texts), show_progress=False)

    def _tokenize(self, texts: list[str]) -> list[list[str]]:
        return bm25s.tokenize(
            texts, stopwords="en", stemmer=self._stemmer, return_ids=False, show_progress=False
        )

    def search_batch(self, queries: list[str], k: int) -> list[list[dict]]:
        """Top-`k` hits for each query, best first, as dicts ``doc_id, title, text, score``.
        Documents sharing no term with the query (score 0) are left out."""
        k = min(k, len(self.docs))
        if k <= 0 or not queries:
            return [[] for _ in queries]
        ids, scores = self._bm25.retrieve(self._tokenize(queries), k=k, show_progress=False)
        return [
            [{**self.docs[i], "score": float(s)} for i, s in zip(row_ids, row_scores) if s > 0]
            for row_ids, row_scores in zip(ids.tolist(), scores.tolist())
        ]

    def search(self, query: str, k: int = 3) -> list[dict]:
        """Top-`k` hits for one query (see `search_batch`)."""
        return self.search_batch([query], k)[0]

    def recall_at_k(self, queries: list[str], gold_titles: list[list[str]], k: int) -> float:
        """Mean over queries of the fraction of their (non-empty) gold titles found in the top `k`."""
        if len(queries) != len(gold_titles):
            raise ValueError(f"{len(queries)} queries but {len(gold_titles)} gold title lists")
        if not queries or any(len(g) == 0 for g in gold_titles):
            raise ValueError("recall needs at least one query and a gold title for every query")
        hits = self.search_batch(queries, k)
        recalls = [
            len(set(gold) & {h["title"] for h in found}) / len(set(gold)) for gold, found in zip(gold_titles, hits)
        ]
        return sum(recalls) / len(recalls)


def make_search_tool(
    index: SearchIndex, top_k: int = 3, timeout_s: float = 10.0, max_output_chars: int = 2000
) -> Tool:
    """The `search` tool over `index`: returns the `top_k` passages as ``(i) Title: text`` lines,
    with ``info = {"titles": [...], "doc_ids": [...]}``."""

    def search(query: str) -> ToolOutput:
        """Search the knowledge base for passages relevant to a query.

        Args:
            query: Keywords or a question naming what to look up, e.g. an entity and the fact wanted.
        """
        hits = index.search(query, top_k)
        info = {"titles": [h["title"] for h in hits], "doc_ids": [h["doc_id"] for h in hits]}
        if not hits:
            return ToolOutput("No results found. Try other keywords.", info)
        return ToolOutput("\n".join(f"({i}) {h['title']}: {h['text']}" for i, h in enumerate(hits, 1)), info)

    # thread-safe: a read-only index whose top-k runs in numpy, fast enough for a thread (the
    # worker process that guards other tools would cost a fork per search)
    return tool(search, timeout_s=timeout_s, max_output_chars=max_output_chars, thread_safe=True)


@register_tool(name="search")
def search_tool(data_dir: Path, env, top_k: int | None = None, split: str | None = None) -> Tool:
    """The registered ``search`` tool: BM25 over ``<data_dir>/corpus.parquet`` (for ``split``, with
    the documents of its own where it has them: the synthetic val split's); ``top_k``, the timeout
    and the output cap default to ``env.top_k``, ``env.tool_timeout_s`` and ``env.max_output_chars``."""
    from agent_r1.data.synthetic import load_corpus

    return make_search_tool(SearchIndex(load_corpus(data_dir, split)), top_k=top_k or env.top_k,
                            timeout_s=env.tool_timeout_s, max_output_chars=env.max_output_chars)
