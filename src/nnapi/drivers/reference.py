"""The reference CPU driver, ``nnapi-reference``: runs every operation of a HAL model with
the operation registry's numpy kernels, exactly as the specification defines them."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from nnapi import __version__
from nnapi.codes import DeviceTypeCode, FeatureLevelCode, OperandCode, OperationCode, ResultCode
from nnapi.errors import NnapiError
from nnapi.hal import (
    Capabilities,
    ErrorStatus,
    ExecutionPreference,
    HalError,
    IDevice,
    IPreparedModel,
    Model,
    OperandLifeTime,
    OutputShape,
    PerformanceInfo,
    Priority,
    Request,
    Subgraph,
    Timing,
)
from nnapi.hal.types import is_extension_type
from nnapi.hal.validation import validate_model, validate_request
from nnapi.operand import TENSOR_TYPES, dtype_of
from nnapi.operations import ExecutionContext, OperationFailed, Tensor, ValidationContext, get_operation
from nnapi.operations.base import MAX_OPERAND_BYTES, SubgraphSignature, deadline_checked

L = OperandLifeTime
_RESULT_TO_STATUS = {
    # result codes an operation or the driver may raise, as the HAL status that carries them
    ResultCode.BAD_DATA: ErrorStatus.INVALID_ARGUMENT,
    ResultCode.OUTPUT_INSUFFICIENT_SIZE: ErrorStatus.OUTPUT_INSUFFICIENT_SIZE,
    ResultCode.MISSED_DEADLINE_TRANSIENT: ErrorStatus.MISSED_DEADLINE_TRANSIENT,
    ResultCode.MISSED_DEADLINE_PERSISTENT: ErrorStatus.MISSED_DEADLINE_PERSISTENT,
    ResultCode.RESOURCE_EXHAUSTED_TRANSIENT: ErrorStatus.RESOURCE_EXHAUSTED_TRANSIENT,
    ResultCode.RESOURCE_EXHAUSTED_PERSISTENT: ErrorStatus.RESOURCE_EXHAUSTED_PERSISTENT,
}


@dataclass(frozen=True)
class SubgraphRef:
    """The value of a MODEL operand: which referenced subgraph it names."""

    index: int


def supports_operation(model: Model, subgraph: Subgraph, operation) -> bool:
    """True if the registry implements ``operation`` with these operand types."""
    return unsupported_reason(model, subgraph, operation) is None


def unsupported_reason(model: Model, subgraph: Subgraph, operation) -> str | None:
    """None if the registry implements ``operation`` with these operand types, else the
    validation message that says why not."""
    if is_extension_type(operation.type):
        return f"extension operation {int(operation.type):#x}: nnapi-reference supports no extensions"
    implementation = get_operation(operation.type)
    if implementation is None:
        return f"{OperationCode(operation.type).name} is not implemented"
    # A constant set to no value where the operation needs one: refused at compilation.
    if not getattr(implementation, "omitted_operands", True) and any(
            subgraph.operands[i].lifetime == L.NO_VALUE for i in operation.inputs):
        return f"{OperationCode(operation.type).name}: an input is omitted, which the operation does not allow"

    def signature(index: int) -> SubgraphSignature | None:
        operand = subgraph.operands[index]
        if operand.lifetime != L.SUBGRAPH:
            return None
        target = model.referenced[operand.location.offset]
        return SubgraphSignature(tuple(target.operands[i].operand_type() for i in target.input_indexes),
                                 tuple(target.operands[i].operand_type() for i in target.output_indexes))

    context = ValidationContext(OperationCode(operation.type),
                                [subgraph.operands[i].operand_type() for i in operation.inputs],
                                [subgraph.operands[i].operand_type() for i in operation.outputs],
                                [signature(i) for i in operation.inputs])
    try:
        implementation.validate(context)
    except NnapiError as error:
        return str(error)
    except Exception as error:  # a validator's own bug must not break the query
        return f"validation failed: {type(error).__name__}: {error}"
    return None


class ReferenceDevice(IDevice):
    """The always-present CPU device."""

    name = "nnapi-reference"
    version_string = __version__
    device_type = DeviceTypeCode.DEVICE_CPU
    feature_level = FeatureLevelCode.FEATURE_LEVEL_8

    def get_capabilities(self) -> Capabilities:
        reference = PerformanceInfo(1.0, 1.0)
        return Capabilities(
            relaxed_float32_to_float16_scalar=reference,
            relaxed_float32_to_float16_tensor=reference,
            operand_performance={code: reference for code in OperandCode},
            if_performance=reference,
            while_performance=reference,
        )

    def get_supported_operations(self, model: Model) -> list[bool]:
        return [supports_operation(model, model.main, operation) for operation in model.main.operations]

    def get_unsupported_reasons(self, model: Model) -> list[str | None]:
        return [unsupported_reason(model, model.main, operation) for operation in model.main.operations]

    def prepare_model(self, model: Model, preference=ExecutionPreference.FAST_SINGLE_ANSWER,
                      priority=Priority.MEDIUM, deadline_ns=None, model_cache=(), data_cache=(),
                      token=None) -> IPreparedModel:
        validate_model(model)
        if deadline_ns is not None and time.monotonic_ns() > deadline_ns:
            raise HalError(ErrorStatus.MISSED_DEADLINE_TRANSIENT, "deadline passed before preparation")
        for subgraph in [model.main, *model.referenced]:
            for operation in subgraph.operations:
                if not supports_operation(model, subgraph, operation):
                    raise HalError(ErrorStatus.INVALID_ARGUMENT,
                                   f"operation {OperationCode(operation.type).name} is not supported")
        prepared = ReferencePreparedModel(model)
        if token is not None and len(model_cache) == 1 and len(data_cache) == 1:
            self._write_cache(model, model_cache[0], data_cache[0], token)
        return prepared

    # --- compilation caching: the validated model, checksummed (see cache_format) ---
    def get_number_of_cache_files_needed(self) -> tuple[int, int]:
        return (1, 1)

    def _write_cache(self, model: Model, model_fd: int, data_fd: int, token: bytes) -> None:
        from nnapi.drivers.cache_format import pack
        from nnapi.hal.interfaces import write_fd

        model_bytes, data_bytes = pack(model, token)
        try:
            write_fd(data_fd, data_bytes)
            write_fd(model_fd, model_bytes)
        except OSError:
            pass  # a cache that cannot be written is no cache; the preparation stands

    def prepare_model_from_cache(self, model_cache, data_cache, token, deadline_ns=None) -> IPreparedModel:
        from nnapi.drivers.cache_format import unpack
        from nnapi.hal.interfaces import read_fd

        if len(model_cache) != 1 or len(data_cache) != 1 or token is None:
            raise HalError(ErrorStatus.INVALID_ARGUMENT, "expected one model and one data cache file and a token")
        try:
            model_bytes, data_bytes = read_fd(model_cache[0]), read_fd(data_cache[0])
        except (OSError, TypeError, ValueError) as error:
            raise HalError(ErrorStatus.GENERAL_FAILURE, f"cannot read the cache: {error}") from None
        model = unpack(model_bytes, data_bytes, token)
        return self.prepare_model(model, deadline_ns=deadline_ns)


class ReferencePreparedModel(IPreparedModel):
    def __init__(self, model: Model) -> None:
        self.model = model
        self._constants = [self._decode_constants(s) for s in [model.main, *model.referenced]]

    def _decode_constants(self, subgraph: Subgraph) -> dict[int, Tensor]:
        constants: dict[int, Tensor] = {}
        for index, operand in enumerate(subgraph.operands):
            lifetime = operand.lifetime
            if lifetime in (L.CONSTANT_COPY, L.CONSTANT_REFERENCE):
                location = operand.location
                buffer = (self.model.operand_values if lifetime == L.CONSTANT_COPY
                          else self.model.pools[location.pool_index])
                dtype = dtype_of(operand.type)
                array = np.frombuffer(buffer, dtype=dtype, count=location.length // dtype.itemsize,
                                      offset=location.offset).reshape(operand.dimensions)
                constants[index] = _tensor(operand, tuple(operand.dimensions), array)
            elif lifetime == L.NO_VALUE:
                constants[index] = _tensor(operand, tuple(operand.dimensions), None)
            elif lifetime == L.SUBGRAPH:
                constants[index] = _tensor(operand, (), SubgraphRef(operand.location.offset))
        return constants

    def execute(self, request: Request, measure_timing: bool = False, deadline_ns: int | None = None,
                loop_timeout_ns: int | None = None) -> tuple[list[OutputShape], Timing]:
        start = time.monotonic_ns()
        validate_request(request, self.model)
        run = _Run(self, deadline_ns, loop_timeout_ns)
        try:
            # Kernels run under their own numpy error state, whatever the caller set.
            with np.errstate(all="ignore"), deadline_checked(run.check_deadline):
                inputs = [self._read_input(request, position, operand_index)
                          for position, operand_index in enumerate(self.model.main.input_indexes)]
                outputs = run.subgraph(0, inputs)
        except HalError:
            raise
        except MemoryError as error:
            raise _out_of_memory(ErrorStatus.RESOURCE_EXHAUSTED_TRANSIENT, "out of memory") from error
        except OperationFailed as error:
            raise HalError(ErrorStatus.GENERAL_FAILURE, str(error)) from error
        except NnapiError as error:
            raise HalError(_RESULT_TO_STATUS.get(error.code, ErrorStatus.GENERAL_FAILURE), str(error)) from error
        except Exception as error:  # a kernel bug is reported, never leaked
            raise HalError(ErrorStatus.GENERAL_FAILURE, f"{type(error).__name__}: {error}") from error
        shapes = self._write_outputs(request, outputs)
        elapsed = time.monotonic_ns() - start
        timing = Timing(elapsed, elapsed) if measure_timing else Timing()
        return shapes, timing

    def _read_input(self, request: Request, position: int, operand_index: int) -> Tensor:
        operand = self.model.main.operands[operand_index]
        argument = request.inputs[position]
        if argument.has_no_value:
            return _tensor(operand, tuple(operand.dimensions), None)
        dims = tuple(argument.dimensions or operand.dimensions)
        if operand.type in TENSOR_TYPES and (not dims or 0 in dims):
            raise HalError(ErrorStatus.INVALID_ARGUMENT, f"input {position} has unspecified dimensions")
        dtype = dtype_of(operand.type)
        count = int(np.prod(dims)) if dims else 1
        location = argument.location
        if location.length < count * dtype.itemsize:
            raise HalError(ErrorStatus.INVALID_ARGUMENT, f"input {position} buffer is too small")
        array = np.frombuffer(request.pools[location.pool_index], dtype=dtype, count=count,
                              offset=location.offset).reshape(dims)
        return _tensor(operand, dims, array)

    def _write_outputs(self, request: Request, outputs: list[Tensor]) -> list[OutputShape]:
        shapes: list[OutputShape] = []
        for position, tensor in enumerate(outputs):
            argument = request.outputs[position]
            needed = tensor.value.nbytes if tensor.value is not None else 0
            sufficient = argument.has_no_value or argument.location.length >= needed
            shapes.append(OutputShape(list(tensor.shape), sufficient))
        if not all(shape.is_sufficient for shape in shapes):
            raise HalError(ErrorStatus.OUTPUT_INSUFFICIENT_SIZE, "an output buffer is too small", shapes)
        for position, tensor in enumerate(outputs):
            argument = request.outputs[position]
            if argument.has_no_value or tensor.value is None or tensor.value.size == 0:
                continue
            target = np.frombuffer(request.pools[argument.location.pool_index], dtype=np.uint8,
                                   count=tensor.value.nbytes, offset=argument.location.offset)
            target[:] = np.ascontiguousarray(tensor.value).reshape(-1).view(np.uint8)
        return shapes


class _Run:
    """One execution: runs subgraphs, checks the deadline, enforces kernel contracts."""

    def __init__(self, prepared: ReferencePreparedModel, deadline_ns: int | None, loop_timeout_ns: int | None):
        self.prepared = prepared
        self.model = prepared.model
        self.deadline_ns = deadline_ns
        self.loop_timeout_ns = loop_timeout_ns

    def check_deadline(self) -> None:
        if self.deadline_ns is not None and time.monotonic_ns() > self.deadline_ns:
            raise HalError(ErrorStatus.MISSED_DEADLINE_TRANSIENT, "the execution's deadline passed")

    def run_reference(self, ref: SubgraphRef, inputs: list[Tensor]) -> list[Tensor]:
        return self.subgraph(ref.index + 1, inputs)

    def subgraph(self, number: int, inputs: list[Tensor]) -> list[Tensor]:
        """Run subgraph ``number`` (0 = main, k = referenced[k-1]) on ``inputs``."""
        subgraph = self.model.main if number == 0 else self.model.referenced[number - 1]
        values: dict[int, Tensor] = dict(self.prepared._constants[number])
        if len(inputs) != len(subgraph.input_indexes):
            raise OperationFailed(f"subgraph expects {len(subgraph.input_indexes)} inputs, got {len(inputs)}")
        for operand_index, tensor in zip(subgraph.input_indexes, inputs, strict=True):
            operand = subgraph.operands[operand_index]
            values[operand_index] = Tensor(operand.type, tensor.shape, operand.scale, operand.zero_point,
                                           operand.channel_quant, tensor.value)
        relaxed = self.model.relax_computation_float32_to_float16
        for operation in subgraph.operations:
            self.check_deadline()
            code = OperationCode(operation.type)
            implementation = get_operation(code)
            if implementation is None:
                raise OperationFailed(f"{code.name} is not implemented")
            missing = [i for i in operation.inputs if i not in values]
            if missing:
                raise OperationFailed(f"{code.name}: operands {missing} have no value")
            declared = [subgraph.operands[i].operand_type() for i in operation.outputs]
            context = ExecutionContext(code, [values[i] for i in operation.inputs], declared, relaxed,
                                       run_subgraph=self.run_reference, check_deadline=self.check_deadline,
                                       loop_timeout_ns=self.loop_timeout_ns)
            shapes = [tuple(int(d) for d in s) for s in _guarded(code, context, implementation.prepare)]
            if len(shapes) != len(operation.outputs):
                raise OperationFailed(f"{code.name}: prepare gave {len(shapes)} shapes for "
                                      f"{len(operation.outputs)} outputs")
            for position, (shape, output_type) in enumerate(zip(shapes, declared, strict=True)):
                _check_output_size(code, position, shape, output_type)
            for position, (shape, output_type) in enumerate(zip(shapes, declared, strict=True)):
                known = output_type.dimensions
                if known and (len(known) != len(shape) or any(k and k != s for k, s in zip(known, shape,
                                                                                         strict=True))):
                    raise OperationFailed(f"{code.name}: output {position} has shape {list(shape)} but the "
                                          f"model declares {list(known)}")
            results = _guarded(code, context, implementation.execute)
            if len(results) != len(operation.outputs):
                raise OperationFailed(f"{code.name}: produced {len(results)} outputs, expected "
                                      f"{len(operation.outputs)}")
            for position, (result, shape, operand_index) in enumerate(zip(results, shapes, operation.outputs,
                                                                          strict=True)):
                operand = subgraph.operands[operand_index]
                result = np.asarray(result)
                expected_dtype = dtype_of(operand.type)
                if result.dtype != expected_dtype or result.shape != shape:
                    raise OperationFailed(f"{code.name}: output {position} is {result.dtype}{list(result.shape)}, "
                                          f"expected {expected_dtype}{list(shape)} (kernel contract)")
                values[operand_index] = Tensor(operand.type, shape, operand.scale, operand.zero_point,
                                               operand.channel_quant, result)
        outputs = []
        for operand_index in subgraph.output_indexes:
            if operand_index not in values:
                raise OperationFailed(f"subgraph output {operand_index} was never computed")
            outputs.append(values[operand_index])
        return outputs


def _guarded(code: OperationCode, context: ExecutionContext, step):
    """Run ``prepare`` or ``execute``. A kernel that trips over an omitted input (None
    where a required value should be) was given bad data: BAD_DATA, as Android's CPU
    executor reports a missing parameter, not a kernel failure."""
    try:
        return step(context)
    except NnapiError:
        raise
    except (AttributeError, TypeError) as error:
        omitted = [position for position, tensor in enumerate(context.inputs) if tensor.value is None]
        if not omitted:
            raise
        raise HalError(ErrorStatus.INVALID_ARGUMENT,
                       f"{code.name}: input {', '.join(map(str, omitted))} omitted, but the operation needs a "
                       "value there") from error


def _check_output_size(code: OperationCode, position: int, shape: tuple[int, ...], output_type) -> None:
    """Refuse an output larger than an operand may be before any kernel allocates it (a
    FILL or TILE to 2**31 elements would otherwise die of MemoryError half way)."""
    size = dtype_of(output_type.type).itemsize
    for dim in shape:
        size *= dim
    if size > MAX_OPERAND_BYTES:
        raise _out_of_memory(ErrorStatus.RESOURCE_EXHAUSTED_PERSISTENT,
                             f"{code.name}: output {position} of shape {list(shape)} needs {size} bytes, more "
                             f"than an operand may hold ({MAX_OPERAND_BYTES})")


def _out_of_memory(status: ErrorStatus, message: str) -> HalError:
    """OUT_OF_MEMORY crosses the HAL as RESOURCE_EXHAUSTED_* (hal/Types.h); in process the
    runtime reports the exact code, which the error carries."""
    error = HalError(status, message)
    error.result_code = ResultCode.OUT_OF_MEMORY
    return error


def _tensor(operand, shape: tuple[int, ...], value) -> Tensor:
    return Tensor(operand.type, shape, operand.scale, operand.zero_point, operand.channel_quant, value)
