"""The clocks of an HTTP/2 server connection (docs/hardening.md, "gRPC connections"): a peer that
stops mid-request (the read timeout), one that stops taking what it is sent (the send timeout),
one that no longer answers (keepalive PINGs), and the connection's maximum age.

:class:`SendStall` and :class:`Keepalive` are the rules, on the times they are given;
:class:`Liveness` is the connection's one timer that applies them all.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Final, Protocol

from shoal.frontends.h2 import frames as h2
from shoal.frontends.h2.floods import FloodLimits
from shoal.frontends.h2.sending import Sender

log = logging.getLogger(__name__)

#: The payload of the server's keepalive PINGs.
KEEPALIVE_PAYLOAD: Final = b"shoal-ka"
#: What :meth:`Keepalive.look` asks for.
PING: Final = 1
DEAD: Final = 2
#: The least time between two looks of the timer (no busy loop on a past due time).
_MIN_WAIT: Final = 0.01


class Watched(Protocol):
    """What the clocks read of a connection, and do to it (an Http2Connection)."""

    last_read: float  # the loop's time of the last bytes read

    def half_sent(self) -> bool: ...

    def go_away(self) -> None: ...

    def cut(self, code: int, reason: str) -> None: ...


class SendStall:
    """The send timeout's rule, HTTP's (``--http-send-timeout-secs``): what waits for the peer
    has waited ``timeout`` seconds with nothing taken. Time restarts whenever the peer took
    something since the last look: it gave window (``granted``: the WINDOW_UPDATEs counted) or
    the transport's buffer shrank (``left``: its size)."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.since: float | None = None  # when the current wait began (None: nothing waits)
        self._left = 0
        self._granted = 0

    def overdue(self, now: float, waiting: bool, left: int, granted: int) -> bool:
        if not waiting:
            self.since = None
            return False
        if self.since is None or granted != self._granted or left < self._left:
            self.since, self._left, self._granted = now, left, granted
            return False
        self._left = left  # more was written since: a shrink from here is progress
        return now - self.since >= self.timeout

    def due(self, now: float) -> float:
        """When to look next: the wait's end, or soon enough to see a wait begin."""
        if self.since is None:
            return now + self.timeout / 2
        return self.since + self.timeout


class Keepalive:
    """grpc-core's keepalive on the server's side (Triton's ``--grpc-keepalive-*`` flags): a
    PING once nothing was read for ``interval`` seconds, the connection dead if nothing (its
    ACK, or any byte, as grpc-core counts) is read within ``timeout`` after it. At most
    ``max_without_data`` PINGs (0: any number) while the server sends no HEADERS or DATA
    (``sent``: the sender's count of those); then none until it does. As grpc-core, no PING
    while no call is open unless ``without_calls`` (``--grpc-keepalive-permit-without-calls``)."""

    def __init__(
        self, interval: float, timeout: float, max_without_data: int, without_calls: bool = False
    ) -> None:
        self.interval, self.timeout, self.max_without_data = interval, timeout, max_without_data
        self.without_calls = without_calls
        self.ping_sent: float | None = None  # the outstanding PING's time
        self._pings = 0  # PINGs sent since ``sent`` was last seen to change
        self._sent = -1

    def look(self, now: float, last_read: float, sent: int, calls_open: bool = True) -> int:
        """PING: send one now; DEAD: close the connection; 0: nothing to do."""
        if self.ping_sent is not None:
            # Answered: read since (the same time too: uvloop's clock counts milliseconds,
            # and nothing read can be as late as the PING when it was sent, see below).
            if last_read >= self.ping_sent:
                self.ping_sent = None
            elif now - self.ping_sent >= self.timeout:
                return DEAD
            else:
                return 0
        if now - last_read < self.interval or not (calls_open or self.without_calls):
            return 0
        if sent != self._sent:
            self._sent, self._pings = sent, 0
        if self.max_without_data and self._pings >= self.max_without_data:
            return 0
        self._pings += 1
        self.ping_sent = now
        return PING

    def due(self, now: float, last_read: float) -> float:
        if self.ping_sent is not None:
            return self.ping_sent + self.timeout
        due = last_read + self.interval
        return due if due > now else now + self.interval  # (PINGs spent: see look)


