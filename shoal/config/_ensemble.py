"""Validation of ensembles: the steps and the flow of tensors from inputs to outputs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from shoal.protos import model_config_pb2 as pb

from .defaults import ENSEMBLE_PLATFORM
from .errors import ConfigError, FieldPath

_STEPS: FieldPath = ("ensemble_scheduling", "step")


@dataclass
class _Tensor:
    producer: int | None = None  # index of the step whose output_map writes it
    consumers: list[int] = field(default_factory=list)
    ready: bool = False


def validate_ensemble(config: pb.ModelConfig, model: str) -> None:
    """Raise :class:`ConfigError` for the first problem in an ensemble's configuration."""
    _check_shape(config, model)
    tensors = _build_graph(config.ensemble_scheduling.step, model, config.name)
    _check_flow(config, tensors, model)


def _check_shape(config: pb.ModelConfig, model: str) -> None:
    _check_ensemble_scheduling(config, model)
    triton = {
        "instance_group": "instance group should not be specified",
        "optimization": "optimization should not be specified",
        "model_warmup": "model_warmup can not be specified",
    }
    for name, words in triton.items():
        present = config.HasField(name) if name == "optimization" else bool(getattr(config, name))
        if present:
            raise ConfigError(
                f"{model} is an ensemble and cannot have {name}: remove it (each step's model "
                "has its own)",
                field_path=(name,),
                triton=f"{words} for ensemble '{config.name}'",
            )


def _check_ensemble_scheduling(config: pb.ModelConfig, model: str) -> None:
    """The ensemble platform goes with steps in ``ensemble_scheduling``, and they with it."""
    if config.platform != ENSEMBLE_PLATFORM:
        raise ConfigError(
            f"{model} has ensemble_scheduling but platform '{config.platform}': set "
            'platform: "ensemble" (and no backend) or remove ensemble_scheduling',
            field_path=("platform",) if config.platform else ("ensemble_scheduling",),
            triton=f"ensemble scheduling cannot be set for model '{config.name}' whose platform "
            "is not ensemble",
        )
    if not config.HasField("ensemble_scheduling"):
        raise ConfigError(
            f'{model} has platform "ensemble" but no ensemble_scheduling: add '
            "ensemble_scheduling { step [ ... ] } with the steps to run",
            field_path=("platform",),
            triton=f"ensemble scheduling must be set for ensemble {config.name} whose platform "
            "is ensemble",
        )
    if not config.ensemble_scheduling.step:
        raise ConfigError(
            f"{model} is an ensemble without steps: add step [ ... ] to ensemble_scheduling",
            field_path=("ensemble_scheduling",),
            triton=f"must specify 'step' for ensemble '{config.name}'",
        )


def _build_graph(
    steps: Sequence[pb.ModelEnsembling.Step], model: str, name: str
) -> dict[str, _Tensor]:
    tensors: dict[str, _Tensor] = {}
    for index, step in enumerate(steps):
        where = (*_STEPS, index)
        for part in ("model_name", "input_map", "output_map"):
            if not getattr(step, part):
                raise ConfigError(
                    f"step {index} of ensemble {model} has no {part}: add it",
                    field_path=where,
                    triton=f"must specify '{part}' in step {index} of ensemble '{name}'",
                )
        # Triton adds a step's outputs to the graph before its inputs
        _add_outputs(tensors, step, index, model, name)
        for tensor_name in step.input_map.values():
            tensors.setdefault(tensor_name, _Tensor()).consumers.append(index)
    return tensors


def _add_outputs(
    tensors: dict[str, _Tensor], step: pb.ModelEnsembling.Step, index: int, model: str, name: str
) -> None:
    for tensor_name in step.output_map.values():
        tensor = tensors.setdefault(tensor_name, _Tensor())
        if tensor.producer is not None:
            raise ConfigError(
                f"ensemble tensor '{tensor_name}' of {model} is written by steps "
                f"{tensor.producer} and {index}: each tensor must have one producer; rename "
                "one of them in output_map",
                field_path=(*_STEPS, index, "output_map"),
                triton=f"ensemble tensor '{tensor_name}' can appear in an output map only once "
                f"for ensemble '{name}' step {index}",
            )
        tensor.producer = index


