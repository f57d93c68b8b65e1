"""What an instance's stub answers, made into completions: the ``Result`` of a batch and each
``Response`` of a decoupled model's request, with their statistics."""

from __future__ import annotations

import time

from shoal.core.errors import Cancelled, InvalidArgument, ShoalError
from shoal.ipc import messages as msg
from shoal.ipc import whole_results
from shoal.ipc.arena import Block
from shoal.ipc.tensor import CudaLocation
from shoal.supervisor.extensions.statistics import StatsRecorder
from shoal.supervisor.instances.channel import StubChannel
from shoal.supervisor.instances.decoupled import OpenStream, OpenStreams, response_blocks
from shoal.supervisor.instances.ledger import InFlightLedger
from shoal.supervisor.instances.outputs import StubOutputs, owned_outputs
from shoal.supervisor.instances.spec import InstanceScope
from shoal.supervisor.work import Completion, Work


class Answers:
    """Completes the requests of the batches the stub answers."""

    def __init__(
        self,
        scope: InstanceScope,
        ledger: InFlightLedger,
        streams: OpenStreams,
        outputs: StubOutputs,
        stats: StatsRecorder,
    ) -> None:
        self._name = scope.name
        self._free_inputs = scope.free_inputs
        self._cuda = scope.directory.cuda
        self._ledger = ledger
        self._streams = streams
        self._outputs = outputs
        self._stats = stats
        #: Running model_warmup: its executions are not client traffic, so not counted.
        self.warming = False

    def complete(self, proc: StubChannel, result: msg.Result) -> None:
        """A batch's Result: each request gets its completion, is rescheduled, or (decoupled)
        learns its compute times."""
        entry = self._ledger.done(proc, result.batch_id)
        if entry is None:
            return
        batch = entry.batch
        received_ns = time.monotonic_ns()
        if batch and result.executed and not self.warming:
            self._record_execution(batch, result, received_ns)
        wholes = result.wholes
        if wholes is not None and _all_answered_here(batch):
            # No request rescheduled (the stub chose the whole form): each record is relayed
            # as it came, or decoded for the core's own use. (By index: compiled, zip() is a
            # generic iterator per Result.)
            if len(wholes) != len(batch):
                raise ValueError(f"{len(wholes)} responses to a batch of {len(batch)}")
            for index in range(len(batch)):
                work = batch[index]
                self._answer(proc, work, _record(work, wholes[index]), result, received_ns)
            return
        if wholes is not None:  # (a decoupled request: not a batch the stub sends whole)
            result.responses = [whole_results.response_of(whole) for whole in wholes]
        if result.rescheduled or not _all_answered_here(batch):
            self._complete_mixed(proc, batch, result, received_ns)
            return
        # Every request gets its response: no set of ids, no filtered list.
        for work, response in zip(batch, result.responses, strict=True):
            self._answer(proc, work, response, result, received_ns)

    def _complete_mixed(
        self, proc: StubChannel, batch: list[Work], result: msg.Result, received_ns: int
    ) -> None:
        """A batch with requests rescheduled or decoupled: those are answered apart."""
        again = self._after_execute(batch, result)
        answered = [w for w in batch if w.stream is None]  # decoupled requests answer apart
        for work, response in zip(answered, result.responses, strict=True):
            if id(work) not in again:  # received_ns: when the stub's Result was read
                self._answer(proc, work, response, result, received_ns)

    def on_response(self, proc: StubChannel, message: msg.Response) -> None:
        """One response of a decoupled model's request."""
        stream = self._streams.get(message.key)
        body = message.response
        if stream is None:  # the request was failed already (e.g. shutdown): drop the response
            if body is not None:
                self._outputs.drop(proc, body)
            return
        if not self.warming:
            self._response_stats(stream, body)
        if message.final:
            self._final_response(stream.work)
        completion = None
        if body is not None:
            # An error response is one response among the others (Triton's too): the request
            # goes on until the model sends the final flag.
            completion = self._stream_completion(proc, stream.work, body)
        stream.push(completion, message.final)

    def reschedule(self, work: Work) -> None:
        """The model released ``work`` with RESCHEDULE: it goes back to its scheduler, inputs and
        open response stream kept; a scheduler that cannot take it back fails it, as Triton."""
        if work.reschedule is not None and not work.abandoned:
            work.reschedule(work, True)
            return
        error: ShoalError = InvalidArgument(
            "Request is released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, while the model "
            f"of instance '{self._name}' does not support rescheduling: it needs "
            "sequence_batching { iterative_sequence: true }"
        )
        if work.abandoned:
            error = Cancelled(f"a request of instance '{self._name}' was cancelled")
        stream = self._streams.pop(work.record.key)
        if stream is not None:
            stream.fail(error)
            return
        self._free_inputs(work.input_blocks)
        if not work.future.done():
            work.future.set_exception(error)

    def _record_execution(self, batch: list[Work], result: msg.Result, received_ns: int) -> None:
        size = 0
        for work in batch:  # (a loop: no generator per Result)
            size += work.batch_size
        self._stats.execution(size, result.compute_ns)
        if self._stats.overhead is not None and result.stub_ns[0]:
            for work in batch:
                self._stats.stage("ipc_in", result.stub_ns[0] - work.dispatched_ns)
                self._stats.stage("ipc_out", received_ns - result.stub_ns[1])

    def _after_execute(self, batch: list[Work], result: msg.Result) -> set[int]:
        """Reschedule the requests the model released so; give the decoupled ones their
        compute times. Returns the ids of the rescheduled."""
        again = {id(batch[i]) for i in result.rescheduled if i < len(batch)}
        for work in batch:
            if id(work) in again:
                self.reschedule(work)
            elif work.stream is not None and not self.warming:
                work.compute_ns = result.compute_ns if result.executed else (0, 0, 0)
                if work.final_ns:  # the final response came before execute returned
                    # The request lasted as long as its execution at least (Triton ends it at
                    # the execution's end): never a success shorter than its compute_infer.
                    work.final_ns = time.monotonic_ns()
                    self._stream_done(work)
        return again

    def _answer(
        self, proc: StubChannel, work: Work, answer: msg.ResponseRecord, result: msg.Result, at: int
    ) -> None:
        owned = self._finish_request(proc, work, answer)
        cuda = self._outputs.adopt_cuda(proc, answer) if self._cuda.lent_count else _NO_CUDA
        if work.abandoned:  # the client went away: nobody will release the outputs
            self._outputs.release_outputs(proc, owned)
            self._outputs.release_cuda(cuda)
            return
        # Queued until the stub started the batch: a request sent ahead waited in the stub's
        # ring, which is queueing too (the stub stamps the same monotonic clock).
        queue_ns = max(work.dispatched_ns, result.stub_ns[0]) - work.enqueued_ns
        completion = Completion(
            answer, self._outputs, proc, owned, queue_ns, result.compute_ns, None, at
        )
        if cuda:
            completion.owned_cuda = cuda
        if work.on_complete is not None:
            work.on_complete(completion)
        work.answer(completion)

    def _finish_request(
        self, proc: StubChannel, work: Work, response: msg.ResponseRecord
    ) -> list[Block]:
        """The request leaves its scheduler; returns the blocks its completion owns (its other
        input blocks are freed)."""
        if work.reschedule is not None:
            work.reschedule(work, False)
        inputs = work.input_blocks
        if response.whole is not None or not response.outputs:
            # A relayed record, or no outputs: nothing in a block is the completion's.
            if inputs:
                self._free_inputs(inputs)
            return _NO_BLOCKS
        outputs = response_blocks(response)
        if not outputs and not inputs:  # small outputs, inline, from small inline inputs
            return _NO_BLOCKS
        arena_id = proc.output_arena_id
        owned = [b for b in outputs if b.arena_id == arena_id]
        if owned:
            self._outputs.lend(len(owned))
        freed: list[Block] = []
        for block in inputs:
            if block in outputs:  # an input returned unchanged: its block is the response's now
                owned.append(block)
            else:
                freed.append(block)
        if freed:
            self._free_inputs(freed)
        return owned

    def _final_response(self, work: Work) -> None:
        self._streams.pop(work.record.key)
        if work.reschedule is not None:
            work.reschedule(work, False)
        if not self.warming:
            work.final_ns = time.monotonic_ns()
            if work.compute_ns is not None:  # else when execute returns (complete)
                self._stream_done(work)

    def _stream_completion(
        self, proc: StubChannel, work: Work, body: msg.ResponseRecord
    ) -> Completion:
        owned = owned_outputs(proc, body)
        if owned:
            self._outputs.lend(len(owned))
        completion = Completion(body, self._outputs, proc, owned)
        if self._cuda.lent_count:
            completion.owned_cuda = self._outputs.adopt_cuda(proc, body)
        if body.error is None and work.on_complete is not None:
            work.on_complete(completion)
        return completion

    def _stream_done(self, work: Work) -> None:
        """A decoupled request's statistics, as Triton's: from enqueued to its final response
        (or to its execution's end, if that came later), with the compute times of the
        execution that ran it."""
        compute = work.compute_ns if work.compute_ns is not None else (0, 0, 0)
        queue_ns = work.dispatched_ns - work.enqueued_ns
        self._stats.success(work.batch_size, work.final_ns - work.enqueued_ns, queue_ns, compute)

    def _response_stats(self, stream: OpenStream, body: msg.ResponseRecord | None) -> None:
        now = time.monotonic_ns()
        start = stream.work.dispatched_ns
        previous = stream.last_ns or start
        if body is None:
            outcome = "empty"
        elif body.error is not None:
            outcome = "fail"
        else:
            outcome = "success"
        self._stats.response(stream.responses, outcome, now - previous, now - start)
        if stream.responses == 0 and body is not None and self._stats.latencies is not None:
            self._stats.first_response(now - stream.work.enqueued_ns)
        stream.responses += 1
        stream.last_ns = now


def _record(work: Work, whole: memoryview) -> msg.ResponseRecord:
    """The response record of ``work`` from its bytes in a whole Result: undecoded where the
    core only relays it to a frontend worker, decoded where the core reads its outputs (its
    own frontends, a hook such as the sequence batcher's implicit state)."""
    if work.relayed and work.on_complete is None:
        return whole_results.relayed(whole)
    return whole_results.response_of(whole)


def _all_answered_here(batch: list[Work]) -> bool:
    """No request of ``batch`` is a decoupled one (those answer through their stream)."""
    for work in batch:  # noqa: SIM110 (a loop: no generator per batch)
        if work.stream is not None:
            return False
    return True


#: What a response without GPU tensors owns of the CUDA pools.
_NO_CUDA: list[CudaLocation] = []
#: What a completion owns whose outputs and inputs lie in no block (small tensors, inline):
#: shared, never added to (a completion's blocks are replaced, not appended to).
_NO_BLOCKS: list[Block] = []
