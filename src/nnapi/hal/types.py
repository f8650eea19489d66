"""Plain data of the NN HAL (after Android's canonical types in nn/common/Types.h)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

import numpy as np

from nnapi.codes import OperandCode, OperationCode, ResultCode
from nnapi.operand import OperandType, SymmPerChannelQuantParams, dtype_of
from nnapi.runtime.type_manager import (  # noqa: F401 (the HAL's spelling)
    EXTENSION_TYPE_BASE,
    extension_prefix,
    is_extension_type,
)
from nnapi.runtime.type_manager import split as split_extension_type

#: Timing's "no measurement" value, as UINT64_MAX in the HAL.
NO_TIMING = 0xFFFFFFFFFFFFFFFF


class OperandLifeTime(IntEnum):
    TEMPORARY_VARIABLE = 0
    SUBGRAPH_INPUT = 1
    SUBGRAPH_OUTPUT = 2
    CONSTANT_COPY = 3
    CONSTANT_REFERENCE = 4
    NO_VALUE = 5
    SUBGRAPH = 6


class ErrorStatus(IntEnum):
    NONE = 0
    DEVICE_UNAVAILABLE = 1
    GENERAL_FAILURE = 2
    OUTPUT_INSUFFICIENT_SIZE = 3
    INVALID_ARGUMENT = 4
    MISSED_DEADLINE_TRANSIENT = 5
    MISSED_DEADLINE_PERSISTENT = 6
    RESOURCE_EXHAUSTED_TRANSIENT = 7
    RESOURCE_EXHAUSTED_PERSISTENT = 8
    DEAD_OBJECT = 10000

    def to_result_code(self) -> ResultCode:
        return _STATUS_TO_RESULT[self]


_STATUS_TO_RESULT = {
    ErrorStatus.NONE: ResultCode.NO_ERROR,
    ErrorStatus.DEVICE_UNAVAILABLE: ResultCode.UNAVAILABLE_DEVICE,
    ErrorStatus.GENERAL_FAILURE: ResultCode.OP_FAILED,
    ErrorStatus.OUTPUT_INSUFFICIENT_SIZE: ResultCode.OUTPUT_INSUFFICIENT_SIZE,
    ErrorStatus.INVALID_ARGUMENT: ResultCode.BAD_DATA,
    ErrorStatus.MISSED_DEADLINE_TRANSIENT: ResultCode.MISSED_DEADLINE_TRANSIENT,
    ErrorStatus.MISSED_DEADLINE_PERSISTENT: ResultCode.MISSED_DEADLINE_PERSISTENT,
    ErrorStatus.RESOURCE_EXHAUSTED_TRANSIENT: ResultCode.RESOURCE_EXHAUSTED_TRANSIENT,
    ErrorStatus.RESOURCE_EXHAUSTED_PERSISTENT: ResultCode.RESOURCE_EXHAUSTED_PERSISTENT,
    ErrorStatus.DEAD_OBJECT: ResultCode.DEAD_OBJECT,
}


class ExecutionPreference(IntEnum):
    LOW_POWER = 0
    FAST_SINGLE_ANSWER = 1
    SUSTAINED_SPEED = 2


class Priority(IntEnum):
    LOW = 0
    MEDIUM = 1
    HIGH = 2


@dataclass
class OutputShape:
    dimensions: list[int]
    is_sufficient: bool = True


@dataclass
class Timing:
    """Durations in nanoseconds; NO_TIMING when not measured."""

    time_on_device: int = NO_TIMING
    time_in_driver: int = NO_TIMING


class HalError(Exception):
    """A driver call that failed with an ErrorStatus (plus output shapes where relevant)."""

    def __init__(self, status: ErrorStatus, message: str = "", output_shapes: list[OutputShape] | None = None):
        super().__init__(message or status.name)
        self.status = status
        self.output_shapes = output_shapes or []


@dataclass
class DataLocation:
    """Where a value lives: ``length`` bytes at ``offset`` in pool ``pool_index``."""

    pool_index: int = 0
    offset: int = 0
    length: int = 0


@dataclass
class Operand:
    type: OperandCode
    dimensions: list[int]
    scale: float
    zero_point: int
    lifetime: OperandLifeTime
    location: DataLocation = field(default_factory=DataLocation)
    channel_quant: SymmPerChannelQuantParams | None = None
    number_of_consumers: int = 0
    extension_data: bytes | None = None  # an extension operand's extra parameters (extraParams)

    def operand_type(self) -> OperandType:
        return OperandType(self.type, self.dimensions, self.scale, self.zero_point, self.channel_quant)


@dataclass
class Operation:
    type: OperationCode
    inputs: list[int]
    outputs: list[int]


@dataclass
class Subgraph:
    operands: list[Operand]
    operations: list[Operation]  # in an order where every operand is written before it is read
    input_indexes: list[int]
    output_indexes: list[int]


@dataclass
class ExtensionNameAndPrefix:
    """The prefix (high 16 bits of an extension operand/operation type) a model uses for
    one extension."""

    name: str
    prefix: int


@dataclass
class ExtensionOperandTypeInformation:
    type: int  # the type within the extension (low 16 bits)
    is_tensor: bool
    byte_size: int  # of a scalar, or of one tensor element


@dataclass
class Extension:
    """An extension a device supports (IDevice::getSupportedExtensions)."""

    name: str
    operand_types: list[ExtensionOperandTypeInformation] = field(default_factory=list)


def operation_name(value: int, model: Model | None = None) -> str:
    """OperationCode's name, or a description of an extension or unknown operation type
    (a HAL model may carry any value; naming it must not fail). With ``model``, an
    extension type is named by its extension: ``com.example.fibonacci operation 0``."""
    try:
        return OperationCode(value).name
    except ValueError:
        return _unnamed("operation", value, model)


def operand_type_name(value: int, model: Model | None = None) -> str:
    """OperandCode's name, or a description of an extension or unknown operand type."""
    try:
        return OperandCode(value).name
    except ValueError:
        return _unnamed("operand type", value, model)


