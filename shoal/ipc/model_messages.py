"""Messages that drive a model in its stub: load, run batches, answer, log, finish.

Down (supervisor → stub): :class:`Initialize`, :class:`Execute`, :class:`Cancel`,
:class:`ReadinessCheck`, :class:`Finalize`. Up (stub → supervisor): :class:`Ready`,
:class:`Result`, :class:`Response` (a decoupled model's), :class:`Readiness`, :class:`Log`,
:class:`Finalized`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from shoal.ipc.records import RequestRecord, ResponseRecord


@dataclass(slots=True)
class Initialize:
    """Load the model and call ``initialize(args)``; ``args`` holds Triton's seven keys."""

    args: dict[str, str]
    model_file: str  # absolute path of model.py
    output_arena_id: int
    output_arena: tuple[int, int, int]  # initial, growth and limit bytes
    #: A Python-based backend's ``model.py`` (``<backend-directory>/<backend>/model.py``), which
    #: the stub runs instead of ``model_file``; "" when the model is its own ``model.py``.
    runtime_file: str = ""

    def fields(self) -> list[Any]:
        return [
            self.args,
            self.model_file,
            self.output_arena_id,
            list(self.output_arena),
            self.runtime_file,
        ]

    @classmethod
    def from_fields(cls, f: list[Any]) -> Initialize:
        return cls(f[0], f[1], f[2], tuple(f[3]), f[4])


@dataclass(slots=True)
class Execute:
    """Run ``execute`` on a batch of requests; answered by one :class:`Result`."""

    batch_id: int
    requests: list[RequestRecord]

    def __init__(self, batch_id: int, requests: list[RequestRecord]) -> None:
        # Written out: a generated __init__ stays interpreted in the compiled hot path.
        self.batch_id = batch_id
        self.requests = requests

    def fields(self) -> list[Any]:
        return [self.batch_id, [r.to_wire() for r in self.requests]]

    @classmethod
    def from_fields(cls, f: list[Any]) -> Execute:
        # By name, not cls(): compiled, that is a native constructor call, cls() a generic one.
        return Execute(f[0], [RequestRecord.from_wire(r) for r in f[1]])


@dataclass(slots=True)
class Cancel:
    """The clients of these requests went away: ``is_cancelled()`` turns true for them."""

    keys: list[int]

    def fields(self) -> list[Any]:
        return [self.keys]

    @classmethod
    def from_fields(cls, f: list[Any]) -> Cancel:
        return Cancel(list(f[0]))


@dataclass(slots=True)
class Finalize:
    """Call ``finalize()`` and exit."""

    def fields(self) -> list[Any]:
        return []

    @classmethod
    def from_fields(cls, f: list[Any]) -> Finalize:
        return cls()


@dataclass(slots=True)
class Ready:
    """``initialize`` finished; when it failed, ``error`` says why in one line (for clients)
    and ``traceback`` holds the model's traceback (for the log)."""

    error: str | None = None
    #: ``execute`` is a coroutine: several batches may be in the stub at once.
    concurrent: bool = False
    #: The model defines ``is_ready()``: model readiness asks it (``ReadinessCheck``).
    user_ready: bool = False
    traceback: str = ""

    def fields(self) -> list[Any]:
        return [self.error, self.concurrent, self.user_ready, self.traceback]

    @classmethod
    def from_fields(cls, f: list[Any]) -> Ready:
        return cls(f[0], f[1], f[2], f[3])


@dataclass(slots=True)
class ReadinessCheck:
    """Run the model's ``is_ready()`` (Triton's user-defined model readiness)."""

    def fields(self) -> list[Any]:
        return []

    @classmethod
    def from_fields(cls, f: list[Any]) -> ReadinessCheck:
        return cls()


@dataclass(slots=True)
class Readiness:
    """What ``is_ready()`` said: ``ready``, or ``error`` (it raised or returned no bool)."""

    ready: bool
    error: str | None = None

    def fields(self) -> list[Any]:
        return [self.ready, self.error]

    @classmethod
    def from_fields(cls, f: list[Any]) -> Readiness:
        return cls(f[0], f[1])


