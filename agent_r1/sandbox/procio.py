"""The sandbox's process I/O: the code and filter handed over as in-memory files, stdout and
stderr read (their head and tail) up to a deadline, bwrap's pid 1 found through ``--info-fd``
and waited for through a pidfd. Descriptors are waited on with epoll and poll, which take any
descriptor number (``select()`` stops at 1023)."""

from __future__ import annotations

import json
import os
import select
import selectors
import signal
import subprocess
import time

EXIT_GRACE_S = 5.0  # how long a killed sandbox may take to be gone


def data_fd(data: bytes) -> int:
    """An in-memory file holding `data`, at offset 0, for bwrap to read."""
    fd = os.memfd_create("agent-r1-sandbox")
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


class Capture:
    """The first (or, with `tail`, the last) `keep` bytes of a stream, and whether any were cut."""

    def __init__(self, keep: int, tail: bool):
        self.keep, self.tail, self.data, self.cut = keep, tail, bytearray(), False

    def add(self, chunk: bytes) -> None:
        self.data += chunk
        if len(self.data) > self.keep:
            self.cut = True
            if self.tail:
                del self.data[:len(self.data) - self.keep]
            else:
                del self.data[self.keep:]

    def text(self) -> str:
        return self.data.decode("utf-8", "replace")


def collect(proc: subprocess.Popen, deadline: float, keep: int) -> tuple[Capture, Capture, bool]:
    """Read stdout (its head) and stderr (its tail) until both close and the process exits, or
    until `deadline`; the flag says the deadline came first."""
    out, err = Capture(keep, tail=False), Capture(keep, tail=True)
    streams = {proc.stdout: out, proc.stderr: err}
    with selectors.DefaultSelector() as selector:
        for stream in streams:
            selector.register(stream, selectors.EVENT_READ)
        while selector.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                return out, err, True
            for key, _ in selector.select(left):
                chunk = os.read(key.fd, 1 << 16)
                if chunk:
                    streams[key.fileobj].add(chunk)
                else:
                    selector.unregister(key.fileobj)
    try:
        proc.wait(max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        return out, err, True
    return out, err, False


def readable(fd: int, timeout_s: float) -> bool:
    """Whether `fd` is readable (or closed) within `timeout_s`; poll works for any descriptor
    number, where select stops at 1023."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(max(0, int(timeout_s * 1000))))


def sandbox_init(info_fd: int, deadline: float) -> int | None:
    """A pidfd of the sandbox's pid 1, from what bwrap writes to --info-fd (None if bwrap wrote
    nothing, or pid 1 is already gone). When pid 1 is gone, so is every process of the sandbox."""
    data = b""
    while (left := deadline - time.monotonic()) > 0 and readable(info_fd, left):
        chunk = os.read(info_fd, 4096)
        if not chunk:
            break
        data += chunk
    try:
        return os.pidfd_open(json.loads(data)["child-pid"])
    except (ValueError, KeyError, TypeError, ProcessLookupError):
        return None


def end(proc: subprocess.Popen, init: int | None) -> None:
    """Kill what is left of the sandbox and wait until every process of it is gone."""
    try:
        if init is not None:
            try:
                signal.pidfd_send_signal(init, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.kill()
        proc.wait()
        if init is not None:
            readable(init, EXIT_GRACE_S)
    finally:
        if init is not None:
            os.close(init)
