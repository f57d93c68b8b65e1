"""Schemathesis against docs/openapi.yaml and a live server (issue #9 item 6).

schemathesis generates requests for every operation of the published description — valid ones and,
in its coverage and negative phases, requests that break the schema (wrong types, missing fields,
out-of-range numbers, odd path parameters) — sends them to a real ``shoal serve`` on loopback, and
checks each answer: never a 500 or another undocumented 5xx, a status the description lists for
the operation, the content type and body schema it gives, and the response headers it declares.
The server must still be healthy, with no stub restarted and the input arena empty, afterwards.

The description is narrowed for the run (not in the published file): model names are the served
models plus unknown ones (random names would only ever meet 404), versions ``1`` to ``3``, and the
repository's load/unload only get names that are in no repository, so that fuzzing never unloads a
model the other operations use. ``SHOAL_OPENAPI_EXAMPLES`` sets the examples per operation (CI:
the default below; docs/hardening.md gives the longer run).
"""

from __future__ import annotations

import copy
import json
import os
import tempfile
import urllib.request
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import hypothesis
import pytest
import requests
import schemathesis
import yaml
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.integration.server import BUNDLED, REPO_ROOT, ShoalServer

pytestmark = pytest.mark.timeout(300)

SPEC = REPO_ROOT / "docs" / "openapi.yaml"
MODELS = ["add_sub", "identity", "string_upper"]
#: Names in no repository, some that a careless server would turn into paths.
UNKNOWN = ["no_such_model", "..", ".", "...", "a b", "x" * 300]
EXAMPLES = int(os.environ.get("SHOAL_OPENAPI_EXAMPLES", "25"))
#: 5xx statuses the description lists: 501 (not supported) and 503 (retry later). A 500 is
#: allowed by the description only as a model's own failure, which these models never raise for
#: JSON input: any 500 here is shoal's.
SERVER_STATUSES = {501, 503}

CHECKS = [
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    response_headers_conformance,
]

#: Cases sent, by operation, for the summary and the total check.
SENT: Counter[str] = Counter()


def _narrowed(spec: dict[str, Any]) -> dict[str, Any]:
    spec = copy.deepcopy(spec)
    served = {"type": "string", "enum": MODELS + UNKNOWN[:2]}
    unknown = {"type": "string", "enum": UNKNOWN}
    for path, item in spec["paths"].items():
        for parameter in item.get("parameters", []):
            name = parameter.get("$ref", "").rsplit("/", 1)[-1]
            if name == "ModelName":
                schema = unknown if path.startswith("/v2/repository/") else served
                item["parameters"][item["parameters"].index(parameter)] = {
                    "name": "model_name",
                    "in": "path",
                    "required": True,
                    "schema": schema,
                }
    spec["components"]["parameters"]["ModelVersion"]["schema"] = {
        "type": "string",
        "enum": ["1", "2", "3"],
    }
    spec["components"]["parameters"]["RegionName"]["schema"] = {
        "type": "string",
        "enum": ["r0", "no_region"],
    }
    return spec


@pytest.fixture(scope="module")
def server():
    args = ["--model-control-mode", "explicit"]
    for name in MODELS:
        args += ["--load-model", name]
    with ShoalServer(BUNDLED, extra_args=tuple(args), metrics=True) as srv:
        stubs = srv.stub_pids()
        yield srv
        assert srv.stub_pids() == stubs, "a stub died or restarted"
        assert _arena_used(srv) == 0, "the input arena was not given back"
        assert _get(srv, "/v2/health/ready") == 200


@pytest.fixture(scope="module")
def session():
    with requests.Session() as s:
        yield s


def _get(server: ShoalServer, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://{server.url}{path}", timeout=10) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as error:
        return error.code


def _arena_used(server: ShoalServer) -> float:
    url = f"http://127.0.0.1:{server.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as reply:
        text = reply.read().decode()
    prefix = 'shoal_arena_used_bytes{arena="input"}'
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(prefix))


schema = schemathesis.openapi.from_dict(_narrowed(yaml.safe_load(SPEC.read_text())))


