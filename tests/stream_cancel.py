"""Cancelling a ``tritonclient.grpc`` stream without leaving its request thread behind."""

from __future__ import annotations

from typing import Any


def stop_stream_cancelling(client: Any) -> None:
    """``client.stop_stream(cancel_requests=True)``, then end the thread that fed the stream.

    tritonclient 2.x cancels the call but never tells the thread that reads its request queue to
    stop: the thread waits on that queue for ever, holding the call (and gRPC's file descriptors)
    in the test process, where later tests that count descriptors see gRPC's background work.
    """
    stream = client._stream
    client.stop_stream(cancel_requests=True)
    if stream is not None:
        stream._request_queue.put(None)  # what tritonclient's own close() sends when not cancelling
