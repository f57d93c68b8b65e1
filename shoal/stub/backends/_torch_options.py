"""The parameters of Triton's PyTorch backend, read from the configuration and applied to torch.

Applied: ``DISABLE_OPTIMIZED_EXECUTION``, ``INFERENCE_MODE``, ``ENABLE_CACHE_CLEANING``,
``INTRA_OP_THREAD_COUNT`` (default: this stub's ``OMP_NUM_THREADS`` when set, so that instances do
not oversubscribe the CPU), ``INTER_OP_THREAD_COUNT``, and ``ENABLE_JIT_EXECUTOR``,
``ENABLE_JIT_PROFILING``, ``ENABLE_TENSOR_FUSER`` (process-wide TorchScript switches; a stub
runs one instance, so they cannot leak into another model). Accepted without effect:
``ENABLE_NVFUSER`` (gone from current torch) and ``ENABLE_WEIGHT_SHARING`` (each instance is its
own process here).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shoal.stub.backends._config import bool_parameter, int_parameter

#: Parameter -> the private ``torch._C`` switch it sets, when this torch has it.
_JIT_SWITCHES: dict[str, str] = {
    "ENABLE_JIT_EXECUTOR": "_jit_set_profiling_executor",
    "ENABLE_JIT_PROFILING": "_jit_set_profiling_mode",
    "ENABLE_TENSOR_FUSER": "_jit_set_texpr_fuser_enabled",
}


@dataclass(frozen=True)
class TorchOptions:
    optimized_execution: bool = True
    inference_mode: bool = False
    cache_cleaning: bool = False
    intra_op_threads: int = 0
    inter_op_threads: int = 0
    jit_switches: tuple[tuple[str, bool], ...] = ()


def read_options(config: Mapping[str, Any], model: str) -> TorchOptions:
    """The options the model's ``parameters`` set; raises on a malformed thread count."""
    intra = int_parameter(config, "INTRA_OP_THREAD_COUNT", model)
    if intra is None or intra <= 0:
        share = os.environ.get("OMP_NUM_THREADS", "")
        intra = int(share) if share.isdigit() else 0
    inter = int_parameter(config, "INTER_OP_THREAD_COUNT", model) or 0
    switches = []
    for key in _JIT_SWITCHES:
        value = bool_parameter(config, key)
        if value is not None:
            switches.append((key, value))
    return TorchOptions(
        optimized_execution=not bool_parameter(config, "DISABLE_OPTIMIZED_EXECUTION"),
        inference_mode=bool(bool_parameter(config, "INFERENCE_MODE")),
        cache_cleaning=bool(bool_parameter(config, "ENABLE_CACHE_CLEANING")),
        intra_op_threads=max(intra, 0),
        inter_op_threads=max(inter, 0),
        jit_switches=tuple(switches),
    )


def apply_options(torch: Any, options: TorchOptions) -> list[str]:
    """Set torch's process-wide state; returns warnings about what could not be applied."""
    warnings = []
    if options.intra_op_threads > 0:
        torch.set_num_threads(options.intra_op_threads)
    if options.inter_op_threads > 0:
        try:
            torch.set_num_interop_threads(options.inter_op_threads)
        except RuntimeError as error:  # only possible before any inter-op work started
            warnings.append(f"INTER_OP_THREAD_COUNT not applied: {error}")
    for key, value in options.jit_switches:
        switch = getattr(torch._C, _JIT_SWITCHES[key], None)
        if switch is None:
            warnings.append(
                f"{key} not applied: this torch ({torch.__version__}) has no such switch"
            )
        else:
            switch(value)
    return warnings


__all__ = ["TorchOptions", "apply_options", "read_options"]
