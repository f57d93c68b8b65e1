"""--model-control-mode=poll follows models added to, changed in and removed from the repository."""

from __future__ import annotations

import shutil
import time

import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.integration.server import BUNDLED, ShoalServer

pytestmark = pytest.mark.timeout(120)


def _wait_until(condition, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.05)  # polling the server's state, which the repository poller changes


def test_poll_mode_follows_the_repository(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    shutil.copytree(BUNDLED / "add_sub", repo / "add_sub")
    args = ("--model-control-mode", "poll", "--repository-poll-secs", "0.2")
    with ShoalServer(repo, extra_args=args) as server:
        client = httpclient.InferenceServerClient(server.url)
        assert client.is_model_ready("add_sub")
        with pytest.raises(InferenceServerException, match="not allowed if polling is enabled"):
            client.load_model("add_sub")

        shutil.copytree(BUNDLED / "string_upper", repo / "string_upper")
        _wait_until(lambda: client.is_model_ready("string_upper"), "string_upper is loaded")

        config = repo / "add_sub" / "config.pbtxt"
        config.write_text(config.read_text().replace("count: 1", "count: 2"))
        _wait_until(
            lambda: (
                len(client.get_model_config("add_sub")["instance_group"]) == 1
                and client.get_model_config("add_sub")["instance_group"][0]["count"] == 2
            ),
            "add_sub is reloaded with two instances",
        )
        assert client.is_model_ready("add_sub")

        shutil.rmtree(repo / "string_upper")
        _wait_until(lambda: not client.is_model_ready("string_upper"), "string_upper is gone")
        _wait_until(
            lambda: "string_upper" not in {m["name"] for m in client.get_model_repository_index()},
            "string_upper leaves the repository index",
        )
        client.close()


def _metadata_error(client: httpclient.InferenceServerClient, name: str, version: str = "") -> str:
    try:
        client.get_model_metadata(name, version)
    except InferenceServerException as error:
        return str(error.message())
    return ""


def test_a_model_removed_from_the_repository_has_no_available_versions(tmp_path):
    # Triton unloads it and keeps it in its table: requests for it say it has no version
    # (Triton's QA checks those words), where a name never seen is "not found".
    repo = tmp_path / "repo"
    repo.mkdir()
    shutil.copytree(BUNDLED / "add_sub", repo / "add_sub")
    shutil.copytree(BUNDLED / "string_upper", repo / "string_upper")
    args = ("--model-control-mode", "poll", "--repository-poll-secs", "0.2")
    with ShoalServer(repo, extra_args=args) as server:
        client = httpclient.InferenceServerClient(server.url)
        try:
            assert client.is_model_ready("string_upper")
            shutil.rmtree(repo / "string_upper")
            _wait_until(
                lambda: (
                    "string_upper" not in {m["name"] for m in client.get_model_repository_index()}
                ),
                "string_upper leaves the repository index",
            )
            expected = "Request for unknown model: 'string_upper' has no available versions"
            assert _metadata_error(client, "string_upper") == expected
            with pytest.raises(InferenceServerException, match="'never_there' is not found"):
                client.get_model_metadata("never_there")
            assert client.is_server_ready()
            assert client.is_model_ready("add_sub")

            shutil.copytree(BUNDLED / "string_upper", repo / "string_upper")
            _wait_until(lambda: client.is_model_ready("string_upper"), "string_upper is back")
            assert client.get_model_metadata("string_upper")["name"] == "string_upper"
        finally:
            client.close()


def test_a_version_removed_from_the_model_directory_stays_listed_unloaded(tmp_path):
    # Triton keeps a version whose directory left in its table: the index lists it unloaded and
    # a request for it is "not at ready state" (Triton's QA checks those words), not "not found".
    repo = tmp_path / "repo"
    shutil.copytree(BUNDLED / "add_sub", repo / "add_sub")
    shutil.copytree(repo / "add_sub" / "1", repo / "add_sub" / "2")
    config = repo / "add_sub" / "config.pbtxt"
    config.write_text(config.read_text() + "\nversion_policy: { all { } }\n")
    args = ("--model-control-mode", "poll", "--repository-poll-secs", "0.2")
    with ShoalServer(repo, extra_args=args) as server:
        client = httpclient.InferenceServerClient(server.url)
        try:
            assert client.is_model_ready("add_sub", "1") and client.is_model_ready("add_sub", "2")
            shutil.rmtree(repo / "add_sub" / "1")
            unloaded = {"name": "add_sub", "version": "1", "state": "UNAVAILABLE"}
            _wait_until(
                lambda: any(
                    unloaded.items() <= entry.items() and entry.get("reason") == "unloaded"
                    for entry in client.get_model_repository_index()
                ),
                "version 1 is listed unloaded",
            )
            _wait_until(lambda: client.is_model_ready("add_sub", "2"), "version 2 serves")
            expected = "Request for unknown model: 'add_sub' version 1 is not at ready state"
            assert _metadata_error(client, "add_sub", "1").startswith(expected)
            with pytest.raises(InferenceServerException, match="version is not available"):
                client.get_inference_statistics("add_sub", "1")
            assert client.is_server_ready()
            assert client.get_model_metadata("add_sub")["versions"] == ["2"]
        finally:
            client.close()
