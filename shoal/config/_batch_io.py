"""Checks on ``batch_input`` and ``batch_output`` (Triton's ValidateBatchIO), with its words."""

from __future__ import annotations

from shoal.protos import model_config_pb2 as pb

from .errors import ConfigError

_INPUT_TYPES = (pb.TYPE_INT32, pb.TYPE_FP32)


def check_batch_io(config: pb.ModelConfig) -> None:
    """Raise :class:`ConfigError` for the first bad ``batch_input`` or ``batch_output``."""
    name = config.name
    inputs = {tensor.name for tensor in config.input}
    outputs = {tensor.name for tensor in config.output}
    for index, batch_input in enumerate(config.batch_input):
        where = ("batch_input", index)
        kind = pb.BatchInput.Kind.Name(batch_input.kind)
        _one_source("batch input", kind, list(batch_input.source_input), name, where)
        if batch_input.data_type not in _INPUT_TYPES:
            raise ConfigError(
                f"batch input {index} of model '{name}' has data_type "
                f"{pb.DataType.Name(batch_input.data_type)}: use TYPE_INT32 or TYPE_FP32",
                field_path=(*where, "data_type"),
                triton=f"batch input data type must be TYPE_INT32 or TYPE_FP32 for {name}",
            )
        _known_sources(list(batch_input.source_input), inputs, name, where)
    for index, batch_output in enumerate(config.batch_output):
        where = ("batch_output", index)
        kind = pb.BatchOutput.Kind.Name(batch_output.kind)
        _one_source("batch output", kind, list(batch_output.source_input), name, where)
        _known_sources(list(batch_output.source_input), inputs, name, where)
        targets: set[str] = set()
        for target in batch_output.target_name:
            if target not in outputs:
                raise ConfigError(
                    f"batch output {index} of model '{name}' targets '{target}', which is not "
                    f"one of the model's outputs ({', '.join(sorted(outputs)) or 'none'})",
                    field_path=(*where, "target_name"),
                    triton=f"unknown target output name '{target}' for {name}",
                )
            if target in targets:
                raise ConfigError(
                    f"batch output {index} of model '{name}' names target '{target}' twice: "
                    "list each output once",
                    field_path=(*where, "target_name"),
                    triton=f"target output name '{target}' can only be specified once for {name}",
                )
            targets.add(target)


def _one_source(
    what: str, kind: str, sources: list[str], name: str, where: tuple[str, int]
) -> None:
    # every kind Triton defines takes exactly one source input
    if len(sources) != 1:
        raise ConfigError(
            f"{what} {where[1]} of model '{name}' has kind {kind} and {len(sources)} "
            "source_input: give exactly one, the input it is computed from",
            field_path=(*where, "source_input"),
            triton=f"{what} kind '{kind}' expects 1 source input, got {len(sources)} for {name}",
        )


def _known_sources(sources: list[str], inputs: set[str], name: str, where: tuple[str, int]) -> None:
    for source in sources:
        if source not in inputs:
            raise ConfigError(
                f"{where[0]} {where[1]} of model '{name}' reads source_input '{source}', which "
                f"is not one of the model's inputs ({', '.join(sorted(inputs)) or 'none'})",
                field_path=(*where, "source_input"),
                triton=f"unknown source input name '{source}' for {name}",
            )


__all__ = ["check_batch_io"]
