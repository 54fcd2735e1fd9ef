"""The Prefect flows with real Prefect and real MLflow (SQLite in a temp folder), tiny sizes.

One Prefect server (``prefect_test_harness``, a subprocess) serves the whole module: the flows run
in this process, the kill test's ``python -m flows.training``, and the deployment tests'
``python -m flows.deploy`` and process-pool worker (``prefect server start`` itself is checked by
tests/test_infra.py's infra/local.sh test). Nothing
here imports Prefect at collection time: ``PREFECT_HOME`` must point at a temp folder first.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent_r1.tracking import Tracker

REPO = Path(__file__).resolve().parents[1]
TINY = [
    "data.n_films=24", "data.n_directors=8", "data.n_studios=4", "sft.worlds=1", "sft.epochs=1.8", "rl.tasks_per_iteration=4",
    "rl.group_size=2", "eval.max_per_hop=4", "model.tiny.num_layers=1", "model.tiny.hidden_size=32",
    "model.tiny.num_heads=2", "model.tiny.num_kv_heads=1", "model.tiny.intermediate_size=64",
    "model.tiny.vocab_size=400",
    # the gate compares rewards: at these sizes EM is 0 for every agent, the reward is not
    "registry.metric=reward",
]


def tiny(out: Path, *more: str) -> list[str]:
    return TINY + [f"output_dir={out}", *more]


@pytest.fixture(scope="module")
def prefect_home(tmp_path_factory):
    """Prefect's home (profiles, UI build, local storage) in a temp folder, set before Prefect loads."""
    home = tmp_path_factory.mktemp("prefect_home")
    mp = pytest.MonkeyPatch()
    mp.setenv("PREFECT_HOME", str(home))
    yield home
    mp.undo()


@pytest.fixture(scope="module")
def harness(prefect_home):
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        from prefect.settings import PREFECT_API_URL

        yield PREFECT_API_URL.value()


def mlflow_env(monkeypatch, root: Path) -> Tracker:
    uri = f"sqlite:///{root}/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return Tracker(uri=uri, project_dir=root)


@pytest.fixture(scope="module")
def trained(harness, tmp_path_factory):
    """One training flow run. SFT long enough that the agent beats a random model on reward (20 epochs:
    270 steps; 6 epochs of nine worlds' demonstrations, 729 steps, gave the same rewards). A format
    error threshold of 0 raises the format_errors alarm whatever the agent writes: the run needs a look."""
    from flows.training import TrainingParams, training_flow

    root = tmp_path_factory.mktemp("trained")
    mp = pytest.MonkeyPatch()
    tracker = mlflow_env(mp, root)
    try:
        state = training_flow(TrainingParams(pipeline="tiny", overrides=tiny(root / "out", "sft.epochs=20", "rl.iterations=2",
                                                                   "health.patience=1", "health.format_error_rate=0")),
                              return_state=True)
    finally:
        mp.undo()
    return {"out": root / "out", "tracker": tracker, "state": state, "result": state.result()}


def _flow_run_records(flow_run_id):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    client = get_client(sync_client=True)
    only = FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]))
    return client.read_task_runs(flow_run_filter=only), client.read_artifacts(flow_run_filter=only)


