"""Restricted APIs and protocols: the flags' syntax, the route/RPC -> group table, and both
frontends answering 403 / PERMISSION_DENIED without the expected header."""

from __future__ import annotations

import argparse
import json
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from starlette.routing import Route
from tritonclient.grpc import service_pb2 as triton_pb
from tritonclient.utils import InferenceServerException

from shoal._flag_types import restriction_parser
from shoal._serve_parser import build_parser
from shoal.cli import options_from_args
from shoal.core import ErrorCode, ShoalError
from shoal.frontends._restricted import (
    GROUPS,
    GRPC_GROUPS,
    HTTP_GROUPS,
    Restrictions,
    restrict_routes,
)
from shoal.frontends.http.app import build_http_app
from shoal.supervisor.options import Restriction
from tests.unit.frontends.grpc.test_double import FullCore, client_of, serving

from .doubles import EchoCore, LoopThread

pytestmark = pytest.mark.timeout(60)

ADMIN = {"admin-key": "admin-value"}


def _serve_args(*flags: str) -> argparse.Namespace:
    return build_parser().parse_args(["serve", "--model-repository", "/models", *flags])


# --- the flags --------------------------------------------------------------------------------


def test_a_spec_names_groups_a_key_and_a_value() -> None:
    parse = restriction_parser("api")
    assert parse("model-repository,health:admin-key=admin-value") == Restriction(
        ("model-repository", "health"), "admin-key", "admin-value"
    )
    # As Triton: the groups end at the first ':', the key at the next '='; the value is the rest.
    assert parse("inference:k=a=b:c") == Restriction(("inference",), "k", "a=b:c")


@pytest.mark.parametrize(
    "spec",
    ["health", "health:key", "health:=value", "health:key=", ":key=value", "health=key:value"],
)
def test_a_malformed_spec_is_refused_with_the_expected_syntax(spec: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=r"expects <api list>:<key>=<value>"):
        restriction_parser("api")(spec)


@pytest.mark.parametrize("spec", ["model-reposit:k=v", "health,,metadata:k=v", "Health:k=v"])
def test_an_unknown_group_is_refused_naming_the_known_ones(spec: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=r"unknown restricted protocol") as info:
        restriction_parser("protocol")(spec)
    assert ", ".join(GROUPS) in str(info.value)


def test_the_flags_reach_the_server_options() -> None:
    options = options_from_args(
        _serve_args(
            "--http-restricted-api=model-repository:admin-key=admin-value",
            "--http-restricted-api",
            "inference:k=v",
            "--grpc-restricted-protocol=health,metadata:probe=yes",
        )
    )
    assert options.http_restricted_api == (
        Restriction(("model-repository",), "admin-key", "admin-value"),
        Restriction(("inference",), "k", "v"),
    )
    assert options.grpc_restricted_protocol == (
        Restriction(("health", "metadata"), "probe", "yes"),
    )
    assert options_from_args(_serve_args()).http_restricted_api == ()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            [
                "--http-restricted-api=model-repository,health:k1=v1",
                "--http-restricted-api=metadata,health:k2=v2",
            ],
            "restricted api 'health' can not be specified in multiple config groups",
        ),
        (
            ["--grpc-restricted-protocol=health,health:k=v"],
            "restricted protocol 'health' can not be specified in multiple config groups",
        ),
    ],
)
def test_a_group_in_two_specs_is_refused(flags: list[str], message: str) -> None:
    with pytest.raises(SystemExit) as info:
        options_from_args(_serve_args(*flags))
    assert message in str(info.value.code)


def test_grpc_ssl_is_accepted_only_off(capsys: pytest.CaptureFixture[str]) -> None:
    assert _serve_args("--grpc-use-ssl", "false", "--grpc-use-ssl-mutual=0").grpc_use_ssl is False
    with pytest.raises(SystemExit):
        _serve_args("--grpc-use-ssl", "true")
    assert "true is not supported" in capsys.readouterr().err


def test_tritonserver_flags_without_effect_are_accepted() -> None:
    options_from_args(
        _serve_args(
            "--backend-directory=/opt/tritonserver/backends",
            "--cache-directory=/opt/tritonserver/caches",
            "--grpc-infer-allocation-pool-size=16",
            "--http-thread-count=8",
            "--pinned-memory-pool-byte-size=0",
            "--cuda-memory-pool-byte-size=0:0",
            "--allow-gpu-metrics=false",
        )
    )


