"""The names a load request may give, checked before the repository is read, in Triton's words."""

from __future__ import annotations

import pytest

from shoal.core.errors import InvalidArgument
from shoal.supervisor.models.preparation import check_model_name

pytestmark = pytest.mark.timeout(10)


@pytest.mark.parametrize("name", ["", " ", "\t", " \t \n ", "\r\f\v"])
def test_an_empty_or_blank_name_is_refused(name):
    with pytest.raises(InvalidArgument) as info:
        check_model_name(name)
    assert str(info.value) == "Model name cannot be empty. Please enter a valid name to deploy."


@pytest.mark.parametrize(
    "name", ["..", " ..", ".. ", "../etc", "a/../b", "/etc/passwd", "model/", "model/sub"]
)
def test_a_name_that_leaves_the_repository_is_refused(name):
    with pytest.raises(InvalidArgument) as info:
        check_model_name(name)
    assert str(info.value) == (
        f"invalid model name '{name}', model name must not contain path traversal characters"
    )


@pytest.mark.parametrize("name", ["model123", "model.version1", "...", "..my_model", "model..1"])
def test_dots_alone_do_not_make_a_traversal(name):
    check_model_name(name)
