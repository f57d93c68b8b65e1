"""Errors of the load generator."""

from __future__ import annotations


class PerfError(Exception):
    """A run cannot start or go on (bad arguments, server unreachable, a failed probe). Fatal."""


class RequestFailed(PerfError):
    """One request failed; the run counts it as an error and goes on. Recoverable."""
