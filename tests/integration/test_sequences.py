"""The sequence batcher through a real server: direct and oldest strategies, control tensors,
correlation ids of both kinds, implicit state and idle release."""

from __future__ import annotations

import queue

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.integration.server import TEST_MODELS, ShoalServer

pytestmark = pytest.mark.timeout(120)

MODELS = ("seq_direct", "seq_oldest", "seq_idle", "seq_decoupled", "seq_decoupled_oldest")


@pytest.fixture(scope="module")
def server():
    args = ["--model-control-mode", "explicit"]
    for name in MODELS:
        args += ["--load-model", name]
    with ShoalServer(TEST_MODELS, extra_args=tuple(args)) as running:
        yield running
        assert "Traceback" not in running.output, running.output


@pytest.fixture
def client(server):
    c = httpclient.InferenceServerClient(server.url, concurrency=8, network_timeout=60)
    yield c
    c.close()


def _in(value: int) -> list[httpclient.InferInput]:
    tensor = httpclient.InferInput("IN", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.array([[value]], np.int32))
    return [tensor]


def _step(client, model, corr, value, start=False, end=False, **kwargs):
    return client.infer(
        model, _in(value), sequence_id=corr, sequence_start=start, sequence_end=end, **kwargs
    )


def test_direct_interleaved_sequences_see_their_controls_and_state(client):
    # Two sequences in lockstep; each keeps its slot, hence its batch position.
    steps = [(True, False, 1), (False, False, 10), (False, True, 100)]
    for start, end, value in steps:
        for corr in (1001, 1002):
            result = _step(client, "seq_direct", corr, value * (corr - 1000), start, end)
            seen = result.as_numpy("SEEN")[0].tolist()
            assert seen[:4] == [int(start), int(end), 1, corr]
            assert seen[4] == corr - 1001  # slot 0, then slot 1 (padded with a null request)
    totals = [_step(client, "seq_direct", c, 0, True, True).as_numpy("OUT") for c in (7, 8)]
    assert [t.tolist() for t in totals] == [[[0]], [[0]]]  # a new sequence starts from zero


def test_direct_state_accumulates_and_is_hidden(client):
    sums = [
        int(_step(client, "seq_direct", 42, v, start=i == 0, end=i == 3).as_numpy("OUT")[0][0])
        for i, v in enumerate([1, 2, 3, 4])
    ]
    assert sums == [1, 3, 6, 10]
    result = _step(client, "seq_direct", 43, 5, True, True)
    assert result.as_numpy("STATE_OUT") is None  # the state output is the server's


def test_direct_concurrent_sequences_share_a_batch(client):
    for corr in (201, 202):
        _step(client, "seq_direct", corr, 1, start=True)
    for round_ in range(5):
        pending = [
            client.async_infer("seq_direct", _in(1), sequence_id=c, sequence_end=round_ == 4)
            for c in (201, 202)
        ]
        outs = [int(p.get_result(timeout=30).as_numpy("OUT")[0][0]) for p in pending]
        assert outs == [round_ + 2, round_ + 2]


def test_oldest_batches_sequences_with_string_ids(client):
    ids = [f"user-{n}" for n in range(4)]
    batches = []
    for step in range(3):
        pending = {
            corr: client.async_infer(
                "seq_oldest",
                _in(step + 1),
                sequence_id=corr,
                sequence_start=step == 0,
                sequence_end=step == 2,
            )
            for corr in ids
        }
        for corr, p in pending.items():
            result = p.get_result(timeout=30)
            assert result.as_numpy("CORRID_SEEN")[0][0] == corr.encode()
            assert result.as_numpy("START_SEEN")[0][0] == (1.0 if step == 0 else 0.0)
            assert int(result.as_numpy("OUT")[0][0]) == sum(range(1, step + 2))
            batches.append(int(result.as_numpy("BATCH")[0][0]))
    assert max(batches) > 1
    stats = client.get_inference_statistics("seq_oldest")["model_stats"][0]
    assert int(stats["execution_count"]) < int(stats["inference_count"])


def test_requests_without_a_sequence_are_rejected(client):
    with pytest.raises(InferenceServerException) as info:
        client.infer("seq_direct", _in(1))
    assert (
        "inference request to model 'seq_direct' must specify a non-zero or non-empty "
        "correlation ID" in str(info.value)
    )
    with pytest.raises(InferenceServerException) as info:
        _step(client, "seq_direct", 9999, 1)
    assert (
        "inference request for sequence 9999 to model 'seq_direct' must specify the START flag "
        "on the first request of the sequence" in str(info.value)
    )


def test_idle_sequence_is_released(client):
    _step(client, "seq_idle", 1, 1, start=True)  # takes the only slot, then goes idle
    # Sequence 2 waits in the backlog until the idle sequence 1 is released (1 s).
    assert _step(client, "seq_idle", 2, 2, start=True).as_numpy("OUT").tolist() == [[2]]
    with pytest.raises(InferenceServerException) as info:
        _step(client, "seq_idle", 1, 3)
    assert "must specify the START flag on the first request of the sequence" in str(info.value)
    _step(client, "seq_idle", 2, 4, end=True)


def test_sequence_parameters_over_grpc(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:

        def step(model, corr, value, start=False, end=False):
            tensor = grpcclient.InferInput("IN", [1, 1], "INT32")
            tensor.set_data_from_numpy(np.array([[value]], np.int32))
            return client.infer(
                model, [tensor], sequence_id=corr, sequence_start=start, sequence_end=end
            )

        seen = step("seq_direct", 77, 5, start=True).as_numpy("SEEN")[0][:4].tolist()
        assert seen == [1, 0, 1, 77]
        assert step("seq_direct", 77, 6, end=True).as_numpy("OUT").tolist() == [[11]]
        result = step("seq_oldest", "grpc-seq", 2, start=True, end=True)
        assert result.as_numpy("CORRID_SEEN")[0][0] == b"grpc-seq"
    finally:
        client.close()


@pytest.mark.parametrize("model", ["seq_decoupled", "seq_decoupled_oldest"])
def test_decoupled_model_keeps_implicit_state_across_a_streamed_sequence(server, model):
    """Every request of two interleaved sequences is sent at once over one gRPC stream; each
    sees the state left by its sequence's previous request's responses."""
    responses: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    values = [1, 2, 3, 4]
    for i, value in enumerate(values):
        for corr in (71, 72):
            tensor = grpcclient.InferInput("IN", [1, 1], "INT32")
            tensor.set_data_from_numpy(np.array([[value * (corr - 70)]], np.int32))
            client.async_stream_infer(
                model,
                [tensor],
                request_id=f"{corr}-{i}",
                sequence_id=corr,
                sequence_start=i == 0,
                sequence_end=i == len(values) - 1,
            )
    seen: dict[str, list[int]] = {}
    for _ in range(2 * 2 * len(values)):
        result, error = responses.get(timeout=30)
        assert error is None, error
        assert result.as_numpy("STATE_OUT") is None  # the state output is the server's
        request = result.get_response().id
        seen.setdefault(request, []).append(int(result.as_numpy("OUT")[0][0]))
    client.stop_stream()
    client.close()
    for corr in (71, 72):
        scale = corr - 70
        totals = [scale * sum(values[: i + 1]) for i in range(len(values))]
        for i in range(len(values)):
            before = totals[i - 1] if i else 0
            assert seen[f"{corr}-{i}"] == [before, totals[i]], (corr, i, seen)
