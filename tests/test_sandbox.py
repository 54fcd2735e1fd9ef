"""The ``python`` tool's sandbox, one layer at a time, each against a hostile program.

Where it is cheap, a test also shows that the same program succeeds without the layer (outside
the sandbox, or in a sandbox built without it), so that the test would fail if the layer went.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import pytest

from agent_r1.tools import build_tools, get_tool, run_tool
from agent_r1.tools.python import (
    UID_BASE,
    UID_COUNT,
    SandboxUnavailable,
    checked_sandbox,
    fork_probe,
    python_tool,
)

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module", autouse=True)
def sandbox_available():
    """Skip (with the one-line reason) on a machine without the sandbox, e.g. no bubblewrap."""
    try:
        checked_sandbox()
    except SandboxUnavailable as e:
        pytest.skip(str(e))


def run(code: str, **settings):
    """Run `code` through a fresh ``python`` tool with `settings`, as the environment does."""
    return run_tool(python_tool(**settings), {"code": code})


def _processes(uid: int | None = None, marker: str | None = None) -> list[int]:
    """Pids of live processes owned by `uid` or with `marker` in their command line."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            status = Path(f"/proc/{entry}/status").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace")
        except OSError:  # it exited meanwhile
            continue
        owner = int(next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1])
        if "State:\tZ" not in status and (owner == uid or (marker is not None and marker in cmdline)):
            found.append(int(entry))
    return found


# --- the observation --------------------------------------------------------------------------

def test_a_clean_run_shows_just_its_stdout():
    result = run_tool(get_tool("python")(), {"code": "print(6 * 7)"})
    assert result.error is None
    assert result.text == "42\n"
    assert result.info["exit_code"] == 0 and result.info["reason"] == "finished"
    assert run("x = 1").text == "(no output)"


def test_a_failing_run_shows_stderr_and_its_exit_status():
    result = run("print('before')\n1 / 0")
    assert result.text.startswith("before\nstderr:\nTraceback")
    assert "ZeroDivisionError: division by zero" in result.text
    assert result.text.endswith("\nexit status: 1")
    assert result.info["exit_code"] == 1 and result.info["reason"] == "finished"


def test_long_output_is_cut_to_the_limit_keeping_the_error_and_status():
    result = run("import sys\nprint('x' * 100_000)\nsys.stderr.write('y' * 100_000)\nraise ValueError('the end')",
                 max_output_chars=500)
    assert len(result.text) <= 500
    assert result.text.startswith("xxx") and "ValueError: the end" in result.text
    assert result.text.endswith("exit status: 1")
    assert result.info["truncated"]


# --- wall clock, CPU, memory, processes ---------------------------------------------------------

@pytest.mark.parametrize("code", ["while True: pass", "import time; time.sleep(100)"], ids=["busy", "sleeping"])
def test_wall_clock_timeout_stops_the_program(code):
    start = time.monotonic()
    result = run(code, timeout_s=1)
    assert result.info["reason"] == "timed out" and result.info["exit_code"] is None
    assert result.text == "stopped: timed out after 1 s"
    assert time.monotonic() - start < 5


def test_cpu_time_limit_stops_a_busy_loop():
    result = run("while True: pass", cpu_s=1, timeout_s=20)
    assert result.info["reason"] == "CPU limit" and result.info["signal"] == "SIGXCPU"
    assert result.text == "stopped: CPU time limit (1 s)"


def test_a_memory_bomb_fails_only_its_call():
    bomb = "chunks = []\nwhile True:\n    chunks.append(bytearray(16 << 20))"
    result = run(bomb, memory_mb=256)
    assert result.info["reason"] == "out of memory"
    assert "MemoryError" in result.text and result.text.endswith("stopped: out of memory (limit 256 MB)")
    assert bytearray(300 << 20)  # the same 300 MB are no problem outside the sandbox
    assert run("print(len(bytearray(100 << 20)))", memory_mb=256).text == f"{100 << 20}\n"


def test_the_process_cap_holds_and_a_fork_bomb_fails_only_its_call():
    count = ("import os, time\nn = 0\nwhile True:\n    try:\n        pid = os.fork()\n    except OSError as e:\n"
             "        print(n, type(e).__name__)\n        break\n    if pid == 0:\n        time.sleep(60)\n"
             "        os._exit(0)\n    n += 1\n")
    assert run(count, max_processes=8).text.split() in (["7", "BlockingIOError"], ["6", "BlockingIOError"])
    bomb = ("import os\nprint(os.getuid(), flush=True)\nwhile True:\n    try:\n        os.fork()\n"
            "    except OSError:\n        pass")
    result = run(bomb, timeout_s=1, max_processes=16)
    assert result.info["reason"] == "timed out"
    uid = int(result.text.split()[0])
    if os.geteuid() == 0:
        assert UID_BASE <= uid < UID_BASE + UID_COUNT and not _processes(uid=uid)
    assert run("print('next')").text == "next\n"
    assert subprocess.run(["true"]).returncode == 0  # this process can still fork


