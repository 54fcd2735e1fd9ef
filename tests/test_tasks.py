"""The environment owns its task (DESIGN contract 9): a user's jsonl rows reach ``reset`` as
written, checked against the environment's ``TASK_FIELDS`` with errors naming the user's file and
line; selection filters (hops, qtypes) apply where the data has them, and a filter that selects
nothing is an error before any model loads."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from agent_r1.config import ConfigError, RunConfig, load_config
from agent_r1.data import DataError, load_split
from agent_r1.run import prepare_data, selection_problems, tasks_for

# the module a test writes: the tool, then an environment (its own below)
REVERSE_TOOL = '''
from agent_r1.envs import Metric, ToolEnv
from agent_r1.tools import tool


@tool(thread_safe=True)
def reverse(text: str) -> str:
    """Reverse a text.

    Args:
        text: The text to reverse.
    """
    return text[::-1]

'''

ENV = REVERSE_TOOL + '''
class ReverseEnv(ToolEnv):
    """Reverse the task's sentence; the row has ``sentence`` and ``target``, nothing of QA."""

    TASK_FIELDS = ("sentence", "target")
    METRICS = {"reversed": Metric("the answer is the target")}
    seen = []  # the tasks reset saw, for the tests

    def reset(self, task):
        ReverseEnv.seen.append(task)
        return [{"role": "user", "content": "Reverse: " + task["sentence"]}]

    def final_reward(self, answer, action_text):
        ok = float(answer == self.task["target"])
        return ok, {"reversed": ok}

    def oracle_turns(self, task):
        return ['<tool_call>{"name": "reverse", "arguments": {"text": "%s"}}</tool_call>' % task["sentence"],
                "<answer>%s</answer>" % task["target"]]
