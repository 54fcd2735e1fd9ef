"""The pipeline on N ranks: real torchrun, gloo on this CPU, DeepSpeed, MLflow (SQLite), the tiny model.

Two ranks (on one node, or two "nodes" of one rank each on 127.0.0.1) train to what one process
trains with the same global batch and seed (``rl.rollout_shards=2`` on both: the same two
rollout batches, each from its own seed, whichever ranks run them):

- metrics: equal to ``rel=1e-4, abs=1e-6`` (as tests/test_kill.py). They agree to ~1e-7: the ranks
  add the same float32 terms in another order (each rank's micro-batches, then the all-reduce);
  the held-out evaluation (greedy) is exactly equal.
- weights: for every tensor, ``max|a - b| <= 1e-4 * max|b|`` (observed ~6e-6). The same rounding
  differences reach the gradients at ~1e-7 relative; Adam divides each moment by the root of the
  second, so a step's error stays a small fraction of the step (lr) and cannot grow past it over
  a few steps. An element-wise relative bound would not hold for weights that are nearly 0
  (their few-1e-9 differences are a large share of them).

Each run is a subprocess of ``agent-r1 train`` (about 30-45 s on two busy cores).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from agent_r1.config import ConfigError, load_config, parse_overrides
from tests.machine_metrics import of_the_run

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = [
    "data.n_films=24", "data.n_directors=8", "data.n_studios=4", "sft.worlds=1", "sft.epochs=4", "rl.iterations=2",
    "rl.tasks_per_iteration=4", "rl.group_size=2", "rl.rollout_shards=2", "rl.checkpoint_every=1",
    # every row gets a gradient (the entropy bonus) even where a group's rewards are equal
    "rl.learner.entropy_coef=0.01", "eval.max_per_hop=2", "model.precision=fp32", "model.tiny.num_layers=1",
    "model.tiny.hidden_size=32", "model.tiny.num_heads=2", "model.tiny.num_kv_heads=1",
    "model.tiny.intermediate_size=64", "model.tiny.vocab_size=400",
]


def _env(root: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE")}
    return env | {"OMP_NUM_THREADS": "1", "MLFLOW_TRACKING_URI": f"sqlite:///{root / 'mlflow.db'}",
                  "TORCH_EXTENSIONS_DIR": str(root / "torch_extensions"),  # a run's: no C++ op is built there
                  "PYTHONPATH": os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)}


def _args(root: Path) -> list[str]:
    sets = [x for s in [f"output_dir={root / 'out'}", *SETTINGS] for x in ("-s", s)]
    return ["-m", "agent_r1.cli", "train", "-p", "tiny", "--config", "pipelines.yaml", *sets]


def _train(root: Path, nproc: int, log_name: str = "log.txt") -> subprocess.Popen:
    root.mkdir(parents=True, exist_ok=True)
    log = open(root / log_name, "a")
    return subprocess.Popen([sys.executable, *_args(root), "--nproc", str(nproc)], cwd=ROOT, env=_env(root),
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def _wait(proc: subprocess.Popen, root: Path, log_name: str = "log.txt", timeout: float = 600) -> None:
    assert proc.wait(timeout=timeout) == 0, (root / log_name).read_text()[-4000:]


def _history(root: Path) -> list[dict]:
    return [of_the_run(h, also=("rollout/prefill",))  # and the engine's counters, of rank 0 only
            for h in json.loads((root / "out" / "metrics" / "train" / "grpo.json").read_text())]


def _assert_same_run(got: Path, ref: Path) -> None:
    """The same metrics, evaluation, and weights (to the tolerances of the module docstring)."""
    a, b = _history(got), _history(ref)
    assert [h["iteration"] for h in a] == [1, 2] and len(b) == 2
    for x, y in zip(a, b):
        assert x.keys() == y.keys() and all(x[k] == pytest.approx(y[k], rel=1e-4, abs=1e-6) for k in x), (x, y)
    assert max(h["reward_std"] for h in b) > 0 and b[-1]["update/live_share"] == 1  # the update had something to learn
    read = lambda r, f: json.loads((r / "out" / "metrics" / f).read_text())
    assert read(got, "eval.json") == read(ref, "eval.json")
    for ckpt in ("checkpoints/sft", "rl/grpo"):
        wa, wb = (load_file(str(r / "out" / ckpt / "model.safetensors")) for r in (got, ref))
        assert wa.keys() == wb.keys()
        worst = max(float((wa[k] - wb[k]).abs().max() / wb[k].abs().max().clamp(min=1e-12)) for k in wb)
        assert worst <= 1e-4, (ckpt, worst)
    print(f"weights: max |a-b| / max|b| over tensors of rl/grpo: {worst:.2e}")


def _assert_one_record(root: Path) -> None:
    """One MLflow pipeline run (finished, every stage nested in it), one registered version, no
    state left behind."""
    from agent_r1.tracking import Tracker

    tracker = Tracker(f"sqlite:///{root / 'mlflow.db'}", project_dir=root)
    runs = tracker.client.search_runs([tracker.experiment_id])
    pipelines = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert len(pipelines) == 1 and pipelines[0].info.status == "FINISHED", [r.info.run_name for r in pipelines]
    assert sorted(tracker.child_runs(pipelines[0].info.run_id)) == ["evaluate", "prepare", "register", "sft", "train"]
    assert len(runs) == 6
    assert [str(v.version) for v in tracker.client.search_model_versions("name = 'agent-r1'")] == ["1"]
    assert not list((root / "out" / "state").iterdir())


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory) -> Path:
    """The reference: one process, the same settings."""
    root = tmp_path_factory.mktemp("one_rank")
    _wait(_train(root, 1), root)
    return root


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


WRITES = ("O_WRONLY", "O_RDWR", "O_CREAT", "rename", "mkdir", "unlink")


@pytest.mark.slow
def test_two_nodes_of_one_rank_train_what_one_rank_trains(one_rank, tmp_path):
    """``torchrun --nnodes 2`` twice, c10d rendezvous on 127.0.0.1. The second node runs under
    strace (where there is one): its rank writes nothing in the output folder or MLflow's."""
    t0 = time.perf_counter()
    port = _free_port()
    launch = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
              "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}"]
    strace = shutil.which("strace")
    trace = tmp_path / "node1.strace"
    procs = []
    for node in (0, 1):
        cmd = launch + ["--node-rank", str(node), *_args(tmp_path)]
        if node == 1 and strace:  # after node 0 hosts the rendezvous (c10d ranks nodes as they join)
            time.sleep(3)
            cmd = [strace, "-f", "--seccomp-bpf", "-e", "trace=openat,rename,renameat,renameat2,mkdir,mkdirat,unlink,unlinkat",
                   "-o", str(trace), *cmd]
        with open(tmp_path / f"node{node}.txt", "w") as log:
            procs.append(subprocess.Popen(cmd, cwd=ROOT, env=_env(tmp_path), stdout=log, stderr=subprocess.STDOUT,
                                          start_new_session=True))
    deadline = time.monotonic() + 600
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        if any(p.poll() not in (None, 0) for p in procs):  # one node failed: the other would wait for it
            break
        time.sleep(0.5)
    stopped = [p.poll() is None for p in procs]  # still running: stopped here, after the other failed
    for p, stop in zip(procs, stopped):
        if stop:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    for node in sorted(range(2), key=stopped.__getitem__):  # the node that failed by itself first
        _wait(procs[node], tmp_path, f"node{node}.txt", timeout=1)
    _assert_same_run(tmp_path, one_rank)
    _assert_one_record(tmp_path)
    assert "held-out evaluation (tiny)" in (tmp_path / "node0.txt").read_text()  # node 0 has rank 0
    assert "held-out evaluation" not in (tmp_path / "node1.txt").read_text()
    if strace:
        lines = trace.read_text().splitlines()
        assert any(str(tmp_path / "out") in line for line in lines)  # it read the data: the trace sees it
        written = [line for line in lines if (str(tmp_path / "out") in line or "mlflow.db" in line)
                   and any(w in line for w in WRITES) and " = -1 " not in line]  # a call that failed wrote nothing
        assert not written, written[:5]
    print(f"2 nodes: {time.perf_counter() - t0:.0f} s; strace: {bool(strace)}")


