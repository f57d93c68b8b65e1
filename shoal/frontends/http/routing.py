"""The inference URL, defined once: ``POST /v2/models/{m}[/versions/{v}]/infer``.

:class:`InferRoutes` holds the two Starlette routes that serve it (the app's routing table, with
its 404 and 405 answers); the two ways past Starlette's router match what those routes match:
the app's shortcut for an inference request with their patterns (:meth:`InferRoutes.match_path`)
and the HTTP protocol's way without ASGI by hand (:meth:`InferRoutes.match_target`).
"""

from __future__ import annotations

from typing import Final

from starlette.routing import Route
from starlette.types import ASGIApp

#: The inference URL's forms, as Starlette's routes declare them.
INFER_PATHS: Final = (
    "/v2/models/{model_name}/infer",
    "/v2/models/{model_name}/versions/{model_version}/infer",
)


class InferRoutes:
    """The routes of the inference URL to ``endpoint``, and matchers that use their patterns."""

    def __init__(self, endpoint: ASGIApp) -> None:
        self.routes = [Route(path, endpoint, methods=["POST"]) for path in INFER_PATHS]
        self._paths = [route.path_regex for route in self.routes]

    def match_path(self, path: str) -> dict[str, str] | None:
        """The path parameters when ``path`` (an ASGI scope's, decoded) is the inference URL."""
        for pattern in self._paths:
            found = pattern.match(path)
            if found is not None:
                return found.groupdict()
        return None

    def match_target(self, target: bytes) -> tuple[str, str] | None:
        """Model name and version ("" when absent) when a raw request target is the inference
        URL as it is: None for any other, and for one with a query or a percent-escape (the
        ASGI way decodes those). Cut by hand, not by the routes' patterns (a regular
        expression's match costs a small request several thousand instructions); what it
        accepts is what those patterns match (each name "[^/]+"), as the tests check. Cut as
        its latin-1 str, one character per byte, so the same cuts: compiled, a str's ``in``,
        ``startswith`` and ``split`` are direct calls, where a bytes' ``find`` and ``split``
        are method look-ups with argument parsing (~500-1,000 instructions each), and a bytes ``in``
        tries its operand as an integer first, raising and clearing a TypeError."""
        text = target.decode("latin-1")
        if "?" in text or "%" in text:
            return None
        if not (text.startswith(_PREFIX) and text.endswith(_SUFFIX)):
            return None
        if len(text) <= len(_PREFIX) + len(_SUFFIX):
            return None  # no name between them; compiled, a backward slice is a SystemError
        parts = text[len(_PREFIX) : len(text) - len(_SUFFIX)].split("/")
        if len(parts) == 1 and parts[0]:
            return parts[0], ""
        if len(parts) == 3 and parts[0] and parts[1] == "versions" and parts[2]:
            return parts[0], parts[2]
        return None


_PREFIX: Final = "/v2/models/"
_SUFFIX: Final = "/infer"
