"""Header names as the client sent them, for ``--http-header-forward-pattern``.

Triton (libevhtp) forwards a matching header under its name as it came (``X-Tenant`` stays
``X-Tenant``); ASGI and the HTTP parser's callbacks give names lowercase. While a pattern is set,
the server's connections use :class:`NameKeepingProtocol`, which records each request's header
lines as they came and puts them in the ASGI scope under :data:`RAW_HEADERS`; without a pattern
the plain protocol runs and nothing is recorded (the fast path, which forwarding turns off
anyway, pays nothing).
"""

from __future__ import annotations

from typing import Any, Final

from shoal.frontends.http._fast_request import FastRequest
from shoal.frontends.http.fast_path import FastInferHttpToolsProtocol

#: The scope key of a request's header lines as they came: ``[(name, value), ...]`` as bytes.
RAW_HEADERS: Final = "shoal.raw_headers"


class NameKeepingProtocol(FastInferHttpToolsProtocol):
    """The HTTP protocol, recording header names in their case."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._raw_headers: list[tuple[bytes, bytes]] = []

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._raw_headers = []

    def on_header(self, name: bytes, value: bytes) -> None:
        self._raw_headers.append((name, value))
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        raw = self._raw_headers
        super().on_headers_complete()
        # The request's scope, which its cycle holds (a pipelined one too), and whose task has
        # not run yet (tasks start on the loop's next turn): it reads the key when it runs.
        if not isinstance(self.cycle, FastRequest):
            self.scope[RAW_HEADERS] = raw  # type: ignore[typeddict-unknown-key]


def protocol_class(app: object) -> type[FastInferHttpToolsProtocol]:
    """The protocol serving ``app``: the name-keeping one where it forwards headers."""
    if getattr(app, "forwards_headers", False):
        return NameKeepingProtocol
    return FastInferHttpToolsProtocol
