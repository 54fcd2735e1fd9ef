"""Starting torch.distributed for DeepSpeed, on CPU (gloo) or GPU (nccl), with a visible cost."""

from __future__ import annotations

import logging
import os
import socket
import time

log = logging.getLogger(__name__)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_distributed(backend: str | None = None) -> None:
    """Initialise the process group once (a single process when not launched by torchrun).

    On a CPU machine DeepSpeed builds a small C++ extension the first time it starts the
    process group (about 30 s, needs g++ and ninja); later runs load it from the torch
    extensions cache (``TORCH_EXTENSIONS_DIR``). We log before and after so the wait is never a
    mystery.
    """
    import deepspeed
    import torch
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return
    single = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"}
    added = [k for k in single if k not in os.environ]  # not launched by torchrun: one process
    os.environ.update({k: single[k] for k in added})
    backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    log.info("starting DeepSpeed (%s); the first run on a machine compiles a C++ op (~30 s)", backend)
    t0 = time.perf_counter()
    try:
        deepspeed.init_distributed(dist_backend=backend, verbose=False)
    finally:
        # A subprocess started later must not inherit our rendezvous port (it would collide);
        # the rank variables stay, DeepSpeed's engine reads LOCAL_RANK.
        for k in {"MASTER_ADDR", "MASTER_PORT"} & set(added):
            os.environ.pop(k, None)
    log.info("DeepSpeed ready in %.1f s", time.perf_counter() - t0)