def _rank_process(proc: subprocess.Popen, rank: int, timeout: float = 120):
    """The worker process of ``rank`` that torchrun started under ``proc``."""
    import psutil

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for child in psutil.Process(proc.pid).children(recursive=True):
            try:
                if child.environ().get("RANK") == str(rank) and "agent_r1.cli" in child.cmdline():
                    return child
            except psutil.Error:
                pass
        time.sleep(0.2)
    raise TimeoutError(f"no rank {rank} under {proc.pid}")


@pytest.mark.slow
def test_two_ranks_train_what_one_rank_trains_through_a_killed_rank_and_a_resume(one_rank, tmp_path):
    """Two ranks on one node (``--nproc 2``), with SIGKILL to rank 1 once the first RL state is
    saved: torchrun stops rank 0 and exits with an error (no rank waits for a dead peer); the same
    command resumes from the saved state, on 2 ranks, into the same MLflow run, and ends where one
    rank's uninterrupted run ends: the same metrics, weights and files, rank 0 alone reporting.
    (One run of two ranks covers both: SFT and iteration 1 before the kill, iteration 2 after.)"""
    pytest.importorskip("psutil")
    t0 = time.perf_counter()
    meta = tmp_path / "out" / "state" / "rl_grpo" / "meta.json"
    first = _train(tmp_path, 2)
    rank1 = _rank_process(first, 1)
    while not meta.exists():
        assert first.poll() is None, (tmp_path / "log.txt").read_text()[-4000:]
        time.sleep(0.01)
    rank1.send_signal(signal.SIGKILL)
    t_kill = time.perf_counter()
    assert first.wait(timeout=120) != 0
    stopped_s = time.perf_counter() - t_kill
    assert json.loads(meta.read_text())["step"] == 1
    run_id = json.loads((tmp_path / "out" / "state" / "mlflow_run.json").read_text())["run_id"]

    _wait(_train(tmp_path, 2), tmp_path)
    log = (tmp_path / "log.txt").read_text()
    assert "RL grpo: resuming after iteration 1" in log and "sft: " in log
    _assert_same_run(tmp_path, one_rank)
    _assert_one_record(tmp_path)
    files = lambda r: sorted(str(p.relative_to(r / "out")) for p in (r / "out").rglob("*") if p.is_file())
    assert files(tmp_path) == files(one_rank)
    assert log.count("held-out evaluation (tiny)") == 1 and log.count("registered agent-r1 v1") == 1  # rank 0 reports
    from agent_r1.tracking import Tracker

    tracker = Tracker(f"sqlite:///{tmp_path / 'mlflow.db'}", project_dir=tmp_path)
    assert tracker.run_info(run_id)["status"] == "FINISHED"  # the killed run's MLflow run, finished by the resume
    assert not list((tmp_path / "torch_extensions").glob("*/*"))  # DeepSpeed's shared-memory op was not built
    print(f"kill + resume: {time.perf_counter() - t0:.0f} s; the run stopped {stopped_s:.1f} s after the kill")


