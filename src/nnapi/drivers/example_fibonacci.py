"""An example vendor-extension driver: Android's ``com.example.fibonacci`` extension.

It shows a driver vendor the whole extension path (NeuralNetworksExtensions.h and the
driver guide's "Vendor extensions"): the device declares its extension through
``get_supported_extensions``, finds the prefix a model gives the extension in
``model.extension_name_to_prefix``, validates its operations and operands itself (the
runtime cannot), and reads extension operand parameters from ``Operand.extension_data``.

The extension, ``com.example.fibonacci`` (as in Android's documentation example):

- operand type ``EXAMPLE_INT64`` (0): a signed 64-bit integer scalar (8 bytes);
- operand type ``EXAMPLE_TENSOR_QUANT64_ASYMM`` (1): a tensor of unsigned 64-bit
  integers, quantized: real value = (q - zero_point) * scale. Its parameters are the
  operand's extension data, ``QUANT64_PARAMS`` = little-endian {double scale; int64
  zero_point} (16 bytes), set with ``Model.set_operand_extension_data``;
- operation ``EXAMPLE_FIBONACCI`` (0): input 0 is n, an ``EXAMPLE_INT64`` scalar or a
  ``TENSOR_FLOAT32`` of shape [1] holding a whole number; output 0 is a 1-D tensor of
  shape [n], ``TENSOR_FLOAT32`` or ``EXAMPLE_TENSOR_QUANT64_ASYMM``, holding the first n
  Fibonacci numbers 1, 1, 2, 3, 5, ... (the output's shape may be left unspecified: the
  driver reports it). Quantized, element i is F(i) / scale + zero_point (computed in
  double precision, exact when scale is 1) truncated to an integer, and it must fit
  uint64; float32 elements beyond float32's range are infinity. 1 <= n <= ``MAX_N``.

Bad models are refused at prepare and bad values at execute with HalError
INVALID_ARGUMENT (BAD_DATA at the NDK), never a raw exception. Load it with
``--driver fibonacci`` or ``nnapi.runtime.manager.register_device(FibonacciDevice())``.
"""

from __future__ import annotations

import math
import struct
import time
from collections.abc import Sequence

import numpy as np

from nnapi.codes import DeviceTypeCode, FeatureLevelCode, OperandCode
from nnapi.hal import (
    Capabilities,
    ErrorStatus,
    ExecutionPreference,
    Extension,
    ExtensionOperandTypeInformation,
    HalError,
    IDevice,
    IPreparedModel,
    Model,
    Operand,
    OperandLifeTime,
    Operation,
    OutputShape,
    PerformanceInfo,
    Priority,
    Request,
    Subgraph,
    Timing,
)
from nnapi.hal.types import operand_type_name, operation_name, pool_view
from nnapi.hal.validation import validate_model, validate_request

EXTENSION_NAME = "com.example.fibonacci"
#: Operand types within the extension.
EXAMPLE_INT64 = 0
EXAMPLE_TENSOR_QUANT64_ASYMM = 1
#: Operation types within the extension.
EXAMPLE_FIBONACCI = 0
#: The extension data of an EXAMPLE_TENSOR_QUANT64_ASYMM operand: {double scale; int64 zero_point}.
QUANT64_PARAMS = struct.Struct("<dq")
#: The largest n the driver computes (the output then holds 16 Mi elements).
MAX_N = 1 << 24

FIBONACCI_INPUT_N = 0
FIBONACCI_OUTPUT = 0

L = OperandLifeTime


def _invalid(message: str) -> HalError:
    return HalError(ErrorStatus.INVALID_ARGUMENT, message)


def _prefix(model: Model) -> int | None:
    """The prefix ``model`` gives this extension, None if it does not use it."""
    for entry in model.extension_name_to_prefix:
        if entry.name == EXTENSION_NAME:
            return int(entry.prefix)
    return None


