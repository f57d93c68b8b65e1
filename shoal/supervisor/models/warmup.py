"""``model_warmup``: the configured samples each instance runs before its model is ready.

As in Triton, every instance runs every sample (``count`` times, once when 0) straight through
its stub, bypassing the scheduler, before the version is marked READY; a sample that fails
fails the load with a message naming the model, the instance and the sample. Warmup runs are
not counted in the model's statistics (they are not client requests).

Sample data: ``zero_data`` (zeros; empty strings for BYTES), ``random_data`` (random values;
zeros for BYTES, as Triton falls back), or ``input_data_file`` (raw row-major bytes of one batch
item, BYTES as Triton's 4-byte length + bytes per element, read from ``<model>/warmup/``). A
sample with ``batch_size`` n > 1 repeats the data n times along the batch dimension.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from shoal.config import ModelConfig
from shoal.config.datatypes import config_dtype_to_v2
from shoal.core.errors import ShoalError
from shoal.ipc.arena import Block
from shoal.ipc.dtypes import NUMPY_DTYPES, byte_size, element_count
from shoal.ipc.records import RequestRecord
from shoal.ipc.tensor import TensorDesc
from shoal.protos import model_config_pb2 as pb
from shoal.supervisor.schedulers.base import StageTensor
from shoal.supervisor.work import Completion, Work

log = logging.getLogger("shoal")

#: The folder of a model's directory that holds ``input_data_file`` files, as in Triton.
WARMUP_FOLDER = "warmup"


@dataclass(frozen=True)
class WarmupInput:
    """One input of a sample: its V2 datatype, full shape (batch included) and bytes."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: bytes


@dataclass(frozen=True)
class WarmupSample:
    name: str
    batch_size: int
    runs: int
    inputs: tuple[WarmupInput, ...]


class WarmupError(ShoalError):
    """A warmup sample could not be built or its execution failed: the load fails."""


def build_samples(config: ModelConfig, model_dir: str) -> list[WarmupSample]:
    """The samples of ``config.proto.model_warmup`` with their data (files read now).

    Raises :class:`WarmupError` naming the sample when a data file is missing or too short.
    """
    samples = []
    rng = np.random.default_rng()
    for sample in config.proto.model_warmup:
        label = f"warmup sample '{sample.name}' of model '{config.name}'"
        inputs = []
        for name, spec in sorted(sample.inputs.items()):
            datatype = config_dtype_to_v2(spec.data_type)
            dims = tuple(int(d) for d in spec.dims)
            item = _item_data(spec, datatype, dims, model_dir, f"input '{name}' of {label}", rng)
            batch = (sample.batch_size,) if config.max_batch_size > 0 else ()
            inputs.append(WarmupInput(name, datatype, batch + dims, item * sample.batch_size))
        samples.append(
            WarmupSample(sample.name, sample.batch_size, max(1, sample.count), tuple(inputs))
        )
    return samples


def _item_data(
    spec: pb.ModelWarmup.Input,
    datatype: str,
    dims: tuple[int, ...],
    model_dir: str,
    label: str,
    rng: Any,
) -> bytes:
    """One batch item's bytes in the V2 layout."""
    count = element_count(dims)
    size = byte_size(datatype, dims)
    choice = spec.WhichOneof("input_data_type")
    if choice == "input_data_file":
        return _file_data(spec.input_data_file, datatype, count, size, model_dir, label)
    if size is None:  # BYTES: empty strings (random_data falls back to zeros, as in Triton)
        return bytes(4 * count)
    if choice == "random_data":
        return _random_data(datatype, count, rng)
    return bytes(size)


def _random_data(datatype: str, count: int, rng: Any) -> bytes:
    dtype = NUMPY_DTYPES[datatype]
    if datatype == "BOOL":
        return bytes(rng.integers(0, 2, count, dtype=np.uint8).astype(np.bool_).tobytes())
    if dtype.kind == "f":  # values, not bit patterns: no NaN or infinity
        return bytes(rng.random(count).astype(dtype).tobytes())
    return bytes(rng.bytes(count * dtype.itemsize))


