"""``pb_utils.ModelConfig``: the configuration ``auto_complete_config`` reads and completes."""

from __future__ import annotations

import json
from typing import Any

_INPUT_KEYS = ("name", "data_type", "dims", "optional")
_OUTPUT_KEYS = ("name", "data_type", "dims")
_REQUIRED_KEYS = ("name", "data_type", "dims")


def _dims(value: Any) -> list[int]:
    return [int(dim) for dim in value]


class ModelConfig:
    """The model configuration as a dict, with the completion methods Triton offers.

    ``ModelConfig(model_config_json)``. Each ``add_*``/``set_*`` method only fills in what the
    configuration leaves open and raises ``ValueError`` when it would contradict it.
    """

    def __init__(self, model_config: str | bytes | dict[str, Any]) -> None:
        if isinstance(model_config, dict):
            self._model_config: dict[str, Any] = model_config
        else:
            self._model_config = json.loads(model_config)

    def as_dict(self) -> dict[str, Any]:
        """The configuration dict (the live object: treat it as read-only)."""
        return self._model_config

    def set_max_batch_size(self, max_batch_size: int) -> None:
        """Set ``max_batch_size``; it may not go below a value the configuration already sets."""
        if isinstance(max_batch_size, bool) or not isinstance(max_batch_size, int):
            raise ValueError(f"max_batch_size must be an int, not {max_batch_size!r}")
        if max_batch_size < 0:
            raise ValueError(f"max_batch_size must not be negative, got {max_batch_size}")
        configured = int(self._model_config.get("max_batch_size", 0) or 0)
        if max_batch_size < configured:
            raise ValueError(
                f"configuration specified max_batch_size {configured}, but in "
                f"auto-complete-config function for model '{self._name}' specified "
                f"max_batch_size {max_batch_size}: the configuration's max_batch_size is "
                "greater than the one auto_complete_config sets"
            )
        self._model_config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self) -> None:
        """Enable the dynamic batcher unless another scheduler is configured."""
        for other in ("sequence_batching", "ensemble_scheduling"):
            if other in self._model_config:
                raise ValueError(
                    f"Configuration specified scheduling_choice as '{other}', but "
                    f"auto-complete-config function for model '{self._name}' tries to set "
                    "scheduling_choice as 'dynamic_batching': dynamic batching cannot be "
                    "added to it"
                )
        self._model_config.setdefault("dynamic_batching", {})

    def add_input(self, input: dict[str, Any]) -> None:
        """Add an input (keys ``name``, ``data_type``, ``dims``, optional ``optional``)."""
        self._add_io("input", input, _INPUT_KEYS)

    def add_output(self, output: dict[str, Any]) -> None:
        """Add an output (keys ``name``, ``data_type``, ``dims``)."""
        self._add_io("output", output, _OUTPUT_KEYS)

    def set_model_transaction_policy(self, transaction_policy_dict: dict[str, Any]) -> None:
        """Set ``model_transaction_policy``; only the key ``decoupled`` is allowed."""
        if not isinstance(transaction_policy_dict, dict):
            raise ValueError("model transaction policy must be a dict")
        _check_policy_keys(transaction_policy_dict, self._name)
        policy = self._model_config.setdefault("model_transaction_policy", {})
        if "decoupled" in transaction_policy_dict:
            _set_decoupled(policy, transaction_policy_dict["decoupled"], self._name)

    def _add_io(self, kind: str, spec: dict[str, Any], allowed: tuple[str, ...]) -> None:
        if not isinstance(spec, dict):
            raise ValueError(f"model {kind} must be a dict, not {type(spec).__name__}")
        for key in spec:
            if key not in allowed:
                words = ", ".join(f"'{k}'" for k in allowed[:-1]) + f" and '{allowed[-1]}'"
                raise ValueError(
                    f"{kind} '{spec.get('name', '')}' in auto-complete-config function for model "
                    f"'{self._name}' contains property other than {words}.: invalid property "
                    f"'{key}'"
                )
        _check_required(kind, spec, self._name)
        entries: list[dict[str, Any]] = self._model_config.setdefault(kind, [])
        existing = next((entry for entry in entries if entry.get("name") == spec["name"]), None)
        if existing is None:
            entries.append(dict(spec))
        else:
            _merge(kind, existing, spec, self._name)

    @property
    def _name(self) -> str:
        return str(self._model_config.get("name", ""))


# Each message starts with the Python backend's own (Triton's QA matches those words).
def _check_policy_keys(policy: dict[str, Any], model: str) -> None:
    for key in policy:
        if key != "decoupled":
            raise ValueError(
                "model transaction property in auto-complete-config function for model "
                f"'{model}' contains property other than 'decoupled'.: '{key}' is not "
                "supported; only 'decoupled' can be set"
            )


def _set_decoupled(policy: dict[str, Any], wanted: Any, model: str) -> None:
    if "decoupled" in policy and policy["decoupled"] != wanted:
        raise ValueError(
            "trying to change decoupled property in auto-complete-config for model "
            f"'{model}', which is already set to '{policy['decoupled']}'.: the configuration's "
            f"decoupled={policy['decoupled']} conflicts with decoupled={wanted} from "
            "auto_complete_config"
        )
    policy["decoupled"] = wanted


def _check_required(kind: str, spec: dict[str, Any], model: str) -> None:
    for key in _REQUIRED_KEYS:
        if key not in spec:
            tensor = f"{kind} '{spec['name']}'" if "name" in spec else kind
            raise ValueError(
                f"{tensor} in auto-complete-config function for model '{model}' is missing "
                f"'{key}' property."
            )


def _merge(kind: str, existing: dict[str, Any], spec: dict[str, Any], model: str) -> None:
    name = spec["name"]
    configured_type = existing.get("data_type", "TYPE_INVALID")
    if configured_type not in ("TYPE_INVALID", spec["data_type"]):
        raise ValueError(
            f"unable to load model '{model}', configuration expects datatype {configured_type} "
            f"for {kind} '{name}', model provides {spec['data_type']}"
        )
    configured_dims = _dims(existing.get("dims", []))
    if configured_dims and configured_dims != _dims(spec["dims"]):
        raise ValueError(
            f"model '{model}', tensor '{name}': the model expects dims {_dims(spec['dims'])} "
            f"but the model configuration specifies dims {configured_dims}"
        )
    if "optional" in spec and "optional" in existing and existing["optional"] != spec["optional"]:
        raise ValueError(
            f"model '{model}', tensor '{name}': the model expects optional {spec['optional']} "
            f"but the model configuration specifies optional {existing['optional']}"
        )
    existing["data_type"] = spec["data_type"]
    existing["dims"] = spec["dims"]
    if "optional" in spec:
        existing["optional"] = spec["optional"]
