"""A failing vLLM server, and one server for N ranks, against a stand-in HTTP server (stdlib
http.server in a thread; tests/test_vllm.py runs the real one):

- HTTP 5xx, a truncated body, a body that is not JSON or not a completion: :class:`EngineDied`
  (a dead or failing server), raised at once; the requests still in flight are aborted, not
  waited on for ``request_timeout_s``; HTTP 4xx stays a bad request;
- the driver restarts a failing engine once and retries the batch; a second failure ends the run;
- on 2 ranks (gloo, no DeepSpeed): rank 0 starts the one server, the other rank gets its url
  (or rank 0's error when it cannot start);
  each update's weights are written once and reloaded once (rank 0), every rank waiting; a
  failed reload is an error on every rank, and the restart gives every rank the new url.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from agent_r1.rollout import EngineDied, SamplingParams
from agent_r1.rollout.vllm_engine import HTTPRefused, VLLMEngine

OK, FAIL, SLOW = 1, 2, 3  # a context's first id: how the stand-in answers it
TIMEOUT_S = 60.0  # the engine's request timeout: a slow request would hold the batch this long


class _State:
    def __init__(self):
        self.failure = "500"  # how a FAIL context (or a failing reload) is answered
        self.fail_next = 0  # the next n completions fail, whatever their context
        self.fail_reload = False
        self.posts: list[str] = []
        self.release = threading.Event()  # ends the SLOW requests


class _Handler(BaseHTTPRequestHandler):
    state: _State

    def _reply(self, code: int, data: bytes, length: int | None = None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data) if length is None else length))
        self.end_headers()
        self.wfile.write(data)

    def _fail(self) -> None:
        failure = self.state.failure
        if failure in ("500", "400", "404"):
            return self._reply(int(failure), json.dumps({"error": f"stand-in {failure}"}).encode())
        if failure == "truncated":  # promises 300 bytes, sends 20, closes
            self._reply(200, b'{"choices": [{"token', length=300)
            self.close_connection = True
            return None
        if failure == "garbage":
            return self._reply(200, b"<html>Internal error</html>")
        return self._reply(200, json.dumps({"choices": []}).encode())  # "shape": JSON, not a completion

    def do_GET(self):  # noqa: N802
        if self.path == "/health":
            return self._reply(200, b"")
        return self._reply(200, json.dumps({"data": [{"id": "policy", "max_model_len": 512}]}).encode())

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
        st = self.state
        if self.path == "/test/fail-reloads":  # the test's own switch
            st.fail_reload, st.failure = True, "500"
            return self._reply(200, b"{}")
        st.posts.append(self.path)
        if self.path != "/v1/completions":
            return self._fail() if st.fail_reload else self._reply(200, b"{}")
        first = body["prompt"][0]
        if st.fail_next > 0:
            st.fail_next -= 1
            return self._fail()
        if first == FAIL:
            return self._fail()
        if first == SLOW:
            st.release.wait(TIMEOUT_S)
        ids = [5] * min(body["max_tokens"], 3)
        try:
            self._reply(200, json.dumps({"choices": [{"token_ids": ids, "logprobs": {"token_logprobs": [-0.5] * len(ids)}}]}).encode())
        except OSError:  # the client aborted it
            pass

    def log_message(self, *args):
        pass


class _Quiet(ThreadingHTTPServer):
    def handle_error(self, request, client_address):  # a request the client aborted: expected here
        pass


def _serve() -> tuple[ThreadingHTTPServer, _State, str]:
    state = _State()
    handler = type("Handler", (_Handler,), {"state": state})
    httpd = _Quiet(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, state, f"http://127.0.0.1:{httpd.server_address[1]}"


@pytest.fixture
def stand_in():
    httpd, state, url = _serve()
    yield state, url
    state.release.set()
    httpd.shutdown()
    httpd.server_close()


def _request_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("vllm-request")]


@pytest.mark.parametrize("failure", ["500", "truncated", "garbage", "shape"])
def test_a_failing_server_is_engine_died_and_nothing_waits_for_the_requests_in_flight(stand_in, failure):
    state, url = stand_in
    state.failure = failure
    engine = VLLMEngine(2, url=url, request_timeout_s=TIMEOUT_S)
    params = SamplingParams(temperature=1.0, max_new_tokens=4)
    t0 = time.monotonic()
    with pytest.raises(EngineDied, match="HTTP 500|IncompleteRead|not JSON|malformed completion"):
        engine.generate([[SLOW] * 4, [SLOW] * 4, [FAIL] * 4, [OK] * 4], params)
    assert time.monotonic() - t0 < 10, "the batch waited for its slow requests"
    while _request_threads() and time.monotonic() - t0 < 10:  # the aborted requests end at once
        time.sleep(0.05)
    assert not _request_threads(), "a request of a failed batch is still waiting on the server"
    assert [g.ids for g in engine.generate([[OK] * 4], params)] == [[5, 5, 5]]  # the next batch is served


def test_a_bad_request_is_not_a_dead_server(stand_in):
    state, url = stand_in
    state.failure = "400"
    engine = VLLMEngine(2, url=url, request_timeout_s=TIMEOUT_S)
    with pytest.raises(HTTPRefused, match="HTTP 400") as err:
        engine.generate([[SLOW] * 4, [FAIL] * 4], SamplingParams(max_new_tokens=4))
    assert not isinstance(err.value, EngineDied)


def test_a_failed_weight_reload(stand_in, tmp_path):
    """HTTP 5xx on /collective_rpc is a failing server; 404 (no VLLM_SERVER_DEV_MODE) a config error."""
    state, url = stand_in
    engine = VLLMEngine(2, url=url)
    write = lambda folder: (folder.mkdir(parents=True), (folder / "config.json").write_text("{}"))
    state.fail_reload = True
    with pytest.raises(EngineDied, match="HTTP 500"):
        engine.sync_weights(write)
    state.failure = "404"
    with pytest.raises(RuntimeError, match="VLLM_SERVER_DEV_MODE") as err:
        engine.sync_weights(write)
    assert not isinstance(err.value, EngineDied) and engine._weights is None
    state.fail_reload = False
    assert engine.sync_weights(write) > 0 and (engine._weights / "config.json").exists()
    engine.close()


def _trainer(engine, tok):
    from agent_r1.config import RLConfig
    from agent_r1.context import ContextManager
    from agent_r1.envs import ToolEnv

    return SimpleNamespace(cfg=RLConfig(tasks_per_iteration=2, group_size=2), tasks=[{"id": "a", "question": "Paris?"},
                           {"id": "b", "question": "Danube?"}], rng=torch.Generator().manual_seed(0), max_new_tokens=4,
                           engine=engine, make_env=lambda: ToolEnv([], max_turns=1), context=ContextManager(tok),
                           max_context_tokens=None, method="grpo", files=None, iteration=0, curriculum=None, seed=0,
                           demos=None)


@pytest.mark.parametrize("failure", ["500", "truncated", "garbage"])
def test_the_driver_restarts_a_failing_server_once_and_retries_the_batch(stand_in, tok, failure):
    from agent_r1.pipeline.rl_driver import sample_episodes

    state, url = stand_in
    state.failure = failure
    starts = []
    server = SimpleNamespace(proc=object(), url=url, model="m", start=lambda: starts.append(1), stop=lambda: None)
    engine = VLLMEngine(tok.eos_token_id, server=server, request_timeout_s=TIMEOUT_S)
    state.fail_next = 1
    trajs = sample_episodes(_trainer(engine, tok))
    assert len(starts) == 1 and len(trajs) == 4 and all(len(t.steps) == 1 for t in trajs)
    state.fail_next = 8  # fails again after the restart
    with pytest.raises(RuntimeError, match="the rollout engine died twice in iteration 1"):
        sample_episodes(_trainer(engine, tok))
    assert len(starts) == 2


RANKS = """
import json, os, sys, urllib.request
from pathlib import Path
from types import SimpleNamespace
import torch.distributed as dist
from agent_r1.learner.distributed import rank
from agent_r1.rollout import EngineDied
from agent_r1.rollout.vllm_engine import VLLMEngine, shared_engine

