"""Messages of Triton's protocol extensions <-> the core's types: pure functions, no I/O.

Statistics, the model repository (index, load, unload), system shared memory, logging and
tracing. Malformed requests raise :class:`~shoal.core.api.InvalidArgument`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from shoal.core import (
    BatchStatistics,
    CudaSharedMemoryRegion,
    InferStatistics,
    InternalError,
    InvalidArgument,
    ModelStatistics,
    ParamValue,
    RepositoryEntry,
    ResponseStatistics,
    SharedMemoryRegion,
    StatDuration,
    TraceChange,
    TraceValue,
    Unsupported,
)
from shoal.protos import grpc_service_pb2 as pb

_CONFIG = "config"
_FILE_PREFIX = "file:"
_UNLOAD_DEPENDENTS = "unload_dependents"
_UINT32_MAX = (1 << 32) - 1


def check_no_repository_name(repository_name: str) -> None:
    """shoal serves its repositories as one; naming one is unsupported, as in Triton."""
    if repository_name:
        raise Unsupported("'repository_name' specification is not supported")


# --- statistics -------------------------------------------------------------------------------


def statistics_response(stats: Iterable[ModelStatistics]) -> pb.ModelStatisticsResponse:
    """The ModelStatistics reply for the core's statistics."""
    response = pb.ModelStatisticsResponse()
    for model in stats:
        entry = response.model_stats.add(
            name=model.name,
            version=model.version,
            last_inference=model.last_inference,
            inference_count=model.inference_count,
            execution_count=model.execution_count,
        )
        _infer_stats(entry.inference_stats, model.inference_stats)
        _batch_and_response_stats(entry, model)
        _memory_usage(entry, model)
    return response


def _batch_and_response_stats(entry: pb.ModelStatistics, model: ModelStatistics) -> None:
    for batch in model.batch_stats:
        _batch_stats(entry.batch_stats.add(), batch)
    for key, stats_of_response in model.response_stats.items():
        _response_stats(entry.response_stats[key], stats_of_response)


def _memory_usage(entry: pb.ModelStatistics, model: ModelStatistics) -> None:
    for usage in model.memory_usage:
        entry.memory_usage.add(type=usage.type, id=usage.id, byte_size=usage.byte_size)


def _duration(target: pb.StatisticDuration, source: StatDuration) -> None:
    target.count = source.count
    target.ns = source.ns


def _infer_stats(target: pb.InferStatistics, source: InferStatistics) -> None:
    for name in (
        "success",
        "fail",
        "queue",
        "compute_input",
        "compute_infer",
        "compute_output",
        "cache_hit",
        "cache_miss",
    ):
        _duration(getattr(target, name), getattr(source, name))


def _batch_stats(target: pb.InferBatchStatistics, source: BatchStatistics) -> None:
    target.batch_size = source.batch_size
    _duration(target.compute_input, source.compute_input)
    _duration(target.compute_infer, source.compute_infer)
    _duration(target.compute_output, source.compute_output)


def _response_stats(target: pb.InferResponseStatistics, source: ResponseStatistics) -> None:
    for name in ("compute_infer", "compute_output", "success", "fail", "empty_response", "cancel"):
        _duration(getattr(target, name), getattr(source, name))


# --- model repository -------------------------------------------------------------------------


def repository_index_response(entries: Iterable[RepositoryEntry]) -> pb.RepositoryIndexResponse:
    """The RepositoryIndex reply for the core's index."""
    response = pb.RepositoryIndexResponse()
    for entry in entries:
        response.models.add(
            name=entry.name, version=entry.version, state=entry.state, reason=entry.reason
        )
    return response


def load_arguments(
    parameters: Mapping[str, pb.ModelRepositoryParameter],
) -> tuple[str | None, dict[str, bytes] | None]:
    """``config`` (JSON text) and ``file:<path>`` contents of a RepositoryModelLoad request."""
    config: str | None = None
    files: dict[str, bytes] = {}
    for key, parameter in parameters.items():
        if key == _CONFIG:
            config = _param(key, parameter, "string_param")
        elif key.startswith(_FILE_PREFIX):
            files[key] = _param(key, parameter, "bytes_param")
    return config, files or None


def _param(key: str, parameter: pb.ModelRepositoryParameter, kind: str) -> Any:
    """The parameter's value, which must be of ``kind``."""
    if parameter.WhichOneof("parameter_choice") != kind:
        raise InvalidArgument(f"expect the '{key}' parameter to be a {kind}")
    return getattr(parameter, kind)


