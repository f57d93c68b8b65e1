"""Defaults filled into a parsed ModelConfig the way Triton fills them before validation.

Triton completes every configuration before it validates and serves it (``GET .../config``
shows the completed form, and Python models receive it in ``args["model_config"]``):

* ``name`` is the model directory's name when the configuration leaves it out.
* ``backend`` and ``platform`` are paired for the backends shoal knows (``onnxruntime`` /
  ``onnxruntime_onnx``, ``pytorch`` / ``pytorch_libtorch``); ``python`` has no platform.
* ``version_policy`` is ``latest { num_versions: 1 }``.
* ``default_model_filename`` is ``model.py``, ``model.onnx`` or ``model.pt`` for those backends.
* ``dynamic_batching.preferred_batch_size`` is ``[max_batch_size]`` when empty and batching is on.
* ``sequence_batching.max_sequence_idle_microseconds`` is 1 000 000 (one second) when 0.
* Non-ensemble models get ``optimization { input_pinned_memory { enable: true }
  output_pinned_memory { enable: true } }`` unless set, and their instance groups completed:
  one group named after the model when there is none; a group without a name is
  ``<model>_<group index>``; ``KIND_AUTO`` becomes ``KIND_GPU`` when GPUs are available (and every
  listed GPU is one of them), else ``KIND_CPU``; ``KIND_GPU`` without ``gpus`` gets every available
  GPU; a count of 0 becomes 1 (2 for ``KIND_CPU`` on the onnxruntime and tensorflow backends).
"""

from __future__ import annotations

from collections.abc import Sequence

from shoal.protos import model_config_pb2 as pb

from .errors import ConfigError

ENSEMBLE_PLATFORM = "ensemble"
SEQUENCE_IDLE_DEFAULT_MICROSECONDS = 1_000_000

#: platform -> backend, for the platforms whose backend Triton fills in.
PLATFORM_BACKENDS: dict[str, str] = {
    "onnxruntime_onnx": "onnxruntime",
    "pytorch_libtorch": "pytorch",
    "tensorflow_graphdef": "tensorflow",
    "tensorflow_savedmodel": "tensorflow",
    "tensorrt_plan": "tensorrt",
}
_BACKEND_PLATFORMS: dict[str, str] = {
    "onnxruntime": "onnxruntime_onnx",
    "pytorch": "pytorch_libtorch",
}
#: backend -> the file a version directory holds when default_model_filename is not set.
DEFAULT_MODEL_FILENAMES: dict[str, str] = {
    "python": "model.py",
    "onnxruntime": "model.onnx",
    "pytorch": "model.pt",
}
_FILENAME_BACKENDS = {name: backend for backend, name in DEFAULT_MODEL_FILENAMES.items()}
_MULTI_CPU_INSTANCE_BACKENDS = frozenset({"onnxruntime", "tensorflow"})
_Kind = pb.ModelInstanceGroup


def fill_defaults(
    config: pb.ModelConfig,
    *,
    model_name: str,
    gpus: Sequence[int] = (),
    detected_backend: str | None = None,
) -> None:
    """Complete ``config`` in place for the model in directory ``model_name``.

    ``gpus`` are the GPU ids this server may use; ``detected_backend`` is the backend found from
    the model's files, used only when the configuration names neither backend nor platform.
    Raises :class:`ConfigError` when the configuration names a different model, or an instance
    group has a negative count.
    """
    _fill_name(config, model_name)
    _fill_backend(config, detected_backend)
    _fill_version_policy(config)
    _fill_model_filename(config)
    _fill_dynamic_batching(config)
    _fill_sequence_batching(config)
    if config.platform != ENSEMBLE_PLATFORM and not config.HasField("ensemble_scheduling"):
        _fill_optimization(config)
        _fill_instance_groups(config, sorted(set(gpus)))
    else:  # Triton serves an ensemble's config with model_transaction_policy { decoupled: false }
        config.model_transaction_policy.SetInParent()


def _fill_name(config: pb.ModelConfig, model_name: str) -> None:
    if not config.name:
        config.name = model_name
    elif config.name != model_name:
        raise ConfigError(
            f"the configuration names the model '{config.name}' but its directory is "
            f"'{model_name}': the name must equal the directory name; change name to "
            f'"{model_name}" (or remove the name line), or rename the directory to '
            f"'{config.name}'",
            field_path=("name",),
        )


