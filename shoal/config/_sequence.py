"""Validation of ``sequence_batching``: control tensors, implicit state and strategy."""

from __future__ import annotations

from shoal.protos import model_config_pb2 as pb

from ._checks import check_dims, check_preferred_sizes
from .errors import ConfigError, FieldPath

_Control = pb.ModelSequenceBatching.Control
_BOOLEAN_KINDS = (
    _Control.CONTROL_SEQUENCE_START,
    _Control.CONTROL_SEQUENCE_END,
    _Control.CONTROL_SEQUENCE_READY,
)
CORRID_DATA_TYPES = (pb.TYPE_UINT64, pb.TYPE_INT64, pb.TYPE_UINT32, pb.TYPE_INT32, pb.TYPE_STRING)
_WHERE: FieldPath = ("sequence_batching",)


def validate_sequence_batching(
    batching: pb.ModelSequenceBatching, max_batch_size: int, name: str
) -> None:
    """Raise :class:`ConfigError` for the first problem in ``batching`` of model ``name``."""
    model = f"model '{name}'"
    _check_control_inputs(batching, model, name)
    _check_controls(batching, model, name)
    for index, state in enumerate(batching.state):
        _check_state(state, model, (*_WHERE, "state", index))
    if batching.HasField("oldest"):
        check_preferred_sizes(
            batching.oldest.preferred_batch_size,
            max_batch_size,
            model,
            "sequence_batching oldest",
            (*_WHERE, "oldest", "preferred_batch_size"),
        )


def _check_controls(batching: pb.ModelSequenceBatching, model: str, name: str) -> None:
    """Each control is well formed, and each kind has one tensor."""
    seen_kinds: dict[int, str] = {}
    for index, control_input in enumerate(batching.control_input):
        for position, control in enumerate(control_input.control):
            where = (*_WHERE, "control_input", index, "control", position)
            kind = _Control.Kind.Name(control.kind)
            label = f"{kind} control '{control_input.name}' of {model}"
            if control.kind in seen_kinds:
                raise ConfigError(
                    f"{model} has two {kind} control tensors "
                    f"('{seen_kinds[control.kind]}' and '{control_input.name}'): keep one",
                    field_path=where,
                    triton=f"sequence batching specifies multiple {kind} tensors for {name}",
                )
            seen_kinds[control.kind] = control_input.name
            _check_control(control, label, where, f"for {kind} for {name}")


def _check_control_inputs(batching: pb.ModelSequenceBatching, model: str, name: str) -> None:
    names: set[str] = set()
    for index, control_input in enumerate(batching.control_input):
        where = (*_WHERE, "control_input", index)
        if not control_input.name:
            raise ConfigError(
                f"sequence_batching control_input {index} of {model} has no name: add the name "
                "of the model input that receives the control",
                field_path=where,
            )
        if control_input.name in names:
            raise ConfigError(
                f"sequence_batching control tensor '{control_input.name}' of {model} is listed "
                "in more than one control_input: use one tensor per control",
                field_path=where,
                triton=f"sequence batching control tensor '{control_input.name}' is specified "
                f"for multiple control kinds for {name}",
            )
        names.add(control_input.name)
        if not control_input.control:
            raise ConfigError(
                f"sequence_batching control_input '{control_input.name}' of {model} has no "
                "control: add control [ { kind: CONTROL_SEQUENCE_START ... } ]",
                field_path=where,
            )


def _check_control(
    control: pb.ModelSequenceBatching.Control, label: str, where: FieldPath, suffix: str
) -> None:
    lists = {
        "int32_false_true": len(control.int32_false_true),
        "fp32_false_true": len(control.fp32_false_true),
        "bool_false_true": len(control.bool_false_true),
    }
    given = [name for name, size in lists.items() if size]
    if control.kind == _Control.CONTROL_SEQUENCE_CORRID:
        _check_corrid_control(control, given, label, where)
        return
    if len(given) != 1 or lists[given[0]] != 2:
        raise ConfigError(
            f"{label} must give exactly one of int32_false_true, fp32_false_true or "
            "bool_false_true, with two values: the false value then the true value "
            "(e.g. int32_false_true: [ 0, 1 ])",
            field_path=where,
            triton="sequence batching must specify either 'int32_false_true', 'fp32_false_true' "
            f"or 'bool_false_true' {suffix}",
        )


def _check_corrid_control(
    control: pb.ModelSequenceBatching.Control, given: list[str], label: str, where: FieldPath
) -> None:
    if given:
        raise ConfigError(
            f"{label} sets {given[0]}, which a correlation-id control does not use: "
            "remove it and set data_type",
            field_path=where,
        )
    if control.data_type not in CORRID_DATA_TYPES:
        raise ConfigError(
            f"{label} has data_type {pb.DataType.Name(control.data_type)}: a correlation-id "
            "control must be TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 or TYPE_STRING",
            field_path=(*where, "data_type"),
        )


def _check_state(state: pb.ModelSequenceBatching.State, model: str, where: FieldPath) -> None:
    if not state.input_name or not state.output_name:
        raise ConfigError(
            f"sequence_batching state {where[-1]} of {model} needs both input_name and "
            "output_name (the tensors that carry the state into and out of the model)",
            field_path=where,
        )
    label = f"sequence_batching state '{state.input_name}' of {model}"
    if state.data_type == pb.TYPE_INVALID:
        raise ConfigError(f"{label} has no data_type: add one", field_path=(*where, "data_type"))
    if not state.dims:
        raise ConfigError(f"{label} has no dims: add dims", field_path=(*where, "dims"))
    check_dims(state.dims, f"{label} has dims", (*where, "dims"))
    for index, initial in enumerate(state.initial_state):
        _check_initial_state(initial, state, label, (*where, "initial_state", index))


def _check_initial_state(
    initial: pb.ModelSequenceBatching.InitialState,
    state: pb.ModelSequenceBatching.State,
    label: str,
    at: FieldPath,
) -> None:
    name = initial.name or str(at[-1])
    if initial.WhichOneof("state_data") is None:
        raise ConfigError(
            f"initial_state '{name}' of {label} gives no data: set zero_data: true or data_file",
            field_path=at,
        )
    if initial.data_type != state.data_type:
        raise ConfigError(
            f"initial_state '{name}' of {label} has data_type "
            f"{pb.DataType.Name(initial.data_type)} but the state is "
            f"{pb.DataType.Name(state.data_type)}: make them equal",
            field_path=(*at, "data_type"),
        )
    check_dims(initial.dims, f"initial_state '{name}' of {label} has dims", (*at, "dims"))


__all__ = ["CORRID_DATA_TYPES", "validate_sequence_batching"]
