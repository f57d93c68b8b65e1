"""The OpenTelemetry exporter settings of ``--trace-config opentelemetry,<setting>=<value>``.

shoal exports no spans, so it keeps none of them; but tritonserver refuses to start in
OpenTelemetry mode when a batch span processor setting is not an unsigned 32-bit integer,
given on the command line or in its ``OTEL_BSP_*`` environment variable, and so does shoal
(in tritonserver's words: scripts grep them).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

#: The batch span processor settings tritonserver reads as unsigned 32-bit integers.
BATCH_SPAN_SETTINGS = ("bsp_max_queue_size", "bsp_schedule_delay", "bsp_max_export_batch_size")

_UINT32_MAX = 2**32 - 1


def check_batch_span_settings(
    given: Mapping[str, str], environ: Mapping[str, str] = os.environ
) -> None:
    """ValueError in tritonserver's words for a batch span processor setting that is not an
    unsigned 32-bit integer: ``given`` on the command line, else its ``OTEL_BSP_*`` variable."""
    for setting in BATCH_SPAN_SETTINGS:
        if setting in given:
            value, source = given[setting], f"--trace-config opentelemetry,{setting}"
        else:
            variable = f"OTEL_{setting.upper()}"
            if variable not in environ:
                continue
            value, source = environ[variable], variable
        problem = _uint32_problem(value)
        if problem is not None:
            raise ValueError(f'Bad option: "{source}".\n{problem}')


def _uint32_problem(value: str) -> str | None:
    text = value.strip()
    if not text.isascii() or not text.isdigit():
        return f"Invalid option value. Got {value}"
    if int(text) > _UINT32_MAX:
        return f"Provided option value is out of bound. Got {value}"
    return None


__all__ = ["BATCH_SPAN_SETTINGS", "check_batch_span_settings"]