def test_the_logging_flags_reach_the_server_options() -> None:
    options = options_from_args(
        _serve_args(
            "--log-file=/tmp/shoal.log",
            "--log-format=ISO8601",
            "--log-info=false",
            "--log-warning=true",
            "--log-error=1",
        )
    )
    assert (options.log_file, options.log_format) == ("/tmp/shoal.log", "ISO8601")
    assert (options.log_info, options.log_warning, options.log_error) == (False, True, True)
    with pytest.raises(SystemExit):
        _serve_args("--log-format=iso8601")


# --- the table --------------------------------------------------------------------------------


def test_every_http_route_belongs_to_a_group() -> None:
    app = build_http_app(EchoCore())
    paths = {route.path for route in app.routes if isinstance(route, Route)}
    assert len(paths) == len(app.routes)
    assert paths - set(HTTP_GROUPS) == set()
    assert set(HTTP_GROUPS.values()) <= set(GROUPS)


def test_every_rpc_of_tritons_service_belongs_to_a_group() -> None:
    service = triton_pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    assert {method.name for method in service.methods} == set(GRPC_GROUPS)
    assert set(GRPC_GROUPS.values()) <= set(GROUPS)


@pytest.mark.parametrize(
    ("path", "group"),
    [
        ("/v2/health/live", "health"),
        ("/v2/models/{model_name}/ready", "health"),
        ("/v2", "metadata"),
        ("/v2/models/{model_name}/versions/{model_version}", "metadata"),
        ("/v2/models/{model_name}/infer", "inference"),
        ("/v2/models/{model_name}/versions/{model_version}/generate_stream", "inference"),
        ("/v2/models/{model_name}/config", "model-config"),
        ("/v2/models/stats", "statistics"),
        ("/v2/repository/models/{model_name}/unload", "model-repository"),
        ("/v2/cudasharedmemory/region/{region_name}/register", "shared-memory"),
        ("/v2/logging", "logging"),
    ],
)
def test_routes_are_grouped_as_tritons(path: str, group: str) -> None:
    assert HTTP_GROUPS[path] == group


@pytest.mark.parametrize(
    ("rpc", "group"),
    [
        ("ModelReady", "health"),
        ("ModelMetadata", "metadata"),
        ("ModelStreamInfer", "inference"),
        ("ModelConfig", "model-config"),
        ("RepositoryIndex", "model-repository"),
        ("CudaSharedMemoryStatus", "shared-memory"),
        ("TraceSetting", "trace"),
        ("LogSettings", "logging"),
    ],
)
def test_rpcs_are_grouped_as_tritons(rpc: str, group: str) -> None:
    assert GRPC_GROUPS[rpc] == group


def test_a_route_without_a_group_is_refused_once_anything_is_restricted() -> None:
    async def endpoint(request: Any) -> Any:
        raise AssertionError("not called")

    routes = [Route("/v2/unheard-of", endpoint)]
    assert restrict_routes(routes, Restrictions({})) == routes
    with pytest.raises(ValueError, match="/v2/unheard-of belongs to no restricted API group"):
        restrict_routes(routes, Restrictions({"health": ("k", "v")}))


# --- the check --------------------------------------------------------------------------------


def _denied(restrictions: Restrictions, group: str, headers: list[tuple[str, object]]) -> str:
    with pytest.raises(ShoalError) as info:
        restrictions.check(group, headers)
    assert info.value.code is ErrorCode.PERMISSION_DENIED
    return info.value.message


def test_a_restricted_group_needs_its_header_with_its_value() -> None:
    restrictions = Restrictions({"model-repository": ("Admin-Key", "admin-value")})
    expected = "This API is restricted, expecting header 'Admin-Key'"
    assert _denied(restrictions, "model-repository", []) == expected
    assert _denied(restrictions, "model-repository", [("admin-key", "wrong")]) == expected
    restrictions.check("model-repository", [("admin-key", "admin-value")])  # names ignore case
    restrictions.check("model-repository", [("ADMIN-KEY", "admin-value")])
    restrictions.check("health", [])  # not restricted


def test_only_the_first_header_with_the_key_counts() -> None:
    restrictions = Restrictions({"health": ("k", "v")})
    _denied(restrictions, "health", [("k", "x"), ("k", "v")])
    restrictions.check("health", [("k", "v"), ("k", "x")])


