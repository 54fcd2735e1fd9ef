"""The command line shows an expected error (bad config, bad data, a missing file) as one red
line and exit code, not a traceback; ``--debug`` shows the traceback."""

import pytest
from typer.testing import CliRunner

from agent_r1.cli import app


def run(*args):
    return CliRunner().invoke(app, list(args))


def _one_error_line(result, code, text):
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output and len(lines) == 1, result.output
    assert text in lines[0], lines[0]


def test_a_missing_config_file_is_one_line(tmp_path):
    result = run("show-config", "--config", str(tmp_path / "nope.yaml"))
    _one_error_line(result, 2, f"{tmp_path / 'nope.yaml'}: config file not found")


def test_a_bad_value_is_one_line():
    result = run("show-config", "-s", "rl.learner.kl_kind=k9")
    _one_error_line(result, 2, "rl.learner.kl_kind: unknown 'k9'; known: k1, k2, k3")


def test_recall_before_prepare_is_one_line_and_debug_shows_the_traceback(tmp_path):
    args = ["recall", "-s", f"output_dir={tmp_path / 'out'}"]
    _one_error_line(run(*args), 1, "test.parquet not found: run the prepare stage first")
    result = run("--debug", *args)
    assert result.exit_code == 1 and isinstance(result.exception, FileNotFoundError)


@pytest.mark.parametrize("train, message", [
    (b'{"id": "caf\xe9"}\n', "train.jsonl: line 1: not UTF-8 text (byte 0xe9)"),
    (b'{"id": ' + b"[" * 100_000 + b"\n", "train.jsonl: line 1: invalid JSON: nested too deeply"),
    (b"", "train.jsonl: no questions in the file"),
])
def test_stage_shows_a_data_error_as_one_line(tmp_path, train, message):
    src = tmp_path / "hotpot"
    src.mkdir()
    (src / "train.jsonl").write_bytes(train)
    (src / "dev.jsonl").write_bytes(b"")
    result = run("stage", "prepare", "--no-track", "-s", f"output_dir={tmp_path / 'out'}", "-s", "data.source=hotpotqa",
                 "-s", f"data.path={src}", "-s", "sft.worlds=0", "-s", "sft.hops=[2]", "-s", "eval.hops=[2]")
    _one_error_line(result, 1, f"error: {src / message}")
