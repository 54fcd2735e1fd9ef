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


def _loopback_interface() -> str | None:
    """The loopback interface's name ("lo" on Linux, "lo0" on macOS), if there is one."""
    return next((name for _, name in socket.if_nameindex() if name.startswith("lo")), None)


def init_distributed(backend: str | None = None) -> None:
    """Initialise the process group once (a single process when not launched by torchrun).

    A single process listens on the loopback interface only: its rendezvous store is in
    memory (no TCPStore, whose server binds every interface), and gloo and NCCL are pointed at
    the loopback interface (``GLOO_SOCKET_IFNAME`` / ``NCCL_SOCKET_IFNAME``, unless set). Under
    torchrun the launcher's rendezvous and interfaces are used as they are.

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
        if "MASTER_PORT" in added:
            if (lo := _loopback_interface()) is not None:
                for key in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):  # read when a backend starts
                    os.environ.setdefault(key, lo)
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
        deepspeed.init_distributed(dist_backend=backend, verbose=False)
    finally:
        # A subprocess started later must not inherit our rendezvous port (it would collide);
        # the rank variables stay, DeepSpeed's engine reads LOCAL_RANK.
        for k in {"MASTER_ADDR", "MASTER_PORT"} & set(added):
            os.environ.pop(k, None)
    log.info("DeepSpeed ready in %.1f s", time.perf_counter() - t0)