'''

WORDS = ["stone", "river", "cloud", "ember", "maple", "otter", "quill", "tulip", "zebra", "apple"]


def _rows(words, **extra) -> list[dict]:
    return [{"sentence": w, "target": w[::-1], "city": "Lorvik", "k": i, "prompt": None, "nested": {"a": [i, "x"]},
             **extra} for i, w in enumerate(words)]


def _write(folder: Path, train: list[dict], test: list[dict]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, rows in (("train", train), ("test", test)):
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def _config(tmp_path: Path, data: Path, **sections) -> object:
    (tmp_path / "revmod.py").write_text(ENV)
    body = {"data": {"source": "jsonl", "path": str(data)},
            "env": {"name": f"{tmp_path / 'revmod.py'}:ReverseEnv", "tools": [f"{tmp_path / 'revmod.py'}:reverse"]},
            "eval": {"baselines": []}} | sections
    return RunConfig.model_validate({"output_dir": str(tmp_path / "out"), **body})


def test_rows_reach_reset_as_written_without_qa_fields_or_corpus(tmp_path):
    data = _write(tmp_path / "data", _rows(WORDS[:7]), _rows(WORDS[7:]))
    cfg = _config(tmp_path, data)  # the QA defaults (sft.hops [1], qtypes, rl.hops [2]) stay
    data_dir = prepare_data(cfg)
    assert not (data_dir / "corpus.parquet").exists()  # no corpus: no tool reads one
    assert selection_problems(cfg, data_dir) == []  # the data has no hops / qtype: no filter applies
    tasks = tasks_for(load_split(data_dir, "train"), cfg.rl.hops, qtypes=cfg.rl.qtypes)
    assert [t["sentence"] for t in tasks] == WORDS[:7]
    first = tasks[0]
    assert first == {"id": "train-00000", "split": "train", **_rows(WORDS[:1])[0]}  # every field, as written
    assert type(first["k"]) is int and first["prompt"] is None and first["nested"] == {"a": [0, "x"]}

    from agent_r1.envs import get_env

    env_cls = get_env(cfg.env.name)
    env = env_cls([])
    env.reset(first)
    assert env_cls.seen[-1]["city"] == "Lorvik" and env_cls.seen[-1]["target"] == "enots"


def test_a_missing_task_field_names_the_users_file_and_line(tmp_path):
    rows = _rows(WORDS[:4])
    del rows[2]["target"]
    data = _write(tmp_path / "data", rows, _rows(WORDS[7:]))
    with pytest.raises(DataError, match=r"data/train\.jsonl: line 3: missing field\(s\) \['target'\]"):
        prepare_data(_config(tmp_path, data))


def test_a_qa_environment_still_needs_the_qa_fields(tmp_path):
    rows = [{"question": "q?", "answers": ["a"], "hops": 1, "qtype": "x", "gold_titles": ["t"], "search_chain": ["t"]},
            {"question": "q2?", "answers": ["a"], "hops": 1, "qtype": "x", "gold_titles": [], "search_chain": ["t"]}]
    data = _write(tmp_path / "data", rows, rows[:1])
    (data / "corpus.jsonl").write_text(json.dumps({"doc_id": "d", "title": "t", "text": "x"}) + "\n")
    cfg = RunConfig.model_validate({"output_dir": str(tmp_path / "out"), "data": {"source": "jsonl", "path": str(data)},
                                    "eval": {"baselines": []}})
    with pytest.raises(DataError, match=r"train\.jsonl: line 2: field 'gold_titles': expected a non-empty list"):
        prepare_data(cfg)
    del rows[1]["gold_titles"]
    _write(data, rows, rows[:1])
    with pytest.raises(DataError, match=r"train\.jsonl: line 2: missing field\(s\) \['gold_titles'\]"):
        prepare_data(cfg)


def test_hops_in_some_rows_only_is_an_error(tmp_path):
    data = _write(tmp_path / "data", _rows(WORDS[:2]) + _rows(WORDS[2:3], hops=1), _rows(WORDS[7:]))
    with pytest.raises(DataError, match=r"train\.jsonl: line 3: has field 'hops', unlike line 1"):
        prepare_data(_config(tmp_path, data))


def test_a_filter_that_selects_nothing_fails_at_prepare(tmp_path):
    from agent_r1.pipeline.stages import prepare

    data = _write(tmp_path / "data", _rows(WORDS[:7], hops=2, qtype="rev"), _rows(WORDS[7:], hops=2, qtype="rev"))
    cfg = _config(tmp_path, data, rl={"hops": [2], "qtypes": []})  # sft.hops: [1] (the default) selects nothing
    with pytest.raises(ConfigError) as e:
        prepare(cfg)
    message = str(e.value)
    assert message.startswith("sft.hops / sft.qtypes: select no task of ") and "its hop counts: [2]" in message
    assert "train.jsonl" in message and "\n" not in message  # only sft's filter; the synthetic qtype default is no error
    cfg = _config(tmp_path, data, sft={"hops": [2], "qtypes": []}, rl={"hops": [2], "qtypes": ["bogus"]},
                  eval={"hops": [2], "baselines": []})
    with pytest.raises(ConfigError, match=r"^rl\.qtypes: .*train\.jsonl has no tasks of question type\(s\) \['bogus'\]"):
        prepare(cfg)
    cfg = _config(tmp_path, data, sft={"hops": [2], "qtypes": []}, rl={"hops": [2]}, eval={"hops": [2], "baselines": []})
    assert prepare(cfg)["train_questions"] == 7


def test_hotpotqa_question_types_are_checked_at_config_load():
    with pytest.raises(ConfigError, match=r"rl\.qtypes: unknown question type\(s\) \['bogus'\] in hotpotqa data; known: bridge"):
        load_config("hotpotqa", "pipelines.yaml", {"rl": {"qtypes": ["bogus"]}})


def test_a_folder_where_a_file_belongs_is_a_data_error(tmp_path):
    src = tmp_path / "hp"
    (src / "dev.jsonl").mkdir(parents=True)
    (src / "train.jsonl").write_text("")
    cfg = load_config("hotpotqa", "pipelines.yaml", {"output_dir": str(tmp_path / "out"), "data": {"path": str(src)}})
    with pytest.raises(DataError, match=r"dev\.jsonl is a folder, not a HotpotQA"):
        prepare_data(cfg)
    data = _write(tmp_path / "data", _rows(WORDS[:2]), _rows(WORDS[7:]))
    (data / "test.jsonl").unlink()
    (data / "test.jsonl").mkdir()
    with pytest.raises(DataError, match=r"test\.jsonl: is a folder, not a \.jsonl file"):
        prepare_data(_config(tmp_path, data))


def test_a_tool_that_reads_a_corpus_the_data_lacks_says_so(tmp_path):
    from agent_r1.run import make_tools

    data = _write(tmp_path / "data", _rows(WORDS[:2]), _rows(WORDS[7:]))
    cfg = _config(tmp_path, data)
    cfg = cfg.model_copy(update={"env": cfg.env.model_copy(update={"tools": ["search"]})})
    data_dir = prepare_data(cfg)
    with pytest.raises(DataError, match=r"the data has no corpus \(no corpus\.jsonl in data\.path\), but a tool"):
        make_tools(cfg, data_dir)


ACCEPT_ENV = REVERSE_TOOL + '''
class ReverseEnv(ToolEnv):
    """Reverse the sentence: rows hold ``sentence`` and ``target`` (and whatever else was written)."""

    TASK_FIELDS = ("sentence", "target")
    METRICS = {"reversed_ok": Metric("the answer is the reversed sentence")}

    def reset(self, task):
        super().reset({"prompt": "Reverse: " + task["sentence"]})
        self.task = task
        if not (type(task["k"]) is int and task["city"] == "Lorvik" and task["nested"]["a"][1] == "x"):
            raise ValueError(f"the row did not arrive as written: {task}")  # an env error, counted in eval.json
        return [{"role": "user", "content": "Reverse: " + task["sentence"]}]

    def final_reward(self, answer, action_text):
        ok = float(answer == self.task["target"])
        return ok, {"reversed_ok": ok}

    def oracle_turns(self, task):
        return ['<tool_call>{"name": "reverse", "arguments": {"text": "%s"}}</tool_call>' % task["sentence"],
                "<answer>%s</answer>" % task["target"]]
