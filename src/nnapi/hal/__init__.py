"""The NN HAL: the contract between the runtime and drivers (plain data + interfaces).

Drivers only ever see these objects. Operand values live in a constant blob or in memory
pools (objects exposing the buffer protocol: mmap'd shared memory, or, for in-process
drivers, the caller's own buffers), so a driver could move into another process.
"""

from nnapi.hal.interfaces import IBurst, IDevice, IPreparedModel
from nnapi.hal.types import (
    Capabilities,
    DataLocation,
    DeviceStatus,
    ErrorStatus,
    ExecutionPreference,
    HalError,
    Model,
    Operand,
    OperandLifeTime,
    Operation,
    OutputShape,
    PerformanceInfo,
    Priority,
    Request,
    RequestArgument,
    Subgraph,
    Timing,
)

__all__ = [
    "Capabilities",
    "DataLocation",
    "DeviceStatus",
    "ErrorStatus",
    "ExecutionPreference",
    "HalError",
    "IBurst",
    "IDevice",
    "IPreparedModel",
    "Model",
    "Operand",
    "OperandLifeTime",
    "Operation",
    "OutputShape",
    "PerformanceInfo",
    "Priority",
    "Request",
    "RequestArgument",
    "Subgraph",
    "Timing",
]
