import json
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from agent_r1.data import (
    QTYPES,
    QUESTION_COLUMNS,
    WorldConfig,
    generate,
    load_corpus,
    load_hotpotqa,
    load_split,
    write_questions,
)

HOTPOT_DEV = Path(__file__).resolve().parents[1] / "data" / "hotpotqa" / "dev.jsonl"  # shipped with the project
CITY_QTYPES = {"birthplace", "studio_city", "director_birthplace", "studio_city_of_film",
               "director_spouse_birthplace"}
SMALL = WorldConfig(seed=3, n_films=40, n_directors=12, n_studios=6, n_cities=8)


@pytest.fixture(scope="module")
def world():
    return generate(WorldConfig())


@pytest.fixture(scope="module")
def docs(world):
    return dict(zip(world.corpus["title"], world.corpus["text"]))


# --------------------------------------------------------------------------- synthetic world


def test_default_sizes(world):
    c = world.counts
    assert c["entities"]["train"] == {"films": 240, "directors": 90, "spouses": 90, "studios": 15}
    assert c["entities"]["test"] == {"films": 80, "directors": 30, "spouses": 30, "studios": 5}
    assert c["docs"] == {"film": 320, "person": 240, "studio": 20, "total": 580}
    assert len(world.corpus) == 580 and world.corpus["doc_id"].is_unique
    assert world.questions["id"].is_unique
    by_split_hops = world.questions.groupby(["split", "hops"]).size().to_dict()
    assert by_split_hops == {("train", 1): 855, ("train", 2): 720, ("train", 3): 240,
                             ("test", 1): 285, ("test", 2): 240, ("test", 3): 80}
    assert set(world.questions["qtype"]) == set(QTYPES)
    for qtype, (hops, _, _) in QTYPES.items():
        assert set(world.questions.loc[world.questions["qtype"] == qtype, "hops"]) == {hops}


def test_splits_share_no_entity_but_cities(world):
    def entities(split):
        rows = world.questions[world.questions["split"] == split]
        names = {t for ts in rows["gold_titles"] for t in ts}
        names |= {t for ts in rows["search_chain"] for t in ts}
        names |= {a[0] for a, q in zip(rows["answers"], rows["qtype"]) if q not in CITY_QTYPES}
        cities = {a[0] for a, q in zip(rows["answers"], rows["qtype"]) if q in CITY_QTYPES}
        return names, cities

    train, train_cities = entities("train")
    test, test_cities = entities("test")
    assert train and test and not (train & test)
    assert not (train & (train_cities | test_cities)) and not (test & (train_cities | test_cities))
    assert train_cities & test_cities  # the cities are shared
    # the corpus holds the documents of both sub-worlds
    assert (train | test) == set(world.corpus["title"])


def test_names_and_documents(world, docs):
    cities = {a[0] for a, q in zip(world.questions["answers"], world.questions["qtype"])
              if q in CITY_QTYPES}
    names = sorted(set(docs) | cities)
    for i, a in enumerate(names):  # no name is a substring of another (hence tokens too)
        for b in names[i + 1:]:
            assert a not in b and b not in a, (a, b)
    for doc_id, title, text in world.corpus.itertuples(index=False):
        kind = doc_id.split("-")[0]
        assert title in text and len(text.split()) <= 40
        words = title.split()
        if kind == "studio":
            assert len(words) == 2 and words[1] in {"Pictures", "Studios", "Films"}
        else:
            assert len(words) == 2 and all(w.isalpha() and w[0].isupper() for w in words)
    assert all(len(c.split()) == 1 for c in cities)


def test_chains_are_discoverable(world, docs):
    for row in world.questions.itertuples(index=False):
        assert len(row.search_chain) == row.hops and row.gold_titles == row.search_chain
        assert all(t in docs for t in row.gold_titles)  # every gold title is a document
        assert row.search_chain[0] in row.question  # the first hop is named in the question
        for prev, nxt in zip(row.search_chain, row.search_chain[1:]):
            assert nxt in docs[prev]  # each hop is named in the previous document
        assert row.answers[0] in docs[row.search_chain[-1]]  # the last doc holds the answer
        assert row.answers[0] not in row.question