def test_the_process_cap_check_sees_a_missing_cap():
    """The start-up check forks under a cap of one process: it reports "forked" for a sandbox
    that runs as root (RLIMIT_NPROC does not hold for root), which the factory refuses."""
    sandbox = checked_sandbox()
    assert fork_probe(sandbox) == "capped"
    if os.geteuid() == 0:
        assert fork_probe(replace(sandbox, setpriv=None)) == "forked"


# --- files and disk -----------------------------------------------------------------------------

def test_code_cannot_change_files_outside_its_working_directory(tmp_path):
    keep = tmp_path / "keep.txt"
    keep.write_text("original")
    marker = f"sandbox-{uuid.uuid4().hex}"
    prefix = Path(os.path.realpath(sys.base_prefix))  # seen by the sandbox, read-only
    targets = [keep, tmp_path / "new.txt", REPO / marker, Path("/tmp") / marker, REPO / "Makefile", prefix / marker]
    code = (f"import os\nfor path in {[str(t) for t in targets]!r}:\n"
            "    for attempt in (lambda: open(path, 'a').write('changed'), lambda: os.remove(path)):\n"
            "        try:\n            attempt()\n            print('changed', path)\n"
            "        except OSError as e:\n            print('refused', path, type(e).__name__)\n"
            "open('mine.txt', 'w').write('ok')\nprint(sorted(os.listdir('.')))")
    before = (REPO / "Makefile").read_bytes()
    lines = run(code).text.splitlines()
    # /tmp inside is the sandbox's own working directory: writing there is fine, and stays there
    assert [line.split()[0] for line in lines if "/tmp/sandbox-" not in line] == ["refused"] * 10 + ["['main.py',"]
    assert lines[-1] == "['main.py', 'mine.txt']"
    assert keep.read_text() == "original" and sorted(os.listdir(tmp_path)) == ["keep.txt"]
    assert not any((d / marker).exists() for d in (REPO, Path("/tmp"), prefix))
    assert (REPO / "Makefile").read_bytes() == before


def test_the_working_directory_is_fresh_each_call():
    assert run("import os\nopen('note.txt', 'w').write('hi')\nprint(os.getcwd(), sorted(os.listdir('.')))").text \
        == "/tmp ['main.py', 'note.txt']\n"
    assert run("import os\nprint(sorted(os.listdir('.')))").text == "['main.py']\n"


def test_writing_stops_at_the_disk_cap_and_the_host_disk_is_untouched():
    code = ("import os\ntotal = 0\nfor name in ('many', 'one'):\n    try:\n        for i in range(64):\n"
            "            with open(f'{name}{i}', 'wb') as f:\n"
            "                for _ in range(64 if name == 'one' else 2):\n"
            "                    f.write(bytes(1 << 20))\n                    total += 1 << 20\n"
            "    except OSError as e:\n        print(name, e.strerror)\n    for f in os.listdir('.'):\n"
            "        if f.startswith(name):\n            os.remove(f)\nprint(total >> 20)")
    free_before = os.statvfs("/").f_bavail * os.statvfs("/").f_frsize
    result = run(code, disk_mb=16)
    lines = result.text.splitlines()
    assert lines[0] == "many No space left on device"
    assert lines[1] in ("one File too large", "one No space left on device")
    assert int(lines[2]) <= 32  # at most 16 MB written each time
    assert abs(os.statvfs("/").f_bavail * os.statvfs("/").f_frsize - free_before) < 64 << 20


# --- network --------------------------------------------------------------------------------------

def test_no_network_not_even_the_hosts_loopback():
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        socket.create_connection(("127.0.0.1", port), timeout=5).close()  # reachable from outside
        code = (f"import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
                "    print('tcp connected')\nexcept OSError as e:\n    print('tcp', type(e).__name__)\n"
                "udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
                "for attempt in (lambda: udp.sendto(b'x', ('8.8.8.8', 53)),\n"
                "                lambda: socket.getaddrinfo('example.com', 80)):\n"
                "    try:\n        attempt()\n        print('udp/dns worked')\n"
                "    except OSError as e:\n        print('udp/dns', type(e).__name__)")
        result = run(code)
    assert result.text.splitlines() == ["tcp ConnectionRefusedError", "udp/dns OSError", "udp/dns gaierror"]


# --- lifetime and reach ---------------------------------------------------------------------------

def test_nothing_outlives_the_call():
    marker = f"sandbox-daemon-{uuid.uuid4().hex}"
    code = (f"import os, subprocess, sys\nsubprocess.Popen(['/bin/sh', '-c', 'sleep 60; : {marker}'])\n"
            "if os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        open('daemon.txt', 'w').write('up')\n"
            f"        os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(60)', '{marker}'])\n"
            "    os._exit(0)\nos.wait()\nprint('parent done')")
    start = time.monotonic()
    result = run(code, timeout_s=10)
    assert result.text == "parent done\n"
    assert time.monotonic() - start < 5  # the call did not wait for its daemon
    assert _processes(marker=marker) == []


