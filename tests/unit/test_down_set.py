"""The stub's set of down rings: the core's and the workers' direct ones, one doorbell."""

from __future__ import annotations

import threading

import pytest

from shoal.ipc.down_set import CORE, DownSet
from shoal.ipc.queue import Channel

pytestmark = pytest.mark.timeout(30)


def _pair(core: Channel | None = None) -> tuple[Channel, Channel]:
    """A channel's supervisor end and stub end (the stub end from copies of the fds)."""
    import os

    made = Channel.create(1 << 16, down_bell=None if core is None else core.down_bell)
    stub = Channel.attach([os.dup(fd) for fd in made.child_fds()])
    return made, stub


def test_reads_every_ring_core_first_then_workers_in_turn() -> None:
    core, core_stub = _pair()
    w1, w1_stub = _pair(core)
    w2, w2_stub = _pair(core)
    downs = DownSet(core_stub)
    downs.add(1, w1_stub)
    downs.add(2, w2_stub)
    try:
        for n in range(2):
            assert w1.send_down_nowait(b"w1-%d" % n)
            assert w2.send_down_nowait(b"w2-%d" % n)
        assert core.send_down_nowait(b"core")
        got = [downs.recv(timeout=5) for _ in range(5)]
        assert got[0] == (CORE, b"core")
        assert sorted(got[1:]) == [(1, b"w1-0"), (1, b"w1-1"), (2, b"w2-0"), (2, b"w2-1")]
        assert [origin for origin, _ in got[1:]] in ([1, 2, 1, 2], [2, 1, 2, 1])
        assert downs.recv_nowait() is None and downs.is_empty()
    finally:
        downs.close_direct()
        for channel in (core, core_stub, w1, w2):
            channel.close()


def test_a_sleeping_stub_wakes_for_a_worker_ring() -> None:
    core, core_stub = _pair()
    w1, w1_stub = _pair(core)
    downs = DownSet(core_stub, spin_us=0)
    downs.add(7, w1_stub)
    got: list[tuple[int, bytes]] = []
    reader = threading.Thread(target=lambda: got.extend(downs.recv(timeout=10) for _ in range(3)))
    try:
        reader.start()
        for n in range(3):  # each one after the reader has gone to sleep again, most likely
            threading.Event().wait(0.05)
            assert w1.send_down_nowait(b"%d" % n)
        reader.join(10)
        assert got == [(7, b"0"), (7, b"1"), (7, b"2")]
    finally:
        downs.close_direct()
        for channel in (core, core_stub, w1):
            channel.close()


def test_a_removed_ring_is_not_read_and_the_timeout_holds() -> None:
    core, core_stub = _pair()
    w1, w1_stub = _pair(core)
    downs = DownSet(core_stub, spin_us=0)
    downs.add(3, w1_stub)
    try:
        removed = downs.remove(3)
        assert removed is w1_stub and downs.channel(3) is None
        assert w1.send_down_nowait(b"late")
        with pytest.raises(TimeoutError):
            downs.recv(timeout=0.05)
        removed.close()
    finally:
        for channel in (core, core_stub, w1):
            channel.close()
