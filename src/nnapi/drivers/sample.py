"""Sample drivers: devices with configurable capabilities and supported operations.

A SampleDevice computes with the reference kernels but claims only the operations it is
given, with the performance it is given. That makes the runtime's device selection and
partitioning testable, and is a starting point for writing a real driver.
"""

from __future__ import annotations

from collections.abc import Iterable

from nnapi.codes import DeviceTypeCode, FeatureLevelCode, OperandCode, OperationCode
from nnapi.drivers.reference import ReferencePreparedModel, supports_operation
from nnapi.hal import (
    Capabilities,
    ErrorStatus,
    ExecutionPreference,
    HalError,
    IDevice,
    IPreparedModel,
    Model,
    PerformanceInfo,
    Priority,
)
from nnapi.hal.validation import validate_model


class SampleDevice(IDevice):
    """A device that supports ``operations`` (all implemented ones when None) and
    reports ``exec_time`` / ``power_usage`` for every operand type (lower is better)."""

    def __init__(self, name: str, operations: Iterable[OperationCode] | None = None, exec_time: float = 0.5,
                 power_usage: float = 0.5, device_type: DeviceTypeCode = DeviceTypeCode.DEVICE_ACCELERATOR,
                 feature_level: FeatureLevelCode = FeatureLevelCode.FEATURE_LEVEL_8, version: str = "1.0") -> None:
        self.name = name
        self.version_string = version
        self.device_type = device_type
        self.feature_level = feature_level
        self.operations = None if operations is None else frozenset(OperationCode(o) for o in operations)
        self.performance = PerformanceInfo(exec_time, power_usage)
        self.prepared_count = 0
        self.executed_operations: list[OperationCode] = []

    def get_capabilities(self) -> Capabilities:
        return Capabilities(
            relaxed_float32_to_float16_scalar=self.performance,
            relaxed_float32_to_float16_tensor=self.performance,
            operand_performance={code: self.performance for code in OperandCode},
            if_performance=self.performance,
            while_performance=self.performance,
        )

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
        return ReferencePreparedModel(model)
