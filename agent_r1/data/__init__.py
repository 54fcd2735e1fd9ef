"""Dataset builders and readers: question tables and corpora stored as parquet.

A dataset directory holds ``corpus.parquet`` (``CORPUS_COLUMNS``) and one ``<split>.parquet``
per split: ``QUESTION_COLUMNS`` (the QA data: synthetic, HotpotQA), or a user's own rows as
written (``write_tasks``, data.source jsonl; the environment's ``TASK_FIELDS`` are checked);
``load_split`` / ``load_corpus`` read and validate them, ``task_records`` gives the task dicts. Bad
input data raises `DataError` (a ValueError) naming the file and the line, record or row.
"""

from agent_r1.data.hotpotqa import load_hotpotqa
from agent_r1.data.synthetic import (
    CORPUS_COLUMNS,
    DataError,
    QTYPES,
    QUESTION_COLUMNS,
    ALL_SPLITS,
    SPLITS,
    TASK_COLUMN,
    SyntheticWorld,
    WorldConfig,
    generate,
    load_corpus,
    load_split,
    task_records,
    validate_corpus,
    validate_questions,
    write_corpus,
    write_questions,
    write_tasks,
)

__all__ = [
    "CORPUS_COLUMNS",
    "DataError",
    "QTYPES",
    "QUESTION_COLUMNS",
    "ALL_SPLITS",
    "SPLITS",
    "TASK_COLUMN",
    "SyntheticWorld",
    "WorldConfig",
    "generate",
    "load_corpus",
    "load_hotpotqa",
    "load_split",
    "task_records",
    "validate_corpus",
    "validate_questions",
    "write_corpus",
    "write_questions",
    "write_tasks",
]
