"""`make test`'s two workers keep each group of tests/conftest.py on one worker (the vLLM tests must not
overlap: they count every server on the machine, and two servers at once strain the memory)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_a_group_of_several_files_runs_on_one_worker():
    tests = ["tests/test_vllm.py::test_missing_environment_is_a_one_line_error",
             "tests/test_vllm_url.py::test_a_failed_reload_says_what_is_likely_wrong",
             "tests/test_vllm.py::test_config_rejects_a_server_context_shorter_than_the_episodes",
             "tests/test_cli.py", "tests/test_config.py"]
    r = subprocess.run([sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup",
                        "--no-loadscope-reorder", *tests], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:]
    workers = {m[1]: m[0] for m in re.findall(r"\[(gw\d)\] \[ *\d+%\] PASSED (tests/test_vllm\w*\.py::\w+)", r.stdout)}
    assert len(workers) == 3 and len(set(workers.values())) == 1, r.stdout[-3000:]
    assert re.search(r"\[gw\d\] .*PASSED tests/test_config\.py", r.stdout)
