"""Checks on a completed ModelConfig; each failure says what to change.

The checks follow Triton's (so a configuration Triton rejects is rejected here too), with
messages that name the model, the field and the fix. Run them after :func:`fill_defaults`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from shoal.protos import model_config_pb2 as pb

from ._batch_io import check_batch_io
from ._checks import WILDCARD_DIM, check_dims, check_preferred_sizes, shape_text
from ._ensemble import validate_ensemble
from ._sequence import validate_sequence_batching
from ._warmup import validate_warmup
from .defaults import ENSEMBLE_PLATFORM, PLATFORM_BACKENDS
from .errors import ConfigError, FieldPath

_Kind = pb.ModelInstanceGroup
#: The backends Triton pairs with platforms (``GetBackendType``): backend -> its platforms.
_KNOWN_BACKENDS = {
    backend: " or ".join(sorted(f"'{p}'" for p, b in PLATFORM_BACKENDS.items() if b == backend))
    for backend in sorted(set(PLATFORM_BACKENDS.values()))
}
_Tensor = pb.ModelInput | pb.ModelOutput


def validate_config(config: pb.ModelConfig, *, gpus: Sequence[int] = ()) -> list[str]:
    """Raise :class:`ConfigError` for the first problem in ``config``; return warnings.

    ``gpus`` are the GPU ids this server may use (instance groups may only name those). The
    returned warnings describe settings that are accepted but have no effect.
    """
    model = f"model '{config.name}'"
    _check_backend(config, model)
    _check_max_batch_size(config, model)
    _check_tensors(config.input, "input", config.max_batch_size, config.name)
    _check_tensors(config.output, "output", config.max_batch_size, config.name)
    check_batch_io(config)
    _check_version_policy(config.version_policy, model)
    warnings = _check_dynamic_batching(config, model)
    _check_model_metrics(config.model_metrics, model)
    if config.HasField("sequence_batching"):
        validate_sequence_batching(config.sequence_batching, config.max_batch_size, config.name)
    if config.HasField("ensemble_scheduling") or config.platform == ENSEMBLE_PLATFORM:
        validate_ensemble(config, model)
        if config.ensemble_scheduling.max_inflight_requests:
            warnings.append(
                f"{model} sets ensemble_scheduling max_inflight_requests "
                f"{config.ensemble_scheduling.max_inflight_requests}, which shoal accepts with "
                "no effect: a decoupled step's responses are not held back for the later steps"
            )
    else:
        _check_instance_groups(config.instance_group, sorted(set(gpus)), config.name)
        validate_warmup(config.model_warmup, config.max_batch_size, model)
    return warnings


def _check_model_metrics(metrics: pb.ModelMetrics, model: str) -> None:
    """Triton's ValidateModelMetrics, its words first (clients match them)."""
    for index, control in enumerate(metrics.metric_control):
        where: FieldPath = ("model_metrics", "metric_control", index)
        problem = ""
        if not control.HasField("metric_identifier"):
            problem = "metric control must specify 'metric_identifier'"
        elif not control.metric_identifier.family:
            problem = "metric identifier must specify non-empty 'family'"
        elif not control.HasField("histogram_options"):
            problem = "metric control must specify 'histogram_options'"
        elif not control.histogram_options.buckets:
            problem = "histogram options must specify non-empty 'buckets'"
        if problem:
            raise ConfigError(
                f"{problem} ({model}, model_metrics metric_control {index}): give "
                'metric_identifier { family: "nv_inference_first_response_histogram_ms" } '
                "and histogram_options { buckets: [...] } with one bound or more",
                field_path=where,
            )


def _check_max_batch_size(config: pb.ModelConfig, model: str) -> None:
    if config.max_batch_size < 0:
        raise ConfigError(
            f"{model} has max_batch_size {config.max_batch_size}: use 0 for a model that does "
            "not batch, or the largest batch it accepts",
            field_path=("max_batch_size",),
            triton=f"'max_batch_size' must be non-negative value for {config.name}",
        )


