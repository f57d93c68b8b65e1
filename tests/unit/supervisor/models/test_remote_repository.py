"""Remote repositories: URL parsing, change detection from listings, and the mirror itself, run
against fsspec's local file system standing in for a bucket (the S3 path is tested end to end in
tests/integration/test_remote_repository.py)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import fsspec
import pytest

from shoal.supervisor.models.remote_repository import (
    Changes,
    RemoteLocation,
    RemoteRepositoryError,
    is_remote,
    parse_location,
)
from shoal.supervisor.models.remote_repository._filesystem import open_filesystem, storage_options
from shoal.supervisor.models.remote_repository._listing import compare, fingerprint, group_by_model
from shoal.supervisor.models.remote_repository._mirror import MANIFEST, RemoteRepository

# -- URLs ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "protocol", "bucket", "prefix", "endpoint", "account"),
    [
        ("s3://bucket/path/to/repo", "s3", "bucket", "path/to/repo", "", ""),
        ("s3://bucket", "s3", "bucket", "", "", ""),
        ("s3://bucket/models/", "s3", "bucket", "models", "", ""),
        (
            "s3://minio.local:9000/bucket/models",
            "s3",
            "bucket",
            "models",
            "http://minio.local:9000",
            "",
        ),
        ("s3://https://10.0.0.1:443/bucket/m", "s3", "bucket", "m", "https://10.0.0.1:443", ""),
        ("gs://bucket/models", "gcs", "bucket", "models", "", ""),
        ("az://container/models", "abfs", "container", "models", "", ""),
        ("as://account/container/models", "abfs", "container", "models", "", "account"),
    ],
)
def test_parse_location(url, protocol, bucket, prefix, endpoint, account):
    location = parse_location(url)
    assert (location.protocol, location.bucket, location.prefix) == (protocol, bucket, prefix)
    assert (location.endpoint, location.account, location.url) == (endpoint, account, url)
    assert location.root == f"{bucket}/{prefix}".rstrip("/")
    assert is_remote(url)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("hdfs://name/models", "unsupported scheme 'hdfs://'"),
        ("s3://", "'s3://' names no bucket"),
        ("as://account", "names no account/container"),
        ("s3://bucket/../etc", "'.' and '..' are not allowed"),
    ],
)
def test_parse_location_errors_name_the_url(url, message):
    with pytest.raises(RemoteRepositoryError, match=message.replace(".", r"\.")) as error:
        parse_location(url)
    assert f"'{url}'" in str(error.value)


def test_local_paths_are_not_remote():
    assert not is_remote("/models")
    assert not is_remote("model_repository")


# -- environment --------------------------------------------------------------------------------


def test_s3_endpoint_and_region_come_from_the_environment():
    location = parse_location("s3://bucket/models")
    assert storage_options(location, {}) == {}
    env = {"AWS_ENDPOINT_URL": "http://a:1", "AWS_DEFAULT_REGION": "eu-west-1"}
    assert storage_options(location, env) == {
        "client_kwargs": {"endpoint_url": "http://a:1", "region_name": "eu-west-1"}
    }
    env |= {"AWS_ENDPOINT_URL_S3": "http://s3:2", "AWS_REGION": "us-west-2"}
    assert storage_options(location, env)["client_kwargs"] == {
        "endpoint_url": "http://s3:2",
        "region_name": "us-west-2",
    }


def test_the_urls_host_and_port_win_over_the_environment():
    location = parse_location("s3://minio:9000/bucket/models")
    options = storage_options(location, {"AWS_ENDPOINT_URL": "http://elsewhere:1"})
    assert options["client_kwargs"]["endpoint_url"] == "http://minio:9000"


def test_azure_account_from_the_url_or_tritons_variables():
    env = {"AZURE_STORAGE_ACCOUNT": "envacct", "AZURE_STORAGE_KEY": "k"}
    assert storage_options(parse_location("az://c/m"), env) == {
        "account_name": "envacct",
        "account_key": "k",
    }
    assert storage_options(parse_location("as://urlacct/c/m"), {}) == {"account_name": "urlacct"}


@pytest.mark.skipif(importlib.util.find_spec("gcsfs") is not None, reason="gcsfs is installed")
def test_a_missing_backend_names_the_extra_to_install():
    with pytest.raises(RemoteRepositoryError, match=r"pip install 'shoal\[gcs\]'") as error:
        open_filesystem(parse_location("gs://bucket/models"), {})
    assert "'gs://bucket/models'" in str(error.value)


# -- listings -----------------------------------------------------------------------------------


def _info(size: int, etag: str) -> dict[str, object]:
    return {"size": size, "ETag": etag, "type": "file"}


def test_group_by_model_keeps_model_objects_only():
    listing = {
        "b/models/README.md": _info(1, "r"),  # not in a model directory
        "b/models/a/config.pbtxt": _info(10, "c"),
        "b/models/a/1/model.py": _info(20, "m"),
        "b/models/empty/": _info(0, "e"),  # a "folder" object
        "b/models/.hidden/x": _info(1, "h"),
        "b/models/evil/../../x": _info(1, "x"),
        "b/models2/other/config.pbtxt": _info(1, "o"),  # a sibling prefix, not ours
    }
    models = group_by_model("b/models", listing)
    assert sorted(models) == ["a", "empty"]
    assert sorted(f.path for f in models["a"]) == ["1/model.py", "config.pbtxt"]
    assert [f.path for f in models["empty"]] == ["/"]
    assert fingerprint(models["a"]) == (("1/model.py", 20, "m"), ("config.pbtxt", 10, "c"))


def test_compare_finds_added_changed_and_removed_models():
    known = {"same": (("c", 1, "x"),), "changed": (("c", 1, "x"),), "gone": (("c", 1, "x"),)}
    listed = {"same": (("c", 1, "x"),), "changed": (("c", 1, "y"),), "new": (("c", 2, "z"),)}
    assert compare(known, listed) == Changes(("changed", "new"), ("gone",))
    # A listing of one model's prefix says nothing about the others.
    assert compare(known, {}, scope=("changed",)) == Changes((), ("changed",))
    assert compare(known, listed, scope=("new",)) == Changes(("new",), ())


# -- the mirror ---------------------------------------------------------------------------------


@pytest.fixture
def store(tmp_path: Path) -> Path:
    """A "bucket" on the local file system with one model."""
    root = tmp_path / "bucket" / "models"
    (root / "add" / "1").mkdir(parents=True)
    (root / "add" / "config.pbtxt").write_text('name: "add"\n')
    (root / "add" / "1" / "model.py").write_text("# v1\n")
    return root


def _mirror(store: Path, cache: Path) -> RemoteRepository:
    location = RemoteLocation(
        url="s3://bucket/models", protocol="file", extra="", bucket=str(store)
    )
    return RemoteRepository(location, cache, fsspec.filesystem("file"))


def test_mirror_downloads_changes_only(store, tmp_path):
    cache = tmp_path / "cache"
    mirror = _mirror(store, cache)
    try:
        assert mirror.sync() == Changes(("add",), ())
        assert (cache / "add" / "1" / "model.py").read_text() == "# v1\n"
        first = (cache / "add" / "config.pbtxt").stat().st_mtime_ns
        assert mirror.sync() == Changes()
        assert (cache / "add" / "config.pbtxt").stat().st_mtime_ns == first  # not downloaded

        (store / "add" / "1" / "model.py").write_text("# v2\n")  # same size: mtime tells
        os.utime(store / "add" / "1" / "model.py", (1, 1))
        (store / "sub" / "1").mkdir(parents=True)
        (store / "sub" / "config.pbtxt").write_text('name: "sub"\n')
        assert mirror.sync() == Changes(("add", "sub"), ())
        assert (cache / "add" / "1" / "model.py").read_text() == "# v2\n"
        assert sorted(p.name for p in cache.iterdir() if not p.name.startswith(".")) == [
            "add",
            "sub",
        ]

        for path in sorted((store / "sub").rglob("*"), reverse=True):
            path.rmdir() if path.is_dir() else path.unlink()
        assert mirror.sync("add") == Changes()  # a one-model sync leaves the others alone
        assert (cache / "sub").is_dir()
        assert mirror.sync("sub") == Changes((), ("sub",))
        assert not (cache / "sub").exists()
        assert mirror.models == ("add",)
        assert mirror.sync("../bucket") == mirror.sync(".incoming-x") == Changes()
    finally:
        mirror.close()


def test_a_kept_cache_is_reused_and_checked(store, tmp_path):
    cache = tmp_path / "cache"
    first = _mirror(store, cache)
    first.sync()
    first.close()
    (cache / ".incoming-crashed").mkdir()  # left by a killed server
    (cache / "stray").mkdir()  # a copy the manifest does not vouch for

    second = _mirror(store, cache)
    try:
        assert second.sync() == Changes((), ("stray",))  # "add" is not downloaded again
        assert not (cache / ".incoming-crashed").exists()
        assert "add" in (cache / MANIFEST).read_text()
    finally:
        second.close()


def test_one_cache_directory_serves_one_server(store, tmp_path):
    first = _mirror(store, tmp_path / "cache")
    try:
        with pytest.raises(RemoteRepositoryError, match="in use by another shoal process"):
            _mirror(store, tmp_path / "cache")
    finally:
        first.close()