def unload_dependents(parameters: Mapping[str, pb.ModelRepositoryParameter]) -> bool:
    """The ``unload_dependents`` flag of a RepositoryModelUnload request (default false)."""
    if _UNLOAD_DEPENDENTS not in parameters:
        return False
    parameter = parameters[_UNLOAD_DEPENDENTS]
    if parameter.WhichOneof("parameter_choice") != "bool_param":
        raise InvalidArgument(f"expect the '{_UNLOAD_DEPENDENTS}' parameter to be a bool_param")
    return parameter.bool_param


# --- shared memory ----------------------------------------------------------------------------


def system_shm_status_response(
    regions: Iterable[SharedMemoryRegion],
) -> pb.SystemSharedMemoryStatusResponse:
    """The SystemSharedMemoryStatus reply, keyed by region name."""
    response = pb.SystemSharedMemoryStatusResponse()
    for region in regions:
        _system_status(response.regions[region.name], region)
    return response


def _system_status(
    status: pb.SystemSharedMemoryStatusResponse.RegionStatus, region: SharedMemoryRegion
) -> None:
    status.name = region.name
    status.key = region.key
    status.offset = region.offset
    status.byte_size = region.byte_size


def cuda_shm_status_response(
    regions: Iterable[CudaSharedMemoryRegion],
) -> pb.CudaSharedMemoryStatusResponse:
    """The CudaSharedMemoryStatus reply, keyed by region name."""
    response = pb.CudaSharedMemoryStatusResponse()
    for region in regions:
        _cuda_status(response.regions[region.name], region)
    return response


def _cuda_status(
    status: pb.CudaSharedMemoryStatusResponse.RegionStatus, region: CudaSharedMemoryRegion
) -> None:
    status.name = region.name
    status.device_id = region.device_id
    status.byte_size = region.byte_size


# --- logging and tracing ----------------------------------------------------------------------

_LogValue = pb.LogSettingsRequest.SettingValue


def log_settings_update(settings: Mapping[str, _LogValue]) -> dict[str, ParamValue]:
    """The settings a LogSettings request changes (empty: the request only reads them)."""
    return {key: _log_value(key, setting) for key, setting in settings.items()}


def _log_value(key: str, setting: _LogValue) -> ParamValue:
    choice = setting.WhichOneof("parameter_choice")
    if choice is None:
        raise InvalidArgument(
            f"log setting '{key}' has no value: expected bool_param, uint32_param or string_param"
        )
    value: ParamValue = getattr(setting, choice)
    return value


def log_settings_response(settings: Mapping[str, ParamValue]) -> pb.LogSettingsResponse:
    """The LogSettings reply: booleans, unsigned integers (e.g. the verbose level) and strings."""
    response = pb.LogSettingsResponse()
    for key, value in settings.items():
        _set_log_value(response.settings[key], key, value)
    return response


def _set_log_value(setting: Any, key: str, value: ParamValue) -> None:
    if isinstance(value, bool):
        setting.bool_param = value
    elif isinstance(value, int):
        if not 0 <= value <= _UINT32_MAX:
            raise InternalError(f"log setting '{key}' = {value} does not fit a uint32")
        setting.uint32_param = value
    else:
        setting.string_param = str(value)


def trace_settings_update(
    settings: Mapping[str, pb.TraceSettingRequest.SettingValue],
) -> dict[str, TraceChange]:
    """The changes a TraceSetting request asks for: an empty value clears a model's setting."""
    return {key: _trace_change(key, list(setting.value)) for key, setting in settings.items()}


def _trace_change(key: str, values: list[str]) -> TraceChange:
    if not values:
        return None
    if key == "trace_level":
        return values
    if len(values) == 1:
        return values[0]
    raise InvalidArgument(f"trace setting '{key}' takes one value, got {len(values)}")


def trace_settings_response(settings: Mapping[str, TraceValue]) -> pb.TraceSettingResponse:
    """The TraceSetting reply: each setting as a list of strings (an empty string stays one
    value, as Triton sends ``trace_file``)."""
    response = pb.TraceSettingResponse()
    for key, value in settings.items():
        values = value if isinstance(value, list) else [value]
        response.settings[key].value.extend(values)
    return response