# ------------------------------------------------------------------------------ input errors (fast)
TWO_RANKS = {  # `agent-r1 train` with what two ranks cannot run, and the first line of what it says
    "rl.rollout_shards=1": "rl.rollout_shards: 1 shards cannot keep 2 ranks busy",
    "rl.tasks_per_iteration=1": "rl.tasks_per_iteration: 1 questions cannot fill 2 rollout shards",
    "rl.learner.zero_stage=3": "rl.learner ZeRO-3 on several ranks",
}
REFUSALS = {"nproc 0": ["train", "-p", "tiny", "--nproc", "0"], "nproc 2": ["train", "-p", "tiny", "--nproc", "2"]} | {
    o: ["train", "-p", "tiny", "--no-track", "-s", o, "-s", f"output_dir={ROOT / 'outputs' / 'never'}"] for o in TWO_RANKS}
# every refusal invoked as the command line invokes `agent-r1` (its typer app), one after the other in one
# process; then whether that process imported DeepSpeed or started a process group
REFUSE = """
import json, sys
import torch.distributed as dist
from typer.testing import CliRunner
from agent_r1.cli import app
runs = {name: CliRunner().invoke(app, args) for name, args in json.loads(sys.argv[1]).items()}
print(json.dumps({name: [r.exit_code, r.stdout, r.stderr] for name, r in runs.items()}
                 | {"started": ["deepspeed" in sys.modules, dist.is_initialized()]}))
"""


