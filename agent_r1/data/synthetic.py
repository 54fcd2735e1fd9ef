"""A synthetic world for multi-hop QA whose answers can only be found by searching.

Every name (people, films, studios, cities) is made of random syllables, so no language model
knows the facts: an agent must search the corpus, read a document, and follow the entity it
names to the next document. The world has

- cities (no document of their own; they are only answers),
- studios (``studio.city``, distractor founding year),
- directors (``person.birthplace``, ``person.spouse``, distractor birth year) and their spouses
  (extra people who are not directors; marriage is symmetric),
- films (``film.director``, ``film.studio``, distractor year),

and exactly one short document per film, person and studio. Entities are generated as two
disjoint sub-worlds that share only the cities: ``train`` questions ask about the first,
``test`` questions about the second (held out), and the corpus holds the documents of both. With
``val_per_type`` > 0 a small third sub-world, generated after the other two (so their questions
and the corpus are the same with or without it), gives the ``val`` questions: for choosing
settings, never on test. Its documents are apart (``val_corpus.parquet``): the val questions
search them beside the corpus, the train and test questions never see them.

Question templates (``QTYPES``) range from 1 to 3 hops; each row carries the chain of entity
names an oracle searches (``search_chain``) and the titles of the documents on that path
(``gold_titles``; in this world both lists are the same).

On-disk layout written by ``SyntheticWorld.write`` and read back by ``load_split`` /
``load_corpus`` (the same layout serves any QA dataset, e.g. HotpotQA)::

    corpus.parquet   doc_id, title, text       (unique doc_id and title; retrievers use both)
    train.parquet    QUESTION_COLUMNS
    test.parquet     QUESTION_COLUMNS
    val.parquet      QUESTION_COLUMNS          (with val_per_type > 0)
    val_corpus.parquet                         (with val_per_type > 0: the val sub-world's documents)
    world.json       the config and the counts
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

__all__ = [
    "CORPUS_COLUMNS",
    "DataError",
    "QTYPES",
    "QUESTION_COLUMNS",
    "SPLITS",
    "ALL_SPLITS",
    "SyntheticWorld",
    "WorldConfig",
    "generate",
    "load_corpus",
    "load_split",
    "validate_corpus",
    "validate_questions",
    "write_corpus",
    "write_questions",
]

# --------------------------------------------------------------------------- schema

QUESTION_COLUMNS = (
    "id", "question", "answers", "hops", "qtype", "gold_titles", "search_chain", "split"
)
CORPUS_COLUMNS = ("doc_id", "title", "text")

_QUESTION_SCHEMA = pa.schema([
    ("id", pa.string()),
    ("question", pa.string()),
    ("answers", pa.list_(pa.string())),
    ("hops", pa.int64()),
    ("qtype", pa.string()),
    ("gold_titles", pa.list_(pa.string())),
    ("search_chain", pa.list_(pa.string())),
    ("split", pa.string()),
])
_CORPUS_SCHEMA = pa.schema([("doc_id", pa.string()), ("title", pa.string()), ("text", pa.string())])

SPLITS = ("train", "test")  # what every data source has
ALL_SPLITS = ("train", "val", "test")  # with the validation split the generated sources write

# qtype -> (hops, question template, relation path from the subject). The subject kind is the
# first relation's owner; each relation but the last leads to the next document to search.
QTYPES: dict[str, tuple[int, str, tuple[str, ...]]] = {
    "director": (1, "Who directed {}?", ("director",)),
    "birthplace": (1, "Where was {} born?", ("birthplace",)),
    "spouse": (1, "Who is {} married to?", ("spouse",)),
    "studio": (1, "Which studio produced {}?", ("studio",)),
    "studio_city": (1, "Where is {} based?", ("city",)),
    "director_birthplace": (2, "Where was the director of {} born?", ("director", "birthplace")),
    "director_spouse": (2, "Who is the director of {} married to?", ("director", "spouse")),
    "studio_city_of_film": (2, "Where is the studio that produced {} based?", ("studio", "city")),
    "director_spouse_birthplace": (
        3, "Where was the spouse of the director of {} born?", ("director", "spouse", "birthplace")
    ),
}
_SUBJECT_KIND = {"director": "film", "studio": "film", "birthplace": "person", "spouse": "person",
                 "city": "studio"}  # first relation -> the kind of entity the question names
_TARGET_KIND = {"director": "person", "spouse": "person", "studio": "studio"}  # others: a city


# --------------------------------------------------------------------------- config & world


@dataclass(frozen=True)
class WorldConfig:
    """Sizes of the synthetic world.

    ``n_films``, ``n_directors`` and ``n_studios`` count both sub-worlds together;
    ``heldout_fraction`` of each goes to the held-out (test) sub-world. Every director gets a
    spouse (so people = 2 * n_directors). ``questions_per_type`` caps the questions of each
    template per split: None = one question per eligible subject entity, an int = that many
    (sampled) per template, a dict = {qtype: cap} (templates not named get none).
    """

    seed: int = 0
    n_films: int = 320
    n_directors: int = 120
    n_studios: int = 20
    n_cities: int = 24
    heldout_fraction: float = 0.25
    questions_per_type: int | dict[str, int] | None = None
    name_words: int = 2  # words per entity name: 2 (combinations) or 1 (single words)
    val_per_type: int = 0  # validation questions per template, from a small third sub-world (0: none)

    def __post_init__(self) -> None:
        if self.name_words not in _INVENTORY_SIZES:
            raise ValueError(f"WorldConfig.name_words must be 1 or 2, got {self.name_words}")
        # films, directors and studios: at least one in each sub-world
        for name, least in (("n_films", 2), ("n_directors", 2), ("n_studios", 2), ("n_cities", 1)):
            value = getattr(self, name)
            if value < least:
                raise ValueError(f"WorldConfig.{name} must be >= {least}, got {value}")
        if not 0.0 < self.heldout_fraction < 1.0:
            raise ValueError(
                f"WorldConfig.heldout_fraction must be in (0, 1), got {self.heldout_fraction}"
            )
        q = self.questions_per_type
        if isinstance(q, dict):
            unknown = sorted(set(q) - set(QTYPES))
            if unknown:
                raise ValueError(
                    f"WorldConfig.questions_per_type: unknown qtype(s) {unknown}; "
                    f"valid: {', '.join(QTYPES)}"
                )
            if any(v < 0 for v in q.values()):
                raise ValueError("WorldConfig.questions_per_type: caps must be >= 0")
        elif q is not None and q < 0:
            raise ValueError("WorldConfig.questions_per_type must be >= 0")


@dataclass
class SyntheticWorld:
    config: WorldConfig
    corpus: pd.DataFrame  # CORPUS_COLUMNS, one row per film, person and studio of the train and test sub-worlds
    questions: pd.DataFrame  # QUESTION_COLUMNS, all splits
    counts: dict[str, Any] = field(default_factory=dict)
    val_corpus: pd.DataFrame | None = None  # the val sub-world's documents (with val_per_type)

    def write(self, out_dir: str | Path) -> Path:
        """Write corpus.parquet, train.parquet, test.parquet (val.parquet and val_corpus.parquet with
        ``val_per_type``) and world.json into ``out_dir``."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        write_corpus(self.corpus, out / "corpus.parquet")
        (out / "val.parquet").unlink(missing_ok=True)
        (out / split_corpus_name("val")).unlink(missing_ok=True)
        if self.val_corpus is not None:
            write_corpus(self.val_corpus, out / split_corpus_name("val"))
        for split in SPLITS + (("val",) if self.config.val_per_type else ()):
            rows = self.questions[self.questions["split"] == split].reset_index(drop=True)
            write_questions(rows, out / f"{split}.parquet")
        meta = {"config": asdict(self.config), "counts": self.counts}
        (out / "world.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
        return out


# --------------------------------------------------------------------------- names

_ONSETS = ["b", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z",
           "br", "dr", "gr", "kr", "st", "tr", "sk"]
_ONSETS_AFTER_CODA = ["b", "d", "g", "k", "l", "m", "n", "p", "t", "v"]  # no "sr", "kz", ...
_VOWELS = ["a", "e", "i", "o", "u", "a", "e", "o"]
_CODAS = ["", "", "", "n", "r", "l", "s", "k", "m"]
_CITY_ENDINGS = ["", "", "ton", "vik", "mar", "dor"]
_STUDIO_SUFFIXES = ["Pictures", "Studios", "Films"]
# Words used by the templates: a generated name must never be one of them.
_TEMPLATE_WORDS = frozenset(
    "a an the is it was by in to of who where which what film films studio studios pictures "
    "director directed produced born married based founded runs minutes shot days won awards "
    "speaks languages has have owns sound stages employs people spouse".split()
)


class _Words:
    """Unique pronounceable words; no word is a substring of another."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.words: list[str] = []

    def _syllable(self, after_coda: bool) -> tuple[str, bool]:
        onset = self.rng.choice(_ONSETS_AFTER_CODA if after_coda else _ONSETS)
        coda = self.rng.choice(_CODAS)
        return onset + self.rng.choice(_VOWELS) + coda, coda != ""

    def word(self, n_syllables: int = 2, endings: list[str] | None = None) -> str:
        for _ in range(10_000):
            parts, coda = [], False
            for _ in range(n_syllables):
                syl, coda = self._syllable(coda)
                parts.append(syl)
            w = "".join(parts) + (self.rng.choice(endings) if endings else "")
            if w in _TEMPLATE_WORDS or any(w in o or o in w for o in self.words):
                continue
            self.words.append(w)
            return w.capitalize()
        raise RuntimeError("could not find a fresh word; the inventory is too large for the syllables")


# The vocabulary of names is fixed (like a language): every world draws its entities as new
# combinations of these words, so a name is never memorisable — only its words are familiar —
# and a model must copy it from what it reads. Cities are single words used as answers.
# With `name_words=1` every name is a single word of a larger inventory (one token each for a
# tokenizer of ~4k entries): a small model then copies one token per name instead of two.
_INVENTORY_SEED = 20261125
_INVENTORY_SIZES = {
    2: {"first": 160, "last": 160, "film_a": 120, "film_b": 120, "studio": 60, "city": 64},
    1: {"person": 700, "film": 1000, "studio": 60, "city": 64},
}
_INVENTORY: dict[int, dict[str, list[str]]] = {}


def name_capacity(name_words: int) -> dict[str, int]:
    """The most entities of each WorldConfig count the name inventory can name (``n_films``,
    ``n_directors``: each also has a spouse, ``n_studios``, ``n_cities``)."""
    sizes = _INVENTORY_SIZES[name_words]
    people = sizes["person"] if name_words == 1 else sizes["first"] * sizes["last"]
    films = sizes["film"] if name_words == 1 else sizes["film_a"] * sizes["film_b"]
    return {"n_films": films, "n_directors": people // 2, "n_studios": sizes["studio"], "n_cities": sizes["city"]}


def _inventory(name_words: int = 2) -> dict[str, list[str]]:
    if name_words not in _INVENTORY:
        words = _Words(random.Random(_INVENTORY_SEED))
        _INVENTORY[name_words] = {
            kind: [words.word(2, _CITY_ENDINGS if kind == "city" else None) for _ in range(n)]
            for kind, n in _INVENTORY_SIZES[name_words].items()
        }
    return _INVENTORY[name_words]


class _Names:
    """Entity names: unique combinations of inventory words (or single words), drawn with the
    world's rng."""

    def __init__(self, rng: random.Random, name_words: int = 2) -> None:
        self.rng = rng
        self.single = name_words == 1
        self.inv = _inventory(name_words)
        self.used: set[str] = set()

    def _fresh(self, make) -> str:
        for _ in range(100_000):
            name = make()
            if name not in self.used:
                self.used.add(name)
                return name
        raise RuntimeError("could not find a fresh name; the world is too large for the name inventory")

    def person(self) -> str:
        if self.single:
            return self._fresh(lambda: self.rng.choice(self.inv["person"]))
        return self._fresh(lambda: f"{self.rng.choice(self.inv['first'])} {self.rng.choice(self.inv['last'])}")

    def film(self) -> str:
        if self.single:
            return self._fresh(lambda: self.rng.choice(self.inv["film"]))
        return self._fresh(lambda: f"{self.rng.choice(self.inv['film_a'])} {self.rng.choice(self.inv['film_b'])}")

    def studio(self) -> str:
        if self.single:
            return self._fresh(lambda: self.rng.choice(self.inv["studio"]))
        return self._fresh(lambda: f"{self.rng.choice(self.inv['studio'])} {self.rng.choice(_STUDIO_SUFFIXES)}")

    def cities(self, n: int) -> list[str]:
        if n > len(self.inv["city"]):
            raise ValueError(f"n_cities={n} exceeds the city inventory ({len(self.inv['city'])})")
        return self.rng.sample(self.inv["city"], n)


# --------------------------------------------------------------------------- generation

_PROFESSIONS = ["an architect", "a painter", "a teacher", "a novelist", "a physician",
                "a composer", "an engineer", "a photographer"]
_FILM_EXTRAS = ["The film runs {} minutes.", "The film was shot in {} days."]
_PERSON_EXTRAS = ["{} has won {} awards.", "{} speaks {} languages."]
_STUDIO_EXTRAS = ["{} employs {} people.", "{} owns {} sound stages."]


def _spread(rng: random.Random, n_items: int, n_slots: int) -> list[int]:
    """Assign each of n_items to a slot, covering every slot when n_items >= n_slots."""
    slots = list(range(n_slots))[:n_items]
    slots += [rng.randrange(n_slots) for _ in range(n_items - n_slots)]
    rng.shuffle(slots)
    return slots


def _sub_world(rng, names, cities, n_films, n_directors, n_studios) -> dict[str, dict]:
    """Entities of one sub-world: {kind: {name: facts}} for kinds film, person, studio."""
    studios = {}
    for _ in range(n_studios):
        studios[names.studio()] = {"city": rng.choice(cities), "founded": rng.randint(1900, 1990)}
    people, directors = {}, []
    for _ in range(n_directors):
        d, s = names.person(), names.person()
        year = rng.randint(1900, 1975)
        people[d] = {"role": "a film director", "born": year, "birthplace": rng.choice(cities),
                     "spouse": s, "director": True}
        people[s] = {"role": rng.choice(_PROFESSIONS), "born": year + rng.randint(-6, 6),
                     "birthplace": rng.choice(cities), "spouse": d, "director": False}
        directors.append(d)
    studio_names = list(studios)
    films = {}
    for di, si in zip(_spread(rng, n_films, n_directors), _spread(rng, n_films, n_studios)):
        director = directors[di]
        films[names.film()] = {"director": director, "studio": studio_names[si],
                               "year": min(2024, people[director]["born"] + rng.randint(25, 55))}
    return {"film": films, "person": people, "studio": studios}


def _documents(rng: random.Random, world: dict[str, dict]) -> dict[str, tuple[str, str]]:
    """title -> (kind, text) for every film, person and studio of a sub-world."""
    docs = {}
    for name, f in world["film"].items():
        docs[name] = "film", (f"{name} is a {f['year']} film directed by {f['director']}. "
                      f"It was produced by {f['studio']}. "
                      + rng.choice(_FILM_EXTRAS).format(rng.randint(80, 150)))
    for name, p in world["person"].items():
        docs[name] = "person", (f"{name} is {p['role']} born in {p['born']}. "
                      f"{name} was born in {p['birthplace']}. "
                      f"{name} is married to {p['spouse']}. "
                      + rng.choice(_PERSON_EXTRAS).format(name, rng.randint(2, 9)))
    for name, s in world["studio"].items():
        docs[name] = "studio", (f"{name} is a film studio founded in {s['founded']}. "
                      f"{name} is based in {s['city']}. "
                      + rng.choice(_STUDIO_EXTRAS).format(name, rng.randint(2, 40)))
    return docs


def _questions(rng, world, split, caps) -> list[dict]:
    rows, counters = [], {1: 0, 2: 0, 3: 0}
    for qtype, (hops, template, path) in QTYPES.items():
        kind = _SUBJECT_KIND[path[0]]
        subjects = list(world[kind])
        cap = caps(qtype)
        if cap is not None and cap < len(subjects):
            chosen = set(rng.sample(range(len(subjects)), cap))
            subjects = [s for i, s in enumerate(subjects) if i in chosen]
        for subject in subjects:
            chain, entity, entity_kind = [], subject, kind
            for relation in path:  # follow the path; every entity visited is a doc to search
                chain.append(entity)
                entity = world[entity_kind][entity][relation]
                entity_kind = _TARGET_KIND.get(relation, "city")
            rows.append({
                "id": f"{split}-{hops}hop-{counters[hops]:05d}",
                "question": template.format(subject),
                "answers": [entity],
                "hops": hops,
                "qtype": qtype,
                "gold_titles": list(chain),
                "search_chain": list(chain),
                "split": split,
            })
            counters[hops] += 1
    return rows


def generate(cfg: WorldConfig | None = None) -> SyntheticWorld:
    """Build the world for ``cfg`` (deterministic for a seed)."""
    cfg = cfg or WorldConfig()
    rng = random.Random(cfg.seed)
    names = _Names(rng, cfg.name_words)
    cities = names.cities(cfg.n_cities)

    def heldout(n: int) -> int:
        return min(n - 1, max(1, round(n * cfg.heldout_fraction)))

    sizes = {"test": (heldout(cfg.n_films), heldout(cfg.n_directors), heldout(cfg.n_studios))}
    sizes["train"] = tuple(n - h for n, h in zip((cfg.n_films, cfg.n_directors, cfg.n_studios),
                                                 sizes["test"]))
    q = cfg.questions_per_type

    def caps(qtype: str) -> int | None:
        return q.get(qtype, 0) if isinstance(q, dict) else q

    v = cfg.val_per_type  # the val sub-world: enough subjects for v questions of every template
    if v:
        sizes["val"] = (max(2, 2 * v), max(2, v), max(2, v))

    docs: dict[str, tuple[str, str]] = {}  # title -> (kind, text): the train and test sub-worlds'
    val_docs: dict[str, tuple[str, str]] = {}  # the val sub-world's: searched by the val questions only
    rows: list[dict] = []
    counts: dict[str, Any] = {"cities": len(cities), "entities": {}, "questions": {}}
    for split in SPLITS + tuple(sizes.keys() - set(SPLITS)):  # val last: train and test the same without it
        sub = _sub_world(rng, names, cities, *sizes[split])
        (val_docs if split == "val" else docs).update(_documents(rng, sub))
        split_rows = _questions(rng, sub, split, caps if split != "val" else lambda _: v)
        rows.extend(split_rows)
        n_dir = sum(p["director"] for p in sub["person"].values())
        counts["entities"][split] = {"films": len(sub["film"]), "directors": n_dir,
                                     "spouses": len(sub["person"]) - n_dir,
                                     "studios": len(sub["studio"])}
        counts["questions"][split] = {
            f"{h}hop": sum(r["hops"] == h for r in split_rows) for h in (1, 2, 3)
        }

    corpus, counts["docs"] = _corpus(docs)
    val_corpus = None
    if v:
        val_corpus, counts["val_docs"] = _corpus(val_docs, "val-")
    questions = pd.DataFrame(rows, columns=list(QUESTION_COLUMNS))
    return SyntheticWorld(config=cfg, corpus=corpus, questions=questions, counts=counts, val_corpus=val_corpus)


def _corpus(docs: dict[str, tuple[str, str]], prefix: str = "") -> tuple[pd.DataFrame, dict[str, int]]:
    """The documents as a corpus table (ids ``<prefix><kind>-NNNN``, by kind and title) and their counts."""
    rows, per_kind = [], {"film": 0, "person": 0, "studio": 0}
    for title, (kind, text) in sorted(docs.items(), key=lambda kv: (kv[1][0], kv[0])):
        rows.append({"doc_id": f"{prefix}{kind}-{per_kind[kind]:04d}", "title": title, "text": text})
        per_kind[kind] += 1
    return pd.DataFrame(rows, columns=list(CORPUS_COLUMNS)), {**per_kind, "total": len(rows)}


# --------------------------------------------------------------------------- I/O + validation


class DataError(ValueError):
    """Bad input data; the message names the file and the line, record or row."""


def _bad(source: str, row: int, column: str, problem: str, value: Any, lines: list[int] | None = None) -> DataError:
    shown = repr(value)
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    where = f"line {lines[row]}: field" if lines else f"row {row}: column"
    return DataError(f"{source}: {where} {column!r}: {problem} (got {shown})")


def _check_columns(df: pd.DataFrame, columns: tuple[str, ...], source: str) -> None:
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise DataError(f"{source}: missing column(s) {missing}; expected {list(columns)}")


def _str_list(value: Any) -> list | None:
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, str) and v.strip()
                                                          for v in value):
        return list(value)
    return None


