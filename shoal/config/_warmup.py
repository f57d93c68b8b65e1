"""Checks on ``model_warmup``: what Triton refuses when it builds the warmup samples."""

from __future__ import annotations

from collections.abc import Iterable

from shoal.protos import model_config_pb2 as pb

from ._checks import check_dims
from .errors import ConfigError, FieldPath


def validate_warmup(samples: Iterable[pb.ModelWarmup], max_batch_size: int, model: str) -> None:
    """Raise :class:`ConfigError` for a warmup sample that cannot be built or run."""
    for index, sample in enumerate(samples):
        where: FieldPath = ("model_warmup", index)
        label = f"warmup sample '{sample.name}' of {model}"
        _check_batch_size(sample.batch_size, max_batch_size, label, (*where, "batch_size"))
        for name, tensor in sorted(sample.inputs.items()):
            _check_input(tensor, f"input '{name}' of {label}", (*where, "inputs", name))


def _check_batch_size(batch_size: int, max_batch_size: int, label: str, where: FieldPath) -> None:
    if batch_size < 1:
        raise ConfigError(
            f"{label} has batch_size {batch_size}: it must be 1 or more", field_path=where
        )
    if max_batch_size == 0 and batch_size != 1:
        raise ConfigError(
            f"{label} has batch_size {batch_size}, but the model does not batch "
            "(max_batch_size 0): use batch_size: 1",
            field_path=where,
        )
    if max_batch_size and batch_size > max_batch_size:
        raise ConfigError(
            f"{label} has batch_size {batch_size}, more than the model's "
            f"max_batch_size {max_batch_size}",
            field_path=where,
        )


def _check_input(tensor: pb.ModelWarmup.Input, label: str, where: FieldPath) -> None:
    if tensor.data_type == pb.TYPE_INVALID:
        raise ConfigError(
            f"{label} has no data_type: add the input's data_type (TYPE_FP32, ...)",
            field_path=(*where, "data_type"),
        )
    check_dims(tensor.dims, f"{label} has dims", (*where, "dims"))
    if any(dim < 0 for dim in tensor.dims):
        raise ConfigError(
            f"{label} has dims {list(tensor.dims)}: a warmup input needs a fixed shape (no -1)",
            field_path=(*where, "dims"),
        )
    _check_data(tensor, label, where)


def _check_data(tensor: pb.ModelWarmup.Input, label: str, where: FieldPath) -> None:
    """The input says where its data comes from."""
    choice = tensor.WhichOneof("input_data_type")
    if choice is None:
        raise ConfigError(
            f"{label} says nothing about its data: set zero_data: true, random_data: true or "
            'input_data_file: "<file in the model\'s warmup directory>"',
            field_path=where,
        )
    if choice == "input_data_file" and not tensor.input_data_file:
        raise ConfigError(
            f"{label} has an empty input_data_file: name a file of the model's warmup directory",
            field_path=(*where, "input_data_file"),
        )