def _types(prefix: int | None) -> tuple[int | None, int | None, int | None]:
    """(FIBONACCI operation, EXAMPLE_INT64, EXAMPLE_TENSOR_QUANT64_ASYMM) type values for ``prefix``."""
    if prefix is None:
        return None, None, None
    return prefix << 16 | EXAMPLE_FIBONACCI, prefix << 16 | EXAMPLE_INT64, prefix << 16 | EXAMPLE_TENSOR_QUANT64_ASYMM


def quant64_params(operand: Operand) -> tuple[float, int]:
    """(scale, zero_point) of an EXAMPLE_TENSOR_QUANT64_ASYMM operand's extension data."""
    data = operand.extension_data
    if data is None or len(data) != QUANT64_PARAMS.size:
        raise _invalid(f"{EXTENSION_NAME}: an EXAMPLE_TENSOR_QUANT64_ASYMM operand needs "
                       f"{QUANT64_PARAMS.size} bytes of extension data {{double scale; int64 zero_point}}, got "
                       f"{'none' if data is None else len(data)}")
    scale, zero_point = QUANT64_PARAMS.unpack(bytes(data))
    if not math.isfinite(scale) or scale <= 0:
        raise _invalid(f"{EXTENSION_NAME}: EXAMPLE_TENSOR_QUANT64_ASYMM scale must be positive, got {scale}")
    return scale, zero_point


def check_operation(model: Model, subgraph: Subgraph, operation: Operation) -> None:
    """Raise HalError(INVALID_ARGUMENT) unless ``operation`` is a well-formed
    EXAMPLE_FIBONACCI of this extension."""
    fibonacci, int64, quant64 = _types(_prefix(model))
    if fibonacci is None or int(operation.type) != fibonacci:
        raise _invalid(f"{operation_name(operation.type, model)} is not an operation of {EXTENSION_NAME}, the only "
                       "extension this device supports")
    if len(operation.inputs) != 1 or len(operation.outputs) != 1:
        raise _invalid(f"EXAMPLE_FIBONACCI takes 1 input and 1 output, got {len(operation.inputs)} and "
                       f"{len(operation.outputs)}")
    count = len(subgraph.operands)
    if not all(isinstance(i, int) and 0 <= i < count for i in list(operation.inputs) + list(operation.outputs)):
        raise _invalid("EXAMPLE_FIBONACCI: operand index out of range")
    n = subgraph.operands[operation.inputs[FIBONACCI_INPUT_N]]
    if n.type == int64:
        if n.dimensions:
            raise _invalid("EXAMPLE_FIBONACCI input n: EXAMPLE_INT64 is a scalar and has no dimensions")
    elif n.type == OperandCode.TENSOR_FLOAT32:
        if list(n.dimensions) not in ([], [0], [1]):
            raise _invalid(f"EXAMPLE_FIBONACCI input n: a TENSOR_FLOAT32 n has shape [1], not {list(n.dimensions)}")
    else:
        raise _invalid("EXAMPLE_FIBONACCI input n must be EXAMPLE_INT64 or TENSOR_FLOAT32, not "
                       f"{operand_type_name(n.type, model)}")
    if n.lifetime == L.NO_VALUE:
        raise _invalid("EXAMPLE_FIBONACCI input n has no value")
    output = subgraph.operands[operation.outputs[FIBONACCI_OUTPUT]]
    if output.type == quant64:
        quant64_params(output)
    elif output.type != OperandCode.TENSOR_FLOAT32:
        raise _invalid("EXAMPLE_FIBONACCI output must be TENSOR_FLOAT32 or EXAMPLE_TENSOR_QUANT64_ASYMM, not "
                       f"{operand_type_name(output.type, model)}")
    if len(output.dimensions) > 1:
        raise _invalid(f"EXAMPLE_FIBONACCI output is 1-D, not {list(output.dimensions)}")


