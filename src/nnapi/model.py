"""Model: the NDK's ANeuralNetworksModel_* functions.

A model is built operand by operand and operation by operation; every call checks its
arguments as the NDK documents and raises the matching NnapiError. ``finish`` checks the
graph as a whole (every operand written exactly once, no cycle) and freezes it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from nnapi import vlog
from nnapi._object import NnapiObject, as_flag
from nnapi.codes import MAX_SIZE_OF_IMMEDIATELY_COPIED_VALUES, OperandCode, OperationCode
from nnapi.errors import BadDataError, BadStateError, NnapiError, UnexpectedNullError
from nnapi.memory import Memory
from nnapi.operand import (
    TENSOR_TYPES,
    OperandType,
    SymmPerChannelQuantParams,
    constant_value,
    dtype_of,
    validate_channel_quant,
    validate_operand_type,
)
from nnapi.operations import Tensor, ValidationContext, get_operation, prepared_shapes
from nnapi.operations.base import (
    RunTimeValue,
    SubgraphSignature,
    accepted_signature,
    operand_key,
    remember_accepted,
    signature_key,
)
from nnapi.runtime import type_manager
from nnapi.runtime.operand_values import (
    NO_VALUE,
    CopiedValue,
    MemoryValue,
    ModelValue,
    OperationRecord,
    ReferencedValue,
)
from nnapi.runtime.type_manager import ExtensionOperandCode, ExtensionOperationCode


def as_bytes_view(value: Any, op_type: OperandType | None = None) -> memoryview:
    """A flat byte view of a bytes-like object or numpy value.

    Python scalars (int, float, bool) are converted to ``op_type``'s element type, so
    ``set_operand_value(i, 3)`` works for an INT32 operand.
    """
    if isinstance(value, bool | int | float) and op_type is not None and not op_type.is_tensor:
        if op_type.is_extension:
            raise BadDataError(f"{op_type.type.name} is an extension type: give its value as bytes or a numpy "
                               "array, not a Python number")
        value = _scalar_array(value, op_type)
    if isinstance(value, np.generic):
        value = np.array(value)
    if isinstance(value, np.ndarray):
        if value.dtype.hasobject or isinstance(value, np.ma.MaskedArray):
            raise BadDataError(f"expected an array of numbers, got {type(value).__name__} of dtype {value.dtype}")
        if not value.flags.c_contiguous:
            value = np.ascontiguousarray(value)
        # A flat byte view works for every shape, zero-sized ones included.
        value = value.reshape(-1).view(np.uint8)
    try:
        view = memoryview(value)
    except TypeError:
        raise BadDataError(f"expected a bytes-like object or numpy array, got {type(value).__name__}") from None
    if not view.c_contiguous:
        raise BadDataError("buffer must be C-contiguous")
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


def _scalar_array(value: bool | int | float, op_type: OperandType) -> np.ndarray:
    """A Python scalar as ``op_type``'s element, refusing what would change its value
    (1.7 for an INT32, 5 for a BOOL, 1e300 for a FLOAT16)."""
    dtype = op_type.dtype
    name = op_type.type.name
    if dtype.kind in "iub":
        if isinstance(value, float) and not value.is_integer():
            raise BadDataError(f"value {value!r} is not an integer, as {name} needs")
        if dtype.kind == "b" and value not in (0, 1):
            raise BadDataError(f"value {value!r} is not a boolean, as {name} needs")
        info = np.iinfo(dtype) if dtype.kind != "b" else None
        if info is not None and not info.min <= value <= info.max:
            raise BadDataError(f"value {value!r} does not fit {name} ([{info.min}, {info.max}])")
        return np.array(int(value), dtype=dtype)
    try:
        with np.errstate(over="raise"):
            array = np.array(value, dtype=dtype)
    except (OverflowError, FloatingPointError, ValueError) as error:
        raise BadDataError(f"value {value!r} does not fit {name}: {error}") from None
    if np.isfinite(value) and not np.isfinite(array):
        raise BadDataError(f"value {value!r} does not fit {name}")
    return array


class Model(NnapiObject):
    """ANeuralNetworksModel."""

    def __init__(self) -> None:
        """ANeuralNetworksModel_create."""
        self._operands: list[OperandType] = []
        self._values: dict[int, Any] = {}
        self._operations: list[OperationRecord] = []
        self._writers: dict[int, int] = {}  # operand index -> operation that writes it
        self._inputs: list[int] = []
        self._outputs: list[int] = []
        self._relaxed = False
        self._finished = False
        self._run_order: list[int] = []
        self._extension_data: dict[int, bytes] = {}  # operand index -> its extension parameters
        #: the HAL model of the finished model, built once (``_hal_model``)
        self._hal: tuple | None = None

    # --- state helpers ---------------------------------------------------------------
    def _check_modifiable(self, call: str) -> None:
        self._check_alive(call)
        if self._finished:
            raise BadStateError(f"{call}: the model is finished and cannot be modified")

    def _check_index(self, call: str, index: Any) -> int:
        if not isinstance(index, int | np.integer) or isinstance(index, bool):
            raise BadDataError(f"{call}: operand index must be an int, got {index!r}")
        if not 0 <= index < len(self._operands):
            raise BadDataError(f"{call}: operand index {index} out of range (model has {len(self._operands)})")
        return int(index)

    def _index_list(self, call: str, indexes: Any) -> list[int]:
        if isinstance(indexes, str | bytes) or not hasattr(indexes, "__iter__") or (
                isinstance(indexes, np.ndarray) and indexes.ndim != 1):
            raise BadDataError(f"{call}: expected a sequence of operand indexes, got {indexes!r}")
        return [self._check_index(call, i) for i in indexes]

    @property
    def is_finished(self) -> bool:
        return self._finished

    @property
    def operand_count(self) -> int:
        return len(self._operands)

    @property
    def operation_count(self) -> int:
        return len(self._operations)

    def operand_type(self, index: int) -> OperandType:
        return self._operands[self._check_index("operand_type", index)]

    @property
    def inputs(self) -> list[int]:
        return list(self._inputs)

    @property
    def outputs(self) -> list[int]:
        return list(self._outputs)

    @property
    def relaxed(self) -> bool:
        return self._relaxed

    # --- construction ----------------------------------------------------------------
    def add_operand(self, op_type: OperandType) -> int:
        """ANeuralNetworksModel_addOperand; returns the new operand's index."""
        self._check_modifiable("add_operand")
        if op_type is None:
            raise UnexpectedNullError("add_operand: type is None")
        if not isinstance(op_type, OperandType):
            raise BadDataError(f"add_operand: expected an OperandType, got {type(op_type).__name__}")
        validate_operand_type(op_type, f"add_operand({len(self._operands)})")
        self._operands.append(op_type)
        return len(self._operands) - 1

    def set_operand_value(self, index: int, value: Any) -> None:
        """ANeuralNetworksModel_setOperandValue.

        ``value`` is bytes-like, a numpy array or scalar, or a Python scalar for a scalar
        operand; None marks an optional operand as omitted. Values up to
        MAX_SIZE_OF_IMMEDIATELY_COPIED_VALUES bytes are copied now; larger ones are kept
        by reference, so the buffer must stay unchanged while the model is in use.
        """
        call = "set_operand_value"
        self._check_modifiable(call)
        index = self._check_index(call, index)
        op_type = self._operands[index]
        self._check_settable(call, index)
        if value is None:
            self._values[index] = NO_VALUE
            return
        if op_type.type == OperandCode.MODEL:
            raise BadDataError(f"{call}: operand {index} is a MODEL; use set_operand_value_from_model")
        try:
            view = as_bytes_view(value, op_type)
        except BadDataError as error:
            raise BadDataError(f"{call}: operand {index}: {error}") from None
        self._check_value_length(call, index, view.nbytes)
        if view.nbytes <= MAX_SIZE_OF_IMMEDIATELY_COPIED_VALUES:
            self._values[index] = CopiedValue(view.tobytes())
        else:
            self._values[index] = ReferencedValue(view)

    def set_operand_value_from_memory(self, index: int, memory: Memory, offset: int, length: int) -> None:
        """ANeuralNetworksModel_setOperandValueFromMemory: the value is ``length`` bytes of
        ``memory`` at ``offset``, referenced, not copied."""
        call = "set_operand_value_from_memory"
        self._check_modifiable(call)
        if memory is None:
            raise UnexpectedNullError(f"{call}: memory is None")
        if not isinstance(memory, Memory):
            raise BadDataError(f"{call}: expected a Memory, got {type(memory).__name__}")
        memory._check_alive(call)
        index = self._check_index(call, index)
        self._check_settable(call, index)
        if memory.is_from_desc:
            raise BadDataError(f"{call}: a memory created from a MemoryDesc cannot hold operand values")
        if self._operands[index].type == OperandCode.MODEL:
            raise BadDataError(f"{call}: operand {index} is a MODEL; use set_operand_value_from_model")
        if not isinstance(offset, int) or not isinstance(length, int) or offset < 0 or length < 0:
            raise BadDataError(f"{call}: offset and length must be non-negative ints")
        if offset + length > memory.size:
            raise BadDataError(f"{call}: offset {offset} + length {length} exceeds the memory's {memory.size} bytes")
        self._check_value_length(call, index, length)
        self._values[index] = MemoryValue(memory, offset, length)

    def set_operand_value_from_model(self, index: int, value: Model) -> None:
        """ANeuralNetworksModel_setOperandValueFromModel: a MODEL operand referring to a
        finished model (the body or condition of IF / WHILE)."""
        call = "set_operand_value_from_model"
        self._check_modifiable(call)
        if value is None:
            raise UnexpectedNullError(f"{call}: value is None")
        if not isinstance(value, Model):
            raise BadDataError(f"{call}: expected a Model, got {type(value).__name__}")
        value._check_alive(call)
        index = self._check_index(call, index)
        self._check_settable(call, index)
        if self._operands[index].type != OperandCode.MODEL:
            raise BadDataError(f"{call}: operand {index} is {self._operands[index].type.name}, not MODEL")
        if not value._finished:
            raise BadDataError(f"{call}: the referenced model must be finished")
        if value is self:
            raise BadDataError(f"{call}: a model cannot reference itself")
        self._values[index] = ModelValue(value)

    def set_operand_symm_per_channel_quant_params(self, index: int, params: SymmPerChannelQuantParams) -> None:
        """ANeuralNetworksModel_setOperandSymmPerChannelQuantParams."""
        call = "set_operand_symm_per_channel_quant_params"
        self._check_modifiable(call)
        index = self._check_index(call, index)
        if params is None:
            raise UnexpectedNullError(f"{call}: params is None")
        if not isinstance(params, SymmPerChannelQuantParams):
            raise BadDataError(f"{call}: expected SymmPerChannelQuantParams")
        validate_channel_quant(self._operands[index], params, f"{call}({index})")
        self._operands[index] = self._operands[index].with_channel_quant(params)

    # --- vendor extensions (NeuralNetworksExtensions.h) --------------------------------
    def _extension_type(self, call: str, extension_name: str, code_within_extension: int, kind: str) -> int:
        self._check_alive(call)
        if extension_name is None:
            raise UnexpectedNullError(f"{call}: extension_name is None")
        if not isinstance(extension_name, str):
            raise BadDataError(f"{call}: extension_name must be a str, got {type(extension_name).__name__}")
        if (not isinstance(code_within_extension, int | np.integer) or isinstance(code_within_extension, bool)
                or not 0 <= code_within_extension <= type_manager.MAX_TYPE_WITHIN_EXTENSION):
            raise BadDataError(f"{call}: the {kind} code within the extension must be an int in [0, 65535] "
                               f"(uint16_t), got {code_within_extension!r}")
        extension = type_manager.extension_named(extension_name)
        if extension is None:
            raise BadDataError(f"{call}: unknown extension {extension_name!r}: no device supports it")
        return extension.prefix << 16 | int(code_within_extension)

    def get_extension_operand_type(self, extension_name: str, operand_code_within_extension: int
                                   ) -> ExtensionOperandCode:
        """ANeuralNetworksModel_getExtensionOperandType: the operand type value
        (``prefix << 16 | code``) of an extension's operand type, for OperandType.

        BAD_DATA if no device supports ``extension_name``; whether the extension declares
        the type is checked by add_operand."""
        return ExtensionOperandCode(self._extension_type("get_extension_operand_type", extension_name,
                                                         operand_code_within_extension, "operand"))

    def get_extension_operation_type(self, extension_name: str, operation_code_within_extension: int
                                     ) -> ExtensionOperationCode:
        """ANeuralNetworksModel_getExtensionOperationType: the operation type value
        (``prefix << 16 | code``) of an extension's operation, for add_operation.
        BAD_DATA if no device supports ``extension_name``."""
        return ExtensionOperationCode(self._extension_type("get_extension_operation_type", extension_name,
                                                           operation_code_within_extension, "operation"))

    def set_operand_extension_data(self, index: int, data: Any) -> None:
        """ANeuralNetworksModel_setOperandExtensionData: the extension parameters of an
        extension operand (copied now). ``data`` is bytes-like or a numpy array; None
        removes them. BAD_DATA for an operand of a non-extension type or empty data (the
        NDK's non-null pointer with length 0); BAD_STATE once the model is finished."""
        call = "set_operand_extension_data"
        self._check_modifiable(call)
        index = self._check_index(call, index)
        op_type = self._operands[index]
        if data is not None:
            try:
                view = as_bytes_view(data)
            except BadDataError as error:
                raise BadDataError(f"{call}: operand {index}: {error}") from None
            if view.nbytes == 0:
                raise BadDataError(f"{call}: operand {index}: data is empty (length 0)")
        if not op_type.is_extension:
            raise BadDataError(f"{call}: operand {index} is {op_type.type.name}, not an extension type; only "
                               "extension operands have extension data")
        if data is None:
            self._extension_data.pop(index, None)
        else:
            self._extension_data[index] = view.tobytes()

    def extension_data(self, index: int) -> bytes | None:
        """The extension data set on operand ``index`` (no NDK counterpart)."""
        return self._extension_data.get(self._check_index("extension_data", index))

    def _check_settable(self, call: str, index: int) -> None:
        if index in self._inputs or index in self._outputs:
            raise BadDataError(f"{call}: operand {index} is a model input or output and cannot have a value")
        if index in self._writers:
            raise BadDataError(f"{call}: operand {index} is written by an operation and cannot have a value")

    def _check_value_length(self, call: str, index: int, length: int) -> None:
        op_type = self._operands[index]
        if not op_type.is_fully_specified:
            raise BadDataError(f"{call}: operand {index} ({op_type.describe()}) has unspecified dimensions")
        if length != op_type.byte_size():
            raise BadDataError(
                f"{call}: operand {index} ({op_type.describe()}) needs {op_type.byte_size()} bytes, got {length}")

    def add_operation(self, code: int, inputs: Sequence[int], outputs: Sequence[int]) -> None:
        """ANeuralNetworksModel_addOperation: validates the operation's signature now.

        ``code`` may be a vendor extension's operation type (get_extension_operation_type):
        as in Android, only its prefix and operand indexes are checked here; its driver
        validates the rest when the model is compiled."""
        self._check_modifiable("add_operation")
        code = self._operation_code(code)
        call = f"add_operation({code.name})"
        if inputs is None or outputs is None:
            raise UnexpectedNullError(f"{call}: inputs and outputs are required")
        input_list = self._index_list(call, inputs)
        output_list = self._index_list(call, outputs)
        for position, index in enumerate(output_list):
            if index in self._values:
                raise BadDataError(f"{call}: output {position} (operand {index}) has a constant value")
            if index in self._writers:
                raise BadDataError(f"{call}: output {position} (operand {index}) is already written by "
                                   f"operation {self._writers[index]}")
            if index in self._inputs:
                raise BadDataError(f"{call}: output {position} (operand {index}) is a model input")
            if index in output_list[:position]:
                raise BadDataError(f"{call}: operand {index} appears twice among the outputs")
        if isinstance(code, OperationCode):
            implementation = get_operation(code)
            if implementation is None:
                raise BadDataError(f"{call}: operation {code.name} is not implemented yet by nnapi")
            self._validate_operation(code, input_list, output_list)
        for index in output_list:
            self._writers[index] = len(self._operations)
        self._operations.append(OperationRecord(code, input_list, output_list))

    def _complete_last_outputs(self) -> None:
        """Give the outputs of the operation added last the dimensions its validation
        inferred from its inputs' declared shapes and constants, where they were declared
        with unknown dimensions. Not an NDK call (an operand's type is fixed once added): an
        importer that learns a tensor's shape only from the operation writing it (a file
        whose declared shapes are placeholders) uses it before ``finish``."""
        self._check_modifiable("_complete_last_outputs")
        if not self._operations:
            return
        record = self._operations[-1]
        if not isinstance(record.code, OperationCode):
            return
        known = accepted_signature(self._signature_key(record.code, record.inputs, record.outputs))
        shapes = known[1] if known is not None else None
        if shapes is None:
            shapes = self._prepared_shapes(record)
        if shapes is None or len(shapes) != len(record.outputs):
            return
        for index, shape in zip(record.outputs, shapes, strict=True):
            declared = self._operands[index]
            dims = tuple(declared.dimensions) or (0,) * len(shape)  # () : rank unknown too
            if 0 in dims and shape and all(d > 0 for d in shape) and len(dims) == len(shape) and \
                    all(d in (0, s) for d, s in zip(dims, shape, strict=True)):
                self._operands[index] = declared.with_dimensions(list(shape))

    def _prepared_shapes(self, record: OperationRecord) -> list[tuple[int, ...]] | None:
        """The output shapes the operation's ``prepare`` gives on its inputs' declared
        shapes and every constant value (validation reads only the small ones); None
        where it needs a value computed at run time or an input's shape is unknown."""
        run_time = RunTimeValue()
        inputs = []
        for index in record.inputs:
            op_type, value = self._operands[index], self._values.get(index)
            if value is NO_VALUE:
                array = None
            elif isinstance(value, CopiedValue | ReferencedValue):
                array = constant_value(op_type, value.data if isinstance(value, CopiedValue) else value.view)
                if array is None:
                    return None
                array = np.asarray(array, dtype_of(op_type.type))
            elif value is None:
                array = run_time
            else:  # a value in a Memory, or a referenced model
                return None
            if op_type.type in TENSOR_TYPES and not op_type.is_fully_specified:
                return None
            shape = tuple(op_type.dimensions) if op_type.type in TENSOR_TYPES else ()
            inputs.append(Tensor(op_type.type, shape, op_type.scale, op_type.zero_point, op_type.channel_quant, array))
        return prepared_shapes(record.code, inputs, [self._operands[i] for i in record.outputs], self._relaxed)

    @staticmethod
    def _operation_code(code: Any) -> OperationCode | ExtensionOperationCode:
        """An OperationCode, or an extension operation type whose prefix names a known
        extension (Android: BAD_DATA "Extension operation type ... is not recognized")."""
        try:
            return OperationCode(int(code))
        except (ValueError, TypeError, OverflowError):
            pass
        if not isinstance(code, int | np.integer) or isinstance(code, bool) or not (
                type_manager.EXTENSION_TYPE_BASE <= int(code) <= type_manager.MAX_EXTENSION_TYPE):
            raise BadDataError(f"add_operation: unknown operation type {code!r}")
        prefix, _ = type_manager.split(int(code))
        if type_manager.extension_with_prefix(prefix) is None:
            raise BadDataError(f"add_operation: operation type {int(code):#x} has extension prefix {prefix}, which "
                               "no extension has (use Model.get_extension_operation_type)")
        return ExtensionOperationCode(int(code))

    def _validate_operation(self, code: OperationCode, inputs: list[int], outputs: list[int]) -> None:
        implementation = get_operation(code)
        assert implementation is not None
        key = self._signature_key(code, inputs, outputs)
        if accepted_signature(key) is not None:  # the same signature accepted before in this process
            return
        context = ValidationContext(code, [self._operands[i] for i in inputs], [self._operands[i] for i in outputs],
                                    [self._referenced_signature(i) for i in inputs],
                                    [self._constant(i) for i in inputs])
        try:
            implementation.check_signature(context)
        except NnapiError:
            raise
        except Exception as error:  # a validator bug must not escape as a raw exception
            raise BadDataError(f"add_operation({code.name}): invalid signature ({error})") from error
        remember_accepted(key, context)

    def _signature_key(self, code: OperationCode, inputs: list[int], outputs: list[int]) -> tuple | None:
        """``signature_key`` of an operation being added (None with a MODEL input): the
        operand types and the small constants set so far, as nnapi-reference keys the
        operation of the HAL model built from this one."""
        def key(index: int) -> tuple:
            operand_type, value = self._operands[index], self._values.get(index)
            if isinstance(value, ModelValue):
                raise LookupError
            return operand_key(operand_type.type, operand_type.dimensions, operand_type.scale, operand_type.zero_point,
                               operand_type.channel_quant, value.data if isinstance(value, CopiedValue) else None)

        try:
            return signature_key(code, [key(i) for i in inputs], [key(i) for i in outputs])
        except LookupError:
            return None

    def _constant(self, index: int) -> int | float | bool | np.ndarray | None:
        """The value of a scalar or small tensor already set by set_operand_value (copied:
        at most 128 bytes, as every scalar); None otherwise."""
        value = self._values.get(index)
        if not isinstance(value, CopiedValue):
            return None
        return constant_value(self._operands[index], value.data)

    def _referenced_signature(self, index: int) -> SubgraphSignature | None:
        value = self._values.get(index)
        if not isinstance(value, ModelValue):
            return None
        model = value.model
        return SubgraphSignature(tuple(model._operands[i] for i in model._inputs),
                                 tuple(model._operands[i] for i in model._outputs))

    def identify_inputs_and_outputs(self, inputs: Sequence[int], outputs: Sequence[int]) -> None:
        """ANeuralNetworksModel_identifyInputsAndOutputs."""
        call = "identify_inputs_and_outputs"
        self._check_modifiable(call)
        if inputs is None or outputs is None:
            raise UnexpectedNullError(f"{call}: inputs and outputs are required")
        input_list = self._index_list(call, inputs)
        output_list = self._index_list(call, outputs)
        for kind, indexes in (("input", input_list), ("output", output_list)):
            if len(set(indexes)) != len(indexes):
                raise BadDataError(f"{call}: an operand appears twice among the {kind}s")
            for index in indexes:
                if index in self._values:
                    raise BadDataError(f"{call}: {kind} operand {index} has a constant value")
        if set(input_list) & set(output_list):
            raise BadDataError(f"{call}: an operand cannot be both an input and an output")
        # Android marks each operand's lifetime here: one already an input or output (a
        # second call naming it again) is refused.
        already = sorted(set(input_list + output_list) & set(self._inputs + self._outputs))
        if already:
            raise BadDataError(f"{call}: operand {already[0]} is already a model input or output")
        for index in input_list:
            if index in self._writers:
                raise BadDataError(f"{call}: input operand {index} is written by an operation")
            if self._operands[index].type == OperandCode.MODEL:
                raise BadDataError(f"{call}: a MODEL operand cannot be a model input")
        self._inputs, self._outputs = input_list, output_list

    def relax_computation_float32_to_float16(self, allow: bool) -> None:
        """ANeuralNetworksModel_relaxComputationFloat32toFloat16."""
        self._check_modifiable("relax_computation_float32_to_float16")
        self._relaxed = as_flag("relax_computation_float32_to_float16", allow)

    def finish(self) -> None:
        """ANeuralNetworksModel_finish: validate the whole graph and freeze the model."""
        self._check_modifiable("finish")
        call = "finish"
        if not self._inputs and not self._outputs and self._operations:
            raise BadDataError(f"{call}: identify_inputs_and_outputs was not called")
        if not self._inputs:
            raise BadDataError(f"{call}: a model needs at least one input (identify_inputs_and_outputs)")
        if not self._outputs:
            raise BadDataError(f"{call}: a model needs at least one output")
        if not self._operations:
            raise BadDataError(f"{call}: a model needs at least one operation")
        for index, op_type in enumerate(self._operands):
            if op_type.type == OperandCode.TENSOR_QUANT8_SYMM_PER_CHANNEL and op_type.channel_quant is None:
                raise BadDataError(f"{call}: operand {index} needs set_operand_symm_per_channel_quant_params")
            defined = index in self._values or index in self._inputs or index in self._writers
            if not defined:
                raise BadDataError(f"{call}: operand {index} is never written (not an input, a constant "
                                   "or an operation output)")
            if op_type.type == OperandCode.MODEL and not isinstance(self._values.get(index), ModelValue):
                raise BadDataError(f"{call}: MODEL operand {index} needs set_operand_value_from_model")
        # Re-check every signature: per-channel parameters may have been set since.
        for operation in self._operations:
            if isinstance(operation.code, OperationCode):  # an extension's driver checks its own
                self._validate_operation(operation.code, operation.inputs, operation.outputs)
        self._run_order = self._topological_order()
        self._finished = True
        vlog.model.debug("finished: %d operands, %d operations, inputs %s, outputs %s", len(self._operands),
                         len(self._operations), self._inputs, self._outputs)

    def _topological_order(self) -> list[int]:
        """Operation indexes in an order where every input is ready before it is read."""
        ready = set(self._values) | set(self._inputs)
        waiting = {i: {x for x in op.inputs if x not in ready} for i, op in enumerate(self._operations)}
        readers: dict[int, list[int]] = {}
        for i, pending in waiting.items():
            for operand in pending:
                readers.setdefault(operand, []).append(i)
        queue = [i for i, pending in waiting.items() if not pending]
        order: list[int] = []
        while queue:
            current = queue.pop(0)
            order.append(current)
            for operand in self._operations[current].outputs:
                for reader in readers.get(operand, []):
                    waiting[reader].discard(operand)
                    if not waiting[reader]:
                        queue.append(reader)
        if len(order) != len(self._operations):
            raise BadDataError("finish: the graph has a cycle")
        return order

    # --- queries ---------------------------------------------------------------------
    def get_supported_operations_for_devices(self, devices: Sequence) -> list[bool]:
        """ANeuralNetworksModel_getSupportedOperationsForDevices: one flag per operation,
        in the order the operations were added; True if any of ``devices`` supports it."""
        from nnapi.device import Device
        from nnapi.runtime.execution_plan import supported_operations

        call = "get_supported_operations_for_devices"
        self._check_alive(call)
        if devices is None:
            raise UnexpectedNullError(f"{call}: devices is None")
        if not self._finished:
            raise BadStateError(f"{call}: the model is not finished")
        if isinstance(devices, str | bytes | np.ndarray) or not hasattr(devices, "__iter__"):
            raise BadDataError(f"{call}: devices must be a sequence of Device")
        devices = list(devices)
        if not devices:
            raise BadDataError(f"{call}: no devices given")
        if not all(isinstance(d, Device) for d in devices):
            raise BadDataError(f"{call}: devices must be Device objects")
        if len({id(d._hal) for d in devices}) != len(devices):
            raise BadDataError(f"{call}: devices must not repeat")
        hal_model, order = self._hal_model()
        supported = [False] * len(self._operations)
        for device in devices:
            # As Android's runtime does: a device is not asked about operations beyond its
            # feature level or using extensions it lacks, and a failing driver supports nothing.
            flags = supported_operations(hal_model, device._hal)
            for hal_index, original in enumerate(order):
                supported[original] = supported[original] or bool(flags[hal_index])
        return supported

    def _hal_model(self) -> tuple:
        """The HAL model of this finished model and its run order (``build_hal_model``),
        built at the first compilation and shared by later ones: a finished model never
        changes, and a driver that keeps what it learned of a HAL model object (the
        reference driver's validation) need not learn it again."""
        if self._hal is None:
            from nnapi.runtime.model_builder import build_hal_model

            self._hal = build_hal_model(self)
        return self._hal

    def _release(self) -> None:
        self._hal = None
        self._values.clear()
