"""Evaluation scores what it is given: `agent-r1 evaluate CHECKPOINT --data FILE` prepares and
scores a user's rows in one command (no training file), every row of them, in the env settings the
checkpoint was trained with (a different pipeline's are named, not used), into an output of its
own, with the score of each kind of task printed."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd

from agent_r1.checkpoints import trained_settings
from agent_r1.config import load_config, parse_overrides
from agent_r1.data.code_tasks import CODE_FIELDS, CodeTaskConfig, generate_code_tasks
from agent_r1.learner import save_hf_checkpoint
from agent_r1.pipeline.state import record_settings, trained_with

ROOT = Path(__file__).resolve().parents[1]
# what the checkpoint is trained with: code-tiny's env, one short turn (the default pipeline: 4 turns of 48 tokens)
TRAINED = ["env.max_turns=1", "env.max_new_tokens=8", "env.system_prompt=Compute it, then answer."]


def readme_evaluate_line() -> str:
    """The README's `agent-r1 evaluate ... --data ...` command."""
    from tests.test_readme import readme_commands

    [line] = [c for c in readme_commands() if c.startswith(".venv/bin/agent-r1 evaluate") and "--data" in c]
    return line


def _code_rows(per_kind: int) -> list[dict]:
    """A user's file of `code` rows: the task fields only, no id, no hop counts."""
    rows = generate_code_tasks(CodeTaskConfig(seed=7, n_train=0, n_test=per_kind))["test"]
    return [{k: r[k] for k in CODE_FIELDS} for r in rows]


def _checkpoint(folder: Path, make_model, tok, overrides: list[str]) -> Path:
    """A tiny model saved as a training run saves its agent: weights, tokenizer, the settings."""
    save_hf_checkpoint(make_model(seed=3), folder, tok)
    record_settings(folder, trained_with(load_config("code-tiny", ROOT / "pipelines.yaml", parse_overrides(overrides))))
    return folder


def test_the_readme_command_scores_every_row_of_a_file_in_the_env_it_was_trained_with(tmp_path, make_model, tok):
    line = readme_evaluate_line()
    argv = line.split()
    checkpoint, data = Path(argv[2]), Path(argv[argv.index("--data") + 1])
    _checkpoint(tmp_path / checkpoint, make_model, tok, TRAINED)
    rows = _code_rows(8)
    assert len(rows) == 48
    (tmp_path / data).write_text("".join(json.dumps(r) + "\n" for r in rows))  # no train.jsonl anywhere
    env = {**os.environ, "COLUMNS": "200", "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlruns.db'}"}
    run = subprocess.run([str(Path(sys.executable).with_name("agent-r1")), *argv[1:]], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=900)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-5000:]

    out = tmp_path / "outputs" / "evaluations" / data.name.removesuffix(".jsonl")  # its own output
    results = json.loads((out / "metrics" / "eval.json").read_text())
    [method] = results["test"]
    scored = results["test"][method]
    assert scored["n"] == 48  # every row: the default pipeline's eval.max_per_hop (100) and code-tiny's (30) cap hop counts only
    assert scored["turns"] == 1.0 and scored["tokens"] <= 8  # the trained env.max_turns / max_new_tokens, not the pipeline's
    assert "code_runs" in scored  # scored by the code environment, the pipeline's being multihop_qa
    # the pipeline's differing settings are named, each with the value used
    assert "env.name='code' as trained (pipeline 'default': 'multihop_qa')" in output, output[-5000:]
    assert "env.system_prompt='Compute it, then answer.' as trained" in output
    # the score of every kind of task, in the printed table too
    kinds = sorted({r["qtype"] for r in rows})
    assert sorted(scored["em_by_qtype"]) == kinds
    table = output[output.index("EM by kind (qtype)"):]
    assert all(k in table for k in kinds), table
    assert pd.read_parquet(out / "data" / "test.parquet").shape[0] == 48 and not (out / "data" / "train.parquet").exists()


def test_a_setting_given_on_the_command_line_wins_over_the_trained_one_and_says_so(tmp_path, make_model, tok, caplog):
    from agent_r1.pipeline.stages import trained_config

    folder = _checkpoint(tmp_path / "agent", make_model, tok, TRAINED)
    assert trained_settings(folder)["env"]["max_turns"] == 1
    cfg = load_config("tiny", overrides=parse_overrides(["env.max_turns=3"]))
    with caplog.at_level(logging.WARNING):
        used = trained_config(cfg, str(folder), env_set={"max_turns"}, method="grpo")
    assert used.env.max_turns == 3 and used.env.name == "code" and used.env.max_new_tokens == 8
    assert used.env.system_prompt == "Compute it, then answer."
    message = caplog.records[-1].getMessage()
    assert "env.max_turns=3 as given (trained: 1)" in message and "env.name='code' as trained (pipeline 'tiny'" in message
    # the pipeline's own checkpoints (env_set None): the pipeline's env, the difference named
    assert trained_config(cfg, str(folder)).env == cfg.env
    assert trained_config(cfg, str(tmp_path)) is cfg  # a folder without settings: the pipeline's


def test_the_evaluation_scores_every_row_without_hop_counts_and_names_a_cap(tmp_path, caplog):
    from agent_r1.run import eval_tasks

    cfg = load_config("code-tiny", ROOT / "pipelines.yaml")
    assert cfg.eval.max_per_hop == 30
    rows = pd.DataFrame({"id": [f"r{i}" for i in range(48)], "split": "test", "qtype": "k",
                         "task": [json.dumps({"id": f"r{i}"}) for i in range(48)]})
    with caplog.at_level(logging.INFO, logger="agent_r1.run"):
        assert len(eval_tasks(cfg, rows)) == 48
        assert not caplog.records
        hops = rows.assign(hops=[1] * 40 + [2] * 8)
        assert len(eval_tasks(cfg.model_copy(update={"eval": cfg.eval.model_copy(update={"hops": [1, 2]})}), hops)) == 38
    assert "38 of the 48 test rows are scored (eval.max_per_hop=30 caps hop count(s) 1 (40 rows))" in caplog.text


def test_a_file_of_rows_needs_no_training_file_and_replaces_results_of_other_rows(tmp_path, caplog):
    from agent_r1.pipeline.stages import _earlier_results
    from agent_r1.run import prepare_data

    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _code_rows(2)))
    cfg = load_config("code-tiny", ROOT / "pipelines.yaml", parse_overrides(
        ["data.source=jsonl", f"data.path={tmp_path / 'rows.jsonl'}", f"output_dir={tmp_path / 'out'}"]))
    data_dir = prepare_data(cfg)
    assert sorted(p.name for p in data_dir.glob("*.parquet")) == ["test.parquet"]
    eval_json = tmp_path / "out" / "metrics" / "eval.json"
    eval_json.parent.mkdir(parents=True)
    eval_json.write_text(json.dumps({"test": {"sft": {"em": 0.5}}}))
    (eval_json.parent / "eval_data.json").write_text(json.dumps({"data_version": "other", "split": "test"}))
    with caplog.at_level(logging.WARNING):
        assert _earlier_results(eval_json, {"data_version": "this", "split": "test"}) == {}
    assert "scored other rows" in caplog.text
    assert _earlier_results(eval_json, {"data_version": "other", "split": "test"}) == {"test": {"sft": {"em": 0.5}}}
