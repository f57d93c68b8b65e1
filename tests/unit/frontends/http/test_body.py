"""Reading infer bodies from ASGI under the size limit (the frontend's private body reader)."""

from __future__ import annotations

import asyncio
import tracemalloc
from collections.abc import Iterable
from typing import Any

import pytest

from shoal.core import InvalidArgument
from shoal.frontends.http._body import ClientDisconnected, read_body

pytestmark = pytest.mark.timeout(30)


class FakeReceive:
    """Replays ASGI body messages; counts how many were read."""

    def __init__(self, chunks: Iterable[bytes], *, disconnect: bool = False) -> None:
        parts = list(chunks)
        self.messages: list[dict[str, Any]] = [
            {"type": "http.request", "body": part, "more_body": index < len(parts) - 1}
            for index, part in enumerate(parts)
        ]
        if disconnect:
            self.messages[-1]["more_body"] = True
            self.messages.append({"type": "http.disconnect"})
        self.read = 0

    async def __call__(self) -> dict[str, Any]:
        self.read += 1
        return self.messages[self.read - 1]


def read(receive: FakeReceive, content_length: str | None, limit: int = 100, **kw: Any) -> Any:
    return asyncio.run(read_body(receive, content_length, limit, **kw))


def test_single_message_is_returned_as_is() -> None:
    receive = FakeReceive([b"abc"])
    assert read(receive, "3") == b"abc"


def test_pieces_fill_one_buffer() -> None:
    body = read(FakeReceive([b"ab", b"cd", b"e"]), "5")
    assert isinstance(body, bytearray) and body == b"abcde"


def test_chunked_body_without_content_length() -> None:
    assert read(FakeReceive([b"ab", b"", b"cd"]), None) == b"abcd"


def test_content_length_over_the_limit_is_refused_before_reading() -> None:
    receive = FakeReceive([b"x" * 200])
    with pytest.raises(InvalidArgument) as info:
        read(receive, "200", what="Request JSON")
    assert receive.read == 0
    assert info.value.message == (
        "request JSON size of 200 bytes exceeds the maximum allowed input size of 100 bytes. "
        "Use --http-max-input-size to increase the limit."
    )


def test_streaming_past_the_limit_stops_reading() -> None:
    receive = FakeReceive([b"x" * 60, b"x" * 60, b"x" * 60])
    with pytest.raises(InvalidArgument) as info:
        read(receive, None)
    assert receive.read == 2
    assert info.value.message.startswith("Request size exceeds the maximum allowed value of 100")


def test_single_message_past_the_limit() -> None:
    with pytest.raises(InvalidArgument):
        read(FakeReceive([b"x" * 101]), None)


def test_body_longer_than_announced() -> None:
    with pytest.raises(InvalidArgument) as info:
        read(FakeReceive([b"abc", b"def"]), "4")
    assert "longer than its Content-Length of 4 bytes" in info.value.message


def test_body_shorter_than_announced_is_trimmed() -> None:
    assert read(FakeReceive([b"ab", b"c"]), "5") == b"abc"


@pytest.mark.parametrize("value", ["abc", "-5"])
def test_bad_content_length(value: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        read(FakeReceive([b""]), value)
    assert info.value.message == f"Unable to parse Content-Length, got: {value}"


@pytest.mark.parametrize("content_length", ["10", None])
def test_client_disconnect(content_length: str | None) -> None:
    with pytest.raises(ClientDisconnected):
        read(FakeReceive([b"abc"], disconnect=True), content_length)


def test_memory_is_taken_as_the_body_arrives_not_from_content_length() -> None:
    # 50 MB announced, 4 bytes sent (a short body): before, the buffer of the announced size
    # was allocated when the first piece came.
    tracemalloc.start()
    try:
        body = read(FakeReceive([b"ab", b"cd"]), str(50_000_000), limit=10**9)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert body == b"abcd"
    assert peak < 1_000_000, f"{peak} bytes allocated for a 4-byte body"


def test_pieces_longer_than_content_length_are_refused() -> None:
    with pytest.raises(InvalidArgument, match="longer than its Content-Length of 3 bytes"):
        read(FakeReceive([b"ab", b"cd"]), "3")
