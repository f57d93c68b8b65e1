"""A whole Result (every output inline, ``ipc/whole_results.py``) over a loopback stub: a request
answered through a worker's relay gets its record undecoded, every other request (the core's
own frontends, a completion hook) the decoded record; input blocks are freed either way."""

from __future__ import annotations

import asyncio

import msgpack
import numpy as np
import pytest

from shoal.ipc.tensor import InlineBytes
from shoal.supervisor.instances.loopback import Loopback
from shoal.supervisor.work import Completion, Work
from tests.unit.supervisor.instances.helpers import Setup, double, run
from tests.unit.supervisor.schedulers.helpers import WAIT

pytestmark = pytest.mark.timeout(10)


def _setup() -> Setup:
    return Setup(make_stub=Loopback(lambda name: double, inline_outputs=True))


async def _completed(work: Work) -> Completion:
    completion: Completion = await asyncio.wait_for(work.future, WAIT)
    return completion


def test_a_relayed_request_gets_its_record_undecoded():
    async def scenario():
        s = _setup()
        await s.instance.start(s.queue)
        work = s.work(3.0)
        work.relayed = True
        s.queue.put([work])
        completion = await _completed(work)
        record = completion.response
        assert record.whole is not None and record.outputs == [] and record.error is None
        assert completion.owned == []  # inline outputs own no block; the input block was freed
        outputs, error, _ = msgpack.unpackb(record.whole)
        assert error is None and outputs[0][0] == "Y" and outputs[0][3] == 4
        np.testing.assert_array_equal(np.frombuffer(outputs[0][4], np.float32), [6.0, 6.0])
        completion.release()
        await s.close()

    run(scenario())


def test_other_requests_get_the_decoded_record():
    async def scenario():
        s = _setup()
        await s.instance.start(s.queue)
        plain = s.work(2.0)
        hooked = s.work(4.0)
        hooked.relayed = True
        seen: list[Completion] = []
        hooked.on_complete = seen.append  # a hook reads the outputs: the record is decoded
        s.queue.put([plain])
        s.queue.put([hooked])
        for work, value in ((plain, 4.0), (hooked, 8.0)):
            completion = await _completed(work)
            assert completion.response.whole is None and completion.owned == []
            (output,) = completion.response.outputs
            assert (output.name, output.shape, type(output.location)) == ("Y", (1, 2), InlineBytes)
            y = np.frombuffer(output.location.data, np.float32)
            np.testing.assert_array_equal(y, [value, value])
            completion.release()
        assert len(seen) == 1
        await s.close()

    run(scenario())