@dataclass(slots=True)
class Result:
    """Responses to an :class:`Execute`, one per request in order."""

    batch_id: int
    responses: list[ResponseRecord]
    #: Time spent in the model's execute (ns), for statistics.
    compute_ns: tuple[int, int, int] = (0, 0, 0)  # input, infer, output
    #: Positions in the batch of the requests the model released with
    #: ``TRITONSERVER_REQUEST_RELEASE_RESCHEDULE``: they run again, and have no response here.
    rescheduled: list[int] = field(default_factory=list)
    #: False when execute was not called: every request was cancelled before it started.
    executed: bool = True
    #: When the stub began and finished the batch (CLOCK_MONOTONIC ns, the supervisor's clock
    #: too): the supervisor derives the IPC legs of a request from them (--trace-overhead).
    stub_ns: tuple[int, int] = (0, 0)
    #: A Result read in its whole form (``ipc/whole_results.py``): each response's record
    #: undecoded, in order, and ``responses`` empty; None: ``responses`` are decoded.
    wholes: list[memoryview] | None = None

    def __init__(
        self,
        batch_id: int,
        responses: list[ResponseRecord],
        compute_ns: tuple[int, int, int] = (0, 0, 0),
        rescheduled: list[int] | None = None,
        executed: bool = True,
        stub_ns: tuple[int, int] = (0, 0),
        wholes: list[memoryview] | None = None,
    ) -> None:
        # Written out: a generated __init__ stays interpreted in the compiled hot path.
        self.batch_id = batch_id
        self.responses = responses
        self.compute_ns = compute_ns
        self.rescheduled = [] if rescheduled is None else rescheduled
        self.executed = executed
        self.stub_ns = stub_ns
        self.wholes = wholes

    def fields(self) -> list[Any]:
        return [
            self.batch_id,
            [r.to_wire() for r in self.responses],
            list(self.compute_ns),
            self.rescheduled,
            self.executed,
            list(self.stub_ns),
        ]

    @classmethod
    def from_fields(cls, f: list[Any]) -> Result:
        return result_from_wire(f, 0)


def result_from_wire(w: list[Any], at: int) -> Result:
    """The :class:`Result` whose fields start at ``w[at]``: the codec reads a received message
    in place (``[kind, *fields]``), with no list of its fields made first."""
    responses = [ResponseRecord.from_wire(r) for r in w[at + 1]]
    compute, stub = w[at + 2], w[at + 5]
    rescheduled = w[at + 3]
    if type(rescheduled) is not list:
        rescheduled = list(rescheduled)
    # By name, not cls(): compiled, that is a native constructor call, cls() a generic one.
    return Result(
        w[at],
        responses,
        (int(compute[0]), int(compute[1]), int(compute[2])),
        rescheduled,
        bool(w[at + 4]),
        (int(stub[0]), int(stub[1])),
    )


@dataclass(slots=True)
class Response:
    """A decoupled model's response to request ``key`` (``final`` closes the request)."""

    key: int
    response: ResponseRecord | None
    final: bool

    def __init__(self, key: int, response: ResponseRecord | None, final: bool) -> None:
        # Written out: a generated __init__ stays interpreted in the compiled hot path.
        self.key = key
        self.response = response
        self.final = final

    def fields(self) -> list[Any]:
        return [self.key, None if self.response is None else self.response.to_wire(), self.final]

    @classmethod
    def from_fields(cls, f: list[Any]) -> Response:
        response = None if f[1] is None else ResponseRecord.from_wire(f[1])
        return Response(f[0], response, f[2])


@dataclass(slots=True)
class Log:
    """A ``pb_utils.Logger`` record: level (0 info, 1 warning, 2 error, 3 verbose)."""

    level: int
    message: str
    filename: str = ""
    line: int = 0

    def fields(self) -> list[Any]:
        return [self.level, self.message, self.filename, self.line]

    @classmethod
    def from_fields(cls, f: list[Any]) -> Log:
        return cls(f[0], f[1], f[2], f[3])


@dataclass(slots=True)
class Finalized:
    """``finalize()`` returned (or raised: ``error``); the stub exits next."""

    error: str | None = None

    def fields(self) -> list[Any]:
        return [self.error]

    @classmethod
    def from_fields(cls, f: list[Any]) -> Finalized:
        return cls(f[0])
