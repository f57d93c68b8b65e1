"""Builders for pb_utils objects as the stub runtime makes them."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import numpy as np

from shoal.stub import pb_utils


class Recorder:
    """A ``deliver`` callback that records what the sender forwarded."""

    def __init__(self) -> None:
        self.sent: list[tuple[Any, int]] = []

    def __call__(self, response: Any, flags: int) -> None:
        self.sent.append((response, flags))


def readonly(array: np.ndarray) -> np.ndarray:
    """A read-only view, like the runtime's zero-copy views over shared memory."""
    view = array.view()
    view.flags.writeable = False
    return view


def server_request(
    inputs: dict[str, np.ndarray] | None = None,
    *,
    requested: list[str] | None = None,
    deliver: Callable[[Any, int], None] | None = None,
    decoupled: bool = False,
    parameters: dict[str, Any] | None = None,
    request_id: str = "req-1",
    correlation_id: int | str = 0,
    flags: int = 0,
    timeout: int = 0,
) -> pb_utils.InferenceRequest:
    """A request as ``execute`` receives it, with read-only inputs."""
    tensors = []
    for name, array in (inputs or {}).items():
        datatype = "BYTES" if array.dtype.kind == "O" else _v2(array)
        tensors.append(pb_utils.Tensor._wrap(name, readonly(array), datatype))
    return pb_utils.InferenceRequest._from_server(
        request_id=request_id,
        correlation_id=correlation_id,
        inputs=tensors,
        requested_output_names=list(requested or []),
        flags=flags,
        parameters=dict(parameters or {}),
        timeout=timeout,
        model_name="model",
        model_version=1,
        deliver=deliver,
        decoupled=decoupled,
    )


def config_tensor(name: str, datatype: str, dims: Any, reshape: Any = None) -> dict[str, Any]:
    """An ``input``/``output`` entry of a configuration in Triton's JSON form."""
    entry: dict[str, Any] = {"name": name, "data_type": datatype, "dims": list(dims)}
    if reshape is not None:
        entry["reshape"] = {"shape": list(reshape)}
    return entry


def instance_args(config: dict[str, Any], kind: str = "CPU") -> dict[str, str]:
    """The ``initialize`` args a stub gives the first instance of ``config``'s model."""
    return {
        "model_config": json.dumps(config),
        "model_instance_kind": kind,
        "model_instance_name": f"{config['name']}_0_0",
        "model_instance_device_id": "0",
        "model_repository": "/models",
        "model_version": "1",
        "model_name": config["name"],
    }


def _v2(array: np.ndarray) -> str:
    from shoal.ipc.dtypes import numpy_to_datatype

    return numpy_to_datatype(array.dtype)
