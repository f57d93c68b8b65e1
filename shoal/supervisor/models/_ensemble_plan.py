"""An ensemble's steps as a dependency graph, worked out once per loaded ensemble version.

A request then only counts down, per step, how many of its input tensors are still missing,
instead of re-reading the configuration and re-testing every waiting step after each step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from shoal.config import ModelConfig


class StepTarget(Protocol):
    """The model version a step runs (a loaded ``ModelVersion``)."""

    @property
    def config(self) -> ModelConfig: ...


@dataclass(eq=False)
class StepPlan:
    """One step: what it reads, what it writes, and its target's input datatypes."""

    index: int
    model_name: str
    version: str  # "" for the latest
    #: (step model input, ensemble tensor), in the configuration's order.
    inputs: tuple[tuple[str, str], ...]
    #: step model output -> ensemble tensor.
    output_map: dict[str, str]
    requested: tuple[str, ...]
    #: Distinct ensemble tensors the step waits for.
    needs: int
    #: The target version the datatypes below were read from (checked by identity per request,
    #: so a reloaded target is read again).
    target: StepTarget | None = None
    datatypes: tuple[str | None, ...] = ()


@dataclass(eq=False)
class EnsemblePlan:
    steps: tuple[StepPlan, ...]
    #: ensemble tensor -> the steps that read it, in step order.
    consumers: dict[str, tuple[StepPlan, ...]] = field(default_factory=dict)
    #: requested outputs -> the steps that make them (:func:`needed_steps`).
    needed: dict[tuple[str, ...], frozenset[int]] = field(default_factory=dict)


#: How many sets of requested outputs a plan remembers the needed steps of.
_NEEDED_KEPT = 64


def needed_steps(plan: EnsemblePlan, wanted: tuple[str, ...]) -> frozenset[int]:
    """The indexes of the steps that make the ``wanted`` tensors, directly or through the
    tensors they read. As Triton's ensemble scheduler, a request runs only those: a step whose
    outputs feed none of the requested outputs is skipped."""
    known = plan.needed.get(wanted)
    if known is not None:
        return known
    producers: dict[str, list[StepPlan]] = {}
    for step in plan.steps:
        for tensor in step.output_map.values():
            producers.setdefault(tensor, []).append(step)
    needed: set[int] = set()
    todo = list(wanted)
    while todo:
        for step in producers.get(todo.pop(), ()):
            if step.index not in needed:
                needed.add(step.index)
                todo.extend(source for _, source in step.inputs)
    result = frozenset(needed)
    if len(plan.needed) < _NEEDED_KEPT:
        plan.needed[wanted] = result
    return result


def plan_of(config: ModelConfig) -> EnsemblePlan:
    steps = []
    for index, step in enumerate(config.ensemble_steps):
        inputs = tuple(step.input_map.items())
        steps.append(
            StepPlan(
                index=index,
                model_name=step.model_name,
                version="" if step.model_version < 0 else str(step.model_version),
                inputs=inputs,
                output_map=dict(step.output_map),
                requested=tuple(step.output_map),
                needs=len({source for _, source in inputs}),
            )
        )
    return EnsemblePlan(tuple(steps), _consumers(steps))


def _consumers(steps: list[StepPlan]) -> dict[str, tuple[StepPlan, ...]]:
    consumers: dict[str, list[StepPlan]] = {}
    for plan in steps:
        for source in dict.fromkeys(source for _, source in plan.inputs):  # each tensor once
            consumers.setdefault(source, []).append(plan)
    return {k: tuple(v) for k, v in consumers.items()}


def input_datatypes(step: StepPlan, target: StepTarget) -> tuple[str | None, ...]:
    """The datatype the target model expects for each of the step's inputs (None: it has no
    such input), cached on the step for this target version."""
    if step.target is not target:
        specs = {t.name: t.datatype for t in target.config.inputs}
        step.datatypes = tuple(specs.get(name) for name, _ in step.inputs)
        step.target = target
    return step.datatypes
