"""The argparse types of ``shoal serve``'s flags: each turns the flag's text into its value, or
says what it expected (argparse prints it with the flag's name)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable

from shoal.frontends._restricted import GROUPS as RESTRICTED_GROUPS
from shoal.supervisor.options import Restriction


def parse_bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got '{text}'")


def parse_positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0  # reported below
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got '{text}'")
    return value


def parse_positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got '{text}'")
    return value


def parse_count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got '{text}'")
    return value


def auto_frontend_workers(cores: int | None = None) -> int:
    """``--frontend-workers auto``: leave the core and the stubs cores of their own."""
    if cores is None:
        cores = len(os.sched_getaffinity(0))
    return max(1, min(8, (cores - 1) // 2))


def parse_workers(text: str) -> int:
    if text.strip().lower() == "auto":
        return auto_frontend_workers()
    return parse_positive_int(text)


def parse_busy_poll(text: str) -> float:
    """``--busy-poll-us``: microseconds, or ``auto`` (-1, resolved once the workers are known)."""
    if text.strip().lower() == "auto":
        return -1.0
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 10_000:
        raise argparse.ArgumentTypeError(f"expected microseconds 0-10000 or auto, got '{text}'")
    return value


def parse_backend_config(text: str) -> tuple[str, str, str]:
    """``python,shm-default-byte-size=1048576`` → ('python', 'shm-default-byte-size', '1048576')."""
    backend, sep, setting = text.partition(",")
    key, eq, value = setting.partition("=")
    if not sep or not eq or not backend or not key:
        raise argparse.ArgumentTypeError(
            f"--backend-config expects <backend>,<setting>=<value>, got '{text}'"
        )
    return backend, key, value


def restriction_parser(kind: str) -> Callable[[str], Restriction]:
    """The argparse type of ``<group>[,<group>...]:<key>=<value>`` (Triton's syntax: the groups
    end at the first ':', the key at the next '='); ``kind`` is "api" or "protocol"."""

    def parse(text: str) -> Restriction:
        groups, colon, setting = text.partition(":")
        key, equals, value = setting.partition("=")
        if not (colon and equals and groups and key and value):
            raise argparse.ArgumentTypeError(f"expects <{kind} list>:<key>=<value>, got '{text}'")
        apis = tuple(groups.split(","))
        _check_groups(apis, kind)
        return Restriction(apis, key, value)

    return parse


def _check_groups(apis: tuple[str, ...], kind: str) -> None:
    for api in apis:
        if api not in RESTRICTED_GROUPS:
            raise argparse.ArgumentTypeError(
                f"unknown restricted {kind} '{api}'; known: {', '.join(RESTRICTED_GROUPS)}"
            )


def parse_ssl(text: str) -> bool:
    if parse_bool(text):
        raise argparse.ArgumentTypeError(
            "true is not supported: shoal serves gRPC without TLS (terminate TLS in front of it)"
        )
    return False