def _check_backend(config: pb.ModelConfig, model: str) -> None:
    if not config.backend and not config.platform:
        raise ConfigError(
            f'{model} does not say what runs it: add backend: "python" (for a model.py) to '
            'its config.pbtxt, or platform: "ensemble" for an ensemble',
            field_path=("backend",),
            triton=f"Invalid model name: Could not determine backend for model '{config.name}' "
            "with no backend in model configuration. Expected model name of the form "
            "'model.<backend_name>'.",
        )
    platform_backend = PLATFORM_BACKENDS.get(config.platform)
    if config.platform == ENSEMBLE_PLATFORM and config.backend:
        raise ConfigError(
            f"{model} is an ensemble and names backend '{config.backend}': remove the backend "
            "(each step's model has its own)",
            field_path=("backend",),
            triton=f"Ensemble model '{config.name}' must have platform type 'ensemble' and "
            "empty backend type",
        )
    if not config.backend and config.platform != ENSEMBLE_PLATFORM:
        raise ConfigError(
            f"unexpected platform type '{config.platform}' for {config.name}: {model} names "
            f"no backend and no platform shoal knows; known platforms: "
            f"{', '.join(sorted([*PLATFORM_BACKENDS, ENSEMBLE_PLATFORM]))}",
            field_path=("platform",),
        )
    # Triton's rule: a backend it knows must match the platform; any other backend (python, a
    # python-based one) takes any platform.
    if config.backend in _KNOWN_BACKENDS and platform_backend != config.backend:
        raise ConfigError(
            f"unexpected 'platform' and 'backend' pair, got:{config.platform}, {config.backend}: "
            f"the backend '{config.backend}' of {model} goes with platform "
            f"{_KNOWN_BACKENDS[config.backend]}",
            field_path=("platform",),
        )


def _check_tensors(tensors: Iterable[_Tensor], kind: str, max_batch_size: int, name: str) -> None:
    model = f"model '{name}'"
    seen: dict[str, int] = {}
    for index, tensor in enumerate(tensors):
        where: FieldPath = (kind, index)
        _check_named(tensor, kind, index, model)
        label = f"{kind} '{tensor.name}' of {model}"
        if tensor.name in seen:
            raise ConfigError(
                f"{label} is declared twice ({kind}s {seen[tensor.name]} and {index}): "
                f"give each {kind} its own name or remove one",
                field_path=where,
            )
        seen[tensor.name] = index
        words = _TritonWords(f"model {kind} '{tensor.name}' ", f" for {name}")
        _check_tensor(tensor, label, max_batch_size, where, words)


def _check_named(tensor: _Tensor, kind: str, index: int, model: str) -> None:
    if not tensor.name:
        raise ConfigError(
            f'{kind} {index} of {model} has no name: add name: "..." to it',
            field_path=(kind, index),
        )


class _TritonWords:
    """Triton's message for a tensor: ``model input 'NAME' <problem> for MODEL``."""

    def __init__(self, prefix: str, suffix: str) -> None:
        self.prefix = prefix
        self.suffix = suffix

    def __call__(self, problem: str) -> str:
        return f"{self.prefix}{problem}{self.suffix}"


_DIM_RULE = "must be integer >= 1, or -1 to indicate a variable-size dimension"


