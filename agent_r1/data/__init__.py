"""Dataset builders and readers: question tables and corpora stored as parquet.

A dataset directory holds ``corpus.parquet`` (``CORPUS_COLUMNS``) and one ``<split>.parquet``
per split (``QUESTION_COLUMNS``); ``load_split`` / ``load_corpus`` read and validate them. Bad
input data raises `DataError` (a ValueError) naming the file and the line, record or row.
"""

from agent_r1.data.hotpotqa import load_hotpotqa
from agent_r1.data.synthetic import (
    CORPUS_COLUMNS,
    DataError,
    QTYPES,
    QUESTION_COLUMNS,
    SPLITS,
    SyntheticWorld,
    WorldConfig,
    generate,
    load_corpus,
    load_split,
    validate_corpus,
    validate_questions,
    write_corpus,
    write_questions,
)

__all__ = [
    "CORPUS_COLUMNS",
    "DataError",
    "QTYPES",
    "QUESTION_COLUMNS",
    "SPLITS",
    "SyntheticWorld",
    "WorldConfig",
    "generate",
    "load_corpus",
    "load_hotpotqa",
    "load_split",
    "validate_corpus",
    "validate_questions",
    "write_corpus",
    "write_questions",
]
