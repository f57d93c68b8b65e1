"""The metrics endpoint: ``GET /metrics`` answers the Prometheus text exposition.

The app serves whatever ``render`` returns; the composition root passes the supervisor's
exporter, so this frontend knows nothing of how metrics are computed. Serve it with
:class:`~shoal.frontends.http.app.HttpServer` on its own port (``--metrics-port``), as Triton does.
"""

from __future__ import annotations

from collections.abc import Callable

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

__all__ = ["CONTENT_TYPE", "build_metrics_app"]

#: Prometheus text format 0.0.4, what Prometheus scrapers and Triton's endpoint speak.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def build_metrics_app(render: Callable[[], bytes]) -> Starlette:
    """An app with one route, ``GET /metrics``; ``render`` runs on the event loop per scrape."""

    async def metrics(request: Request) -> Response:
        # An async endpoint: Starlette would run a sync one in a thread, away from the loop
        # whose state ``render`` reads.
        return Response(render(), media_type=CONTENT_TYPE)

    return Starlette(routes=[Route("/metrics", metrics, methods=["GET"])])