@pytest.mark.slow
def test_training_flow_runs_every_stage_and_registers(trained):
    out, tracker, result = trained["out"], trained["tracker"], trained["result"]
    assert trained["state"].is_completed()
    # the health alarm: in the result, on the MLflow runs, and the flow run marked as needing a look
    assert result["health"] == {"grpo": ["format_errors"]}
    assert trained["state"].message == "needs a look: grpo: format_errors"
    written = json.loads((out / "metrics" / "eval.json").read_text())
    assert {"sft", "grpo"} <= set(written["test"]) and written["test"]["grpo"] == result["eval"]["test"]["grpo"]
    # MLflow: one finished pipeline run, a nested run per stage, a metric point per RL iteration
    run_id = result["mlflow_run_id"]
    assert tracker.run_info(run_id)["status"] == "FINISHED"
    params = tracker.run_info(run_id)["params"]  # the precision computed in, beside the setting
    assert params["precision_computed"] == "fp32" and params["model.precision"] == "auto"
    stages = tracker.child_runs(run_id)
    assert set(stages) == {"prepare", "sft", "train", "evaluate", "register"}
    assert [step for step, _ in tracker.metric_history(stages["train"], "reward_mean")] == [1, 2]
    assert tracker.run_info(stages["prepare"])["params"]["data_version"] == result["data_version"]
    assert [v for _, v in tracker.metric_history(stages["train"], "health/format_errors")] == [1, 1]
    assert tracker.run_info(run_id)["tags"]["health_alarms"] == "grpo: format_errors"
    assert tracker.run_info(stages["train"])["tags"]["health_alarms"] == "format_errors"
    # the registry: the first agent is the champion
    reg = result["register"]
    assert reg["alias"] == "champion" and tracker.alias_version("agent-r1", "champion")["version"] == reg["version"]
    # Prefect: each piece of each RL iteration is a task run; progress and report artifacts
    task_runs, artifacts = _flow_run_records(trained["state"].state_details.flow_run_id)
    names = {t.name for t in task_runs}
    phases = ("sample_episodes", "build_train_batch", "update_policy", "end_iteration")
    per_iteration = {f"{p}-grpo-{i}" for p in phases for i in (1, 2)}
    assert per_iteration <= names
    assert {"prepare", "sft", "rl-setup", "rl-finish", "evaluate", "register"} <= {n.rsplit("-", 1)[0] for n in names}
    assert all(t.state.is_completed() for t in task_runs)
    # the data passed between the pieces (opaque to Prefect) still links them in the run graph.
    # Prefect finds these links by id() of earlier results, and CPython reuses the id of a freed
    # result, so an input may also carry a stale link to an older task run: test inclusion
    by_name = {t.name: t for t in task_runs}
    def linked(task, arg):
        return {i.id for i in by_name[task].task_inputs[arg]}
    assert by_name["sample_episodes-grpo-2"].id in linked("build_train_batch-grpo-2", "trajs")
    assert by_name["update_policy-grpo-2"].id in linked("end_iteration-grpo-2", "stats")
    by_type = {a.type: a for a in artifacts}
    assert by_type["progress"].data == 100.0 and "iteration 2/2" in by_type["progress"].description
    report = by_type["markdown"].data
    assert "| test | grpo |" in report and f"version {reg['version']} as **champion**" in report
    assert "**Needs a look**: alarms raised (grpo: format_errors)" in report
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        assert "needs-a-look" in client.read_flow_run(trained["state"].state_details.flow_run_id).tags


@pytest.mark.slow
def test_evaluation_flow_scores_a_registered_agent(trained, tmp_path, monkeypatch):
    from flows.evaluation import EvaluationParams, evaluation_flow

    monkeypatch.setenv("MLFLOW_TRACKING_URI", trained["tracker"].uri)
    sft_dir = str(trained["out"] / "checkpoints" / "sft")
    res = evaluation_flow(EvaluationParams(pipeline="tiny", overrides=tiny(tmp_path / "out"),
                                           models={"champion": "models:/agent-r1@champion", "sft": sft_dir}))
    trained_eval = trained["result"]["eval"]
    assert set(res["eval"]["test"]) == {"champion", "sft"}
    # the same data version and tasks as training: the registered agent scores as it did there
    assert res["data_version"] == trained["result"]["data_version"]
    assert res["eval"]["test"]["champion"] == trained_eval["test"]["grpo"]
    assert res["eval"]["test"]["sft"] == trained_eval["test"]["sft"]
    assert trained["tracker"].run_info(res["mlflow_run_id"])["status"] == "FINISHED"


@pytest.mark.slow
def test_retraining_promotes_only_a_better_agent(trained, tmp_path, monkeypatch):
    """A weak champion (the random init) is replaced by a trained agent; an agent that only
    equals the champion (RL for 0 iterations from it) stays challenger."""
    from flows.retrain import retraining_flow
    from flows.training import PipelineParams

    ev = trained["result"]["eval"]["test"]
    assert ev["sft"]["reward"] > ev["base_tool_call"]["reward"], "the tiny SFT agent must beat its random init"
    tracker = mlflow_env(monkeypatch, tmp_path)
    seed_run = tracker.start_pipeline_run("weak-champion", {})
    weak = tracker.log_agent(seed_run, trained["out"] / "checkpoints" / "base", "agent-r1", alias="champion")
    sft_dir = trained["out"] / "checkpoints" / "sft"

    better = retraining_flow(PipelineParams(pipeline="tiny", overrides=tiny(tmp_path / "r1", f"rl.init_from={sft_dir}", "rl.iterations=1")))
    reg = better["register"]
    assert better["promoted"] and reg["alias"] == "champion" and "beats champion" in reg["reason"]
    assert reg["score"] > reg["champion_score"] == better["eval"]["test"]["champion"]["reward"]
    assert better["champion"] == f"models:/agent-r1/{weak}"
    assert tracker.alias_version("agent-r1", "champion")["version"] == reg["version"]

    same = retraining_flow(PipelineParams(pipeline="tiny", overrides=tiny(tmp_path / "r2", "rl.iterations=0")))
    reg2 = same["register"]
    assert same["init_from"] == f"models:/agent-r1/{reg['version']}"  # RL started from the champion
    assert not same["promoted"] and reg2["alias"] == "challenger" and "does not beat" in reg2["reason"]
    assert reg2["score"] == reg2["champion_score"]
    assert tracker.alias_version("agent-r1", "champion")["version"] == reg["version"]
    assert tracker.alias_version("agent-r1", "challenger")["version"] == reg2["version"]