def test_example_documents(world, docs):
    row = world.questions[world.questions["qtype"] == "director_spouse_birthplace"].iloc[0]
    film, director, spouse = row["search_chain"]
    assert docs[film].startswith(f"{film} is a ")
    assert f"film directed by {director}. It was produced by " in docs[film]
    assert docs[director].startswith(f"{director} is a film director born in ")
    assert f"{director} is married to {spouse}." in docs[director]
    assert f"{spouse} is married to {director}." in docs[spouse]
    assert f"{spouse} was born in {row['answers'][0]}." in docs[spouse]
    assert row["question"] == f"Where was the spouse of the director of {film} born?"


def test_questions_per_type():
    q = generate(replace(SMALL, questions_per_type=2)).questions
    assert (q.groupby(["split", "qtype"]).size() == 2).all() and len(q) == 2 * 2 * len(QTYPES)
    q = generate(replace(SMALL, questions_per_type={"director_birthplace": 5})).questions
    assert set(q["qtype"]) == {"director_birthplace"} and len(q) == 10
    with pytest.raises(ValueError, match="nope"):
        WorldConfig(questions_per_type={"nope": 1})
    with pytest.raises(ValueError, match="heldout_fraction"):
        WorldConfig(heldout_fraction=1.0)


def test_write_load_roundtrip_and_determinism(tmp_path):
    a = generate(SMALL).write(tmp_path / "a")
    b = generate(SMALL).write(tmp_path / "b")
    c = generate(replace(SMALL, seed=4)).write(tmp_path / "c")
    files = ["corpus.parquet", "train.parquet", "test.parquet", "world.json"]
    assert all((a / f).read_bytes() == (b / f).read_bytes() for f in files)
    assert (a / "corpus.parquet").read_bytes() != (c / "corpus.parquet").read_bytes()
    assert set(load_corpus(a)["title"]) != set(load_corpus(c)["title"])

    world = generate(SMALL)
    pd.testing.assert_frame_equal(load_corpus(a), world.corpus)
    for split in ("train", "test"):
        expected = world.questions[world.questions["split"] == split].reset_index(drop=True)
        pd.testing.assert_frame_equal(load_split(a, split), expected)
    meta = json.loads((a / "world.json").read_text())
    assert meta["config"]["seed"] == 3 and meta["counts"]["docs"]["total"] == len(world.corpus)


def _good_row(i):
    return {"id": f"q{i}", "question": "Who directed Brask Tolen?", "answers": ["Mara Velkin"],
            "hops": 1, "qtype": "director", "gold_titles": ["Brask Tolen"],
            "search_chain": ["Brask Tolen"], "split": "train"}


@pytest.mark.parametrize(
    ("column", "bad"),
    [("question", ""), ("answers", []), ("answers", None), ("answers", ["Mara", None]),
     ("gold_titles", [""]),
     ("hops", 0), ("id", None), ("split", "test"), ("id", "q0")],
)
def test_malformed_parquet_row(tmp_path, column, bad):
    rows = [_good_row(0), _good_row(1), _good_row(2)]
    rows[1][column] = bad
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "train.parquet")
    with pytest.raises(ValueError) as err:
        load_split(tmp_path, "train")
    msg = str(err.value)
    assert "train.parquet" in msg and "row 1" in msg and repr(column) in msg


def test_missing_column(tmp_path):
    rows = [{k: v for k, v in _good_row(0).items() if k != "search_chain"}]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "train.parquet")
    with pytest.raises(ValueError, match="search_chain"):
        load_split(tmp_path, "train")
    pq.write_table(pa.Table.from_pylist([{"doc_id": "d0", "title": "T"}]),
                   tmp_path / "corpus.parquet")
    with pytest.raises(ValueError, match="text"):
        load_corpus(tmp_path)


# --------------------------------------------------------------------------- HotpotQA


def _to_original(rec):
    return {
        "_id": rec["id"], "question": rec["question"], "answer": rec["answer"],
        "type": rec["type"], "level": rec["level"],
        "supporting_facts": [[t, s] for t, s in zip(rec["supporting_facts"]["title"],
                                                    rec["supporting_facts"]["sent_id"])],
        "context": [[t, s] for t, s in zip(rec["context"]["title"],
                                           rec["context"]["sentences"])],
    }


