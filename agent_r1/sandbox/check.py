"""The machine, checked once per process and settings by running the sandbox: where it lacks a
layer, one line (`SandboxUnavailable`) names the layer and the setting that accepts running
without it, if any. The per-call memory layer (a cgroup per call) has no such setting: without
it, a warning names it and why, and each call is held by its rlimits and ``oom_score_adj``."""

from __future__ import annotations

import functools
import logging
import os
import platform
import re
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from agent_r1.sandbox.cgroups import delegated_cgroup, unusable
from agent_r1.sandbox.core import Sandbox
from agent_r1.sandbox.limits import Limits, SandboxUnavailable
from agent_r1.sandbox.mounts import interpreter_mounts
from agent_r1.sandbox.seccomp import syscall_filter

log = logging.getLogger(__name__)
MIN_BWRAP = (0, 7)  # --size
_FORK_PROBE = """import os
try:
    pid = os.fork()
except OSError:
    print("capped")
else:
    if pid == 0:
        os._exit(0)
    print("forked")
"""


def fork_probe(sandbox: Sandbox) -> str:
    """Fork once under a cap of one process: "capped" where the process cap holds, "forked" where
    it does not, else the last line of what went wrong."""
    o = replace(sandbox, limits=Limits(max_processes=1)).run(_FORK_PROBE)
    if o.exit_code == 0:
        return o.stdout.strip()
    return (o.stderr.strip().splitlines() or [f"{o.reason}, exit status {o.exit_code}"])[-1]


def missing(layer: str, why: str, opt_out: str | None) -> SandboxUnavailable:
    accept = f"set {opt_out}: true to run without it" if opt_out else "no setting runs code without it"
    return SandboxUnavailable(f"the {layer} layer is missing: {why}; {accept}")


def _without_call_cgroups(why: str) -> None:
    log.warning("sandbox: the per-call memory layer (a cgroup per call) is missing: %s; each call is held by its "
                "per-process rlimits and oom_score_adj 1000 alone", why)


def calls_cgroup(folder: str) -> str | None:
    """`folder` if a call can run in a cgroup made in it; else None, with a warning naming the
    layer and why."""
    if problem := unusable(folder, Limits()):
        _without_call_cgroups(f"a call cannot run in a cgroup made in {folder} ({problem})")
        return None
    return folder


def _interpreter(setting: str | None) -> tuple[str, str]:
    """The sandbox's interpreter (`setting`, else this process's own) and its prefix, refused in
    one line where the sandbox's uid cannot read them. The code runs with ``-I -S``, so any
    Python 3 serves."""
    path = os.path.realpath(setting or sys.executable)
    prefix = str(Path(path).parents[1]) if setting else os.path.realpath(sys.base_prefix)
    try:
        if os.geteuid() == 0:  # bwrap binds them as root; the call's own uid then runs them as "others"
            readable = all(os.stat(p).st_mode & 0o005 == 0o005 for p in (path, prefix)) and os.path.isfile(path)
        else:  # bwrap binds them as this user, who is the sandbox's user too
            readable = all(os.access(p, os.R_OK | os.X_OK) for p in (path, prefix)) and os.path.isfile(path)
    except OSError:
        readable = False
    if not readable:
        raise SandboxUnavailable(f"the sandbox's uid cannot read the interpreter {path} (missing or not readable); "
                                 "set interpreter: to a Python 3 it can read, e.g. /usr/bin/python3")
    return path, prefix


def _bwrap(setting: str) -> str:
    """The path of bubblewrap, refused in one line where it is missing or older than 0.7."""
    found = shutil.which(setting)
    if found is None:
        raise missing("sandbox", f"bubblewrap not found at {setting!r} (apt-get install bubblewrap, or set bwrap: "
                      "to its path)", None)
    answer = subprocess.run([found, "--version"], capture_output=True, text=True, env={}).stdout.strip()
    version = re.search(r"(\d+)\.(\d+)[.\d]*", answer)
    if version is None or tuple(map(int, version.groups())) < MIN_BWRAP:
        raise missing("sandbox", f"{found} is bubblewrap {version[0] if version else repr(answer)}, and 0.7 or "
                      "later is needed (for --size)", None)
    return found


def found_sandbox(bwrap: str = "bwrap", allow_no_syscall_filter: bool = False,
                  interpreter: str | None = None) -> Sandbox:
    """The sandbox's programs, interpreter and syscall filter, found on this machine (not yet
    run), without a cgroup for its calls."""
    found = _bwrap(bwrap)
    names = ("prlimit", "choom", "setpriv") if os.geteuid() == 0 else ("prlimit", "choom")
    helpers = {name: shutil.which(name) for name in names}
    if absent := [name for name, path in helpers.items() if path is None]:
        raise missing("resource limits", f"util-linux's {' and '.join(absent)} not found", None)
    machine = platform.machine()
    program = syscall_filter(machine)
    if program is None and not allow_no_syscall_filter:
        raise missing("syscall filter", f"no seccomp filter for the {machine} architecture", "allow_no_syscall_filter")
    path, prefix = _interpreter(interpreter)
    return Sandbox(bwrap=found, prlimit=helpers["prlimit"], choom=helpers["choom"], setpriv=helpers.get("setpriv"),
                   interpreter=path, mounts=tuple(interpreter_mounts(prefix)), syscall_filter=program)


def checked(sandbox: Sandbox, allow_no_process_cap: bool = False) -> Sandbox:
    """`sandbox` checked by running it: itself where the process cap holds; as root, without the
    uid switch where that is what fails and `allow_no_process_cap` accepts it; else raises
    `SandboxUnavailable`. Its calls' cgroup folder is kept only where a call can run in one
    (`calls_cgroup`)."""
    if sandbox.cgroup is not None:
        sandbox = replace(sandbox, cgroup=calls_cgroup(sandbox.cgroup))
    result = fork_probe(sandbox)
    if result == "capped":
        return sandbox
    if result == "forked":
        why = "RLIMIT_NPROC does not hold for the sandbox's user"
    else:  # the sandbox did not run: without the uid switch?
        plain = replace(sandbox, setpriv=None)
        plain_result = fork_probe(plain) if sandbox.setpriv else result
        if plain_result not in ("capped", "forked"):
            raise missing("sandbox", f"bwrap cannot start it here ({plain_result})", None)
        sandbox, why = plain, f"cannot switch to an unprivileged uid ({result})"
    if not allow_no_process_cap:
        raise missing("process cap", why, "allow_no_process_cap")
    return sandbox


@functools.lru_cache(maxsize=None)
def checked_sandbox(bwrap: str = "bwrap", allow_no_process_cap: bool = False,
                    allow_no_syscall_filter: bool = False, interpreter: str | None = None) -> Sandbox:
    """The sandbox with every layer this machine provides, checked by running it (once per process
    and settings). Raises `SandboxUnavailable` where a layer is missing and not opted out of."""
    sandbox = found_sandbox(bwrap, allow_no_syscall_filter, interpreter)
    return checked(replace(sandbox, cgroup=_delegated_cgroup()), allow_no_process_cap)


@functools.lru_cache(maxsize=None)
def _delegated_cgroup() -> str | None:
    """`delegated_cgroup`, with a warning (once per process) where there is none."""
    folder, why = delegated_cgroup()
    if folder is None:
        _without_call_cgroups(why)
    return folder