def _python_env(**extra: str) -> dict:
    from agent_r1.pipeline.env import OFFLINE  # also for `prefect server`, which never imports flows

    env = {**os.environ, **OFFLINE, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **extra}
    # this process's DeepSpeed process group (started by an earlier test) set these; a child
    # that inherited them would try to bind the same rendezvous port
    for var in ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "PREFECT_API_KEY"):
        env.pop(var, None)
    return env


@pytest.mark.slow
def test_killed_training_flow_resumes_into_the_same_run(harness, prefect_home, tmp_path):
    """`make run`'s command (python -m flows.training) killed with -9 during RL, at the default
    pipeline's save cadence and iteration count (tiny sizes otherwise): the same command again
    skips SFT, continues after the saved iteration into the same MLflow run, and finishes."""
    from agent_r1.config import load_config

    default = load_config("default", REPO / "pipelines.yaml")
    iterations, every = default.rl.iterations, default.rl.checkpoint_every
    assert every < iterations  # make run saves mid-RL
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "flows.training", "-p", "tiny", "--no-register"]
    for o in tiny(out, f"rl.iterations={iterations}", f"rl.checkpoint_every={every}",
                  f"sft.checkpoint_every={default.sft.checkpoint_every}"):
        cmd += ["-s", o]
    env = _python_env(PREFECT_API_URL=harness, PREFECT_HOME=str(prefect_home),
                      MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path}/mlflow.db")
    meta = out / "state" / "rl_grpo" / "meta.json"
    with open(tmp_path / "first.log", "w") as log:
        first = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 300
        while not meta.exists() and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert first.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
        first.send_signal(signal.SIGKILL)
        first.wait()
    saved = json.loads(meta.read_text())["step"]
    assert saved % every == 0 and every <= saved < iterations
    run_id = json.loads((out / "state" / "mlflow_run.json").read_text())["run_id"]

    second = subprocess.run(cmd, check=False, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            timeout=600)
    log = second.stdout
    (tmp_path / "second.log").write_text(log)
    assert second.returncode == 0, log[-3000:]
    assert "sft: " in log and "is up to date for this config; skipping" in log  # SFT not trained again
    assert f"RL grpo: resuming after iteration {saved} of {iterations}" in log
    # the re-run's RL tasks are the iterations after the saved one, none from 1
    ran = {i for i in range(1, iterations + 1) if f"sample_episodes-grpo-{i}'" in log}
    assert ran == set(range(saved + 1, iterations + 1)), (saved, sorted(ran))
    history = json.loads((out / "metrics" / "train" / "grpo.json").read_text())
    assert [h["iteration"] for h in history] == list(range(1, iterations + 1))
    tracker = Tracker(uri=env["MLFLOW_TRACKING_URI"], project_dir=tmp_path)
    pipeline_runs = tracker.client.search_runs([tracker.experiment_id], "attributes.run_name = 'tiny'")
    assert [r.info.run_id for r in pipeline_runs] == [run_id]
    assert tracker.run_info(run_id)["status"] == "FINISHED"
    train_run = tracker.child_runs(run_id)["train"]
    assert {s for s, _ in tracker.metric_history(train_run, "reward_mean")} == set(range(1, iterations + 1))


