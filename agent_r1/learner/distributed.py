"""Starting torch.distributed for DeepSpeed, on CPU (gloo) or GPU (nccl), with a visible cost; and the
few collectives the pipeline uses across ranks (each one a no-op in a single process).

A process is one of several ranks when a launcher (``torchrun``, ``deepspeed``, ``agent-r1 train
--nproc N``) set ``WORLD_SIZE`` > 1. Rank 0 owns the record (MLflow, checkpoints, state files,
metrics: DESIGN.md contract 8); :func:`is_main` says whether this process is it.
"""

from __future__ import annotations

import logging
import os
import socket
import time

from agent_r1.ports import free_port

log = logging.getLogger(__name__)


def _loopback_interface() -> str | None:
    """The loopback interface's name ("lo" on Linux, "lo0" on macOS), if there is one."""
    return next((name for _, name in socket.if_nameindex() if name.startswith("lo")), None)


def init_distributed(backend: str | None = None) -> None:
    """Initialise the process group once (a single process when not launched by torchrun).

    A single process listens on the loopback interface only: its rendezvous store is in
    memory (no TCPStore, whose server binds every interface), and gloo and NCCL are pointed at
    the loopback interface (``GLOO_SOCKET_IFNAME`` / ``NCCL_SOCKET_IFNAME``, unless set). Under
    torchrun the launcher's rendezvous and interfaces are used as they are.

    Without a GPU, DeepSpeed would build its shared-memory all-reduce (a C++ extension: 30-110 s
    on 2 cores, again whenever the venv's path changes) each time its extensions cache lacks it.
    That op serves only inference's tensor-parallel all-reduce (``inference_all_reduce``, which
    falls back to torch.distributed without it); training's gradients and the pipeline's
    collectives go through torch.distributed (gloo), so it is never built. We log before and
    after so a wait is never a mystery.
    """
    import deepspeed
    import torch
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return
    single = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"}
    added = [k for k in single if k not in os.environ]  # not launched by torchrun: one process
    os.environ.update({k: single[k] for k in added})
    backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    if not torch.cuda.is_available():  # DeepSpeed reads its op table on start: the op is not built
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    if torch.cuda.is_available() and "LOCAL_RANK" not in added:  # "cuda" is this rank's GPU from here on
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    log.info("starting DeepSpeed (%s)", backend)
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


# ------------------------------------------------------------------------------ ranks
def world_size() -> int:
    """How many ranks this run has (1 unless a launcher started several)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return int(os.environ.get("WORLD_SIZE", "1"))


def rank() -> int:
    """This process's global rank (0 in a single process)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", "0"))


def is_main() -> bool:
    """Rank 0: the process that writes files and talks to MLflow."""
    return rank() == 0


def barrier() -> None:
    """Wait for every rank (nothing to wait for in a single process)."""
    if world_size() > 1:
        init_distributed()
        import torch.distributed as dist

        dist.barrier()


def broadcast_object(obj=None):
    """Rank 0's ``obj`` on every rank."""
    if world_size() == 1:
        return obj
    init_distributed()
    import torch.distributed as dist

    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def all_gather_object(obj) -> list:
    """Every rank's ``obj``, in rank order."""
    if world_size() == 1:
        return [obj]
    init_distributed()
    import torch.distributed as dist

    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def all_reduce(values: list[float], op: str = "sum") -> list[float]:
    """``values`` summed (``op="sum"``) or maximised (``"max"``) over the ranks, in float64."""
    if world_size() == 1:
        return list(values)
    import torch
    import torch.distributed as dist

    device = "cuda" if dist.get_backend() == "nccl" else "cpu"  # NCCL reduces GPU tensors only
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op={"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}[op])
    return t.tolist()


def any_rank(flag: bool) -> bool:
    """Whether ``flag`` is true on any rank (``flag`` itself in a single process)."""
    return all_reduce([float(flag)], "max")[0] > 0 if world_size() > 1 else bool(flag)


def my_share(items: list) -> list:
    """This rank's contiguous share of ``items`` (rank r's follows rank r-1's; all of them in a
    single process): :func:`gathered` puts the shares back in order."""
    n, r, world = len(items), rank(), world_size()
    return items[n * r // world: n * (r + 1) // world]


def gathered(items: list) -> list:
    """Every rank's ``items`` concatenated in rank order (``items`` itself in a single process)."""
    return [x for part in all_gather_object(items) for x in part] if world_size() > 1 else items


def shutdown() -> int:
    """End the process group once every rank is done (a rank that exits with the group alive can
    abort in a communication thread's destructor); returns how many ranks there were."""
    import torch.distributed as dist

    n = world_size()
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()
        dist.destroy_process_group()
    return n
