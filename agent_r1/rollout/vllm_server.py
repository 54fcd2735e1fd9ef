"""A vLLM OpenAI-compatible server started from its own environment (``.venv-vllm``, ``make vllm``).

:class:`VLLMServer` starts ``python -m vllm.entrypoints.openai.api_server`` on a free port of
127.0.0.1, waits for ``/health`` (on a timeout or an early exit it raises with the server's last
log lines) and stops it on every exit path:

- :meth:`VLLMServer.stop` (also a context manager, and ``atexit``) ends the server's whole
  process group (vLLM runs its engine core in a child process);
- the server runs under agent_r1/lifetime.py's watchdog (run by the vLLM environment's Python),
  which ends the group when the trainer dies, SIGKILL included, and takes the server with it
  should the watchdog itself be SIGKILLed.
"""

from __future__ import annotations

import atexit
import collections
import json
import os
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from agent_r1 import lifetime
from agent_r1.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"


def post(url: str, body: dict | None = None, timeout: float = 600.0) -> dict:
    """POST ``body`` as JSON to ``url``; the JSON answer ({} when empty)."""
    req = urllib.request.Request(url, data=json.dumps(body or {}).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        text = r.read()
    return json.loads(text) if text.strip() else {}


def healthy(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=timeout) as r:
            return r.status == 200
    except (OSError, urllib.error.URLError):
        return False


class VLLMServer:
    """One vLLM server process group serving ``model`` (an HF folder) at :attr:`url`.

    ``args`` are extra command-line options of vLLM's server; ``env`` extra environment variables.
    ``VLLM_SERVER_DEV_MODE=1`` opens ``/collective_rpc`` and ``/reset_prefix_cache`` (weight sync).
    ``remove_when_orphaned``: globs of the trainer's files (its weights copies) that the server's
    watchdog removes when the trainer dies.
    """

    def __init__(self, model: str | Path, *, python: str | Path = DEFAULT_PYTHON, args: list[str] = (),
                 env: dict | None = None, startup_timeout_s: float = 300.0, log_path: str | Path | None = None,
                 remove_when_orphaned: list[str] = ()):
        self.python = Path(python)
        if not self.python.exists():
            raise FileNotFoundError(f"rollout.engine=vllm: no vLLM environment at {self.python.parent.parent} "
                                    "(run `make vllm`, or set rollout.vllm.url to a running server)")
        self.model, self.args, self.env = str(model), list(args), dict(env or {})
        self.startup_timeout_s, self.remove_when_orphaned = startup_timeout_s, list(remove_when_orphaned)
        if log_path is None:
            fd, log_path = tempfile.mkstemp(prefix="vllm-server.", suffix=".log")
            os.close(fd)  # start() opens it by name
        self.log_path = Path(log_path)
        self.proc: subprocess.Popen | None = None
        self.port: int | None = None
        atexit.register(self.stop)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return [str(self.python), "-m", "vllm.entrypoints.openai.api_server", "--model", self.model,
                "--host", "127.0.0.1", "--port", str(self.port), *self.args]

    def start(self) -> "VLLMServer":
        self.stop()
        self.port = free_port()
        env = _without_launcher(os.environ) | {"VLLM_SERVER_DEV_MODE": "1", "PYTHONUNBUFFERED": "1"} | self.env
        with open(self.log_path, "ab") as log:  # the watchdog leads a process group: the server and its children
            self.proc = lifetime.start(self.command(), python=self.python, stdout=log, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL, env=env,
                                       remove_when_orphaned=self.remove_when_orphaned)
        t0 = time.monotonic()
        while not healthy(self.url):
            if self.proc.poll() is not None:
                raise RuntimeError(f"the vLLM server exited with code {self.proc.returncode} while starting; "
                                   f"its last log lines ({self.log_path}):\n{self.tail()}")
            if time.monotonic() - t0 > self.startup_timeout_s:
                self.stop()
                raise TimeoutError(f"the vLLM server was not healthy after {self.startup_timeout_s:.0f} s "
                                   f"(rollout.vllm.startup_timeout_s); its last log lines ({self.log_path}):\n{self.tail()}")
            time.sleep(0.5)
        self.startup_s = time.monotonic() - t0
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None and healthy(self.url)

    def tail(self, n: int = 30) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(collections.deque(f, n))
        except OSError:
            return "(no log)"

    def stop(self, grace_s: float = 10.0) -> None:
        """End the server's process group: SIGTERM, then SIGKILL after ``grace_s``."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        lifetime.stop(proc, grace_s)

    def __enter__(self) -> "VLLMServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


# What torchrun sets for each rank: a server started by rank 0 of N is one program of its own
# (vLLM starts its own process group), not a rank of the trainer's group
_LAUNCHER = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
             "ROLE_NAME", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}


def _without_launcher(env) -> dict:
    return {k: v for k, v in env.items() if k not in _LAUNCHER and not k.startswith(("TORCHELASTIC_", "TORCH_ELASTIC_"))}