class FibonacciDevice(IDevice):
    """A device supporting the ``com.example.fibonacci`` extension and nothing else."""

    def __init__(self, name: str = "example-fibonacci", exec_time: float = 0.5, power_usage: float = 0.5) -> None:
        self.name = name
        self.version_string = "fibonacci-1.0"
        self.device_type = DeviceTypeCode.DEVICE_ACCELERATOR
        self.feature_level = FeatureLevelCode.FEATURE_LEVEL_8
        self.performance = PerformanceInfo(exec_time, power_usage)

    def get_capabilities(self) -> Capabilities:
        return Capabilities.uniform(self.performance)

    def get_supported_extensions(self) -> list[Extension]:
        return [Extension(EXTENSION_NAME, [
            ExtensionOperandTypeInformation(EXAMPLE_INT64, is_tensor=False, byte_size=8),
            ExtensionOperandTypeInformation(EXAMPLE_TENSOR_QUANT64_ASYMM, is_tensor=True, byte_size=8),
        ])]

    def get_unsupported_reasons(self, model: Model) -> list[str | None]:
        reasons: list[str | None] = []
        for operation in model.main.operations:
            try:
                check_operation(model, model.main, operation)
                reasons.append(None)
            except HalError as error:
                reasons.append(str(error))
        return reasons

    def get_supported_operations(self, model: Model) -> list[bool]:
        return [reason is None for reason in self.get_unsupported_reasons(model)]

    def prepare_model(self, model: Model, preference: ExecutionPreference = ExecutionPreference.FAST_SINGLE_ANSWER,
                      priority: Priority = Priority.MEDIUM, deadline_ns: int | None = None,
                      model_cache: Sequence[int] = (), data_cache: Sequence[int] = (),
                      token: bytes | None = None) -> IPreparedModel:
        validate_model(model)
        if model.referenced:
            raise _invalid(f"{self.name}: control flow (referenced subgraphs) is not supported")
        for operation in model.main.operations:
            check_operation(model, model.main, operation)
        return FibonacciPreparedModel(model)


# --- the computation ---------------------------------------------------------------------
def _float_table() -> np.ndarray:
    """F(1), F(2), ... in float64 up to the last finite one."""
    values = [1.0, 1.0]
    while math.isfinite(values[-1] + values[-2]):
        values.append(values[-1] + values[-2])
    return np.array(values)


def _exact_table() -> list[int]:
    """F(1), F(2), ... up to the last that fits uint64."""
    values = [1, 1]
    while values[-1] + values[-2] < 1 << 64:
        values.append(values[-1] + values[-2])
    return values


_FLOATS = _float_table()
_EXACT = _exact_table()


def fibonacci_float32(n: int) -> np.ndarray:
    """The first ``n`` Fibonacci numbers as float32 (infinity past float32's range)."""
    values = np.full(n, np.inf, np.float32)
    count = min(n, len(_FLOATS))
    with np.errstate(over="ignore"):
        values[:count] = _FLOATS[:count].astype(np.float32)
    return values


def fibonacci_quant64(n: int, scale: float, zero_point: int) -> np.ndarray:
    """The first ``n`` Fibonacci numbers quantized to uint64: F(i) / scale + zero_point."""
    if scale == 1.0 and n <= len(_EXACT):
        exact = [value + zero_point for value in _EXACT[:n]]
        if min(exact) < 0 or max(exact) >= 1 << 64:
            raise _invalid(f"EXAMPLE_FIBONACCI: F(i) + zero_point {zero_point} does not fit uint64 for n = {n}")
        return np.array(exact, dtype=np.uint64)
    count = min(n, len(_FLOATS))
    with np.errstate(over="ignore"):
        real = np.concatenate([_FLOATS[:count], np.full(n - count, np.inf)]) / scale + float(zero_point)
    if not (np.all(real >= 0) and np.all(real < 2.0 ** 64)):
        raise _invalid(f"EXAMPLE_FIBONACCI: F(i) / {scale} + {zero_point} does not fit uint64 for n = {n}")
    return np.trunc(real).astype(np.uint64)


