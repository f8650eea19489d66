"""The NN HAL: the contract between the runtime and drivers (plain data + interfaces).

Drivers only ever see these objects. Operand values live in a constant blob or in memory
pools (objects exposing the buffer protocol: mmap'd shared memory, or, for in-process
drivers, the caller's own buffers), so a driver could move into another process.
"""

from nnapi.hal.interfaces import IBuffer, IBurst, IDevice, IExecution, IFencedExecutionCallback, IPreparedModel
from nnapi.hal.types import (
    BufferDesc,
    BufferRole,
    BufferToken,
    Capabilities,
    DataLocation,
    ErrorStatus,
    ExecutionPreference,
    Extension,
    ExtensionNameAndPrefix,
    ExtensionOperandTypeInformation,
    FdPool,
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
    "BufferDesc",
    "BufferRole",
    "BufferToken",
    "Capabilities",
    "DataLocation",
    "ErrorStatus",
    "ExecutionPreference",
    "Extension",
    "ExtensionNameAndPrefix",
    "ExtensionOperandTypeInformation",
    "FdPool",
    "HalError",
    "IBuffer",
    "IBurst",
    "IDevice",
    "IExecution",
    "IFencedExecutionCallback",
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
