"""``shoal serve`` flags of the response cache and the rate limiter, with tritonserver's names
and syntax: ``--cache-config <cache>,<key>=<value>`` (and the older
``--response-cache-byte-size``), ``--rate-limit`` and ``--rate-limit-resource``."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

#: ``(name, device)``: ``device`` None applies to every device (and to a global resource).
ResourceKey = tuple[str, int | None]


def add_arguments(serve: argparse.ArgumentParser) -> None:
    serve.add_argument(
        "--cache-config",
        action="append",
        type=_cache_setting,
        default=[],
        metavar="<cache>,<key>=<value>",
        help="the response cache: local,size=<bytes> (repeatable for more settings); models "
        "with response_cache { enable: true } then use it",
    )
    serve.add_argument(
        "--response-cache-byte-size",
        type=int,
        default=None,
        help="deprecated form of --cache-config local,size=<bytes>",
    )
    serve.add_argument(
        "--rate-limit",
        type=str.lower,
        choices=("off", "execution_count"),
        default="off",
        help="execution_count: instances run when the rate_limiter resources of their "
        "instance_group are free, the least used (weighted by priority) first",
    )
    serve.add_argument(
        "--rate-limit-resource",
        action="append",
        type=_resource,
        default=[],
        metavar="<name>:<count>[:<device>]",
        help="copies of a rate-limiter resource (on one device, or on every device when "
        "<device> is left out); default: the most any loaded instance asks for",
    )


def _cache_setting(text: str) -> tuple[str, str, str]:
    cache, comma, setting = text.partition(",")
    key, equals, value = setting.partition("=")
    if not (cache and comma and key and equals):
        raise argparse.ArgumentTypeError(f"expects <cache>,<key>=<value>, got '{text}'")
    return cache, key, value


def _resource(text: str) -> tuple[str, int, int | None]:
    parts = text.split(":")
    try:
        if len(parts) not in (2, 3) or not parts[0]:
            raise ValueError
        count = int(parts[1])
        device = int(parts[2]) if len(parts) == 3 else None
        if count < 0 or (device is not None and device < 0):
            raise ValueError
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expects <resource name>:<count>[:<device>] with a count and device of 0 or "
            f"more, got '{text}'"
        ) from None
    return parts[0].lower(), count, device


def cache_bytes(settings: Sequence[tuple[str, str, str]], byte_size: int | None) -> int:
    """The local cache's size from the flags (0: no cache); SystemExit on a misuse."""
    if byte_size is not None and settings:
        raise SystemExit(
            "shoal: incompatible flags --response-cache-byte-size and --cache-config: use "
            "--cache-config local,size=<bytes> only"
        )
    if byte_size is not None:
        if byte_size < 0:
            raise SystemExit("shoal: --response-cache-byte-size must be 0 or more")
        return byte_size
    if not settings:
        return 0
    caches = sorted({cache for cache, _, _ in settings})
    if len(caches) > 1:
        raise SystemExit(
            f"shoal: multiple cache configurations ({', '.join(caches)}) are not supported: "
            "configure one cache"
        )
    if caches != ["local"]:
        raise SystemExit(
            f"shoal: cache '{caches[0]}' is not available: shoal has the local cache "
            "(--cache-config local,size=<bytes>)"
        )
    values = {key: value for _, key, value in settings}
    unknown = sorted(set(values) - {"size"})
    if unknown:
        raise SystemExit(f"shoal: the local cache has no setting {', '.join(unknown)} (only size)")
    try:
        size = int(values.get("size", ""))
    except ValueError:
        raise SystemExit(
            "shoal: --cache-config local,size=<bytes> needs a number of bytes"
        ) from None
    if size <= 0:
        raise SystemExit("shoal: --cache-config local,size must be more than 0 bytes")
    return size


def rate_limit_resources(specs: Sequence[tuple[str, int, int | None]]) -> dict[ResourceKey, int]:
    """``--rate-limit-resource`` values by (name, device); a repeated one is a misuse."""
    resources: dict[ResourceKey, int] = {}
    for name, count, device in specs:
        if (name, device) in resources:
            where = f" on device {device}" if device is not None else ""
            raise SystemExit(f"shoal: --rate-limit-resource {name}{where} is given twice")
        resources[(name, device)] = count
    return resources


def options(args: argparse.Namespace) -> dict[str, Any]:
    """The ServerOptions fields these flags set."""
    return {
        "cache_bytes": cache_bytes(args.cache_config, args.response_cache_byte_size),
        "rate_limit": args.rate_limit,
        "rate_limit_resources": tuple(
            sorted(rate_limit_resources(args.rate_limit_resource).items(), key=str)
        ),
    }
