"""Triton's statistics extension: the JSON of ``GET /v2/models[/{m}[/versions/{v}]]/stats``.

Fields and their order are those Triton's server writes (``TRITONSERVER_ServerModelStatistics``):
every duration is ``{"count", "ns"}``, every field is present even when zero, ``response_stats`` is
an object keyed by response index and ``batch_stats`` and ``memory_usage`` are arrays.
"""

from __future__ import annotations

from typing import Any

from shoal.core import (
    BatchStatistics,
    InferStatistics,
    MemoryUsage,
    ModelStatistics,
    ResponseStatistics,
    StatDuration,
)


def model_stats_json(stats: list[ModelStatistics]) -> dict[str, Any]:
    """The ``{"model_stats": [...]}`` body."""
    return {"model_stats": [_model_stat(stat) for stat in stats]}


def _model_stat(stat: ModelStatistics) -> dict[str, Any]:
    return {
        "name": stat.name,
        "version": stat.version,
        "last_inference": stat.last_inference,
        "inference_count": stat.inference_count,
        "execution_count": stat.execution_count,
        "inference_stats": _infer_stats(stat.inference_stats),
        "response_stats": {
            str(index): _response_stats(response) for index, response in stat.response_stats.items()
        },
        "batch_stats": [_batch_stats(batch) for batch in stat.batch_stats],
        "memory_usage": [_memory_usage(usage) for usage in stat.memory_usage],
    }


def _infer_stats(stats: InferStatistics) -> dict[str, Any]:
    return {
        "success": _duration(stats.success),
        "fail": _duration(stats.fail),
        "queue": _duration(stats.queue),
        "compute_input": _duration(stats.compute_input),
        "compute_infer": _duration(stats.compute_infer),
        "compute_output": _duration(stats.compute_output),
        "cache_hit": _duration(stats.cache_hit),
        "cache_miss": _duration(stats.cache_miss),
    }


def _response_stats(stats: ResponseStatistics) -> dict[str, Any]:
    return {
        "compute_infer": _duration(stats.compute_infer),
        "compute_output": _duration(stats.compute_output),
        "success": _duration(stats.success),
        "fail": _duration(stats.fail),
        "empty_response": _duration(stats.empty_response),
        "cancel": _duration(stats.cancel),
    }


def _batch_stats(stats: BatchStatistics) -> dict[str, Any]:
    return {
        "batch_size": stats.batch_size,
        "compute_input": _duration(stats.compute_input),
        "compute_infer": _duration(stats.compute_infer),
        "compute_output": _duration(stats.compute_output),
    }


def _duration(duration: StatDuration) -> dict[str, int]:
    return {"count": duration.count, "ns": duration.ns}


def _memory_usage(usage: MemoryUsage) -> dict[str, Any]:
    return {"type": usage.type, "id": usage.id, "byte_size": usage.byte_size}
