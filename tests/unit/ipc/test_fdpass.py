"""fd passing over stream and seqpacket Unix sockets."""

from __future__ import annotations

import os
import resource
import socket

import pytest

from shoal.ipc.fdpass import MAX_PAYLOAD, readable_now, recv_fds, send_fds
from shoal.ipc.queue import PeerGone


@pytest.mark.parametrize("kind", [socket.SOCK_STREAM, socket.SOCK_SEQPACKET])
def test_fds_and_payloads_arrive_in_order(kind: int) -> None:
    left, right = socket.socketpair(socket.AF_UNIX, kind)
    memfds = [os.memfd_create(f"fdpass-{i}") for i in range(3)]
    try:
        for i, fd in enumerate(memfds):
            os.write(fd, f"segment {i}".encode())
        send_fds(left, b"first", memfds[:2])
        send_fds(left, b"", [])
        send_fds(left, b"x" * MAX_PAYLOAD, memfds[2:])
        payload, fds = recv_fds(right)
        assert payload == b"first" and len(fds) == 2
        for i, fd in enumerate(fds):
            assert os.pread(fd, 100, 0) == f"segment {i}".encode()
            os.close(fd)
        assert recv_fds(right) == (b"", [])
        payload, fds = recv_fds(right)
        assert payload == b"x" * MAX_PAYLOAD and len(fds) == 1
        os.close(fds[0])
    finally:
        for fd in memfds:
            os.close(fd)
        left.close()
        right.close()


def test_eof_raises_peer_gone() -> None:
    left, right = socket.socketpair()
    left.close()
    with pytest.raises(PeerGone):
        recv_fds(right)
    with pytest.raises(ConnectionError):
        send_fds(right, b"late", [])
    right.close()


def test_too_many_fds_are_closed_and_reported() -> None:
    left, right = socket.socketpair()
    fds = [os.memfd_create("many") for _ in range(4)]
    try:
        send_fds(left, b"p", fds)
        with pytest.raises(ValueError, match="more than 2 fds"):
            recv_fds(right, max_fds=2)
    finally:
        for fd in fds:
            os.close(fd)
        left.close()
        right.close()


def test_oversized_payload_is_refused() -> None:
    left, right = socket.socketpair()
    with pytest.raises(ValueError, match="limit"):
        send_fds(left, bytes(MAX_PAYLOAD + 1), [])
    left.close()
    right.close()


def test_readable_now_takes_a_descriptor_past_1024() -> None:
    """A server with many connections open gives its newest sockets numbers past 1024, where
    ``select`` refuses them (``ValueError``): reading what a stub announced must still work."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    high = 1500
    if hard != resource.RLIM_INFINITY and hard <= high:
        pytest.skip(f"RLIMIT_NOFILE's hard limit is {hard}")
    if soft != resource.RLIM_INFINITY and soft <= high:
        resource.setrlimit(resource.RLIMIT_NOFILE, (high + 1, hard))
    ours, theirs = socket.socketpair()
    try:
        os.dup2(ours.fileno(), high)
        far = socket.socket(fileno=high)
        try:
            assert not readable_now(far)
            send_fds(theirs, b"announced", [])
            assert readable_now(far)
            assert recv_fds(far) == (b"announced", [])
            assert not readable_now(far)
            theirs.close()
            assert readable_now(far)  # the peer's close is something to read: its end
        finally:
            far.close()
    finally:
        ours.close()
        theirs.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
