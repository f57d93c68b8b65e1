"""The frozen, typed view of a completed and validated ModelConfig that the server reads."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Literal, NamedTuple

from shoal.protos import model_config_pb2 as pb

from .datatypes import config_dtype_to_v2
from .defaults import ENSEMBLE_PLATFORM
from .sequence import SequenceBatchingConfig, sequence_batching_from_proto

#: ``("latest", n)``, ``("all",)`` or ``("specific", (1, 3))``.
VersionPolicy = (
    tuple[Literal["latest"], int]
    | tuple[Literal["all"]]
    | tuple[Literal["specific"], tuple[int, ...]]
)


@dataclass(frozen=True)
class TensorConfig:
    """One input or output as configured; ``dims`` exclude the batch dimension."""

    name: str
    datatype: str  # KServe V2 name: "FP32", "BYTES", ...
    dims: tuple[int, ...]
    optional: bool = False
    reshape: tuple[int, ...] | None = None
    is_shape_tensor: bool = False
    allow_ragged_batch: bool = False


@dataclass(frozen=True)
class InstanceGroupConfig:
    """A completed instance group: ``kind`` is ``KIND_CPU``, ``KIND_GPU`` or ``KIND_MODEL``."""

    name: str
    kind: str
    count: int
    gpus: tuple[int, ...] = ()
    passive: bool = False
    host_policy: str = ""


class InstanceSpec(NamedTuple):
    """One model instance to create: its name, kind and device id (0 for CPU instances)."""

    name: str
    kind: str
    device_id: int


@dataclass(frozen=True)
class QueuePolicy:
    """How long a request may wait in a batcher's queue, and what happens after that."""

    timeout_action: Literal["REJECT", "DELAY"] = "REJECT"
    default_timeout_microseconds: int = 0  # 0: no timeout
    allow_timeout_override: bool = False
    max_queue_size: int = 0  # 0: unbounded


@dataclass(frozen=True)
class DynamicBatchingConfig:
    preferred_batch_sizes: tuple[int, ...]
    max_queue_delay_microseconds: int
    preserve_ordering: bool
    priority_levels: int  # 0: one queue, no priorities
    default_priority_level: int
    default_queue_policy: QueuePolicy
    priority_queue_policies: Mapping[int, QueuePolicy]


@dataclass(frozen=True)
class EnsembleStep:
    """One step of an ensemble: ``input_map`` maps the step model's input names to ensemble
    tensors, ``output_map`` its output names to ensemble tensors."""

    model_name: str
    model_version: int  # -1: the latest version
    input_map: Mapping[str, str]
    output_map: Mapping[str, str]


@dataclass(frozen=True, eq=False)
class ModelConfig:
    """A model's configuration, completed with defaults and validated.

    ``proto`` is the completed protobuf message (read it, do not change it); ``path`` is the
    model directory and ``config_file`` the ``config.pbtxt`` it came from (``None`` when the
    model has none or the configuration was given as an override). ``warnings`` list accepted
    settings that have no effect.
    """

    name: str
    platform: str
    backend: str
    runtime: str
    max_batch_size: int
    inputs: tuple[TensorConfig, ...]
    outputs: tuple[TensorConfig, ...]
    instance_groups: tuple[InstanceGroupConfig, ...]
    version_policy: VersionPolicy
    default_model_filename: str
    parameters: Mapping[str, str]
    decoupled: bool
    dynamic_batching: DynamicBatchingConfig | None
    sequence_batching: SequenceBatchingConfig | None
    ensemble_steps: tuple[EnsembleStep, ...]
    response_cache: bool
    proto: pb.ModelConfig
    path: Path
    config_file: Path | None = None
    warnings: tuple[str, ...] = ()

    @property
    def is_ensemble(self) -> bool:
        return self.platform == ENSEMBLE_PLATFORM

    def instance_names(self) -> Iterator[InstanceSpec]:
        """The instances to create, in Triton's order and with Triton's names.

        For each group, for each ``i`` below its count: ``<group name>_<i>`` once per device
        (each of ``gpus`` for ``KIND_GPU``, device 0 otherwise). Groups left unnamed are named
        ``<model>_<group index>``; the group added when the configuration has none is named
        ``<model>``; so unnamed instances read ``add_sub_0_0`` or ``add_sub_0``.
        """
        for group in self.instance_groups:
            devices = group.gpus if group.kind == "KIND_GPU" else (0,)
            for index in range(group.count):
                for device in devices:
                    yield InstanceSpec(f"{group.name}_{index}", group.kind, device)


