"""GPU model parameters, a GPU stub's environment and the pool-size flag, without a GPU."""

from __future__ import annotations

import argparse

import pytest

from shoal._serve_parser import build_parser
from shoal.cli import options_from_args
from shoal.config import ConfigError
from shoal.supervisor.instances.devices import (
    FORCE_CPU_ONLY,
    NARROW_VISIBLE_DEVICES,
    check_gpu_parameters,
    force_cpu_only_inputs,
    parse_pool_size,
    stub_environment,
)


@pytest.mark.parametrize(("value", "expected"), [(None, True), ("yes", True), ("no", False)])
def test_force_cpu_only_defaults_to_yes_as_triton(value: str | None, expected: bool) -> None:
    parameters = {} if value is None else {FORCE_CPU_ONLY: value}
    assert force_cpu_only_inputs(parameters, "m") is expected


@pytest.mark.parametrize("key", [FORCE_CPU_ONLY, NARROW_VISIBLE_DEVICES])
@pytest.mark.parametrize("value", ["YES", "true", "", "1"])
def test_other_values_fail_the_load_with_triton_words(key: str, value: str) -> None:
    with pytest.raises(ConfigError, match=f"model 'm': Incorrect value for {key}: '{value}'"):
        check_gpu_parameters({key: value}, "m")


def test_narrowing_names_the_instance_gpu() -> None:
    narrow = {NARROW_VISIBLE_DEVICES: "yes"}
    # The stub also learns the server's number for its GPU (descriptors carry that one).
    assert stub_environment(narrow, "KIND_GPU", 1, "m", environ={}) == {
        "CUDA_VISIBLE_DEVICES": "1",
        "SHOAL_SERVER_CUDA_DEVICE": "1",
    }
    # The server's own ids are positions in its CUDA_VISIBLE_DEVICES.
    inherited = {"CUDA_VISIBLE_DEVICES": "4,6"}
    assert stub_environment(narrow, "KIND_GPU", 1, "m", environ=inherited) == {
        "CUDA_VISIBLE_DEVICES": "6",
        "SHOAL_SERVER_CUDA_DEVICE": "1",
    }
    with pytest.raises(ConfigError, match="GPU 2 is not among CUDA_VISIBLE_DEVICES 4,6"):
        stub_environment(narrow, "KIND_GPU", 2, "m", environ=inherited)


@pytest.mark.parametrize(
    ("parameters", "kind"),
    [
        ({}, "KIND_GPU"),
        ({NARROW_VISIBLE_DEVICES: "no"}, "KIND_GPU"),
        ({NARROW_VISIBLE_DEVICES: "yes"}, "KIND_CPU"),
    ],
)
def test_no_narrowing_leaves_the_environment_alone(parameters: dict[str, str], kind: str) -> None:
    assert stub_environment(parameters, kind, 0, "m", environ={}) == {}


def test_pool_size_flag_takes_device_colon_bytes() -> None:
    assert parse_pool_size("0:67108864") == (0, 67108864)
    for bad in ("67108864", "a:1", "0:-1", "-1:5"):
        with pytest.raises(argparse.ArgumentTypeError, match="<integer>:<integer>"):
            parse_pool_size(bad)
    flag = "--cuda-memory-pool-byte-size"
    args = build_parser().parse_args(
        ["serve", "--model-repository", "r", flag, "1:1024", flag, "0:4096"]
    )
    assert options_from_args(args).cuda_pool_limits == ((1, 1024), (0, 4096))
