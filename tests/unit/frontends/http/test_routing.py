"""The inference URL's matchers: the hand-cut one accepts what the routes' patterns match."""

from __future__ import annotations

import pytest

from shoal.frontends.http.routing import InferRoutes

pytestmark = pytest.mark.timeout(30)

ROUTES = InferRoutes(lambda scope, receive, send: None)  # type: ignore[arg-type, return-value]

TARGETS = [
    b"/v2/models/m/infer",
    b"/v2/models/identity_fp32/infer",
    b"/v2/models/m/versions/1/infer",
    b"/v2/models/m/versions/x y/infer",
    b"/v2/models/infer",
    b"/v2/models//infer",
    b"/v2/models/infer/infer",
    b"/v2/models/versions/infer",
    b"/v2/models/m/versions//infer",
    b"/v2/models/m/versions/1/2/infer",
    b"/v2/models/m/version/1/infer",
    b"/v2/models/m/infer/",
    b"/v2/models/m/inference",
    b"/v2/models/m",
    b"/v2/models/a/b/infer",
    b"/v2/model/m/infer",
    b"//v2/models/m/infer",
    b"/v2/models/m/infer?x=1",
    b"/v2/models/m%20n/infer",
    b"/v2/models/\xe9/infer",
    b"",
]


@pytest.mark.parametrize("target", TARGETS)
def test_match_target_agrees_with_the_routes(target: bytes) -> None:
    expected = None
    if b"?" not in target and b"%" not in target:
        params = ROUTES.match_path(target.decode("latin-1"))
        if params is not None:
            expected = (params["model_name"], params.get("model_version", ""))
    assert ROUTES.match_target(target) == expected


def test_the_matched_forms() -> None:
    assert ROUTES.match_target(b"/v2/models/m/infer") == ("m", "")
    assert ROUTES.match_target(b"/v2/models/m/versions/3/infer") == ("m", "3")