def validate_questions(df: pd.DataFrame, source: str = "questions", lines: list[int] | None = None) -> pd.DataFrame:
    """Check a question table; return a clean copy (QUESTION_COLUMNS, python lists, int hops).

    Raises ValueError naming ``source``, the row index (or its line in ``source``, given
    ``lines``) and the column of the first bad value.
    """
    _check_columns(df, QUESTION_COLUMNS, source)
    _bad_at = _bad if lines is None else (lambda *a: _bad(*a, lines=lines))
    cols = {c: df[c].tolist() for c in QUESTION_COLUMNS}
    seen: set[str] = set()
    for i in range(len(df)):
        for c in ("id", "question", "qtype", "split"):
            v = cols[c][i]
            if not isinstance(v, str) or not v.strip():
                raise _bad_at(source, i, c, "expected a non-empty string", v)
        if cols["id"][i] in seen:
            raise _bad_at(source, i, "id", "duplicate id", cols["id"][i])
        seen.add(cols["id"][i])
        for c in ("answers", "gold_titles", "search_chain"):
            lst = _str_list(cols[c][i])
            if lst is None:
                raise _bad_at(source, i, c, "expected a non-empty list of non-empty strings",
                           cols[c][i])
            cols[c][i] = lst
        h = cols["hops"][i]
        if isinstance(h, bool) or not isinstance(h, (int, np.integer)) or h < 1:
            raise _bad_at(source, i, "hops", "expected an integer >= 1", h)
        cols["hops"][i] = int(h)
    out = pd.DataFrame(cols, columns=list(QUESTION_COLUMNS))
    out["hops"] = out["hops"].astype("int64")
    return out