class Liveness:
    """The connection's timer: it looks at the connection when the next rule is due, and ends
    it (or PINGs, or sends GOAWAY at its maximum age) as the rules say."""

    _timer: asyncio.TimerHandle | None = None
    _aged = False  # GOAWAY sent at the maximum age

    def __init__(self, connection: Watched, sender: Sender, limits: FloodLimits) -> None:
        self._connection, self._sender = connection, sender
        self._limits = limits
        self._loop = asyncio.get_running_loop()
        self._born = self._loop.time()
        self._stall = SendStall(limits.send_timeout)
        self._keepalive = Keepalive(
            limits.keepalive_time,
            limits.keepalive_timeout,
            limits.max_pings_without_data,
            limits.permit_pings_without_calls,
        )

    def start(self) -> None:
        self._timer = self._loop.call_later(self._next(self._loop.time()), self._look)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _look(self) -> None:
        self._timer = None
        connection, transport = self._connection, self._sender.transport
        if transport is None:
            return
        now = self._loop.time()
        if transport.is_closing():
            # A graceful close (the client's GOAWAY, the maximum age, an error) waits for the
            # buffer to empty: a client that takes nothing would keep the connection and its
            # answers' output blocks for ever, so the send timeout and the grace still apply.
            if not transport.get_write_buffer_size():
                return
            reason = self._stalled(now) or self._past_grace(now)
        else:
            reason = self._ended(now)
        if reason:
            log.info("gRPC connection ended: %s", reason)
            connection.cut(h2.ENHANCE_YOUR_CALM, reason)
            return
        self._timer = self._loop.call_later(self._next(now), self._look)

    def _ended(self, now: float) -> str:
        """Why the connection ends now; "" if it goes on (a PING or GOAWAY may have been sent)."""
        connection, limits = self._connection, self._limits
        last_read = connection.last_read
        if now - last_read >= limits.read_timeout and connection.half_sent():
            return f"nothing read for {limits.read_timeout:g} s mid-request"
        stalled = self._stalled(now)
        if stalled:
            return stalled
        sender = self._sender
        action = self._keepalive.look(now, last_read, sender.sent, sender.calls_open())
        if action == DEAD:
            return (
                f"no answer to a keepalive PING within {limits.keepalive_timeout:g} s "
                "(--grpc-keepalive-timeout)"
            )
        if action == PING:
            sender.write(h2.frame(h2.PING, 0, 0, KEEPALIVE_PAYLOAD))
        if limits.max_age and now - self._born >= limits.max_age and not self._aged:
            self._aged = True
            connection.go_away()
        return self._past_grace(now)

    def _stalled(self, now: float) -> str:
        sender = self._sender
        left = sender.waiting_bytes()
        if self._stall.overdue(now, left > 0, left, sender.granted):
            return (
                f"the client took nothing of its answers for {self._limits.send_timeout:g} s "
                "(--grpc-send-timeout-secs)"
            )
        return ""

    def _past_grace(self, now: float) -> str:
        limits = self._limits
        grace = limits.max_age_grace
        if self._aged and grace and now - self._born >= limits.max_age + grace:
            return "its maximum age and grace passed (--grpc-max-connection-age-grace)"
        return ""

    def _next(self, now: float) -> float:
        """Seconds until a rule is due."""
        connection, limits = self._connection, self._limits
        last_read = connection.last_read
        due = max(last_read + limits.read_timeout, now + 1.0)
        due = min(due, self._stall.due(now), self._keepalive.due(now, last_read))
        if limits.max_age:
            age_due = self._born + limits.max_age + (limits.max_age_grace if self._aged else 0.0)
            if not self._aged or limits.max_age_grace:
                due = min(due, age_due)
        return max(due - now, _MIN_WAIT)