def _unnamed(kind: str, value: int, model: Model | None) -> str:
    if is_extension_type(value):
        prefix, within = split_extension_type(value)
        for entry in model.extension_name_to_prefix if model is not None else ():
            if entry.prefix == prefix:
                return f"{entry.name} {kind} {within}"
        return f"extension {kind} {within} (prefix {prefix})"
    return f"unknown {kind} {int(value)}"


@dataclass
class Model:
    """A HAL model: main subgraph, referenced subgraphs, a CONSTANT_COPY blob and pools.

    A SUBGRAPH operand's ``location.offset`` is its index into ``referenced``. Operand and
    operation types >= 2**16 are extension types: the high 16 bits are a prefix listed in
    ``extension_name_to_prefix``, the low 16 bits the type within that extension.
    """

    main: Subgraph
    referenced: list[Subgraph]
    operand_values: bytes
    pools: list[Any]  # buffer-protocol objects, FdPool or BufferToken
    relax_computation_float32_to_float16: bool = False
    extension_name_to_prefix: list[ExtensionNameAndPrefix] = field(default_factory=list)


@dataclass
class FdPool:
    """A pool backed by a file descriptor (memfd / file): ``size`` bytes at ``offset``.

    ``buffer`` is a view of those bytes for in-process use; a remote transport passes the
    descriptor itself instead of the bytes. The descriptor stays owned by whoever made it.
    """

    fd: int
    offset: int
    size: int
    writable: bool
    buffer: Any = None



def pool_view(pool: Any) -> memoryview:
    """A byte view of a model or request pool (a buffer object or an FdPool); HalError
    INVALID_ARGUMENT for anything else (a BufferToken is resolved by its device)."""
    if type(pool) is memoryview and pool.ndim == 1 and pool.format == "B":
        return pool
    if isinstance(pool, FdPool):
        pool = pool.buffer
    try:
        view = memoryview(pool)
    except TypeError:
        raise HalError(ErrorStatus.INVALID_ARGUMENT, f"pool of type {type(pool).__name__} has no bytes") from None
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def constant_array(model: Model, operand: Operand) -> np.ndarray:
    """The value of ``model``'s CONSTANT_COPY or CONSTANT_REFERENCE ``operand``: an array of
    its dtype and dimensions over the model's bytes (no copy; read-only where they are)."""
    location = operand.location
    buffer = (model.operand_values if operand.lifetime == OperandLifeTime.CONSTANT_COPY
              else pool_view(model.pools[location.pool_index]))
    dtype = dtype_of(operand.type)
    array = np.frombuffer(buffer, dtype=dtype, count=location.length // dtype.itemsize, offset=location.offset)
    return array.reshape(operand.dimensions)


@dataclass(frozen=True)
class BufferToken:
    """A request pool naming device memory allocated by this device's ``allocate``."""

    token: int


@dataclass
class BufferDesc:
    """What ``IDevice.allocate`` is asked for: dimensions (0 = unknown axis; may be empty)."""

    dimensions: list[int] = field(default_factory=list)


@dataclass
class BufferRole:
    """One role of a device memory: input/output ``io_index`` of prepared model ``model_index``."""

    model_index: int
    io_index: int
    probability: float = 1.0


@dataclass
class RequestArgument:
    has_no_value: bool = False
    location: DataLocation = field(default_factory=DataLocation)
    dimensions: list[int] = field(default_factory=list)  # completes an unspecified shape


@dataclass
class Request:
    inputs: list[RequestArgument]
    outputs: list[RequestArgument]
    pools: list[Any]  # buffer-protocol objects; outputs' pools must be writable


@dataclass
class PerformanceInfo:
    """Relative to the CPU running the model in float32: lower is better."""

    exec_time: float = 1.0
    power_usage: float = 1.0


@dataclass
class Capabilities:
    relaxed_float32_to_float16_scalar: PerformanceInfo = field(default_factory=PerformanceInfo)
    relaxed_float32_to_float16_tensor: PerformanceInfo = field(default_factory=PerformanceInfo)
    operand_performance: dict[OperandCode, PerformanceInfo] = field(default_factory=dict)
    if_performance: PerformanceInfo = field(default_factory=PerformanceInfo)
    while_performance: PerformanceInfo = field(default_factory=PerformanceInfo)
    #: nnapi's addition to Android's struct: the measured fixed cost, in seconds, of one
    #: execution on this device (its dispatch and binding, whatever the model), so that the
    #: partitioner can weigh a plan step's cost against what running operations here saves.
    #: 0.0 (the default, and what a device that does not measure it reports): not weighed,
    #: each operation goes to its best device as on Android.
    step_cost_s: float = 0.0

    @classmethod
    def uniform(cls, performance: PerformanceInfo, step_cost_s: float = 0.0) -> Capabilities:
        """Capabilities with the same performance for every operand type, relaxed float32
        and control flow: a device that does not tell its workloads apart."""
        return cls(relaxed_float32_to_float16_scalar=performance, relaxed_float32_to_float16_tensor=performance,
                   operand_performance={code: performance for code in OperandCode},
                   if_performance=performance, while_performance=performance, step_cost_s=step_cost_s)

    def performance_for(self, code: OperandCode) -> PerformanceInfo:
        return self.operand_performance.get(code, PerformanceInfo(float("inf"), float("inf")))
