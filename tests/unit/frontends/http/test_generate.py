"""Triton's generate extension (``/generate``, ``/generate_stream``) served for real over HTTP.

The core is ``GenerateCore``: ``EchoCore`` with generate-friendly metadata, plus a "stream" model
that answers COUNT responses (INDEX = 0..COUNT-1) and can fail, crash or hang on request.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import socket
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import numpy as np
import pytest
import requests

from shoal.core import (
    InferOutput,
    InferRequest,
    InferResponse,
    InvalidArgument,
    ModelMetadata,
    TensorMetadata,
)
from shoal.frontends.http._generate_json import (
    EXACTLY_ONE,
    encode_generate_response,
    fit_shape,
)
from shoal.frontends.http.generate import EVENT_STREAM_TYPE
from shoal.ipc.dtypes import serialize_bytes
from tests.unit.frontends.doubles import EchoCore

pytestmark = pytest.mark.timeout(60)

ROUTES = ("generate", "generate_stream")

ECHO_INPUTS = (
    TensorMetadata("TEXT", "BYTES", (-1,)),
    TensorMetadata("COUNT", "INT32", (1,)),
    TensorMetadata("PAIRS", "FP32", (-1, 2)),
    TensorMetadata("FLAG", "BOOL", (1,)),
)
STREAM_INPUTS = (TensorMetadata("COUNT", "INT32", (1,)),)
STREAM_OUTPUTS = (TensorMetadata("INDEX", "INT32", (1,)),)
CRASH_MESSAGE = "internal error while serving a generate_stream request; see the server log"


class GenerateCore(EchoCore):
    """``EchoCore`` whose models have generate-style inputs, plus the streaming model "stream".

    "stream" answers COUNT responses; request parameters make it raise InvalidArgument
    ("fail_at": index) or RuntimeError ("crash_at": index) instead of a response, answer an
    error response as a decoupled model sends one ("error_at": index), or wait for
    ever after its responses ("hang": true). ``closed`` is set when its iterator is finished or
    closed, however that happens.
    """

    def reset(self) -> None:
        super().reset()
        self.closed = threading.Event()

    def model_metadata(self, name: str, version: str = "") -> ModelMetadata:
        if name == "stream":
            return ModelMetadata(name, ("1",), "python", STREAM_INPUTS, STREAM_OUTPUTS)
        self._check_model(name)
        return ModelMetadata(name, ("1",), "python", ECHO_INPUTS, ECHO_INPUTS)

    async def infer_stream(self, request: InferRequest) -> AsyncIterator[InferResponse]:
        if request.model_name != "stream":
            async for response in super().infer_stream(request):
                yield response
            return
        self.requests.append(request)
        self.entered.set()
        try:
            count = int(np.asarray(request.inputs[0].data).reshape(-1)[0])
            for index in range(count):
                if request.parameters.get("fail_at") == index:
                    raise InvalidArgument(f"the model failed at response {index}")
                if request.parameters.get("crash_at") == index:
                    raise RuntimeError("a bug in the model")
                if request.parameters.get("error_at") == index:
                    error = InvalidArgument(f"the model answered an error at {index}")
                    yield InferResponse("stream", "1", error=error)
                    return
                await asyncio.sleep(0)  # let the loop run between responses, as a real model
                yield self._index(index)
            if request.parameters.get("hang"):
                await asyncio.Event().wait()
        finally:
            self.closed.set()

    def _index(self, index: int) -> InferResponse:
        self.issued += 1
        data = memoryview(np.array([index], np.int32).tobytes())
        output = InferOutput("INDEX", "INT32", (1,), data)
        return InferResponse("stream", "1", outputs=[output], _release=self._on_release)


@pytest.fixture(scope="module")
def shared_generate_core() -> GenerateCore:
    return GenerateCore()


@pytest.fixture
def gen_core(shared_generate_core: GenerateCore) -> Iterator[GenerateCore]:
    shared_generate_core.reset()
    yield shared_generate_core
    assert shared_generate_core.released == shared_generate_core.issued


@pytest.fixture(scope="module")
def base(serve: Callable[..., str], shared_generate_core: GenerateCore) -> str:
    return "http://" + serve(shared_generate_core, max_input_size=4096)


def post(base: str, model: str, route: str, body: Any, **kwargs: Any) -> requests.Response:
    data = body if isinstance(body, str | bytes) else json.dumps(body)
    return requests.post(f"{base}/v2/models/{model}/{route}", data=data, timeout=10, **kwargs)


def events(response: requests.Response) -> list[dict[str, Any]]:
    """The JSON of each Server-Sent Event, after checking the framing of every one."""
    assert response.headers["content-type"] == EVENT_STREAM_TYPE
    body = response.content
    assert body == b"" or body.endswith(b"\n\n")
    parsed = []
    for event in body.split(b"\n\n")[:-1]:
        assert event.startswith(b"data: ") and b"\n" not in event
        parsed.append(json.loads(event.removeprefix(b"data: ")))
    return parsed


def error_of(response: requests.Response, status: int) -> str:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    message: str = response.json()["error"]
    return message


class TestRequest:
    def test_keys_become_inputs_and_parameters(self, base: str, gen_core: GenerateCore) -> None:
        body = {
            "TEXT": "héllo",
            "COUNT": 3,
            "PAIRS": [1, 2, 3, 4],
            "FLAG": True,
            "temperature": 0.5,
            "parameters": {"max_tokens": 7, "stop": "\n"},
        }
        response = post(base, "echo", "generate", body)
        assert response.status_code == 200, response.text
        assert response.headers["content-type"] == "application/json"
        request = gen_core.requests[-1]
        assert (request.model_name, request.model_version, request.id) == ("echo", "", "")
        assert [(t.name, t.datatype, t.shape) for t in request.inputs] == [
            ("TEXT", "BYTES", (1,)),
            ("COUNT", "INT32", (1,)),
            ("PAIRS", "FP32", (2, 2)),
            ("FLAG", "BOOL", (1,)),
        ]
        assert np.asarray(request.inputs[0].data).tolist() == ["héllo".encode()]
        assert request.parameters == {"temperature": 0.5, "max_tokens": 7, "stop": "\n"}
        # EchoCore echoes the inputs as outputs and the parameters as response parameters.
        assert response.json() == {
            "model_name": "echo",
            "model_version": "1",
            "temperature": 0.5,
            "max_tokens": 7,
            "stop": "\n",
            "TEXT": "héllo",
            "COUNT": 3,
            "PAIRS": [1.0, 2.0, 3.0, 4.0],
            "FLAG": True,
        }

    def test_lists_fill_the_variable_dims(self, base: str, gen_core: GenerateCore) -> None:
        response = post(base, "echo", "generate", {"TEXT": ["a", "b", "c"], "PAIRS": []})
        assert response.status_code == 200, response.text
        shapes = {t.name: t.shape for t in gen_core.requests[-1].inputs}
        assert shapes == {"TEXT": (3,), "PAIRS": (0, 2)}
        assert response.json()["TEXT"] == ["a", "b", "c"]
        assert response.json()["PAIRS"] == []

    def test_inputs_may_be_given_in_parameters(self, base: str, gen_core: GenerateCore) -> None:
        response = post(base, "echo", "generate", {"parameters": {"COUNT": [4], "seed": 1}})
        assert response.status_code == 200, response.text
        request = gen_core.requests[-1]
        assert [t.name for t in request.inputs] == ["COUNT"]
        assert request.parameters == {"seed": 1}

    def test_version_from_the_path(self, base: str, gen_core: GenerateCore) -> None:
        for route in ROUTES:
            url = f"{base}/v2/models/echo/versions/1/{route}"
            response = requests.post(url, json={"COUNT": 1}, timeout=10)
            assert response.status_code == 200, response.text
            assert gen_core.requests[-1].model_version == "1"

    def test_gzip_body(self, base: str, gen_core: GenerateCore) -> None:
        body = gzip.compress(json.dumps({"TEXT": "zipped"}).encode())
        headers = {"Content-Encoding": "gzip"}
        response = post(base, "echo", "generate", body, headers=headers)
        assert response.status_code == 200, response.text
        assert response.json()["TEXT"] == "zipped"

    @pytest.mark.parametrize("route", ROUTES)
    @pytest.mark.parametrize(
        ("body", "message"),
        [
            ('{"TEXT": "a", "COUNT": 1, "TEXT": "b"}', "input 'TEXT' already exists in request"),
            ('{"COUNT": 1, "parameters": {"COUNT": 2}}', "input 'COUNT' already exists"),
            ('{"parameters": {"COUNT": 1, "COUNT": 2}}', "input 'COUNT' already exists"),
            ('{"parameters": 1}', "Expected JSON object for keyword: 'parameters'"),
            ('{"PARAMS": {"a": 0}}', "parameter 'PARAMS' has invalid type"),
            (
                '{"parameters": {"nested": [1]}}',
                "Converting keyword: 'parameters': parameter 'nested' has invalid type",
            ),
            ('{"triton_x": 1}', "reserved for Triton usage"),
            ('{"TEXT": 123}', "'TEXT': attempt to access JSON non-string as string: expected"),
            ('{"TEXT": {"a": 1}}', "attempt to access JSON non-string as string"),
            ('{"FLAG": "yes"}', "'FLAG': attempt to access JSON non-boolean as boolean"),
            ('{"COUNT": 2147483648}', "value 2147483648 is out of range for INT32"),
            ('{"COUNT": [1, 2]}', "can not convert input 'COUNT' to tensor with proper shape"),
            ('{"PAIRS": [1, 2, 3]}', "can not convert input 'PAIRS' to tensor with proper shape"),
            ('{"PAIRS": [[1, 2]]}', "input 'PAIRS': expected a scalar or a flat array"),
            ("{", "failed to parse the request JSON buffer"),
            ("[1]", "failed to parse the request JSON buffer: expected a JSON object"),
            ("[" * 4000, "failed to parse the request JSON buffer"),
        ],
    )
    def test_malformed_bodies(
        self, base: str, gen_core: GenerateCore, route: str, body: str, message: str
    ) -> None:
        response = post(base, "echo", route, body)
        assert message in error_of(response, 400)
        assert gen_core.requests == []

    @pytest.mark.parametrize("route", ROUTES)
    def test_model_errors_use_the_status_table(self, base: str, route: str) -> None:
        assert "unknown model" in error_of(post(base, "nope", route, {}), 404)
        assert "fail_unavailable" in error_of(post(base, "fail_unavailable", route, {}), 503)
        assert "version" in error_of(post(base, "echo/versions/x", route, {}), 400)

    @pytest.mark.parametrize("route", ROUTES)
    def test_oversized_body(self, base: str, route: str) -> None:
        response = post(base, "echo", route, {"TEXT": "x" * 5000})
        assert "request JSON size of 5012 bytes exceeds the maximum allowed input size" in error_of(
            response, 400
        )

    def test_only_post(self, base: str) -> None:
        response = requests.get(f"{base}/v2/models/echo/generate", timeout=10)
        assert response.status_code == 405


class TestGenerate:
    def test_the_id_member_is_the_request_id(self, base: str) -> None:
        """As Triton: ``id`` names the request, and each response carries it back."""
        response = post(base, "echo", "generate", {"TEXT": "hi", "id": "42"})
        assert response.status_code == 200
        assert response.json()["id"] == "42"
        refused = post(base, "echo", "generate", {"TEXT": "hi", "id": 42})
        assert error_of(refused, 400).startswith("Unable to parse 'id'")

    def test_one_response_of_a_streaming_model(self, base: str, gen_core: GenerateCore) -> None:
        response = post(base, "stream", "generate", {"COUNT": 1})
        assert response.status_code == 200, response.text
        assert response.json() == {"model_name": "stream", "model_version": "1", "INDEX": 0}
        assert gen_core.closed.is_set()

    @pytest.mark.parametrize("count", [0, 2, 5])
    def test_needs_exactly_one_response(
        self, base: str, gen_core: GenerateCore, count: int
    ) -> None:
        response = post(base, "stream", "generate", {"COUNT": count})
        assert error_of(response, 400) == EXACTLY_ONE
        assert gen_core.closed.is_set()
        assert gen_core.issued == min(count, 2)  # the rest was dropped, not produced

    def test_model_error(self, base: str) -> None:
        body = {"COUNT": 2, "parameters": {"fail_at": 1}}
        response = post(base, "stream", "generate", body)
        assert error_of(response, 400) == "the model failed at response 1"

    def test_unexpected_error_is_a_500(self, base: str) -> None:
        message = error_of(post(base, "crash", "generate", {}), 500)
        assert message == "internal error while serving a generate request; see the server log"

    def test_disconnect_closes_the_stream(self, base: str, gen_core: GenerateCore) -> None:
        port = int(base.rsplit(":", 1)[1])
        body = json.dumps({"COUNT": 0, "hang": True}).encode()
        head = (
            f"POST /v2/models/stream/generate HTTP/1.1\r\nHost: x\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(head + body)
            assert gen_core.entered.wait(10)
        assert gen_core.closed.wait(10)


class TestGenerateStream:
    def test_one_event_per_response(self, base: str, gen_core: GenerateCore) -> None:
        response = post(base, "stream", "generate_stream", {"COUNT": 4})
        assert response.status_code == 200
        assert events(response) == [
            {"model_name": "stream", "model_version": "1", "INDEX": index} for index in range(4)
        ]
        assert gen_core.closed.is_set()

    def test_a_normal_model_gives_one_event(self, base: str) -> None:
        response = post(base, "echo", "generate_stream", {"TEXT": "hi"})
        assert response.status_code == 200
        assert events(response) == [{"model_name": "echo", "model_version": "1", "TEXT": "hi"}]

    def test_no_response_is_an_empty_stream(self, base: str) -> None:
        response = post(base, "stream", "generate_stream", {"COUNT": 0})
        assert response.status_code == 200
        assert events(response) == []

    def test_error_after_the_first_response_is_the_last_event(self, base: str) -> None:
        body = {"COUNT": 5, "parameters": {"fail_at": 2}}
        response = post(base, "stream", "generate_stream", body)
        assert response.status_code == 200
        assert [event.get("INDEX", event.get("error")) for event in events(response)] == [
            0,
            1,
            "the model failed at response 2",
        ]

    def test_unexpected_error_after_the_first_response(self, base: str) -> None:
        response = post(base, "stream", "generate_stream", {"COUNT": 3, "crash_at": 1})
        assert response.status_code == 200
        assert events(response)[1:] == [{"error": CRASH_MESSAGE}]

    def test_an_error_as_the_first_response_is_the_only_event_with_its_status(
        self, base: str
    ) -> None:
        """As Triton: the stream starts with the error's status, the error its only event."""
        body = {"COUNT": 3, "error_at": 0}
        response = post(base, "stream", "generate_stream", body)
        assert response.status_code == 400
        assert events(response) == [{"error": "the model answered an error at 0"}]

    def test_an_error_raised_before_the_first_response_is_plain_json(self, base: str) -> None:
        """A request refused (or a model failing) before any response: JSON, not a stream."""
        body = {"COUNT": 3, "fail_at": 0}
        response = post(base, "stream", "generate_stream", body)
        assert error_of(response, 400) == "the model failed at response 0"

    def test_events_are_sent_as_they_come(self, base: str, gen_core: GenerateCore) -> None:
        """The model hangs after one response: that event arrives all the same; hanging up
        closes the iterator."""
        url = f"{base}/v2/models/stream/generate_stream"
        body = {"COUNT": 1, "hang": True}
        with (
            requests.Session() as session,
            session.post(url, json=body, stream=True, timeout=10) as response,
        ):
            assert response.status_code == 200
            chunks = response.iter_content(chunk_size=None)  # leaving it would hang up
            received = b""
            while not received.endswith(b"\n\n"):
                received += next(chunks)
            assert json.loads(received.removeprefix(b"data: "))["INDEX"] == 0
            assert not gen_core.closed.is_set()
        assert gen_core.closed.wait(10)
        assert requests.get(f"{base}/v2/health/live", timeout=10).status_code == 200


