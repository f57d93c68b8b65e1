"""Flood accounting of one HTTP/2 connection (docs/hardening.md "HTTP/2 floods").

A peer past a :class:`FloodLimits` limit ends its connection with GOAWAY ``ENHANCE_YOUR_CALM``:
PINGs past grpc-core's ping policy (the one Triton's ``--grpc-http2-*`` flags set), more than a
bounded number of replies (PING and SETTINGS ACKs, RST_STREAM) queued for a peer that does not
read, streams reset faster than a token bucket allows, and long runs of frames that carry
nothing.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from shoal.frontends.h2 import frames as h2
from shoal.frontends.h2.errors import ConnectionError_

#: grpc-core's interval between pings on a connection without calls, unless permitted (2 hours).
_IDLE_PING_INTERVAL = 7200.0


@dataclass(frozen=True)
class FloodLimits:
    """What a peer may send before the connection ends with GOAWAY ``ENHANCE_YOUR_CALM``.

    The ping policy is grpc-core's (Triton's flags and defaults): a PING sooner than
    ``min_ping_interval`` seconds after the previous one is a strike, unless the server sent
    HEADERS or DATA in between; more than ``max_ping_strikes`` strikes (0: any number) end the
    connection. Without calls in progress the interval is 2 hours unless
    ``permit_pings_without_calls``. The rest are nghttp2's defaults: ``max_queued_replies``
    control frames written while the peer does not read (the transport has paused writing),
    ``reset_burst`` streams reset by the peer at once and ``reset_rate`` a second after that.
    ``max_empty_frames``: frames in a row that carry nothing (empty DATA or header fragments,
    PRIORITY, unknown types).
    """

    max_ping_strikes: int = 2
    min_ping_interval: float = 300.0
    permit_pings_without_calls: bool = False
    max_queued_replies: int = 1000
    reset_burst: int = 1000
    reset_rate: float = 33.0
    max_empty_frames: int = 1000
    #: Seconds without a byte while something is half-sent (the preface, a frame, a header
    #: block or a stream's message): then the connection is dropped (nginx's read timeouts).
    read_timeout: float = 60.0
    #: Seconds what waits for the peer (the windows it gives, or its socket) may wait with
    #: nothing taken; then the connection ends (:mod:`~shoal.frontends.h2.liveness`).
    send_timeout: float = 60.0
    #: Answer bytes the connection may hold waiting for the peer: past it, a call fails.
    max_send_buffer: int = 1 << 30
    #: grpc-core's keepalive (Triton's flags): a PING after ``keepalive_time`` seconds with
    #: nothing read, the connection closed if nothing comes within ``keepalive_timeout``; at
    #: most ``max_pings_without_data`` PINGs (0: any) while we send no HEADERS or DATA.
    keepalive_time: float = 7200.0
    keepalive_timeout: float = 20.0
    max_pings_without_data: int = 2
    #: GOAWAY at this age (seconds; 0: never), closed ``max_age_grace`` later (0: never).
    max_age: float = 0.0
    max_age_grace: float = 0.0


class FloodGuard:
    """Counts what a connection's peer does against its :class:`FloodLimits`; each check raises
    :class:`ConnectionError_` (``ENHANCE_YOUR_CALM``) when a limit is passed."""

    def __init__(self, limits: FloodLimits, loop: asyncio.AbstractEventLoop) -> None:
        self.limits = limits
        self._loop = loop
        self._last_ping: float | None = None  # None: we sent HEADERS or DATA since
        self._ping_strikes = 0
        self._sent = 0  # the sender's count of HEADERS and DATA at the last PING
        self.writing_paused = False
        self._queued_replies = 0  # control frames written while writing is paused
        self._reset_tokens = float(limits.reset_burst)
        self._reset_time = loop.time()
        self._empty_frames = 0

    def frame(self, kind: int, flags: int, length: int) -> None:
        """A frame arrived: count a run of frames that carry nothing (CVE-2019-9518): empty
        DATA frames or header fragments that end nothing, PRIORITY (which shoal ignores) and
        unknown types."""
        if kind == h2.DATA:
            empty = length == 0 and not flags & h2.END_STREAM
        elif kind == h2.HEADERS or kind == h2.CONTINUATION:
            empty = length == 0 and not flags & h2.END_HEADERS
        else:
            empty = kind == h2.PRIORITY or kind > h2.CONTINUATION
        if empty:
            self._empty_frames += 1
            if self._empty_frames > self.limits.max_empty_frames:
                raise ConnectionError_(h2.ENHANCE_YOUR_CALM, "too many frames that carry nothing")
        elif kind == h2.DATA or kind == h2.HEADERS or kind == h2.CONTINUATION:
            self._empty_frames = 0

    def ping(self, calls_open: bool, sent: int) -> None:
        """A PING arrived: grpc-core's ping policy (see FloodLimits). ``sent``: how many
        HEADERS and DATA frames we have sent; any since the last PING forgive earlier ones."""
        if sent != self._sent:
            self._sent = sent
            self._last_ping = None
            self._ping_strikes = 0
        limits = self.limits
        now = self._loop.time()
        last = self._last_ping
        self._last_ping = now
        if last is None:
            return
        interval = limits.min_ping_interval
        if not calls_open and not limits.permit_pings_without_calls:
            interval = max(interval, _IDLE_PING_INTERVAL)
        if now - last < interval:
            self._ping_strikes += 1
            if limits.max_ping_strikes and self._ping_strikes > limits.max_ping_strikes:
                raise ConnectionError_(h2.ENHANCE_YOUR_CALM, "too_many_pings")

    def reply(self) -> None:
        """A control frame the peer's frame asked for is written; the peer must read them."""
        if self.writing_paused:
            self._queued_replies += 1
            if self._queued_replies > self.limits.max_queued_replies:
                raise ConnectionError_(
                    h2.ENHANCE_YOUR_CALM,
                    "too many replies wait for a peer that does not read",
                    abort=True,
                )

    def pause_writing(self) -> None:
        self.writing_paused = True

    def resume_writing(self) -> None:
        self.writing_paused = False
        self._queued_replies = 0

    def reset(self) -> None:
        """A stream the peer reset while it was open: a token of the reset bucket."""
        limits = self.limits
        now = self._loop.time()
        tokens = self._reset_tokens + (now - self._reset_time) * limits.reset_rate
        self._reset_tokens = min(float(limits.reset_burst), tokens) - 1
        self._reset_time = now
        if self._reset_tokens < 0:
            raise ConnectionError_(h2.ENHANCE_YOUR_CALM, "too many streams reset")
