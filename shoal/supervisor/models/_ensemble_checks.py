"""Load-time checks of an ensemble against its step models, nested ensembles included.

``config/_ensemble.py`` checks an ensemble's own data flow; these checks need the step models'
configurations, so they run when the ensemble loads (after its step models), as in Triton:

* a step names a model that is in no repository;
* an ensemble contains itself, directly or through nested ensembles (a cycle);
* a step model batches less than the ensemble (``max_batch_size``);
* a step maps a tensor the model does not have, or leaves a required input unmapped;
* an ensemble tensor is given two different datatypes or incompatible shapes by the ensemble and
  its step models (``-1`` matches any size; a tensor may be ``[d...]`` in a batching model and
  ``[-1, d...]`` in a non-batching one).

A step that is itself an ensemble is checked like any model, through its inputs and outputs; its
own steps were checked when it loaded.

:func:`decoupled_flow` decides, as Triton does, whether the ensemble is decoupled: it is when one
of its steps is (a nested ensemble with a decoupled step is), whatever its own configuration
says. Each response of a decoupled step runs the steps that read its outputs once more, so a
step (and the ensemble's outputs) must read the tensors of one decoupled step's responses only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from shoal.config import ModelConfig, TensorConfig

#: The configuration of a loaded step model, None while it is not loaded.
ConfigOf = Callable[[str], ModelConfig | None]
#: The step model names of an ensemble (loaded or only in a repository); () for other models.
StepsOf = Callable[[str], Sequence[str]]
#: Whether a step model is decoupled (a nested ensemble: whether it is, by its own steps).
DecoupledOf = Callable[[str], bool]


class EnsembleProblem(Exception):
    """The ensemble cannot load; the message names the ensemble, the step and the tensor."""


@dataclass(frozen=True)
class _Tensor:
    """What one side (the ensemble or a step model) says an ensemble tensor is."""

    datatype: str
    dims: tuple[int, ...]
    batching: bool
    source: str  # "ensemble 'e'" or "'OUT' of model 'm'"

    @property
    def full_dims(self) -> tuple[int, ...]:
        return ((-1,) if self.batching else ()) + self.dims


def check_ensemble(
    config: ModelConfig, known: Callable[[str], bool], config_of: ConfigOf, steps_of: StepsOf
) -> None:
    """Raise :class:`EnsembleProblem` for the first problem; steps not loaded yet are skipped
    (except for cycles, found from the repository's configurations)."""
    _check_cycles(config, steps_of)
    tensors = _ensemble_tensors(config)
    for index, step in enumerate(config.ensemble_steps):
        _check_known(config.name, index, step.model_name, known)
        target = config_of(step.model_name)
        if target is not None:
            _check_step(config, index, target, tensors)


def decoupled_flow(config: ModelConfig, decoupled_of: DecoupledOf) -> bool:
    """Whether the ensemble is decoupled: one of its steps is (Triton's rule: the ensemble's own
    ``model_transaction_policy`` is replaced by it). Raises :class:`EnsembleProblem` where a step
    or the ensemble's outputs would read the responses of two decoupled steps, or of one and
    the ensemble's inputs: they cannot be paired one to one (Triton's check and words)."""
    #: Each tensor's stream: 0 for the ensemble's inputs, n for the responses of the n-th
    #: decoupled step met; a plain step's outputs are in the stream of its inputs.
    streams = {t.name: 0 for t in config.inputs}
    pending = list(enumerate(config.ensemble_steps))
    decoupled = 0
    while pending:
        ready = [(i, s) for i, s in pending if all(t in streams for t in s.input_map.values())]
        if not ready:
            break  # steps whose inputs never exist: config/_ensemble.py's problem
        for index, step in ready:
            pending.remove((index, step))
            seen = {streams[t] for t in step.input_map.values()}
            if len(seen) > 1:
                raise EnsembleProblem(
                    f"in ensemble {config.name}, step of model '{step.model_name}' receives "
                    "inputs originated from different decoupled models: "  # Triton's words
                    f"in ensemble '{config.name}', step {index} of model '{step.model_name}' "
                    "receives inputs originated from different decoupled models: each "
                    "response of a decoupled step runs the steps that read its outputs, so a "
                    "step reads the outputs of one decoupled step (or none) only"
                )
            stream = seen.pop() if seen else 0
            if decoupled_of(step.model_name):
                decoupled += 1
                stream = decoupled
            for tensor in step.output_map.values():
                streams[tensor] = stream
    if len({streams[t.name] for t in config.outputs if t.name in streams}) > 1:
        raise EnsembleProblem(
            # Triton's words: it checks the outputs as a step of the ensemble itself
            f"in ensemble {config.name}, step of model '{config.name}' receives inputs "
            "originated from different decoupled models: "
            f"in ensemble '{config.name}', its outputs receive inputs originated from "
            "different decoupled models: each response of the ensemble is made of the "
            "outputs of one decoupled step's response (or of none)"
        )
    return decoupled > 0


def _check_cycles(config: ModelConfig, steps_of: StepsOf) -> None:
    path = _path_back(config.name, [s.model_name for s in config.ensemble_steps], steps_of)
    if path is not None:
        names = (config.name, *path)
        chain = " -> ".join(f"'{name}'" for name in names)
        raise EnsembleProblem(
            f"circular dependency between ensembles: {config.name} -> ... -> {names[-2]} -> "
            f"{config.name}: "  # Triton's words first
            f"ensemble '{config.name}' contains itself ({chain}): an ensemble cannot be a step "
            "of itself, directly or through nested ensembles"
        )


def _check_known(ensemble: str, index: int, model: str, known: Callable[[str], bool]) -> None:
    if not known(model):
        raise EnsembleProblem(
            f"step {index} of ensemble '{ensemble}' uses model '{model}', "
            "which is in no model repository"
        )


def _path_back(start: str, steps: Sequence[str], steps_of: StepsOf) -> list[str] | None:
    """The chain of step models leading from ``steps`` back to ``start``, if there is one."""
    seen: set[str] = set()
    stack = [[name] for name in reversed(steps)]
    while stack:
        path = stack.pop()
        name = path[-1]
        if name == start:
            return path
        if name in seen:
            continue
        seen.add(name)
        stack.extend([*path, child] for child in reversed(steps_of(name)))
    return None


def _ensemble_tensors(config: ModelConfig) -> dict[str, _Tensor]:
    batching = config.max_batch_size > 0
    source = f"ensemble '{config.name}'"
    return {
        t.name: _Tensor(
            t.datatype, t.reshape if t.reshape is not None else t.dims, batching, source
        )
        for t in (*config.inputs, *config.outputs)
    }


def _check_step(
    ensemble: ModelConfig, index: int, model: ModelConfig, tensors: dict[str, _Tensor]
) -> None:
    step = ensemble.ensemble_steps[index]
    where = f"step {index} of ensemble '{ensemble.name}'"
    _check_batch_size(ensemble, index, model)
    _check_maps(ensemble, index, model, tensors)
    for spec in model.inputs:
        if spec.name not in step.input_map and not spec.optional:
            raise EnsembleProblem(
                f"{where}: input '{spec.name}' of model '{model.name}' is not mapped to any "
                "ensemble tensor"
            )


def _check_batch_size(ensemble: ModelConfig, index: int, model: ModelConfig) -> None:
    if 0 < model.max_batch_size < ensemble.max_batch_size:
        raise EnsembleProblem(
            f"ensemble '{ensemble.name}' allows batch size {ensemble.max_batch_size} but "
            f"model '{model.name}' of its step {index} only allows {model.max_batch_size}"
        )


def _check_maps(
    ensemble: ModelConfig, index: int, model: ModelConfig, tensors: dict[str, _Tensor]
) -> None:
    """Every tensor a step maps is the model's, and agrees with the ensemble tensor."""
    step = ensemble.ensemble_steps[index]
    inputs = {t.name: t for t in model.inputs}
    outputs = {t.name: t for t in model.outputs}
    for model_tensors, mapping in ((inputs, step.input_map), (outputs, step.output_map)):
        for model_tensor, ensemble_tensor in sorted(mapping.items()):  # a stable first error
            spec = model_tensors.get(model_tensor)
            if spec is None:
                raise EnsembleProblem(
                    f"step {index} of ensemble '{ensemble.name}' maps '{model_tensor}', which "
                    f"model '{model.name}' does not have"
                )
            _agree(ensemble.name, ensemble_tensor, spec, model, tensors)


def _model_side(spec: TensorConfig, model: ModelConfig) -> _Tensor:
    """What a step model says one of its tensors is."""
    source = f"'{spec.name}' of model '{model.name}'"
    return _Tensor(spec.datatype, spec.dims, model.max_batch_size > 0, source)


def _agree(
    ensemble: str, name: str, spec: TensorConfig, model: ModelConfig, tensors: dict[str, _Tensor]
) -> None:
    mine = _model_side(spec, model)
    seen = tensors.setdefault(name, mine)
    if seen is mine:
        return
    if seen.datatype != mine.datatype:
        raise EnsembleProblem(
            f"ensemble '{ensemble}' tensor '{name}' is {seen.datatype} but "
            f"{mine.source} is {mine.datatype}" + _from(seen)
        )
    if not (_fits(seen.dims, mine.dims) or _fits(seen.full_dims, mine.full_dims)):
        raise EnsembleProblem(
            f"ensemble '{ensemble}' tensor '{name}' has shape {list(seen.full_dims)} but "
            f"{mine.source} has shape {list(mine.full_dims)}" + _from(seen)
        )


def _from(seen: _Tensor) -> str:
    return "" if seen.source.startswith("ensemble") else f" (the tensor comes from {seen.source})"


def _fits(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    return len(a) == len(b) and all(x == y or x == -1 or y == -1 for x, y in zip(a, b, strict=True))


__all__ = ["DecoupledOf", "EnsembleProblem", "check_ensemble", "decoupled_flow"]
