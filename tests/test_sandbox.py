"""The ``python`` tool's sandbox, one layer at a time, each against a hostile program.

Where it is cheap, a test also shows that the same program succeeds without the layer (outside
the sandbox, or in a sandbox built without it), so that the test would fail if the layer went.
"""

from __future__ import annotations

import ast
import errno
import json
import os
import platform
import resource
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import pytest

from agent_r1.sandbox import (
    SYSCALLS,
    UID_BASE,
    UID_COUNT,
    Limits,
    SandboxUnavailable,
    call_cgroup,
    checked,
    checked_sandbox,
    delegated_cgroup,
    fork_probe,
    found_sandbox,
    own_cgroup,
)
from agent_r1.tools import build_tools, get_tool, python_tool, run_tool
from tests.procs import live
from tests.test_structure import import_graph

REPO = Path(__file__).resolve().parents[1]
SECRET_NAME = "AGENT_R1_TEST_SECRET"
# The hostile programs that run both as root and as an unprivileged trainer (test_as_an_unprivileged_user).
# Each prints a short verdict, so that no cut of the output can hide a finding.
ENVIRON_PROBE = """import os
secret = {secret!r}.encode()
readable, leaked = [], []
for pid in filter(str.isdigit, os.listdir('/proc')):
    try:
        environ = open(f'/proc/{{pid}}/environ', 'rb').read()
    except OSError:
        continue
    readable.append(pid)
    if secret in environ:
        leaked.append(pid)
print('readable', *readable)
print('leaked', *leaked, secret.decode() in str(os.environ))
"""
# 8 processes that each fill their 64 MB of address space, each saying its OOM ranking first; the
# first waits for the others, so that every one of them prints before the sandbox ends
MEMORY_BOMB = """import os
first = True
for _ in range(7):
    if os.fork() == 0:
        first = False
        break
print(open('/proc/self/oom_score_adj').read().strip(), flush=True)
if first:
    for _ in range(7):
        os.wait()
chunks = []
while True:
    chunks.append(b'x' * (4 << 20))
"""
# limits under which the bomb ends in MemoryError alone: the call's cgroup (where there is one)
# has room for every process's 64 MB, so the kernel's OOM killer never has to choose
BOMB_LIMITS = {"memory_mb": 64, "max_processes": 16, "call_memory_mb": 1024, "timeout_s": 60}
FORK_BOMB = ("import os\nprint(os.getuid(), flush=True)\nwhile True:\n    try:\n        os.fork()\n"
             "    except OSError:\n        pass")
WRITES = """for path in {targets!r}:
    try:
        open(path, 'a').write('changed')
        print('changed', path)
    except OSError as e:
        print('refused', path, type(e).__name__)
"""
NETWORK = """import socket
try:
    socket.create_connection(('127.0.0.1', {port}), timeout=2)
    print('tcp connected')
except OSError as e:
    print('tcp', type(e).__name__)
"""


def secret_value() -> str:
    """A long secret whose start and end differ from any cut of the output."""
    return f"secret-{uuid.uuid4().hex}-" + "z" * 5000 + uuid.uuid4().hex


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
    return live(lambda p: p.uid == uid or (marker is not None and marker.encode() in p.cmdline))


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
    assert time.monotonic() - start < 30  # not the program's 100 s (or forever)


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


def check_memory_bomb(text: str, reason: str, error: str | None) -> None:
    """Every one of the 8 processes had oom_score_adj 1000 (the OOM killer's first pick), and
    each ran into its own address-space limit."""
    assert error is None and reason == "out of memory"
    assert text.startswith("1000\n" * 8 + "stderr:\n") and text.endswith("\nstopped: out of memory (limit 64 MB)")


def test_a_multi_process_memory_bomb_fails_its_call_and_the_oom_killer_takes_the_sandbox_first():
    """8 processes that each fill their address space: the call ends in an out-of-memory
    observation, every sandboxed process has oom_score_adj 1000, and the next call works."""
    result = run(MEMORY_BOMB, **BOMB_LIMITS)
    check_memory_bomb(result.text, result.info["reason"], result.error)
    assert run("print(6 * 7)").text == "42\n"


# --- the call's cgroup --------------------------------------------------------------------------