def validate_corpus(df: pd.DataFrame, source: str = "corpus") -> pd.DataFrame:
    """Check a corpus table (non-empty strings, unique doc_id and title); return a clean copy."""
    _check_columns(df, CORPUS_COLUMNS, source)
    cols = {c: df[c].tolist() for c in CORPUS_COLUMNS}
    seen: dict[str, set] = {"doc_id": set(), "title": set()}
    for i in range(len(df)):
        for c in CORPUS_COLUMNS:
            v = cols[c][i]
            if not isinstance(v, str) or not v.strip():
                raise _bad(source, i, c, "expected a non-empty string", v)
            if c in seen:
                if v in seen[c]:
                    raise _bad(source, i, c, f"duplicate {c}", v)
                seen[c].add(v)
    return pd.DataFrame(cols, columns=list(CORPUS_COLUMNS))


def write_questions(df: pd.DataFrame, path: str | Path) -> None:
    """Validate and write a question table to parquet (fixed schema, no index)."""
    clean = validate_questions(df, str(path))
    pq.write_table(pa.Table.from_pandas(clean, schema=_QUESTION_SCHEMA, preserve_index=False), path)


def write_corpus(df: pd.DataFrame, path: str | Path) -> None:
    """Validate and write a corpus table to parquet (fixed schema, no index)."""
    clean = validate_corpus(df, str(path))
    pq.write_table(pa.Table.from_pandas(clean, schema=_CORPUS_SCHEMA, preserve_index=False), path)


