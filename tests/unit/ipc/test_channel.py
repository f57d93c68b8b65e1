"""Channel behaviour within one process (both ends here, the stub end on a thread if needed)."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.ipc.queue import Channel, PeerGone

RING = 4096


@pytest.fixture
def pair() -> Iterator[tuple[Channel, Channel]]:
    supervisor = Channel.create(RING)
    stub = Channel.attach([os.dup(fd) for fd in supervisor.child_fds()])
    yield supervisor, stub
    stub.close()
    supervisor.close()


def payload(index: int, size: int) -> bytes:
    return index.to_bytes(4, "little") + bytes([index % 256]) * max(size - 4, 0)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, RING - 8), min_size=1, max_size=200))
def test_messages_of_any_size_wrap_around_in_order(sizes: list[int]) -> None:
    supervisor = Channel.create(RING)
    stub = Channel.attach([os.dup(fd) for fd in supervisor.child_fds()])
    try:
        for index, size in enumerate(sizes):
            message = payload(index, size)[:size]
            assert supervisor.send_down_nowait(message)
            assert stub.recv_down(timeout=5) == message
            stub.send_up(message)
            assert supervisor.recv_up_nowait() == message
            assert supervisor.recv_up_nowait() is None
    finally:
        stub.close()
        supervisor.close()


def test_full_ring_and_oversized_messages(pair: tuple[Channel, Channel]) -> None:
    supervisor, stub = pair
    sent = 0
    while supervisor.send_down_nowait(payload(sent, 100)):
        sent += 1
    assert sent == RING // 112  # 8-byte length word + 100 bytes padded to 104
    assert [stub.recv_down_nowait() for _ in range(sent)] == [payload(i, 100) for i in range(sent)]
    assert stub.recv_down_nowait() is None
    with pytest.raises(ValueError, match=f"{RING - 7} bytes exceeds the ring capacity \\({RING}"):
        supervisor.send_down_nowait(bytes(RING - 7))
    assert supervisor.send_down_nowait(bytes(RING - 8))  # the largest message fits exactly


def test_recv_down_times_out(pair: tuple[Channel, Channel]) -> None:
    _, stub = pair
    with pytest.raises(TimeoutError):
        stub.recv_down(timeout=0.01)


def test_close_drains_then_peer_gone(pair: tuple[Channel, Channel]) -> None:
    supervisor, stub = pair
    supervisor.send_down_nowait(b"last words")
    supervisor.close()
    assert stub.peer_closed
    assert stub.recv_down(timeout=5) == b"last words"
    with pytest.raises(PeerGone):
        stub.recv_down(timeout=5)
    with pytest.raises(PeerGone):
        stub.send_up(b"too late")


def test_watch_up_delivers_thread_sends_with_back_pressure(pair: tuple[Channel, Channel]) -> None:
    supervisor, stub = pair
    count = 3000  # about 80 ring-fulls of 100-byte messages from two threads

    def produce(offset: int) -> None:
        for index in range(offset, count, 2):
            stub.send_up(payload(index, 100), timeout=30)

    async def consume() -> list[bytes]:
        loop = asyncio.get_running_loop()
        received: list[bytes] = []
        done = loop.create_future()

        def on_ready() -> None:
            while (message := supervisor.recv_up_nowait()) is not None:
                received.append(message)
            if len(received) == count and not done.done():
                done.set_result(None)

        supervisor.watch_up(loop, on_ready)
        threads = [threading.Thread(target=produce, args=(i,)) for i in range(2)]
        for thread in threads:
            thread.start()
        await asyncio.wait_for(done, 30)
        for thread in threads:
            thread.join()
        return received

    received = asyncio.run(consume())
    assert sorted(received) == sorted(payload(i, 100) for i in range(count))
    for parity in range(2):  # each producer thread's messages stay in order
        mine = [m for m in received if int.from_bytes(m[:4], "little") % 2 == parity]
        assert mine == [payload(i, 100) for i in range(parity, count, 2)]


def test_watch_up_gives_the_loop_back_between_shares(pair: tuple[Channel, Channel]) -> None:
    """A reader that returns False after its share is called again on the loop's next turn
    (no doorbell rings for what it left), and what the loop had queued runs in between: a
    stub sending faster than the core reads cannot keep the core's loop to itself."""
    supervisor, stub = pair
    count, share = 100, 10  # 100 messages of 24 bytes (and their length words) fit the ring
    for index in range(count):
        stub.send_up(payload(index, 24), timeout=5)

    async def consume() -> tuple[list[bytes], int]:
        loop = asyncio.get_running_loop()
        received: list[bytes] = []
        done = loop.create_future()
        other = [-1]  # how many had been read when another callback of the loop ran

        def on_ready() -> bool:
            for _ in range(share):
                message = supervisor.recv_up_nowait()
                if message is None:
                    if not done.done():
                        done.set_result(None)
                    return True
                received.append(message)
            if len(received) == share:
                loop.call_soon(lambda: other.__setitem__(0, len(received)))
            return False

        supervisor.watch_up(loop, on_ready)
        await asyncio.wait_for(done, 30)
        return received, other[0]

    received, read_before_other = asyncio.run(consume())
    assert received == [payload(i, 24) for i in range(count)]
    assert read_before_other < count  # it ran before the reader had read everything