def _writable_cgroup() -> bool:
    return bool(own_cgroup() and os.access(own_cgroup(), os.W_OK) and os.geteuid() == 0)


@contextmanager
def child_cgroup(kind: str | None = None):
    """A fresh cgroup in this process's own (of cgroup.type `kind`), removed afterwards."""
    folder = tempfile.mkdtemp(prefix="agent-r1-test-", dir=own_cgroup())
    try:
        if kind:
            Path(folder, "cgroup.type").write_text(kind)
        yield folder
    finally:
        os.rmdir(folder)


def _calls_cgroups(folder: str) -> list[str]:
    return [p.name for p in Path(folder).iterdir() if p.name.startswith("agent-r1-sandbox-")]


@pytest.mark.skipif(not _writable_cgroup(), reason="needs root and a writable cgroup v2 folder")
def test_the_calls_cgroups_are_sought_only_in_this_processs_own_cgroup():
    """A trainer in a cgroup of its own (a leaf, as in a systemd service) that delegates nothing:
    no cgroup is made for its calls, not even beside it (outside the limits of what holds it),
    and the reason names its cgroup."""
    probe = "import json; from agent_r1.sandbox import delegated_cgroup; print(json.dumps(delegated_cgroup()))"
    with child_cgroup() as leaf:
        code = f"import os; open({leaf + '/cgroup.procs'!r}, 'w').write(str(os.getpid()))\n{probe}"
        answer = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                                env={**os.environ, "PYTHONPATH": str(REPO)})
    assert answer.returncode == 0, answer.stderr
    folder, why = json.loads(answer.stdout)
    assert folder is None and why.startswith(f"this process's cgroup {leaf} delegates no memory and pids controller")


@pytest.mark.skipif(not _writable_cgroup(), reason="needs root and a writable cgroup v2 folder")
@pytest.mark.parametrize("kind", [None, "threaded"], ids=["no memory controller", "threaded"])
def test_a_cgroup_a_call_cannot_run_in_is_dropped_with_a_warning_naming_the_layer(kind, caplog):
    """Two folders whose calls' cgroups cannot hold a call: one that delegates no memory controller
    (a call's memory.max cannot be written; a call would run in a cgroup that holds nothing) and a
    threaded one (its children are "domain invalid", which no process can enter; the start-up
    check said "bwrap cannot start it here"). Each is dropped with a warning naming the per-call
    memory layer and the folder, nothing is left in it, and the sandbox runs without it."""
    with child_cgroup(kind) as parent:
        with pytest.raises(OSError):
            with call_cgroup(parent, Limits()):
                pass
        sandbox = checked(replace(found_sandbox(), cgroup=parent))
        assert _calls_cgroups(parent) == []
    assert sandbox.cgroup is None and sandbox.run("print(6 * 7)").stdout == "42\n"
    [warning] = [r.getMessage() for r in caplog.records if "per-call memory" in r.getMessage()]
    assert warning.startswith("sandbox: the per-call memory layer (a cgroup per call) is missing: a call cannot run "
                              f"in a cgroup made in {parent} (")


@pytest.mark.skipif(delegated_cgroup()[0] is None, reason="this process's cgroup delegates no memory and pids")
def test_a_calls_cgroup_holds_its_memory_and_processes():
    """Where this process's cgroup delegates memory and pids: a call's cgroup has memory.max =
    call_memory_mb and pids.max = max_processes + 2, and 300 MB under a 128 MB budget (and a
    1 GB address space) end in the OOM killer's SIGKILL, where they pass without the cgroup."""
    parent = delegated_cgroup()[0]
    limits = Limits(memory_mb=1024, call_memory_mb=128, max_processes=8, timeout_s=60)
    with call_cgroup(parent, limits) as folder:
        assert Path(folder, "memory.max").read_text() == f"{128 << 20}\n"
        assert Path(folder, "pids.max").read_text() == "10\n"
    assert not os.path.exists(folder)
    sandbox = replace(checked_sandbox(), limits=limits)
    assert sandbox.cgroup == parent
    code = "print(len(b'x' * (300 << 20)))"
    outcome = sandbox.run(code)
    assert (outcome.reason, outcome.signal) == ("killed", "SIGKILL") and _calls_cgroups(parent) == []
    assert replace(sandbox, cgroup=None).run(code).stdout == f"{300 << 20}\n"