# A task table (a user's own rows, data.source: jsonl): every row kept as written, as JSON in
# the column ``task`` (with ``id`` and ``split``), beside the columns the stages select on:
# ``id``, ``split`` and, where every row has them, ``hops`` and ``qtype``.
TASK_COLUMN = "task"
FILTER_FIELDS = ("hops", "qtype")


def write_tasks(rows: list[dict], path: str | Path, split: str, fields: tuple[str, ...] = (),
                source: str = "tasks", lines: list[int] | None = None) -> None:
    """Validate a split's task rows and write them to parquet as written (see ``TASK_COLUMN``).

    Each row must have the ``fields`` the environment declares; ``id`` (default ``<split>-<n>``)
    must be unique, ``split`` (default ``split``) must be ``split``; ``hops`` (an integer >= 1)
    and ``qtype`` (a string) are in every row or in none. Errors name ``source`` and the line.
    """
    lines = lines or list(range(1, len(rows) + 1))
    if not rows:
        raise DataError(f"{source}: no tasks (the {split!r} split is empty)")
    seen: set[str] = set()
    out = []
    for n, (row, line) in enumerate(zip(rows, lines)):
        at = f"{source}: line {line}"
        missing = [f for f in fields if f not in row]
        if missing:
            raise DataError(f"{at}: missing field(s) {missing}; the environment's TASK_FIELDS are {list(fields)}")
        row = {"id": f"{split}-{n:05d}", **row}
        row.setdefault("split", split)
        if not isinstance(row["id"], str) or not row["id"].strip():
            raise DataError(f"{at}: field 'id': expected a non-empty string (got {row['id']!r})")
        if row["id"] in seen:
            raise DataError(f"{at}: field 'id': duplicate id {row['id']!r}")
        seen.add(row["id"])
        if row["split"] != split:
            raise DataError(f"{at}: field 'split': expected {split!r} (got {row['split']!r})")
        h = row.get("hops", 1)
        if isinstance(h, bool) or not isinstance(h, int) or h < 1:
            raise DataError(f"{at}: field 'hops': expected an integer >= 1 (got {h!r})")
        if not isinstance(row.get("qtype", "q"), str) or not row.get("qtype", "q").strip():
            raise DataError(f"{at}: field 'qtype': expected a non-empty string (got {row['qtype']!r})")
        out.append(row)
    table = {"id": [r["id"] for r in out], "split": [r["split"] for r in out]}
    for f in FILTER_FIELDS:
        has = [f in r for r in out]
        if any(has) and not all(has):
            line = lines[has.index(not has[0])]
            raise DataError(f"{source}: line {line}: {'has' if not has[0] else 'has no'} field {f!r}, unlike line "
                            f"{lines[0]}: {f} must be in every row or in none (it selects tasks: sft/rl/eval.{f})")
        if all(has):
            table[f] = [r[f] for r in out]
    try:
        table[TASK_COLUMN] = [json.dumps(r, ensure_ascii=False) for r in out]
    except (TypeError, ValueError) as e:
        raise DataError(f"{source}: a row cannot be stored as JSON: {e}") from None
    pd.DataFrame(table).to_parquet(path, index=False)