@schema.parametrize()
@hypothesis.settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=list(hypothesis.HealthCheck),
    database=None,
)
def test_api_conforms_to_its_description(case, server, session):
    response = case.call(base_url=f"http://{server.url}", session=session, timeout=30)
    SENT[case.operation.label] += 1
    status = response.status_code
    assert status < 500 or status in SERVER_STATUSES, (
        f"{case.operation.label}: {status} {response.text[:500]}\n{case.as_curl_command()}"
    )
    if status >= 400:
        body = json.loads(response.text)
        assert isinstance(body.get("error"), str) and body["error"], response.text
    case.validate_response(response, checks=CHECKS)


def test_every_operation_was_exercised(server):
    """Runs after the generated tests (same module): the server is healthy and each operation
    got cases."""
    paths = yaml.safe_load(SPEC.read_text())["paths"].values()
    operations = sum(1 for item in paths for key in item if key in ("get", "post"))
    total = sum(SENT.values())
    print(f"\nschemathesis: {total} cases over {len(SENT)} operations")
    if not SENT:
        pytest.skip("run with the generated tests")
    assert len(SENT) == operations, sorted(SENT)
    assert _get(server, "/v2/health/ready") == 200
    assert Path(SPEC).is_file()


@pytest.mark.parametrize(
    "name, words",
    [
        (".", "needs a name that can be a directory name"),
        ("..", "model name must not contain path traversal characters"),  # Triton's check first
    ],
)
def test_load_from_files_under_a_dot_name_is_a_client_error(server, session, name, words):
    """Found by this module: the name became the scratch directory (or its parent): 500."""
    body = {"parameters": {"config": "{}", "file:1/model.py": "cGFzcw=="}}
    url = f"http://{server.url}/v2/repository/models/{name}/load"
    # requests would normalise the dot segments away: send the path as it is.
    request = requests.Request("POST", url, json=body).prepare()
    request.url = url
    response = session.send(request, timeout=30)
    assert response.status_code == 400, response.text
    assert words in response.json()["error"]


@pytest.mark.parametrize("relative", ["../{token}", "../../{token}", "1/../../{token}"])
def test_load_file_paths_cannot_leave_the_model_directory(server, session, relative):
    token = f"shoal-escape-{uuid.uuid4().hex}"
    key = "file:" + relative.format(token=token)
    body = {"parameters": {"config": "{}", key: "cGFzcw=="}}
    url = f"http://{server.url}/v2/repository/models/escape_probe/load"
    response = session.post(url, json=body, timeout=30)
    assert response.status_code == 400, response.text
    assert "inside the model directory" in response.json()["error"]
    tmp = Path(tempfile.gettempdir())
    # os.walk skips directories that vanish while it looks (other processes' temp dirs), where
    # Path.glob("**") raises.
    written = [d for d, _, files in os.walk(tmp) if token in files]
    assert not written and not list(tmp.parent.glob(token))


def _documented(path: str, method: str = "get") -> set[str]:
    return set(yaml.safe_load(SPEC.read_text())["paths"][path][method]["responses"])


def test_the_statuses_of_an_unloaded_version_and_a_raw_binary_request_are_documented():
    args = ("--model-control-mode", "explicit", "--load-model", "add_sub")
    with ShoalServer(BUNDLED, extra_args=args) as srv, requests.Session() as http:
        base = f"http://{srv.url}"
        assert http.post(f"{base}/v2/repository/models/add_sub/unload", timeout=30).ok
        version = "/v2/models/{model_name}/versions/{model_version}"
        # Statistics answer as Triton's do: 400, "requested model version is not available".
        for suffix, status in (("", 503), ("/config", 503), ("/stats", 400)):
            reply = http.get(f"{base}/v2/models/add_sub/versions/1{suffix}", timeout=10)
            assert reply.status_code == status, (suffix, reply.text)
            assert str(status) in _documented(version + suffix), f"{version}{suffix}: {status}"
        assert http.post(f"{base}/v2/repository/models/add_sub/load", timeout=60).ok
        reply = http.post(
            f"{base}/v2/models/add_sub/infer",
            data=b"\x00" * 16,
            headers={"Inference-Header-Content-Length": "0"},
            timeout=10,
        )
        assert reply.status_code == 400, reply.text  # add_sub has two inputs
        assert "Raw request must only have 1 input" in reply.json()["error"]
        header = yaml.safe_load(SPEC.read_text())["components"]["parameters"]
        assert "raw binary request" in header["InferenceHeaderContentLength"]["description"]