def test_send_down_waits_for_a_slow_consumer(pair: tuple[Channel, Channel]) -> None:
    supervisor, stub = pair
    count = 2000
    received: list[bytes] = []

    def consume() -> None:
        for _ in range(count):
            received.append(stub.recv_down(timeout=30))

    async def produce() -> bool:
        saw_full = False
        for index in range(count):
            message = payload(index, 200)
            if not supervisor.send_down_nowait(message):
                saw_full = True
                await supervisor.send_down(message)
        return saw_full

    thread = threading.Thread(target=consume)
    thread.start()
    saw_full = asyncio.run(produce())
    thread.join()
    assert saw_full
    assert received == [payload(i, 200) for i in range(count)]


def test_mark_peer_dead_wakes_a_blocked_send(pair: tuple[Channel, Channel]) -> None:
    supervisor, _ = pair

    async def scenario() -> None:
        while supervisor.send_down_nowait(bytes(500)):
            pass
        pending = asyncio.ensure_future(supervisor.send_down(bytes(500)))
        await asyncio.sleep(0)  # let it start waiting
        assert not pending.done()
        supervisor.mark_peer_dead()
        with pytest.raises(PeerGone):
            await asyncio.wait_for(pending, 5)
        with pytest.raises(PeerGone):
            supervisor.send_down_nowait(b"x")

    asyncio.run(scenario())


def test_recv_down_async(pair: tuple[Channel, Channel]) -> None:
    supervisor, stub = pair

    async def scenario() -> list[bytes]:
        loop = asyncio.get_running_loop()
        loop.call_later(0.01, supervisor.send_down_nowait, b"later")
        first = await asyncio.wait_for(stub.recv_down_async(), 5)
        supervisor.send_down_nowait(b"now")
        second = await asyncio.wait_for(stub.recv_down_async(), 5)
        return [first, second]

    assert asyncio.run(scenario()) == [b"later", b"now"]


def test_attach_validates_its_fds() -> None:
    with pytest.raises(ValueError, match="5 fds"):
        Channel.attach([1, 2])
    with pytest.raises(ValueError, match="power of two"):
        Channel.create(5000)


def test_watch_up_recovers_when_the_callback_fails(pair: tuple[Channel, Channel]) -> None:
    supervisor, stub = pair

    async def scenario() -> list[bytes]:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda loop, context: None)
        received: list[bytes] = []
        done = loop.create_future()
        calls = 0

        def on_ready() -> None:
            nonlocal calls
            calls += 1
            if calls == 2:  # the delivery of "hello" fails before draining anything
                raise RuntimeError("dispatch failed")
            while (message := supervisor.recv_up_nowait()) is not None:
                received.append(message)
            if received and not done.done():
                done.set_result(None)

        supervisor.watch_up(loop, on_ready)
        await asyncio.sleep(0)  # the first, empty delivery from watch_up itself
        stub.send_up(b"hello")
        await asyncio.wait_for(done, 5)
        return received

    assert asyncio.run(scenario()) == [b"hello"]


def _rang(bell: int) -> bool:
    """Whether the doorbell rang since it was last read (and reset it)."""
    try:
        return os.eventfd_read(bell) > 0
    except BlockingIOError:
        return False


def test_a_quiet_send_leaves_a_sleeping_stub_asleep_until_wake_down() -> None:
    supervisor = Channel.create(RING)
    fds = supervisor.child_fds()
    stub = Channel.attach([os.dup(fd) for fd in fds])
    down_bell = fds[1]
    try:
        _rang(down_bell)  # whatever attach left
        stub._down.begin_sleep()  # the stub found its ring empty and is about to sleep
        assert supervisor.send_down_nowait(b"release", ring=False)
        assert not _rang(down_bell)
        supervisor.wake_down()
        assert _rang(down_bell)
        supervisor.wake_down()  # one ring per sleep episode
        assert not _rang(down_bell)
        assert stub.recv_down_nowait() == b"release"
    finally:
        stub.close()
        supervisor.close()


def test_wake_down_does_not_ring_an_awake_stub(pair: tuple[Channel, Channel]) -> None:
    supervisor, stub = pair
    down_bell = supervisor.child_fds()[1]
    _rang(down_bell)
    assert supervisor.send_down_nowait(b"first", ring=False)
    supervisor.wake_down()  # the stub is not sleeping: it will find the message itself
    assert not _rang(down_bell)
    assert stub.recv_down(timeout=5) == b"first"
