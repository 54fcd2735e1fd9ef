"""A free TCP port of 127.0.0.1 (standard library only)."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port of 127.0.0.1 that is free now: the vLLM server's, torch.distributed's single-process rendezvous."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
