"""What a frontend worker process does before it serves: tie its life to the core's, and read
the settings the core sends first."""

from __future__ import annotations

import ctypes
import os
import signal
import socket

from shoal.frontends.workers.client import recv_frame

_PR_SET_PDEATHSIG = 1


def follow_parent(parent: int) -> None:
    """Die with the core: the kernel's parent-death signal, checked once against the race of a
    core that died before it was set."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: the closed sockets still stop the worker
    if parent > 0 and os.getppid() != parent:
        os._exit(1)
    # A terminal's ^C is the core's to handle; it stops the workers.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def read_hello(control: socket.socket) -> bytes:
    """The core's first message on the control socket: the worker's settings."""
    (kind, blob), _ = recv_frame(control)
    if kind != "hello":
        raise RuntimeError(f"unexpected first message from the core: {kind!r}")
    return bytes(blob)
