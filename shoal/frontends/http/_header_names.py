"""Header names as the client sent them, for ``--http-header-forward-pattern``.

Triton (libevhtp) forwards a matching header under its name as it came (``X-Tenant`` stays
``X-Tenant``); ASGI and the HTTP parser's callbacks give names lowercase. While a pattern is set,
each connection's parser reports to a :class:`_Recorder` standing in front of the protocol: it
records each request's header lines as they came, hands every callback on, and puts the lines
in the request's ASGI scope under :data:`RAW_HEADERS`. Without a pattern the protocol is made as
it is and nothing is recorded (the fast path, which forwarding turns off anyway, pays nothing).

Not a subclass of the protocol: compiled (mypyc), its class refuses interpreted subclasses.
"""

from __future__ import annotations

from typing import Any, Final, cast

import httptools

from shoal.frontends.http._fast_request import FastRequest
from shoal.frontends.http.fast_path import FastInferHttpToolsProtocol

#: The scope key of a request's header lines as they came: ``[(name, value), ...]`` as bytes.
RAW_HEADERS: Final = "shoal.raw_headers"

#: The parser's callbacks handed on as they are.
_PASSED_ON: Final = (
    "on_url",
    "on_body",
    "on_message_complete",
    "on_chunk_header",
    "on_chunk_complete",
)


class _Recorder:
    """What the parser calls: the protocol's callbacks, with the header lines recorded."""

    def __init__(self, protocol: FastInferHttpToolsProtocol) -> None:
        self._protocol = protocol
        self._lines: list[tuple[bytes, bytes]] = []
        for name in _PASSED_ON:  # (the parser looks its callbacks up once, when made)
            if hasattr(protocol, name):
                setattr(self, name, getattr(protocol, name))

    def on_message_begin(self) -> None:
        self._lines = []
        self._protocol.on_message_begin()

    def on_header(self, name: bytes, value: bytes) -> None:
        self._lines.append((name, value))
        self._protocol.on_header(name, value)

    def on_headers_complete(self) -> None:
        protocol = self._protocol
        protocol.on_headers_complete()
        # The request's scope, which its cycle holds (a pipelined one too), and whose task has
        # not run yet (tasks start on the loop's next turn): it reads the key when it runs.
        if not isinstance(protocol.cycle, FastRequest):
            protocol.scope[RAW_HEADERS] = self._lines  # type: ignore[typeddict-unknown-key]


def _name_keeping(**kwargs: Any) -> FastInferHttpToolsProtocol:
    """The protocol, its parser reporting to a :class:`_Recorder`."""
    protocol = FastInferHttpToolsProtocol(**kwargs)
    protocol.parser = httptools.HttpRequestParser(_Recorder(protocol))
    protocol.parser.set_dangerous_leniencies(lenient_data_after_close=True)  # as uvicorn
    return protocol


def protocol_class(app: object) -> type[FastInferHttpToolsProtocol]:
    """What makes the protocol serving ``app``: the name-keeping one where it forwards
    headers (a function standing where uvicorn takes a class: it only calls it)."""
    if getattr(app, "forwards_headers", False):
        return cast("type[FastInferHttpToolsProtocol]", _name_keeping)
    return FastInferHttpToolsProtocol