def test_hotpotqa_hf_layout():
    questions, corpus = load_hotpotqa(HOTPOT_DEV, limit=20)
    assert list(questions.columns) == list(QUESTION_COLUMNS) and len(questions) == 20
    assert set(questions["split"]) == {"dev"} and set(questions["hops"]) == {2}
    assert set(questions["qtype"]) <= {"bridge", "comparison"}
    first = json.loads(HOTPOT_DEV.open().readline())
    assert questions["answers"][0] == [first["answer"]]
    assert questions["gold_titles"][0] == ["Tinted Windows (album)", "Tinted Windows (band)"]
    assert corpus["title"].is_unique and corpus["doc_id"].is_unique
    assert len(corpus) <= 200 and set(first["context"]["title"]) <= set(corpus["title"])
    titles = set(corpus["title"])
    assert all(set(g) <= titles for g in questions["gold_titles"])
    text = dict(zip(corpus["title"], corpus["text"]))["Tinted Windows (band)"]
    assert text.startswith("Tinted Windows is an American ")
    assert "  " not in text


def test_hotpotqa_layouts_agree(tmp_path):
    recs = [json.loads(line) for line in HOTPOT_DEV.open().readlines()[:3]]
    orig = tmp_path / "sample.json"
    orig.write_text(json.dumps([_to_original(r) for r in recs], indent=1))
    hf_q, hf_c = load_hotpotqa(HOTPOT_DEV, split="sample", limit=3)
    or_q, or_c = load_hotpotqa(orig)  # split defaults to the file stem
    pd.testing.assert_frame_equal(hf_q, or_q)
    pd.testing.assert_frame_equal(hf_c, or_c)
    # the frames fit the shared on-disk schema
    write_questions(or_q, tmp_path / "sample.parquet")
    pd.testing.assert_frame_equal(load_split(tmp_path, "sample"), or_q)


def test_hotpotqa_malformed(tmp_path):
    recs = [json.loads(line) for line in HOTPOT_DEV.open().readlines()[:3]]
    bad = dict(recs[1], question="")
    jl = tmp_path / "bad.jsonl"
    jl.write_text("\n".join(json.dumps(r) for r in (recs[0], bad, recs[2])) + "\n")
    with pytest.raises(ValueError, match=r"bad\.jsonl: line 2: field 'question'"):
        load_hotpotqa(jl)
    jl.write_text(json.dumps(recs[0]) + "\n{not json\n")
    with pytest.raises(ValueError, match=r"bad\.jsonl: line 2: invalid JSON"):
        load_hotpotqa(jl)
    orig = [_to_original(r) for r in recs]
    orig[2]["supporting_facts"] = [["No Such Title", 0]]
    js = tmp_path / "bad.json"
    js.write_text(json.dumps(orig))
    with pytest.raises(ValueError, match=r"bad\.json: record 2: field 'supporting_facts'"):
        load_hotpotqa(js)


def test_single_word_names_are_one_token_each_and_still_held_out():
    from agent_r1.models import train_tokenizer

    w = generate(WorldConfig(seed=1, n_films=200, n_directors=60, name_words=1))
    titles = list(w.corpus["title"])
    assert all(" " not in t for t in titles) and len(set(titles)) == len(titles)
    tok = train_tokenizer(list(w.corpus["text"]) + titles + list(w.questions["question"]), vocab_size=4096)
    # one token, and the same one after a space, a quote or a tag: copying a name is copying a token
    for t in titles:
        (name,) = tok.encode(t, add_special_tokens=False)
        for context in (f"made by {t}.", f'{{"query": "{t}"}}', f"<answer>{t}</answer>"):
            assert name in tok.encode(context, add_special_tokens=False), (t, context)
    split_titles = {s: {t for ts in w.questions[w.questions.split == s]["gold_titles"] for t in ts} for s in ("train", "test")}
    assert split_titles["train"] and not split_titles["train"] & split_titles["test"]
    with pytest.raises(ValueError, match="name_words"):
        WorldConfig(name_words=3)