def model_config_from_proto(
    config: pb.ModelConfig,
    *,
    path: Path,
    config_file: Path | None = None,
    warnings: tuple[str, ...] = (),
) -> ModelConfig:
    """Build the typed view of a completed, validated ``config``."""
    return ModelConfig(
        name=config.name,
        platform=config.platform,
        backend=config.backend,
        runtime=config.runtime,
        max_batch_size=config.max_batch_size,
        inputs=tuple(_tensor(tensor) for tensor in config.input),
        outputs=tuple(_tensor(tensor) for tensor in config.output),
        instance_groups=tuple(_instance_group(group) for group in config.instance_group),
        version_policy=version_policy_from_proto(config.version_policy),
        default_model_filename=config.default_model_filename,
        parameters=MappingProxyType(
            {key: value.string_value for key, value in config.parameters.items()}
        ),
        decoupled=config.model_transaction_policy.decoupled,
        dynamic_batching=(
            _dynamic_batching(config.dynamic_batching)
            if config.HasField("dynamic_batching")
            else None
        ),
        sequence_batching=(
            sequence_batching_from_proto(config.sequence_batching)
            if config.HasField("sequence_batching")
            else None
        ),
        ensemble_steps=tuple(_step(step) for step in config.ensemble_scheduling.step),
        response_cache=config.response_cache.enable,
        proto=config,
        path=path,
        config_file=config_file,
        warnings=warnings,
    )


def version_policy_from_proto(policy: pb.ModelVersionPolicy) -> VersionPolicy:
    choice = policy.WhichOneof("policy_choice")
    if choice == "all":
        return ("all",)
    if choice == "specific":
        return ("specific", tuple(sorted(set(policy.specific.versions))))
    return ("latest", policy.latest.num_versions if choice == "latest" else 1)


def _tensor(tensor: pb.ModelInput | pb.ModelOutput) -> TensorConfig:
    return TensorConfig(
        name=tensor.name,
        datatype=config_dtype_to_v2(tensor.data_type),
        dims=tuple(tensor.dims),
        optional=isinstance(tensor, pb.ModelInput) and tensor.optional,
        reshape=tuple(tensor.reshape.shape) if tensor.HasField("reshape") else None,
        is_shape_tensor=tensor.is_shape_tensor,
        allow_ragged_batch=isinstance(tensor, pb.ModelInput) and tensor.allow_ragged_batch,
    )


def _instance_group(group: pb.ModelInstanceGroup) -> InstanceGroupConfig:
    return InstanceGroupConfig(
        name=group.name,
        kind=pb.ModelInstanceGroup.Kind.Name(group.kind),
        count=group.count,
        gpus=tuple(group.gpus),
        passive=group.passive,
        host_policy=group.host_policy,
    )


def _queue_policy(policy: pb.ModelQueuePolicy) -> QueuePolicy:
    action: Literal["REJECT", "DELAY"] = (
        "DELAY" if policy.timeout_action == pb.ModelQueuePolicy.DELAY else "REJECT"
    )
    return QueuePolicy(
        timeout_action=action,
        default_timeout_microseconds=policy.default_timeout_microseconds,
        allow_timeout_override=policy.allow_timeout_override,
        max_queue_size=policy.max_queue_size,
    )


def _dynamic_batching(batching: pb.ModelDynamicBatching) -> DynamicBatchingConfig:
    return DynamicBatchingConfig(
        preferred_batch_sizes=tuple(batching.preferred_batch_size),
        max_queue_delay_microseconds=batching.max_queue_delay_microseconds,
        preserve_ordering=batching.preserve_ordering,
        priority_levels=batching.priority_levels,
        default_priority_level=batching.default_priority_level,
        default_queue_policy=_queue_policy(batching.default_queue_policy),
        priority_queue_policies=MappingProxyType(
            {
                level: _queue_policy(policy)
                for level, policy in sorted(batching.priority_queue_policy.items())
            }
        ),
    )


def _step(step: pb.ModelEnsembling.Step) -> EnsembleStep:
    return EnsembleStep(
        model_name=step.model_name,
        model_version=step.model_version,
        input_map=MappingProxyType(dict(step.input_map)),
        output_map=MappingProxyType(dict(step.output_map)),
    )


__all__ = [
    "DynamicBatchingConfig",
    "EnsembleStep",
    "InstanceGroupConfig",
    "InstanceSpec",
    "ModelConfig",
    "QueuePolicy",
    "TensorConfig",
    "VersionPolicy",
    "model_config_from_proto",
    "version_policy_from_proto",
]
