"""The inference URL, defined once: ``POST /v2/models/{m}[/versions/{v}]/infer``.

:class:`InferRoutes` holds the two Starlette routes that serve it (the app's routing table, with
its 404 and 405 answers); the two ways past Starlette's router match with those same routes'
patterns: the app's shortcut for an inference request (:meth:`InferRoutes.match_path`) and the
HTTP protocol's way without ASGI (:meth:`InferRoutes.match_target`).
"""

from __future__ import annotations

import re

from starlette.routing import Route
from starlette.types import ASGIApp

#: The inference URL's forms, as Starlette's routes declare them.
INFER_PATHS = (
    "/v2/models/{model_name}/infer",
    "/v2/models/{model_name}/versions/{model_version}/infer",
)


class InferRoutes:
    """The routes of the inference URL to ``endpoint``, and matchers that use their patterns."""

    def __init__(self, endpoint: ASGIApp) -> None:
        self.routes = [Route(path, endpoint, methods=["POST"]) for path in INFER_PATHS]
        self._paths = [route.path_regex for route in self.routes]
        # The same patterns over bytes (names are "[^/]+": the raw target's bytes, undecoded).
        self._targets = [re.compile(path.pattern.encode("ascii")) for path in self._paths]

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
        ASGI way decodes those)."""
        if b"?" in target or b"%" in target:
            return None
        for pattern in self._targets:
            found = pattern.match(target)
            if found is not None:
                groups = found.groups()
                version = groups[1].decode("latin-1") if len(groups) > 1 else ""
                return groups[0].decode("latin-1"), version
        return None