# --------------------------------------------------------------------------- hostile data
def _hotpot(qid="a1"):
    return {"id": qid, "question": "Which river?", "answer": "Danube", "type": "bridge", "level": "easy",
            "supporting_facts": {"title": ["Danube"], "sent_id": [0]},
            "context": {"title": ["Danube"], "sentences": [["A river."]]}}


def _jsonl(*lines) -> bytes:
    return b"".join((json.dumps(x).encode() if isinstance(x, dict) else x) + b"\n" for x in lines)


@pytest.mark.parametrize("content, message", [
    (_jsonl(_hotpot(), b'{"id": "caf\xe9"}'), "bad.jsonl: line 2: not UTF-8 text (byte 0xe9)"),
    (_jsonl(_hotpot(), b"[" * 100_000 + b"]" * 100_000), "bad.jsonl: line 2: invalid JSON: nested too deeply"),
    (_jsonl(b'{"id": ' + b"7" * 5000 + b"}"), "bad.jsonl: line 1: invalid JSON: Exceeds the limit (4300 digits)"),
    (b"", "bad.jsonl: no questions in the file"),
    (b"\n\n", "bad.jsonl: no questions in the file"),
    (b"[" + b"[" * 100_000 + b"]" * 100_000 + b"]", "bad.jsonl: invalid JSON: nested too deeply"),
    (b'[{"_id": "\xff"}]', "bad.jsonl: line 1: not UTF-8 text (byte 0xff)"),
])
def test_hostile_hotpotqa_files_name_file_and_line(tmp_path, content, message):
    from agent_r1.data import DataError

    f = tmp_path / "bad.jsonl"
    f.write_bytes(content)
    with pytest.raises(DataError) as err:
        load_hotpotqa(f)
    assert str(err.value) == f"{tmp_path}/{message}" or str(err.value).startswith(f"{tmp_path}/{message}")


def _write_split(folder, split, ids):
    from agent_r1.data.synthetic import _QUESTION_SCHEMA

    rows = [dict(_good_row(i), id=qid, split=split) for i, qid in enumerate(ids)]
    pq.write_table(pa.Table.from_pylist(rows, schema=_QUESTION_SCHEMA), folder / f"{split}.parquet")


def test_an_empty_split_ids_shared_between_splits_and_a_missing_file_are_errors(tmp_path):
    from agent_r1.data import DataError

    with pytest.raises(FileNotFoundError, match=r"train.parquet not found: run the prepare stage first"):
        load_split(tmp_path, "train")
    _write_split(tmp_path, "train", [])
    with pytest.raises(DataError, match=r"train.parquet: the 'train' split has no questions"):
        load_split(tmp_path, "train")
    _write_split(tmp_path, "train", ["q1", "q2", "q3"])
    _write_split(tmp_path, "test", ["q9", "q2"])
    for split, other in (("train", "test"), ("test", "train")):
        with pytest.raises(DataError, match=rf"{split}.parquet: 1 question id\(s\) also in .*{other}.parquet, e.g. 'q2'"):
            load_split(tmp_path, split)
    (tmp_path / "corpus.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(DataError, match="corpus.parquet: not a readable parquet file"):
        load_corpus(tmp_path)


def test_prepare_rejects_a_question_in_both_hotpotqa_splits(tmp_path):
    from agent_r1.config import load_config, parse_overrides
    from agent_r1.data import DataError
    from agent_r1.pipeline import stages

    src = tmp_path / "hotpot"
    src.mkdir()
    (src / "train.jsonl").write_bytes(_jsonl(_hotpot("a1"), _hotpot("a2")))
    (src / "dev.jsonl").write_bytes(_jsonl(_hotpot("a2")))
    cfg = load_config("default", "pipelines.yaml", parse_overrides(
        [f"output_dir={tmp_path / 'out'}", "data.source=hotpotqa", f"data.path={src}", "sft.worlds=0", "sft.hops=[2]",
         "eval.hops=[2]"]))
    with pytest.raises(DataError, match=r"1 question id\(s\) also in .*, e.g. 'a2'"):
        stages.prepare(cfg)
    (src / "dev.jsonl").write_bytes(b"")
    with pytest.raises(DataError, match=r"dev.jsonl: no questions in the file"):
        stages.prepare(cfg)