def _fill_backend(config: pb.ModelConfig, detected_backend: str | None) -> None:
    if not config.backend and not config.platform and detected_backend:
        config.backend = detected_backend
    # Triton's custom-backend naming: a model named "<anything>.<backend>" runs on <backend>,
    # only where the config says nothing of its backend, platform or file
    custom = not (config.backend or config.platform or config.default_model_filename)
    if custom and "." in config.name:
        config.backend = config.name.split(".", 1)[1]
        config.default_model_filename = f"model.{config.backend}"
    if not config.backend and config.platform in PLATFORM_BACKENDS:
        config.backend = PLATFORM_BACKENDS[config.platform]
    # Triton's auto-complete: a default_model_filename of a backend's model file names it
    if not config.backend and config.platform not in PLATFORM_BACKENDS:
        config.backend = _FILENAME_BACKENDS.get(config.default_model_filename, "")
    if not config.platform and config.backend in _BACKEND_PLATFORMS:
        config.platform = _BACKEND_PLATFORMS[config.backend]


def _fill_version_policy(config: pb.ModelConfig) -> None:
    if not config.HasField("version_policy"):
        config.version_policy.latest.num_versions = 1


def _fill_model_filename(config: pb.ModelConfig) -> None:
    if not config.default_model_filename:
        config.default_model_filename = DEFAULT_MODEL_FILENAMES.get(config.backend, "")


def _fill_dynamic_batching(config: pb.ModelConfig) -> None:
    if config.HasField("dynamic_batching"):
        batching = config.dynamic_batching
        if not batching.preferred_batch_size and config.max_batch_size > 0:
            batching.preferred_batch_size.append(config.max_batch_size)


def _fill_sequence_batching(config: pb.ModelConfig) -> None:
    if config.HasField("sequence_batching"):
        sequence = config.sequence_batching
        if sequence.max_sequence_idle_microseconds == 0:
            sequence.max_sequence_idle_microseconds = SEQUENCE_IDLE_DEFAULT_MICROSECONDS


def _fill_optimization(config: pb.ModelConfig) -> None:
    optimization = config.optimization
    if not optimization.HasField("input_pinned_memory"):
        optimization.input_pinned_memory.enable = True
    if not optimization.HasField("output_pinned_memory"):
        optimization.output_pinned_memory.enable = True


def _fill_instance_groups(config: pb.ModelConfig, gpus: list[int]) -> None:
    if not config.instance_group:
        config.instance_group.add(name=config.name)
    for index, group in enumerate(config.instance_group):
        if group.count < 0:
            raise ConfigError(
                f"instance group {index} of model '{config.name}' has count {group.count}: "
                "the count must be 1 or more (leave it out for the default)",
                field_path=("instance_group", index, "count"),
            )
        if not group.name:
            group.name = f"{config.name}_{index}"
        _fill_kind(group, gpus)
        _fill_count(group, config.backend)
        if group.kind == _Kind.KIND_GPU and not group.gpus:
            group.gpus.extend(gpus)


def _fill_kind(group: pb.ModelInstanceGroup, gpus: list[int]) -> None:
    """KIND_AUTO: on the GPUs when the server has every one the group names, else on the CPU."""
    if group.kind == _Kind.KIND_AUTO:
        on_gpu = bool(gpus) and all(gpu in gpus for gpu in group.gpus)
        group.kind = _Kind.KIND_GPU if on_gpu else _Kind.KIND_CPU


def _fill_count(group: pb.ModelInstanceGroup, backend: str) -> None:
    if group.count == 0:
        many = group.kind == _Kind.KIND_CPU and backend in _MULTI_CPU_INSTANCE_BACKENDS
        group.count = 2 if many else 1


__all__ = [
    "DEFAULT_MODEL_FILENAMES",
    "ENSEMBLE_PLATFORM",
    "PLATFORM_BACKENDS",
    "SEQUENCE_IDLE_DEFAULT_MICROSECONDS",
    "fill_defaults",
]
