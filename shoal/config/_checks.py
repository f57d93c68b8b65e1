"""Field checks shared by the validators."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from .errors import ConfigError, FieldPath

WILDCARD_DIM = -1


def check_dims(dims: Sequence[int], what: str, where: FieldPath, triton: str = "") -> None:
    """Every dimension must be >= 1, or -1 for a variable size."""
    for dim in dims:
        if dim < 1 and dim != WILDCARD_DIM:
            raise ConfigError(
                f"{what} {shape_text(dims)}: every dimension must be an integer >= 1, or -1 for "
                f"a variable-size dimension; change {dim}",
                field_path=where,
                triton=triton,
            )


def check_preferred_sizes(
    sizes: Sequence[int], max_batch_size: int, model: str, owner: str, where: FieldPath
) -> None:
    """Preferred batch sizes must be in [1, max_batch_size]."""
    for size in sizes:
        if size < 1 or size > max_batch_size:
            limit = (
                f"max_batch_size {max_batch_size}"
                if max_batch_size
                else "max_batch_size, which is 0 (set max_batch_size to batch)"
            )
            raise ConfigError(
                f"{model} has {owner} preferred_batch_size {size}: each preferred batch size "
                f"must be at least 1 and at most {limit}",
                field_path=where,
            )


def shape_text(dims: Iterable[int]) -> str:
    return "[" + ", ".join(map(str, dims)) + "]"


__all__ = ["WILDCARD_DIM", "check_dims", "check_preferred_sizes", "shape_text"]
