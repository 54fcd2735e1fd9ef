"""The vLLM engine's setup without a vLLM server (tests/test_vllm.py runs a real one): the server
options a run derives from its config's defaults, the request's new tokens capped to the
server's context length (against a stand-in HTTP server that refuses what vLLM refuses), and
nothing left behind when a start fails (the /dev/shm weights copy, the server, a file descriptor).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import pytest

from agent_r1.config import ConfigError, load_config
from agent_r1.learner import save_hf_checkpoint
from agent_r1.ports import free_port
from agent_r1.rollout import SamplingParams
from agent_r1.rollout import vllm_engine, vllm_server
from agent_r1.rollout.vllm_engine import VLLMEngine

ROOT = Path(__file__).resolve().parents[1]


def _tiny_vllm(**overrides):
    """The README's `agent-r1 train -p tiny -s rollout.engine=vllm`: the tiny pipeline, the defaults."""
    return load_config("tiny", ROOT / "pipelines.yaml", {"rollout": {"engine": "vllm", **overrides}})


def _option(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def _weights_dirs() -> set[Path]:
    base = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
    return set(base.glob(f"agent-r1-weights.{os.getpid()}.*"))


class _Recorded:
    """Stands in for VLLMServer / VLLMEngine in make_engine: records how it was built."""

    made: list = []
    url, log_path = "http://127.0.0.1:0", None

    def __init__(self, *args, **kwargs):
        self.args, self.kwargs = args, kwargs
        _Recorded.made.append(self)


def test_the_readme_vllm_command_starts_its_server_with_the_defaults(tmp_path, monkeypatch, tok, make_model):
    """model.precision auto and rollout.vllm.max_model_len null: the server gets the dtype the run
    computes in (fp32 on a CPU) and the episode budget capped by the model's positions (the tiny
    model has 1024; the old default 2048 was more, and the server refused to start)."""
    from agent_r1.rollout.build import make_engine
    from agent_r1.pipeline.state import computed_precision

    cfg = _tiny_vllm().model_copy(update={"output_dir": str(tmp_path / "out")})
    assert cfg.model.precision == "auto" and cfg.rollout.vllm.max_model_len is None
    model = make_model()
    folder = save_hf_checkpoint(model, tmp_path / "model", tok)
    _Recorded.made = []
    monkeypatch.setattr(vllm_server, "VLLMServer", _Recorded)
    monkeypatch.setattr(vllm_engine, "VLLMEngine", _Recorded)
    model.config.max_position_embeddings = 1024
    make_engine(cfg, model, tok, folder)
    server, _ = _Recorded.made
    args = server.kwargs["args"]
    assert _option(args, "--dtype") == {"fp32": "float32", "bf16": "bfloat16"}[computed_precision(cfg)]
    assert _option(args, "--max-model-len") == "1024"  # env.max_context_tokens, within the positions
    shutil.rmtree(server.args[0].parent)

    from agent_r1.rollout.build import vllm_server_args

    model.config.max_position_embeddings = 512  # fewer positions than the episode budget: capped
    assert _option(vllm_server_args(cfg, model.config), "--max-model-len") == "512"
    explicit = _tiny_vllm(vllm={"max_model_len": 1024})
    explicit = explicit.model_copy(update={"model": explicit.model.model_copy(update={"precision": "bf16"})})
    args = vllm_server_args(explicit, model.config)
    assert _option(args, "--max-model-len") == "1024" and _option(args, "--dtype") == "bfloat16"


def test_an_explicit_max_model_len_is_still_checked():
    with pytest.raises(ConfigError, match=r"rollout.vllm.max_model_len: 256 is shorter than env.max_context_tokens \(1024\)"):
        _tiny_vllm(vllm={"max_model_len": 256})
    with pytest.raises(ConfigError, match=r"rollout.vllm.max_model_len: 2048 is longer than the tiny model's positions"):
        _tiny_vllm(vllm={"max_model_len": 2048})
    assert _tiny_vllm(vllm={"max_model_len": 1024}).rollout.vllm.max_model_len == 1024


def test_the_served_copy_is_removed_when_the_server_cannot_be_made(tmp_path, tok, make_model):
    from agent_r1.rollout.build import make_engine

    cfg = _tiny_vllm(vllm={"python": str(tmp_path / "none" / "bin" / "python"), "max_model_len": 1024})
    cfg = cfg.model_copy(update={"output_dir": str(tmp_path / "out"), "model": cfg.model.model_copy(update={"precision": "fp32"})})
    folder = save_hf_checkpoint(make_model(), tmp_path / "model", tok)
    before = _weights_dirs()
    with pytest.raises(FileNotFoundError, match="make vllm"):
        make_engine(cfg, make_model(), tok, folder)
    assert _weights_dirs() == before, "a /dev/shm copy of the model outlived a failed start"


def test_an_engine_whose_server_is_not_healthy_stops_it_and_deletes_its_weights(tmp_path):
    stopped = []
    server = SimpleNamespace(proc=object(), url=f"http://127.0.0.1:{free_port()}", stop=lambda: stopped.append(1))
    weights = tmp_path / "w" / "model"
    weights.mkdir(parents=True)
    with pytest.raises(ConnectionError, match="no healthy vLLM server"):
        VLLMEngine(2, server=server, weights=weights)
    assert stopped and not weights.parent.exists()


def test_the_server_keeps_no_descriptor_of_its_log_file(tmp_path):
    fds = Path("/proc/self/fd")
    if not fds.is_dir():
        pytest.skip("no /proc/self/fd")
    before = len(list(fds.iterdir()))
    server = vllm_server.VLLMServer(tmp_path, python=sys.executable)  # no log_path: a temp file of its own
    try:
        assert len(list(fds.iterdir())) == before
    finally:
        server.log_path.unlink()


class _Server(BaseHTTPRequestHandler):
    """vLLM's routes as far as VLLMEngine uses them; a completion whose prompt + max_tokens
    exceeds max_model_len is refused with HTTP 400, as vLLM refuses it."""

    max_model_len = 64
    bodies: list = []

    def _send(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):  # noqa: N802
        if self.path == "/health":
            return self._send(200, {})
        return self._send(200, {"data": [{"id": "policy", "max_model_len": self.max_model_len}]})

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        _Server.bodies.append(body)
        if len(body["prompt"]) + body["max_tokens"] > self.max_model_len:
            return self._send(400, {"error": "This model's maximum context length is 64 tokens"})
        ids = [5] * body["max_tokens"]
        self._send(200, {"choices": [{"token_ids": ids, "logprobs": {"token_logprobs": [-0.5] * len(ids)}}]})

    def log_message(self, *args):
        pass


@pytest.fixture
def fake_server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Server)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    _Server.bodies = []
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_a_requests_new_tokens_fit_the_servers_context(fake_server):
    """With max_model_len == env.max_context_tokens an episode's first turn may ask for more new
    tokens than the server has room for; the request asks for what is left."""
    engine = VLLMEngine(2, url=fake_server)
    assert engine.max_model_len == 64
    params = SamplingParams(temperature=1.0, max_new_tokens=10)
    short, long = engine.generate([[1] * 20, [1] * 60], params)
    # the two requests are sent at once: they reach the server in either order
    assert sorted((len(b["prompt"]), b["max_tokens"]) for b in _Server.bodies) == [(20, 10), (60, 4)]
    assert len(short.ids) == 10 and len(long.ids) == 4 and not long.finished
    with pytest.raises(ValueError, match=r"context of 64 tokens leaves no room .* max_model_len \(64\)"):
        engine.generate([[1] * 64], params)


def test_the_docs_say_what_the_code_does():
    """The trainer's docstring: only the HF engine shares the learner's weights. docs/running.md:
    several ranks are wired, and vLLM on several ranks runs one server, synced once per update."""
    from agent_r1.pipeline.rl_driver import RLTrainer

    doc = " ".join(RLTrainer.__doc__.split())
    assert "(they share the weights)" not in doc and "a vLLM engine gets a copy of them at every sync" in doc
    running = " ".join((ROOT / "docs" / "running.md").read_text().split())
    assert "the learner runs one process today" not in running
    assert "without `rollout.vllm.url` the run is refused" not in running and "does not work yet" not in running
    assert "one server for every rank, started by rank 0" in running and "one weight sync per update" in running
