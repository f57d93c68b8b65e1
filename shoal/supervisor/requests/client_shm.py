"""Reading request inputs from, and writing outputs into, clients' shared-memory regions.

Both kinds go to the stub by descriptor: it maps a system region, or opens a CUDA region's IPC
handle, and reads inputs or writes outputs in place. Two cases go through the supervisor
instead: BYTES inputs (copied once, so that their elements can be checked and cannot change
after), and an ensemble's outputs, which the ensemble's last steps do not write themselves. The
supervisor reads and writes system regions with ``pread``/``pwrite``, never through a mapping
(a client may shrink its object at any time: see ``memory.system_shm``).
"""

from __future__ import annotations

import functools

from shoal.core.errors import InvalidArgument
from shoal.core.types import InferOutput, InferRequest, InferResponse, ParamValue
from shoal.ipc.dtypes import byte_size
from shoal.ipc.tensor import CudaRegionLocation, RegionLocation
from shoal.supervisor.memory.system_shm import Held, SharedMemoryRegistry
from shoal.supervisor.work import Work

REGION = "shared_memory_region"
OFFSET = "shared_memory_offset"
SIZE = "shared_memory_byte_size"


def _window(params: dict[str, ParamValue], what: str) -> tuple[str, int, int]:
    region = params[REGION]
    offset = params.get(OFFSET, 0)
    size = params.get(SIZE)
    if not isinstance(region, str) or not isinstance(offset, int) or not isinstance(size, int):
        raise InvalidArgument(f"{what}: '{REGION}' needs a string and '{OFFSET}'/'{SIZE}' integers")
    return region, offset, size


ClientRegion = RegionLocation | CudaRegionLocation

#: What a request holds when no region is registered (never appended to).
_NONE_HELD: Held = []


def held_regions(registry: SharedMemoryRegistry, request: InferRequest) -> Held:
    """The registered regions a request names, held until it ends (the caller releases them
    with ``registry.release``): one the client unregisters meanwhile stays until then."""
    if not registry.any_registered():  # most servers: no region, no loop over tensors
        return _NONE_HELD
    held: Held = []
    for tensor in request.inputs:
        region = tensor.parameters.get(REGION) if tensor.parameters else None
        if isinstance(region, str):
            registry.hold(region, held)
    for output in request.outputs:
        region = output.parameters.get(REGION) if output.parameters else None
        if isinstance(region, str):
            registry.hold(region, held)
    return held


def keep_inside(registry: SharedMemoryRegistry, work: Work, held: Held) -> None:
    """A request ended (cancelled, timed out) while its work is still inside a stub, which may
    still read its inputs from the client's regions or write its outputs there: the regions
    stay held until the stub is done with it (Triton holds them until the backend releases the
    request). ``held`` is emptied, so that the requester's own release lets go of nothing."""
    if not held or not work.inside:
        return
    kept = held.copy()
    held.clear()
    work.on_leave = functools.partial(registry.release, kept)


def let_go(registry: SharedMemoryRegistry, work: Work, held: Held) -> None:
    """A request ended: release its regions now, or when its work leaves its stub."""
    keep_inside(registry, work, held)
    registry.release(held)


def read_shm_inputs(
    registry: SharedMemoryRegistry, request: InferRequest
) -> dict[str, ClientRegion]:
    """Inputs given by region: where the stub finds them (it maps or opens the region itself,
    so they are never copied); their ``data`` is empty (staging checks the window's size). A
    BYTES input is read instead (its ``data`` is a copy, staged like any other input)."""
    regions: dict[str, ClientRegion] = {}
    for tensor in request.inputs:
        if REGION not in tensor.parameters:
            continue
        what = f"input '{tensor.name}' for model '{request.model_name}'"
        region, offset, size = _window(tensor.parameters, what)
        if region in registry.cuda:
            if tensor.datatype == "BYTES":  # staged, so that its elements are checked
                tensor.data = registry.cuda.read(region, offset, size, what=what)
            else:
                regions[tensor.name] = registry.cuda.location(region, offset, size, what=what)
                tensor.data = _EMPTY
        elif tensor.datatype == "BYTES":
            tensor.data = registry.read(region, offset, size, what=what)
        else:
            regions[tensor.name] = registry.location(region, offset, size, what=what)
            tensor.data = _EMPTY
    return regions


_EMPTY = memoryview(b"")


def output_regions(
    registry: SharedMemoryRegistry, request: InferRequest
) -> dict[str, ClientRegion]:
    """Outputs the client wants in a region: the stub writes them there itself."""
    regions: dict[str, ClientRegion] = {}
    for output in request.outputs:
        if REGION not in output.parameters:
            continue
        what = f"output '{output.name}' of model '{request.model_name}'"
        region, offset, size = _window(output.parameters, what)
        if region in registry.cuda:
            regions[output.name] = registry.cuda.location(region, offset, size, what=what)
        else:
            regions[output.name] = registry.location(region, offset, size, what=what)
    return regions


def placed_output(
    output_name: str, datatype: str, shape: tuple[int, ...], request: InferRequest, nbytes: int
) -> InferOutput:
    """The description of an output the stub wrote into the client's region."""
    params = next(o.parameters for o in request.outputs if o.name == output_name)
    return InferOutput(
        output_name,
        datatype,
        shape,
        memoryview(b""),
        {REGION: params[REGION], OFFSET: params.get(OFFSET, 0), SIZE: nbytes},
    )


def write_shm_outputs(
    registry: SharedMemoryRegistry, request: InferRequest, response: InferResponse
) -> None:
    """Copy outputs the client asked to receive in a region there; they then carry no data."""
    if not request.outputs:  # most requests: no dict made to find nothing
        return
    wanted = {o.name: o.parameters for o in request.outputs if REGION in o.parameters}
    if not wanted:
        return
    for index, output in enumerate(response.outputs):
        params = wanted.get(output.name)
        if params is None or REGION in output.parameters:  # absent, or written by the stub
            continue
        what = f"output '{output.name}' of model '{request.model_name}'"
        region, offset, size = _window(params, what)
        nbytes = output.data.nbytes
        if nbytes > size:
            raise InvalidArgument(
                f"shared memory size specified with the request for output '{output.name}' "
                f"({size} bytes) should be at least {nbytes} bytes to hold the results"
            )
        if region in registry.cuda:
            registry.cuda.write(region, offset, output.data, what=what)
        else:
            registry.write(region, offset, output.data, what=what)
        expected = byte_size(output.datatype, output.shape)
        assert expected is None or expected == nbytes
        response.outputs[index] = InferOutput(
            output.name,
            output.datatype,
            output.shape,
            memoryview(b""),
            {**output.parameters, REGION: region, OFFSET: offset, SIZE: nbytes},
        )
