"""The OpenTelemetry exporter settings of ``--trace-config opentelemetry,<setting>=<value>``.

shoal exports no spans, so it keeps none of them; but tritonserver refuses to start in
OpenTelemetry mode when a batch span processor setting given on the command line or in its
``OTEL_BSP_*`` environment variable does not read as a number, and so does shoal (in
tritonserver's words: scripts grep them). It reads them as ``std::stoul`` does: leading blanks,
a sign and the leading digits (``12abc`` is 12), refused only without digits or past 2**64-1.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

#: The batch span processor settings tritonserver reads as numbers.
BATCH_SPAN_SETTINGS = ("bsp_max_queue_size", "bsp_schedule_delay", "bsp_max_export_batch_size")

#: What ``std::stoul`` reads (an unsigned long is 64 bits where tritonserver runs).
_LEADING_NUMBER = re.compile(r"\s*[+-]?(\d+)")
_ULONG_MAX = 2**64 - 1


def check_batch_span_settings(
    given: Mapping[str, str], environ: Mapping[str, str] = os.environ
) -> None:
    """ValueError in tritonserver's words for a batch span processor setting that does not
    read as a number: ``given`` on the command line, else its ``OTEL_BSP_*`` variable."""
    for setting in BATCH_SPAN_SETTINGS:
        if setting in given:
            value, source = given[setting], f"--trace-config opentelemetry,{setting}"
        else:
            variable = f"OTEL_{setting.upper()}"
            if variable not in environ:
                continue
            value, source = environ[variable], variable
        problem = _number_problem(value)
        if problem is not None:
            raise ValueError(f'Bad option: "{source}".\n{problem}')


def _number_problem(value: str) -> str | None:
    number = _LEADING_NUMBER.match(value)
    if number is None or not number.group(1).isascii():
        return f"Invalid option value. Got {value}"
    if int(number.group(1)) > _ULONG_MAX:
        return f"Provided option value is out of bound. Got {value}"
    return None


__all__ = ["BATCH_SPAN_SETTINGS", "check_batch_span_settings"]
