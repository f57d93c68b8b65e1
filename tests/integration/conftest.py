from __future__ import annotations

import pytest
import tritonclient.http as httpclient

from tests.integration.server import BUNDLED, TEST_MODELS, ShoalServer


@pytest.fixture(scope="module")
def bundled_server():
    with ShoalServer(BUNDLED) as server:
        yield server


@pytest.fixture(scope="module")
def test_server():
    """The bundled models plus the test models (some of which fail to load on purpose)."""
    with ShoalServer(BUNDLED, TEST_MODELS) as server:
        yield server


@pytest.fixture
def client(bundled_server):
    c = httpclient.InferenceServerClient(bundled_server.url)
    yield c
    c.close()


@pytest.fixture
def test_client(test_server):
    c = httpclient.InferenceServerClient(test_server.url)
    yield c
    c.close()