def task_records(df: pd.DataFrame) -> list[dict]:
    """The rows of a split as task dicts: a task table's rows as written, a question table's
    rows with python lists."""
    if TASK_COLUMN in df.columns:
        return [json.loads(t) for t in df[TASK_COLUMN]]
    out = df.to_dict("records")
    for t in out:
        for k in ("answers", "gold_titles", "search_chain"):
            if k in t:
                t[k] = list(t[k])
    return out


def _validate_task_table(df: pd.DataFrame, source: str) -> pd.DataFrame:
    _check_columns(df, ("id", "split", TASK_COLUMN), source)
    if df["id"].duplicated().any():
        raise DataError(f"{source}: duplicate id {df['id'][df['id'].duplicated()].iloc[0]!r}")
    return df


def _read(path: Path, columns: list[str] | None = None) -> pd.DataFrame:
    if not path.exists():
        if path.name == "corpus.parquet" and any((path.parent / f"{s}.parquet").exists() for s in SPLITS):
            raise DataError(f"{path}: the data has no corpus (no corpus.jsonl in data.path), but a tool of env.tools "
                            "reads one: add data.path/corpus.jsonl, or use tools that need none")
        raise FileNotFoundError(f"{path} not found: run the prepare stage first (agent-r1 stage prepare)")
    try:
        return pq.read_table(path, columns=columns).to_pandas()
    except (pa.ArrowException, OSError) as e:
        raise DataError(f"{path}: not a readable parquet file: {e}") from None