def _file_data(
    file: str, datatype: str, count: int, size: int | None, model_dir: str, label: str
) -> bytes:
    folder = os.path.realpath(os.path.join(model_dir, WARMUP_FOLDER))
    path = os.path.realpath(os.path.join(folder, file))
    if os.path.commonpath([folder, path]) != folder:
        raise WarmupError(
            f"{label} names input_data_file '{file}', which is outside the model's "
            f"'{WARMUP_FOLDER}' directory"
        )
    try:
        with open(path, "rb") as handle:
            raw = handle.read()
    except OSError as error:
        raise WarmupError(
            f"{label}: cannot read input_data_file '{file}' in {folder}: {error.strerror}"
        ) from None
    needed = size if size is not None else _bytes_length(raw, count, label, file)
    if len(raw) < needed:
        raise WarmupError(
            f"{label} needs {needed} bytes, but input_data_file '{file}' has only {len(raw)}"
        )
    return raw[:needed]


def _bytes_length(raw: bytes, count: int, label: str, file: str) -> int:
    """Bytes taken by the first ``count`` serialized BYTES elements of ``raw``."""
    offset = 0
    for index in range(count):
        if offset + 4 > len(raw):
            raise WarmupError(
                f"{label} needs {count} string elements, but input_data_file '{file}' ends "
                f"after {index}"
            )
        offset += 4 + int.from_bytes(raw[offset : offset + 4], "little")
        if offset > len(raw):
            raise WarmupError(
                f"{label}: element {index} of input_data_file '{file}' runs past its end"
            )
    return offset


def work_for(sample: WarmupSample, stage: StageTensor, free: Callable[[list[Block]], None]) -> Work:
    """A request of ``sample``, its inputs staged in the input arena (the work owns them)."""
    descs, blocks = _staged(sample, stage, free)
    record = RequestRecord(f"warmup {sample.name}", 0, 0, {}, [], descs)
    future: asyncio.Future[Completion] = asyncio.get_running_loop().create_future()
    return Work(record, blocks, future, batch_size=sample.batch_size)


def _staged(
    sample: WarmupSample, stage: StageTensor, free: Callable[[list[Block]], None]
) -> tuple[list[TensorDesc], list[Block]]:
    """The sample's inputs staged; on a failure, the blocks staged so far are freed."""
    descs: list[TensorDesc] = []
    blocks: list[Block] = []
    try:
        for tensor in sample.inputs:
            desc, block = stage(tensor.name, tensor.datatype, tensor.shape, tensor.data)
            descs.append(desc)
            blocks.append(block)
    except ShoalError:
        free(blocks)
        raise
    return descs, blocks


#: Runs one batch on one instance now and returns its completions (``StubInstance.run_now``).
RunNow = Callable[[list[Work]], Awaitable[list[Completion]]]


async def warm_up(
    model: str,
    instance: str,
    samples: list[WarmupSample],
    stage: StageTensor,
    free: Callable[[list[Block]], None],
    run_now: RunNow,
) -> None:
    """Run every sample on one instance; raise :class:`WarmupError` at the first failure."""
    for sample in samples:
        for run in range(1, sample.runs + 1):
            log.info(
                "model '%s' instance %s is running warmup sample '%s' for iteration %d",
                model,
                instance,
                sample.name,
                run,
            )
            failures = await _run_once(sample, stage, free, run_now)
            if failures:
                raise WarmupError(_failed(model, instance, sample, failures))


async def _run_once(
    sample: WarmupSample, stage: StageTensor, free: Callable[[list[Block]], None], run_now: RunNow
) -> list[str]:
    """Run the sample once; why it failed (each failed response's message), or nothing."""
    try:
        work = work_for(sample, stage, free)
        completions = await run_now([work])  # the instance owns the inputs from here
    except ShoalError as error:
        return [str(error)]
    failures = []
    for completion in completions:
        if completion.response.error is not None:
            failures.append(completion.response.error[1])
        completion.release()
    return failures


def _failed(model: str, instance: str, sample: WarmupSample, why: list[str]) -> str:
    # Triton's words ("<error>; " per failed response; its QA greps for them), then where.
    errors = "".join(f"{error}; " for error in why)
    return (
        f"failed to run warmup sample '{sample.name}': {errors}"
        f"(instance '{instance}' of model '{model}')"
    )


__all__ = [
    "WARMUP_FOLDER",
    "WarmupError",
    "WarmupInput",
    "WarmupSample",
    "build_samples",
    "warm_up",
    "work_for",
]