def test_the_process_cap_holds_and_a_fork_bomb_fails_only_its_call():
    count = ("import os, time\nn = 0\nwhile True:\n    try:\n        pid = os.fork()\n    except OSError as e:\n"
             "        print(n, type(e).__name__)\n        break\n    if pid == 0:\n        time.sleep(60)\n"
             "        os._exit(0)\n    n += 1\n")
    assert run(count, max_processes=8).text.split() in (["7", "BlockingIOError"], ["6", "BlockingIOError"])
    result = run(FORK_BOMB, timeout_s=3, max_processes=16)
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
    marker = f"sandbox-{uuid.uuid4().hex}"
    code += (f"\nopen('{marker}', 'w').write('left?')\n"  # the working directory's mount: type, place, size
             "mount = next(m for m in map(str.split, open('/proc/self/mountinfo')) if m[4] == '/tmp')\n"
             "print(mount[mount.index('-') + 1], mount[4], *[o for o in mount[-1].split(',') if o.startswith('size')])")
    result = run(code, disk_mb=16)
    lines = result.text.splitlines()
    assert lines[0] == "many No space left on device"  # 2 MB files, each under RLIMIT_FSIZE: the tmpfs is full
    assert lines[1] in ("one File too large", "one No space left on device")
    assert int(lines[2]) <= 32  # at most 16 MB written each time
    assert lines[3] == "tmpfs /tmp size=16384k"  # in memory, 16 MB, and gone with the call:
    assert not any((d / marker).exists() for d in (REPO, Path("/tmp"), Path(tempfile.gettempdir()), Path.cwd()))


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
    assert time.monotonic() - start < 30  # the call did not wait for its daemon (60 s)
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


def check_environ(text: str, pid_1_readable: bool) -> None:
    readable, leaked = text.splitlines()
    assert readable.split()[0] == "readable" and ("1" in readable.split()) == pid_1_readable
    assert leaked == "leaked False"


def test_code_cannot_read_the_trainers_environment(monkeypatch):
    """Not in its own environment, nor in any /proc/*/environ it can read: bwrap's pid 1 stays in
    the sandbox, and as root without the uid switch (allow_no_process_cap) it is readable."""
    secret = secret_value()
    monkeypatch.setenv(SECRET_NAME, secret)
    probe = ENVIRON_PROBE.format(secret=secret)
    outside = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True).stdout
    assert outside.splitlines()[1].endswith("True")  # the probe sees the secret where it is
    check_environ(run(probe).text, pid_1_readable=os.geteuid() != 0)
    if os.geteuid() == 0:
        check_environ(replace(checked_sandbox(), setpriv=None).run(probe).stdout, pid_1_readable=True)


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


@pytest.mark.skipif(platform.machine() not in SYSCALLS, reason="no syscall numbers for this architecture")
def test_code_cannot_use_keyrings_io_uring_bpf_perf_events_or_ptrace():
    numbers = SYSCALLS[platform.machine()][1]
    names = ["add_key", "request_key", "keyctl", "io_uring_setup", "io_uring_enter", "io_uring_register", "bpf",
             "perf_event_open", "ptrace", "process_vm_readv", "process_vm_writev"]
    code = ("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nlibc.syscall.restype = ctypes.c_long\n"
            f"for name, number in {[(n, numbers[n]) for n in names]!r}:\n"
            "    print(name, libc.syscall(number, 0, 0, 0, 0, 0, 0), ctypes.get_errno())")
    expected = [f"{name} -1 {errno.EPERM}" for name in names]
    assert checked_sandbox().run(code).stdout.splitlines() == expected
    assert replace(checked_sandbox(), syscall_filter=None).run(code).stdout.splitlines() != expected


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
    info = checked_sandbox.cache_info()
    python_tool(timeout_s=3)
    assert checked_sandbox.cache_info()[:2] == (info.hits + 1, info.misses)  # no second check ran