@pytest.fixture(scope="module")
def refused() -> dict:
    """``{name: (exit code, stdout, stderr)}`` of each of ``REFUSALS`` as rank 0 of 2 (the launcher's
    variables), in a fresh process (this one may hold a 1-rank group): one import of the CLI for all."""
    out = subprocess.run([sys.executable, "-c", REFUSE, json.dumps(REFUSALS)], cwd=ROOT, capture_output=True,
                         text=True, timeout=120, env=_env(ROOT) | {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0"})
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_nproc_below_one_is_refused_in_one_line(refused):
    code, _, err = refused["nproc 0"]
    assert code == 2 and "--nproc" in err and "greater than or equal to 1" in err, err


def test_nproc_inside_a_launcher_is_refused(refused):
    code, out, err = refused["nproc 2"]
    assert code == 2 and "already one of 2 ranks" in out + err


@pytest.mark.parametrize("content, message", [(None, "no such DeepSpeed config file"), ("{bf16: true", "not JSON"),
                                              ("[1]", "a DeepSpeed config is a JSON object"),
                                              ('{"gradient_accumulation_steps": 4}', "micro-batches itself")])
def test_a_bad_deepspeed_config_is_named(tmp_path, content, message):
    path = tmp_path / "ds.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError, match=f"rl.learner.deepspeed_config.*{message}"):
        load_config("tiny", ROOT / "pipelines.yaml", parse_overrides([f"rl.learner.deepspeed_config={path}"]))


@pytest.mark.parametrize("name", ["zero2.json", "zero2_offload.json", "zero3.json", "zero3_offload.json"])
def test_the_infra_deepspeed_files_merge_over_the_learners_keys(name):
    from agent_r1.learner.learner import LearnerConfig, _ds_config, ds_config

    path = ROOT / "infra" / "deepspeed" / name
    cfg = LearnerConfig(deepspeed_config=str(path), grad_clip=0.5)
    merged, file = ds_config(cfg), json.loads(path.read_text())
    assert merged["zero_optimization"] == file["zero_optimization"]  # the file wins, nested keys too
    assert merged["bf16"] == {"enabled": True} and merged["gradient_clipping"] == file["gradient_clipping"]
    assert merged["steps_per_print"] == _ds_config(cfg)["steps_per_print"]  # the learner's keys the file lacks stay
    assert ds_config(LearnerConfig()) == _ds_config(LearnerConfig())


@pytest.mark.parametrize("override", TWO_RANKS)
def test_what_two_ranks_cannot_run_is_named_before_anything_starts(refused, override):
    """As rank 0 of 2, `agent-r1 train` stops with one line before the process group or any model starts."""
    code, out, err = refused[override]
    assert code == 1 and f"error: {TWO_RANKS[override]}" in out, out + err
    assert "DeepSpeed" not in out
    assert refused["started"] == [False, False]  # no refusal imported DeepSpeed or started a process group


@pytest.mark.slow  # the first use on a machine compiles DeepSpeed's CPU Adam op (~30 s)
def test_optimizer_offload_uses_deepspeeds_cpu_adam_and_trains(make_model, tok):
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    from agent_r1.learner import Learner, LearnerConfig
    from agent_r1.trajectory import Sequence, collate

    learner = Learner(make_model(seed=0), LearnerConfig(deepspeed_config=str(ROOT / "infra" / "deepspeed" / "zero2_offload.json")),
                      precision="fp32")
    assert isinstance(learner.engine.optimizer.optimizer, DeepSpeedCPUAdam)
    before = {k: p.detach().float().clone() for k, p in learner.model.named_parameters()}
    ids = torch.randint(5, len(tok), (2, 12), generator=torch.Generator().manual_seed(0))
    seqs = [Sequence(ids=row.tolist(), action=[1] * 12, step_ids=[0] * 12, rewards=[0.0] * 12, sample_logprobs=[0.0] * 12,
                     group_id=0, prompt_len=0) for row in ids]
    stats = learner.sft_step(collate(seqs, tok.pad_token_id))
    assert stats["sft_loss"] > 0
    # every matrix moved (the file turns bf16 on: a 1e-4 step of a norm's 1.0 is below bf16's resolution there)
    matrices = {k for k, p in learner.model.named_parameters() if p.dim() == 2}
    moved = {k for k, p in learner.model.named_parameters() if not torch.equal(before[k], p.detach().float())}
    assert matrices and matrices <= moved, sorted(matrices - moved)


def two_gloo_ranks(script: str, tmp_path: Path, *args: str) -> list[dict]:
    """``script`` run as ranks 0 and 1 of a gloo group (``python -c script *args tmp_path``); what each
    rank wrote to ``tmp_path/rank<r>.json``."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "WORLD_SIZE": "2", "OMP_NUM_THREADS": "1",
            "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-c", script, *args, str(tmp_path)], cwd=ROOT,
                              env=env | {"RANK": str(r), "LOCAL_RANK": str(r)}, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for r in (0, 1)]
    try:
        outs = [p.communicate(timeout=240)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert all(p.returncode == 0 for p in procs), "\n".join(outs)[-4000:]
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]


KEYED = """
import json, os, sys
from datetime import timedelta
from types import SimpleNamespace
import torch.distributed as dist
from agent_r1.config import RLConfig
from agent_r1.learner.distributed import rank
from agent_r1.pipeline.rl_driver import build_train_batch
from agent_r1.trajectory import Step, Trajectory

dist.init_process_group("gloo", timeout=timedelta(seconds=60))  # a rank left waiting fails instead of hanging

def episode(group, final, key):  # one step, starting from the state `key` (None: the environment gives none)
    return Trajectory(task_id=f"t{group}", group_id=group, steps=[Step([11, 12], [30], [-0.5], state_key=key)],
                      final_reward=final)

# rank 0: a group whose two steps start from one state; rank 1: steps without state keys (say episodes that ended
# before a keyed step), then the next all-reduce of the batch (dynamic sampling's)
trajs = [episode(0, 1.0, "s"), episode(0, 0.0, "s")] if rank() == 0 else [episode(1, 1.0, None), episode(1, 1.0, None)]
batch = build_train_batch(SimpleNamespace(critic=None, single_step=True, reference=None), trajs,
                          RLConfig(dynamic_sampling=True), 0)
open(os.path.join(sys.argv[1], f"rank{rank()}.json"), "w").write(json.dumps(batch.info))
dist.barrier()
dist.destroy_process_group()
"""


@pytest.mark.slow  # two processes of torch: ~10 s
@pytest.mark.timeout(300)
def test_every_rank_enters_the_shared_state_all_reduce_with_keyed_steps_or_none(tmp_path):
    infos = two_gloo_ranks(KEYED, tmp_path)
    # every rank: rank 0's 2 shared steps of the 2 keyed steps; one of the 2 groups with equal rewards
    assert infos[0] == infos[1] == {"rollout/shared_state_steps": 1.0, "dapo/zero_variance_groups": 0.5}


WHITENED = """
import json, os, sys
from datetime import timedelta
from types import SimpleNamespace
import torch.distributed as dist
from agent_r1.config import RLConfig
from agent_r1.learner.distributed import rank
from agent_r1.pipeline.rl_driver import build_train_batch
from agent_r1.trajectory import Step, Trajectory

dist.init_process_group("gloo", timeout=timedelta(seconds=60))  # a rank left waiting fails instead of hanging

def episode(group, final, step_reward, turns):
    steps = [Step([11, 12], [30 + k, 31], [-0.5, -0.5], reward=step_reward) for k in range(turns)]
    return Trajectory(task_id=f"t{group}", group_id=group, steps=steps, final_reward=final)

# a group per rank (rank 1's rewards larger); one process: both groups
groups = [[episode(0, 1.0, 0.0, 1), episode(0, 0.0, 0.5, 2)], [episode(1, 3.0, 0.2, 3), episode(1, 2.0, 0.0, 2)]]
learner = SimpleNamespace(critic=None, single_step=True, reference=None)

def advantages(trajs):  # every advantage token of the batch, row by row
    out = {}
    for algorithm in ("reinforce_pp", "reinforce_pp_baseline"):
        batch = build_train_batch(learner, trajs, RLConfig(algorithm=algorithm, gamma=0.9), 0)
        out[algorithm] = batch.advantages[batch.adv_mask.bool()].tolist()
    return out

result = {"ranks": advantages(groups[rank()])}
dist.barrier()
dist.destroy_process_group()
if rank() == 0:  # then one process over the whole batch
    os.environ["WORLD_SIZE"] = "1"
    result["one"] = advantages(groups[0] + groups[1])
open(os.path.join(sys.argv[1], f"rank{rank()}.json"), "w").write(json.dumps(result))
"""


@pytest.mark.slow  # two processes of torch: ~10 s
@pytest.mark.timeout(300)
def test_two_ranks_whiten_reinforce_pp_advantages_as_one_process(tmp_path):
    """reinforce_pp(_baseline) whiten over the batch's action tokens: on 2 ranks (gloo), each with one
    group, the advantages are one process's over both groups (not each rank's batch whitened alone)."""
    r0, r1 = two_gloo_ranks(WHITENED, tmp_path)
    for algorithm, one in r0["one"].items():
        two = r0["ranks"][algorithm] + r1["ranks"][algorithm]
        assert two == pytest.approx(one, rel=1e-6, abs=1e-6), algorithm
        assert max(map(abs, one)) > 0.1  # something to whiten
