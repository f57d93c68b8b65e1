"""The rules of an HTTP/2 connection's clocks, on the times they are given: the send timeout
(restarted whenever the peer took something), grpc-core's keepalive PINGs, and the sender's
bound on the answer bytes that wait for the peer."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from shoal.frontends.h2 import frames as h2
from shoal.frontends.h2.liveness import DEAD, PING, Keepalive, SendStall
from shoal.frontends.h2.sending import Sender
from shoal.frontends.h2.streams import Stream

pytestmark = pytest.mark.timeout(30)


def test_nothing_waiting_is_never_overdue() -> None:
    stall = SendStall(1.0)
    assert not stall.overdue(0.0, False, 0, 0)
    assert not stall.overdue(100.0, False, 0, 0)
    assert stall.since is None


def test_a_wait_with_nothing_taken_is_overdue_after_the_timeout() -> None:
    stall = SendStall(1.0)
    assert not stall.overdue(10.0, True, 500, 3)  # the wait begins
    assert not stall.overdue(10.9, True, 500, 3)
    assert stall.overdue(11.0, True, 500, 3)


def test_more_written_meanwhile_is_no_progress() -> None:
    stall = SendStall(1.0)
    stall.overdue(0.0, True, 500, 0)
    assert not stall.overdue(0.5, True, 900, 0)  # another answer joined the wait
    assert stall.overdue(1.0, True, 900, 0)


@pytest.mark.parametrize(("left", "granted"), [(400, 0), (500, 1)], ids=["read", "window"])
def test_anything_taken_restarts_the_time(left: int, granted: int) -> None:
    stall = SendStall(1.0)
    stall.overdue(0.0, True, 500, 0)
    assert not stall.overdue(0.9, True, left, granted)  # the socket took some, or window came
    assert not stall.overdue(1.5, True, left, granted)
    assert stall.overdue(2.0, True, left, granted)


def test_a_shrink_after_growth_is_progress() -> None:
    stall = SendStall(1.0)
    stall.overdue(0.0, True, 500, 0)
    stall.overdue(0.5, True, 900, 0)
    assert not stall.overdue(1.0, True, 800, 0)
    assert stall.since == 1.0


def test_the_next_look_sees_a_wait_begin_and_end() -> None:
    stall = SendStall(2.0)
    assert stall.due(5.0) == 6.0  # nothing waits: look again within half the timeout
    stall.overdue(5.0, True, 1, 0)
    assert stall.due(5.5) == 7.0


def test_keepalive_pings_a_quiet_peer_and_gives_it_the_timeout() -> None:
    keepalive = Keepalive(interval=10.0, timeout=2.0, max_without_data=0)
    assert keepalive.look(now=5.0, last_read=0.0, sent=0) == 0
    assert keepalive.due(5.0, 0.0) == 10.0
    assert keepalive.look(now=10.0, last_read=0.0, sent=0) == PING
    assert keepalive.due(10.0, 0.0) == 12.0
    assert keepalive.look(now=11.0, last_read=0.0, sent=0) == 0
    assert keepalive.look(now=12.0, last_read=0.0, sent=0) == DEAD


def test_any_byte_after_the_ping_answers_it() -> None:
    keepalive = Keepalive(interval=10.0, timeout=2.0, max_without_data=0)
    keepalive.look(now=10.0, last_read=0.0, sent=0)
    assert keepalive.look(now=12.0, last_read=11.0, sent=0) == 0
    assert keepalive.ping_sent is None
    assert keepalive.due(12.0, 11.0) == 21.0


def test_pings_without_data_stop_at_the_limit_until_data_is_sent() -> None:
    keepalive = Keepalive(interval=1.0, timeout=1.0, max_without_data=2)
    now = 0.0
    for _ in range(2):
        now += 1.0
        assert keepalive.look(now, last_read=now - 1.0, sent=7) == PING
        assert keepalive.look(now + 0.5, last_read=now + 0.5, sent=7) == 0  # acknowledged
        now += 0.5
    assert keepalive.look(now + 1.0, last_read=now, sent=7) == 0  # spent: no third PING
    assert keepalive.due(now + 1.0, now) == now + 2.0  # (no busy loop)
    assert keepalive.look(now + 1.0, last_read=now, sent=8) == PING  # data went out


def test_no_ping_while_no_call_is_open_unless_permitted() -> None:
    """grpc-core's rule (Triton's ``--grpc-keepalive-permit-without-calls``, false by default)."""
    keepalive = Keepalive(interval=10.0, timeout=2.0, max_without_data=0)
    assert keepalive.look(now=10.0, last_read=0.0, sent=0, calls_open=False) == 0
    assert keepalive.look(now=10.0, last_read=0.0, sent=0, calls_open=True) == PING
    # A PING sent while a call was open is still waited for once the call ended.
    assert keepalive.look(now=12.0, last_read=0.0, sent=0, calls_open=False) == DEAD
    permitted = Keepalive(interval=10.0, timeout=2.0, max_without_data=0, without_calls=True)
    assert permitted.look(now=10.0, last_read=0.0, sent=0, calls_open=False) == PING


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


class _Transport:
    buffered = 0

    def writelines(self, pieces: list[bytes | memoryview]) -> None:
        pass

    def is_closing(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return self.buffered


def test_answers_waiting_are_bounded_unless_nothing_waits(loop: asyncio.AbstractEventLoop) -> None:
    streams = {1: Stream(None, 0), 3: Stream(None, 0)}
    sender = Sender(loop, streams, lambda stream_id, stream: None)
    transport = _Transport()
    sender.transport = transport  # type: ignore[assignment]
    assert sender.refusal(10_000, 1000) == ""  # nothing waits: one answer always goes
    sender.send_data(1, streams[1], memoryview(bytes(600)), False)  # window 0: it waits
    transport.buffered = 300
    assert sender.waiting_bytes() == 900
    assert sender.refusal(100, 1000) == ""
    refusal = sender.refusal(101, 1000)
    assert "900 bytes" in refusal and "1000" in refusal
    assert "--grpc-max-connection-send-buffer-size" in refusal
    sender.apply_setting(h2.SETTINGS_INITIAL_WINDOW_SIZE, 1 << 20)
    sender.window = 1 << 20
    sender.resume_blocked()
    assert sender.waiting_bytes() == 300  # sent on: only the socket's buffer is left


def test_a_read_in_the_same_millisecond_as_the_ping_answers_it() -> None:
    """uvloop's clock counts milliseconds: an ACK read in the PING's millisecond is a read."""
    keepalive = Keepalive(interval=0.5, timeout=1.0, max_without_data=0)
    assert keepalive.look(now=962.046, last_read=961.54, sent=0) == PING
    assert keepalive.look(now=963.046, last_read=962.046, sent=0) == PING  # not DEAD
