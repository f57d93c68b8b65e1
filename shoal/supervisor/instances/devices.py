"""Which GPUs the server uses, the GPU parameters of a model, and a GPU stub's environment.

* ``visible_gpus()``: the devices ``KIND_GPU``/``KIND_AUTO`` instance groups may use (none
  without cupy or a driver, so that ``KIND_GPU`` then fails to load with Triton's message).
* ``FORCE_CPU_ONLY_INPUT_TENSORS`` (Triton's, default ``"yes"``): checked when a model loads,
  with Triton's error for a value other than ``yes``/``no``.
* ``SHOAL_NARROW_CUDA_VISIBLE_DEVICES`` (shoal's, default ``"no"``): ``"yes"`` starts each
  ``KIND_GPU`` stub with ``CUDA_VISIBLE_DEVICES`` naming only its GPU, for frameworks that
  initialise every visible device. The model then sees its GPU as ``cuda:0``, while
  ``args["model_instance_device_id"]`` stays the server's id, as Triton passes it.
* ``--cuda-memory-pool-byte-size <device>:<bytes>``: the hard limit of a device's pool.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping

from shoal.config import ConfigError
from shoal.ipc.cuda import cuda_device_count

FORCE_CPU_ONLY = "FORCE_CPU_ONLY_INPUT_TENSORS"
NARROW_VISIBLE_DEVICES = "SHOAL_NARROW_CUDA_VISIBLE_DEVICES"


def visible_gpus() -> tuple[int, ...]:
    """The CUDA devices this process sees, numbered as CUDA numbers them."""
    return tuple(range(cuda_device_count()))


def force_cpu_only_inputs(parameters: Mapping[str, str], model: str) -> bool:
    """Whether GPU inputs are copied to the CPU for the model (Triton's default: yes)."""
    return _yes_no(parameters, FORCE_CPU_ONLY, default=True, model=model)


def narrow_visible_devices(parameters: Mapping[str, str], model: str) -> bool:
    return _yes_no(parameters, NARROW_VISIBLE_DEVICES, default=False, model=model)


def check_gpu_parameters(parameters: Mapping[str, str], model: str) -> None:
    """ConfigError for a GPU parameter with a value other than ``yes``/``no``."""
    force_cpu_only_inputs(parameters, model)
    narrow_visible_devices(parameters, model)


def stub_environment(
    parameters: Mapping[str, str],
    kind: str,
    device_id: int,
    model: str,
    environ: Mapping[str, str] = os.environ,
) -> dict[str, str]:
    """Variables a stub of ``model`` starts with for its device (empty unless narrowed)."""
    if kind != "KIND_GPU" or not narrow_visible_devices(parameters, model):
        return {}
    return {
        "CUDA_VISIBLE_DEVICES": _visible_device(device_id, model, environ),
        # The stub sees its GPU as device 0; GPU tensor descriptors use the server's number.
        "SHOAL_SERVER_CUDA_DEVICE": str(device_id),
    }


def _visible_device(device_id: int, model: str, environ: Mapping[str, str]) -> str:
    """Device ids are this server's: the n-th of its own CUDA_VISIBLE_DEVICES, when it has one."""
    inherited = [d.strip() for d in environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d]
    if inherited and device_id >= len(inherited):
        raise ConfigError(
            f"model '{model}': GPU {device_id} is not among CUDA_VISIBLE_DEVICES "
            f"{','.join(inherited)} of the server"
        )
    return inherited[device_id] if inherited else str(device_id)


def parse_pool_size(text: str) -> tuple[int, int]:
    """``--cuda-memory-pool-byte-size`` ``<device>:<bytes>`` -> ``(device, bytes)``."""
    device, sep, size = text.partition(":")
    try:
        parsed = int(device), int(size)
    except ValueError:
        parsed = (-1, -1)
    if not sep or parsed[0] < 0 or parsed[1] < 0:
        raise argparse.ArgumentTypeError(
            f"--cuda-memory-pool-byte-size expects <integer>:<integer>, got '{text}'"
        )
    return parsed


def _yes_no(parameters: Mapping[str, str], key: str, *, default: bool, model: str) -> bool:
    value = parameters.get(key)
    if value is None:
        return default
    if value in ("yes", "no"):
        return value == "yes"
    raise ConfigError(
        f"model '{model}': Incorrect value for {key}: '{value}' (expected 'yes' or 'no')",
        field_path=("parameters", key),
    )