class TestEncoding:
    def test_scalars_lists_strings_and_parameters(self) -> None:
        texts = np.array([b"x", "é".encode()], dtype=np.object_)
        response = InferResponse(
            "m",
            "2",
            "req-1",
            outputs=[
                InferOutput("ONE", "FP32", (1, 1), memoryview(np.float32([1.5]).tobytes())),
                InferOutput("TEXT", "BYTES", (2,), memoryview(serialize_bytes(texts))),
                InferOutput("EMPTY", "INT8", (0,), memoryview(b"")),
                InferOutput("model_name", "INT8", (1,), memoryview(b"\x01")),
                InferOutput("p", "INT8", (1,), memoryview(b"\x01")),
            ],
            parameters={"p": "param", "model_version": "9", "done": True},
        )
        assert json.loads(encode_generate_response(response)) == {
            "id": "req-1",
            "model_name": "m",
            "model_version": "2",
            "p": "param",
            "done": True,
            "ONE": 1.5,
            "TEXT": ["x", "é"],
            "EMPTY": [],
        }

    def test_non_utf8_bytes_cannot_be_sent(self) -> None:
        data = memoryview(serialize_bytes(np.array([b"\xff"], dtype=np.object_)))
        response = InferResponse("m", "1", outputs=[InferOutput("B", "BYTES", (1,), data)])
        with pytest.raises(InvalidArgument, match="output 'B' element 0 is not valid UTF-8"):
            encode_generate_response(response)

    @pytest.mark.parametrize(
        ("dims", "count", "shape"),
        [
            ((1,), 1, (1,)),
            ((-1,), 1, (1,)),
            ((-1,), 0, (0,)),
            ((4,), 4, (4,)),
            ((-1, 4), 4, (1, 4)),
            ((-1, -1), 3, (1, 3)),
            ((-1, 2, -1), 6, (1, 2, 3)),
            ((0,), 0, (0,)),
            ((), 1, ()),
        ],
    )
    def test_fit_shape(self, dims: tuple[int, ...], count: int, shape: tuple[int, ...]) -> None:
        assert fit_shape("X", dims, count) == shape

    @pytest.mark.parametrize(("dims", "count"), [((4,), 3), ((4,), 0), ((0,), 1), ((), 2)])
    def test_fit_shape_refuses(self, dims: tuple[int, ...], count: int) -> None:
        with pytest.raises(InvalidArgument, match="can not convert input 'X'"):
            fit_shape("X", dims, count)
