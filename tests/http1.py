"""Raw HTTP/1.1 on a socket, for tests that control the bytes and the connection themselves."""

from __future__ import annotations

import socket


def read_head_and_body(sock: socket.socket) -> tuple[bytes, bytes]:
    """One HTTP/1.1 response with a Content-Length from ``sock``: its head and its body."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed before the answer: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    received = bytearray(body)  # grown in place: bytes would be copied whole at each chunk
    while len(received) < length:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed mid-body: {len(received)} of {length} bytes"
        received += chunk
    return head, bytes(received)


def read_response(sock: socket.socket) -> tuple[int, bytes]:
    """One HTTP/1.1 response with a Content-Length from ``sock``: its status and body."""
    head, body = read_head_and_body(sock)
    return int(head.split()[1]), body
