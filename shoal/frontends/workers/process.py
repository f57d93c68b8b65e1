"""What a frontend worker process does before it serves: tie its life to the core's, and read
the settings the core sends first.

The listening sockets are shared with the core and every other worker: a worker killed with the
core would hold them open (accepting connections into the backlog that nobody answers) until the
kernel has torn its memory down. So the core's death reaches a worker as a signal it handles,
and, as soon as the link drops, the worker stops the listening sockets for every holder
(``shutdown``: new connections are refused at once), then answers what it holds (503: the core is
gone, and the connection closes after it) and exits.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
from collections.abc import Sequence
from types import FrameType

from shoal.frontends.workers.client import recv_frame

__all__ = ["follow_parent", "read_hello", "stop_accepting"]

_PR_SET_PDEATHSIG = 1
#: The parent-death signal: handled (not SIGKILL), so that the worker stops the shared
#: listening sockets before it goes; a signal of its own, since the kernel may send it while the
#: core is still this process's parent (its first dying thread, when another one is left to
#: adopt the worker for a moment), so the signal itself must say that the core is dying.
_DEATH_SIGNAL = signal.SIGUSR2

#: The worker's own references to the listening sockets (the servers may close theirs).
_listening: list[socket.socket] = []


def stop_accepting() -> None:
    """Stop the shared listening sockets, for every process that holds them: the core is gone
    and nobody would answer what they accept."""
    for sock in _listening:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


#: Seconds a worker whose core died has to answer what it holds before the kernel ends it.
_DEATH_EXIT_SECS = 2


def _on_death_signal(signum: int, frame: FrameType | None) -> None:
    stop_accepting()
    # Not an exit here: the link's sockets close with the core, and the worker then answers the
    # requests it holds, and any that come on its open connections, with 503 before it exits (a
    # load balancer retries those on another replica; a dropped connection it would not). The
    # alarm's default action ends the worker if that takes longer.
    signal.alarm(_DEATH_EXIT_SECS)


def follow_parent(parent: int, listening: Sequence[int] = ()) -> None:
    """Die with the core: the kernel's parent-death signal, checked once against the race of a
    core that died before it was set. ``listening``: the inherited listening sockets."""
    _listening[:] = [socket.socket(fileno=os.dup(fd)) for fd in listening if fd >= 0]
    signal.signal(_DEATH_SIGNAL, _on_death_signal)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, _DEATH_SIGNAL, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: the closed sockets still stop the worker
    if parent > 0 and os.getppid() != parent:
        stop_accepting()
        os._exit(1)
    # A terminal's ^C is the core's to handle; it stops the workers.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def read_hello(control: socket.socket) -> bytes:
    """The core's first message on the control socket: the worker's settings."""
    (kind, blob), _ = recv_frame(control)
    if kind != "hello":
        raise RuntimeError(f"unexpected first message from the core: {kind!r}")
    return bytes(blob)
