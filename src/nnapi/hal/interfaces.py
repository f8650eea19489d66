"""The driver interfaces of the NN HAL: IDevice, IPreparedModel, IBurst, IExecution, IBuffer
and IFencedExecutionCallback (after Android's NN HAL 1.3 / AIDL interfaces).

Methods added after HAL 1.0 have default implementations, so a driver implements only
what it supports: no extensions, no cache files, no driver-allocated memory, fenced
execution by waiting and then executing.
"""

from __future__ import annotations

import os
import select
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence

from nnapi.codes import DeviceTypeCode, FeatureLevelCode
from nnapi.hal.types import (
    BufferDesc,
    BufferRole,
    Capabilities,
    ErrorStatus,
    ExecutionPreference,
    Extension,
    HalError,
    Model,
    OutputShape,
    Priority,
    Request,
    Timing,
)


class IFencedExecutionCallback(ABC):
    """What execute_fenced hands back beside its sync fence."""

    @abstractmethod
    def get_execution_info(self) -> tuple[ErrorStatus, Timing, Timing]:
        """(status, timing launched -> done, timing fence signalled -> done)."""


class _DoneCallback(IFencedExecutionCallback):
    def __init__(self, status: ErrorStatus, launched: Timing, fenced: Timing) -> None:
        self._info = (status, launched, fenced)

    def get_execution_info(self) -> tuple[ErrorStatus, Timing, Timing]:
        return self._info