dist.init_process_group("gloo")
urls, out = sys.argv[1:3], Path(sys.argv[3])

def start():  # rank 0 alone: the engine of the server it starts (a stand-in whose restart moves it)
    server = SimpleNamespace(proc=object(), url=urls[0], model="m", stop=lambda: None)
    server.start = lambda: setattr(server, "url", urls[1])
    return VLLMEngine(2, server=server)

def write(folder):  # as save_hf_checkpoint: every rank calls it, rank 0 writes, all wait
    writers.append(str(folder))
    if rank() == 0:
        folder.mkdir(parents=True)
        (folder / "config.json").write_text("{}")
    dist.barrier()

def broken():
    raise FileNotFoundError("no vLLM environment")

writers, record = [], {}
try:  # a server that cannot start: an error on every rank, none waits
    shared_engine(broken, lambda url: VLLMEngine(2, url=url))
except Exception as e:
    record["start_error"] = f"{type(e).__name__}: {e}"
engine = shared_engine(start, lambda url: VLLMEngine(2, url=url))
record["url"] = engine.url
engine.sync_weights(write)
engine.sync_weights(write)
if rank() == 0:  # from here the server refuses reloads (HTTP 500)
    urllib.request.urlopen(urllib.request.Request(urls[0] + "/test/fail-reloads", data=b"{}", method="POST")).read()
dist.barrier()
try:
    engine.sync_weights(write)
except EngineDied as e:
    record["error"] = str(e)
engine.restart()
record["restarted_url"] = engine.url
record["writers"] = writers
record["weights"] = str(engine._weights) if engine._weights else None
(out / f"rank{rank()}.json").write_text(json.dumps(record))
engine.close()
dist.barrier()
dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)  # as agent-r1 train on N ranks: no C++ destructor of a communication thread at exit
"""


@pytest.mark.slow  # two processes of torch: ~10 s
@pytest.mark.timeout(300)
def test_two_ranks_share_one_server_and_sync_it_once_per_update(tmp_path):
    from tests.test_distributed import two_gloo_ranks

    (a, state_a, url_a), (b, state_b, url_b) = _serve(), _serve()
    try:
        r0, r1 = two_gloo_ranks(RANKS, tmp_path, url_a, url_b)
    finally:
        for httpd in (a, b):
            httpd.shutdown()
            httpd.server_close()
    assert r0["start_error"] == "FileNotFoundError: no vLLM environment"
    assert r1["start_error"] == "RuntimeError: on rank 0: no vLLM environment"
    assert r0["url"] == r1["url"] == url_a  # rank 0 started the server, rank 1 got its url
    # three syncs, each reloaded once: two that worked, one refused (HTTP 500) on every rank
    assert state_a.posts == ["/collective_rpc", "/reset_prefix_cache"] * 2 + ["/collective_rpc"]
    assert "HTTP 500" in r0["error"] and r1["error"].startswith("on rank 0: ") and "HTTP 500" in r1["error"]
    assert r0["restarted_url"] == r1["restarted_url"] == url_b  # the restart's url reached every rank
    assert r0["writers"] == r1["writers"] and len(set(r0["writers"])) == 3  # one folder of rank 0's per sync
    assert r1["weights"] is None and r0["weights"] == r0["writers"][1]  # rank 0 alone owns the folder
    assert not Path(r0["weights"]).exists()  # closed
