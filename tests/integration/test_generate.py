"""Triton's generate extension on a real ``shoal serve``: ``/generate`` and ``/generate_stream``."""

from __future__ import annotations

import json
from typing import Any

import pytest
import requests

from tests.integration.server import BUNDLED, TEST_MODELS, ShoalServer

pytestmark = pytest.mark.timeout(120)

MODELS = ("decoupled_repeat", "add_sub", "string_upper")
EVENT_STREAM_TYPE = "text/event-stream; charset=utf-8"
EXACTLY_ONE = "generate expects model to produce exactly 1 response"


@pytest.fixture(scope="module")
def base():
    args = ["--model-control-mode", "explicit"]
    for model in MODELS:
        args += ["--load-model", model]
    with ShoalServer(BUNDLED, TEST_MODELS, extra_args=tuple(args)) as server:
        yield f"http://{server.url}"


def post(base: str, model: str, route: str, body: dict[str, Any], **kwargs: Any):
    url = f"{base}/v2/models/{model}/{route}"
    return requests.post(url, data=json.dumps(body), timeout=30, **kwargs)


def events(response: requests.Response) -> list[dict[str, Any]]:
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == EVENT_STREAM_TYPE
    chunks = response.content.split(b"\n\n")
    assert chunks[-1] == b""
    assert all(chunk.startswith(b"data: ") for chunk in chunks[:-1])
    return [json.loads(chunk.removeprefix(b"data: ")) for chunk in chunks[:-1]]


def test_generate_add_sub(base):
    body = {"INPUT0": [1, 2, 3, 4], "INPUT1": [10, 20, 30, 40]}
    response = post(base, "add_sub", "generate", body)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/json"
    assert response.json() == {
        "model_name": "add_sub",
        "model_version": "1",
        "OUTPUT0": [11.0, 22.0, 33.0, 44.0],
        "OUTPUT1": [-9.0, -18.0, -27.0, -36.0],
    }


def test_generate_string_upper(base):
    """TEXT has dims [-1] and a batch dim: a string is shape [1, 1], a list [1, n]."""
    response = post(base, "string_upper", "generate", {"TEXT": "héllo"})
    assert response.status_code == 200, response.text
    assert response.json() == {
        "model_name": "string_upper",
        "model_version": "1",
        "UPPER": "HÉLLO",
        "LENGTH": 6,
    }
    response = post(base, "string_upper", "generate", {"TEXT": ["ab", "c"], "mode": "x"})
    assert response.status_code == 200, response.text
    assert response.json()["UPPER"] == ["AB", "C"]
    assert response.json()["LENGTH"] == [2, 1]


def test_generate_stream_decoupled_repeat(base):
    response = post(base, "decoupled_repeat", "generate_stream", {"COUNT": 5})
    assert events(response) == [
        {"model_name": "decoupled_repeat", "model_version": "1", "INDEX": index}
        for index in range(5)
    ]
    assert events(post(base, "decoupled_repeat", "generate_stream", {"COUNT": 0})) == []


def test_generate_stream_of_a_normal_model_is_one_event(base):
    response = post(base, "string_upper", "generate_stream", {"TEXT": "a"})
    assert [event["UPPER"] for event in events(response)] == ["A"]


def test_generate_needs_exactly_one_response(base):
    response = post(base, "decoupled_repeat", "generate", {"COUNT": 1})
    assert response.status_code == 200, response.text
    assert response.json()["INDEX"] == 0
    for count in (0, 3):
        response = post(base, "decoupled_repeat", "generate", {"COUNT": count})
        assert response.status_code == 400
        assert EXACTLY_ONE in response.json()["error"]


@pytest.mark.parametrize("route", ["generate", "generate_stream"])
def test_errors_before_the_first_response_are_json(base, route):
    response = post(base, "nope", route, {})
    assert response.status_code == 404
    assert response.headers["content-type"] == "application/json"
    response = post(base, "add_sub", route, {"INPUT0": [1, 2, 3, 4]})  # INPUT1 missing
    assert response.status_code == 400
    assert "INPUT1" in response.json()["error"], response.text
    response = post(base, "add_sub", route, {"INPUT0": [1, 2, 3], "INPUT1": [1, 2, 3, 4]})
    assert "can not convert input 'INPUT0'" in response.json()["error"]


def test_hanging_up_mid_stream_leaves_the_server_serving(base):
    url = f"{base}/v2/models/decoupled_repeat/generate_stream"
    with (
        requests.Session() as session,
        session.post(url, json={"COUNT": 20_000}, stream=True, timeout=30) as response,
    ):
        assert response.status_code == 200
        chunks = response.iter_content(chunk_size=None)
        assert next(chunks).startswith(b"data: ")
    # The core dropped the rest: the model serves the next request at once.
    response = post(base, "decoupled_repeat", "generate_stream", {"COUNT": 2})
    assert [event["INDEX"] for event in events(response)] == [0, 1]


@pytest.mark.parametrize("route", ["generate", "generate_stream"])
def test_a_parameter_wider_than_64_bits_is_the_clients_error(base, route):
    tensors = {"INPUT0": [1, 2, 3, 4], "INPUT1": [1, 2, 3, 4]}
    response = post(base, "add_sub", route, {**tensors, "big": -(1 << 63) - 1})
    assert response.status_code == 400, response.text
    assert "parameter 'big' is out of range" in response.json()["error"]
    response = post(base, "add_sub", route, {**tensors, "edge": (1 << 64) - 1})
    assert response.status_code == 200, response.text
