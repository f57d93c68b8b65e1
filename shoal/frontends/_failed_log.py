"""Triton's verbose line for an inference request that failed before its model answered (HTTP's
``HandleInfer`` and gRPC's ``ModelInfer`` log it at ``--log-verbose 1``):
``[request id: <id>] Infer failed: <message>``. The message may hold the client's text (a model
or input name); the log's escaping keeps it on its line."""

from __future__ import annotations

import logging

log = logging.getLogger("shoal.frontends")


def infer_failed(request_id: str, message: str) -> None:
    """Log the failure of the request ``request_id`` ("" before its id was read), when
    verbose."""
    if log.isEnabledFor(logging.DEBUG):
        log.debug("[request id: %s] Infer failed: %s", request_id or "<id_unknown>", message)