def test_a_config_entry_builds_the_tool_and_bad_limits_are_refused():
    [tool] = build_tools([{"name": "python", "timeout_s": 5}])
    assert tool.name == "python" and "5 s" in tool.description
    with pytest.raises(ValueError, match="cpu_s must be a whole number"):
        python_tool(cpu_s=1.5)
    with pytest.raises(ValueError, match="max_concurrency must be >= 1"):
        python_tool(max_concurrency=0)


# --- descriptors ----------------------------------------------------------------------------------

def call_with_many_descriptors_open(settings: dict) -> list[str]:
    """With 1,100 descriptors open in the trainer (so some are >= 1024, past select()): the
    observations of a clean call (60 s to start and finish on a busy machine) and of a call that
    times out (a sleep of 100 s, stopped at 1 s), and whether this process's descriptors are the
    same before and after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 2048)), hard))
    opened = [os.open("/dev/null", os.O_RDONLY) for _ in range(1100)]
    try:
        before = sorted(os.listdir("/proc/self/fd"))
        texts = [run_tool(python_tool(**settings, timeout_s=timeout_s), {"code": code}).text
                 for code, timeout_s in (("print(6 * 7)", 60), ("import time; time.sleep(100)", 1))]
        return texts + [str(sorted(os.listdir("/proc/self/fd")) == before)]
    finally:
        for fd in opened:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_call_works_with_1100_descriptors_open_and_leaks_none():
    assert call_with_many_descriptors_open({}) == [
        "42\n", "stopped: timed out after 1 s", "True"]


# --- the uid lock folder --------------------------------------------------------------------------

@pytest.mark.skipif(os.geteuid() != 0, reason="uid locks are taken as root only")
@pytest.mark.parametrize("plant", ["another owner", "open to all", "symlink"])
def test_a_planted_uid_lock_folder_is_refused(tmp_path, monkeypatch, plant):
    """In a shared /tmp, a folder (or symlink) planted by another user must not be trusted: it could
    hold every lock, or make root create files elsewhere."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    folder, elsewhere = tmp_path / "agent-r1-sandbox-uids", tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    if plant == "symlink":
        folder.symlink_to(elsewhere)
    else:
        folder.mkdir()
        folder.chmod(0o777 if plant == "open to all" else 0o700)
        if plant == "another owner":
            os.chown(folder, 54321, 54321)
    with pytest.raises(SandboxUnavailable, match="uid lock folder") as caught:
        checked_sandbox().run("print(1)")
    assert "\n" not in str(caught.value) and os.listdir(elsewhere) == []
    os.unlink(folder) if plant == "symlink" else os.rmdir(folder)
    assert checked_sandbox().run("print(1)").stdout == "1\n"  # a folder of its own is made
    made = folder.lstat()
    assert (made.st_uid, made.st_mode & 0o7777) == (0, 0o700) and folder.is_dir() and not folder.is_symlink()


# --- interpreter and bubblewrap version --------------------------------------------------------------

@pytest.mark.skipif(not os.path.exists("/usr/bin/python3"), reason="no /usr/bin/python3")
def test_the_interpreter_setting_names_another_python():
    assert run("import sys\nprint(sys.executable)", interpreter="/usr/bin/python3").text \
        == os.path.realpath("/usr/bin/python3") + "\n"
    with pytest.raises(SandboxUnavailable, match="set interpreter: to a Python 3 it can read") as caught:
        python_tool(interpreter="/nonexistent/bin/python3")
    assert "\n" not in str(caught.value)


def test_a_bubblewrap_older_than_0_7_is_refused_with_both_versions(tmp_path):
    old = tmp_path / "bwrap"
    old.write_text("#!/bin/sh\necho bubblewrap 0.6.1\n")
    old.chmod(0o755)
    with pytest.raises(SandboxUnavailable) as caught:
        python_tool(bwrap=str(old))
    message = str(caught.value)
    assert "\n" not in message and "bubblewrap 0.6.1" in message and "0.7 or later" in message


# --- as an unprivileged user ----------------------------------------------------------------------

