"""grpc-core's choice of an algorithm for a compression level among those a client accepts."""

from __future__ import annotations

import asyncio
import gzip
import zlib

import pytest

from shoal.frontends.grpc.native_compression import (
    AnswerCompression,
    Squeeze,
    algorithm_for_level,
)

pytestmark = pytest.mark.timeout(30)

MODEL_INFER = b"/inference.GRPCInferenceService/ModelInfer"


@pytest.mark.parametrize(
    ("level", "accepted", "expected"),
    [
        ("low", b"identity,deflate,gzip", b"gzip"),
        ("medium", b"identity,deflate,gzip", b"deflate"),  # index 2 // 2 of (gzip, deflate)
        ("high", b"identity,deflate,gzip", b"deflate"),
        ("medium", b"gzip", b"gzip"),
        ("high", b"identity, gzip", b"gzip"),
        ("low", b"deflate", b"deflate"),
        ("high", b"identity", None),
        ("high", b"br", None),
        ("high", None, None),
        ("none", b"gzip", None),
    ],
)
def test_the_level_picks_among_the_accepted(
    level: str, accepted: bytes | None, expected: bytes | None
) -> None:
    assert algorithm_for_level(level, accepted) == expected


def test_only_the_two_inference_methods_are_compressed() -> None:
    compression = AnswerCompression.of("high")
    assert compression is not None and AnswerCompression.of("none") is None
    squeeze = compression.for_call(MODEL_INFER, b"gzip")
    assert squeeze is not None and squeeze.encoding == b"gzip"
    assert compression.for_call(MODEL_INFER, b"gzip") is squeeze  # kept per accept value
    stream = compression.for_call(b"/inference.GRPCInferenceService/ModelStreamInfer", b"gzip")
    assert stream is squeeze
    assert compression.for_call(b"/inference.GRPCInferenceService/ModelConfig", b"gzip") is None


@pytest.mark.parametrize("size", [10, 2 << 20])
def test_a_message_inflates_back(size: int) -> None:  # a large one deflated in a thread
    body = bytes(range(256)) * (size // 256 + 1)
    assert gzip.decompress(asyncio.run(Squeeze(b"gzip").compressed(body))) == body
    assert zlib.decompress(asyncio.run(Squeeze(b"deflate").compressed(body))) == body