def test_grpc_keys_carry_tritons_prefix() -> None:
    restrictions = Restrictions(
        {"inference": ("infer-key", "v")}, prefix="triton-grpc-protocol-", what="protocol"
    )
    message = _denied(restrictions, "inference", [("infer-key", "v")])
    assert (
        message == "This protocol is restricted, expecting header 'triton-grpc-protocol-infer-key'"
    )
    restrictions.check("inference", [("triton-grpc-protocol-infer-key", "v")])


def test_an_unknown_group_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="model-reposit"):
        Restrictions({"model-reposit": ("k", "v")})


# --- over HTTP --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def restricted_url(serve: Callable[..., str]) -> str:
    restricted = {"model-repository": ("admin-key", "admin-value"), "inference": ("k", "v")}
    return serve(EchoCore(), restricted=restricted)


@pytest.fixture
def restricted_client(restricted_url: str) -> Iterator[httpclient.InferenceServerClient]:
    client = httpclient.InferenceServerClient(restricted_url)
    yield client
    client.close()


def test_http_answers_403_without_the_header(restricted_client: Any) -> None:
    with pytest.raises(InferenceServerException) as info:
        restricted_client.get_model_repository_index()
    assert info.value.status() == "403"
    assert info.value.message() == "This API is restricted, expecting header 'admin-key'"
    assert isinstance(restricted_client.get_model_repository_index(headers=ADMIN), list)


def test_http_leaves_other_groups_open(restricted_client: Any) -> None:
    assert restricted_client.is_server_live()
    assert restricted_client.get_model_metadata("echo")["name"] == "echo"


def test_http_restricts_infer_and_generate(restricted_client: Any, restricted_url: str) -> None:
    inputs = [httpclient.InferInput("INPUT0", [1, 3], "FP32")]
    inputs[0].set_data_from_numpy(np.ones((1, 3), dtype=np.float32))
    with pytest.raises(InferenceServerException, match="expecting header 'k'"):
        restricted_client.infer("echo", inputs)
    result = restricted_client.infer("echo", inputs, headers={"k": "v"})
    assert result.as_numpy("INPUT0").tolist() == [[1.0, 1.0, 1.0]]
    for route in ("generate", "generate_stream"):
        request = urllib.request.Request(
            f"http://{restricted_url}/v2/models/echo/{route}", data=b"{}", method="POST"
        )
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(request, timeout=10)
        assert info.value.code == 403
        assert json.loads(info.value.read()) == {
            "error": "This API is restricted, expecting header 'k'"
        }


# --- over gRPC --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def restricted_grpc(loop_thread: LoopThread) -> Iterator[Any]:
    restricted = {"model-repository": ("admin-key", "admin-value"), "inference": ("k", "v")}
    with serving(loop_thread, FullCore(), restricted=restricted) as url, client_of(url) as client:
        yield client


def test_grpc_answers_permission_denied_without_the_key(restricted_grpc: Any) -> None:
    with pytest.raises(InferenceServerException) as info:
        restricted_grpc.get_model_repository_index(headers=ADMIN)  # not prefixed
    assert info.value.status() == str(grpc.StatusCode.PERMISSION_DENIED)
    assert info.value.message() == (
        "This protocol is restricted, expecting header 'triton-grpc-protocol-admin-key'"
    )
    headers = {"triton-grpc-protocol-admin-key": "admin-value"}
    assert restricted_grpc.get_model_repository_index(headers=headers) is not None
    assert restricted_grpc.is_server_live()  # health is open


def test_grpc_restricts_the_stream(restricted_grpc: Any) -> None:
    # As with Triton, the stream opens and then ends with the error, which the callback gets; a
    # request sent after that is refused by the client itself.
    errors: list[Any] = []
    restricted_grpc.start_stream(lambda result, error: errors.append(error))
    inputs = [grpcclient.InferInput("INPUT0", [1, 3], "FP32")]
    inputs[0].set_data_from_numpy(np.ones((1, 3), dtype=np.float32))
    try:
        restricted_grpc.async_stream_infer("echo", inputs)
    except InferenceServerException as exc:
        assert "no longer in valid state" in str(exc)
    finally:
        restricted_grpc.stop_stream()  # waits for the stream to end
    assert errors
    assert "This protocol is restricted, expecting header 'triton-grpc-protocol-k'" in str(
        errors[0]
    )
    assert "PERMISSION_DENIED" in str(errors[0].status())
