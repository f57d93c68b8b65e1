"""The KServe Python SDK's clients (InferenceRESTClient, InferenceGRPCClient) against shoal.

The SDK is one of the third-party tools that must work unmodified. Unlike tritonclient it reads
the health answers' KServe V2 bodies (``{"live": true}``, ``{"ready": true}``), not only their
status, and decodes responses with its own binary-extension reader. Its calls run in a process
of their own (``kserve_calls.py`` says why).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.integration.server import BUNDLED, ShoalServer

pytestmark = pytest.mark.timeout(180)

CALLS = Path(__file__).with_name("kserve_calls.py")
SUM = [1.5, 2.5, 4.0, 12.0]
DIFFERENCE = [0.5, 1.5, 2.0, -4.0]


@pytest.fixture(scope="module")
def results() -> dict[str, Any]:
    with ShoalServer(BUNDLED) as server:
        done = subprocess.run(
            [sys.executable, str(CALLS), server.url, server.grpc_url],
            capture_output=True,
            text=True,
            timeout=150,
        )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_rest_health_reads_the_v2_bodies(results: dict[str, Any]) -> None:
    assert results["rest_health"] == [True, True, True]


@pytest.mark.parametrize("form", ["json", "binary"])
def test_rest_infer(results: dict[str, Any], form: str) -> None:
    assert results[f"rest_infer_{form}"] == {
        "id": "kserve-rest-1",
        "outputs": {"OUTPUT0": SUM, "OUTPUT1": DIFFERENCE},
    }


def test_rest_bytes_tensor(results: dict[str, Any]) -> None:
    assert results["rest_bytes"] == {"OUT_STRING": ["a", "", "xyz"]}


def test_rest_error_names_the_model(results: dict[str, Any]) -> None:
    error = results["rest_unknown_model"]
    assert error["status"] == 404, error
    assert "no_such_model" in error["message"]


def test_grpc_health_and_infer(results: dict[str, Any]) -> None:
    assert results["grpc_health"] == [True, True, True]
    assert results["grpc_infer"] == {
        "id": "kserve-grpc-1",
        "outputs": {"OUTPUT0": SUM, "OUTPUT1": DIFFERENCE},
    }


def test_grpc_error_names_the_model(results: dict[str, Any]) -> None:
    error = results["grpc_unknown_model"]
    assert error["code"] == "NOT_FOUND", error
    assert "no_such_model" in error["details"]
