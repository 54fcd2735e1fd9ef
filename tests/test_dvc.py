"""dvc.yaml with real DVC, in a scratch git repository (no mocks).

The scratch repository holds copies of dvc.yaml, .dvcignore, .dvc/config and the agent_r1 code
(the stages' code dependencies); its pipelines.yaml is the repository's default pipeline with the
tiny sizes of tests/test_run.py. The stages run the installed ``agent-r1`` console script and log
to an MLflow SQLite file in the scratch folder.
"""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from agent_r1.config import parse_overrides
from agent_r1.dicts import deep_merge

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
STAGES = ["prepare", "sft", "train", "evaluate", "register"]
# tests/test_run.py's tiny sizes
TINY = [
    "data.n_films=24", "data.n_directors=8", "data.n_studios=4", "sft.worlds=1", "sft.epochs=1.8", "rl.iterations=2",
    "rl.tasks_per_iteration=4", "rl.group_size=2", "eval.max_per_hop=4", "model.tiny.num_layers=1",
    "model.tiny.hidden_size=32", "model.tiny.num_heads=2", "model.tiny.num_kv_heads=1",
    "model.tiny.intermediate_size=64", "model.tiny.vocab_size=400",
]


def _env(tmp: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DVC_", "MLFLOW_"))}
    # DVC_NO_ANALYTICS: `dvc init` runs before .dvc/config (core.analytics false) is in place
    env.update(PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}", OMP_NUM_THREADS="1", DVC_NO_ANALYTICS="1",
               MLFLOW_TRACKING_URI=f"sqlite:///{tmp / 'mlflow.db'}")
    return env


def _run(args: list[str], cwd: Path, env: dict, timeout: int = 900) -> str:
    r = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    out = r.stdout + r.stderr
    assert r.returncode == 0, f"{' '.join(args)} failed ({r.returncode}):\n{out[-6000:]}"
    return out


def scratch_repo(tmp: Path, pipeline: dict) -> Path:
    """A git + DVC repository with this project's DVC files, code and ``pipeline`` as default."""
    repo = tmp / "repo"
    repo.mkdir()
    for name in ("dvc.yaml", ".dvcignore", ".gitignore"):
        shutil.copy(ROOT / name, repo / name)
    if ".dvc-site-cache/" not in (repo / ".gitignore").read_text():  # core.site_cache_dir
        with open(repo / ".gitignore", "a") as f:
            f.write("\n.dvc-site-cache/\n")
    shutil.copytree(ROOT / "agent_r1", repo / "agent_r1", ignore=shutil.ignore_patterns("__pycache__"))
    (repo / "pipelines.yaml").write_text(yaml.safe_dump({"pipelines": {"default": pipeline}}, sort_keys=False))
    env = _env(tmp)
    _run(["git", "init", "-q"], repo, env)
    _run(["git", "config", "user.name", "test"], repo, env)
    _run(["git", "config", "user.email", "test@example.invalid"], repo, env)
    # `dvc init` runs before .dvc/config exists: point its site cache into the repository too
    _run([str(BIN / "dvc"), "init", "-q"], repo, env | {"DVC_SITE_CACHE_DIR": str(repo / ".dvc-site-cache")})
    shutil.copy(ROOT / ".dvc" / "config", repo / ".dvc" / "config")
    _run(["git", "add", "-A"], repo, env)
    _run(["git", "commit", "-qm", "scratch"], repo, env)
    return repo


def repo_pipeline(name: str = "tiny") -> dict:
    """A pipeline of the repository's pipelines.yaml (the tests run ``tiny`` as the scratch
    repository's default)."""
    return yaml.safe_load((ROOT / "pipelines.yaml").read_text())["pipelines"][name]


def ran(output: str) -> list[str]:
    return re.findall(r"Running stage '(\w+)'", output)