def _check_tensor(
    tensor: _Tensor, label: str, max_batch_size: int, where: FieldPath, words: _TritonWords
) -> None:
    if tensor.data_type == pb.TYPE_INVALID:
        raise ConfigError(
            f"{label} has no data_type: add data_type: TYPE_FP32 (or the type it carries; "
            "TYPE_STRING for BYTES)",
            field_path=(*where, "data_type"),
            triton=words("must specify 'data_type'"),
        )
    if not tensor.dims:
        raise ConfigError(
            f"{label} has no dims: add dims: [ ... ] (use [ 1 ] for one value per batch item, "
            "-1 for a variable-size dimension)",
            field_path=(*where, "dims"),
            triton=words("must specify 'dims'"),
        )
    if tensor.HasField("reshape") and not tensor.reshape.shape and max_batch_size == 0:
        raise ConfigError(
            f"{label} has an empty reshape, which a model without batching cannot use (the "
            "tensor would hold no data): remove the reshape or set max_batch_size",
            field_path=(*where, "reshape"),
            triton=words(
                "cannot have empty reshape for non-batching model as scalar tensors are not "
                "supported"
            ),
        )
    check_dims(tensor.dims, f"{label} has dims", (*where, "dims"), words(f"dimension {_DIM_RULE}"))
    if tensor.HasField("reshape"):
        _check_reshape(tensor, label, (*where, "reshape"), words)
    if isinstance(tensor, pb.ModelInput):
        _check_format(tensor, label, where)


def _check_format(tensor: pb.ModelInput, label: str, where: FieldPath) -> None:
    if tensor.format != pb.ModelInput.FORMAT_NONE and len(tensor.dims) != 3:
        raise ConfigError(
            f"{label} has format {pb.ModelInput.Format.Name(tensor.format)}, which needs "
            f"exactly 3 dims, but has {shape_text(tensor.dims)}: fix dims or use FORMAT_NONE",
            field_path=(*where, "format"),
        )


def _check_reshape(tensor: _Tensor, label: str, where: FieldPath, words: _TritonWords) -> None:
    shape = tensor.reshape.shape
    check_dims(
        shape, f"{label} has reshape", (*where, "shape"), words(f"reshape dimensions {_DIM_RULE}")
    )
    dims_chunks, reshape_chunks = _chunk_counts(tensor.dims), _chunk_counts(shape)
    if dims_chunks != reshape_chunks:
        both_variable = len(dims_chunks) > 1 and len(reshape_chunks) > 1
        problem = (
            "has different number of variable-size dimensions for dims and reshape"
            if both_variable and len(dims_chunks) != len(reshape_chunks)
            else "has different size for dims and reshape"
        )
        raise ConfigError(
            f"{label} has dims {shape_text(tensor.dims)} and reshape {shape_text(shape)}, which "
            "hold different numbers of elements: the reshape must keep the element count (and "
            "the same -1 dimensions between equal-sized runs of fixed ones)",
            field_path=where,
            triton=words(problem),
        )


def _chunk_counts(dims: Sequence[int]) -> list[int]:
    """Element counts of the runs of fixed dimensions between variable (-1) ones."""
    counts = [1]
    for dim in dims:
        if dim == WILDCARD_DIM:
            counts.append(1)
        else:
            counts[-1] *= dim
    return counts


def _check_version_policy(policy: pb.ModelVersionPolicy, model: str) -> None:
    choice = policy.WhichOneof("policy_choice")
    if choice == "latest" and policy.latest.num_versions < 1:
        raise ConfigError(
            f"{model} has version_policy latest with num_versions 0: serve at least one "
            "version (num_versions: 1)",
            field_path=("version_policy", "latest", "num_versions"),
        )
    if choice == "specific":
        versions = list(policy.specific.versions)
        if not versions or min(versions) < 0:
            raise ConfigError(
                f"{model} has version_policy specific with versions {versions}: list the "
                "version numbers (directory names, 0 or more) to serve",
                field_path=("version_policy", "specific", "versions"),
            )


def _check_dynamic_batching(config: pb.ModelConfig, model: str) -> list[str]:
    if not config.HasField("dynamic_batching"):
        return []
    batching = config.dynamic_batching
    where: FieldPath = ("dynamic_batching",)
    check_preferred_sizes(
        batching.preferred_batch_size,
        config.max_batch_size,
        model,
        "dynamic_batching",
        (*where, "preferred_batch_size"),
    )
    _check_priorities(batching, config.name, where)
    if batching.preserve_ordering:
        _check_ordering(batching, config.name, where)
    if config.max_batch_size == 0:
        return [
            f"{model} has dynamic_batching but max_batch_size 0, so requests are queued and "
            "run one at a time, never batched: set max_batch_size to batch them"
        ]
    return []