_UNPRIVILEGED_TRAINER = """import json, os, sys
from agent_r1.tools import SandboxUnavailable, python_tool, run_tool
from tests.test_sandbox import call_with_many_descriptors_open
uid, programs = int(sys.argv[1]), json.loads(sys.stdin.read())
os.setgroups([])
os.setgid(uid)
os.setuid(uid)
try:
    python_tool()
    default = 'built'
except SandboxUnavailable as e:
    default = str(e)
settings = {'interpreter': '/usr/bin/python3'}
out = {'default': default, 'own python readable': os.access(os.path.realpath(sys.executable), os.R_OK)}
for name, (code, limits) in programs.items():
    result = run_tool(python_tool(**settings, **limits), {'code': code})
    out[name] = [result.text, result.info.get('reason'), result.error]
out['descriptors'] = call_with_many_descriptors_open(settings)
print(json.dumps(out))
"""


@pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists("/usr/bin/python3"),
                    reason="needs root to drop to a fresh uid, and /usr/bin/python3")
def test_as_an_unprivileged_user(tmp_path):
    """A trainer-like process drops to a fresh uid after its imports and runs the hostile programs
    through the tool. Where its own Python is out of that uid's reach (a pyenv under /root), the
    tool names the interpreter setting; with /usr/bin/python3 every layer holds."""
    uid = 54321 + os.getpid() % 1000
    secret = secret_value()
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # the trainer's uid could write here; the sandbox cannot even see it
    marker = f"sandbox-{uuid.uuid4().hex}"
    targets = [str(shared / marker), f"/tmp/{marker}", str(REPO / marker), f"/usr/{marker}"]
    with socket.create_server(("127.0.0.1", 0)) as server:
        programs = {
            "environ": (ENVIRON_PROBE.format(secret=secret), {}),
            "memory bomb": (MEMORY_BOMB, BOMB_LIMITS),
            "fork bomb": (FORK_BOMB, {"timeout_s": 3, "max_processes": 16}),
            "after": ("print('next')", {}),
            "writes": (WRITES.format(targets=targets), {}),
            "network": (NETWORK.format(port=server.getsockname()[1]), {}),
        }
        child = subprocess.run([sys.executable, "-c", _UNPRIVILEGED_TRAINER, str(uid)], input=json.dumps(programs),
                               capture_output=True, text=True, cwd=REPO, timeout=120,
                               env={**os.environ, "PYTHONPATH": str(REPO), SECRET_NAME: secret})
    assert child.returncode == 0, child.stderr[-3000:]
    out = json.loads(child.stdout.splitlines()[-1])
    if not out["own python readable"]:
        assert "set interpreter: to a Python 3 it can read, e.g. /usr/bin/python3" in out["default"]
    check_environ(out["environ"][0], pid_1_readable=True)
    check_memory_bomb(*out["memory bomb"])
    assert out["fork bomb"][1] == "timed out" and out["fork bomb"][0].startswith(f"{uid}\n")
    assert out["after"][0] == "next\n" and _processes(uid=uid) == []
    # /tmp inside is the sandbox's own working directory: writing there is fine, and stays there
    assert [line.split()[0] for line in out["writes"][0].splitlines()] == ["refused", "changed", "refused", "refused"]
    assert not any(Path(t).exists() for t in targets) and os.listdir(shared) == []
    assert out["network"][0] == "tcp ConnectionRefusedError\n"
    assert out["descriptors"] == ["42\n", "stopped: timed out after 1 s", "True"]


# --- the package ----------------------------------------------------------------------------------

def test_the_sandbox_stands_alone_and_the_python_tool_holds_only_the_tool():
    """agent_r1.sandbox imports no other part of agent_r1 (a tool or a server can use it without
    the python tool), and the python tool starts no process and reads no descriptor itself."""
    graph = import_graph(deferred=True)
    sandbox = {name: deps for name, deps in graph.items() if name.split(".")[:2] == ["agent_r1", "sandbox"]}
    assert len(sandbox) >= 8 and "agent_r1.sandbox.core" in sandbox
    outside = {d for deps in sandbox.values() for d in deps if d.split(".")[:2] != ["agent_r1", "sandbox"]}
    assert outside == set()
    assert "agent_r1.sandbox" in graph["agent_r1.tools.python"]
    tree = ast.parse((REPO / "agent_r1" / "tools" / "python.py").read_text())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names} | \
        {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert imported & {"subprocess", "select", "selectors", "fcntl", "signal", "struct", "ctypes", "json"} == set()