def test_code_cannot_signal_or_see_processes_outside_its_call():
    code = (f"import os, signal\nfor pid in ({os.getpid()}, 1):\n    try:\n        os.kill(pid, signal.SIGKILL)\n"
            "        print(pid, 'sent')\n    except OSError as e:\n        print(pid, type(e).__name__)\n"
            "print(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))")
    result = run(code)
    lines = result.text.splitlines()
    assert lines[0] == f"{os.getpid()} ProcessLookupError"  # this process is not even visible
    assert lines[1] in ("1 PermissionError", "1 sent")  # pid 1 is the sandbox's own init, which survives it
    assert max(eval(lines[2])) < 10 and result.info["exit_code"] == 0


def test_code_cannot_read_the_trainers_environment(monkeypatch):
    secret = f"secret-{uuid.uuid4().hex}"
    monkeypatch.setenv("AGENT_R1_TEST_SECRET", secret)
    code = ("import os\nprint(dict(os.environ))\nfor pid in filter(str.isdigit, os.listdir('/proc')):\n    try:\n"
            "        print(open(f'/proc/{pid}/environ', 'rb').read())\n    except OSError as e:\n"
            "        print(pid, type(e).__name__)")
    assert secret in subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout
    result = run(code)
    assert result.info["exit_code"] == 0 and secret not in result.text


def test_code_cannot_make_a_user_namespace_memfd_or_shared_memory():
    """The syscall filter: in a user namespace code could mount a tmpfs of any size; memfd and
    SysV shared memory are memory the address-space limit does not count."""
    code = ("import ctypes, os, subprocess\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            "print('unshare', libc.unshare(0x10000000), os.strerror(ctypes.get_errno()))\n"
            "print('shmget', libc.shmget(0, 1 << 20, 0o1600), os.strerror(ctypes.get_errno()))\n"
            "try:\n    os.memfd_create('x')\n    print('memfd ok')\n"
            "except OSError as e:\n    print('memfd', e.strerror)\n"
            "print('unshare -Ur', subprocess.run(['unshare', '-Ur', 'true'], capture_output=True).returncode)")
    filtered = checked_sandbox().run(code)
    assert filtered.stdout.splitlines() == [
        "unshare -1 Operation not permitted", "shmget -1 Operation not permitted", "memfd Operation not permitted",
        "unshare -Ur 1"]
    unfiltered = replace(checked_sandbox(), syscall_filter=None).run(code)
    assert unfiltered.stdout.splitlines()[0] == "unshare 0 Success" and "memfd ok" in unfiltered.stdout


# --- concurrency ----------------------------------------------------------------------------------

def test_calls_run_concurrently_up_to_the_bound():
    tool = python_tool(max_concurrency=2)
    code = "import time\nstart = time.time()\ntime.sleep(0.4)\nprint(start, time.time())"
    with ThreadPoolExecutor(6) as pool:
        results = list(pool.map(lambda _: run_tool(tool, {"code": code}), range(6)))
    assert all(r.error is None and r.info["exit_code"] == 0 for r in results)
    spans = [tuple(map(float, r.text.split())) for r in results]
    at_once = max(sum(s <= start < e for s, e in spans) for start, _ in spans)
    assert at_once == 2


def test_the_tools_timeout_leaves_room_for_the_queue_and_the_run():
    tool = python_tool(timeout_s=5, queue_timeout_s=30)
    assert tool.timeout_s >= 35 and tool.thread_safe and tool.name == "python"


# --- start-up -------------------------------------------------------------------------------------

def test_a_missing_layer_stops_the_factory_with_one_line():
    with pytest.raises(SandboxUnavailable) as caught:
        get_tool("python")(bwrap="/nonexistent")
    message = str(caught.value)
    assert "\n" not in message and "'/nonexistent'" in message and "sandbox layer is missing" in message


def test_the_machine_is_checked_once_per_process():
    python_tool()
    hits = checked_sandbox.cache_info().hits
    start = time.perf_counter()
    python_tool(timeout_s=3)
    assert checked_sandbox.cache_info().hits == hits + 1 and time.perf_counter() - start < 0.05


def test_a_config_entry_builds_the_tool_and_bad_limits_are_refused():
    [tool] = build_tools([{"name": "python", "timeout_s": 5}])
    assert tool.name == "python" and "5 s" in tool.description
    with pytest.raises(ValueError, match="cpu_s must be a whole number"):
        python_tool(cpu_s=1.5)
    with pytest.raises(ValueError, match="max_concurrency must be >= 1"):
        python_tool(max_concurrency=0)
