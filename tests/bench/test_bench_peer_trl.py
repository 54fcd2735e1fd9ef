"""bench/peer_trl.py: its help runs without TRL; with TRL installed, the ours side runs one RL step."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from argparse import Namespace
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "peer_trl.py"


def _load():
    spec = importlib.util.spec_from_file_location("peer_trl", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_help_runs_and_names_the_ratio():
    out = subprocess.run([sys.executable, str(BENCH), "--help"], capture_output=True, text=True, check=True).stdout
    assert "ratio_trl_over_ours_step_time" in out
    assert "--model" in out


def test_model_is_tiny_smollm2_or_a_checkpoint_folder(tmp_path):
    mod = _load()
    (tmp_path / "config.json").write_text("{}")
    assert [mod.parse_args(["--model", m]).model for m in ("tiny", "smollm2", str(tmp_path))] == ["tiny", "smollm2", str(tmp_path)]
    r = subprocess.run([sys.executable, str(BENCH), "--model", str(tmp_path / "nowhere")], capture_output=True, text=True)
    assert r.returncode == 2 and "not tiny, smollm2 or a checkpoint folder" in r.stderr


@pytest.mark.slow
def test_ours_side_runs_one_step_on_the_tiny_model():
    pytest.importorskip("trl")  # the shared chat template is TRL's
    bench = _load()
    args = Namespace(model="tiny", steps=1, questions=1, group_size=2, max_new_tokens=16, turns=2, lr=1e-5, seed=0, share_prefix=True,
                     reward="em+tiebreak", precision="auto")
    res = bench.run_ours(args)
    (step,) = res["steps"]  # the warm-up step is left out
    assert res["episodes"] == 2
    assert step["gen_tokens"] > 0 and step["train_tokens"] > 0  # the two last turns differ in length: the tie-breaker gives both an advantage (8 tokens tied them)
    assert step["rollout_s"] > 0 and step["update_s"] > 0
    assert 1 <= step["turns"] <= 2


@pytest.mark.slow
def test_warmup_sft_writes_the_checkpoint_both_sides_start_from(tmp_path):
    pytest.importorskip("trl")
    from transformers import AutoTokenizer

    bench = _load()
    args = Namespace(model="tiny", warmup_sft=1, turns=3, seed=0, steps=1, questions=1)
    bench.warmup_sft(args, str(tmp_path))
    assert bench.parse_args(["--model", str(tmp_path)]).model == str(tmp_path)  # what the sides are given
    template = AutoTokenizer.from_pretrained(tmp_path).chat_template
    assert template == bench.chat_template()  # trained under the template both sides render with
