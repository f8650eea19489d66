"""Sample drivers: devices with configurable capabilities, supported operations and faults.

A SampleDevice computes with the reference kernels but claims only the operations it is
given, with the performance it is given. That makes the runtime's device selection and
partitioning testable, and is a starting point for writing a real driver.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable

import numpy as np

from nnapi.codes import DeviceTypeCode, FeatureLevelCode, OperationCode
from nnapi.drivers import device_memory
from nnapi.drivers.reference import ReferencePreparedModel, supports_operation, unsupported_reason
from nnapi.hal import (
    BufferToken,
    Capabilities,
    ErrorStatus,
    ExecutionPreference,
    HalError,
    IDevice,
    IPreparedModel,
    Model,
    OutputShape,
    PerformanceInfo,
    Priority,
    Request,
    Timing,
)
from nnapi.hal.types import operation_name, pool_view
from nnapi.hal.validation import validate_model
from nnapi.operand import dtype_of


class SampleDevice(IDevice):
    """A device that supports ``operations`` (all implemented ones when None) and
    reports ``exec_time`` / ``power_usage`` for every operand type (lower is better) and
    ``step_cost_s`` as the fixed cost of a step on it (0: not weighed)."""

    def __init__(self, name: str, operations: Iterable[OperationCode] | None = None, exec_time: float = 0.5,
                 power_usage: float = 0.5, device_type: DeviceTypeCode = DeviceTypeCode.DEVICE_ACCELERATOR,
                 feature_level: FeatureLevelCode = FeatureLevelCode.FEATURE_LEVEL_8, version: str = "1.0",
                 step_cost_s: float = 0.0) -> None:
        self.name = name
        self.step_cost_s = step_cost_s
        self.version_string = version
        self.device_type = device_type
        self.feature_level = feature_level
        self.operations = None if operations is None else frozenset(OperationCode(o) for o in operations)
        self.performance = PerformanceInfo(exec_time, power_usage)
        self.prepared_count = 0
        self.executed_operations: list[OperationCode] = []
        self._buffers = device_memory.BufferTracker()

    def get_capabilities(self) -> Capabilities:
        return Capabilities.uniform(self.performance, self.step_cost_s)

    def _supports(self, model: Model, subgraph, operation) -> bool:
        if self.operations is not None and operation.type not in self.operations:
            return False
        if operation.type in (OperationCode.IF, OperationCode.WHILE):
            return False  # control flow stays with devices that run whole subgraphs
        return supports_operation(model, subgraph, operation)

    def get_supported_operations(self, model: Model) -> list[bool]:
        return [self._supports(model, model.main, operation) for operation in model.main.operations]

    def prepare_model(self, model: Model, preference=ExecutionPreference.FAST_SINGLE_ANSWER,
                      priority=Priority.MEDIUM, deadline_ns=None, model_cache=(), data_cache=(),
                      token=None) -> IPreparedModel:
        validate_model(model)
        for operation in model.main.operations:
            if not self._supports(model, model.main, operation):
                raise HalError(ErrorStatus.INVALID_ARGUMENT,
                               f"{self.name} does not support {OperationCode(operation.type).name}")
        self.prepared_count += 1
        self.executed_operations.extend(OperationCode(o.type) for o in model.main.operations)
        return ReferencePreparedModel(model, self._buffers)

    def allocate(self, desc, prepared_models, input_roles, output_roles):
        """IDevice::allocate, as nnapi-reference does it (see drivers.device_memory)."""
        def model_of(prepared):
            ours = isinstance(prepared, ReferencePreparedModel) and prepared._buffers is self._buffers
            return prepared.model if ours else None

        return device_memory.allocate(self._buffers, model_of, desc, prepared_models, input_roles, output_roles)


class FaultyDevice(IDevice):
    """A fault-injecting device, a tool for testing how an NNAPI integration copes with
    drivers that fail (register it with ``nnapi.runtime.manager.register_device``).

    It computes with the reference kernels and claims ``supported`` (None: every operation
    nnapi-reference implements; else a set of OperationCodes), reporting ``exec_time`` and
    ``power_usage`` for every operand type (lower is better than the CPU's 1.0), so the
    runtime prefers it. Faults:

    - ``fail_prepare``: prepare_model fails (HalError GENERAL_FAILURE);
    - ``fail_execute``: every execution fails (HalError GENERAL_FAILURE);
    - ``fail_allocate``: IDevice.allocate fails (HalError GENERAL_FAILURE), so device
      memory for its roles falls back to runtime memory (or fails with explicit devices);
      otherwise it allocates device memory as nnapi-reference does;
    - ``wrong_results``: executions succeed but every output element is perturbed
      (+1, booleans flipped) — what a buggy accelerator looks like;
    - ``raise_exception``: the failures above raise a raw RuntimeError instead of a
      HalError (with neither set, every execution does), as a crashing driver would;
    - ``delay_s``: each execution first sleeps this long (a deadline passing meanwhile
      gives MISSED_DEADLINE_TRANSIENT).

    ``prepare_count``, ``execute_count`` and ``allocate_count`` count the calls that reached
    the device.
    """

    def __init__(self, name: str, *, supported: Iterable[OperationCode] | None = None, fail_prepare: bool = False,
                 fail_execute: bool = False, fail_allocate: bool = False, wrong_results: bool = False,
                 raise_exception: bool = False,
                 delay_s: float = 0.0, exec_time: float = 0.5, power_usage: float = 1.0,
                 feature_level: FeatureLevelCode = FeatureLevelCode.FEATURE_LEVEL_8,
                 device_type: DeviceTypeCode = DeviceTypeCode.DEVICE_ACCELERATOR) -> None:
        from nnapi.drivers.reference import ReferenceDevice

        self.name = name
        self.version_string = "faulty-1.0"
        self.device_type = device_type
        self.feature_level = feature_level
        self.supported = None if supported is None else frozenset(OperationCode(o) for o in supported)
        self.fail_prepare = fail_prepare
        self.fail_execute = fail_execute
        self.fail_allocate = fail_allocate
        self.wrong_results = wrong_results
        self.raise_exception = raise_exception
        self.delay_s = delay_s
        self.performance = PerformanceInfo(exec_time, power_usage)
        self.prepare_count = 0
        self.execute_count = 0
        self.allocate_count = 0
        self._reference = ReferenceDevice()

    def get_capabilities(self) -> Capabilities:
        return Capabilities.uniform(self.performance)

    def get_supported_operations(self, model: Model) -> list[bool]:
        flags = self._reference.get_supported_operations(model)
        if self.supported is None:
            return flags
        return [flag and operation.type in self.supported for flag, operation in zip(flags, model.main.operations,
                                                                                     strict=True)]

    def _fail(self, what: str) -> None:
        if self.raise_exception:
            raise RuntimeError(f"{self.name}: injected crash in {what}")
        raise HalError(ErrorStatus.GENERAL_FAILURE, f"{self.name}: injected failure in {what}")

    def prepare_model(self, model: Model, preference=ExecutionPreference.FAST_SINGLE_ANSWER,
                      priority=Priority.MEDIUM, deadline_ns=None, model_cache=(), data_cache=(),
                      token=None) -> IPreparedModel:
        self.prepare_count += 1
        if self.fail_prepare:
            self._fail("prepare_model")
        validate_model(model)
        for position, flag in enumerate(self.get_supported_operations(model)):
            if not flag:
                operation = model.main.operations[position]
                reason = unsupported_reason(model, model.main, operation) or (
                    f"{operation_name(operation.type)} is not among the operations it supports")
                raise HalError(ErrorStatus.INVALID_ARGUMENT, f"{self.name}: main operation {position}: {reason}")
        return _FaultyPreparedModel(self, self._reference.prepare_model(model, preference, priority, deadline_ns),
                                    model)

    def allocate(self, desc, prepared_models, input_roles, output_roles):
        """IDevice::allocate: device memory held by the device's reference kernels (their
        prepared models are the ones named in requests)."""
        self.allocate_count += 1
        if self.fail_allocate:
            self._fail("allocate")
        inner = []
        for position, prepared in enumerate(prepared_models):
            if not isinstance(prepared, _FaultyPreparedModel) or prepared._device is not self:
                raise HalError(ErrorStatus.INVALID_ARGUMENT,
                               f"{self.name}: allocate: prepared model {position} is not one of this device's")
            inner.append(prepared._inner)
        return self._reference.allocate(desc, inner, input_roles, output_roles)


class _FaultyPreparedModel(IPreparedModel):
    def __init__(self, device: FaultyDevice, inner: IPreparedModel, model: Model) -> None:
        self._device = device
        self._inner = inner
        self._model = model

    def execute(self, request: Request, measure_timing: bool = False, deadline_ns: int | None = None,
                loop_timeout_ns: int | None = None) -> tuple[list[OutputShape], Timing]:
        device = self._device
        device.execute_count += 1
        if device.delay_s:
            time.sleep(device.delay_s)
            if deadline_ns is not None and time.monotonic_ns() > deadline_ns:
                raise HalError(ErrorStatus.MISSED_DEADLINE_TRANSIENT, f"{device.name}: deadline passed")
        if device.fail_execute or (device.raise_exception and not device.fail_prepare):
            device._fail("execute")
        shapes, timing = self._inner.execute(request, measure_timing, deadline_ns, loop_timeout_ns)
        if device.wrong_results:
            self._perturb(request, shapes)
        return shapes, timing

    def _perturb(self, request: Request, shapes: list[OutputShape]) -> None:
        main = self._model.main
        for argument, index, shape in zip(request.outputs, main.output_indexes, shapes, strict=True):
            if argument.has_no_value:
                continue
            dtype = dtype_of(main.operands[index].type)
            count = math.prod(shape.dimensions) if shape.dimensions else 1
            pool = request.pools[argument.location.pool_index]
            if isinstance(pool, BufferToken):  # the device's own memory: perturbed where it lives
                managed = self._device._reference._buffers.get(pool.token)
                if managed is None:
                    continue
                pool = managed.data
            view = pool_view(pool)
            values = np.frombuffer(view, dtype, count, argument.location.offset)
            if dtype == np.bool_:
                values[...] = ~values
            else:
                values += np.ones((), dtype)
