"""Passing file descriptors (memfd segments) with a small payload over a Unix socket.

Each message is framed as a 4-byte little-endian length followed by the payload, with the fds
attached to the first byte, so the same code works over SOCK_STREAM (which keeps no message
boundaries) and SOCK_SEQPACKET sockets.
"""

from __future__ import annotations

import array
import os
import select
import socket

from shoal.ipc._errors import PeerGone

__all__ = ["MAX_PAYLOAD", "PeerGone", "readable_now", "recv_fds", "send_fds"]

MAX_PAYLOAD = 64 << 10
_HEADER = 4


def send_fds(sock: socket.socket, payload: bytes, fds: list[int]) -> None:
    """Send ``payload`` (at most 64 KiB) with duplicates of ``fds``; the caller keeps its fds."""
    if len(payload) > MAX_PAYLOAD:
        raise ValueError(f"fd-passing payload is {len(payload)} bytes, the limit is {MAX_PAYLOAD}")
    frame = len(payload).to_bytes(_HEADER, "little") + payload
    ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
    try:
        sent = sock.sendmsg([frame], ancillary)
        if sent < len(frame):
            sock.sendall(frame[sent:])
    except (BrokenPipeError, ConnectionResetError) as exc:
        raise PeerGone(f"peer closed the socket while sending fds: {exc}") from exc


def readable_now(sock: socket.socket) -> bool:
    """Whether ``sock`` has something to read (or its peer closed it), without waiting.

    ``poll``, not ``select``: ``select`` refuses a descriptor numbered 1024 or more, which a
    process past 1024 open files (a server holding many connections, under a raised
    ``RLIMIT_NOFILE``) gives its newest sockets."""
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(0))


def recv_fds(sock: socket.socket, max_fds: int = 16) -> tuple[bytes, list[int]]:
    """Receive one message and the fds that came with it (the caller owns them).

    Raises PeerGone (a ConnectionError) when the peer has closed the socket.
    """
    stream = sock.type == socket.SOCK_STREAM
    want = _HEADER if stream else _HEADER + MAX_PAYLOAD
    space = socket.CMSG_SPACE(max_fds * array.array("i").itemsize)
    try:
        data, ancillary, flags, _ = sock.recvmsg(want, space)
    except ConnectionResetError as exc:
        raise PeerGone(f"peer reset the socket: {exc}") from exc
    fds = _collect_fds(ancillary)
    try:
        if flags & socket.MSG_CTRUNC:
            raise ValueError(f"more than {max_fds} fds arrived in one message")
        if not data:
            raise PeerGone("peer closed the socket")
        return _complete(sock, data, stream), fds
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise


def _collect_fds(ancillary: list[tuple[int, int, bytes]]) -> list[int]:
    fds = array.array("i")
    for level, kind, blob in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            usable = len(blob) - len(blob) % fds.itemsize
            fds.frombytes(blob[:usable])
    return list(fds)


def _complete(sock: socket.socket, data: bytes, stream: bool) -> bytes:
    """The payload of a frame whose first bytes are ``data`` (reading the rest from a stream)."""
    if stream:
        data += _recv_exactly(sock, _HEADER - len(data))
    length = int.from_bytes(data[:_HEADER], "little")
    if length > MAX_PAYLOAD:
        raise ValueError(f"fd-passing frame announces {length} bytes, the limit is {MAX_PAYLOAD}")
    if not stream:
        if len(data) != _HEADER + length:
            raise ValueError(f"fd-passing frame holds {len(data) - _HEADER} of {length} bytes")
        return data[_HEADER:]
    return _recv_exactly(sock, length)


def _recv_exactly(sock: socket.socket, nbytes: int) -> bytes:
    chunks: list[bytes] = []
    while nbytes > 0:
        chunk = sock.recv(nbytes)
        if not chunk:
            raise PeerGone("peer closed the socket in the middle of a message")
        chunks.append(chunk)
        nbytes -= len(chunk)
    return b"".join(chunks)
