"""The worker's link to the core: a frame the worker answers before ``connect`` has resumed
(uvloop may hand the core's first frames over first) goes out, not a CoreGone."""

from __future__ import annotations

import asyncio
import socket

import pytest

from shoal.frontends.workers import _wire as wire
from shoal.frontends.workers.client import CoreGone, RemoteCore, recv_frame

pytestmark = pytest.mark.timeout(30)


def test_a_frame_sent_before_the_outbox_was_made_goes_out() -> None:
    control, _control_peer = socket.socketpair()
    calls, core_end = socket.socketpair()
    core = RemoteCore(control)

    async def run() -> None:
        with pytest.raises(CoreGone):
            core.send([wire.LOG_APPLIED, 1])  # no link at all yet
        await core.connect(calls)
        core._outbox = None  # as it is between the reader's connection_made and connect's end
        core.send([wire.LOG_APPLIED, 7])
        await asyncio.sleep(0)

    try:
        asyncio.run(run())
        core_end.settimeout(5)
        header, _ = recv_frame(core_end)
        assert list(header[:2]) == [wire.LOG_APPLIED, 7]
    finally:
        for sock in (control, _control_peer, calls, core_end):
            sock.close()