def _stop(proc: subprocess.Popen) -> None:
    """End a process this test started, and its children (it leads its own process group)."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@contextlib.contextmanager
def _served_by(api: str, tmp_path: Path, log: str, **settings: str):
    """The environment that points a process at the Prefect server ``api`` (a Prefect home and
    MLflow under ``tmp_path``, ``settings``), the open log file ``log``, and ``started(proc)``, which
    registers a process the test starts; at the end those processes are stopped and the log closed."""
    env = _python_env(PREFECT_HOME=str(tmp_path / "prefect_home"), PREFECT_API_URL=api, PREFECT_UI_ENABLED="false",
                      MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path}/mlflow.db", **settings)
    procs = []

    def started(proc: subprocess.Popen) -> subprocess.Popen:
        procs.append(proc)
        return proc

    with open(tmp_path / f"{log}.log", "w") as logfile:
        try:
            yield env, logfile, started
        finally:
            for proc in reversed(procs):
                _stop(proc)


@pytest.mark.slow
def test_served_deployments_run_from_the_api(harness, tmp_path):
    """`python -m flows.deploy` against the module's Prefect server, a run triggered through the
    API (as the UI does) that completes: retraining on an empty registry (SFT, RL, register)."""
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment

    # the served process picks up new runs within 1 s
    with _served_by(harness, tmp_path, "serve", PREFECT_RUNNER_POLL_FREQUENCY="1") as (env, log, started):
        served = started(subprocess.Popen([sys.executable, "-m", "flows.deploy", "--cron", "0 4 * * 0"], cwd=REPO,
                                          env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
        client = get_client(sync_client=True)
        deadline = time.monotonic() + 180
        while True:
            assert served.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
            names = {d.name for d in client.read_deployments()}
            if names >= {"training", "evaluation", "retraining"}:
                break
            assert time.monotonic() < deadline, names
            time.sleep(1)
        retraining = client.read_deployment_by_name("retraining/retraining")
        assert [s.schedule.cron for s in retraining.schedules] == ["0 4 * * 0"]
        overrides = tiny(tmp_path / "out", "rl.iterations=1")
        run = run_deployment("retraining/retraining", parameters={"params": {"pipeline": "tiny", "overrides": overrides}},
                             timeout=400, poll_interval=1)
        assert run.state.is_completed(), (tmp_path / "serve.log").read_text()[-3000:]
        tracker = Tracker(uri=env["MLFLOW_TRACKING_URI"], project_dir=tmp_path)
        champion = tracker.alias_version("agent-r1", "champion")
        assert champion is not None and champion["version"] == "1"
        assert (tmp_path / "out" / "checkpoints" / "sft" / "config.json").exists()  # no champion: SFT first


@pytest.mark.slow
def test_a_process_pool_worker_runs_the_training_deployment_that_another_flow_dispatches(harness, tmp_path, monkeypatch,
                                                                                          capsys):
    """The module's Prefect server, a process work pool and a worker of it (limit 1), the deployments
    registered with the pool (`python -m flows.deploy --pool`'s main, in this process, from the
    repository root; retraining on its cron: the same deployments the test before served, now the
    pool's, their schedule replaced), and the dispatch flow starting the training deployment with
    run_deployment: the worker runs the tiny pipeline to the end, and MLflow holds its run and the
    registered agent."""
    from prefect.client.orchestration import get_client

    from flows.deploy import main as deploy
    from flows.dispatch import dispatch_flow

    pool = "agent-r1-test"
    with _served_by(harness, tmp_path, "worker", PREFECT_WORKER_QUERY_SECONDS="1") as (env, log, started):
        created = subprocess.run([sys.executable, "-m", "prefect", "work-pool", "create", pool, "--type", "process"],
                                 cwd=tmp_path, env=env, text=True, capture_output=True, timeout=300)
        assert created.returncode == 0, created.stdout + created.stderr
        monkeypatch.chdir(REPO)
        deploy(["--pool", pool, "--cron", "0 5 * * 0"])
        assert "registered 3 deployments" in capsys.readouterr().out
        worker = started(subprocess.Popen([sys.executable, "-m", "prefect", "worker", "start", "--pool", pool, "--limit", "1"],
                                          cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT,
                                          start_new_session=True))
        client = get_client(sync_client=True)
        training = client.read_deployment_by_name("training/training")
        assert training.work_pool_name == pool and training.job_variables == {"working_dir": str(REPO)}
        retraining = client.read_deployment_by_name("retraining/retraining")
        assert [s.schedule.cron for s in retraining.schedules] == ["0 5 * * 0"]
        result = dispatch_flow("training/training", {"pipeline": "tiny", "overrides": tiny(tmp_path / "out", "rl.iterations=1")},
                               timeout_s=500, poll_interval_s=1)
        flow_run = client.read_flow_run(result["flow_run_id"])
        assert flow_run.state.is_completed() and flow_run.work_pool_name == pool, (tmp_path / "worker.log").read_text()[-3000:]
        assert worker.poll() is None  # the worker ran it (as a subprocess) and is still polling
        tracker = Tracker(uri=env["MLFLOW_TRACKING_URI"], project_dir=tmp_path)
        pipeline_runs = tracker.client.search_runs([tracker.experiment_id], "attributes.run_name = 'tiny'")
        assert [r.info.status for r in pipeline_runs] == ["FINISHED"]
        assert tracker.alias_version("agent-r1", "champion")["version"] == "1"
