"""Version directories and version policies."""

from __future__ import annotations

import logging

import pytest

from shoal.config import ConfigError, list_versions, select_versions


def test_list_versions_takes_numeric_directories_only(tmp_path, caplog):
    for name in ("0", "1", "3", "10", "02", "latest", ".5", "x1", "warmup", "__pycache__"):
        (tmp_path / name).mkdir()
    (tmp_path / "7").write_text("a file, not a version")
    (tmp_path / "config.pbtxt").write_text("")
    with caplog.at_level(logging.WARNING, logger="shoal"):
        assert list_versions(tmp_path) == [0, 1, 3, 10]
    # Triton's warnings, word for word: "02" is not version 2 (Triton serves none of it).
    assert sorted(caplog.messages) == [
        "ignore version directory '02' which contains leading zeros in its directory name",
        "ignore version directory 'latest' which fails to convert to integral number",
        "ignore version directory 'x1' which fails to convert to integral number",
    ]
    caplog.clear()
    assert list_versions(tmp_path, warn=False) == [0, 1, 3, 10]
    assert not caplog.messages


def test_list_versions_of_empty_model(tmp_path):
    assert list_versions(tmp_path) == []


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        (("latest", 1), [10]),
        (("latest", 2), [3, 10]),
        (("latest", 9), [1, 3, 10]),
        (("all",), [1, 3, 10]),
        (("specific", (3,)), [3]),
        (("specific", (10, 1)), [1, 10]),
    ],
)
def test_select_versions(policy, expected):
    assert select_versions(policy, [3, 1, 10]) == expected


def test_a_specific_version_that_does_not_exist_is_logged_and_the_others_serve(caplog):
    # As Triton: it loads the listed versions it finds and logs each missing one.
    with caplog.at_level(logging.ERROR, logger="shoal"):
        assert select_versions(("specific", (1, 4, 5)), [1, 2], model_name="add_sub") == [1]
    assert caplog.messages == [
        f"version {v} is specified for model 'add_sub', but the version directory is not present"
        " (versions found: 1, 2): add the version directory or change version_policy"
        for v in (4, 5)
    ]


def test_a_specific_policy_with_no_version_found_has_nothing_to_serve():
    with pytest.raises(
        ConfigError, match=r"model 'm' has no version to serve \(versions found: 2\)"
    ):
        select_versions(("specific", (1, 3)), [2], model_name="m")


@pytest.mark.parametrize("policy", [("latest", 1), ("all",)])
def test_nothing_to_serve(policy):
    with pytest.raises(ConfigError, match="model 'm' has no version to serve"):
        select_versions(policy, [], model_name="m")
