"""What a frontend worker process does before it serves: tie its life to the core's, and read
the settings the core sends first.

A worker holds no listening socket (the core accepts and deals it connections:
``dealing.py``), so a dead core's ports refuse new connections at once. The core's death
reaches a worker as a signal it handles, and as its link and dealing sockets closing: it then
answers what it holds, and what comes on its open connections, with 503 (the core is gone, and
the connection closes after it) and exits.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
from types import FrameType

from shoal.frontends.workers.control_socket import recv_frame

__all__ = ["follow_parent", "read_hello"]

_PR_SET_PDEATHSIG = 1
#: The parent-death signal: handled (not SIGKILL), so that the worker answers what it holds
#: before it goes; a signal of its own, since the kernel may send it while the core is still
#: this process's parent (its first dying thread, when another one is left to adopt the worker
#: for a moment), so the signal itself must say that the core is dying.
_DEATH_SIGNAL = signal.SIGUSR2

#: Seconds a worker whose core died has to answer what it holds before the kernel ends it.
_DEATH_EXIT_SECS = 2


def _on_death_signal(signum: int, frame: FrameType | None) -> None:
    # Not an exit here: the link's sockets close with the core, and the worker then answers the
    # requests it holds, and any that come on its open connections, with 503 before it exits (a
    # load balancer retries those on another replica; a dropped connection it would not). The
    # alarm's default action ends the worker if that takes longer.
    signal.alarm(_DEATH_EXIT_SECS)


def follow_parent(parent: int) -> None:
    """Die with the core: the kernel's parent-death signal, checked once against the race of a
    core that died before it was set."""
    signal.signal(_DEATH_SIGNAL, _on_death_signal)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, _DEATH_SIGNAL, 0, 0, 0)
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
