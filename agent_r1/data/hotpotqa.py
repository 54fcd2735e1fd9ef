"""Load real HotpotQA questions into the project's question/corpus schema.

Two layouts are read, detected automatically per file and per record:

- the Hugging Face ``datasets`` export: JSON lines, ``id``, ``context = {"title": [...],
  "sentences": [[...], ...]}``, ``supporting_facts = {"title": [...], "sent_id": [...]}``;
- the original release: one JSON list, ``_id``, ``context = [[title, [sentences]], ...]``,
  ``supporting_facts = [[title, sent_id], ...]``.

Rows follow ``QUESTION_COLUMNS``: ``hops`` = 2, ``qtype`` = the HotpotQA ``type`` (bridge |
comparison), ``answers`` = [answer], ``gold_titles`` = ``search_chain`` = the unique supporting
titles in order of first appearance.

The corpus holds every context paragraph of the loaded questions (gold and distractors),
deduplicated by title (first occurrence wins), in order of first appearance; ``doc_id`` =
``hotpotqa-<n>``. ``text`` is the paragraph alone (its sentences joined as HotpotQA stores them:
each but the first carries its leading space), and ``title`` stays separate: the search tool
indexes and shows ``title`` and ``text`` together, so putting the title into ``text`` as well
would only repeat it. A paragraph without sentences gets its title as text.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from agent_r1.data.synthetic import CORPUS_COLUMNS, QUESTION_COLUMNS, DataError

__all__ = ["load_hotpotqa"]


HOTPOTQA_QTYPES = ("bridge", "comparison")  # the question types (``type``) HotpotQA has

def _decode(data: bytes, path: Path, first_line: int = 1) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = first_line + data[: e.start].count(b"\n")
        raise DataError(f"{path}: line {line}: not UTF-8 text (byte 0x{data[e.start]:02x})") from None


def _json(text: str, path: Path, line: int | None = None):
    """Parse JSON; an error names the file and the line (``line``: the line `text` is, in JSON lines)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise DataError(f"{path}: line {line or e.lineno}: invalid JSON: {e.msg}") from None
    except (ValueError, RecursionError) as e:  # nested ~1000 deep; an integer of over 4300 digits
        at = f": line {line}" if line else ""
        problem = "nested too deeply" if isinstance(e, RecursionError) else str(e)[:200]
        raise DataError(f"{path}{at}: invalid JSON: {problem}") from None


def _records(path: Path, limit: int | None):
    """Yield (where, record) pairs; ``where`` names the file and the line (or list index)."""
    with path.open("rb") as fh:
        head = fh.read(4096).lstrip()
    if head.startswith(b"["):  # original layout: one JSON list
        data = _json(_decode(path.read_bytes(), path), path)
        for i, rec in enumerate(data[:limit] if limit is not None else data):
            yield f"{path}: record {i}", rec
        return
    n = 0
    with path.open("rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            if limit is not None and n >= limit:
                return
            line = _decode(raw, path, lineno)
            if not line.strip():
                continue
            n += 1
            yield f"{path}: line {lineno}", _json(line, path, lineno)


def _paragraphs(context: Any, where: str) -> list[tuple[str, list[str]]]:
    if isinstance(context, dict):  # HF: {"title": [...], "sentences": [[...], ...]}
        titles, sentences = context.get("title"), context.get("sentences")
        if not isinstance(titles, list) or not isinstance(sentences, list) \
                or len(titles) != len(sentences):
            raise DataError(f"{where}: field 'context': expected title and sentences lists "
                             "of equal length")
        pairs = list(zip(titles, sentences))
    elif isinstance(context, list):  # original: [[title, [sentences]], ...]
        if not all(isinstance(p, list) and len(p) == 2 for p in context):
            raise DataError(f"{where}: field 'context': expected [title, [sentences]] pairs")
        pairs = [tuple(p) for p in context]
    else:
        raise DataError(f"{where}: field 'context': expected a dict or a list, "
                         f"got {type(context).__name__}")
    for title, sents in pairs:
        if not isinstance(title, str) or not title.strip() or not isinstance(sents, list) \
                or not all(isinstance(s, str) for s in sents):
            raise DataError(f"{where}: field 'context': bad paragraph {title!r}")
    return pairs


def _supporting_titles(facts: Any, where: str) -> list[str]:
    if isinstance(facts, dict):  # HF: {"title": [...], "sent_id": [...]}
        titles = facts.get("title")
    elif isinstance(facts, list) and all(isinstance(f, list) and len(f) == 2 for f in facts):
        titles = [f[0] for f in facts]  # original: [[title, sent_id], ...]
    else:
        titles = None
    if not isinstance(titles, list) or not titles or not all(isinstance(t, str) for t in titles):
        raise DataError(f"{where}: field 'supporting_facts': expected a non-empty list of "
                         "supporting titles")
    return list(dict.fromkeys(titles))


def _field(rec: dict, names: tuple[str, ...], where: str) -> str:
    for name in names:
        if name in rec:
            value = rec[name]
            if not isinstance(value, str) or not value.strip():
                raise DataError(f"{where}: field {name!r}: expected a non-empty string, "
                                 f"got {value!r}")
            return value
    raise DataError(f"{where}: missing field {names[0]!r}")


def load_hotpotqa(
    path: str | Path, split: str | None = None, limit: int | None = None
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Read HotpotQA questions from ``path``; return ``(questions, corpus)``.

    ``split`` fills the ``split`` column (default: the file name without its extension, e.g.
    "dev" for dev.jsonl); ``limit`` reads only the first ``limit`` questions. A malformed record
    raises ValueError naming the file and the line (JSON lines) or the record index (JSON list).
    """
    path = Path(path)
    split = split if split is not None else path.stem
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    rows: list[dict] = []
    docs: dict[str, str] = {}
    seen_ids: set[str] = set()
    for where, rec in _records(path, limit):
        if not isinstance(rec, dict):
            raise DataError(f"{where}: expected a JSON object, got {type(rec).__name__}")
        qid = _field(rec, ("id", "_id"), where)
        if qid in seen_ids:
            raise DataError(f"{where}: duplicate question id {qid!r}")
        seen_ids.add(qid)
        paragraphs = _paragraphs(rec.get("context"), where)
        gold = _supporting_titles(rec.get("supporting_facts"), where)
        missing = [t for t in gold if t not in {title for title, _ in paragraphs}]
        if missing:
            raise DataError(f"{where}: field 'supporting_facts': titles {missing} are not in "
                             "the context")
        rows.append({
            "id": qid,
            "question": _field(rec, ("question",), where),
            "answers": [_field(rec, ("answer",), where)],
            "hops": 2,
            "qtype": _field(rec, ("type",), where),
            "gold_titles": gold,
            "search_chain": list(gold),
            "split": split,
        })
        for title, sents in paragraphs:
            if title not in docs:
                docs[title] = "".join(sents).strip() or title
    if not rows and limit != 0:
        raise DataError(f"{path}: no questions in the file")
    questions = pd.DataFrame(rows, columns=list(QUESTION_COLUMNS)).astype({"hops": "int64"})
    corpus = pd.DataFrame(
        [{"doc_id": f"hotpotqa-{i:06d}", "title": t, "text": x}
         for i, (t, x) in enumerate(docs.items())],
        columns=list(CORPUS_COLUMNS),
    )
    return questions, corpus