@pytest.mark.parametrize("pipeline", ["default", "tiny"])
def test_dvc_yaml_params_deps_and_config_resolve(tmp_path, monkeypatch, pipeline):
    """Every param dvc.yaml lists exists in the repository's pipelines.yaml (the default
    pipeline and the tiny one), every code dependency exists, no stage touches state/, and
    .dvc/config keeps DVC offline and its site cache inside the project."""
    repo = scratch_repo(tmp_path, repo_pipeline(pipeline))
    monkeypatch.chdir(repo)  # core.site_cache_dir is relative to where DVC runs
    monkeypatch.delenv("DVC_SITE_CACHE_DIR", raising=False)
    from dvc.dependency.param import ParamsDependency
    from dvc.repo import Repo

    with Repo(str(repo)) as dvc:
        core = dvc.config["core"]
        assert core["analytics"] is False and core["check_update"] is False
        assert Path(dvc.site_cache_dir).resolve().is_relative_to(repo.resolve())
        stages = {s.name: s for s in dvc.index.stages}
        assert list(stages) == STAGES
        for name, stage in stages.items():
            assert stage.cmd == f'PATH=".venv/bin:$PATH" agent-r1 stage {name} -p default'
            for dep in stage.deps:
                path = Path(dep.fs_path).relative_to(repo).as_posix()
                if isinstance(dep, ParamsDependency):
                    missing = set(dep.params) - set(dep.read_params())
                    assert not missing, f"{name}: {path} lacks {sorted(missing)}"
                elif not path.startswith("outputs/"):
                    assert dep.exists, f"{name}: code dependency {path} does not exist"
            for out in stage.outs:
                path = Path(out.fs_path).relative_to(repo).as_posix()
                assert path.startswith("outputs/default/") and "/state" not in path, path
    assert (repo / ".dvc-site-cache" / "repo").is_dir()


@pytest.mark.slow
@pytest.mark.timeout(1800)  # five stage processes: about 2 min on the 2-core machine
def test_dvc_repro_from_scratch_then_nothing_and_metrics(tmp_path):
    """`dvc repro` runs the five stages; again it runs none; metrics show the numbers.
    (`dvc exp run` re-running train onward only is checked by tests/test_readme.py, which runs
    the README's `dvc exp run` after `make run`.)"""
    repo = scratch_repo(tmp_path, deep_merge(repo_pipeline(), parse_overrides(TINY)))
    env = _env(tmp_path)
    dvc = [str(BIN / "dvc")]
    out = repo / "outputs" / "default"

    assert ran(_run(dvc + ["repro"], repo, env)) == STAGES
    eval_json = json.loads((out / "metrics" / "eval.json").read_text())
    assert eval_json["test_2hop"]["grpo"]["n"] == 4 and "sft" in eval_json["test"]
    assert [h["iteration"] for h in json.loads((out / "metrics" / "train" / "grpo.json").read_text())] == [1, 2]
    assert int(json.loads((out / "metrics" / "register.json").read_text())["version"]) == 1
    assert (repo / ".dvc-site-cache" / "repo").is_dir()  # core.site_cache_dir is honoured
    metrics = json.loads(_run(dvc + ["metrics", "show", "--json"], repo, env))
    assert metrics[""]["data"]["outputs/default/metrics/eval.json"]["data"] == eval_json

    second = _run(dvc + ["repro"], repo, env)
    assert ran(second) == [] and "Data and pipelines are up to date" in _run(dvc + ["status"], repo, env)


def test_only_the_run_dvc_yaml_describes_is_recorded(tmp_path, monkeypatch):
    """dvc.lock may only claim outputs made with pipelines.yaml's params for dvc.yaml's pipeline."""
    from agent_r1.config import load_config
    from agent_r1.pipeline.dvc_lock import record_in_dvc_lock, why_not_recorded

    repo = scratch_repo(tmp_path, repo_pipeline())
    monkeypatch.chdir(repo)
    cfg = load_config("default", "pipelines.yaml")
    assert why_not_recorded(cfg, "pipelines.yaml", []) is None
    assert why_not_recorded(cfg, None, None) is None  # the CLI's default: ./pipelines.yaml
    assert "overrides" in why_not_recorded(cfg, "pipelines.yaml", ["rl.iterations=1"])
    other = tmp_path / "other.yaml"
    shutil.copy(repo / "pipelines.yaml", other)
    assert "./pipelines.yaml" in why_not_recorded(cfg, other, [])
    assert "'default', not 'tiny'" in why_not_recorded(cfg.model_copy(update={"name": "tiny"}), "pipelines.yaml", [])
    moved = cfg.model_copy(update={"output_dir": "elsewhere"})
    assert "output_dir elsewhere" in why_not_recorded(moved, "pipelines.yaml", [])
    # no outputs yet: nothing is committed and dvc.lock is not written
    assert record_in_dvc_lock(cfg, "pipelines.yaml", []) == [] and not (repo / "dvc.lock").exists()
    shutil.rmtree(repo / ".git")  # a copy that is not a git checkout: DVC refuses, the run still ends well
    assert record_in_dvc_lock(cfg, "pipelines.yaml", []) == []
    monkeypatch.chdir(tmp_path)
    assert "no dvc.yaml" in why_not_recorded(cfg, "pipelines.yaml", [])
