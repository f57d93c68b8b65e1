"""InferenceResponseSender: every misuse rule and message, in both transaction modes."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from shoal.stub import pb_utils
from shoal.stub.pb_utils import InferenceResponse, Tensor, TritonModelException
from tests.unit.stub.helpers import Recorder, server_request

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
CLOSED = r"^Unable to send response\. Response sender has been closed\.$"
UNSUPPORTED_FLAG = r"^Unable to send response\. Unsupported flag provided\.$"
NEEDS_RESPONSE = (
    r"^Inference Response object must be provided when the response flags is set to zero\.$"
)
MORE_THAN_ONE = (
    r"^Unable to send response\. Non-decoupled model cannot send more than one response\.$"
)
FINAL_FIRST = (
    r"^Unable to send response\. Non-decoupled model cannot send complete final before "
    r"sending a response\.$"
)
NO_STATE = (
    r"^Unable to send response\. Response sender has no reference to the decoupled state of "
    r"the model\.$"
)


def sender(decoupled: bool):
    recorder = Recorder()
    request = server_request(deliver=recorder, decoupled=decoupled)
    return request.get_response_sender(), recorder


def response():
    return InferenceResponse([Tensor("OUT", np.zeros(1))])


@pytest.mark.parametrize("decoupled", [True, False])
@pytest.mark.parametrize("flags", [2, 3, -1])
def test_unsupported_flag(decoupled, flags):
    s, recorder = sender(decoupled)
    with pytest.raises(TritonModelException, match=UNSUPPORTED_FLAG):
        s.send(response(), flags=flags)
    assert recorder.sent == []


@pytest.mark.parametrize("decoupled", [True, False])
def test_flags_zero_needs_a_response(decoupled):
    s, recorder = sender(decoupled)
    with pytest.raises(TritonModelException, match=NEEDS_RESPONSE):
        s.send()
    with pytest.raises(TritonModelException, match=NEEDS_RESPONSE):
        s.send(None, 0)
    assert recorder.sent == []


def test_decoupled_many_responses_then_final():
    s, recorder = sender(decoupled=True)
    first, second = response(), response()
    s.send(first)
    s.send(second, flags=0)
    s.send(flags=FINAL)
    assert recorder.sent == [(first, 0), (second, 0), (None, FINAL)]
    assert s._is_closed()


def test_decoupled_final_alone_is_allowed():
    s, recorder = sender(decoupled=True)
    s.send(flags=FINAL)
    assert recorder.sent == [(None, FINAL)]


def test_decoupled_response_with_final():
    s, recorder = sender(decoupled=True)
    r = response()
    s.send(r, FINAL)
    assert recorder.sent == [(r, FINAL)]


@pytest.mark.parametrize("decoupled", [True, False])
def test_send_after_final_raises_closed(decoupled):
    s, recorder = sender(decoupled)
    s.send(response(), FINAL)
    with pytest.raises(TritonModelException, match=CLOSED):
        s.send(flags=FINAL)
    if decoupled:
        with pytest.raises(TritonModelException, match=CLOSED):
            s.send(response())
    assert len(recorder.sent) == 1


def test_non_decoupled_one_response_then_final():
    s, recorder = sender(decoupled=False)
    r = response()
    s.send(r)
    s.send(flags=FINAL)
    assert recorder.sent == [(r, 0), (None, FINAL)]


def test_non_decoupled_second_response_raises():
    s, recorder = sender(decoupled=False)
    s.send(response())
    with pytest.raises(TritonModelException, match=MORE_THAN_ONE):
        s.send(response())
    with pytest.raises(TritonModelException, match=MORE_THAN_ONE):
        s.send(response(), FINAL)
    assert len(recorder.sent) == 1


def test_non_decoupled_second_response_after_final_reports_more_than_one():
    s, _ = sender(decoupled=False)
    s.send(response(), FINAL)
    with pytest.raises(TritonModelException, match=MORE_THAN_ONE):
        s.send(response())


def test_non_decoupled_final_before_response_raises():
    s, recorder = sender(decoupled=False)
    with pytest.raises(TritonModelException, match=FINAL_FIRST):
        s.send(flags=FINAL)
    assert recorder.sent == []
    s.send(response(), FINAL)  # still usable: nothing was sent


def test_closed_sender_raises():
    s, recorder = sender(decoupled=True)
    s.send(response())
    s._close()  # execute raised
    assert s._is_closed()
    with pytest.raises(TritonModelException, match=CLOSED):
        s.send(response())
    with pytest.raises(TritonModelException, match=CLOSED):
        s.send(flags=FINAL)
    assert len(recorder.sent) == 1


def test_sender_without_deliver_behaves_like_a_bls_request():
    request = server_request(deliver=None)
    s = request.get_response_sender()
    with pytest.raises(TritonModelException, match=NO_STATE):
        s.send(response(), FINAL)
    bls = pb_utils.InferenceRequest(inputs=[], requested_output_names=[], model_name="m")
    with pytest.raises(TritonModelException, match=NO_STATE):
        bls.get_response_sender().send(flags=FINAL)
    assert not bls.get_response_sender().is_cancelled()


def test_argument_types():
    s, _ = sender(decoupled=True)
    with pytest.raises(TypeError):
        s.send("not a response")
    with pytest.raises(TypeError):
        s.send(response(), flags="1")


def test_returned_response_counts_as_send_with_final():
    s, recorder = sender(decoupled=False)
    s._mark_returned(response())
    assert s._is_closed()
    assert recorder.sent == []  # the runtime sends returned responses itself
    with pytest.raises(TritonModelException, match=CLOSED):
        s.send(flags=FINAL)


def test_returning_a_response_after_sending_one_is_misuse():
    s, _ = sender(decoupled=False)
    s.send(response())
    with pytest.raises(TritonModelException, match=MORE_THAN_ONE):
        s._mark_returned(response())


def test_deliver_errors_propagate_to_the_model():
    def failing(response, flags):
        raise TritonModelException("stream gone")

    request = server_request(deliver=failing, decoupled=True)
    with pytest.raises(TritonModelException, match="stream gone"):
        request.get_response_sender().send(response())


def test_sends_from_threads_reach_deliver_in_state_order():
    s, recorder = sender(decoupled=True)
    threads = [threading.Thread(target=s.send, args=(response(),)) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    s.send(flags=FINAL)
    assert len(recorder.sent) == 9
    assert recorder.sent[-1] == (None, FINAL)
