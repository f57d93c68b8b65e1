"""``--frontend-workers N|auto``: auto keeps one process on two cores."""

from __future__ import annotations

import argparse

import pytest

from shoal._flag_types import auto_frontend_workers, parse_workers
from shoal._serve_parser import build_parser
from shoal.cli import options_from_args

pytestmark = pytest.mark.timeout(10)


@pytest.mark.parametrize(("cores", "workers"), [(1, 1), (2, 1), (4, 1), (5, 2), (16, 7), (64, 8)])
def test_auto_leaves_cores_to_the_core_and_the_stubs(cores, workers):
    assert auto_frontend_workers(cores) == workers


def test_the_default_is_auto_and_bad_values_are_refused():
    args = build_parser().parse_args(["serve", "--model-repository", "r"])
    assert options_from_args(args).frontend_workers == auto_frontend_workers()
    args = build_parser().parse_args(
        ["serve", "--model-repository", "r", "--frontend-workers", "3"]
    )
    assert options_from_args(args).frontend_workers == 3
    assert parse_workers("AUTO") == auto_frontend_workers()
    with pytest.raises(argparse.ArgumentTypeError):
        parse_workers("0")
