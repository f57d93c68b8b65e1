"""Triton's trace extension through a real server, over HTTP and gRPC: global and per-model
settings, updates, clearing a model's setting with null, validation."""

from __future__ import annotations

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.timeout(60)


def _http(server):
    return httpclient.InferenceServerClient(server.url)


def _grpc(server):
    return grpcclient.InferenceServerClient(server.grpc_url)


def _get(client, model=""):
    if isinstance(client, grpcclient.InferenceServerClient):
        settings = client.get_trace_settings(model_name=model, as_json=True)["settings"]
        return _flatten(settings)
    return client.get_trace_settings(model_name=model or None)


def _update(client, settings, model=""):
    if isinstance(client, grpcclient.InferenceServerClient):
        answer = client.update_trace_settings(model_name=model, settings=settings, as_json=True)
        return _flatten(answer["settings"])
    return client.update_trace_settings(model_name=model or None, settings=settings)


def _flatten(settings):
    """gRPC's {"k": {"value": [...]}} as HTTP's JSON: a list for trace_level, else a string."""
    flat = {}
    for key, entry in settings.items():
        values = entry.get("value", [])
        flat[key] = values if key == "trace_level" else (values[0] if values else "")
    return flat


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_global_and_model_settings(bundled_server, protocol):
    client = _http(bundled_server) if protocol == "http" else _grpc(bundled_server)
    try:
        metadata = client.get_server_metadata()
        extensions = metadata["extensions"] if protocol == "http" else metadata.extensions
        assert "trace" in extensions
        assert _get(client) == {
            "trace_file": "",
            "trace_level": ["OFF"],
            "trace_rate": "1000",
            "trace_count": "-1",
            "log_frequency": "0",
            "trace_mode": "triton",
        }
        updated = _update(client, {"trace_rate": "10"})
        assert updated["trace_level"] == ["OFF"] and updated["trace_rate"] == "10"
        # A model's settings start from the global ones; its own changes stay its own.
        model = _update(client, {"trace_count": "5", "log_frequency": "2"}, model="add_sub")
        assert model["trace_rate"] == "10" and model["trace_count"] == "5"
        assert _get(client)["trace_count"] == "-1"
        # Clearing (null) makes a model setting follow the global one again.
        _update(client, {"trace_rate": "20"})
        cleared = _update(client, {"trace_count": None}, model="add_sub")
        assert cleared["trace_count"] == "-1" and cleared["trace_rate"] == "20"
        assert cleared["log_frequency"] == "2"
        assert _get(client, "add_sub") == cleared
        # Clearing a global setting gives back its value at start, as in Triton.
        assert _update(client, {"trace_rate": None, "trace_count": None})["trace_rate"] == "1000"
        assert _get(client, "add_sub")["trace_count"] == "-1"
    finally:
        _update(client, {"log_frequency": None}, model="add_sub")
        _update(client, {"trace_level": ["OFF"], "trace_rate": "1000"})
        client.close()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize(
    ("settings", "model", "message"),
    [
        ({"trace_level": ["LOUD"]}, "", "unknown level 'LOUD'"),
        ({"trace_rate": "0"}, "", "'trace_rate' must be at least 1, got 0"),
        ({"trace_count": "many"}, "", "'trace_count' must be an integer"),
        ({"trace_colour": "red"}, "", "unknown trace setting 'trace_colour'"),
        ({"trace_file": "/tmp/x.json"}, "", "trace file location can not be updated"),
        ({"trace_rate": "1"}, "no_such_model", "Request for unknown model : no_such_model$"),
        # Triton's answer without a trace file (shoal has none: it writes no traces).
        ({"trace_level": ["TIMESTAMPS"]}, "", "trace file name is not given"),
        ({"trace_level": ["TENSORS"]}, "add_sub", "trace file name is not given"),
    ],
)
def test_invalid_settings_are_refused(bundled_server, protocol, settings, model, message):
    client = _http(bundled_server) if protocol == "http" else _grpc(bundled_server)
    try:
        with pytest.raises(InferenceServerException, match=message):
            _update(client, settings, model)
        assert _get(client)["trace_rate"] == "1000"  # nothing changed
    finally:
        client.close()