def load_split(data_dir: str | Path, split: str) -> pd.DataFrame:
    """Read and validate ``<data_dir>/<split>.parquet``: at least one question, every row's
    ``split`` is ``split``, and no id is also in one of the other splits (``ALL_SPLITS``) of the folder."""
    path = Path(data_dir) / f"{split}.parquet"
    df = _read(path)
    df = _validate_task_table(df, str(path)) if TASK_COLUMN in df.columns else validate_questions(df, str(path))
    if df.empty:
        raise DataError(f"{path}: the {split!r} split has no questions")
    for i, v in enumerate(df["split"].tolist()):
        if v != split:
            raise _bad(str(path), i, "split", f"expected {split!r}", v)
    for other in ALL_SPLITS:
        other_path = Path(data_dir) / f"{other}.parquet"
        if other != split and other_path.exists():
            shared = set(df["id"]) & set(_read(other_path, ["id"])["id"])
            if shared:
                raise DataError(f"{path}: {len(shared)} question id(s) also in {other_path}, e.g. "
                                f"{min(shared)!r}: a question must be in one split only")
    return df


def split_corpus_name(split: str) -> str:
    """The file of the documents only ``split``'s questions search (the synthetic val sub-world's:
    ``val_corpus.parquet``), beside the corpus every split searches."""
    return f"{split}_corpus.parquet"


def load_corpus(data_dir: str | Path, split: str | None = None) -> pd.DataFrame:
    """Read and validate ``<data_dir>/corpus.parquet`` (at least one document): the corpus of the
    train and test questions; for ``split`` with documents of its own (``split_corpus_name``:
    the val split), those documents too."""
    path = Path(data_dir) / "corpus.parquet"
    df = validate_corpus(_read(path), str(path))
    if df.empty:
        raise DataError(f"{path}: the corpus has no documents")
    own = Path(data_dir) / split_corpus_name(split) if split else None
    if own is not None and own.exists():
        df = validate_corpus(pd.concat([df, _read(own)], ignore_index=True), f"{path} with {own.name}")
    return df
