"""Device memory on the runtime side: the pool a driver-allocated memory is in a request,
and the staging that keeps it on its own device.

Device memory belongs to the device that allocated it. A request to that device names it
by token; any other device (another step of a partitioned plan, the CPU fallback) gets
a staging buffer the runtime fills with ``IBuffer.copy_to`` and, for an output, hands back
with ``IBuffer.copy_from`` after the run. The runtime never reads a driver's bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from nnapi.hal import IBuffer, IDevice, OutputShape, Request, Timing
from nnapi.hal.types import BufferToken


@dataclass(frozen=True, eq=False)
class DeviceMemoryPool(BufferToken):
    """A request pool naming device memory: the driver sees a BufferToken; the runtime
    also knows the device that owns it, its IBuffer and its size."""

    device: IDevice | None = field(default=None, compare=False)
    buffer: IBuffer | None = field(default=None, compare=False)
    size: int = 0


def needs_staging(request: Request, device: IDevice | None) -> bool:
    """True when ``request`` names device memory ``device`` does not own (``device`` None:
    any device memory, for a prepared model no allocation named, as the CPU fallback's)."""
    for pool in request.pools:
        if type(pool) is DeviceMemoryPool and (device is None or pool.device is not device):
            return True
    return False


def staged(request: Request, device: IDevice | None) -> _Staged | None:
    """None when every device memory in ``request`` belongs to ``device`` (the usual case:
    the request goes as it is); else the request with the others staged."""
    return _Staged(request, device) if needs_staging(request, device) else None


class _Staged:
    """A request whose foreign device memories are replaced by staging buffers."""

    def __init__(self, request: Request, device: IDevice | None) -> None:
        pools: list[Any] = list(request.pools)
        self._write_backs: list[tuple[DeviceMemoryPool, bytearray, list[int]]] = []
        for index, pool in enumerate(request.pools):
            if type(pool) is not DeviceMemoryPool or (device is not None and pool.device is device):
                continue
            staging = bytearray(pool.size)
            if any(not a.has_no_value and a.location.pool_index == index for a in request.inputs):
                pool.buffer.copy_to(staging)
            outputs = [position for position, a in enumerate(request.outputs)
                       if not a.has_no_value and a.location.pool_index == index]
            if outputs:
                self._write_backs.append((pool, staging, outputs))
            pools[index] = staging
        self.request = Request(request.inputs, request.outputs, pools)

    def write_back(self, shapes: list[OutputShape]) -> None:
        """Hand computed outputs back to the devices that own their memory."""
        for pool, staging, positions in self._write_backs:
            position = positions[0]
            dims = list(shapes[position].dimensions) if position < len(shapes) else []
            pool.buffer.copy_from(staging, dims)

    def run(self, execute: Callable[..., tuple[list[OutputShape], Timing]], *args: Any
            ) -> tuple[list[OutputShape], Timing]:
        shapes, timing = execute(self.request, *args)
        self.write_back(shapes)
        return shapes, timing


def execute_on(device: IDevice | None, execute: Callable[..., tuple[list[OutputShape], Timing]], request: Request,
               *args: Any) -> tuple[list[OutputShape], Timing]:
    """``execute(request, *args)`` with device memory not owned by ``device`` staged."""
    staging = staged(request, device)
    if staging is None:
        return execute(request, *args)
    return staging.run(execute, *args)
