"""Outside processes tied to the run (agent_r1/lifetime.py) and its users, vLLM's server and MCP's
stdio servers (the game server's is in tests/test_textworld.py): a SIGKILLed trainer, a SIGKILLed
watchdog, `stop`, and a stdout flood without a newline. Stand-ins serve where the real server is
heavy: a sleeping Python, a `vllm` module that answers /health. Every wait polls a condition
under a deadline."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from agent_r1 import lifetime
from tests.procs import children_of, group, group_ends, live, until, watchdogs_of

ROOT = Path(__file__).resolve().parents[1]
DEMO = str(ROOT / "tests" / "mcp_servers" / "demo_server.py")
# a server that starts a process of its own (as vLLM its engine core, npx node) and says when it has
SPAWNER = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
           "print('ready', flush=True); time.sleep(600)")
# `python -m vllm.entrypoints.openai.api_server --port N ...`: answers /health, with a child of its own
VLLM_STANDIN = """
import http.server, subprocess, sys
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[sys.argv.index("--port") + 1])), Health).serve_forever()
"""


TRAINER = """
import sys, threading
from agent_r1 import lifetime
from agent_r1.rollout.vllm_engine import weights_dir, weights_of_this_process
from agent_r1.rollout.vllm_server import VLLMServer
from agent_r1.tools import mcp_tools, run_tool

def start():  # in a thread that ends, as a Prefect task's worker thread does
    own = lifetime.start([sys.executable, "-c", %(spawner)r], stdout=-1)
    assert own.stdout.readline() == b"ready\\n"
    weights = weights_dir(%(shm)r) / "model"  # as a served copy's
    VLLMServer("standin", python=sys.executable, env={"PYTHONPATH": %(standin)r}, startup_timeout_s=60,
               remove_when_orphaned=[weights_of_this_process(weights)]).start()
    spawn = next(t for t in mcp_tools(command=sys.executable, args=[%(demo)r]) if t.name == "spawn")
    run_tool(spawn, {})