def wait_for_fences(fds: Sequence[int], deadline_ns: int | None = None) -> None:
    """Block until every sync fence (an fd readable when signalled) is signalled; HalError
    MISSED_DEADLINE_TRANSIENT past ``deadline_ns``, INVALID_ARGUMENT for a bad fd."""
    for fd in fds:
        poller = select.poll()
        try:
            poller.register(fd, select.POLLIN)
        except (OSError, TypeError, ValueError) as error:
            raise HalError(ErrorStatus.INVALID_ARGUMENT, f"bad sync fence {fd!r}: {error}") from None
        while True:
            timeout_ms = None
            if deadline_ns is not None:
                timeout_ms = max(0, (deadline_ns - time.monotonic_ns()) // 1_000_000)
            events = poller.poll(timeout_ms)
            if events:
                if events[0][1] & (select.POLLERR | select.POLLNVAL):
                    raise HalError(ErrorStatus.INVALID_ARGUMENT, f"sync fence {fd} is in error")
                break
            if deadline_ns is not None and time.monotonic_ns() >= deadline_ns:
                raise HalError(ErrorStatus.MISSED_DEADLINE_TRANSIENT, "deadline passed waiting for fences")


class IPreparedModel(ABC):
    """A model prepared (compiled) for one device."""

    #: True only where every answer of a successful execution (its output shapes and
    #: timing, through execute, a burst or a reusable execution) is well formed by
    #: construction -- the runtime's own drivers, held to it by their tests, and the driver
    #: service's client, which checks each reply itself -- so the runtime does not check
    #: it again per execution (~0.35 us); any other driver's answers are checked
    #: (execution_plan.checked_answer).
    answers_checked: bool = False

    @abstractmethod
    def execute(
        self,
        request: Request,
        measure_timing: bool = False,
        deadline_ns: int | None = None,
        loop_timeout_ns: int | None = None,
    ) -> tuple[list[OutputShape], Timing]:
        """Run the model; raise HalError on failure (with output shapes when too small)."""

    def execute_fenced(
        self,
        request: Request,
        wait_for: Sequence[int],
        measure_timing: bool = False,
        deadline_ns: int | None = None,
        loop_timeout_ns: int | None = None,
        timeout_after_fence_ns: int | None = None,
    ) -> tuple[int | None, IFencedExecutionCallback]:
        """IPreparedModel::executeFenced: wait for the sync fences in ``wait_for``, then
        run. Returns a sync fence fd the caller owns (None when the work is already
        complete) and a callback reporting status and timing. Raise HalError for an
        error found before the work is scheduled.

        The default waits, runs ``execute`` and returns (None, callback)."""
        wait_for_fences(wait_for, deadline_ns)
        fence_signalled = time.monotonic_ns()
        if timeout_after_fence_ns is not None:
            after = fence_signalled + timeout_after_fence_ns
            deadline_ns = after if deadline_ns is None else min(deadline_ns, after)
        _, timing = self.execute(request, measure_timing, deadline_ns, loop_timeout_ns)
        return None, _DoneCallback(ErrorStatus.NONE, timing, timing)

    def configure_burst(self) -> IBurst:
        return _SimpleBurst(self)

    def array_executor(self) -> Callable[[list, int | None], tuple[list[OutputShape], Timing]] | None:
        """An in-process fast path, no HAL counterpart: ``run(arrays, deadline_ns)`` runs the
        request whose argument k (inputs, then outputs) is the whole of numpy array k, as
        ``execute(request, False, deadline_ns)`` would, for the runtime's usual Execution
        (each a C-contiguous array of its operand's dtype and shape, checked at
        set_input / set_output); the driver still checks what it binds. None (the
        default): the runtime makes the request and calls execute."""
        return None

    def create_reusable_execution(self, request: Request, measure_timing: bool = False,
                                  loop_timeout_ns: int | None = None) -> IExecution:
        """IPreparedModel::createReusableExecution (AIDL): ``request`` bound to this model
        for many computations, so what depends only on the request is checked and laid
        out once. Raise HalError for a request the model cannot run. The caller keeps the
        request's pools alive and unchanged in size while the execution is used.

        The default runs ``execute`` on every computation."""
        return _SimpleExecution(self.execute, request, measure_timing, loop_timeout_ns)


class IBurst(ABC):
    """A burst: a channel for many executions of one prepared model."""

    @abstractmethod
    def execute(
        self,
        request: Request,
        measure_timing: bool = False,
        deadline_ns: int | None = None,
        loop_timeout_ns: int | None = None,
    ) -> tuple[list[OutputShape], Timing]: ...


    def create_reusable_execution(self, request: Request, measure_timing: bool = False,
                                  loop_timeout_ns: int | None = None) -> IExecution:
        """IBurst::createReusableExecution: as IPreparedModel's, run through the burst.
        The default runs ``execute`` on every computation."""
        return _SimpleExecution(self.execute, request, measure_timing, loop_timeout_ns)


class _SimpleBurst(IBurst):
    def __init__(self, prepared: IPreparedModel) -> None:
        self._prepared = prepared

    def execute(self, request, measure_timing=False, deadline_ns=None, loop_timeout_ns=None):
        return self._prepared.execute(request, measure_timing, deadline_ns, loop_timeout_ns)

    def create_reusable_execution(self, request, measure_timing=False, loop_timeout_ns=None):
        # a burst of a prepared model without one of its own: the model's reusable execution
        return self._prepared.create_reusable_execution(request, measure_timing, loop_timeout_ns)


class IExecution(ABC):
    """A request bound to a prepared model (AIDL IExecution): computed any number of
    times, one at a time."""

    @abstractmethod
    def execute(self, deadline_ns: int | None = None) -> tuple[list[OutputShape], Timing]:
        """IExecution::executeSynchronously: run the bound request; raise HalError on
        failure (with output shapes when an output is too small)."""


class _SimpleExecution(IExecution):
    def __init__(self, execute, request: Request, measure_timing: bool, loop_timeout_ns: int | None) -> None:
        self._execute = execute
        self._arguments = (request, measure_timing)
        self._loop_timeout_ns = loop_timeout_ns

    def execute(self, deadline_ns=None):
        request, measure_timing = self._arguments
        return self._execute(request, measure_timing, deadline_ns, self._loop_timeout_ns)


class IBuffer(ABC):
    """Device memory allocated by IDevice.allocate (IBuffer in the HAL)."""

    @abstractmethod
    def copy_to(self, dst) -> None:
        """Copy the whole buffer into ``dst``, a writable pool of exactly its size."""

    @abstractmethod
    def copy_from(self, src, dimensions: list[int]) -> None:
        """Set the buffer from ``src`` (a pool), with ``dimensions`` completing its shape."""


class IDevice(ABC):
    """A driver's device."""

    name: str
    version_string: str
    device_type: DeviceTypeCode
    feature_level: FeatureLevelCode

    @abstractmethod
    def get_capabilities(self) -> Capabilities: ...

    @abstractmethod
    def get_supported_operations(self, model: Model) -> list[bool]:
        """One flag per operation of ``model.main``, in order."""

    def get_supported_extensions(self) -> list[Extension]:
        """IDevice::getSupportedExtensions; none by default."""
        return []

    def get_unsupported_reasons(self, model: Model) -> list[str | None]:
        """One entry per operation of ``model.main``: None where supported, else why not.
        The default derives it from get_supported_operations."""
        return [None if ok else "declined by the driver" for ok in self.get_supported_operations(model)]

    def get_number_of_cache_files_needed(self) -> tuple[int, int]:
        """IDevice::getNumberOfCacheFilesNeeded: (model cache files, data cache files)."""
        return (0, 0)

    @abstractmethod
    def prepare_model(
        self,
        model: Model,
        preference: ExecutionPreference = ExecutionPreference.FAST_SINGLE_ANSWER,
        priority: Priority = Priority.MEDIUM,
        deadline_ns: int | None = None,
        model_cache: Sequence[int] = (),
        data_cache: Sequence[int] = (),
        token: bytes | None = None,
    ) -> IPreparedModel:
        """Compile ``model``; raise HalError on failure. ``model_cache`` / ``data_cache``
        are file descriptors the runtime opened read-write (and keeps owning): when given
        with ``token``, the driver writes its compiled artifacts into them."""

    def prepare_model_from_cache(
        self,
        model_cache: Sequence[int],
        data_cache: Sequence[int],
        token: bytes,
        deadline_ns: int | None = None,
    ) -> IPreparedModel:
        """IDevice::prepareModelFromCache. A driver must validate what it reads (version,
        checksum, token) and raise HalError on any mismatch; the runtime then recompiles."""
        raise HalError(ErrorStatus.GENERAL_FAILURE, "compilation caching not supported")

    def allocate(
        self,
        desc: BufferDesc,
        prepared_models: Sequence[IPreparedModel],
        input_roles: Sequence[BufferRole],
        output_roles: Sequence[BufferRole],
    ) -> tuple[IBuffer, int]:
        """IDevice::allocate: device memory for the roles; returns (buffer, token > 0).
        Requests then name it with BufferToken(token)."""
        raise HalError(ErrorStatus.GENERAL_FAILURE, "allocate not supported")

    def wait(self) -> None:
        """Block until the device is available (ANeuralNetworksDevice_wait); an in-process
        device is always available, so the default returns at once."""
        return None


def read_fd(fd: int) -> bytes:
    """The whole content of a cache file descriptor, from its start."""
    chunks = []
    offset = 0
    while True:
        chunk = os.pread(fd, 1 << 20, offset)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        offset += len(chunk)


def write_fd(fd: int, data: bytes) -> None:
    """Replace the content of a cache file descriptor with ``data``."""
    os.ftruncate(fd, 0)
    view = memoryview(data)
    offset = 0
    while offset < len(view):
        offset += os.pwrite(fd, view[offset:], offset)