def _check_priorities(batching: pb.ModelDynamicBatching, name: str, where: FieldPath) -> None:
    levels = batching.priority_levels
    if levels == 0:
        return
    model = f"model '{name}'"
    if not 1 <= batching.default_priority_level <= levels:
        raise ConfigError(
            f"{model} has dynamic_batching default_priority_level "
            f"{batching.default_priority_level}: with priority_levels {levels} it must be "
            f"between 1 and {levels}",
            field_path=(*where, "default_priority_level"),
            triton=f"default priority level must be in range [1, {levels}] for {name}",
        )
    for level in batching.priority_queue_policy:
        if not 1 <= level <= levels:
            raise ConfigError(
                f"{model} has a dynamic_batching priority_queue_policy for level {level}: with "
                f"priority_levels {levels} the levels are 1 to {levels}",
                field_path=(*where, "priority_queue_policy"),
                triton=f"priority queue policy must have priority level in range [1, {levels}] "
                f"for {name}",
            )


def _check_ordering(batching: pb.ModelDynamicBatching, name: str, where: FieldPath) -> None:
    model = f"model '{name}'"
    if batching.priority_levels > 1:
        raise ConfigError(
            f"{model} has dynamic_batching preserve_ordering with priority_levels "
            f"{batching.priority_levels}: responses can keep request order only with one "
            "priority level; remove one of the two",
            field_path=(*where, "preserve_ordering"),
            triton="Only one priority level is allowed when 'preserve_ordering' is true for "
            + name,
        )
    policies = [batching.default_queue_policy, *batching.priority_queue_policy.values()]
    for policy in policies:
        if policy.default_timeout_microseconds and policy.timeout_action == policy.DELAY:
            raise ConfigError(
                f"{model} has dynamic_batching preserve_ordering with a queue policy whose "
                "timeout_action is DELAY: delayed requests would reorder responses; use REJECT "
                "or remove preserve_ordering",
                field_path=(*where, "preserve_ordering"),
                triton="Queue policy can not have DELAY as timeout action when "
                f"'preserve_ordering' is true for {name}",
            )


def _check_instance_groups(
    groups: Iterable[pb.ModelInstanceGroup], gpus: list[int], name: str
) -> None:
    for index, group in enumerate(groups):
        where: FieldPath = ("instance_group", index)
        label = f"instance group '{group.name}' of model '{name}'"
        triton = f"instance group {group.name} of model {name}"
        kind = _Kind.Kind.Name(group.kind)
        if group.kind == _Kind.KIND_GPU:
            _check_gpus(group, gpus, label, where, triton)
        elif group.gpus:
            raise ConfigError(
                f"{label} has kind {kind} but lists gpus "
                f"{list(group.gpus)}: remove gpus, or use kind: KIND_GPU",
                field_path=(*where, "gpus"),
                triton=f"{triton} has kind {kind} but specifies one or more GPUs",
            )


def _check_gpus(
    group: pb.ModelInstanceGroup, gpus: list[int], label: str, where: FieldPath, triton: str
) -> None:
    """A KIND_GPU group names GPUs, each one this server may use."""
    if not group.gpus:
        raise ConfigError(
            f"{label} has kind KIND_GPU but no GPUs are available: use kind: KIND_CPU "
            "or run where a GPU is visible",
            field_path=(*where, "kind"),
        )
    for gpu in group.gpus:
        if gpu not in gpus:
            available = ", ".join(map(str, gpus)) or "none"
            raise ConfigError(
                f"{label} lists GPU {gpu}, which is not available (available GPUs: "
                f"{available}): change gpus",
                field_path=(*where, "gpus"),
                triton=f"{triton} specifies invalid or unsupported gpu id {gpu}. GPUs with at "
                "least the minimum required CUDA compute compatibility are: "
                + ", ".join(map(str, gpus)),
            )


__all__ = ["WILDCARD_DIM", "validate_config"]
