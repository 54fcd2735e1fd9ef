"""The heap memory an update frees goes back to the OS when sampling starts (agent_r1/memory.py)."""

import pytest
import torch

from agent_r1 import memory
from agent_r1.config import EnvConfig
from agent_r1.context import ContextManager
from agent_r1.envs import ToolEnv
from agent_r1.rollout import SamplingParams, ScriptedEngine, run_episodes

pytestmark = pytest.mark.skipif(memory._malloc_trim() is None, reason="glibc's malloc_trim only")

MB = 1 << 20


def _free_on_the_heap(mb: int = 240) -> list[torch.Tensor]:
    """Free ``mb`` MB of tensors that glibc keeps, as after an update: once a 16 MB block is
    freed, glibc's mmap threshold is 16 MB, so 4 MB blocks come from the heap; every other one is
    freed, and the live ones between them (returned) keep the freed ones from merging into the top."""
    torch.empty(16 * MB, dtype=torch.uint8).fill_(1)  # allocated and freed
    blocks = [torch.ones(MB) for _ in range(mb // 2)]  # 4 MB each, touched
    return blocks[1::2]


def test_release_freed_hands_the_heaps_free_pages_back():
    pins = _free_on_the_heap()
    before = memory.rss_gb()
    released = memory.release_freed()
    assert released > 0.15 and memory.rss_gb() < before - 0.15
    assert memory.peak_rss_gb() > memory.rss_gb() + 0.1  # the peak stays
    assert len(pins) == 60


def test_a_batch_of_episodes_starts_by_releasing_what_the_update_freed(tok):
    """The agent loop (every rollout, held-out point and evaluation) releases freed memory first:
    without it the freed 240 MB stay resident through the whole batch."""
    pins = _free_on_the_heap()
    before = memory.rss_gb()
    make_env = lambda: ToolEnv.from_config([], EnvConfig())  # noqa: E731
    (traj,) = run_episodes(ScriptedEngine(tok, [["<answer>x</answer>"]]), make_env, [{"id": "q", "question": "?"}],
                           ContextManager(tok), SamplingParams())
    assert traj.answer == "x"
    assert memory.rss_gb() < before - 0.15
    assert len(pins) == 60