def _check_flow(config: pb.ModelConfig, tensors: dict[str, _Tensor], model: str) -> None:
    _check_inputs_used(config, tensors, model)
    _propagate(config.ensemble_scheduling.step, tensors)
    for index, model_output in enumerate(config.output):
        if model_output.name not in tensors:
            raise ConfigError(
                f"ensemble output '{model_output.name}' of {model} is not written by any step: "
                "map a step's output to it in output_map",
                field_path=("output", index),
                triton=f"ensemble output '{model_output.name}' for ensemble {config.name}' is "
                "not used",
            )
        if not tensors[model_output.name].ready:
            _not_written(config, tensors, model_output.name, model)
    outputs = {model_output.name for model_output in config.output}
    for name, tensor in tensors.items():
        if name not in outputs:
            _check_tensor(name, tensor, model, config.name)


def _not_written(
    config: pb.ModelConfig, tensors: dict[str, _Tensor], output: str, model: str
) -> None:
    """Triton's words for an output no step can compute, naming the first tensor upstream that
    nothing connects."""
    steps = config.ensemble_scheduling.step
    source, seen = output, {output}
    while (producer := tensors[source].producer) is not None:
        missing = [
            name
            for name in steps[producer].input_map.values()
            if not tensors[name].ready and name not in seen
        ]
        if not missing:
            break
        source = missing[0]
        seen.add(source)
    words = f"output '{output}' for ensemble '{config.name}' is not written"
    if source != output:
        words += f": at least one of its depending tensors, '{source}', is not connected"
    raise ConfigError(
        f"ensemble output '{output}' of {model} cannot be computed: '{source}' is neither an "
        "ensemble input nor written by a step that can run (check the names in input_map and "
        "output_map)",
        field_path=("output", [o.name for o in config.output].index(output)),
        triton=words,
    )


def _check_inputs_used(config: pb.ModelConfig, tensors: dict[str, _Tensor], model: str) -> None:
    """Every ensemble input feeds a step; each is ready from the start."""
    for index, model_input in enumerate(config.input):
        if model_input.name not in tensors or not tensors[model_input.name].consumers:
            raise ConfigError(
                f"ensemble input '{model_input.name}' of {model} is not used by any step: map it "
                "in a step's input_map or remove the input",
                field_path=("input", index),
                triton=f"ensemble input '{model_input.name}' for ensemble {config.name}' is not "
                "used",
            )
        tensors[model_input.name].ready = True


def _check_tensor(name: str, tensor: _Tensor, model: str, ensemble: str) -> None:
    """A tensor that is not an ensemble output can be computed, and someone reads it."""
    triton = f"ensemble tensor '{name}' is unused in ensemble '{ensemble}'"
    if not tensor.ready:
        step = tensor.consumers[0] if tensor.producer is None else tensor.producer
        raise ConfigError(
            f"ensemble tensor '{name}' of {model} cannot be computed: step {step} needs it "
            "but it is neither an ensemble input nor written by a step that can run (check "
            "the names in input_map and output_map)",
            field_path=(*_STEPS, step),
            triton=triton,
        )
    if not tensor.consumers:
        raise ConfigError(
            f"ensemble tensor '{name}' of {model} is written by step {tensor.producer} but "
            "no step reads it and it is not an ensemble output: use it or remove it from "
            "output_map",
            field_path=(*_STEPS, tensor.producer or 0, "output_map"),
            triton=triton,
        )


def _propagate(steps: Sequence[pb.ModelEnsembling.Step], tensors: dict[str, _Tensor]) -> None:
    """Mark every tensor that can be computed from the ensemble inputs as ready."""
    pending = set(range(len(steps)))
    progress = True
    while progress:
        progress = False
        for index in sorted(pending):
            if all(tensors[name].ready for name in steps[index].input_map.values()):
                for name in steps[index].output_map.values():
                    tensors[name].ready = True
                pending.discard(index)
                progress = True


__all__ = ["validate_ensemble"]