class FibonacciPreparedModel(IPreparedModel):
    def __init__(self, model: Model) -> None:
        self._model = model
        _, self._int64, self._quant64 = _types(_prefix(model))

    def _read_n(self, operand: Operand, data: memoryview) -> int:
        if operand.type == self._int64:
            if data.nbytes != 8:
                raise _invalid(f"EXAMPLE_FIBONACCI input n: EXAMPLE_INT64 is 8 bytes, got {data.nbytes}")
            n = int(np.frombuffer(data, np.int64)[0])
        else:
            if data.nbytes != 4:
                raise _invalid(f"EXAMPLE_FIBONACCI input n: a TENSOR_FLOAT32 of shape [1] is 4 bytes, got "
                               f"{data.nbytes}")
            value = float(np.frombuffer(data, np.float32)[0])
            if not math.isfinite(value) or not value.is_integer():
                raise _invalid(f"EXAMPLE_FIBONACCI input n must be a whole number, got {value}")
            n = int(value)
        if not 1 <= n <= MAX_N:
            raise _invalid(f"EXAMPLE_FIBONACCI input n must be in [1, {MAX_N}], got {n}")
        return n

    def _compute(self, output: Operand, n: int) -> np.ndarray:
        if output.type == self._quant64:
            scale, zero_point = quant64_params(output)
            return fibonacci_quant64(n, scale, zero_point)
        return fibonacci_float32(n)

    def execute(self, request: Request, measure_timing: bool = False, deadline_ns: int | None = None,
                loop_timeout_ns: int | None = None) -> tuple[list[OutputShape], Timing]:
        start = time.monotonic_ns()
        model = self._model
        main = model.main
        validate_request(request, model)
        values: dict[int, memoryview] = {}  # operand index -> its bytes
        for argument, index in zip(request.inputs, main.input_indexes, strict=True):
            if not argument.has_no_value:
                location = argument.location
                view = pool_view(request.pools[location.pool_index])
                values[index] = view[location.offset:location.offset + location.length]
        for operand_index, operand in enumerate(main.operands):
            location = operand.location
            if operand.lifetime == L.CONSTANT_COPY:
                values[operand_index] = memoryview(model.operand_values)[location.offset:
                                                                         location.offset + location.length]
            elif operand.lifetime == L.CONSTANT_REFERENCE:
                view = pool_view(model.pools[location.pool_index])
                values[operand_index] = view[location.offset:location.offset + location.length]
        results: dict[int, np.ndarray] = {}
        for operation in main.operations:
            n_index = operation.inputs[FIBONACCI_INPUT_N]
            if n_index in results:
                data = memoryview(results[n_index].tobytes())
            elif n_index in values:
                data = values[n_index]
            else:
                raise _invalid("EXAMPLE_FIBONACCI input n has no value")
            if deadline_ns is not None and time.monotonic_ns() > deadline_ns:
                raise HalError(ErrorStatus.MISSED_DEADLINE_TRANSIENT, "deadline passed")
            output_index = operation.outputs[FIBONACCI_OUTPUT]
            results[output_index] = self._compute(main.operands[output_index], self._read_n(main.operands[n_index],
                                                                                            data))
        shapes = []
        for argument, index in zip(request.outputs, main.output_indexes, strict=True):
            result = results[index]
            declared = list(argument.dimensions or main.operands[index].dimensions)
            if declared and declared[0] and declared[0] != result.size:
                raise _invalid(f"EXAMPLE_FIBONACCI output has shape {declared}, but n = {result.size}")
            sufficient = argument.has_no_value or argument.location.length >= result.nbytes
            shapes.append(OutputShape([result.size], sufficient))
        if not all(shape.is_sufficient for shape in shapes):
            raise HalError(ErrorStatus.OUTPUT_INSUFFICIENT_SIZE, "an output buffer is too small", shapes)
        for argument, index in zip(request.outputs, main.output_indexes, strict=True):
            if not argument.has_no_value:
                location = argument.location
                view = pool_view(request.pools[location.pool_index])
                data = results[index].view(np.uint8)
                view[location.offset:location.offset + data.size] = data
        elapsed = time.monotonic_ns() - start
        return shapes, Timing(elapsed, elapsed) if measure_timing else Timing()


def devices() -> list[IDevice]:
    """The plug-in factory (``--driver fibonacci``)."""
    return [FibonacciDevice()]