'''


@pytest.mark.slow
def test_a_users_own_task_trains_from_a_config_in_another_folder(tmp_path):
    """The acceptance test of issue 26: an environment in a temp module with its own fields
    (sentence, target; no QA field, no corpus), a config in another folder naming everything by
    relative paths and extending the packaged tiny pipeline, trained by `agent-r1 train` from a
    third folder; its metric is in eval.json and in the CLI's results table."""
    import os
    import subprocess
    import sys

    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "revmod.py").write_text(ACCEPT_ENV)
    _write(tmp_path / "data", _rows(WORDS[:7]), _rows(WORDS[7:]))
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "pipelines.yaml").write_text(textwrap.dedent("""\
        pipelines:
          reverse:
            extends: agent-r1:tiny
            data: {source: jsonl, path: ../data}
            env: {name: ../code/revmod.py:ReverseEnv, tools: [../code/revmod.py:reverse], max_turns: 3,
                  max_context_tokens: 256, max_new_tokens: 16}
            model: {tiny: {vocab_size: 300, hidden_size: 32, num_layers: 1, num_heads: 2, num_kv_heads: 1,
                           intermediate_size: 64, max_position_embeddings: 256}}
            sft: {worlds: 0, epochs: 0.5, batch_size: 4}
            rl: {iterations: 1, tasks_per_iteration: 2, group_size: 2}
            eval: {baselines: [base_tool_call], max_per_hop: 3}
            runtime: {threads: 1}
        """))
    (tmp_path / "elsewhere").mkdir()
    out = tmp_path / "out"
    agent_r1 = str(Path(sys.executable).with_name("agent-r1"))
    run = subprocess.run([agent_r1, "train", "--no-track", "--config", "../conf/pipelines.yaml", "-p", "reverse",
                          "-s", f"output_dir={out}"], cwd=tmp_path / "elsewhere", capture_output=True, text=True,
                         timeout=600, env={**os.environ, "COLUMNS": "240"})
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    results = json.loads((out / "metrics" / "eval.json").read_text())
    assert set(results) == {"test"}  # no hop counts in the data: one split, no "0hop"
    for method in ("base_tool_call", "sft", "grpo"):
        m = results["test"][method]
        assert m["n"] == 3 and m["env_errors"] == 0 and "reversed_ok" in m and "em" not in m, (method, m)
    header = next(line for line in run.stdout.splitlines() if "method" in line and "split" in line)
    assert "reversed_ok" in header and "EM" not in header and "F1" not in header, run.stdout
    sft_row = next(line for line in run.stdout.splitlines() if " sft " in line)
    assert f"{results['test']['sft']['reversed_ok']:.3f}" in sft_row, run.stdout


def test_summaries_and_transcripts_of_a_task_without_qa_fields():
    """No hop counts: one "all" summary (no "0hop"); no qtype or em: no em_by_qtype entry (whose
    "em_?" metric MLflow would refuse); the transcript shows the task's own fields."""
    from agent_r1.evaluate import summarize_by_hops
    from agent_r1.trajectory import Trajectory
    from agent_r1.transcripts import transcript

    trajs = [Trajectory("train-00000", 0, answer="enots", metrics={"reversed_ok": 1.0}, metric_aggs={"reversed_ok": "mean"})]
    tasks = [{"id": "train-00000", "split": "train", **_rows(WORDS[:1])[0]}]
    s = summarize_by_hops(trajs, tasks)
    assert set(s) == {"all"} and s["all"]["reversed_ok"] == 1.0 and s["all"]["em_by_qtype"] == {}
    text = transcript(trajs[0], tasks[0])
    assert "**Task:** {'sentence': 'stone', 'target': 'enots', 'city': 'Lorvik'" in text and "Gold" not in text
    assert "EM" not in text and "**Answer:** 'enots' · reward 0.00" in text


def test_the_results_table_shows_every_declared_metric():
    from rich.console import Console

    from agent_r1.cli import results_table

    common = {"n": 3, "tool_calls": 1.0, "format_error_rate": 0.0, "turns": 2.0, "reward": 0.5, "answered": 1.0,
              "tokens": 9.0, "env_errors": 0, "em_by_qtype": {}}
    console = Console(width=200, record=True)
    console.print(results_table({"test": {"sft": common | {"reversed_ok": 0.667}}}, "custom"))
    custom = console.export_text()
    assert "reversed_ok" in custom and "0.667" in custom and "EM" not in custom and "nan" not in custom
    console.print(results_table({"test": {"sft": common | {"f1": 0.25, "found_gold": 1.5, "em": 0.125}}}, "qa"))
    header = next(line for line in console.export_text().splitlines() if "method" in line)
    assert header.index("EM") < header.index("F1") < header.index("found_gold") < header.index("n ")
    assert "reward" not in header and "answered" not in header  # the summary's own numbers, not declared metrics


def test_a_task_in_both_splits_names_the_jsonl_files(tmp_path):
    data = _write(tmp_path / "data", _rows(WORDS[:2], id="same"), _rows(WORDS[7:8], id="same"))
    with pytest.raises(DataError, match=r"data/test\.jsonl: 1 task id\(s\) also in .*data/train\.jsonl, e\.g\. 'same'"):
        prepare_data(_config(tmp_path, data))
