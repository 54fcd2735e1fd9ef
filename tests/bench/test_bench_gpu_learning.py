"""bench/gpu_learning.sh at smoke scale on the CPU (the tiny model): the seeds run side by side,
the control beside RL where asked, and the script ends on its result line."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from agent_r1.evaluate import seed_report

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_gpu_learning_script_runs_the_seeds_and_ends_on_the_lift_line(tmp_path):
    """Two seeds side by side (the script's default is three), the control for one of them
    (--control-seeds), and the result line over both."""
    out = tmp_path / "gpu"
    proc = subprocess.run(["bash", "bench/gpu_learning.sh", "--smoke", "--seeds", "0 1", "--control-seeds", "1",
                           "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=900,
                          env=os.environ | {"PYTHON": sys.executable})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert re.fullmatch(r"gpu_rl_lift: [+-]\d\.\d\d ± \d\.\d\d \(control [+-]\d\.\d\d on 1 of them, RL there [+-]\d\.\d\d, "
                        r"2 seeds, \d+ s\)", lines[-1]), lines[-1]
    assert lines[-2].startswith("goal: lift >= +0.20: ")
    results = [json.loads((out / f"seed{s}" / "metrics" / "eval.json").read_text()) for s in (0, 1)]
    assert "sft_control" not in results[0]["test"] and {"sft", "grpo", "sft_control"} <= set(results[1]["test"])
    assert json.loads((out / "seed0" / "metrics" / "model.json").read_text())["precision"] == "fp32"
    # the line is the seeds' mean lift: recomputed from the two eval.json files
    lift = sum(r["test"]["grpo"]["em"] - r["test"]["sft"]["em"] for r in results) / 2
    assert lines[-1].startswith(f"gpu_rl_lift: {lift:+.2f}")
    assert any(line.startswith("| test_2hop |") for line in lines)  # the per-hop table


def test_seed_report_gives_mean_and_spread_and_checks_the_goal():
    def run(sft, grpo, control, hop2=(0.0, 0.0)):
        m = lambda em: {"em": em}
        return {"test": {"sft": m(sft), "grpo": m(grpo), "sft_control": m(control)},
                "test_1hop": {"sft": m(0.9), "grpo": m(0.9), "sft_control": m(0.9)},
                "test_2hop": {"sft": m(hop2[0]), "grpo": m(hop2[1]), "sft_control": m(0.0)}}

    text = seed_report([run(0.3, 0.6, 0.36, (0.0, 0.7)), run(0.3, 0.5, 0.3, (0.0, 0.5))], name="gpu_rl_lift", wall_s=12)
    assert text.splitlines()[-1] == "gpu_rl_lift: +0.25 ± 0.07 (control +0.03, 2 seeds, 12 s)"
    assert "goal: lift >= +0.20: yes; above the control: yes; no hop count below SFT by more than 0.05: yes" in text
    assert "| test_2hop | 0.000 ± 0.000 | 0.000 ± 0.000 | 0.600 ± 0.141 |" in text  # columns sft, sft_control, grpo
    worse = seed_report([run(0.5, 0.4, 0.5, (0.5, 0.2))])
    assert "lift >= +0.20: no; above the control: no; no hop count below SFT by more than 0.05: no (worst -0.30)" in worse
    # the control ran for one seed of two (--control-seeds): compared with RL on that seed alone
    uncontrolled = run(0.3, 0.3, 0.0)
    del uncontrolled["test"]["sft_control"]
    mixed = seed_report([run(0.3, 0.6, 0.4), uncontrolled])
    assert mixed.splitlines()[-1] == "grpo_lift: +0.15 ± 0.21 (control +0.10 on 1 of them, RL there +0.30, 2 seeds)"
    assert "above the control: yes" in mixed and "sft_control" not in mixed.splitlines()[0]
    with pytest.raises(ValueError, match="needs method 'grpo'"):
        seed_report([{"test": {"sft": {"em": 0.1}}}])