thread = threading.Thread(target=start)
thread.start()
thread.join()
print("ready", flush=True)
threading.Event().wait()
"""


def test_a_sigkilled_trainer_leaves_no_process_of_its_servers(tmp_path):
    """A trainer-like process starts, from a thread that then ends, a stand-in server through the
    helper, a vLLM server (a stand-in `vllm` module) and an MCP server; each has started a process
    of its own. The servers outlive the thread; the trainer's SIGKILL ends each whole group, and
    the vLLM server's watchdog removes the trainer's weights folder."""
    api = tmp_path / "vllm" / "entrypoints" / "openai"
    api.mkdir(parents=True)
    for folder in (api, api.parent, api.parent.parent):
        (folder / "__init__.py").touch()
    (api / "api_server.py").write_text(VLLM_STANDIN)
    shm = tmp_path / "shm"
    script = TRAINER % {"spawner": SPAWNER, "standin": str(tmp_path), "demo": DEMO, "shm": str(shm)}
    trainer = subprocess.Popen([sys.executable, "-c", textwrap.dedent(script)], cwd=ROOT, stdout=subprocess.PIPE,
                               env=os.environ | {"PYTHONPATH": str(ROOT)})
    try:
        assert trainer.stdout.readline() == b"ready\n"
        groups = watchdogs_of(trainer.pid)
        assert len(groups) == 3 and all(len(group(g)) >= 3 for g in groups), {g: group(g) for g in groups}
        assert [p.name.split(".")[1] for p in shm.iterdir()] == [str(trainer.pid)]
    finally:
        trainer.kill()
        trainer.wait()
    assert all(group_ends(g) for g in groups), {g: group(g) for g in groups}
    assert not list(shm.iterdir())


def test_a_sigkilled_watchdog_takes_its_command_with_it():
    """A `pkill -9` that matches the watchdog: the kernel kills the command (PR_SET_PDEATHSIG)."""
    proc = lifetime.start([sys.executable, "-c", "print('ready', flush=True); import time; time.sleep(600)"],
                          stdout=subprocess.PIPE)
    try:
        assert proc.stdout.readline() == b"ready\n"
        [command] = children_of(proc.pid)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        assert until(lambda: not live(lambda p: p.pid == command)), "the command outlived its watchdog"
    finally:
        lifetime.stop(proc, grace_s=0)


def test_stop_ends_the_group_even_a_process_that_ignores_sigterm():
    stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); " \
               "time.sleep(600)"
    proc = lifetime.start([sys.executable, "-c", stubborn], stdout=subprocess.PIPE, grace_s=0.5)
    assert proc.stdout.readline() == b"ready\n"
    lifetime.stop(proc, grace_s=30)  # the watchdog's own grace (0.5 s) ends it first
    assert proc.returncode is not None and group_ends(proc.pid)
    lifetime.stop(proc)  # idempotent: a reaped leader is never signalled


MESSAGE = "agent-r1 watchdog: the process wrote a stdout line of more than 4096 bytes; ending its process group"


def test_a_stdout_line_without_end_ends_the_group():
    """A flood without a newline: the watchdog passes on the lines before it and exactly the limit
    of it, however the two writes fall into reads, says why on stderr and ends the group."""
    flood = "import sys; sys.stdout.write('ok\\n'); sys.stdout.flush(); sys.stdout.write('x' * 10**8)"
    proc = lifetime.start([sys.executable, "-c", flood], max_line_bytes=4096, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE)
    out, err = proc.communicate(timeout=60)
    assert out == b"ok\n" + b"x" * 4096
    assert err.decode().strip() == MESSAGE
    assert group_ends(proc.pid)


def test_a_long_line_inside_one_read_is_cut_and_the_line_before_it_arrives():
    """One write of a short line, a 50 KB line and another line: the three may arrive in one
    read; the long one is cut at the limit wherever it falls, and the command (which SIGTERM
    ends) reports its own signal."""
    code = ("import os, time; os.write(1, b'ok\\n' + b'x' * 50_000 + b'\\nnever\\n'); time.sleep(600)")
    proc = lifetime.start([sys.executable, "-c", code], max_line_bytes=4096, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE)
    out, err = proc.communicate(timeout=60)
    assert out == b"ok\n" + b"x" * 4096
    assert err.decode().strip() == MESSAGE
    assert proc.returncode == -signal.SIGTERM and group_ends(proc.pid)


def test_lines_across_read_boundaries_pass_whole_and_the_exit_status_is_the_commands():
    """120 KB of 4,000-byte lines in one write: the watchdog's 64 KiB reads end inside a line, and
    every line passes; the command's exit status 3 is the watchdog's."""
    lines = b"".join(bytes([65 + i % 26]) * 3999 + b"\n" for i in range(30))
    code = f"import os, sys; os.write(1, {lines!r}); sys.exit(3)"
    proc = lifetime.start([sys.executable, "-c", code], max_line_bytes=4096, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE)
    out, err = proc.communicate(timeout=60)
    assert (out, err, proc.returncode) == (lines, b"", 3)


@pytest.mark.parametrize("code, status", [("import sys; sys.exit(3)", 3), ("", 0),
                                          ("import os, signal; os.kill(os.getpid(), signal.SIGUSR1)",
                                           -signal.SIGUSR1)], ids=["exit 3", "exit 0", "SIGUSR1"])
def test_the_watchdog_reports_the_commands_own_exit_status(code, status):
    """The watchdog ends what is left of the group (a child of the command, here) without ending
    itself, and exits as the command did: the owner reads 3, not the -9 of a group SIGKILL."""
    spawn = "import subprocess, sys; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
    proc = lifetime.start([sys.executable, "-c", spawn + (code or "pass")], grace_s=0.5)
    assert proc.wait(timeout=60) == status
    assert group_ends(proc.pid)
