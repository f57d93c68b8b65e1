"""BodyBuffer (a large body's memory) and LentBody (a response sent from shared memory)."""

from __future__ import annotations

import pytest

from shoal.frontends.http._body_reader import BodyBuffer, MapPool
from shoal.frontends.http._response import LentBody, body_length

pytestmark = pytest.mark.timeout(30)


def test_a_body_buffer_fills_in_order_and_gives_the_whole_body_read_only() -> None:
    buffer = BodyBuffer(10)
    buffer.add(b"abc")
    assert not buffer.complete
    space = buffer.space()
    assert len(space) == 7
    space[:4] = b"defg"  # what a read into get_buffer's view does
    buffer.filled += 4
    buffer.add(b"hij")
    assert buffer.complete
    body = buffer.body()
    assert bytes(body) == b"abcdefghij"
    assert body.readonly


def test_a_body_buffer_takes_no_memory_for_what_did_not_arrive() -> None:
    # 64 MiB announced: an anonymous map, no page of which is touched until written.
    buffer = BodyBuffer(64 << 20)
    buffer.add(b"x" * 100)
    assert bytes(buffer.space()[:4]) == b"\0\0\0\0"
    assert buffer.filled == 100


def test_a_lent_body_joined_is_released() -> None:
    released: list[bool] = []
    lent = LentBody((b"head", memoryview(b"tensor")), lambda: released.append(True))
    assert body_length(lent) == 10
    assert lent.joined() == b"headtensor"
    assert released == [True]


def test_a_map_is_reused_only_once_nothing_views_it() -> None:
    pool = MapPool()
    first = pool.take(1 << 20)
    body = memoryview(first)[:100].toreadonly()
    pool.give_back(first)  # a view is left: not kept
    assert pool.take(1 << 20) is not first
    del body
    pool.give_back(first)
    assert pool.take(1000) is first  # the smallest kept map that fits
    assert pool.take(1000) is not first


def test_a_body_buffer_lets_go_of_its_map_with_the_body() -> None:
    buffer = BodyBuffer(1 << 19)
    buffer.add(b"y" * (1 << 19))
    body = buffer.body()
    with pytest.raises(BufferError):
        buffer.map.resize(len(buffer.map))
    del body
    buffer.map.resize(len(buffer.map))  # no view left
