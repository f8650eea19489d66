"""TensorFlow Lite import: a .tflite flatbuffer -> a finished nnapi.Model.

The flatbuffer is read with the ``tflite`` package (``pip install nnapi[tflite]``), the
generated schema bindings; nothing here parses bytes by hand. Each subgraph becomes one
Model (WHILE / IF branches become referenced models). Each builtin operator maps to the
NNAPI operation with the same meaning; where TFLite allows more than that operation (a
requantizing MEAN, per-channel FULLY_CONNECTED, a rank-0 GATHER index, ...) the operator
is lowered to an exact sequence of NNAPI operations and the rewrite is recorded in
``ImportedModel.lowerings``. Weights stored as float16 behind DEQUANTIZE, or sparse
behind DENSIFY, are folded into float32 / dense constants once, here. Anything without
an NNAPI meaning raises BadDataError naming the operator's index, its name and why.

Tensor conventions: a rank-0 TFLite tensor becomes a [1] NNAPI tensor (NNAPI has no
rank-0 tensors); a dimension TFLite marks -1 becomes 0 (unknown until execution).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from nnapi.codes import OperandCode, OperationCode
from nnapi.errors import BadDataError, NnapiError
from nnapi.importers import ImportedModel, Lowering, SourceOp, StateSpec, TensorSpec, read_source
from nnapi.importers.tflite_fold import folded_values
from nnapi.importers.tflite_moves import move_plan
from nnapi.importers.tflite_variables import (
    VariableError,
    assign_variable,
    call_once,
    read_variable,
    var_handle,
    variable_states,
)
from nnapi.importers.tflite_while_lstm import keras_while_lstm
from nnapi.model import Model
from nnapi.operand import OperandType, SymmPerChannelQuantParams
from nnapi.operations.common import ERFC_A, ERFC_P, GELU_TANH_CUBIC, nearest_indexes
from nnapi.operations.quant_math import (
    dequantize,
    half_below,
    multiply_by_quantized_multiplier,
    quantize,
    quantize_multiplier,
)

try:  # the optional extra nnapi[tflite]
    import tflite as _tfl
    from tflite.utils import BUILTIN_OPCODE2NAME as _OPCODE_NAMES
except ImportError:  # pragma: no cover - exercised only without the extra
    _tfl = None
    _OPCODE_NAMES = {}

T = OperandCode
Op = OperationCode

# TFLite TensorType values (schema.fbs).
_FLOAT32, _FLOAT16, _INT32, _UINT8, _INT64, _STRING, _BOOL, _INT16 = 0, 1, 2, 3, 4, 5, 6, 7
_INT8, _FLOAT64 = 9, 10
_TYPE_NAMES = {0: "FLOAT32", 1: "FLOAT16", 2: "INT32", 3: "UINT8", 4: "INT64", 5: "STRING", 6: "BOOL",
               7: "INT16", 8: "COMPLEX64", 9: "INT8", 10: "FLOAT64", 11: "COMPLEX128", 12: "UINT64",
               13: "RESOURCE", 14: "VARIANT", 15: "UINT32", 16: "UINT16", 17: "INT4"}
_NUMPY = {_FLOAT32: np.float32, _FLOAT16: np.float16, _INT32: np.int32, _UINT8: np.uint8, _INT64: np.int64,
          _BOOL: np.bool_, _INT16: np.int16, _INT8: np.int8, _FLOAT64: np.float64, 15: np.uint32, 16: np.uint16}

# TFLite ActivationFunctionType: NONE, RELU, RELU_N1_TO_1, RELU6 equal NNAPI's FuseCode.
_ACT_TANH, _ACT_SIGN_BIT = 4, 5
_ACT_NAMES = {0: "NONE", 1: "RELU", 2: "RELU_N1_TO_1", 3: "RELU6", 4: "TANH", 5: "SIGN_BIT"}
_FUSE_AS_OP = {1: Op.RELU, 2: Op.RELU1, 3: Op.RELU6, _ACT_TANH: Op.TANH}
# TFLite Padding: SAME 0, VALID 1 -> NNAPI PaddingCode SAME 1, VALID 2.
_PADDING = {0: 1, 1: 2}

_FLOAT_TYPES = (T.TENSOR_FLOAT32, T.TENSOR_FLOAT16)
_QUANT8 = (T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT8_ASYMM_SIGNED)


def _require_tflite() -> None:
    if _tfl is None:
        raise BadDataError("TensorFlow Lite import needs the 'tflite' package: pip install 'nnapi[tflite]'")


class UnsupportedOperator(Exception):
    """Raised by a converter: the operator (as configured) has no NNAPI equivalent."""


@dataclass
class _TensorInfo:
    index: int
    name: str
    tfl_type: int
    shape: tuple[int, ...]  # TFLite shape, -1 for unknown
    scales: np.ndarray | None
    zero_points: np.ndarray | None
    quantized_dimension: int
    data: np.ndarray | None  # constant contents, shaped, or None
    is_variable: bool
    sparsity: Any

    @property
    def type_name(self) -> str:
        return _TYPE_NAMES.get(self.tfl_type, str(self.tfl_type))

    @property
    def per_channel(self) -> bool:
        return self.scales is not None and len(self.scales) > 1

    @property
    def scale(self) -> float:
        return float(self.scales[0]) if self.scales is not None and len(self.scales) else 0.0

    @property
    def zero_point(self) -> int:
        return int(self.zero_points[0]) if self.zero_points is not None and len(self.zero_points) else 0


@dataclass
class _Const:
    """A constant known to the importer (a buffer, or a folded DEQUANTIZE / DENSIFY)."""

    data: np.ndarray
    code: OperandCode
    scale: float = 0.0
    zero_point: int = 0
    channel: SymmPerChannelQuantParams | None = None


def _operand_shape(shape: Sequence[int]) -> tuple[int, ...]:
    if len(shape) == 0:
        return (1,)
    return tuple(max(int(d), 0) for d in shape)


class _Operator:
    """One TFLite operator being converted: its tensors, options and names."""

    def __init__(self, graph: _Graph, index: int, raw: Any) -> None:
        self.graph = graph
        self.index = index
        self.raw = raw
        code = graph.reader.opcodes[raw.OpcodeIndex()] if raw.OpcodeIndex() < len(graph.reader.opcodes) else None
        if code is None:
            raise BadDataError(f"tflite subgraph {graph.subgraph} operator {index}: opcode index "
                               f"{raw.OpcodeIndex()} out of range")
        self.builtin, self.custom = code
        self.name = _OPCODE_NAMES.get(self.builtin, f"BUILTIN_{self.builtin}")
        if self.custom is not None:
            self.name = f"CUSTOM {self.custom}"
        self.inputs = [int(i) for i in raw.InputsAsNumpy()] if raw.InputsLength() else []
        self.outputs = [int(i) for i in raw.OutputsAsNumpy()] if raw.OutputsLength() else []
        self.source = SourceOp(graph.subgraph, index, self.name)

    def options(self, cls_name: str) -> Any:
        table = self.raw.BuiltinOptions()
        cls = getattr(_tfl, cls_name)
        options = cls()
        if table is None:
            return None
        options.Init(table.Bytes, table.Pos)
        return options

    def has_input(self, position: int) -> bool:
        return position < len(self.inputs) and self.inputs[position] >= 0

    def tensor(self, position: int) -> _TensorInfo:
        return self.graph.tensors[self.inputs[position]]

    def out_tensor(self, position: int = 0) -> _TensorInfo:
        return self.graph.tensors[self.outputs[position]]


class _Reader:
    """The whole flatbuffer: operator codes, buffers and one _Graph per subgraph."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        try:
            self.model = _tfl.Model.GetRootAsModel(data, 0)
            self.opcodes: list[tuple[int, str | None]] = []
            for i in range(self.model.OperatorCodesLength()):
                code = self.model.OperatorCodes(i)
                builtin = max(int(code.BuiltinCode()), int(code.DeprecatedBuiltinCode()))
                custom = code.CustomCode()
                self.opcodes.append((builtin, custom.decode("utf-8", "replace") if builtin == 32 and custom else
                                     ("?" if builtin == 32 else None)))
            self.subgraph_count = self.model.SubgraphsLength()
        except NnapiError:
            raise
        except Exception as error:  # a corrupt flatbuffer surfaces as struct / index errors
            raise BadDataError(f"not a valid TensorFlow Lite model ({type(error).__name__}: {error})") from None
        if self.subgraph_count == 0:
            raise BadDataError("the TensorFlow Lite model has no subgraphs")

    def buffer_data(self, index: int) -> bytes | None:
        if index <= 0 or index >= self.model.BuffersLength():
            return None
        buffer = self.model.Buffers(index)
        if buffer.DataLength():
            return buffer.DataAsNumpy().tobytes()
        offset, size = int(buffer.Offset()), int(buffer.Size())
        if offset > 1 and size:  # models over 2 GB keep buffers after the flatbuffer
            if offset + size > len(self.data):
                raise BadDataError(f"buffer {index} lies outside the file")
            return self.data[offset:offset + size]
        return None


class _Graph:
    """Tensor metadata of one subgraph."""

    def __init__(self, reader: _Reader, subgraph: int, static_shapes: bool = False, propagate: bool = False,
                 input_shapes: dict[str, tuple[int, ...]] | None = None) -> None:
        self.reader = reader
        self.subgraph = subgraph
        self.static_shapes = static_shapes
        #: the file's static shapes for the inputs only; every other dimension its shape
        #: signature leaves open is taken from the operation writing it (_Converter.emit)
        self.propagate = propagate
        #: the inputs' shapes the caller gave (load_tflite's input_shapes), by name
        self.input_shapes = input_shapes or {}
        self.raw = reader.model.Subgraphs(subgraph)
        self.inputs = [int(i) for i in self.raw.InputsAsNumpy()] if self.raw.InputsLength() else []
        self.tensors = [self._tensor(i) for i in range(self.raw.TensorsLength())]
        self.outputs = [int(i) for i in self.raw.OutputsAsNumpy()] if self.raw.OutputsLength() else []
        self.operators = [self.raw.Operators(i) for i in range(self.raw.OperatorsLength())]

    def _tensor(self, i: int) -> _TensorInfo:
        raw = self.raw.Tensors(i)
        name = (raw.Name() or b"").decode("utf-8", "replace") or f"tensor_{i}"
        shape = tuple(int(d) for d in raw.ShapeAsNumpy()) if raw.ShapeLength() else ()
        if i in self.inputs and name in self.input_shapes:
            shape = _given_shape(name, shape, raw, self.input_shapes[name])
        elif self.propagate and i not in self.inputs and not raw.IsVariable() and \
                self.reader.buffer_data(raw.Buffer()) is None:
            # every dimension open, even those its signature fixes: downstream of an open one
            # they can be placeholders too (word-activation-recognition's RFFT2D declares its
            # 1025 bins as its 2048 samples, signature and all)
            shape = tuple(-1 for _ in shape)
        elif raw.ShapeSignatureLength() and not self.static_shapes:
            signature = tuple(int(d) for d in raw.ShapeSignatureAsNumpy())
            if len(signature) == len(shape):
                shape = tuple(-1 if s < 0 else d for d, s in zip(shape, signature))
        scales = zero_points = None
        quantized_dimension = 0
        quant = raw.Quantization()
        if quant is not None and quant.ScaleLength():
            scales = np.asarray(quant.ScaleAsNumpy(), np.float64)
            zero_points = (np.asarray(quant.ZeroPointAsNumpy(), np.int64) if quant.ZeroPointLength()
                           else np.zeros(len(scales), np.int64))
            quantized_dimension = int(quant.QuantizedDimension())
        data = None
        raw_bytes = self.reader.buffer_data(raw.Buffer())
        tfl_type = int(raw.Type())
        sparsity = raw.Sparsity()
        if raw_bytes is not None:
            dtype = _NUMPY.get(tfl_type)
            if dtype is None:
                data = np.frombuffer(raw_bytes, np.uint8)
            else:
                data = np.frombuffer(raw_bytes, dtype).copy()
                if sparsity is None:
                    if data.size != int(np.prod(shape, dtype=np.int64)) or any(d < 0 for d in shape):
                        raise BadDataError(f"tflite tensor {i} ({name}): buffer holds {data.size} values for "
                                           f"shape {list(shape)}")
                    data = data.reshape(shape)
        return _TensorInfo(i, name, tfl_type, shape, scales, zero_points, quantized_dimension, data,
                           bool(raw.IsVariable()), sparsity)


class _Converter:
    """Builds one nnapi.Model from one TFLite subgraph."""

    def __init__(self, importer: _Importer, subgraph: int, top_level: bool) -> None:
        self.importer = importer
        self.graph = _Graph(importer.reader, subgraph, importer.static_shapes, importer.propagate,
                            importer.input_shapes if top_level else None)
        self.top_level = top_level
        self.model = Model()
        self.operands: dict[int, int] = {}  # TFLite tensor -> NNAPI operand
        self.consts: dict[int, _Const] = {}
        self.sources: list[SourceOp] = []
        self.lowerings: list[Lowering] = []
        self.hybrid_operators: list[SourceOp] = []
        self.detections: list[tuple[int, int, int, int]] = []  # TFLite_Detection_PostProcess output tensors
        self.keep_alive: list[Any] = []
        self.states: list[tuple[int, int]] = []  # (tensor, model input position)
        self.state_outputs: dict[int, int] = {}  # tensor -> NNAPI operand holding its new value
        #: resource variables (tflite_variables.py): VAR_HANDLE tensor -> (container, shared
        #: name), the variables by that key, their initial values (CALL_ONCE's constants)
        self.variable_handles: dict[int, tuple[str, str]] = {}
        self.variables: dict[tuple[str, str], Any] = {}
        self.variable_initials: dict[tuple[str, str], np.ndarray] = {}
        #: the model's inputs as convert() identifies them (variables add theirs)
        self.model_inputs: list[int] = []
        self.current: _Operator | None = None
        self._emitted: list[str] = []
        # PAD outputs folded into the explicit padding of the convolutions reading them:
        # tensor -> (the PAD's input tensor, (top, bottom, left, right))
        self.folded_pads: dict[int, tuple[int, tuple[int, int, int, int]]] = {}
        self._operators: list[_Operator] | None = None
        self._readers: dict[int, list[tuple[_Operator, int]]] | None = None
        # While an int32 / bool operator is moved through float32 (_through_float32):
        # output() gives float32 operands; the float32 halves made of each tensor, kept.
        self.float_outputs = False
        #: complex64 tensors (RFFT2D's results; NNAPI has no complex type) as their real and
        #: imaginary parts: TFLite tensor -> (real, imaginary) float32 operands
        self.complex_parts: dict[int, tuple[int, int]] = {}
        #: int64 tensors held as TENSOR_INT32 (ARG_MAX / ARG_MIN indices, which fit)
        self.narrowed: set[int] = set()
        self.float_halves: dict[tuple[int, int], int] = {}
        # operators converted together with an earlier one (_high_rank_chain): skipped
        self.absorbed: set[int] = set()
        #: tensors above NNAPI's rank 4 held as a rank <= 4 operand of the same elements in
        #: the same order (tensor -> (operand, TFLite shape)): a RESHAPE up, or arithmetic on
        #: such tensors computed on merged axes (_lift, _lifted_arithmetic). A reader that
        #: needs the tensor itself gets the rank-5 RESHAPE then (and refuses it, as before).
        self.lifted: dict[int, tuple[int, list[int]]] = {}

    # --- operands ----------------------------------------------------------------------
    def nn_type(self, info: _TensorInfo, shape: Sequence[int] | None = None) -> OperandType:
        dims = _operand_shape(info.shape if shape is None else shape)
        t = info.tfl_type
        if t == _FLOAT32:
            return OperandType(T.TENSOR_FLOAT32, dims)
        if t == _FLOAT16:
            return OperandType(T.TENSOR_FLOAT16, dims)
        if t == _BOOL:
            return OperandType(T.TENSOR_BOOL8, dims)
        if t == _INT32:
            # Quantized biases carry a scale; a per-channel bias takes scale 0 in NNAPI.
            scale = info.scale if info.scales is not None and len(info.scales) == 1 else 0.0
            return OperandType(T.TENSOR_INT32, dims, scale, 0)
        if t == _UINT8:
            if info.scales is None:
                raise UnsupportedOperator(f"tensor {info.index} ({info.name}) is uint8 without quantization")
            return OperandType(T.TENSOR_QUANT8_ASYMM, dims, info.scale, info.zero_point)
        if t == _INT8:
            if info.scales is None:
                raise UnsupportedOperator(f"tensor {info.index} ({info.name}) is int8 without quantization")
            if info.per_channel:
                return OperandType(T.TENSOR_QUANT8_SYMM_PER_CHANNEL, dims)
            return OperandType(T.TENSOR_QUANT8_ASYMM_SIGNED, dims, info.scale, info.zero_point)
        if t == _INT16:
            if info.scales is None or info.per_channel or info.zero_point != 0:
                raise UnsupportedOperator(f"tensor {info.index} ({info.name}) is int16 without symmetric "
                                          "per-tensor quantization")
            return OperandType(T.TENSOR_QUANT16_SYMM, dims, info.scale, 0)
        raise UnsupportedOperator(f"tensor {info.index} ({info.name}) has type {info.type_name}, "
                                  "which NNAPI has no operand type for")

    def channel_params(self, info: _TensorInfo) -> SymmPerChannelQuantParams | None:
        if info.tfl_type == _INT8 and info.per_channel:
            if info.zero_points is not None and np.any(info.zero_points != 0):
                raise UnsupportedOperator(f"tensor {info.index} ({info.name}) is per-channel quantized with "
                                          "non-zero zero points")
            return SymmPerChannelQuantParams(info.quantized_dimension, [float(s) for s in info.scales])
        return None

    def add(self, op_type: OperandType, channel: SymmPerChannelQuantParams | None = None) -> int:
        index = self.model.add_operand(op_type)
        if channel is not None:
            self.model.set_operand_symm_per_channel_quant_params(index, channel)
        return index

    def const_operand(self, data: np.ndarray, op_type: OperandType,
                      channel: SymmPerChannelQuantParams | None = None) -> int:
        index = self.add(op_type, channel)
        data = np.ascontiguousarray(data, dtype=op_type.dtype)
        self.keep_alive.append(data)
        self.model.set_operand_value(index, data)
        return index

    def const_of(self, tensor: int) -> _Const | None:
        """The constant value of a TFLite tensor, or None if it is computed at run time."""
        if tensor in self.consts:
            return self.consts[tensor]
        info = self.graph.tensors[tensor]
        if info.data is None or info.is_variable:
            return None
        if info.sparsity is not None:
            raise UnsupportedOperator(f"tensor {tensor} ({info.name}) is sparse; only DENSIFY may read it")
        if info.tfl_type in (_INT64, _FLOAT64):
            # Index-like int64 constants (axes, shapes, paddings) narrow to NNAPI's int32.
            if info.tfl_type == _INT64:
                if info.data.size and (info.data.min() < -2**31 or info.data.max() >= 2**31):
                    raise UnsupportedOperator(f"int64 constant {tensor} ({info.name}) exceeds int32")
                const = _Const(info.data.astype(np.int32), T.TENSOR_INT32)
            else:
                const = _Const(info.data.astype(np.float32), T.TENSOR_FLOAT32)
        else:
            op_type = self.nn_type(info)
            const = _Const(info.data, op_type.type, op_type.scale, op_type.zero_point, self.channel_params(info))
        self.consts[tensor] = const
        return const

    def const_values(self, position: int, what: str) -> np.ndarray:
        """The values of a constant input operand (axes, shapes, sizes) as a numpy array."""
        op = self.current
        const = self.const_of(op.inputs[position])
        if const is None:
            raise UnsupportedOperator(f"{what} (input {position}) must be a constant")
        return const.data

    def operand(self, tensor: int) -> int:
        """The NNAPI operand of a TFLite tensor, creating it for a constant on first use."""
        if tensor in self.operands:
            return self.operands[tensor]
        if tensor in self.lifted:
            source, shape = self.lifted[tensor]
            index = self.add(self.type_of(source).with_dimensions(shape))
            self.emit(Op.RESHAPE, [source, self.vector(shape)], [index])
            self.operands[tensor] = index
            return index
        const = self.const_of(tensor)
        if const is None:
            info = self.graph.tensors[tensor]
            raise UnsupportedOperator(f"tensor {tensor} ({info.name}) is read before any operator writes it")
        dims = _operand_shape(const.data.shape)
        index = self.const_operand(const.data.reshape(dims), OperandType(const.code, dims, const.scale,
                                                                             const.zero_point), const.channel)
        self.operands[tensor] = index
        return index

    def input(self, position: int) -> int:
        return self.operand(self.current.inputs[position])

    def type_of(self, operand: int) -> OperandType:
        return self.model.operand_type(operand)

    def output(self, position: int = 0) -> int:
        """Create the NNAPI operand for the current operator's output ``position``."""
        tensor = self.current.outputs[position]
        info = self.graph.tensors[tensor]
        if tensor in self.operands:
            raise UnsupportedOperator(f"tensor {tensor} ({info.name}) is written twice")
        if self.float_outputs:
            index = self.add(OperandType(T.TENSOR_FLOAT32, _operand_shape(info.shape)))
            self.operands[tensor] = index
            return index
        index = self.add(self.nn_type(info), self.channel_params(info))
        self.operands[tensor] = index
        return index

    def temp(self, like: OperandType, dims: Sequence[int] | None = None) -> int:
        return self.add(like.with_dimensions(like.dimensions if dims is None else dims))

    def i32(self, value: int) -> int:
        return self.const_operand(np.int32(value), OperandType(T.INT32))

    def f32(self, value: float) -> int:
        return self.const_operand(np.float32(value), OperandType(T.FLOAT32))

    def f16(self, value: float) -> int:
        return self.const_operand(np.float16(value), OperandType(T.FLOAT16))

    def boolean(self, value: bool) -> int:
        return self.const_operand(np.bool_(value), OperandType(T.BOOL))

    def float_scalar(self, value: float, like: int) -> int:
        """A FLOAT16 scalar for a float16 tensor, FLOAT32 otherwise (NNAPI's rule)."""
        return self.f16(value) if self.type_of(like).type == T.TENSOR_FLOAT16 else self.f32(value)

    def vector(self, values: Sequence[int] | np.ndarray) -> int:
        array = np.asarray(values, np.int32).reshape(-1)
        if array.size == 0:
            raise UnsupportedOperator("an empty list of indices has no NNAPI operand")
        return self.const_operand(array, OperandType(T.TENSOR_INT32, [array.size]))

    def omitted(self, op_type: OperandType) -> int:
        index = self.add(op_type)
        self.model.set_operand_value(index, None)
        return index

    # --- operations --------------------------------------------------------------------
    def emit(self, code: OperationCode, inputs: Sequence[int], outputs: Sequence[int]) -> None:
        self.model.add_operation(code, list(inputs), list(outputs))
        if self.graph.propagate:
            self.model._complete_last_outputs()
        self.sources.append(self.current.source)
        self._emitted.append(code.name)

    def _take_propagated_shapes(self, op: _Operator) -> None:
        """The shapes ``op``'s outputs got from its inputs (emit) as their TFLite shapes,
        for the converters after it, where the signature left them open."""
        for tensor in op.outputs:
            info = self.graph.tensors[tensor]
            operand = self.operands.get(tensor, self.complex_parts.get(tensor, (None,))[0])
            if all(d >= 0 for d in info.shape):
                continue
            if operand is None:
                if tensor in self.consts:  # a converter's constant (SHAPE of a static shape)
                    dims = tuple(self.consts[tensor].data.shape)
                    if len(dims) == len(info.shape):
                        info.shape = dims
                continue
            dims = tuple(self.type_of(operand).dimensions)
            if len(dims) == len(info.shape) and 0 not in dims:
                info.shape = dims

    def lowered(self, reason: str) -> None:
        """Record that the current operator became the operations emitted for it."""
        self._lowering_reason = reason

    def with_activation(self, activation: int, build: Callable[[int, int], None], target: int | None = None
                        ) -> None:
        """Emit an operation with a fused activation into ``target`` (default: the
        operator's output): NNAPI fuses NONE / RELU / RELU1 / RELU6; a fused TANH
        becomes a separate TANH."""
        if activation in (0, 1, 2, 3):
            build(self.i32(activation), self.output() if target is None else target)
            return
        if activation == _ACT_TANH:
            info = self.current.out_tensor(0)
            if info.tfl_type not in (_FLOAT32, _FLOAT16):
                raise UnsupportedOperator("a fused TANH on a quantized output has no NNAPI equivalent")
            final = self.output() if target is None else target
            temp = self.temp(self.type_of(final))
            build(self.i32(0), temp)
            self.emit(Op.TANH, [temp], [final])
            self.lowered("fused TANH activation applied as a separate TANH")
            return
        raise UnsupportedOperator(f"fused activation {_ACT_NAMES.get(activation, activation)} has no NNAPI "
                                  "equivalent")

    def activation_after(self, activation: int, produced: int, position: int = 0) -> None:
        """Apply ``activation`` to ``produced`` into the operator's output (ops without a
        fuse code in NNAPI, such as CONCATENATION)."""
        code = _FUSE_AS_OP.get(activation)
        if code is None:
            raise UnsupportedOperator(f"fused activation {_ACT_NAMES.get(activation, activation)} has no NNAPI "
                                      "equivalent")
        self.emit(code, [produced], [self.output(position)])
        self.lowered(f"fused {_ACT_NAMES[activation]} applied as a separate {code.name}")

    def identity(self, source: int, target: int) -> None:
        """Copy ``source`` into ``target`` with an operation that computes nothing (NNAPI
        forbids an operand being a model input and output, or listed twice)."""
        op_type = self.type_of(source)
        if op_type.type == T.TENSOR_INT32:
            zero = self.const_operand(np.zeros(1, np.int32), OperandType(T.TENSOR_INT32, [1]))
            self.emit(Op.ADD, [source, zero, self.i32(0)], [target])
        elif op_type.type == T.TENSOR_BOOL8:
            self.emit(Op.LOGICAL_AND, [source, source], [target])
        else:
            shape = self.vector(op_type.dimensions) if op_type.is_fully_specified else self.vector([-1])
            self.emit(Op.RESHAPE, [source, shape], [target])

    # --- the subgraph ------------------------------------------------------------------
    def convert(self, input_names: bool = True) -> ImportedModel:
        graph = self.graph
        inputs = self.model_inputs
        for tensor in graph.inputs:
            info = graph.tensors[tensor]
            index = self.add(self.nn_type(info), self.channel_params(info))
            self.operands[tensor] = index
            inputs.append(index)
        if self.top_level:
            for info in graph.tensors:
                if info.is_variable and info.index not in self.operands:
                    index = self.add(self.nn_type(info))
                    self.operands[info.index] = index
                    self.states.append((info.index, len(inputs)))
                    inputs.append(index)
        for position, raw in enumerate(graph.operators):
            if position in self.absorbed:
                continue
            op = _Operator(graph, position, raw)
            self.current = op
            self._emitted = []
            self._lowering_reason = None
            if graph.propagate and op.custom is None and op.name in ("RESHAPE", "SQUEEZE", "EXPAND_DIMS"):
                _derive_moved_shape(self, op)
            try:
                convert = _CONVERTERS.get(op.builtin) if op.custom is None else _CUSTOM_CONVERTERS.get(op.custom)
                folded = op.custom is None and _fold_constants(self, op)
                if op.custom is not None and convert is None:
                    raise UnsupportedOperator(f"custom operator '{op.custom}' has no NNAPI equivalent")
                if convert is None and not folded:
                    raise UnsupportedOperator("this builtin operator has no NNAPI equivalent")
                moved_type = op.out_tensor().tfl_type if op.custom is None and op.outputs else None
                if folded or \
                        op.name == "CONCATENATION" and moved_type == _INT32 and _int32_concatenation(self, op):
                    pass
                elif op.name in _MOVES_DATA and moved_type in (_INT32, _BOOL) or \
                        op.name in _MOVES_BOOL and moved_type == _BOOL:
                    _through_float32(self, op, {**_MOVES_DATA, **_MOVES_BOOL}[op.name], convert)
                else:
                    convert(self, op)
            except UnsupportedOperator as error:
                raise BadDataError(f"tflite {op.source}: {error}") from None
            except NnapiError as error:
                raise BadDataError(f"tflite {op.source}: cannot express it in NNAPI ({error})") from None
            except Exception as error:  # a malformed flatbuffer surfaces as index / struct errors
                raise BadDataError(f"tflite {op.source}: malformed operator ({type(error).__name__}: "
                                   f"{error})") from None
            if graph.propagate:
                self._take_propagated_shapes(op)
            if self._lowering_reason is not None:
                self.lowerings.append(Lowering(op.source, tuple(self._emitted), self._lowering_reason))
        self.current = _Operator.__new__(_Operator)
        self.current.source = SourceOp(graph.subgraph, -1, "outputs")
        self.current.graph = graph
        self._emitted = []
        outputs: list[int] = []
        for tensor in graph.outputs:
            info = graph.tensors[tensor]
            index = self.operand(tensor) if tensor in self.operands or tensor in self.lifted or \
                self.const_of(tensor) is not None else None
            if index is None:
                raise BadDataError(f"tflite subgraph {graph.subgraph}: output tensor {tensor} ({info.name}) "
                                   "is never written")
            if index in inputs or index in outputs or tensor in self.consts or info.data is not None:
                copy = self.add(self.type_of(index))
                self.identity(index, copy)
                index = copy
            outputs.append(index)
        state_specs: list[StateSpec] = []
        for tensor, position in self.states:
            info = graph.tensors[tensor]
            out_index = None
            if tensor in self.state_outputs:
                out_index = len(outputs)
                outputs.append(self.state_outputs[tensor])
            # TFLite starts a variable tensor without a buffer at zero: its zero point when
            # quantized (the raw value of real 0), as LiteRT's ResetVariableTensors does.
            initial = info.data if info.data is not None else np.full(
                [max(d, 1) for d in info.shape], info.zero_point if info.scales is not None else 0,
                _NUMPY.get(info.tfl_type, np.float32))
            state_specs.append(StateSpec(info.name, position, out_index,
                                         np.asarray(initial).reshape(_operand_shape(info.shape))))
        state_specs += variable_states(self, inputs, outputs)
        self.model.identify_inputs_and_outputs(inputs, outputs)
        self.model.finish()
        visible_inputs = [graph.tensors[t] for t in graph.inputs]
        visible_outputs = [graph.tensors[t] for t in graph.outputs]
        return ImportedModel(
            model=self.model,
            inputs=[self.spec(info) for info in visible_inputs],
            outputs=[self.spec(info) for info in visible_outputs],
            lowerings=self.lowerings,
            sources=self.sources,
            states=state_specs,
            hybrid_operators=self.hybrid_operators,
            detections=[tuple(graph.tensors[t].name for t in group) for group in self.detections
                        if all(t in graph.outputs for t in group)],
            source_operator_count=len(graph.operators),
            operand_names={operand: graph.tensors[tensor].name for tensor, operand in self.operands.items()},
            _keep_alive=self.keep_alive,
        )

    def operators(self) -> list[_Operator]:
        """Every operator of this subgraph, in order (made once)."""
        if self._operators is None:
            self._operators = [_Operator(self.graph, i, raw) for i, raw in enumerate(self.graph.operators)]
        return self._operators

    def readers(self, tensor: int) -> list[tuple[_Operator, int]]:
        """The operators of this subgraph that read ``tensor``, with the input position."""
        if self._readers is None:
            self._readers = {}
            for reader in self.operators():
                for slot, index in enumerate(reader.inputs):
                    self._readers.setdefault(index, []).append((reader, slot))
        return self._readers.get(tensor, [])

    def float_values(self, tensor: int, const: _Const) -> np.ndarray:
        """The float32 values of ``tensor``'s constant ``const``: float16 and quantized
        (hybrid) weights dequantized as their DEQUANTIZE is folded."""
        if const.data.dtype == np.float32:
            return const.data
        return _dequantize_const(self.graph.tensors[tensor], const).data

    def spec(self, info: _TensorInfo) -> TensorSpec:
        if info.index in self.narrowed:
            return TensorSpec(info.name, T.TENSOR_INT32, info.shape, 0.0, 0, _operand_shape(info.shape),
                              source_dtype="int64")
        op_type = self.nn_type(info)
        return TensorSpec(info.name, op_type.type, info.shape, op_type.scale, op_type.zero_point,
                          op_type.dimensions)


class _Importer:
    def __init__(self, data: bytes, keep_loops: bool = False, static_shapes: bool = False,
                 propagate: bool = False, input_shapes: dict[str, tuple[int, ...]] | None = None) -> None:
        self.reader = _Reader(data)
        self.keep_loops = keep_loops
        self.static_shapes = static_shapes
        self.propagate = propagate
        self.input_shapes = input_shapes
        self.subgraph_models: dict[int, ImportedModel] = {}
        self.in_progress: set[int] = set()

    def subgraph(self, index: int) -> ImportedModel:
        """The finished Model of a referenced subgraph (IF / WHILE), converted once."""
        if not 0 < index < self.reader.subgraph_count:
            raise UnsupportedOperator(f"references subgraph {index}, which does not exist")
        if index in self.subgraph_models:
            return self.subgraph_models[index]
        if index in self.in_progress:
            raise UnsupportedOperator(f"subgraph {index} references itself")
        self.in_progress.add(index)
        converted = _Converter(self, index, top_level=False).convert()
        self.in_progress.discard(index)
        self.subgraph_models[index] = converted
        return converted


def load_tflite(source: str | os.PathLike | bytes, *, keep_loops: bool = False,
                static_shapes: bool | None = None,
                input_shapes: dict[str, Sequence[int]] | None = None) -> ImportedModel:
    """Import a TensorFlow Lite model (a path or the flatbuffer's bytes) as an ImportedModel.

    A WHILE loop that is Keras 3's LSTM layer becomes one UNIDIRECTIONAL_SEQUENCE_LSTM
    (tflite_while_lstm.py) unless ``keep_loops`` is true, which imports it as written.

    ``static_shapes``: a tensor's dimension that the file's shape signature leaves open
    (-1, a dynamic batch) stays an unknown NNAPI dimension, set per execution, when
    ``static_shapes`` is False; is the file's static shape (what LiteRT allocates without
    ``resize_tensor_input``, 1 for a dynamic batch) when True. None (the default): open
    dimensions stay open unless the model cannot be expressed so (an operator needing a
    static shape, such as SHAPE, which NNAPI lacks), then static as with True; the
    ImportedModel's ``fixed_shapes`` then says why.

    ``input_shapes``: {input name: shape} fixes those inputs' open dimensions (the file's
    static ones must match), as LiteRT's ``resize_tensor_input`` before it allocates: every
    shape after the inputs is then derived from them (a raw-audio model whose file declares
    one sample, a batch of 8). ``static_shapes`` does not apply then.

    Raises BadDataError naming the TFLite operator (index and name) and the reason when
    the model uses something NNAPI cannot express (a custom operator, an unsupported type).
    """
    _require_tflite()
    data, path = read_source(source)
    if len(data) < 8 or data[4:8] != b"TFL3":
        raise BadDataError(f"{path or 'the given bytes'}: not a TensorFlow Lite model (no TFL3 identifier)")
    try:
        if input_shapes:
            given = _input_shapes(input_shapes)
            importer = _Importer(data, keep_loops, static_shapes=True, propagate=True, input_shapes=given)
            converter = _Converter(importer, 0, top_level=True)
            names = [converter.graph.tensors[t].name for t in converter.graph.inputs]
            if set(given) - set(names):
                raise BadDataError(f"input_shapes names {sorted(set(given) - set(names))}, which the model's "
                                   f"inputs ({', '.join(names)}) are not")
            imported = converter.convert()
            fixed_reason = "input shapes given (" + ", ".join(f"{name} {list(shape)}" for name, shape in
                                                               given.items()) + "); the shapes after them derived"
        elif static_shapes:
            imported, importer, derived = _import_static(data, keep_loops)
            fixed_reason = f"static shapes asked for{derived}" if _has_open_dimensions(importer.reader) else None
        else:
            try:
                importer = _Importer(data, keep_loops)
                imported = _Converter(importer, 0, top_level=True).convert()
                fixed_reason = None
            except (UnsupportedOperator, BadDataError) as error:
                if static_shapes is not None or not _has_open_dimensions(importer.reader):
                    raise
                # LiteRT itself runs such a model at its static shape until it is resized
                try:
                    imported, importer, derived = _import_static(data, keep_loops)
                except (UnsupportedOperator, BadDataError) as static_error:
                    raise BadDataError(f"{_message(error)}; nor at the file's static shapes (which it declares for "
                                       f"its open dimensions): {_message(static_error)}") from None
                fixed_reason = f"with its open dimensions the model cannot be expressed ({error}){derived}"
    except NnapiError:
        raise
    except UnsupportedOperator as error:
        raise BadDataError(f"tflite: {error}") from None
    except Exception as error:  # a malformed flatbuffer surfaces as index / struct errors
        raise BadDataError(f"{path or 'the given bytes'}: not a valid TensorFlow Lite model "
                           f"({type(error).__name__}: {error})") from None
    imported.path = path
    imported.fixed_shapes = fixed_reason
    imported.submodels = [importer.subgraph_models[i] for i in sorted(importer.subgraph_models)]
    imported._keep_alive.append(data)
    for sub in imported.submodels:
        imported._keep_alive.extend(sub._keep_alive)
    return imported


def _import_static(data: bytes, keep_loops: bool) -> tuple[ImportedModel, _Importer, str]:
    """The model at the file's static shapes, with the importer and what else was done
    (empty, or why the shapes were derived). Where an operation computes another shape
    than the file declares (placeholders the converter wrote for open dimensions, as
    BirdNET's analyzer has: [1, 1] for a slice of [1, 144000]), at the inputs' static shapes
    with every open dimension after them derived from the operation writing it, as LiteRT
    does when it allocates tensors."""
    importer = _Importer(data, keep_loops, static_shapes=True)
    try:
        return _Converter(importer, 0, top_level=True).convert(), importer, ""
    except (UnsupportedOperator, BadDataError) as error:
        if not _has_open_dimensions(importer.reader):
            raise
        derived = _Importer(data, keep_loops, static_shapes=True, propagate=True)
        try:
            imported = _Converter(derived, 0, top_level=True).convert()
        except (UnsupportedOperator, BadDataError) as derived_error:
            if _message(derived_error) == _message(error):
                raise error from None
            raise BadDataError(f"{_message(error)}; nor with its other shapes derived from its inputs' static "
                               f"shapes: {_message(derived_error)}") from None
        return imported, derived, (f"; the shapes after its inputs derived from them (the file's static shapes "
                                   f"disagree with its operations: {_message(error)})")


def _input_shapes(given: Any) -> dict[str, tuple[int, ...]]:
    """load_tflite's ``input_shapes`` checked: names to tuples of positive ints."""
    if not isinstance(given, dict):
        raise BadDataError(f"input_shapes must be a dict of input name to shape, got {type(given).__name__}")
    shapes = {}
    for name, shape in given.items():
        try:
            dims = tuple(int(d) for d in shape)
            bad = any(isinstance(d, bool) or int(d) != d for d in shape) or any(d < 1 for d in dims)
        except (TypeError, ValueError):
            bad = True
        if not isinstance(name, str) or bad:
            raise BadDataError(f"input_shapes: {name!r}: {shape!r} is not a shape of positive ints")
        shapes[name] = dims
    return shapes


def _given_shape(name: str, static: tuple[int, ...], raw: Any, given: tuple[int, ...]) -> tuple[int, ...]:
    """An input's shape as given: its rank and the dimensions its signature fixes must match."""
    signature = tuple(int(d) for d in raw.ShapeSignatureAsNumpy()) if raw.ShapeSignatureLength() else static
    if len(given) != len(signature) or any(0 <= s != g for s, g in zip(signature, given)):
        raise UnsupportedOperator(f"input {name!r} is {list(signature)} (-1 open); input_shapes gives "
                                  f"{list(given)}")
    return given


def _message(error: Exception) -> str:
    """An import failure's text as load_tflite reports it."""
    return str(error) if isinstance(error, BadDataError) else f"tflite: {error}"


def _has_open_dimensions(reader: _Reader) -> bool:
    """Whether any tensor's shape signature leaves a dimension open (-1)."""
    for index in range(reader.subgraph_count):
        subgraph = reader.model.Subgraphs(index)
        for t in range(subgraph.TensorsLength()):
            raw = subgraph.Tensors(t)
            if raw.ShapeSignatureLength() and (raw.ShapeSignatureAsNumpy() < 0).any():
                return True
    return False


# === operator converters ================================================================
_CONVERTERS: dict[int, Callable[[_Converter, _Operator], None]] = {}
#: custom operators (by custom code) whose meaning one NNAPI operation has
_CUSTOM_CONVERTERS: dict[str, Callable[[_Converter, _Operator], None]] = {}


def _fold_constants(c: _Converter, op: _Operator) -> bool:
    """Folds ``op`` into constants of its outputs when every input is a constant
    (tflite_fold.py); whether it did. A value of another shape than the file declares
    refuses the model."""
    folded = folded_values(c, op)
    if folded is None:
        return False
    for tensor, (value, code) in zip(op.outputs, folded):
        declared = c.graph.tensors[tensor].shape
        if c.graph.propagate and any(d < 0 for d in declared) and len(value.shape) == len(declared) and \
                all(d < 0 or d == v for d, v in zip(declared, value.shape)):
            c.graph.tensors[tensor].shape = declared = value.shape
        if all(d >= 0 for d in declared):
            # NNAPI holds a scalar as one element: () and (1,) are the same operand
            if (value.shape or (1,)) != (tuple(declared) or (1,)):
                raise UnsupportedOperator(f"folding its constant inputs gives shape {list(value.shape)}, the "
                                          f"file declares {list(declared)}")
            value = value.reshape(declared)
        c.consts[tensor] = _Const(value, code)
    c.lowered(f"{op.name} of constants folded at import")
    return True


def _converter(*names: str):
    codes = {name: code for code, name in _OPCODE_NAMES.items()}

    def wrap(function):
        for name in names:
            _CONVERTERS[codes[name]] = function
        return function

    return wrap


def _bias_for(c: _Converter, op: _Operator, position: int, input_operand: int, filter_operand: int,
              channels: int) -> int:
    """The bias operand, or a zero bias when the operator has none (NNAPI requires one)."""
    if op.has_input(position):
        bias = c.input(position)
        if c.type_of(bias).type == T.TENSOR_FLOAT16 and c.type_of(input_operand).type == T.TENSOR_FLOAT32:
            raise UnsupportedOperator("float16 bias on a float32 operator")
        return bias
    in_type, filter_type = c.type_of(input_operand), c.type_of(filter_operand)
    if in_type.type in _FLOAT_TYPES:
        return c.const_operand(np.zeros(channels, in_type.dtype), OperandType(in_type.type, [channels]))
    scale = 0.0 if filter_type.type == T.TENSOR_QUANT8_SYMM_PER_CHANNEL else in_type.scale * filter_type.scale
    return c.const_operand(np.zeros(channels, np.int32), OperandType(T.TENSOR_INT32, [channels], scale))


def _weights(c: _Converter, op: _Operator, position: int) -> int:
    """A weight operand; int8 / uint8 weights of a float operator (TFLite's hybrid,
    dynamic-range quantization) are dequantized into float32 constants once."""
    tensor = op.inputs[position]
    # (TRANSPOSE_CONV's data is its input 2; its input 0 is the output shape)
    in_type = c.type_of(c.input(2) if op.name == "TRANSPOSE_CONV" else _data_input(c, op))
    const = c.const_of(tensor)
    if in_type.type == T.TENSOR_FLOAT32 and tensor not in c.operands and const is not None \
            and const.code != T.TENSOR_FLOAT32:
        if const.code == T.TENSOR_FLOAT16:
            c.consts[tensor] = _Const(const.data.astype(np.float32), T.TENSOR_FLOAT32)
        else:
            c.consts[tensor] = _dequantize_const(op.tensor(position), const)
            c.lowered("hybrid (dynamic-range) quantized weights dequantized to float32 constants")
            if op.source not in c.hybrid_operators:
                c.hybrid_operators.append(op.source)
    return c.operand(tensor)


def _dequantize_const(info: _TensorInfo, const: _Const) -> _Const:
    data = const.data
    if data.dtype == np.float16:
        return _Const(data.astype(np.float32), T.TENSOR_FLOAT32)
    if info.scales is None:
        raise UnsupportedOperator(f"tensor {info.index} ({info.name}) has no quantization to dequantize")
    scales, zero_points = info.scales, info.zero_points
    if len(scales) > 1:  # per channel: broadcast along the quantized dimension
        shape = [1] * data.ndim
        shape[info.quantized_dimension] = len(scales)
        scales = scales.reshape(shape)
        zero_points = zero_points.reshape(shape)
    return _Const(dequantize(data, scales, zero_points).astype(np.float32), T.TENSOR_FLOAT32)


@_converter("CONV_2D")
def _conv_2d(c: _Converter, op: _Operator) -> None:
    options = op.options("Conv2DOptions")
    x = _data_input(c, op)
    w = _weights(c, op, 1)
    w_type = c.type_of(w)
    channels, in_per_group = w_type.dimensions[0], w_type.dimensions[3]
    bias = _bias_for(c, op, 2, x, w, channels)
    in_channels = c.type_of(x).dimensions[3] if c.type_of(x).rank == 4 else 0
    padding = _PADDING[options.Padding()]
    strides = [c.i32(options.StrideW()), c.i32(options.StrideH())]
    dilation = [c.i32(options.DilationWFactor() or 1), c.i32(options.DilationHFactor() or 1)]
    if in_channels and in_per_group and in_channels != in_per_group:
        groups = in_channels // in_per_group
        if options.DilationWFactor() > 1 or options.DilationHFactor() > 1:
            raise UnsupportedOperator("a grouped convolution with dilation has no NNAPI equivalent")
        folded = _folded_padding(c, op)
        pads = folded or [c.i32(padding)]
        c.with_activation(options.FusedActivationFunction(), lambda act, out: c.emit(
            Op.GROUPED_CONV_2D, [x, w, bias, *pads, *strides, c.i32(groups), act, c.boolean(False)],
            [out]))
        c.lowered(f"{groups}-group convolution (filter depth {in_per_group} of {in_channels} input channels) "
                  "as GROUPED_CONV_2D" + (", reading a PAD folded into its explicit padding" if folded else ""))
        return
    pads = _folded_padding(c, op)
    if pads is not None:
        c.with_activation(options.FusedActivationFunction(), lambda act, out: c.emit(
            Op.CONV_2D, [x, w, bias, *pads, *strides, act, c.boolean(False), *dilation], [out]))
        return
    c.with_activation(options.FusedActivationFunction(), lambda act, out: c.emit(
        Op.CONV_2D, [x, w, bias, c.i32(padding), *strides, act, c.boolean(False), *dilation], [out]))


@_converter("DEPTHWISE_CONV_2D")
def _depthwise(c: _Converter, op: _Operator) -> None:
    options = op.options("DepthwiseConv2DOptions")
    x = _data_input(c, op)
    w = _weights(c, op, 1)
    channels = c.type_of(w).dimensions[3]
    bias = _bias_for(c, op, 2, x, w, channels)
    x_type = c.type_of(x)
    multiplier = options.DepthMultiplier()
    if x_type.rank == 4 and x_type.dimensions[3]:
        multiplier = channels // x_type.dimensions[3]  # the option is unreliable in newer models
    padding = _folded_padding(c, op) or [c.i32(_PADDING[options.Padding()])]
    c.with_activation(options.FusedActivationFunction(), lambda act, out: c.emit(
        Op.DEPTHWISE_CONV_2D,
        [x, w, bias, *padding, c.i32(options.StrideW()), c.i32(options.StrideH()),
         c.i32(multiplier), act, c.boolean(False), c.i32(options.DilationWFactor() or 1),
         c.i32(options.DilationHFactor() or 1)], [out]))


@_converter("TRANSPOSE_CONV")
def _transpose_conv(c: _Converter, op: _Operator) -> None:
    options = op.options("TransposeConvOptions")
    x = c.input(2)
    w = _weights(c, op, 1)
    channels = c.type_of(w).dimensions[0]
    bias = _bias_for(c, op, 3, x, w, channels)
    shape = c.input(0)
    activation = options.FusedActivationFunction() if hasattr(options, "FusedActivationFunction") else 0
    c.with_activation(activation, lambda act, out: c.emit(
        Op.TRANSPOSE_CONV_2D, [x, w, bias, shape, c.i32(_PADDING[options.Padding()]), c.i32(options.StrideW()),
                               c.i32(options.StrideH()), act, c.boolean(False)], [out]))


def _transpose_conv_bias(c: _Converter, op: _Operator) -> None:
    """MediaPipe's custom ``Convolution2DTransposeBias`` (selfie segmentation's upsampling
    head): TRANSPOSE_CONV with a bias input, which NNAPI's TRANSPOSE_CONV_2D has. Its
    custom options are the raw C struct TfLiteTransposeConvParams, read as MediaPipe and
    LiteRT's XNNPACK delegate read them: int32 padding (TfLitePadding: 1 SAME, 2 VALID,
    NNAPI's PaddingCode numbers), stride_width, stride_height. Inputs: input, weights
    (OHWI), bias; the output shape is the output tensor's."""
    raw = op.raw.CustomOptionsAsNumpy().tobytes() if op.raw.CustomOptionsLength() else b""
    if len(raw) < 12:
        raise UnsupportedOperator(f"custom options of {len(raw)} bytes; TfLiteTransposeConvParams needs 12")
    padding, stride_w, stride_h = (int(v) for v in np.frombuffer(raw[:12], "<i4"))
    if padding not in (1, 2):
        raise UnsupportedOperator(f"padding {padding} is neither SAME (1) nor VALID (2)")
    if len(op.inputs) != 3 or len(op.outputs) != 1:
        raise UnsupportedOperator(f"takes input, weights and bias and gives one output; got {len(op.inputs)} "
                                  f"inputs and {len(op.outputs)} outputs")
    shape = op.out_tensor(0).shape
    if len(shape) != 4 or min(shape) <= 0:
        raise UnsupportedOperator(f"needs a known 4-D output shape, got {list(shape)}")
    x = c.input(0)
    w = _weights(c, op, 1)
    channels = c.type_of(w).dimensions[0]
    bias = _bias_for(c, op, 2, x, w, channels)
    c.emit(Op.TRANSPOSE_CONV_2D, [x, w, bias, c.vector(shape), c.i32(padding), c.i32(stride_w), c.i32(stride_h),
                                  c.i32(0), c.boolean(False)], [c.output()])
    c.lowered("MediaPipe's custom Convolution2DTransposeBias as TRANSPOSE_CONV_2D (which takes a bias)")


_CUSTOM_CONVERTERS["Convolution2DTransposeBias"] = _transpose_conv_bias


def _float_input(c: _Converter, op: _Operator, position: int) -> int:
    """Input ``position`` as float32: a quantized constant dequantized once here, a
    quantized run-time tensor through DEQUANTIZE (exact: what TFLite's kernel reads)."""
    tensor = op.inputs[position]
    const = c.const_of(tensor) if tensor not in c.operands else None
    if const is not None and const.code != T.TENSOR_FLOAT32:
        c.consts[tensor] = _dequantize_const(op.tensor(position), const)
    x = c.operand(tensor)
    x_type = c.type_of(x)
    if x_type.type == T.TENSOR_FLOAT32:
        return x
    if x_type.type not in _QUANT8:
        raise UnsupportedOperator(f"input {position} is {x_type.type.name}; float32 or 8-bit quantized expected")
    real = c.temp(OperandType(T.TENSOR_FLOAT32, x_type.dimensions))
    c.emit(Op.DEQUANTIZE, [x], [real])
    return real


def _detection_postprocess(c: _Converter, op: _Operator) -> None:
    """TFLite's custom ``TFLite_Detection_PostProcess`` (the SSD models' anchor decoding
    and NMS) as DETECTION_POSTPROCESSING, which was made for it (TFLite's NNAPI delegate
    maps it the same way). Options are a FlexBuffer map. TFLite reads box encodings,
    class predictions, anchors (8-bit quantized ones dequantized) and writes boxes,
    classes, scores and the count, all float32; NNAPI takes scores first, writes scores,
    boxes, int32 classes and an int32 count: the classes and count go through CAST. Class
    predictions carry the background as column 0 when they have one column more than
    num_classes (is_bg_in_label false: the labels come out from 0 for the first real
    class); with exactly num_classes columns a zero background column is padded in front."""
    from flatbuffers import flexbuffers

    raw = op.raw.CustomOptionsAsNumpy().tobytes() if op.raw.CustomOptionsLength() else b""
    try:
        options = flexbuffers.Loads(raw)
    except Exception as error:  # a malformed FlexBuffer surfaces as struct / index errors
        raise UnsupportedOperator(f"custom options are not a FlexBuffer map ({type(error).__name__})") from None
    if not isinstance(options, dict):
        raise UnsupportedOperator("custom options are not a FlexBuffer map")

    def option(name: str, kind: type, default=None):
        value = options.get(name, default)
        if value is None:
            raise UnsupportedOperator(f"custom option '{name}' is missing")
        return kind(value)

    max_detections = option("max_detections", int)
    per_detection = option("max_classes_per_detection", int)
    per_class = option("detections_per_class", int, 100)
    regular = option("use_regular_nms", bool, False)
    num_classes = option("num_classes", int)
    scales = [option(name, float) for name in ("y_scale", "x_scale", "h_scale", "w_scale")]
    score_threshold = option("nms_score_threshold", float)
    iou_threshold = option("nms_iou_threshold", float)
    if len(op.inputs) != 3 or len(op.outputs) != 4:
        raise UnsupportedOperator(f"takes 3 inputs and gives 4 outputs; got {len(op.inputs)} and {len(op.outputs)}")
    if min(max_detections, per_detection, per_class, num_classes) <= 0:
        raise UnsupportedOperator("max_detections, max_classes_per_detection, detections_per_class and "
                                  "num_classes must be positive")
    boxes_in, predictions, anchors = (_float_input(c, op, i) for i in range(3))
    pred_type = c.type_of(predictions)
    if pred_type.rank != 3 or pred_type.dimensions[2] not in (num_classes, num_classes + 1):
        raise UnsupportedOperator(f"class predictions {list(pred_type.dimensions)} need num_classes "
                                  f"({num_classes}) or one more columns")
    if pred_type.dimensions[2] == num_classes:  # no background column: NNAPI's class 0 is one
        padded = c.temp(pred_type, [pred_type.dimensions[0], pred_type.dimensions[1], num_classes + 1])
        c.emit(Op.PAD, [predictions, c.const_operand(np.array([[0, 0], [0, 0], [1, 0]], np.int32),
                                                     OperandType(T.TENSOR_INT32, [3, 2]))], [padded])
        predictions = padded
    batches = pred_type.dimensions[0]
    slots = max_detections * per_detection  # TFLite's output size in both modes
    if regular and per_detection != 1:
        raise UnsupportedOperator("regular NMS with max_classes_per_detection > 1: TFLite's outputs hold "
                                  "max_detections * max_classes_per_detection slots, NNAPI's max_detections")
    if per_detection > num_classes:
        raise UnsupportedOperator(f"max_classes_per_detection {per_detection} above num_classes {num_classes}: "
                                  "TFLite pads each box's classes with dummies, NNAPI packs them")
    shapes = ([batches, slots, 4], [batches, slots], [batches, slots], [batches])
    for position, shape in enumerate(shapes):
        info = op.out_tensor(position)
        if info.tfl_type != _FLOAT32:
            raise UnsupportedOperator(f"output {position} is {info.type_name}; TFLite's kernel writes float32")
        info.shape = tuple(shape)  # TFLite sizes these at Prepare; the file may leave them empty
    classes = c.temp(OperandType(T.TENSOR_INT32, shapes[1]))
    count = c.temp(OperandType(T.TENSOR_INT32, shapes[3]))
    boxes_out, scores_out = c.output(0), c.output(2)
    c.emit(Op.DETECTION_POSTPROCESSING,
           [predictions, boxes_in, anchors, *(c.f32(v) for v in scales), c.boolean(regular), c.i32(max_detections),
            c.i32(per_detection), c.i32(per_class), c.f32(score_threshold), c.f32(iou_threshold),
            c.boolean(False)], [scores_out, boxes_out, classes, count])
    c.emit(Op.CAST, [classes], [c.output(1)])
    c.detections.append(tuple(op.outputs[:4]))
    reason = "TFLite_Detection_PostProcess as DETECTION_POSTPROCESSING, its int32 classes and count CAST to " \
             "TFLite's float32"
    if regular or per_detection == 1:
        c.emit(Op.CAST, [count], [c.output(3)])
    else:  # NNAPI counts the (box, class) slots filled, TFLite the boxes: an exact division
        slots_filled = c.temp(OperandType(T.TENSOR_FLOAT32, shapes[3]))
        c.emit(Op.CAST, [count], [slots_filled])
        per_box = c.const_operand(np.array([per_detection], np.float32), OperandType(T.TENSOR_FLOAT32, [1]))
        c.emit(Op.DIV, [slots_filled, per_box, c.i32(0)], [c.output(3)])
        reason += f"; the count of (box, class) slots divided by {per_detection} (TFLite counts boxes)"
    if pred_type.dimensions[2] == num_classes:
        reason += "; class predictions without a background column: one padded in front"
    c.lowered(reason)


_CUSTOM_CONVERTERS["TFLite_Detection_PostProcess"] = _detection_postprocess


@_converter("FULLY_CONNECTED")
def _fully_connected(c: _Converter, op: _Operator, target: int | None = None) -> None:
    """FULLY_CONNECTED of the operator's input into its output, or into ``target``
    (_rows_fully_connected: the rows of a rank-6 tensor, as [rows, units])."""
    options = op.options("FullyConnectedOptions")
    if options.WeightsFormat() != 0:
        raise UnsupportedOperator("shuffled FULLY_CONNECTED weights have no NNAPI equivalent")
    x = c.input(0)
    w = _weights(c, op, 1)
    w_type = c.type_of(w)
    units, depth = w_type.dimensions
    bias = _bias_for(c, op, 2, x, w, units)
    out_info = op.out_tensor()
    out_type = c.nn_type(out_info) if target is None else c.type_of(target)
    activation = options.FusedActivationFunction()
    x_type = c.type_of(x)
    total = int(np.prod(x_type.dimensions)) if x_type.is_fully_specified else 0
    batch = total // depth if total and depth else 0
    needs_reshape = out_type.rank != 2
    # A batch known only at run time (shape signature -1): the RESHAPEs take -1 there,
    # which needs exactly one unknown output dimension.
    out_shape = [-1 if d == 0 else d for d in out_type.dimensions]
    if not batch and out_shape.count(-1) == 1 and depth:
        batch = -1
    if w_type.type == T.TENSOR_QUANT8_SYMM_PER_CHANNEL:
        # NNAPI FULLY_CONNECTED takes per-tensor weights only; a 1x1 CONV_2D over a
        # [1, batch, 1, depth] view computes the same sums with per-channel scales. The
        # rows run down the height, not as a batch of 1x1 images: ONNX Runtime's
        # QLinearConv works image by image, 197 matrix-vector products for a ViT's tokens
        # (tinyvit int8 through ai-edge-torch: 18 such layers 9.3 ms, LiteRT's whole model
        # 2.4 ms), where one image of 197 rows is one matrix product.
        if not batch:
            raise UnsupportedOperator("per-channel FULLY_CONNECTED needs a known input shape "
                                      "(or one unknown output dimension)")
        const = c.const_of(op.inputs[1])
        params = c.channel_params(op.tensor(1))
        filter4 = c.const_operand(const.data.reshape(units, 1, 1, depth),
                                  OperandType(T.TENSOR_QUANT8_SYMM_PER_CHANNEL, [units, 1, 1, depth]),
                                  SymmPerChannelQuantParams(0, params.scales))
        x4 = c.temp(x_type, [1, max(batch, 0), 1, depth])
        c.emit(Op.RESHAPE, [x, c.vector([1, batch, 1, depth])], [x4])
        y4 = c.temp(out_type, [1, max(batch, 0), 1, units])
        c.with_activation(activation, lambda act, out: c.emit(
            Op.CONV_2D, [x4, filter4, bias, c.i32(2), c.i32(1), c.i32(1), act, c.boolean(False)], [out]), y4)
        c.emit(Op.RESHAPE, [y4, c.vector(out_shape)], [c.output() if target is None else target])
        c.lowered("per-channel quantized weights: NNAPI FULLY_CONNECTED is per-tensor only, so "
                  "RESHAPE + 1x1 CONV_2D (per-channel) + RESHAPE")
        return
    if needs_reshape:
        if not batch:
            raise UnsupportedOperator("FULLY_CONNECTED keeping its input rank needs a known input shape "
                                      "(or one unknown output dimension)")
        flat = c.temp(out_type, [max(batch, 0), units])
        c.with_activation(activation, lambda act, out: c.emit(Op.FULLY_CONNECTED, [x, w, bias, act], [out]), flat)
        c.emit(Op.RESHAPE, [flat, c.vector(out_shape)], [c.output() if target is None else target])
        c.lowered("keep_num_dims: NNAPI FULLY_CONNECTED outputs 2-D, so FULLY_CONNECTED + RESHAPE")
        return
    c.with_activation(activation, lambda act, out: c.emit(Op.FULLY_CONNECTED, [x, w, bias, act], [out]), target)


def _pool(code: OperationCode):
    def convert(c: _Converter, op: _Operator) -> None:
        options = op.options("Pool2DOptions")
        x = c.input(0)
        c.with_activation(options.FusedActivationFunction(), lambda act, out: c.emit(
            code, [x, c.i32(_PADDING[options.Padding()]), c.i32(options.StrideW()), c.i32(options.StrideH()),
                   c.i32(options.FilterWidth()), c.i32(options.FilterHeight()), act, c.boolean(False)], [out]))
    return convert


_converter("AVERAGE_POOL_2D")(_pool(Op.AVERAGE_POOL_2D))
_converter("MAX_POOL_2D")(_pool(Op.MAX_POOL_2D))
_converter("L2_POOL_2D")(_pool(Op.L2_POOL_2D))


_ARITHMETIC = {"ADD": (Op.ADD, "AddOptions"), "SUB": (Op.SUB, "SubOptions"), "MUL": (Op.MUL, "MulOptions"),
               "DIV": (Op.DIV, "DivOptions")}


def _arithmetic(c: _Converter, op: _Operator) -> None:
    code, options_name = _ARITHMETIC[op.name]
    options = op.options(options_name)
    activation = options.FusedActivationFunction() if options is not None else 0
    if code == Op.DIV and c.nn_type(op.out_tensor()).type in _QUANT8 and activation in (0, 1, 2, 3):
        # NNAPI's DIV takes no quantized tensors; TFLite's rounds the quotient once.
        _in_float32(c, op, lambda inputs, out: c.with_activation(
            activation, lambda act, target: c.emit(Op.DIV, [*inputs, act], [target]), out))
        c.lowered("quantized DIV as DEQUANTIZE, DIV in float32, QUANTIZE (one rounding, as TFLite)")
        return
    if len(op.out_tensor().shape) > _MAX_RANK and _lifted_arithmetic(c, op, code, activation):
        return
    a, b = c.input(0), c.input(1)
    if code == Op.MUL and c.nn_type(op.out_tensor()).type in _QUANT8 and activation == 0:
        a_type, b_type, out_type = c.type_of(a), c.type_of(b), c.nn_type(op.out_tensor())
        if not np.float32(out_type.scale) > np.float32(a_type.scale) * np.float32(b_type.scale):
            # NNAPI's quantized MUL needs output_scale > input1_scale * input2_scale; TFLite's
            # (a multiplier >= 1: yolov5's box decoding) takes any, with one rounding
            if not _float_mul_matches_tflite(a_type, b_type, out_type):
                raise UnsupportedOperator(
                    f"quantized MUL whose output scale {out_type.scale} does not exceed the product of the "
                    f"input scales ({a_type.scale} * {b_type.scale}), which NNAPI's MUL requires, and whose "
                    "float32 form (DEQUANTIZE, MUL, QUANTIZE) differs from TFLite's integer MUL")
            _in_float32(c, op, lambda inputs, out: c.emit(Op.MUL, [*inputs, c.i32(0)], [out]))
            c.lowered("quantized MUL whose output scale does not exceed the product of the input scales "
                      "(NNAPI's MUL requires it) as DEQUANTIZE, MUL in float32, QUANTIZE: equal to TFLite's "
                      "integer MUL on every pair of stored values (checked at import)")
            return
    c.with_activation(activation, lambda act, out: c.emit(code, [a, b, act], [out]))


def _float_mul_matches_tflite(a: OperandType, b: OperandType, out: OperandType) -> bool:
    """Whether DEQUANTIZE, MUL, QUANTIZE in float32 (NNAPI's arithmetic: (q - zero point) *
    scale, the product, round(p / scale) halves away from zero, saturated) give TFLite's
    integer MUL without activation on all 65,536 pairs of 8-bit stored values: zero point +
    MultiplyByQuantizedMultiplier((qa - za) * (qb - zb)) of the multiplier
    scale_a * scale_b / scale_out, which TFLite computes in float32 (mul.cc); also in float64,
    in case a build does, so that neither rounding of the multiplier is assumed."""
    if not np.dtype(a.dtype) == np.dtype(b.dtype) == np.dtype(out.dtype):
        return False
    info = np.iinfo(a.dtype)
    qa = np.arange(info.min, info.max + 1, dtype=np.int64)[:, None]
    qb = np.arange(info.min, info.max + 1, dtype=np.int64)[None, :]
    product = (qa - a.zero_point) * (qb - b.zero_point)
    real = dequantize(qa, a.scale, a.zero_point, np.float32) * dequantize(qb, b.scale, b.zero_point, np.float32)
    got = np.clip(quantize(real, out.scale, out.zero_point, np.float32), info.min, info.max)
    multipliers = (float(np.float32(np.float32(a.scale) * np.float32(b.scale)) / np.float32(out.scale)),
                   float(a.scale) * float(b.scale) / float(out.scale))
    for real_multiplier in multipliers:
        multiplier, shift = quantize_multiplier(real_multiplier)
        want = np.clip(multiply_by_quantized_multiplier(product, multiplier, shift) + out.zero_point,
                       info.min, info.max)
        if not np.array_equal(got, want):
            return False
    return True


for _name in _ARITHMETIC:
    _converter(_name)(_arithmetic)

@_converter("FLOOR_DIV", "FLOOR_MOD")
def _floor_div_mod(c: _Converter, op: _Operator) -> None:
    """int32: NNAPI's int32 DIV is floor division (FLOOR_DIV), FLOOR_MOD = a - (a div b) * b;
    float FLOOR_DIV = FLOOR(a / b), as TFLite computes it. Float FLOOR_MOD refuses (TFLite's
    is fmod-exact; a - floor(a / b) * b rounds)."""
    a, b = c.input(0), c.input(1)
    out = c.output()
    out_type = c.type_of(out)
    if out_type.type == T.TENSOR_INT32:
        if op.name == "FLOOR_DIV":
            c.emit(Op.DIV, [a, b, c.i32(0)], [out])
            c.lowered("int32 FLOOR_DIV as DIV (NNAPI's int32 DIV is floor division)")
            return
        quotient, product = c.temp(out_type), c.temp(out_type)
        c.emit(Op.DIV, [a, b, c.i32(0)], [quotient])
        c.emit(Op.MUL, [quotient, b, c.i32(0)], [product])
        c.emit(Op.SUB, [a, product, c.i32(0)], [out])
        c.lowered("int32 FLOOR_MOD as a - (a DIV b) * b (NNAPI's int32 DIV is floor division)")
        return
    if out_type.type in _FLOAT_TYPES and op.name == "FLOOR_DIV":
        ratio = c.temp(out_type)
        c.emit(Op.DIV, [a, b, c.i32(0)], [ratio])
        c.emit(Op.FLOOR, [ratio], [out])
        c.lowered("float FLOOR_DIV as DIV + FLOOR")
        return
    raise UnsupportedOperator(f"{op.name} of {out_type.type.name} has no exact NNAPI sequence")


_SIMPLE = {
    "ABS": Op.ABS, "EXP": Op.EXP, "FLOOR": Op.FLOOR, "LOG": Op.LOG, "NEG": Op.NEG, "RSQRT": Op.RSQRT,
    "SIN": Op.SIN, "SQRT": Op.SQRT, "LOGISTIC": Op.LOGISTIC, "TANH": Op.TANH, "RELU": Op.RELU,
    "RELU6": Op.RELU6, "RELU_N1_TO_1": Op.RELU1, "HARD_SWISH": Op.HARD_SWISH, "LOGICAL_NOT": Op.LOGICAL_NOT,
    "L2_NORMALIZATION": Op.L2_NORMALIZATION,
    "MAXIMUM": Op.MAXIMUM, "MINIMUM": Op.MINIMUM, "POW": Op.POW, "PRELU": Op.PRELU,
    "LESS": Op.LESS, "LESS_EQUAL": Op.LESS_EQUAL, "GREATER": Op.GREATER, "GREATER_EQUAL": Op.GREATER_EQUAL,
    "EQUAL": Op.EQUAL, "NOT_EQUAL": Op.NOT_EQUAL, "LOGICAL_AND": Op.LOGICAL_AND, "LOGICAL_OR": Op.LOGICAL_OR,
    "SELECT": Op.SELECT, "SELECT_V2": Op.SELECT, "BATCH_MATMUL": None,
}


def _simple(c: _Converter, op: _Operator) -> None:
    code = _SIMPLE[op.name]
    if op.name == "L2_NORMALIZATION":
        options = op.options("L2NormOptions")
        if options is not None and options.FusedActivationFunction():
            raise UnsupportedOperator("L2_NORMALIZATION with a fused activation")
    if op.name in ("SELECT", "SELECT_V2"):
        dims = c.nn_type(op.out_tensor()).dimensions
        if {c.type_of(c.input(i)).dimensions for i in range(3)} != {dims}:
            if not all(d > 0 for d in dims):
                raise UnsupportedOperator("NNAPI SELECT needs three tensors of one shape (no broadcasting); "
                                          "the output's shape is not static")
            c.emit(Op.SELECT, [_broadcast_to(c, op, i, dims) for i in range(3)], [c.output()])
            c.lowered(f"SELECT_V2 broadcasting: inputs broadcast to {list(dims)} first (NNAPI's SELECT does not)")
            return
    if code in _RELU_FUSE and c.type_of(c.input(0)).type in _QUANT8:
        x, out_type = c.input(0), c.nn_type(op.out_tensor())
        x_type = c.type_of(x)
        if (x_type.scale, x_type.zero_point) != (out_type.scale, out_type.zero_point):
            # NNAPI's quantized RELU keeps the input's scale; TFLite's may requantize.
            # x + 0 requantized into the output with the activation fused is that.
            zero = c.const_operand(np.array([x_type.zero_point], x_type.dtype), x_type.with_dimensions([1]))
            c.emit(Op.ADD, [x, zero, c.i32(_RELU_FUSE[code])], [c.output()])
            c.lowered(f"requantizing {op.name} as ADD of 0 with the activation fused (NNAPI's {code.name} "
                      "keeps the input's scale)")
            return
    if code in _FLOAT_ONLY and c.type_of(c.input(0)).type in _QUANT8:
        _in_float32(c, op, lambda inputs, out: c.emit(code, inputs, [out]))
        c.lowered(f"quantized {op.name} (NNAPI's {code.name} is float only) as DEQUANTIZE, {code.name}, QUANTIZE")
        return
    inputs = [c.input(i) for i in range(len(op.inputs))]
    c.emit(code, inputs, [c.output()])


#: NNAPI's activation operations and the fuse code that means the same
_RELU_FUSE = {Op.RELU: 1, Op.RELU1: 2, Op.RELU6: 3}
#: the unary operations of _SIMPLE that NNAPI defines on float tensors only
_FLOAT_ONLY = (Op.RSQRT, Op.SQRT, Op.EXP, Op.LOG, Op.SIN, Op.POW)



@_converter("GELU")
def _gelu(c: _Converter, op: _Operator) -> None:
    options = op.options("GeluOptions")
    approximate = bool(options.Approximate()) if options is not None else False
    form = "tanh form" if approximate else "erf form, erf to 1.5e-7 by Abramowitz & Stegun 7.1.26"
    if c.nn_type(op.out_tensor()).type in _QUANT8:
        _in_float32(c, op, lambda inputs, out: _gelu_float(c, inputs[0], out, approximate))
        c.lowered(f"quantized GELU ({form}) as DEQUANTIZE, elementwise float32 operations, QUANTIZE")
        return
    _gelu_float(c, c.input(0), c.output(), approximate)
    c.lowered(f"GELU ({form}) as elementwise NNAPI operations (NNAPI has no GELU)")


def _gelu_float(c: _Converter, x: int, out: int, approximate: bool) -> None:
    """gelu(x) = x * Phi(x). Exact form: x * Phi(x) = relu(x) - |x| * erfc(|x| / sqrt 2) / 2
    (erf is odd), with no select; approximate: x / 2 * (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))."""
    x_type = c.type_of(x)

    def k(value: float) -> int:
        return c.const_operand(np.array([value], x_type.dtype), x_type.with_dimensions([1]))

    def op2(code: OperationCode, a: int, b: int, target: int | None = None) -> int:
        target = c.temp(x_type) if target is None else target
        c.emit(code, [a, b, c.i32(0)], [target])
        return target

    def op1(code: OperationCode, a: int) -> int:
        target = c.temp(x_type)
        c.emit(code, [a], [target])
        return target

    if approximate:
        cube = op2(Op.MUL, op2(Op.MUL, x, x), x)
        inner = op2(Op.MUL, op2(Op.ADD, op2(Op.MUL, cube, k(GELU_TANH_CUBIC)), x), k(float(np.sqrt(2 / np.pi))))
        op2(Op.MUL, op2(Op.MUL, x, k(0.5)), op2(Op.ADD, op1(Op.TANH, inner), k(1.0)), out)
        return
    magnitude = op1(Op.ABS, x)
    t = op2(Op.DIV, k(1.0), op2(Op.ADD, op2(Op.MUL, magnitude, k(ERFC_P / np.sqrt(2))), k(1.0)))
    poly = op2(Op.MUL, t, k(ERFC_A[4]))
    for coefficient in reversed(ERFC_A[:4]):
        poly = op2(Op.MUL, op2(Op.ADD, poly, k(coefficient)), t)
    erfc = op2(Op.MUL, poly, op1(Op.EXP, op2(Op.MUL, op2(Op.MUL, x, x), k(-0.5))))
    op2(Op.SUB, op1(Op.RELU, x), op2(Op.MUL, op2(Op.MUL, magnitude, erfc), k(0.5)), out)


def _broadcast_to(c: _Converter, op: _Operator, position: int, dims: Sequence[int]) -> int:
    """Input ``position`` broadcast to ``dims`` (NumPy's rule): a constant at import; a
    bool by LOGICAL_AND with true; others by RESHAPE (EXPAND_DIMS for int32) and TILE."""
    x = c.input(position)
    x_type = c.type_of(x)
    dims = list(dims)
    if list(x_type.dimensions) == dims:
        return x
    const = c.const_of(op.inputs[position])
    full = x_type.with_dimensions(dims)
    if const is not None and const.channel is None:
        return c.const_operand(np.broadcast_to(const.data.reshape(x_type.dimensions), dims), full)
    if x_type.type == T.TENSOR_BOOL8:
        out = c.temp(full)
        c.emit(Op.LOGICAL_AND, [x, c.const_operand(np.ones(dims, np.bool_), full)], [out])
        return out
    source = [1] * (len(dims) - x_type.rank) + list(x_type.dimensions)
    if len(source) != len(dims) or any(s not in (1, d) for s, d in zip(source, dims)):
        raise UnsupportedOperator(f"input {position} of shape {list(x_type.dimensions)} does not broadcast to "
                                  f"{dims}")
    if x_type.rank < len(dims) and x_type.type == T.TENSOR_INT32:  # NNAPI's RESHAPE takes no int32
        for rank in range(x_type.rank + 1, len(dims) + 1):
            ranked = c.temp(x_type, source[len(dims) - rank:])
            c.emit(Op.EXPAND_DIMS, [x, c.i32(0)], [ranked])
            x = ranked
    elif x_type.rank < len(dims):
        ranked = c.temp(x_type, source)
        c.emit(Op.RESHAPE, [x, c.vector(source)], [ranked])
        x = ranked
    out = c.temp(full)
    c.emit(Op.TILE, [x, c.vector([d // s for s, d in zip(source, dims)])], [out])
    return out


for _name, _code in _SIMPLE.items():
    if _code is not None:
        _converter(_name)(_simple)


@_converter("ELU")
def _elu(c: _Converter, op: _Operator) -> None:
    x = c.input(0)
    c.emit(Op.ELU, [x, c.float_scalar(1.0, x)], [c.output()])


@_converter("LEAKY_RELU")
def _leaky_relu(c: _Converter, op: _Operator) -> None:
    alpha = op.options("LeakyReluOptions").Alpha()
    x = c.input(0)
    x_type = c.type_of(x)
    if x_type.type in _FLOAT_TYPES:
        slope = c.const_operand(np.array([alpha], x_type.dtype), OperandType(x_type.type, [1]))
    elif x_type.type in _QUANT8 and alpha > 0:
        # alpha is exactly representable as one step of a quantized tensor of scale alpha.
        slope = c.const_operand(np.array([1], x_type.dtype), OperandType(x_type.type, [1], float(alpha), 0))
    else:
        raise UnsupportedOperator(f"LEAKY_RELU with alpha {alpha} on {x_type.type.name}")
    c.emit(Op.PRELU, [x, slope], [c.output()])
    c.lowered(f"LEAKY_RELU as PRELU with a constant slope {alpha:g}")


@_converter("SQUARED_DIFFERENCE")
def _squared_difference(c: _Converter, op: _Operator) -> None:
    a, b = c.input(0), c.input(1)
    out_type = c.nn_type(op.out_tensor())
    if out_type.type in _QUANT8:
        _in_float32(c, op, lambda inputs, out: _squared_difference_float(c, *inputs, out))
        c.lowered("quantized SQUARED_DIFFERENCE as DEQUANTIZE, SUB + MUL in float32, QUANTIZE (one rounding, "
                  "where TFLite's integer kernel rounds in fixed point: within a step of it)")
        return
    if out_type.type not in _FLOAT_TYPES:
        raise UnsupportedOperator(f"SQUARED_DIFFERENCE of {out_type.type.name} has no NNAPI sequence")
    _squared_difference_float(c, a, b, c.output())
    c.lowered("SQUARED_DIFFERENCE as SUB + MUL")


def _squared_difference_float(c: _Converter, a: int, b: int, out: int) -> None:
    out_type = c.type_of(out)
    difference = c.temp(out_type)
    c.emit(Op.SUB, [a, b, c.i32(0)], [difference])
    c.emit(Op.MUL, [difference, difference, c.i32(0)], [out])


def _in_float32(c: _Converter, op: _Operator, build: Callable[[list[int], int], None]) -> None:
    """A quantized operator computed in float32: every quantized input DEQUANTIZEd, ``build``
    emits the float operation into a float32 temporary, QUANTIZE writes the output."""
    inputs = []
    for position in range(len(op.inputs)):
        x = c.input(position)
        x_type = c.type_of(x)
        if x_type.type in _QUANT8:
            real = c.temp(OperandType(T.TENSOR_FLOAT32, x_type.dimensions))
            c.emit(Op.DEQUANTIZE, [x], [real])
            x = real
        inputs.append(x)
    out = c.output()
    real_out = c.temp(OperandType(T.TENSOR_FLOAT32, c.type_of(out).dimensions))
    build(inputs, real_out)
    c.emit(Op.QUANTIZE, [real_out], [out])


@_converter("SQUARE")
def _square(c: _Converter, op: _Operator) -> None:
    x = c.input(0)
    if c.type_of(x).type not in _FLOAT_TYPES + (T.TENSOR_INT32,):
        raise UnsupportedOperator("quantized SQUARE")
    c.emit(Op.MUL, [x, x, c.i32(0)], [c.output()])
    c.lowered("SQUARE as MUL of the input by itself")


@_converter("ADD_N")
def _add_n(c: _Converter, op: _Operator) -> None:
    operands = [c.input(i) for i in range(len(op.inputs))]
    out_type = c.nn_type(op.out_tensor())
    total = operands[0]
    for i, operand in enumerate(operands[1:], 1):
        target = c.output() if i == len(operands) - 1 else c.temp(out_type)
        c.emit(Op.ADD, [total, operand, c.i32(0)], [target])
        total = target
    if len(operands) == 1:
        c.identity(total, c.output())
    c.lowered(f"ADD_N of {len(operands)} tensors as a chain of ADD")


@_converter("BATCH_MATMUL")
def _batch_matmul(c: _Converter, op: _Operator) -> None:
    options = op.options("BatchMatMulOptions")
    adj_x = bool(options.AdjX()) if options is not None else False
    adj_y = bool(options.AdjY()) if options is not None else False
    shapes = [list(_operand_shape(op.tensor(i).shape)) for i in range(2)]
    if _matmul_by_constant_matrix(c, op, adj_x, adj_y):
        return
    batch = list(np.broadcast_shapes(tuple(shapes[0][:-2]), tuple(shapes[1][:-2])))
    operands = []
    broadcast = []
    for i in range(2):
        if shapes[i][:-2] == batch:
            operands.append(c.input(i))
            continue
        # NNAPI needs both operands of one rank and batch shape; TFLite broadcasts them.
        const = c.const_of(op.inputs[i])
        if const is None or any(d < 0 for d in op.tensor(1 - i).shape[:-2]):
            raise UnsupportedOperator("BATCH_MATMUL broadcasting a run-time operand, or over batch dimensions known "
                                      "only at run time, has no NNAPI equivalent")
        full = np.ascontiguousarray(np.broadcast_to(const.data.reshape(shapes[i]), batch + shapes[i][-2:]))
        operands.append(c.const_operand(full, OperandType(const.code, full.shape, const.scale, const.zero_point)))
        broadcast.append(i)
    c.emit(Op.BATCH_MATMUL, [*operands, c.boolean(adj_x), c.boolean(adj_y)], [c.output()])
    if broadcast:
        c.lowered(f"constant operand {broadcast[0]} broadcast to the batch shape {batch} at import (NNAPI "
                  "BATCH_MATMUL does not broadcast)")


def _matmul_by_constant_matrix(c: _Converter, op: _Operator, adj_x: bool, adj_y: bool) -> bool:
    """x @ W for a float32 x of rank 2-4 whose batch dimensions are known only at run time
    (a free batch, a sequence length) and a constant W without batch dimensions of its own
    (all 1), where broadcasting W to x's batch as a constant cannot be written: rank 2 as
    FULLY_CONNECTED, rank 4 [b, h, w, K] as a 1x1 CONV_2D (its output [b, h, w, N] is the
    product), rank 3 as that between EXPAND_DIMS and SQUEEZE. None needs the batch's size.
    Whether it did."""
    x_info, w_info = op.tensor(0), op.tensor(1)
    w = c.const_of(op.inputs[1])
    rank = len(x_info.shape)
    if adj_x or w is None or w.code != T.TENSOR_FLOAT32 or x_info.tfl_type != _FLOAT32 or not 2 <= rank <= 4 or \
            not any(d < 0 for d in x_info.shape[:-1]) or any(d != 1 for d in w_info.shape[:-2]) or \
            len(w_info.shape) < 2 or x_info.shape[-1] < 0 or any(d < 0 for d in w_info.shape):
        return False
    matrix = w.data.reshape(w_info.shape[-2:])
    weights = np.ascontiguousarray(matrix if adj_y else matrix.T, np.float32)  # [N, K]
    units, depth = weights.shape
    if depth != x_info.shape[-1]:
        raise UnsupportedOperator(f"BATCH_MATMUL of [.., {x_info.shape[-1]}] by a [{depth}, {units}] matrix")
    x = c.input(0)
    bias = c.const_operand(np.zeros(units, np.float32), OperandType(T.TENSOR_FLOAT32, [units]))
    if rank == 2:
        filters = c.const_operand(weights, OperandType(T.TENSOR_FLOAT32, [units, depth]))
        c.emit(Op.FULLY_CONNECTED, [x, filters, bias, c.i32(0)], [c.output()])
        c.lowered("BATCH_MATMUL by a constant matrix on rows known only at run time as FULLY_CONNECTED")
        return True
    image = x
    if rank == 3:
        image = c.temp(c.type_of(x), [0, 1, 0, depth])
        c.emit(Op.EXPAND_DIMS, [x, c.i32(1)], [image])
    filters = c.const_operand(weights.reshape(units, 1, 1, depth), OperandType(T.TENSOR_FLOAT32, [units, 1, 1, depth]))
    convolved = c.output() if rank == 4 else c.temp(c.type_of(x), [0, 1, 0, units])
    c.emit(Op.CONV_2D, [image, filters, bias, c.i32(_PADDING[1]), c.i32(1), c.i32(1), c.i32(0)], [convolved])
    if rank == 3:
        c.emit(Op.SQUEEZE, [convolved, c.vector([1])], [c.output()])
    c.lowered(f"BATCH_MATMUL by a constant matrix over dimensions known only at run time as a 1x1 CONV_2D"
              f"{' between EXPAND_DIMS and SQUEEZE' if rank == 3 else ''}")
    return True


@_converter("SOFTMAX")
def _softmax(c: _Converter, op: _Operator) -> None:
    x = c.input(0)
    beta = op.options("SoftmaxOptions").Beta()
    c.emit(Op.SOFTMAX, [x, c.float_scalar(beta, x)], [c.output()])


@_converter("LOG_SOFTMAX")
def _log_softmax(c: _Converter, op: _Operator) -> None:
    x = c.input(0)
    c.emit(Op.LOG_SOFTMAX, [x, c.float_scalar(1.0, x), c.i32(-1)], [c.output()])


@_converter("LOCAL_RESPONSE_NORMALIZATION")
def _lrn(c: _Converter, op: _Operator) -> None:
    options = op.options("LocalResponseNormalizationOptions")
    x = c.input(0)
    c.emit(Op.LOCAL_RESPONSE_NORMALIZATION,
           [x, c.i32(options.Radius()), c.float_scalar(options.Bias(), x), c.float_scalar(options.Alpha(), x),
            c.float_scalar(options.Beta(), x)], [c.output()])


@_converter("CONCATENATION")
def _concatenation(c: _Converter, op: _Operator) -> None:
    options = op.options("ConcatenationOptions")
    operands = [c.input(i) for i in range(len(op.inputs))]
    axis = options.Axis()
    if axis < 0:  # TFLite counts a negative axis from the end; NNAPI's axis is in [0, rank)
        axis += c.type_of(operands[0]).rank
    activation = options.FusedActivationFunction()
    if activation == 0:
        c.emit(Op.CONCATENATION, [*operands, c.i32(axis)], [c.output()])
        return
    temp = c.temp(c.nn_type(op.out_tensor()))
    c.emit(Op.CONCATENATION, [*operands, c.i32(axis)], [temp])
    c.activation_after(activation, temp)


def _reshape_complex(c: _Converter, op: _Operator) -> None:
    """RESHAPE / SQUEEZE / EXPAND_DIMS of a complex tensor (RFFT2D's): both parts."""
    shape = _static_shape(c, op.out_tensor())
    if shape is None:
        raise UnsupportedOperator("complex tensor of unknown shape")
    dims = list(_operand_shape(shape))
    parts = []
    for part in c.complex_parts[op.inputs[0]]:
        moved = c.temp(c.type_of(part), dims)
        c.emit(Op.RESHAPE, [part, c.vector(dims)], [moved])
        parts.append(moved)
    c.complex_parts[op.outputs[0]] = (parts[0], parts[1])
    c.lowered(f"{op.name} of a complex tensor: of its real and imaginary parts")


def _derive_moved_shape(c: _Converter, op: _Operator) -> None:
    """The output shape of RESHAPE / SQUEEZE / EXPAND_DIMS from its input's and its
    parameters, before its converter reads it, where the file left dimensions of it open
    (propagated shapes: they are known once the input's are)."""
    out = op.out_tensor()
    source = op.tensor(0)
    if all(d >= 0 for d in out.shape) or any(d < 0 for d in source.shape):
        return
    size = int(np.prod(source.shape, dtype=np.int64))
    try:
        if op.name == "RESHAPE":
            const = c.const_of(op.inputs[1]) if op.has_input(1) else None
            options = op.options("ReshapeOptions")
            new = const.data.reshape(-1) if const is not None else \
                options.NewShapeAsNumpy() if options is not None and options.NewShapeLength() else None
            if new is None:
                return
            shape = np.empty(size, np.int8).reshape([int(d) for d in new]).shape
        elif op.name == "SQUEEZE":
            options = op.options("SqueezeOptions")
            rank = len(source.shape)
            axes = {int(d) % rank for d in options.SqueezeDimsAsNumpy()} if options is not None and \
                options.SqueezeDimsLength() else {i for i, d in enumerate(source.shape) if d == 1}
            shape = tuple(d for i, d in enumerate(source.shape) if i not in axes)
        else:
            const = c.const_of(op.inputs[1])
            if const is None:
                return
            axis = int(const.data.reshape(-1)[0])
            axis = axis + len(source.shape) + 1 if axis < 0 else axis
            shape = (*source.shape[:axis], 1, *source.shape[axis:])
    except (ValueError, TypeError, ZeroDivisionError):  # parameters that do not fit the input: its converter refuses
        return
    if len(shape) == len(out.shape) and all(d < 0 or d == s for d, s in zip(out.shape, shape)):
        out.shape = tuple(int(d) for d in shape)


def _static_shape(c: _Converter, info: _TensorInfo) -> list[int] | None:
    return list(_operand_shape(info.shape)) if all(d >= 0 for d in info.shape) else None


#: the tensor types NNAPI's RESHAPE takes (others are reshaped by _reshape_other_type)
_RESHAPE_TYPES = (*_FLOAT_TYPES, *_QUANT8)


@_converter("RESHAPE")
def _reshape(c: _Converter, op: _Operator) -> None:
    if op.inputs[0] in c.complex_parts:
        _reshape_complex(c, op)
        return
    out = op.out_tensor()
    static = _static_shape(c, out)
    const = c.const_of(op.inputs[0])
    if const is not None and const.channel is None and static is not None and op.inputs[0] not in c.operands:
        # A reshaped constant is a constant: reshaped here, once.
        c.consts[op.outputs[0]] = _Const(const.data.reshape(static), const.code, const.scale, const.zero_point)
        c.lowered("a constant reshaped at import")
        return
    if _high_rank_chain(c, op) or _high_rank_tree(c, op) or _lift(c, op, static):
        return
    x = c.input(0)
    if c.type_of(x).type not in _RESHAPE_TYPES:
        _reshape_other_type(c, op, x, static)
        return
    if static is not None:
        shape = c.vector(static)
    elif op.has_input(1) and c.const_of(op.inputs[1]) is not None:
        shape = c.vector(c.const_of(op.inputs[1]).data)
    elif op.has_input(1):
        shape = c.input(1)
    else:
        options = op.options("ReshapeOptions")
        shape = c.vector(options.NewShapeAsNumpy())
    c.emit(Op.RESHAPE, [x, shape], [c.output()])


#: operators that only move values, with the input positions holding them (None: all):
#: NNAPI's versions take no TENSOR_INT32 / TENSOR_BOOL8, so those are moved as float32
_MOVES_DATA: dict[str, tuple[int, ...] | None] = {
    "STRIDED_SLICE": (0,), "CONCATENATION": None, "TRANSPOSE": (0,), "SQUEEZE": (0,),
    "SPACE_TO_DEPTH": (0,), "DEPTH_TO_SPACE": (0,), "SPLIT": (1,), "SPLIT_V": (0,)}
#: the same for operators whose NNAPI operation takes TENSOR_INT32 but not TENSOR_BOOL8
_MOVES_BOOL: dict[str, tuple[int, ...] | None] = {
    "EXPAND_DIMS": (0,), "GATHER": (0,), "SLICE": (0,), "TILE": (0,), "PACK": None, "REVERSE_V2": (0,),
    "PAD": (0,), "PADV2": (0,)}
_HALF = 1 << 16


def _float_half(c: _Converter, tensor: int, half: int) -> int:
    """float32 operand holding, exactly, the high (``half`` 0) or low (1) 16 bits of an
    int32 tensor, or a bool tensor as 1 / 0 (``half`` 0)."""
    key = (tensor, half)
    if key in c.float_halves:
        return c.float_halves[key]
    info = c.graph.tensors[tensor]
    const = c.const_of(tensor)
    dims = list(_operand_shape(info.shape))
    float_type = OperandType(T.TENSOR_FLOAT32, dims)
    if const is not None:
        data = const.data.astype(np.int64)
        if info.tfl_type == _INT32:
            data = data // _HALF if half == 0 else data % _HALF
        index = c.const_operand(data.astype(np.float32).reshape(dims), float_type)
    elif info.tfl_type == _BOOL:
        index = c.temp(float_type)
        _select_one_zero(c, c.operand(tensor), float_type, index)
    else:
        # high = min(floor(float(x) / 2**16), 2**15 - 1): float(x) may round, so high may be
        # one off floor(x / 2**16), but low = x - high * 2**16 is then still small and exact
        # in float32, and the clamp keeps high * 2**16 inside int32. (No int32 DIV: not
        # every device has one.)
        x = c.operand(tensor)
        x_type = c.type_of(x)
        rounded, scaled, floored, high = (c.temp(float_type) for _ in range(4))
        c.emit(Op.CAST, [x], [rounded])
        one = OperandType(T.TENSOR_FLOAT32, [1])
        c.emit(Op.MUL, [rounded, c.const_operand(np.array([1 / _HALF], np.float32), one), c.i32(0)], [scaled])
        c.emit(Op.FLOOR, [scaled], [floored])
        c.emit(Op.MINIMUM, [floored, c.const_operand(np.array([_HALF // 2 - 1], np.float32), one)], [high])
        high_int, high_scaled, low_int, low = c.temp(x_type), c.temp(x_type), c.temp(x_type), c.temp(float_type)
        c.emit(Op.CAST, [high], [high_int])
        c.emit(Op.MUL, [high_int, c.const_operand(np.array([_HALF], np.int32), OperandType(T.TENSOR_INT32, [1])),
                        c.i32(0)], [high_scaled])
        c.emit(Op.SUB, [x, high_scaled, c.i32(0)], [low_int])
        c.emit(Op.CAST, [low_int], [low])
        c.float_halves[(tensor, 0)], c.float_halves[(tensor, 1)] = high, low
        return c.float_halves[key]
    c.float_halves[key] = index
    return index


def _int32_concatenation(c: _Converter, op: _Operator) -> bool:
    """CONCATENATION of int32 tensors of static shapes, exactly and in few operations
    (NNAPI's CONCATENATION takes no TENSOR_INT32; GATHER and SELECT do): each input
    computed at run time is GATHERed along the axis into the output's shape (its own
    positions, index 0 elsewhere) and SELECTed into place by a constant mask; constant
    inputs are joined here. A loop body building a SLICE's begin from its counter ([i, 0,
    0]) is then one GATHER and one SELECT instead of fourteen operations on float32
    halves. False where it does not apply (unknown or zero-sized shapes, a fused
    activation, nothing computed at run time): ``_through_float32`` then moves it."""
    options = op.options("ConcatenationOptions")
    out_shape = _static_shape(c, op.out_tensor())
    shapes = [_static_shape(c, c.graph.tensors[t]) for t in op.inputs]
    if options.FusedActivationFunction() != 0 or out_shape is None or None in shapes or not out_shape:
        return False
    rank = len(out_shape)
    axis = options.Axis() + (rank if options.Axis() < 0 else 0)
    if not 0 <= axis < rank or any(len(shape) != rank or 0 in shape for shape in shapes) \
            or sum(shape[axis] for shape in shapes) != out_shape[axis]:
        return False
    constants = [c.const_of(t) for t in op.inputs]
    if all(const is not None for const in constants):
        return False
    total = out_shape[axis]
    joined = np.zeros(out_shape, np.int32)  # the constant inputs in their places
    picks: list[tuple[int, slice]] = []  # (position of a run-time input, its range on the axis)
    start = 0
    for position, (shape, const) in enumerate(zip(shapes, constants, strict=True)):
        span = slice(start, start + shape[axis])
        where = (slice(None),) * axis + (span,)
        if const is None:
            picks.append((position, span))
        else:
            joined[where] = const.data.reshape(shape)
        start = span.stop
    out_type = OperandType(T.TENSOR_INT32, out_shape)
    current = c.const_operand(joined, out_type) if len(picks) < len(op.inputs) else None
    for number, (position, span) in enumerate(picks):
        indices = np.zeros(total, np.int32)
        indices[span] = np.arange(span.stop - span.start, dtype=np.int32)
        last = number == len(picks) - 1
        gathered = c.output() if last and current is None else c.temp(out_type)
        c.emit(Op.GATHER, [c.input(position), c.i32(axis),
                           c.const_operand(indices, OperandType(T.TENSOR_INT32, [total]))], [gathered])
        if current is None:
            current = gathered
            continue
        mask = np.zeros(out_shape, np.bool_)
        mask[(slice(None),) * axis + (span,)] = True
        target = c.output() if last else c.temp(out_type)
        c.emit(Op.SELECT, [c.const_operand(mask, OperandType(T.TENSOR_BOOL8, out_shape)), gathered, current],
               [target])
        current = target
    c.lowered("CONCATENATION of TENSOR_INT32, which NNAPI's operation does not take: each input computed at run "
              "time GATHERed into the output's shape and SELECTed into place, constant inputs joined at import")
    return True


def _select_one_zero(c: _Converter, condition: int, value_type: OperandType, target: int) -> None:
    """``target`` (of ``value_type``, static) = 1 where the bool tensor ``condition`` is
    true, else 0: NNAPI's CAST takes no TENSOR_BOOL8."""
    dims = list(value_type.dimensions)
    c.emit(Op.SELECT, [condition, c.const_operand(np.ones(dims, value_type.dtype), value_type),
                       c.const_operand(np.zeros(dims, value_type.dtype), value_type)], [target])


def _through_float32(c: _Converter, op: _Operator, positions: tuple[int, ...] | None,
                     convert: Callable[[_Converter, _Operator], None]) -> None:
    """Convert an operator that only moves values of an int32 / bool tensor, which its
    NNAPI operation does not take, on float32 instead, exactly: a bool as 1.0 / 0.0; an
    int32 as its high and low 16 bits (each exact in float32), moved apart and joined."""
    out_info = op.out_tensor()
    is_bool = out_info.tfl_type == _BOOL
    positions = range(len(op.inputs)) if positions is None else positions
    moved = [op.inputs[p] for p in positions if p < len(op.inputs) and op.inputs[p] >= 0]
    if any(c.graph.tensors[t].tfl_type != out_info.tfl_type for t in moved):
        raise UnsupportedOperator("its inputs and output differ in type")
    results: list[list[int]] = []
    for half in (0,) if is_bool else (0, 1):
        saved = {t: c.operands[t] for t in moved if t in c.operands}
        for tensor in moved:
            c.operands[tensor] = _float_half(c, tensor, half)
        c.float_outputs = True
        try:
            convert(c, op)
        finally:
            c.float_outputs = False
            for tensor in moved:
                c.operands.pop(tensor, None)
            c.operands.update(saved)
        results.append([c.operands.pop(t) for t in op.outputs])
    for position in range(len(op.outputs)):
        target = c.output(position)
        target_type = c.type_of(target)
        if is_bool:
            zero = c.const_operand(np.zeros(1, np.float32), OperandType(T.TENSOR_FLOAT32, [1]))
            c.emit(Op.NOT_EQUAL, [results[0][position], zero], [target])
            continue
        high, low, scaled = c.temp(target_type), c.temp(target_type), c.temp(target_type)
        c.emit(Op.CAST, [results[0][position]], [high])
        c.emit(Op.CAST, [results[1][position]], [low])
        base = c.const_operand(np.array([_HALF], np.int32), OperandType(T.TENSOR_INT32, [1]))
        c.emit(Op.MUL, [high, base, c.i32(0)], [scaled])
        c.emit(Op.ADD, [scaled, low, c.i32(0)], [target])
    c.lowered(f"{op.name} of {'TENSOR_BOOL8' if is_bool else 'TENSOR_INT32'}, which NNAPI's "
              + ("operation does not take, moved as float32 1.0 / 0.0 and compared with 0" if is_bool else
                 "operation does not take, moved exactly as float32 high and low 16 bits and joined again"))


def _inserted_ones(source: Sequence[int], target: Sequence[int]) -> list[int] | None:
    """The positions in ``target`` of size-1 dimensions inserted into ``source``, or
    None when ``target`` is not ``source`` with size-1 dimensions inserted."""
    inserted, position = [], 0
    for index, size in enumerate(target):
        if position < len(source) and size == source[position]:
            position += 1
        elif size == 1:
            inserted.append(index)
        else:
            return None
    return inserted if position == len(source) else None


def _reshape_other_type(c: _Converter, op: _Operator, x: int, dims: list[int] | None) -> None:
    """RESHAPE of a TENSOR_INT32 / TENSOR_BOOL8 tensor, which NNAPI's RESHAPE does not
    take: nothing when the NNAPI shapes are equal (a rank-0 tensor is [1]), EXPAND_DIMS
    when it only inserts size-1 dimensions, else an exact round trip through float32."""
    x_type = c.type_of(x)
    if dims is None or not x_type.is_fully_specified:
        raise UnsupportedOperator(f"RESHAPE of a {x_type.type.name} tensor needs static shapes (NNAPI's "
                                  f"RESHAPE takes no {x_type.type.name})")
    source = list(x_type.dimensions)
    if source == dims:
        c.operands[op.outputs[0]] = x
        c.lowered(f"RESHAPE of {x_type.type.name} to the same NNAPI shape {dims}: the output is the input")
        return
    inserted = _inserted_ones(source, dims) if x_type.type == T.TENSOR_INT32 else None
    if inserted is not None:  # NNAPI's EXPAND_DIMS takes TENSOR_INT32
        current = x
        for step, axis in enumerate(inserted):
            # the later insertions lie further right, so the earlier axes are all in place
            later = set(inserted[step + 1:])
            target = c.output() if step == len(inserted) - 1 else \
                c.temp(x_type, [d for i, d in enumerate(dims) if i not in later])
            c.emit(Op.EXPAND_DIMS, [current, c.i32(axis)], [target])
            current = target
        c.lowered(f"RESHAPE of {x_type.type.name} that inserts size-1 dimensions as EXPAND_DIMS")
        return
    if x_type.type not in (T.TENSOR_INT32, T.TENSOR_BOOL8):
        raise UnsupportedOperator(f"RESHAPE of a {x_type.type.name} tensor has no NNAPI equivalent")
    _through_float32(c, op, (0,), lambda c, op: c.emit(Op.RESHAPE, [c.input(0), c.vector(dims)], [c.output()]))


#: NNAPI's tensors have rank 4 at most (RESHAPE, TILE, TRANSPOSE, ...)
_MAX_RANK = 4
#: the largest tensor whose element positions _high_rank_chain traces (int64 each)
_CHAIN_ELEMENTS = 1 << 24


def _chain_step(c: _Converter, op: _Operator, index: np.ndarray) -> np.ndarray | None:
    """``index`` (the input positions a tensor holds) moved by RESHAPE / EXPAND_DIMS / TILE /
    BROADCAST_TO / TRANSPOSE ``op`` with constant parameters; None for any other operator."""
    out, source = op.out_tensor(), op.tensor(0)
    dims = _static_shape(c, out)
    if op.custom is not None or len(op.outputs) != 1 or dims is None or len(out.shape) == 0 or \
            (out.tfl_type, out.scales, out.zero_points) != (source.tfl_type, source.scales, source.zero_points):
        return None
    if op.name in ("RESHAPE", "EXPAND_DIMS") and int(np.prod(dims)) == index.size:
        return index.reshape(dims)
    param = c.const_of(op.inputs[1]) if op.has_input(1) else None
    if param is None:
        return None
    values = param.data.reshape(-1).astype(np.int64)
    if op.name == "TILE" and len(values) == index.ndim and values.min() >= 1 and \
            int(np.prod(dims)) <= _CHAIN_ELEMENTS:
        moved = np.tile(index, values)
    elif op.name == "BROADCAST_TO" and int(np.prod(dims)) <= _CHAIN_ELEMENTS:
        try:
            moved = np.broadcast_to(index, dims)
        except ValueError:
            return None
    elif op.name == "TRANSPOSE" and sorted(values.tolist()) == list(range(index.ndim)):
        moved = index.transpose(values)
    else:
        return None
    return moved if list(moved.shape) == dims else None


def _merged_transpose(dims: Sequence[int], perm: Sequence[int]) -> tuple[list[int], list[int]]:
    """The smallest (dims, perm) moving elements as TRANSPOSE ``perm`` of a ``dims`` tensor:
    size-1 axes dropped, runs of axes that stay neighbours merged into one."""
    kept = [axis for axis in range(len(dims)) if dims[axis] != 1]
    renumber = {axis: k for k, axis in enumerate(kept)}
    order = [renumber[axis] for axis in perm if dims[axis] != 1]
    groups: list[list[int]] = []  # runs of input axes, in output order
    for axis in order:
        if groups and groups[-1][-1] + 1 == axis:
            groups[-1].append(axis)
        else:
            groups.append([axis])
    by_input = sorted(range(len(groups)), key=lambda g: groups[g][0])
    merged = [int(np.prod([dims[kept[a]] for a in groups[g]])) for g in by_input]
    return merged, [by_input.index(g) for g in range(len(groups))]


def _lifted_shape(c: _Converter, op: _Operator) -> list[int] | None:
    """The static shape of ``op``'s input where ``op`` lifts a computed (or already
    converted) tensor of rank 1-4 above NNAPI's rank 4 and it is small enough to trace
    element by element; None otherwise."""
    source, out = op.tensor(0), op.out_tensor()
    shape = _static_shape(c, source)
    if len(out.shape) <= _MAX_RANK or shape is None or len(source.shape) == 0 or \
            len(source.shape) > _MAX_RANK or int(np.prod(shape)) > _CHAIN_ELEMENTS or \
            (c.const_of(op.inputs[0]) is not None and op.inputs[0] not in c.operands):
        return None
    return shape


def _high_rank_chain(c: _Converter, op: _Operator) -> bool:
    """Convert ``op`` and the operators after it when ``op`` lifts a tensor of rank <= 4
    above NNAPI's rank 4 and a chain of single readers (RESHAPE, EXPAND_DIMS, TILE,
    BROADCAST_TO, TRANSPOSE with constant parameters) brings it back, as Keras writes
    UpSampling2D (repeat: rank-5 RESHAPE + TILE) and window or pixel shuffles (rank-6
    TRANSPOSE). Such a chain only moves elements: the input position of each output
    element, traced here on the static shapes, is matched to an exact rank-4 form: per-axis
    GATHERs (RESIZE_NEAREST_NEIGHBOR where they are its indexes) or RESHAPE + TRANSPOSE +
    RESHAPE. One FULLY_CONNECTED keeping its input's rank may sit in the chain before any
    element moved (a Swin window merge: the attention's output projection on the rank-6
    windows): it acts on each row of the last axis alone, so it runs on the rows as they
    are, [rows, depth], and the moves after it follow. False (nothing emitted) when there
    is no such chain or form."""
    shape = _lifted_shape(c, op)
    if shape is None:
        return False
    # the operand type, before the trace (up to _CHAIN_ELEMENTS positions through every step)
    known = c.operands.get(op.inputs[0])
    if known is not None and c.type_of(known).type not in _RESHAPE_TYPES:
        return False
    index = _chain_step(c, op, np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape))
    chain, transposes, rows = [op], [], None
    while index is not None and index.ndim > _MAX_RANK:
        tensor = chain[-1].outputs[0]
        readers = c.readers(tensor)
        if tensor in c.graph.outputs or len(readers) != 1 or readers[0][1] != 0:
            return False
        reader = readers[0][0]
        chain.append(reader)
        if reader.name == "FULLY_CONNECTED":
            rows = _rows_before(c, reader, index, rows)
            if rows is None:
                return False
            index = np.arange(int(np.prod(rows[1]))).reshape(rows[1])
            continue
        if reader.name == "TRANSPOSE":
            perm = c.const_of(reader.inputs[1])
            if perm is None:
                return False
            transposes.append((list(index.shape), perm.data.reshape(-1).tolist()))
        index = _chain_step(c, reader, index)
    if index is None:
        return False
    x = c.input(0)  # (``known``, checked above: a tensor no operator wrote yet raises here)
    if rows is not None:
        shape = [int(np.prod(rows[1][:-1])), rows[1][-1]]
    picks = _gather_plan(shape, index)
    moves = _transpose_plan(index, *transposes[0]) if picks is None and len(transposes) == 1 else None
    if picks is None and moves is None:
        return False
    last = chain[-1]
    if rows is not None:
        x = _rows_fully_connected(c, rows[0], x)
    emitted = _emit_gathers(c, last, x, shape, index, picks) if picks is not None else \
        _emit_transpose(c, last, x, shape, index, *moves)
    c.absorbed.update(reader.index for reader in chain[1:])
    names = " + ".join(step.name for step in chain)
    c.lowered(f"{names} through rank {max(len(step.out_tensor().shape) for step in chain)} only moves "
              f"elements: {emitted}")
    return True


def _tree_step(c: _Converter, op: _Operator, index: np.ndarray) -> np.ndarray | None:
    """``index`` moved by ``op`` as _chain_step does, and also by SQUEEZE, SLICE and
    STRIDED_SLICE with constant parameters; None for any other operator."""
    if op.name not in ("SQUEEZE", "SLICE", "STRIDED_SLICE"):
        return _chain_step(c, op, index)
    out, source = op.out_tensor(), op.tensor(0)
    dims = _static_shape(c, out)
    if op.custom is not None or len(op.outputs) != 1 or dims is None or \
            (out.tfl_type, out.scales, out.zero_points) != (source.tfl_type, source.scales, source.zero_points):
        return None
    if op.name == "SQUEEZE":
        return index.reshape(dims) if int(np.prod(dims)) == index.size else None
    params = [c.const_of(op.inputs[k]) if op.has_input(k) else None for k in range(1, len(op.inputs))]
    if any(p is None for p in params):
        return None
    values = [p.data.reshape(-1).astype(np.int64) for p in params]
    if op.name == "SLICE":
        begin, size = values
        if len(begin) != index.ndim or len(size) != index.ndim or begin.min(initial=0) < 0:
            return None
        moved = index[tuple(slice(b, None if n < 0 else b + n) for b, n in zip(begin, size))]
    else:
        options = op.options("StridedSliceOptions")
        if options is None or (hasattr(options, "Offset") and options.Offset()):
            return None
        begin, end = values[0], values[1]
        strides = values[2] if len(values) > 2 else np.ones_like(begin)
        try:
            spec, begin_mask, end_mask, shrink, out_axes = _dense_slice_spec(
                index.ndim, begin, end, strides, options.BeginMask(), options.EndMask(), options.ShrinkAxisMask(),
                options.EllipsisMask(), options.NewAxisMask())
        except UnsupportedOperator:
            return None
        picks: list[Any] = []
        for axis, (b, e, s) in enumerate(spec):
            if s == 0:
                return None
            if shrink >> axis & 1:
                if begin_mask >> axis & 1 or not -index.shape[axis] <= b < index.shape[axis]:
                    return None
                picks.append(int(b))
            else:
                picks.append(slice(None if begin_mask >> axis & 1 else b, None if end_mask >> axis & 1 else e, s))
        moved = index[tuple(picks)]
        moved = moved.reshape([1 if new else d for new, d in zip(out_axes, dims)]) if \
            len(out_axes) == len(dims) and int(np.prod(dims)) == moved.size else moved
    return moved if list(moved.shape) == dims else None


def _high_rank_tree(c: _Converter, op: _Operator) -> bool:
    """Convert ``op`` and every operator after it when ``op`` lifts a tensor of rank <= 4
    above NNAPI's rank 4 and the operators reading it (several, each a branch of element
    moves: RESHAPE, TRANSPOSE, SLICE, STRIDED_SLICE, SQUEEZE, ... with constant parameters)
    bring every branch back to rank <= 4, as attention's query / key / value split is
    written (tflite_moves.py). Each branch's end is computed from ``op``'s input by one
    RESHAPE / STRIDED_SLICE / TRANSPOSE / RESHAPE plan. False (nothing emitted) when a
    branch does anything else or has no such plan."""
    shape = _lifted_shape(c, op)
    if shape is None:
        return False
    known = c.operands.get(op.inputs[0])
    if known is not None and c.type_of(known).type not in (*_FLOAT_TYPES, *_QUANT8):
        return False
    first = _chain_step(c, op, np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape))
    if first is None:
        return False
    pending, inner, leaves = [(op, first)], [op], []
    while pending:
        step, index = pending.pop()
        if index.ndim <= _MAX_RANK:
            leaves.append((step, index))
            continue
        tensor = step.outputs[0]
        readers = c.readers(tensor)
        if tensor in c.graph.outputs or not readers or any(slot != 0 for _, slot in readers):
            return False
        for reader, _ in readers:
            moved = _tree_step(c, reader, index)
            if moved is None:
                return False
            inner.append(reader)
            pending.append((reader, moved))
    plans = [(leaf, index, move_plan(shape, index)) for leaf, index in leaves]
    if any(plan is None for _, _, plan in plans):
        return False
    x = c.input(0)
    like = c.type_of(x)
    for leaf, index, plan in sorted(plans, key=lambda item: item[0].index):
        final = list(index.shape)
        steps: list[tuple[Any, ...]] = []
        if plan.sliced_from != shape:
            steps.append((Op.RESHAPE, [c.vector(plan.sliced_from)], plan.sliced_from))
        if plan.begin is not None:
            kept = [len(range(b, e, s)) for b, e, s in zip(plan.begin, plan.end, plan.strides)]
            steps.append((Op.STRIDED_SLICE, [c.vector(plan.begin), c.vector(plan.end), c.vector(plan.strides),
                                             c.i32(0), c.i32(0), c.i32(0)], kept))
        if plan.order is not None:
            if (steps[-1][2] if steps else shape) != plan.moved_from:
                steps.append((Op.RESHAPE, [c.vector(plan.moved_from)], plan.moved_from))
            steps.append((Op.TRANSPOSE, [c.vector(plan.order)], [plan.moved_from[k] for k in plan.order]))
        if (steps[-1][2] if steps else shape) != final:
            steps.append((Op.RESHAPE, [c.vector(final)], final))
        current = x
        for k, (code, params, dims) in enumerate(steps):
            target = _chain_output(c, leaf) if k == len(steps) - 1 else c.temp(like, dims)
            c.emit(code, [current, *params], [target])
            current = target
        if not steps:
            c.identity(x, _chain_output(c, leaf))
    c.absorbed.update(step.index for step in inner[1:])
    c.lowered(f"{len(leaves)} branches of element moves through rank "
              f"{max(len(step.out_tensor().shape) for step in inner)} (operators "
              f"{sorted(step.index for step in inner)}): each a rank-4 RESHAPE / STRIDED_SLICE / TRANSPOSE / RESHAPE")
    return True


def _lift(c: _Converter, op: _Operator, static: list[int] | None) -> bool:
    """RESHAPE ``op`` to above rank 4 (that no chain or tree of moves brings back) kept as
    its input's operand (c.lifted) for readers that need no rank-5 operand: a RESHAPE back
    down, arithmetic on merged axes. A RESHAPE of a lifted tensor is one RESHAPE of its
    operand, or stays lifted. False where the RESHAPE is emitted as written."""
    tensor = op.inputs[0]
    if static is None or c.graph.propagate:
        return False
    if tensor in c.lifted and tensor not in c.operands:
        source = c.lifted[tensor][0]
        if len(static) > _MAX_RANK:
            c.lifted[op.outputs[0]] = (source, static)
        else:
            c.emit(Op.RESHAPE, [source, c.vector(static)], [c.output()])
        c.lowered("a RESHAPE of a tensor above rank 4, from the rank <= 4 operand holding its elements")
        return True
    if len(static) <= _MAX_RANK or tensor not in c.operands or \
            c.type_of(c.operands[tensor]).type not in _RESHAPE_TYPES or \
            len(c.type_of(c.operands[tensor]).dimensions) > _MAX_RANK:
        return False
    c.lifted[op.outputs[0]] = (c.operands[tensor], static)
    return True


def _merged_broadcast(shapes: list[list[int]], out: list[int]) -> list[list[int]] | None:
    """Each input's shape, and the output's (last), with the output's size-1 axes dropped
    and neighbouring axes merged where every input is either whole or broadcast on both;
    None when an input's axis is neither the output's nor 1."""
    aligned = [[1] * (len(out) - len(shape)) + list(shape) for shape in shapes]
    groups: list[tuple[tuple[bool, ...], list[int]]] = []
    for axis, size in enumerate(out):
        if size == 1:
            continue
        if any(shape[axis] not in (1, size) for shape in aligned):
            return None
        pattern = tuple(shape[axis] == size for shape in aligned)
        if groups and groups[-1][0] == pattern:
            groups[-1][1].append(axis)
        else:
            groups.append((pattern, [axis]))
    merged = [[int(np.prod([out[a] for a in axes])) if pattern[k] else 1 for pattern, axes in groups]
              for k in range(len(shapes))]
    return [shape or [1] for shape in merged] + [[int(np.prod([out[a] for a in axes])) for _, axes in groups]
                                                 or [1]]


def _lifted_arithmetic(c: _Converter, op: _Operator, code: OperationCode, activation: int) -> bool:
    """Float ADD / SUB / MUL / DIV above rank 4 whose inputs are lifted tensors, constants or
    operands of static shape: computed on merged axes (_merged_broadcast, rank <= 4) and
    kept lifted, as attention adds its mask per window (Swin, through ai-edge-torch: two
    RESHAPEs to rank 5, ADD, RESHAPE back). False (nothing emitted) otherwise."""
    out = _static_shape(c, op.out_tensor())
    if out is None or c.graph.propagate or op.out_tensor().tfl_type not in (_FLOAT32, _FLOAT16):
        return False
    sources, shapes = [], []
    for position in (0, 1):
        tensor = op.inputs[position]
        info = op.tensor(position)
        if tensor in c.lifted and tensor not in c.operands:
            sources.append(c.lifted[tensor][0])
        elif tensor in c.operands or c.const_of(tensor) is not None:
            sources.append(None)
        else:
            return False
        shape = _static_shape(c, info)
        if shape is None:
            return False
        shapes.append(shape)
    merged = _merged_broadcast(shapes, out)
    if merged is None or any(len(shape) > _MAX_RANK for shape in merged):
        return False
    operands = []
    for position, (source, shape) in enumerate(zip(sources, merged[:2])):
        tensor = op.inputs[position]
        const = c.const_of(tensor)
        if source is None and const is not None and tensor not in c.operands:
            data = const.data.reshape(shape)
            operands.append(c.const_operand(data, OperandType(const.code, shape, const.scale, const.zero_point)))
            continue
        source = c.operand(tensor) if source is None else source
        if list(c.type_of(source).dimensions) == shape:
            operands.append(source)
            continue
        reshaped = c.temp(c.type_of(source), shape)
        c.emit(Op.RESHAPE, [source, c.vector(shape)], [reshaped])
        operands.append(reshaped)
    result = c.add(c.nn_type(op.out_tensor()).with_dimensions(merged[2]))
    c.with_activation(activation, lambda act, target: c.emit(code, [*operands, act], [target]), result)
    c.lifted[op.outputs[0]] = (result, out)
    c.lowered(f"{op.name} of rank {len(out)} on merged axes {merged[2]} (inputs {merged[0]} and {merged[1]})")
    return True


def _rows_before(c: _Converter, fc: _Operator, index: np.ndarray, rows) -> tuple[_Operator, list[int]] | None:
    """(``fc``, its output's shape) when FULLY_CONNECTED ``fc`` keeps its input's rank
    (acting on each row of the last axis) and reads the chain's rows unmoved; else None."""
    options = fc.options("FullyConnectedOptions")
    dims = _static_shape(c, fc.out_tensor())
    if rows is not None or options is None or not options.KeepNumDims() or len(fc.outputs) != 1 or \
            dims is None or not np.array_equal(index.reshape(-1), np.arange(index.size)):
        return None
    return fc, dims


def _rows_fully_connected(c: _Converter, fc: _Operator, x: int) -> int:
    """FULLY_CONNECTED ``fc`` on the rows of ``x`` (as [rows, depth]): a [rows, units] operand."""
    x_type = c.type_of(x)
    depth = fc.tensor(0).shape[-1]
    flat = x
    if list(x_type.dimensions)[1:] != [depth] or len(x_type.dimensions) != 2:
        flat = c.temp(x_type, [int(np.prod(x_type.dimensions)) // depth, depth])
        c.emit(Op.RESHAPE, [x, c.vector(c.type_of(flat).dimensions)], [flat])
    dims = _static_shape(c, fc.out_tensor())
    target = c.add(c.nn_type(fc.out_tensor(), [c.type_of(flat).dimensions[0], dims[-1]]))
    current = c.current
    c.current = fc
    c.operands[fc.inputs[0]] = flat  # its only reader is fc: the rank-6 tensor as its rows
    try:
        _fully_connected(c, fc, target)
    finally:
        c.current = current
        del c.operands[fc.inputs[0]]
    return target


def _chain_output(c: _Converter, last: _Operator) -> int:
    """The operand of the chain's last output (created as its own operator would)."""
    current = c.current
    c.current = last
    try:
        return c.output()
    finally:
        c.current = current


def _gather_plan(shape: list[int], index: np.ndarray) -> list[np.ndarray] | None:
    """The per-axis indexes whose gathers of a ``shape`` tensor give ``index`` (input
    positions, of the output's shape), or None when it is no such gather."""
    if index.ndim != len(shape):
        return None
    coords = np.unravel_index(index, shape)
    picks = []
    for axis, along in enumerate(coords):
        pick = along[tuple(slice(None) if k == axis else 0 for k in range(index.ndim))]
        if not np.array_equal(along, np.broadcast_to(
                pick.reshape([-1 if k == axis else 1 for k in range(index.ndim)]), index.shape)):
            return None
        picks.append(pick)
    return picks


def _emit_gathers(c: _Converter, last: _Operator, x: int, shape: list[int], index: np.ndarray,
                  picks: list[np.ndarray]) -> str:
    """Per-axis gathers ``picks``: RESIZE_NEAREST_NEIGHBOR where they are its indexes, else GATHERs."""
    moved = [axis for axis in range(len(shape)) if not np.array_equal(picks[axis], np.arange(shape[axis]))]
    if len(shape) == 4 and set(moved) <= {1, 2}:
        height, width = index.shape[1], index.shape[2]
        for half_pixel in (False, True):
            if np.array_equal(picks[1], nearest_indexes(shape[1], height, False, half_pixel)) and \
                    np.array_equal(picks[2], nearest_indexes(shape[2], width, False, half_pixel)):
                c.emit(Op.RESIZE_NEAREST_NEIGHBOR, [x, c.i32(width), c.i32(height), c.boolean(False),
                                                    c.boolean(False), c.boolean(half_pixel)],
                       [_chain_output(c, last)])
                return f"RESIZE_NEAREST_NEIGHBOR to {height}x{width}"
    current, current_dims = x, list(shape)
    for step, axis in enumerate(moved):
        current_dims[axis] = index.shape[axis]
        target = _chain_output(c, last) if step == len(moved) - 1 else \
            c.temp(c.type_of(x), current_dims)
        c.emit(Op.GATHER, [current, c.i32(axis), c.vector(picks[axis])], [target])
        current = target
    if not moved:
        c.identity(x, _chain_output(c, last))
    return f"GATHER along axes {moved}" if moved else "the input unchanged"


def _transpose_plan(index: np.ndarray, dims: list[int], perm: list[int]) -> tuple[list[int], list[int]] | None:
    """(dims, perm) of a rank-4 TRANSPOSE whose RESHAPE before and after give ``index``,
    from the chain's one TRANSPOSE (of a ``dims`` tensor by ``perm``) once its size-1
    axes are dropped and its neighbouring axes merged; None when there is none."""
    merged, order = _merged_transpose(dims, perm)
    if not merged or len(merged) > _MAX_RANK or not np.array_equal(
            np.arange(index.size).reshape(merged).transpose(order).reshape(index.shape), index):
        return None
    return merged, order


def _emit_transpose(c: _Converter, last: _Operator, x: int, shape: list[int], index: np.ndarray,
                    merged: list[int], order: list[int]) -> str:
    current = x
    if merged != shape:
        current = c.temp(c.type_of(x), merged)
        c.emit(Op.RESHAPE, [x, c.vector(merged)], [current])
    final = list(index.shape)
    moved = [merged[axis] for axis in order]
    target = _chain_output(c, last) if moved == final else c.temp(c.type_of(x), moved)
    c.emit(Op.TRANSPOSE, [current, c.vector(order)], [target])
    if moved != final:
        c.emit(Op.RESHAPE, [target, c.vector(final)], [_chain_output(c, last)])
    return f"RESHAPE to {merged}, TRANSPOSE {order}, RESHAPE to {final}"


@_converter("SQUEEZE")
def _squeeze(c: _Converter, op: _Operator) -> None:
    if op.inputs[0] in c.complex_parts:
        _reshape_complex(c, op)
        return
    x = c.input(0)
    in_info = op.tensor(0)
    options = op.options("SqueezeOptions")
    dims = [int(d) for d in options.SqueezeDimsAsNumpy()] if options is not None and \
        options.SqueezeDimsLength() else [i for i, d in enumerate(in_info.shape) if d == 1]
    if not dims or len(in_info.shape) == len(dims):
        # Nothing to squeeze, or a squeeze to rank 0 (NNAPI's [1]): a RESHAPE does it.
        c.emit(Op.RESHAPE, [x, c.vector(_operand_shape(op.out_tensor().shape))], [c.output()])
        return
    c.emit(Op.SQUEEZE, [x, c.vector(dims)], [c.output()])


@_converter("EXPAND_DIMS")
def _expand_dims(c: _Converter, op: _Operator) -> None:
    if op.inputs[0] in c.complex_parts:
        _reshape_complex(c, op)
        return
    if _high_rank_chain(c, op) or _high_rank_tree(c, op):
        return
    axis = int(c.const_values(1, "axis").reshape(-1)[0])
    x = c.input(0)
    if len(op.tensor(0).shape) == 0:
        c.emit(Op.RESHAPE, [x, c.vector(_operand_shape(op.out_tensor().shape))], [c.output()])
        return
    c.emit(Op.EXPAND_DIMS, [x, c.i32(axis)], [c.output()])


_REDUCERS = {"MEAN": Op.MEAN, "SUM": Op.REDUCE_SUM, "REDUCE_MAX": Op.REDUCE_MAX, "REDUCE_MIN": Op.REDUCE_MIN,
             "REDUCE_PROD": Op.REDUCE_PROD, "REDUCE_ANY": Op.REDUCE_ANY, "REDUCE_ALL": Op.REDUCE_ALL}


def _reduce(c: _Converter, op: _Operator) -> None:
    code = _REDUCERS[op.name]
    options = op.options("ReducerOptions")
    keep = bool(options.KeepDims()) if options is not None else False
    x = c.input(0)
    axes = c.vector(c.const_values(1, "axes")) if c.const_of(op.inputs[1]) is not None else c.input(1)
    keep_operand = c.i32(int(keep)) if code == Op.MEAN else c.boolean(keep)
    x_type = c.type_of(x)
    out_type = c.nn_type(op.out_tensor())
    requantize = x_type.type in _QUANT8 and (x_type.scale, x_type.zero_point) != (out_type.scale,
                                                                                   out_type.zero_point)
    if not requantize:
        c.emit(code, [x, axes, keep_operand], [c.output()])
        return
    if code != Op.MEAN:
        # TFLite's own kernel refuses this too (its XNNPACK delegate copies the integers).
        raise UnsupportedOperator(f"quantized {op.name} needs the output's scale and zero point equal to the "
                                  "input's")
    if code == Op.MEAN:
        # NNAPI's quantized MEAN keeps the input's scale; TFLite rescales the sum to the
        # output's. The float path computes the exact mean and rounds it once.
        real = c.temp(OperandType(T.TENSOR_FLOAT32, x_type.dimensions))
        c.emit(Op.DEQUANTIZE, [x], [real])
        mean = c.temp(OperandType(T.TENSOR_FLOAT32, out_type.dimensions))
        c.emit(Op.MEAN, [real, axes, keep_operand], [mean])
        c.emit(Op.QUANTIZE, [mean], [c.output()])
        c.lowered("quantized MEAN with an output scale other than the input's: DEQUANTIZE + float MEAN + "
                  "QUANTIZE (one rounding, as TFLite)")
        return


def _requantize(c: _Converter, source: int, target: int) -> None:
    """Re-express a quantized tensor at another scale / zero point / signedness."""
    source_type = c.type_of(source)
    real = c.temp(OperandType(T.TENSOR_FLOAT32, source_type.dimensions))
    c.emit(Op.DEQUANTIZE, [source], [real])
    c.emit(Op.QUANTIZE, [real], [target])


for _name in _REDUCERS:
    _converter(_name)(_reduce)


@_converter("QUANTIZE")
def _quantize(c: _Converter, op: _Operator) -> None:
    x = c.input(0)
    if c.type_of(x).type in _FLOAT_TYPES:
        c.emit(Op.QUANTIZE, [x], [c.output()])
        return
    _requantize(c, x, c.output())
    c.lowered("requantizing QUANTIZE (quantized input): DEQUANTIZE + QUANTIZE")


@_converter("DEQUANTIZE")
def _dequantize(c: _Converter, op: _Operator) -> None:
    const = c.const_of(op.inputs[0])
    if const is not None:
        # float16 (or int8) weights stored compactly: fold into a float32 constant once.
        c.consts[op.outputs[0]] = _dequantize_const(op.tensor(0), const)
        c.lowered(f"constant {op.tensor(0).type_name} tensor dequantized at import")
        return
    x = c.input(0)
    if c.type_of(x).type == T.TENSOR_FLOAT16:
        c.emit(Op.CAST, [x], [c.output()])
        c.lowered("DEQUANTIZE of a float16 tensor as CAST")
        return
    c.emit(Op.DEQUANTIZE, [x], [c.output()])


@_converter("DENSIFY")
def _densify(c: _Converter, op: _Operator) -> None:
    info = op.tensor(0)
    if info.data is None or info.sparsity is None:
        raise UnsupportedOperator("DENSIFY of a tensor that is not a sparse constant")
    dense = _densify_tensor(info)
    op_type = c.nn_type(info)
    c.consts[op.outputs[0]] = _Const(dense, op_type.type, op_type.scale, op_type.zero_point,
                                     c.channel_params(info))
    c.lowered("sparse constant densified at import")


def _densify_tensor(info: _TensorInfo) -> np.ndarray:
    """Expand a TFLite sparse constant (SparsityParameters: traversal order, block map,
    DENSE / SPARSE_CSR dimension metadata) into its dense array."""
    sparsity = info.sparsity
    order = [int(d) for d in sparsity.TraversalOrderAsNumpy()]
    block_map = [int(d) for d in sparsity.BlockMapAsNumpy()] if sparsity.BlockMapLength() else []
    rank = len(info.shape)
    metadata = [sparsity.DimMetadata(i) for i in range(sparsity.DimMetadataLength())]
    values = info.data.reshape(-1)

    def union_values(meta, which: str) -> np.ndarray:
        kind = meta.ArraySegmentsType() if which == "segments" else meta.ArrayIndicesType()
        table = meta.ArraySegments() if which == "segments" else meta.ArrayIndices()
        cls = {1: _tfl.Int32Vector, 2: _tfl.Uint16Vector, 3: _tfl.Uint8Vector}.get(kind)
        if cls is None or table is None:
            raise UnsupportedOperator(f"sparse tensor {info.index} has unreadable {which}")
        vec = cls()
        vec.Init(table.Bytes, table.Pos)
        return np.asarray(vec.ValuesAsNumpy(), np.int64)

    # Dense sizes of each traversal dimension (block dimensions come after the rank ones).
    sizes = [int(meta.DenseSize()) for meta in metadata]
    dense_shape = list(info.shape)
    block_sizes = {}
    for k, original in enumerate(block_map):
        block_sizes[original] = sizes[rank + k]
    out = np.zeros(dense_shape, info.data.dtype)
    position = [0]

    def walk(level: int, index_prefix: list[int], parent: int) -> None:
        meta = metadata[level]
        if meta.Format() == 0:  # DENSE
            children = [(i, parent * sizes[level] + i) for i in range(sizes[level])]
        else:
            segments, indices = union_values(meta, "segments"), union_values(meta, "indices")
            children = [(int(indices[j]), j) for j in range(int(segments[parent]), int(segments[parent + 1]))]
        for coordinate, child in children:
            prefix = [*index_prefix, coordinate]
            if level + 1 == len(metadata):
                original = [0] * rank
                for traversal_level, dim in enumerate(order):
                    if dim < rank:
                        original[dim] += prefix[traversal_level] * block_sizes.get(dim, 1)
                    else:
                        original[block_map[dim - rank]] += prefix[traversal_level]
                out[tuple(original)] = values[position[0]]
                position[0] += 1
            else:
                walk(level + 1, prefix, child)

    walk(0, [], 0)
    return out


@_converter("CAST")
def _cast(c: _Converter, op: _Operator) -> None:
    if op.inputs[0] in c.complex_parts:
        if op.out_tensor().tfl_type != _FLOAT32:
            raise UnsupportedOperator(f"CAST of a complex tensor to {op.out_tensor().type_name}")
        # TFLite's CAST of complex64 keeps the real part (std::real)
        real = c.complex_parts[op.inputs[0]][0]
        c.emit(Op.RESHAPE, [real, c.vector(list(c.type_of(real).dimensions))], [c.output()])
        c.lowered("CAST of RFFT2D's complex result to float32: its real part, as TFLite's CAST")
        return
    # NNAPI's CAST takes no TENSOR_BOOL8: x != 0 makes a bool, SELECT(b, 1, 0) reads one.
    x = c.input(0)
    x_type = c.type_of(x)
    if op.out_tensor().tfl_type == _BOOL and x_type.type != T.TENSOR_BOOL8:
        if x_type.type not in (*_FLOAT_TYPES, T.TENSOR_INT32, *_QUANT8):
            raise UnsupportedOperator(f"CAST of {x_type.type.name} to bool has no NNAPI equivalent")
        zero = np.full(1, x_type.zero_point, x_type.dtype)
        c.emit(Op.NOT_EQUAL, [x, c.const_operand(zero, x_type.with_dimensions([1]))], [c.output()])
        c.lowered("CAST to bool as NOT_EQUAL 0 (NNAPI's CAST takes no TENSOR_BOOL8)")
        return
    if x_type.type == T.TENSOR_BOOL8 and op.out_tensor().tfl_type != _BOOL:
        out = c.output()
        out_type = c.type_of(out)
        if out_type.type not in (*_FLOAT_TYPES, T.TENSOR_INT32) or not x_type.is_fully_specified:
            raise UnsupportedOperator(f"CAST of bool to {out_type.type.name} needs a float or int32 output and a "
                                      "static shape")
        _select_one_zero(c, x, out_type.with_dimensions(list(x_type.dimensions)), out)
        c.lowered("CAST of bool as SELECT(x, 1, 0) (NNAPI's CAST takes no TENSOR_BOOL8)")
        return
    c.emit(Op.CAST, [x], [c.output()])


def _spatial_zero_padding(c: _Converter, op: _Operator) -> tuple[int, int, int, int] | None:
    """(top, bottom, left, right) when the PAD / PADV2 ``op`` pads only the height and
    width of a 4-D tensor with real zeros (0.0, or the zero point when quantized), the
    padding a convolution applies itself; None otherwise."""
    const = c.const_of(op.inputs[1]) if op.has_input(1) else None
    if const is None or const.data.shape != (4, 2) or len(op.tensor(0).shape) != 4:
        return None
    paddings = const.data.astype(np.int64)
    if paddings.min() < 0 or paddings[0].any() or paddings[3].any() or not paddings[1:3].any():
        return None
    info, out = op.tensor(0), op.out_tensor(0)
    if info.tfl_type != out.tfl_type or info.scale != out.scale or info.zero_point != out.zero_point:
        return None
    if op.name == "PADV2" and op.has_input(2):
        value = c.const_of(op.inputs[2])
        if value is None or value.data.size != 1:
            return None
        real_zero = info.zero_point if info.tfl_type in (_UINT8, _INT8) else 0
        if value.data.reshape(-1)[0] != real_zero:
            return None
    return int(paddings[1, 0]), int(paddings[1, 1]), int(paddings[2, 0]), int(paddings[2, 1])


def _pads_into_convolutions(c: _Converter, op: _Operator) -> bool:
    """Fold a spatial zero PAD into the explicit padding of the convolutions reading it
    (the converter writes PAD + VALID convolution for padding SAME cannot express): the
    same values, without materializing the padded copy. Only when every reader is a
    VALID CONV_2D (grouped ones too: GROUPED_CONV_2D takes explicit padding; onnx2tf
    writes a depthwise convolution so, PP-OCRv4's recognizer four of them, ~0.7 ms of
    Pad on nnapi-ort-cpu) or DEPTHWISE_CONV_2D taking it as its input, and the padded
    tensor is no subgraph output."""
    padding = _spatial_zero_padding(c, op)
    tensor = op.outputs[0] if len(op.outputs) == 1 else -1
    readers = c.readers(tensor)
    if padding is None or not readers or tensor in c.graph.outputs:
        return False
    depth = op.tensor(0).shape[3]
    for reader, slot in readers:
        if slot != 0 or reader.custom is not None or reader.name not in ("CONV_2D", "DEPTHWISE_CONV_2D"):
            return False
        options = reader.options("Conv2DOptions" if reader.name == "CONV_2D" else "DepthwiseConv2DOptions")
        if options is None or options.Padding() != 1:  # VALID
            return False
        if reader.name == "CONV_2D" and (len(reader.inputs) < 2 or len(reader.tensor(1).shape) != 4 or
                                         depth <= 0 or reader.tensor(1).shape[3] <= 0 or
                                         depth % reader.tensor(1).shape[3]):
            return False  # unknown depth, or no whole number of groups
    c.folded_pads[tensor] = (op.inputs[0], padding)
    c.lowered("spatial zero padding folded into the explicit padding of the convolution(s) reading it")
    return True


def _data_input(c: _Converter, op: _Operator) -> int:
    """A convolution's input operand: the PAD's input when it reads a folded PAD."""
    folded = c.folded_pads.get(op.inputs[0])
    return c.input(0) if folded is None else c.operand(folded[0])


def _folded_padding(c: _Converter, op: _Operator) -> list[int] | None:
    """For a convolution reading a folded PAD: its explicit padding operands (left, right,
    top, bottom); None when its input is no folded PAD."""
    folded = c.folded_pads.get(op.inputs[0])
    if folded is None:
        return None
    top, bottom, left, right = folded[1]
    c.lowered("reads a PAD folded into its explicit padding")
    return [c.i32(left), c.i32(right), c.i32(top), c.i32(bottom)]


@_converter("PAD", "PADV2")
def _pad(c: _Converter, op: _Operator) -> None:
    if _pads_into_convolutions(c, op):
        return
    x = c.input(0)
    paddings = c.const_values(1, "paddings").astype(np.int32)
    pad = c.const_operand(paddings, OperandType(T.TENSOR_INT32, list(paddings.shape)))
    if op.name == "PADV2" and op.has_input(2):
        value = c.const_values(2, "constant value").reshape(-1)[0]
        x_type = c.type_of(x)
        if x_type.type == T.TENSOR_FLOAT16:
            scalar = c.f16(float(value))
        elif x_type.type == T.TENSOR_FLOAT32:
            scalar = c.f32(float(value))
        else:
            scalar = c.i32(int(value))
        c.emit(Op.PAD_V2, [x, pad, scalar], [c.output()])
        return
    c.emit(Op.PAD, [x, pad], [c.output()])


@_converter("MIRROR_PAD")
def _mirror_pad(c: _Converter, op: _Operator) -> None:
    paddings = c.const_values(1, "paddings").astype(np.int32)
    mode = op.options("MirrorPadOptions").Mode()
    pad = c.const_operand(paddings, OperandType(T.TENSOR_INT32, list(paddings.shape)))
    c.emit(Op.MIRROR_PAD, [c.input(0), pad, c.i32(mode)], [c.output()])


def _int_vector_input(c: _Converter, position: int) -> int:
    const = c.const_of(c.current.inputs[position])
    if const is not None:
        return c.vector(const.data)
    return c.input(position)


@_converter("TRANSPOSE")
def _transpose(c: _Converter, op: _Operator) -> None:
    c.emit(Op.TRANSPOSE, [c.input(0), _int_vector_input(c, 1)], [c.output()])


@_converter("SLICE")
def _slice(c: _Converter, op: _Operator) -> None:
    c.emit(Op.SLICE, [c.input(0), _int_vector_input(c, 1), _int_vector_input(c, 2)], [c.output()])


@_converter("TILE")
def _tile(c: _Converter, op: _Operator) -> None:
    c.emit(Op.TILE, [c.input(0), _int_vector_input(c, 1)], [c.output()])


@_converter("REVERSE_V2")
def _reverse(c: _Converter, op: _Operator) -> None:
    axes = c.const_values(1, "axis").reshape(-1)
    if axes.size != 1:
        raise UnsupportedOperator("NNAPI REVERSE takes exactly one axis")
    x = c.input(0)
    x_type, out_type = c.type_of(x), c.nn_type(op.out_tensor())
    if x_type.type in _QUANT8 and (x_type.scale, x_type.zero_point) != (out_type.scale, out_type.zero_point):
        # TFLite's kernel copies the stored values whatever the two quantizations say (the
        # converter writes such a pair in a bidirectional LSTM); NNAPI's REVERSE keeps the
        # quantization, and CAST, which ignores it, carries the stored values over.
        reversed_ = c.temp(x_type)
        c.emit(Op.REVERSE, [x, c.vector(axes)], [reversed_])
        c.emit(Op.CAST, [reversed_], [c.output()])
        c.lowered("REVERSE_V2 between two quantizations: REVERSE + CAST of the stored values, as TFLite's kernel")
        return
    c.emit(Op.REVERSE, [x, c.vector(axes)], [c.output()])


def _dense_slice_spec(rank: int, begin: np.ndarray, end: np.ndarray, strides: np.ndarray, begin_mask: int,
                      end_mask: int, shrink: int, ellipsis: int, new_axis: int
                      ) -> tuple[list[list[int]], int, int, int, list[bool]]:
    """TensorFlow's sparse slice spec (an ellipsis, new axes, fewer entries than the
    rank) made dense: one (begin, end, stride) and mask bit per input axis, and for each
    output axis whether it is a new size-1 axis (True) or comes from the input (False)."""
    count = len(begin)
    if not ellipsis & ((1 << count) - 1):
        ellipsis |= 1 << count  # a spec shorter than the rank ends in an implicit ellipsis
        count += 1
    elif bin(ellipsis & ((1 << count) - 1)).count("1") > 1:
        raise UnsupportedOperator("STRIDED_SLICE with more than one ellipsis")
    spec: list[list[int]] = []
    dense_begin_mask = dense_end_mask = dense_shrink = 0
    out_axes: list[bool] = []
    for i in range(count):
        bit = 1 << i
        if ellipsis & bit:
            # The ellipsis covers every input axis the entries after it do not name.
            named_after = sum(1 for j in range(i + 1, count) if not new_axis >> j & 1)
            covered = rank - len(spec) - named_after
            if covered < 0:
                raise UnsupportedOperator(f"STRIDED_SLICE names more axes than the input's {rank}")
            for _ in range(covered):
                dense_begin_mask |= 1 << len(spec)
                dense_end_mask |= 1 << len(spec)
                spec.append([0, 0, 1])
                out_axes.append(False)
        elif new_axis & bit:
            out_axes.append(True)  # TensorFlow ignores begin, end, stride and shrink here
        else:
            if len(spec) >= rank:
                raise UnsupportedOperator(f"STRIDED_SLICE names more axes than the input's {rank}")
            axis = len(spec)
            dense_begin_mask |= (begin_mask >> i & 1) << axis
            dense_end_mask |= (end_mask >> i & 1) << axis
            dense_shrink |= (shrink >> i & 1) << axis
            spec.append([int(begin[i]), int(end[i]), int(strides[i])])
            if not shrink >> i & 1:
                out_axes.append(False)
    if len(spec) != rank:
        raise UnsupportedOperator(f"STRIDED_SLICE names {len(spec)} of the input's {rank} axes")
    return spec, dense_begin_mask, dense_end_mask, dense_shrink, out_axes


@_converter("STRIDED_SLICE")
def _strided_slice(c: _Converter, op: _Operator) -> None:
    options = op.options("StridedSliceOptions")
    x = c.input(0)
    in_shape = op.tensor(0).shape
    begin = c.const_values(1, "begin").astype(np.int64).reshape(-1)
    end = c.const_values(2, "end").astype(np.int64).reshape(-1)
    strides = (c.const_values(3, "strides").astype(np.int64).reshape(-1) if op.has_input(3)
               else np.ones_like(begin))
    if not len(begin) == len(end) == len(strides):
        raise UnsupportedOperator(f"STRIDED_SLICE with {len(begin)} begin, {len(end)} end and {len(strides)} "
                                  "stride values")
    ellipsis, new_axis = options.EllipsisMask(), options.NewAxisMask()
    offset = bool(options.Offset()) if hasattr(options, "Offset") else False
    notes = []
    if offset:
        # offset: each end counts from its (unresolved) begin; measured against LiteRT,
        # a negative begin is not wrapped first. Added here once the indices are known.
        if ellipsis or new_axis or options.BeginMask():
            raise UnsupportedOperator("STRIDED_SLICE with offset together with ellipsis, new-axis or begin masks")
        end = begin + end
        notes.append("offset: end = begin + end computed at import")
    rank = len(in_shape)
    # Entries naming an input axis; fewer than the rank means an ellipsis somewhere.
    named = len(begin) - bin(new_axis & ((1 << len(begin)) - 1)).count("1")
    spec, begin_mask, end_mask, shrink, out_axes = _dense_slice_spec(
        rank, begin, end, strides, options.BeginMask(), options.EndMask(), options.ShrinkAxisMask(), ellipsis,
        new_axis)
    begin = np.array([s[0] for s in spec], np.int64)
    end = np.array([s[1] for s in spec], np.int64)
    strides = np.array([s[2] for s in spec], np.int64)
    reasons = []
    for axis in range(rank):
        if shrink >> axis & 1:
            # TFLite ignores end (and stride) on a shrunk axis and takes begin alone;
            # NNAPI reads them, so make the slice [begin, begin + 1) explicitly.
            size = in_shape[axis]
            start = begin[axis] if not begin_mask >> axis & 1 else 0
            if start < 0:
                if size < 0:
                    raise UnsupportedOperator("shrinking an axis of unknown size from a negative index")
                start += size
            if end[axis] != start + 1 or strides[axis] != 1 or begin_mask >> axis & 1 or end_mask >> axis & 1:
                reasons.append(axis)
            begin[axis] = start
            end[axis] = start + 1
            strides[axis] = 1
            begin_mask &= ~(1 << axis)
            end_mask &= ~(1 << axis)
    slice_inputs = [x, c.vector(begin), c.vector(end), c.vector(strides), c.i32(begin_mask), c.i32(end_mask),
                    c.i32(shrink)]
    if reasons:
        notes.append(f"shrink axes {reasons}: TFLite ignores their end, NNAPI needs end = begin + 1; rewritten")
    if ellipsis or named < rank:
        notes.append("ellipsis (or fewer indices than the rank) expanded to full ranges of the axes it covers")
    if any(out_axes):
        out_info = op.out_tensor()
        out_shape = list(out_info.shape)
        if len(out_shape) != len(out_axes) or any(out_shape[i] not in (1, -1) for i, new in
                                                  enumerate(out_axes) if new):
            raise UnsupportedOperator(f"STRIDED_SLICE output shape {out_shape} does not match its new axes")
        out_type = c.nn_type(out_info)
        kept = [d for d, new in zip(out_type.dimensions, out_axes) if not new]
        sliced = c.temp(out_type, kept or [1])
        c.emit(Op.STRIDED_SLICE, slice_inputs, [sliced])
        target = [-1 if d < 0 else 1 if new else d for d, new in zip(out_shape, out_axes)]
        if target.count(-1) > 1:
            raise UnsupportedOperator("new_axis_mask on an output with more than one unknown dimension")
        c.emit(Op.RESHAPE, [sliced, c.vector(target)], [c.output()])
        notes.append(f"new_axis_mask: STRIDED_SLICE + RESHAPE inserting size-1 axes at output positions "
                     f"{[i for i, new in enumerate(out_axes) if new]}")
    else:
        c.emit(Op.STRIDED_SLICE, slice_inputs, [c.output()])
    if notes:
        c.lowered("; ".join(notes))


@_converter("RANK")
def _rank(c: _Converter, op: _Operator) -> None:
    if op.out_tensor().tfl_type != _INT32:
        raise UnsupportedOperator(f"RANK with {op.out_tensor().type_name} output (NNAPI's RANK gives int32)")
    rank = c.add(OperandType(T.INT32))
    c.emit(Op.RANK, [c.input(0)], [rank])
    # TFLite's rank-0 int32 tensor is a [1] tensor here; FILL turns NNAPI's scalar into it.
    c.emit(Op.FILL, [c.vector([1]), rank], [c.output()])
    c.lowered("RANK gives an INT32 scalar; FILL of shape [1] makes it the rank-0 tensor TFLite outputs")


@_converter("GATHER")
def _gather(c: _Converter, op: _Operator) -> None:
    options = op.options("GatherOptions")
    axis = options.Axis() if options is not None else 0
    if options is not None and options.BatchDims():
        raise UnsupportedOperator("GATHER with batch_dims has no NNAPI equivalent")
    x = c.input(0)
    indices_info = op.tensor(1)
    indices = c.input(1)
    if c.type_of(indices).type != T.TENSOR_INT32:
        raise UnsupportedOperator("GATHER indices must be int32 for NNAPI")
    if len(indices_info.shape) > 0:
        c.emit(Op.GATHER, [x, c.i32(axis), indices], [c.output()])
        return
    # A rank-0 index removes the axis; NNAPI's [1] index keeps it with size 1.
    in_shape = list(_operand_shape(op.tensor(0).shape))
    axis_n = axis % len(in_shape)
    kept = [*in_shape[:axis_n], 1, *in_shape[axis_n + 1:]]
    out_type = c.nn_type(op.out_tensor())
    temp = c.temp(out_type, kept)
    c.emit(Op.GATHER, [x, c.i32(axis), indices], [temp])
    if out_type.type not in _FLOAT_TYPES + _QUANT8:
        raise UnsupportedOperator(f"rank-0 GATHER index on {out_type.type.name} (no NNAPI RESHAPE for it)")
    c.emit(Op.RESHAPE, [temp, c.vector(out_type.dimensions)], [c.output()])
    c.lowered("rank-0 index: GATHER with a [1] index keeps the axis, so GATHER + RESHAPE drops it")


@_converter("GATHER_ND")
def _gather_nd(c: _Converter, op: _Operator) -> None:
    """GATHER_ND as GATHER on the params with their first k axes merged: the row index
    sum(index_j * stride_j) from the [..., k] indices (folded at import when constant;
    else SLICE per column, MUL by the stride, ADD, in int32; -1 where any index is outside
    its axis, so that the run fails as LiteRT's does), then RESHAPE to TFLite's output
    shape."""
    params_shape = list(_operand_shape(op.tensor(0).shape))
    indices_shape = list(_operand_shape(op.tensor(1).shape))
    out_type = c.nn_type(op.out_tensor())
    if not indices_shape or 0 in indices_shape or 0 in params_shape or not out_type.is_fully_specified:
        raise UnsupportedOperator("GATHER_ND needs static params and indices shapes")
    k = indices_shape[-1]
    if k > len(params_shape):
        raise UnsupportedOperator(f"GATHER_ND index depth {k} above the params' rank {len(params_shape)}")
    rows = int(np.prod(params_shape[:k]))
    flat_shape = [rows, *params_shape[k:]]
    strides = [int(np.prod(params_shape[j + 1:k])) for j in range(k)]
    params_const = c.const_of(op.inputs[0])
    x_type = c.nn_type(op.tensor(0))
    if x_type.type not in _FLOAT_TYPES + _QUANT8:
        raise UnsupportedOperator(f"GATHER_ND of {x_type.type.name} (no NNAPI RESHAPE for it)")
    if params_const is not None:
        flat = c.const_operand(np.asarray(params_const.data).reshape(flat_shape), x_type.with_dimensions(flat_shape))
    elif flat_shape != params_shape:
        flat = c.temp(x_type, flat_shape)
        c.emit(Op.RESHAPE, [c.input(0), c.vector(flat_shape)], [flat])
    else:
        flat = c.input(0)
    column_shape = [*indices_shape[:-1], 1]
    indices_const = c.const_of(op.inputs[1])
    if indices_const is not None:
        values = np.asarray(indices_const.data).astype(np.int64).reshape(-1, k)
        if (values < 0).any() or (values >= np.array(params_shape[:k])).any():
            raise UnsupportedOperator("GATHER_ND constant index out of the params' range")
        linear = c.const_operand((values @ np.array(strides, np.int64)).astype(np.int32).reshape(column_shape),
                                 OperandType(T.TENSOR_INT32, column_shape))
    else:
        indices = c.input(1)
        if c.type_of(indices).type != T.TENSOR_INT32:
            raise UnsupportedOperator("GATHER_ND indices must be int32 for NNAPI")
        linear = None
        outside = None   # an index outside its axis (LiteRT fails the run): the row index -1 fails GATHER
        int_type, bool_type = OperandType(T.TENSOR_INT32, column_shape), OperandType(T.TENSOR_BOOL8, column_shape)
        for j in range(k):
            if k == 1:
                column = indices
            else:
                column = c.temp(int_type)
                c.emit(Op.SLICE, [indices, c.vector([0] * (len(indices_shape) - 1) + [j]), c.vector(column_shape)],
                       [column])
            below, beyond, either = c.temp(bool_type), c.temp(bool_type), c.temp(bool_type)
            c.emit(Op.LESS, [column, c.const_operand(np.array([0], np.int32), OperandType(T.TENSOR_INT32, [1]))],
                   [below])
            c.emit(Op.GREATER_EQUAL, [column, c.const_operand(np.array([params_shape[j]], np.int32),
                                                              OperandType(T.TENSOR_INT32, [1]))], [beyond])
            c.emit(Op.LOGICAL_OR, [below, beyond], [either])
            if outside is not None:
                joined = c.temp(bool_type)
                c.emit(Op.LOGICAL_OR, [outside, either], [joined])
                either = joined
            outside = either
            if strides[j] != 1:
                scaled = c.temp(OperandType(T.TENSOR_INT32, column_shape))
                c.emit(Op.MUL, [column, c.const_operand(np.array([strides[j]], np.int32),
                                                        OperandType(T.TENSOR_INT32, [1])), c.i32(0)], [scaled])
                column = scaled
            if linear is None:
                linear = column
            else:
                total = c.temp(OperandType(T.TENSOR_INT32, column_shape))
                c.emit(Op.ADD, [linear, column, c.i32(0)], [total])
                linear = total
        checked = c.temp(int_type)
        c.emit(Op.SELECT, [outside, c.const_operand(np.full(column_shape, -1, np.int32), int_type), linear], [checked])
        linear = checked
    gathered_shape = [*column_shape, *params_shape[k:]]
    gathered = c.temp(out_type, gathered_shape)
    c.emit(Op.GATHER, [flat, c.i32(0), linear], [gathered])
    c.emit(Op.RESHAPE, [gathered, c.vector(list(out_type.dimensions) or [1])], [c.output()])
    c.lowered(f"GATHER_ND (index depth {k}) as GATHER of the params with their first {k} axes merged, "
              "the row index sum(index_j * stride_j) in int32 (SLICE, MUL, ADD; folded when constant; -1, failing "
              "the run as LiteRT's, where an index is outside its axis), RESHAPE")


#: the longest axis CUMSUM becomes a matrix for (its [n, n] weights: 4 MiB of float32)
_CUMSUM_MAX = 1024


@_converter("CUMSUM")
def _cumsum(c: _Converter, op: _Operator) -> None:
    """Float CUMSUM along a constant axis of a static shape as FULLY_CONNECTED by a
    triangular 0 / 1 matrix (exclusive: strictly triangular; reverse: the other triangle),
    the axis moved last by TRANSPOSE and back. Every product is exact; the sums round in
    another order than a running sum's. NNAPI has no cumulative sum."""
    options = op.options("CumsumOptions")
    axis = int(c.const_values(1, "axis").reshape(-1)[0])
    shape = list(_operand_shape(op.tensor(0).shape))
    x = c.input(0)
    x_type = c.type_of(x)
    if x_type.type != T.TENSOR_FLOAT32 or 0 in shape or not x_type.is_fully_specified:
        raise UnsupportedOperator("CUMSUM other than of float32 of a static shape has no NNAPI sequence")
    rank = len(shape)
    axis %= rank
    n = shape[axis]
    if n > _CUMSUM_MAX:
        raise UnsupportedOperator(f"CUMSUM along {n} elements (at most {_CUMSUM_MAX} as a matrix)")
    exclusive = bool(options.Exclusive()) if options is not None else False
    reverse = bool(options.Reverse()) if options is not None else False
    out_index, in_index = np.indices((n, n))
    # output j sums inputs i <= j (reverse: i >= j); exclusive leaves out i == j
    weights = (in_index >= out_index) if reverse else (in_index <= out_index)
    if exclusive:
        weights &= in_index != out_index
    perm = [d for d in range(rank) if d != axis] + [axis]
    moved_shape = [shape[d] for d in perm]
    source = x
    if perm != list(range(rank)):
        source = c.temp(x_type, moved_shape)
        c.emit(Op.TRANSPOSE, [x, c.vector(perm)], [source])
    rows = int(np.prod(moved_shape[:-1]))
    flat = c.temp(x_type, [rows, n])
    c.emit(Op.RESHAPE, [source, c.vector([rows, n])], [flat])
    summed = c.temp(x_type, [rows, n])
    matrix = c.const_operand(weights.astype(np.float32), OperandType(T.TENSOR_FLOAT32, [n, n]))
    no_bias = c.const_operand(np.zeros(n, np.float32), OperandType(T.TENSOR_FLOAT32, [n]))
    c.emit(Op.FULLY_CONNECTED, [flat, matrix, no_bias, c.i32(0)], [summed])
    if perm == list(range(rank)):
        c.emit(Op.RESHAPE, [summed, c.vector(shape)], [c.output()])
    else:
        moved = c.temp(x_type, moved_shape)
        c.emit(Op.RESHAPE, [summed, c.vector(moved_shape)], [moved])
        c.emit(Op.TRANSPOSE, [moved, c.vector(list(np.argsort(perm)))], [c.output()])
    c.lowered("CUMSUM as FULLY_CONNECTED by a triangular 0 / 1 matrix (the axis moved last by TRANSPOSE): "
              "NNAPI has no cumulative sum")


@_converter("CALL_ONCE", "VAR_HANDLE", "READ_VARIABLE", "ASSIGN_VARIABLE")
def _resource_variable(c: _Converter, op: _Operator) -> None:
    """Resource variables as the session's state tensors (tflite_variables.py)."""
    convert = {"CALL_ONCE": call_once, "VAR_HANDLE": var_handle, "READ_VARIABLE": read_variable,
               "ASSIGN_VARIABLE": assign_variable}[op.name]
    try:
        convert(c, op)
    except VariableError as error:
        raise UnsupportedOperator(str(error)) from None


@_converter("RFFT2D")
def _rfft2d(c: _Converter, op: _Operator) -> None:
    """RFFT2D over the last axis only (fft_length [1, n], as tf.signal.stft writes it; the
    axis before it of size 1): the real and imaginary parts of the DFT as two
    FULLY_CONNECTEDs by cos / -sin matrices (computed in float64 here, the input cropped or
    zero-padded to n by their rows), kept as the complex tensor's parts for COMPLEX_ABS,
    REAL, IMAG and RESHAPE to read. NNAPI has no FFT and no complex type."""
    fft = c.const_values(1, "fft_length").astype(np.int64).reshape(-1)
    shape = list(_operand_shape(op.tensor(0).shape))
    if len(fft) != 2 or fft[0] != 1 or len(shape) < 2 or shape[-2] != 1 or 0 in shape or fft[1] < 1:
        raise UnsupportedOperator("RFFT2D other than a 1-D transform of the last axis (fft_length [1, n] "
                                  "on an axis of size 1) has no NNAPI sequence")
    if c.type_of(c.input(0)).type != T.TENSOR_FLOAT32:
        raise UnsupportedOperator("RFFT2D of a non-float32 input")
    n, width = int(fft[1]), shape[-1]
    bins = n // 2 + 1
    out_shape = [*shape[:-1], bins]
    declared = op.out_tensor().shape
    if len(declared) != len(out_shape) or any(0 <= d != s for d, s in zip(declared, out_shape)):
        raise UnsupportedOperator(f"RFFT2D's output is declared {list(declared)}; fft_length [1, {n}] of its "
                                  f"input gives {out_shape}")
    rows = int(np.prod(shape[:-1]))
    factors = _rfft_factors(n, width, bins)
    if factors is not None:
        parts = _rfft_factored(c, c.input(0), rows, width, n, factors, out_shape)
        c.complex_parts[op.outputs[0]] = parts
        c.lowered(f"RFFT2D (fft_length [1, {n}]) as two DFT stages of {factors[0]} and {factors[1]} points by "
                  "matrices, the twiddle factors in the second's (two BATCH_MATMULs; NNAPI has no FFT "
                  "or complex type); its complex result kept as real and imaginary parts")
        return
    samples = np.arange(min(width, n))[:, None] * np.arange(bins)[None, :] % n   # exact phase index
    angle = 2 * np.pi * samples / n
    real_w = np.zeros((bins, width), np.float64)
    imag_w = np.zeros((bins, width), np.float64)
    real_w[:, :min(width, n)] = np.cos(angle).T
    imag_w[:, :min(width, n)] = -np.sin(angle).T
    x = c.input(0)
    flat = c.temp(OperandType(T.TENSOR_FLOAT32, [rows, width]))
    c.emit(Op.RESHAPE, [x, c.vector([rows, width])], [flat])
    zero_bias = c.const_operand(np.zeros(bins, np.float32), OperandType(T.TENSOR_FLOAT32, [bins]))
    parts = []
    for weights in (real_w, imag_w):
        w = c.const_operand(weights.astype(np.float32), OperandType(T.TENSOR_FLOAT32, [bins, width]))
        flat_part = c.temp(OperandType(T.TENSOR_FLOAT32, [rows, bins]))
        c.emit(Op.FULLY_CONNECTED, [flat, w, zero_bias, c.i32(0)], [flat_part])
        part = c.temp(OperandType(T.TENSOR_FLOAT32, out_shape))
        c.emit(Op.RESHAPE, [flat_part, c.vector(out_shape)], [part])
        parts.append(part)
    c.complex_parts[op.outputs[0]] = (parts[0], parts[1])
    c.lowered(f"RFFT2D (fft_length [1, {n}]) as two FULLY_CONNECTEDs by the DFT's cos / -sin matrices "
              "(NNAPI has no FFT or complex type); its complex result kept as real and imaginary parts")


def _rfft_factors(n: int, width: int, bins: int) -> tuple[int, int] | None:
    """(n1, n2), n = n1 * n2, for an RFFT of n points in two DFT stages by matrices
    (_rfft_factored), where that takes at most a third of the multiply-adds of one DFT by
    matrices of the ``width`` samples; None otherwise (small or prime n)."""
    direct = 2 * width * bins
    best = None
    for n1 in range(2, n):
        if n % n1:
            continue
        n2 = n // n1
        cost = 2 * n * n2 + 4 * n2 * n1 * (n1 // 2 + 1)  # per row: stage 1 + stage 2
        if best is None or cost < best[0]:
            best = (cost, n1, n2)
    if best is None or 3 * best[0] > direct:
        return None
    return best[1], best[2]


def _rfft_factored(c: _Converter, x: int, rows: int, width: int, n: int, factors: tuple[int, int],
                   out_shape: list[int]) -> tuple[int, int]:
    """The real and imaginary parts of the RFFT of n = n1 * n2 points of ``x`` (``rows``
    rows of ``width`` samples, cropped or zero-padded to n) in two DFT stages (Cooley-Tukey,
    sample m = m1 + n1 * m2, bin k = k2 + n2 * k1), the samples of every row side by side
    (their axis last), so that each stage is one matrix product from the left:

    - stage 1, the n2-point DFTs over m2 of the real samples: [(re, im) k2, m2] @ [m2, (m1, row)];
    - stage 2, for each k2, the n1-point DFTs over m1 of those complex values, times the
      twiddle factors e^(-2 pi i m1 k2 / n), only the k1 up to the last bin: one constant
      matrix [(re, im) k1, (re, im) m1] per k2 (BATCH_MATMUL over k2).

    The transposes between move whole rows of values (the row axis stays last), but for the
    first and last, 2-D. About 4 n (n1 + n2) multiply-adds per row where one DFT by
    matrices takes 2 n (n + 2) (n = 2048: 10x fewer); float32 like it. The matrices are
    computed in float64, phases by exact integer indices."""
    n1, n2 = factors
    bins = n // 2 + 1
    k1s = n1 // 2 + 1  # stage 2 outputs: every bin k = k2 + n2 * k1 up to n / 2
    f32 = T.TENSOR_FLOAT32

    def step(code: OperationCode, inputs: list[int], dims: list[int]) -> int:
        out = c.temp(OperandType(f32, dims))
        c.emit(code, inputs, [out])
        return out

    def const(values: np.ndarray) -> int:
        return c.const_operand(values.astype(np.float32), OperandType(f32, list(values.shape)))

    flat = step(Op.RESHAPE, [x, c.vector([rows, width])], [rows, width])
    if width > n:
        flat = step(Op.SLICE, [flat, c.vector([0, 0]), c.vector([rows, n])], [rows, n])
    elif width < n:
        paddings = c.const_operand(np.array([[0, 0], [0, n - width]], np.int32), OperandType(T.TENSOR_INT32, [2, 2]))
        flat = step(Op.PAD, [flat, paddings], [rows, n])
    samples = step(Op.TRANSPOSE, [flat, c.vector([1, 0])], [n, rows])              # [m, row]
    grid = step(Op.RESHAPE, [samples, c.vector([n2, n1 * rows])], [n2, n1 * rows])  # [m2, (m1, row)]
    theta = 2 * np.pi * ((np.arange(n2)[:, None] * np.arange(n2)[None, :]) % n2) / n2   # [k2, m2]
    first = np.concatenate([np.cos(theta), -np.sin(theta)])                            # [(re, im) k2, m2]
    stage1 = step(Op.BATCH_MATMUL, [const(first), grid, c.boolean(False), c.boolean(False)], [2 * n2, n1 * rows])
    split = step(Op.RESHAPE, [stage1, c.vector([2, n2, n1 * rows])], [2, n2, n1 * rows])
    by_k2 = step(Op.TRANSPOSE, [split, c.vector([1, 0, 2])], [n2, 2, n1 * rows])   # [k2, (re, im), (m1, row)]
    pairs = step(Op.RESHAPE, [by_k2, c.vector([n2, 2 * n1, rows])], [n2, 2 * n1, rows])
    # (a + ib) e^(-i phi) = (a cos + b sin) + i (b cos - a sin), phi = 2 pi (m1 k1 / n1 + m1 k2 / n)
    k2, k1, m1 = np.ogrid[:n2, :k1s, :n1]
    phi = 2 * np.pi * ((m1 * (k1 * n2 + k2)) % n) / n                                  # [k2, k1, m1]
    cos, sin = np.cos(phi), np.sin(phi)
    second = np.concatenate([np.concatenate([cos, sin], axis=2),
                             np.concatenate([-sin, cos], axis=2)], axis=1)            # [k2, (re, im) k1, (re, im) m1]
    stage2 = step(Op.BATCH_MATMUL, [const(second), pairs, c.boolean(False), c.boolean(False)],
                  [n2, 2 * k1s, rows])                                                 # [k2, (re, im) k1, row]
    grouped = step(Op.RESHAPE, [stage2, c.vector([n2, 2, k1s, rows])], [n2, 2, k1s, rows])
    ordered = step(Op.TRANSPOSE, [grouped, c.vector([1, 2, 0, 3])], [2, k1s, n2, rows])  # [(re, im), k1, k2, row]
    spectrum = step(Op.RESHAPE, [ordered, c.vector([2, k1s * n2, rows])], [2, k1s * n2, rows])  # [(re, im), k, row]
    parts = []
    for which in (0, 1):
        kept = step(Op.SLICE, [spectrum, c.vector([which, 0, 0]), c.vector([1, bins, rows])], [1, bins, rows])
        by_bin = step(Op.RESHAPE, [kept, c.vector([bins, rows])], [bins, rows])
        by_row = step(Op.TRANSPOSE, [by_bin, c.vector([1, 0])], [rows, bins])
        parts.append(step(Op.RESHAPE, [by_row, c.vector(out_shape)], out_shape))
    return parts[0], parts[1]


def _complex_input(c: _Converter, op: _Operator) -> tuple[int, int]:
    parts = c.complex_parts.get(op.inputs[0])
    if parts is None:
        raise UnsupportedOperator("complex input not computed by RFFT2D (NNAPI has no complex type)")
    return parts


@_converter("COMPLEX_ABS")
def _complex_abs(c: _Converter, op: _Operator) -> None:
    real, imag = _complex_input(c, op)
    like = c.type_of(real)
    squares = [c.temp(like), c.temp(like)]
    for part, square in zip((real, imag), squares, strict=True):
        c.emit(Op.MUL, [part, part, c.i32(0)], [square])
    total = c.temp(like)
    c.emit(Op.ADD, [*squares, c.i32(0)], [total])
    c.emit(Op.SQRT, [total], [c.output()])
    c.lowered("COMPLEX_ABS of RFFT2D's parts as SQRT(re * re + im * im)")


@_converter("REAL", "IMAG")
def _complex_part(c: _Converter, op: _Operator) -> None:
    part = _complex_input(c, op)[0 if op.name == "REAL" else 1]
    c.emit(Op.RESHAPE, [part, c.vector(list(c.type_of(part).dimensions))], [c.output()])
    c.lowered(f"{op.name} of RFFT2D's result: its {'real' if op.name == 'REAL' else 'imaginary'} part")


@_converter("SPLIT")
def _split(c: _Converter, op: _Operator) -> None:
    axis = int(c.const_values(0, "axis").reshape(-1)[0])
    x = c.operand(op.inputs[1])
    outputs = [c.output(i) for i in range(len(op.outputs))]
    c.emit(Op.SPLIT, [x, c.i32(axis), c.i32(len(outputs))], outputs)


@_converter("SPLIT_V")
def _split_v(c: _Converter, op: _Operator) -> None:
    x = c.input(0)
    sizes = c.const_values(1, "size_splits").astype(np.int64).reshape(-1)
    axis = int(c.const_values(2, "axis").reshape(-1)[0])
    shape = list(_operand_shape(op.tensor(0).shape))
    axis %= len(shape)
    if -1 in sizes:
        sizes[list(sizes).index(-1)] = shape[axis] - (sizes.sum() + 1)
    start = 0
    for i, size in enumerate(sizes):
        begin = [0] * len(shape)
        begin[axis] = start
        size_vector = [-1] * len(shape)
        size_vector[axis] = int(size)
        c.emit(Op.SLICE, [x, c.vector(begin), c.vector(size_vector)], [c.output(i)])
        start += int(size)
    c.lowered(f"SPLIT_V into {len(sizes)} parts as {len(sizes)} SLICE")


@_converter("PACK")
def _pack(c: _Converter, op: _Operator) -> None:
    options = op.options("PackOptions")
    operands = [c.input(i) for i in range(len(op.inputs))]
    if all(len(op.tensor(i).shape) == 0 for i in range(len(op.inputs))):
        # Rank-0 inputs are NNAPI [1] tensors: PACK would give [n, 1], TFLite's output is [n].
        out = c.output()
        out_type = c.type_of(out)
        if out_type.type != T.TENSOR_INT32:
            c.emit(Op.CONCATENATION, [*operands, c.i32(0)], [out])
            c.lowered("PACK of rank-0 tensors (NNAPI [1] tensors) as CONCATENATION")
            return
        # int32 (index arithmetic: [row, column] for GATHER_ND): NNAPI's CONCATENATION takes
        # no int32; each scalar times a constant one-hot vector, summed, is exact.
        total = None
        for i, x in enumerate(operands):
            one_hot = np.zeros(len(operands), np.int32)
            one_hot[i] = 1
            term = out if len(operands) == 1 else c.temp(out_type)
            c.emit(Op.MUL, [x, c.const_operand(one_hot, out_type), c.i32(0)], [term])
            if total is None:
                total = term
                continue
            target = out if i == len(operands) - 1 else c.temp(out_type)
            c.emit(Op.ADD, [total, term, c.i32(0)], [target])
            total = target
        c.lowered("PACK of rank-0 int32 tensors as each times a one-hot vector (MUL), summed (ADD): NNAPI's "
                  "CONCATENATION takes no int32")
        return
    c.emit(Op.PACK, [c.i32(options.Axis()), *operands], [c.output()])


@_converter("UNPACK")
def _unpack(c: _Converter, op: _Operator) -> None:
    options = op.options("UnpackOptions")
    x = c.input(0)
    shape = list(_operand_shape(op.tensor(0).shape))
    axis = options.Axis() % len(shape)
    count = len(op.outputs)
    x_type = c.type_of(x)
    pieces_shape = [*shape[:axis], 1, *shape[axis + 1:]]
    pieces = [c.temp(x_type, pieces_shape) for _ in range(count)]
    c.emit(Op.SPLIT, [x, c.i32(axis), c.i32(count)], pieces)
    for i, piece in enumerate(pieces):
        out_shape = list(_operand_shape(op.out_tensor(i).shape))
        c.emit(Op.RESHAPE, [piece, c.vector(out_shape)], [c.output(i)])
    c.lowered(f"UNPACK as SPLIT into {count} + RESHAPE each (drops the axis)")


@_converter("ARG_MAX", "ARG_MIN")
def _arg(c: _Converter, op: _Operator) -> None:
    axis = int(c.const_values(1, "axis").reshape(-1)[0])
    if op.out_tensor().tfl_type not in (_INT32, _INT64):
        raise UnsupportedOperator(f"{op.name} with {op.out_tensor().type_name} output (NNAPI outputs int32)")
    code = Op.ARGMAX if op.name == "ARG_MAX" else Op.ARGMIN
    if op.out_tensor().tfl_type == _INT64:
        # tf.argmax's default: an index always fits int32, which NNAPI outputs; the tensor
        # stays int32 (readers take it as such; a model output is widened by Session)
        tensor = op.outputs[0]
        out = c.add(OperandType(T.TENSOR_INT32, _operand_shape(op.out_tensor().shape)))
        c.operands[tensor] = out
        c.narrowed.add(tensor)
        c.emit(code, [c.input(0), c.i32(axis)], [out])
        c.lowered(f"{op.name} with int64 output as int32 (an index fits; NNAPI outputs int32)")
        return
    c.emit(code, [c.input(0), c.i32(axis)], [c.output()])


@_converter("TOPK_V2")
def _topk(c: _Converter, op: _Operator) -> None:
    k = int(c.const_values(1, "k").reshape(-1)[0])
    c.emit(Op.TOPK_V2, [c.input(0), c.i32(k)], [c.output(0), c.output(1)])


@_converter("SHAPE")
def _shape(c: _Converter, op: _Operator) -> None:
    shape = op.tensor(0).shape
    if any(d < 0 for d in shape):
        raise UnsupportedOperator(f"SHAPE of a tensor with unknown dimensions {list(shape)} (NNAPI has no "
                                  "SHAPE operation; only a static shape is folded)")
    if not shape:
        raise UnsupportedOperator("SHAPE of a rank-0 tensor is an empty tensor, which NNAPI cannot hold")
    c.consts[op.outputs[0]] = _Const(np.array(shape, np.int32), T.TENSOR_INT32)
    c.lowered(f"SHAPE of a static shape folded to the constant {list(shape)}")


@_converter("BROADCAST_TO")
def _broadcast_to_op(c: _Converter, op: _Operator) -> None:
    dims = _static_shape(c, op.out_tensor())
    if dims is None:
        raise UnsupportedOperator("BROADCAST_TO an unknown shape has no NNAPI equivalent")
    const = c.const_of(op.inputs[0])
    if const is not None and const.channel is None and op.inputs[0] not in c.operands:
        c.consts[op.outputs[0]] = _Const(np.broadcast_to(const.data.reshape(_operand_shape(const.data.shape)), dims)
                                         .copy(), const.code, const.scale, const.zero_point)
        c.lowered("BROADCAST_TO of a constant folded at import")
        return
    c.identity(_broadcast_to(c, op, 0, dims), c.output())
    c.lowered(f"BROADCAST_TO {dims} as RESHAPE / EXPAND_DIMS and TILE (LOGICAL_AND for bool)")


@_converter("CEIL")
def _ceil(c: _Converter, op: _Operator) -> None:
    x = c.input(0)
    x_type = c.type_of(x)
    if x_type.type not in _FLOAT_TYPES:
        raise UnsupportedOperator(f"CEIL of {x_type.type.name}")
    negated, floored = c.temp(x_type), c.temp(x_type)
    c.emit(Op.NEG, [x], [negated])
    c.emit(Op.FLOOR, [negated], [floored])
    c.emit(Op.NEG, [floored], [c.output()])
    c.lowered("CEIL as NEG, FLOOR, NEG (ceil(x) = -floor(-x))")


@_converter("RELU_0_TO_1")
def _relu_0_to_1(c: _Converter, op: _Operator) -> None:
    x = c.input(0)
    x_type = c.type_of(x)
    out = c.output()
    out_type = c.type_of(out)
    if x_type.type not in (*_FLOAT_TYPES, *_QUANT8):
        raise UnsupportedOperator(f"RELU_0_TO_1 of {x_type.type.name}")

    def bound(value: float) -> int:
        if out_type.type in _FLOAT_TYPES:
            return c.const_operand(np.array([value], out_type.dtype), out_type.with_dimensions([1]))
        # the bound in the output's quantization: the clamp of TFLite's kernel, on stored values
        info = np.iinfo(out_type.dtype)
        stored = np.clip(np.round(value / out_type.scale) + out_type.zero_point, info.min, info.max)
        return c.const_operand(np.array([stored], out_type.dtype), out_type.with_dimensions([1]))

    below = c.temp(out_type)
    c.emit(Op.MINIMUM, [x, bound(1.0)], [below])
    c.emit(Op.MAXIMUM, [below, bound(0.0)], [out])
    c.lowered("RELU_0_TO_1 as MINIMUM 1, MAXIMUM 0 (NNAPI has no such activation)")


@_converter("FILL")
def _fill(c: _Converter, op: _Operator) -> None:
    value = c.const_values(1, "value").reshape(-1)[0]
    out_type = c.nn_type(op.out_tensor())
    scalar = {T.TENSOR_FLOAT32: c.f32, T.TENSOR_FLOAT16: c.f16, T.TENSOR_INT32: c.i32}.get(out_type.type)
    if scalar is None:
        raise UnsupportedOperator(f"FILL of {out_type.type.name}")
    c.emit(Op.FILL, [_int_vector_input(c, 0), scalar(value)], [c.output()])


@_converter("RESIZE_BILINEAR", "RESIZE_NEAREST_NEIGHBOR")
def _resize(c: _Converter, op: _Operator) -> None:
    bilinear = op.name == "RESIZE_BILINEAR"
    options = op.options("ResizeBilinearOptions" if bilinear else "ResizeNearestNeighborOptions")
    size = c.const_values(1, "size").reshape(-1)
    code = Op.RESIZE_BILINEAR if bilinear else Op.RESIZE_NEAREST_NEIGHBOR

    def emit(inputs: list[int], out: int) -> None:
        c.emit(code, [inputs[0], c.i32(int(size[1])), c.i32(int(size[0])), c.boolean(False),
                      c.boolean(bool(options.AlignCorners())), c.boolean(bool(options.HalfPixelCenters()))],
               [out])
    x_type = c.type_of(c.input(0))
    if bilinear and x_type.type == T.TENSOR_QUANT8_ASYMM:
        # NNAPI's quantized bilinear blend truncates toward zero (Android's kernel casts);
        # LiteRT rounds it to nearest (every uint8 path: the float32 blend of the stored
        # integers, rounded). Truncation biased every uint8 resize by ~0.5 step against
        # LiteRT. The same blend of the stored integers (CAST keeps them) in float32, then
        # trunc(x + half_below(0.5)) = C's round for x >= 0, CAST back.
        out = c.output()
        stored = c.temp(OperandType(T.TENSOR_FLOAT32, x_type.dimensions))
        c.emit(Op.CAST, [c.input(0)], [stored])
        blend = c.temp(OperandType(T.TENSOR_FLOAT32, c.type_of(out).dimensions))
        emit([stored], blend)
        shifted = c.temp(OperandType(T.TENSOR_FLOAT32, c.type_of(out).dimensions))
        half = c.const_operand(np.array([half_below(np.float32)], np.float32), OperandType(T.TENSOR_FLOAT32, [1]))
        c.emit(Op.ADD, [blend, half, c.i32(0)], [shifted])
        c.emit(Op.CAST, [shifted], [out])
        c.lowered("uint8 RESIZE_BILINEAR as CAST, RESIZE_BILINEAR of the stored integers in float32, + 0.5, CAST "
                  "(LiteRT rounds the blend to nearest; NNAPI's quantized kernel truncates)")
        return
    if bilinear and x_type.type in _QUANT8:
        # int8: LiteRT's builtin kernel blends in fixed point and rounds to nearest, XNNPACK
        # its own way; NNAPI's truncation toward zero pulled values toward 0. The blend of
        # the real values in float32 and one QUANTIZE (round to nearest) is unbiased.
        _in_float32(c, op, emit)
        c.lowered("int8 RESIZE_BILINEAR as DEQUANTIZE, RESIZE_BILINEAR in float32, QUANTIZE (LiteRT rounds "
                  "the blend to nearest; NNAPI's quantized kernel truncates)")
        return
    emit([c.input(0)], c.output())


@_converter("SPACE_TO_DEPTH", "DEPTH_TO_SPACE")
def _space_depth(c: _Converter, op: _Operator) -> None:
    s2d = op.name == "SPACE_TO_DEPTH"
    options = op.options("SpaceToDepthOptions" if s2d else "DepthToSpaceOptions")
    code = Op.SPACE_TO_DEPTH if s2d else Op.DEPTH_TO_SPACE
    c.emit(code, [c.input(0), c.i32(options.BlockSize()), c.boolean(False)], [c.output()])


@_converter("SPACE_TO_BATCH_ND")
def _space_to_batch(c: _Converter, op: _Operator) -> None:
    paddings = c.const_values(2, "paddings").astype(np.int32)
    c.emit(Op.SPACE_TO_BATCH_ND, [c.input(0), c.vector(c.const_values(1, "block shape")),
                                  c.const_operand(paddings, OperandType(T.TENSOR_INT32, list(paddings.shape)))],
           [c.output()])


@_converter("BATCH_TO_SPACE_ND")
def _batch_to_space(c: _Converter, op: _Operator) -> None:
    block = c.vector(c.const_values(1, "block shape"))
    crops = c.const_values(2, "crops").astype(np.int64) if op.has_input(2) else np.zeros((2, 2), np.int64)
    if not crops.any():
        c.emit(Op.BATCH_TO_SPACE_ND, [c.input(0), block, c.boolean(False)], [c.output()])
        return
    out_type = c.nn_type(op.out_tensor())
    shape = list(out_type.dimensions)
    full = [shape[0], shape[1] + int(crops[0].sum()), shape[2] + int(crops[1].sum()), shape[3]]
    temp = c.temp(out_type, full)
    c.emit(Op.BATCH_TO_SPACE_ND, [c.input(0), block, c.boolean(False)], [temp])
    c.emit(Op.SLICE, [temp, c.vector([0, int(crops[0, 0]), int(crops[1, 0]), 0]), c.vector(shape)], [c.output()])
    c.lowered("BATCH_TO_SPACE_ND with crops: NNAPI has none, so BATCH_TO_SPACE_ND + SLICE")


@_converter("EMBEDDING_LOOKUP")
def _embedding_lookup(c: _Converter, op: _Operator) -> None:
    c.emit(Op.EMBEDDING_LOOKUP, [c.input(0), c.input(1)], [c.output()])


@_converter("HASHTABLE_LOOKUP")
def _hashtable_lookup(c: _Converter, op: _Operator) -> None:
    c.emit(Op.HASHTABLE_LOOKUP, [c.input(0), c.input(1), c.input(2)], [c.output(0), c.output(1)])


@_converter("LSH_PROJECTION")
def _lsh(c: _Converter, op: _Operator) -> None:
    kind = op.options("LSHProjectionOptions").Type()
    weight = c.input(2) if op.has_input(2) else c.omitted(OperandType(T.TENSOR_FLOAT32, [0]))
    c.emit(Op.LSH_PROJECTION, [c.input(0), c.input(1), weight, c.i32(kind)], [c.output()])


def _state_in(c: _Converter, op: _Operator, position: int) -> int:
    """The operand of a state input (a variable tensor of the main graph, a model input)."""
    return c.input(position)


def _state_out(c: _Converter, op: _Operator, position: int) -> int:
    """A fresh operand holding the new value of the state input ``position``; the main
    model returns it as a hidden output so the Session can carry the state forward."""
    tensor = op.inputs[position]
    op_type = c.type_of(c.operand(tensor))
    index = c.add(op_type)
    info = op.graph.tensors[tensor]
    if c.top_level and info.is_variable:
        c.state_outputs[tensor] = index
    return index


@_converter("SVDF")
def _svdf(c: _Converter, op: _Operator) -> None:
    options = op.options("SVDFOptions")
    if options.FusedActivationFunction() not in (0, 1, 3):
        raise UnsupportedOperator("SVDF activation")
    x = c.input(0)
    wf = _weights(c, op, 1)
    wt = _weights(c, op, 2)
    units = c.type_of(wf).dimensions[0] // max(options.Rank(), 1)
    bias = c.input(3) if op.has_input(3) else c.const_operand(np.zeros(units, np.float32),
                                                               OperandType(T.TENSOR_FLOAT32, [units]))
    state = _state_in(c, op, 4)
    state_out = _state_out(c, op, 4)
    c.emit(Op.SVDF, [x, wf, wt, bias, state, c.i32(options.Rank()), c.i32(options.FusedActivationFunction())],
           [state_out, c.output()])


@_converter("RNN")
def _rnn(c: _Converter, op: _Operator) -> None:
    options = op.options("RNNOptions")
    state_out = _state_out(c, op, 4)
    c.emit(Op.RNN, [c.input(0), _weights(c, op, 1), _weights(c, op, 2), c.input(3), _state_in(c, op, 4),
                    c.i32(options.FusedActivationFunction())], [state_out, c.output()])


@_converter("UNIDIRECTIONAL_SEQUENCE_RNN")
def _sequence_rnn(c: _Converter, op: _Operator) -> None:
    options = op.options("SequenceRNNOptions")
    state_out = _state_out(c, op, 4)
    c.emit(Op.UNIDIRECTIONAL_SEQUENCE_RNN,
           [c.input(0), _weights(c, op, 1), _weights(c, op, 2), c.input(3), _state_in(c, op, 4),
            c.i32(options.FusedActivationFunction()), c.i32(int(bool(options.TimeMajor())))],
           [c.output(), state_out])


def _lstm_tensors(c: _Converter, op: _Operator, count: int) -> list[int]:
    """Inputs 0..count-1 of a TFLite LSTM, with omitted optional tensors as NO_VALUE."""
    x = c.input(0)
    x_type = c.type_of(x)
    if x_type.type != T.TENSOR_FLOAT32 and x_type.type != T.TENSOR_FLOAT16:
        raise UnsupportedOperator(f"{op.name} on {x_type.type.name} (NNAPI's LSTM is float only)")
    operands = [x]
    for position in range(1, count):
        if op.has_input(position):
            operands.append(_weights(c, op, position))  # states and inputs pass through unchanged
        else:
            operands.append(c.omitted(OperandType(x_type.type, [0])))
    return operands


@_converter("UNIDIRECTIONAL_SEQUENCE_LSTM")
def _sequence_lstm(c: _Converter, op: _Operator) -> None:
    options = op.options("UnidirectionalSequenceLSTMOptions")
    if hasattr(options, "DiagonalRecurrentTensors") and options.DiagonalRecurrentTensors():
        raise UnsupportedOperator("diagonal recurrent weights (one value per unit) have no NNAPI equivalent")
    if op.tensor(0).tfl_type == _INT8:
        _integer_sequence_lstm(c, op, options)
        return
    operands = _lstm_tensors(c, op, 24)
    x_type = c.type_of(operands[0])
    layer_norm = operands[20:24]
    state_outputs = [_state_out(c, op, 18), _state_out(c, op, 19)]
    scalar = c.f16 if x_type.type == T.TENSOR_FLOAT16 else c.f32
    c.emit(Op.UNIDIRECTIONAL_SEQUENCE_LSTM,
           [*operands[:20], c.i32(options.FusedActivationFunction()), scalar(options.CellClip()),
            scalar(options.ProjClip()), c.boolean(bool(options.TimeMajor())), *layer_norm],
           [c.output(), *state_outputs])


@_converter("BIDIRECTIONAL_SEQUENCE_LSTM")
def _bidirectional_lstm(c: _Converter, op: _Operator) -> None:
    options = op.options("BidirectionalSequenceLSTMOptions")
    operands = _lstm_tensors(c, op, 48)
    x_type = c.type_of(operands[0])
    scalar = c.f16 if x_type.type == T.TENSOR_FLOAT16 else c.f32
    layer_norm = [c.omitted(OperandType(x_type.type, [0])) for _ in range(8)]
    outputs = [c.output(i) for i in range(len(op.outputs))]
    states = [_state_out(c, op, position) for position in (35, 36, 37, 38)]
    c.emit(Op.BIDIRECTIONAL_SEQUENCE_LSTM,
           [*operands, c.i32(options.FusedActivationFunction()), scalar(options.CellClip()),
            scalar(options.ProjClip()), c.boolean(bool(options.MergeOutputs())), c.boolean(bool(options.TimeMajor())),
            *layer_norm], [*outputs, *states])


@_converter("BIDIRECTIONAL_SEQUENCE_RNN")
def _bidirectional_rnn(c: _Converter, op: _Operator) -> None:
    options = op.options("BidirectionalSequenceRNNOptions")
    x = c.input(0)
    x_type = c.type_of(x)
    operands = [x]
    for position in range(1, 12):
        if op.has_input(position):
            operands.append(_weights(c, op, position))
        else:
            operands.append(c.omitted(OperandType(x_type.type, [0])))
    outputs = [c.output(i) for i in range(len(op.outputs))]
    states = [_state_out(c, op, 4), _state_out(c, op, 8)]
    c.emit(Op.BIDIRECTIONAL_SEQUENCE_RNN,
           [*operands, c.i32(options.FusedActivationFunction()), c.boolean(bool(options.TimeMajor())),
            c.boolean(bool(options.MergeOutputs()))], [*outputs, *states])


@_converter("LSTM")
def _lstm(c: _Converter, op: _Operator) -> None:
    options = op.options("LSTMOptions")
    if options.KernelType() != 0:
        _basic_lstm(c, op, options)
        return
    if op.tensor(0).tfl_type == _INT8:
        _integer_lstm(c, op, options)
        return
    operands = _lstm_tensors(c, op, 24)
    x_type = c.type_of(operands[0])
    batch = x_type.dimensions[0]
    units = c.type_of(operands[4]).dimensions[0]
    cifg = not op.has_input(1)
    scratch = c.add(OperandType(x_type.type, [batch, units * (3 if cifg else 4)]))
    scalar = c.f16 if x_type.type == T.TENSOR_FLOAT16 else c.f32
    layer_norm = operands[20:24] if any(op.has_input(i) for i in range(20, 24)) else []
    c.emit(Op.LSTM, [*operands[:20], c.i32(options.FusedActivationFunction()), scalar(options.CellClip()),
                     scalar(options.ProjClip()), *layer_norm],
           [scratch, _state_out(c, op, 18), _state_out(c, op, 19), c.output()])


# --- TFLite's integer LSTMs -> QUANTIZED_LSTM / QUANTIZED_16BIT_LSTM ----------------------
# TFLite's full LSTM kernel and NNAPI's QUANTIZED_LSTM number inputs 0-23 alike: input,
# input-to-gate weights (i, f, c, o), recurrent weights, peepholes (i, f, o), gate biases,
# projection weights and bias, output state, cell state, layer-norm weights.
_LSTM_INPUT, _LSTM_OUTPUT_STATE, _LSTM_CELL_STATE = 0, 18, 19
_LSTM_INT8_WEIGHTS = (1, 2, 3, 4, 5, 6, 7, 8, 16)
_LSTM_INT16_WEIGHTS = (9, 10, 11, 20, 21, 22, 23)
_LSTM_BIASES = (12, 13, 14, 15, 17)
_LSTM_LAYER_NORM = (20, 21, 22, 23)
# The operator's intermediates: the four gates' matmul scales (read with layer norm) and
# the hidden state's scale and zero point.
_HIDDEN_INTERMEDIATE = 4


def _integer_lstm_operands(c: _Converter, op: _Operator, options: Any) -> list[int]:
    """QUANTIZED_LSTM's inputs 1-17 and 20-31 (0, 18 and 19 are left as None) for TFLite's
    fully-integer (8x8_16) LSTM, checking every place the two kernels could disagree."""
    cell = op.tensor(_LSTM_CELL_STATE)
    if cell.tfl_type != _INT16:
        raise UnsupportedOperator(f"cell state {_LSTM_CELL_STATE} ({cell.name}) is {cell.type_name} (TFLite's 8x8_8 "
                                  "kernel): NNAPI's QUANTIZED_LSTM keeps an int16 cell state")
    if options.FusedActivationFunction() != _ACT_TANH:
        raise UnsupportedOperator("an integer LSTM with a cell activation other than TANH")
    for position in (_LSTM_INPUT, _LSTM_OUTPUT_STATE):
        info = op.tensor(position)
        if info.tfl_type != _INT8 or info.scales is None or info.per_channel:
            raise UnsupportedOperator(f"input {position} ({info.name}) must be int8 quantized per tensor")
    operands: list[int | None] = [None] * 32
    for position in range(1, 24):
        if position in (_LSTM_OUTPUT_STATE, _LSTM_CELL_STATE):
            continue
        if position in _LSTM_INT8_WEIGHTS:
            code, tfl_type = T.TENSOR_QUANT8_SYMM, _INT8
        elif position in _LSTM_INT16_WEIGHTS:
            code, tfl_type = T.TENSOR_QUANT16_SYMM, _INT16
        else:
            code, tfl_type = T.TENSOR_INT32, _INT32
        if not op.has_input(position):
            # An omitted quantized operand still needs a valid scale to be declared.
            operands[position] = c.omitted(OperandType(code, [0], 0.0 if code == T.TENSOR_INT32 else 1.0))
            continue
        info = op.tensor(position)
        if info.data is None or info.is_variable:
            raise UnsupportedOperator(f"input {position} ({info.name}) of an integer LSTM must be a constant")
        if info.tfl_type != tfl_type or (code != T.TENSOR_INT32 and (info.scales is None or info.per_channel
                                                                      or info.zero_point != 0)):
            raise UnsupportedOperator(f"input {position} ({info.name}) is {info.type_name}"
                                      f"{' per-channel' if info.per_channel else ''}; the integer LSTM needs "
                                      f"{_TYPE_NAMES[tfl_type]}"
                                      f"{'' if code == T.TENSOR_INT32 else ' quantized symmetrically per tensor'}")
        scale = info.scale if code != T.TENSOR_INT32 or (info.scales is not None and len(info.scales) == 1) else 0.0
        operands[position] = c.const_operand(info.data, OperandType(code, _operand_shape(info.shape), scale, 0))
    units = op.tensor(2).shape[0] if len(op.tensor(2).shape) == 2 else -1
    output_size = op.tensor(_LSTM_OUTPUT_STATE).shape[-1]
    if op.has_input(10) and units != output_size:
        # TFLite's (and Android's) integer peephole walks the cell state as if it had the
        # output's width; the reference QUANTIZED_LSTM reads it per unit.
        raise UnsupportedOperator(f"peephole weights with a projection to {output_size} of {units} units: TFLite's "
                                  "integer kernel applies them over the output width, NNAPI's over the units")
    layer_norm = op.has_input(21)
    for position in _LSTM_LAYER_NORM if layer_norm else ():
        if not op.has_input(position):
            continue
        # TFLite replaces a variance below 1 by max(1, int(10000 * scale)), Android's
        # kernel (which NNAPI's QUANTIZED_LSTM follows) by min(1, ...); 0 and 1 both leave
        # the gate undivided, so they agree exactly while int(10000 * scale) < 2.
        guard = int(np.float32(10000) * np.float32(op.tensor(position).scale))
        if guard >= 2:
            raise UnsupportedOperator(f"layer-norm weights {position} ({op.tensor(position).name}) have scale "
                                      f"{op.tensor(position).scale:g}: TFLite's variance guard ({guard}) differs "
                                      "from NNAPI's (at most 1)")
    intermediates = [int(i) for i in op.raw.IntermediatesAsNumpy()] if op.raw.IntermediatesLength() else []
    needed = 5
    if len(intermediates) < needed:
        raise UnsupportedOperator(f"an integer LSTM needs {needed} intermediates (gate and hidden-state scales), "
                                  f"the operator has {len(intermediates)}")
    scales = []
    for i in range(_HIDDEN_INTERMEDIATE + 1):
        info = op.graph.tensors[intermediates[i]]
        # Without layer norm TFLite takes the gates' scales as 2**-12 and ignores those
        # intermediates (the converter leaves them unquantized); the hidden one it reads.
        if (layer_norm or i == _HIDDEN_INTERMEDIATE) and (info.scales is None or info.per_channel):
            raise UnsupportedOperator(f"intermediate {i} ({info.name}) has no per-tensor quantization")
        scales.append(info)
    gate_scales = [info.scale if layer_norm else 2.0**-12 for info in scales[:4]]
    hidden = scales[_HIDDEN_INTERMEDIATE]
    proj_clip = float(options.ProjClip())
    if proj_clip > 0 and op.has_input(16):
        # TFLite measures the projection clip in steps of the output's scale; Android's
        # kernel in steps of the projection weights' scale: pass the clip that gives
        # TFLite's integer threshold there (half a step up, as both truncate).
        threshold = int(min(max(np.float32(proj_clip) / np.float32(op.out_tensor().scale), -128.0), 127.0))
        proj_clip = (threshold + 0.5) * op.tensor(16).scale if threshold > 0 else 0.0
    # TFLite adds the hidden state's zero point after o * tanh(c); Android's kernel (so
    # QUANTIZED_LSTM) subtracts input 30 there, and its projection undoes whichever was
    # applied: the negated zero point gives TFLite's values.
    operands[24:32] = [c.f32(float(options.CellClip())), c.f32(proj_clip), *(c.f32(s) for s in gate_scales),
                       c.i32(-hidden.zero_point), c.f32(hidden.scale)]
    return operands


def _integer_lstm(c: _Converter, op: _Operator, options: Any) -> None:
    operands = _integer_lstm_operands(c, op, options)
    operands[_LSTM_INPUT] = c.input(_LSTM_INPUT)
    operands[_LSTM_OUTPUT_STATE] = _state_in(c, op, _LSTM_OUTPUT_STATE)
    operands[_LSTM_CELL_STATE] = _state_in(c, op, _LSTM_CELL_STATE)
    c.emit(Op.QUANTIZED_LSTM, operands, [_state_out(c, op, _LSTM_OUTPUT_STATE), _state_out(c, op, _LSTM_CELL_STATE),
                                         c.output()])
    c.lowered("fully-integer LSTM (int16 cell state) as QUANTIZED_LSTM with the operator's intermediate scales")


def _integer_sequence_lstm(c: _Converter, op: _Operator, options: Any) -> None:
    """TFLite's integer UNIDIRECTIONAL_SEQUENCE_LSTM unrolled over its static time axis:
    the input viewed as [time * batch, input] (time-major) or [batch, time * input]
    (batch-major) and SPLIT into the steps, one QUANTIZED_LSTM per step threading the
    states, the step outputs concatenated the same way and viewed back (TFLite copies each
    step's output state raw into the output)."""
    operands = _integer_lstm_operands(c, op, options)
    time_major = bool(options.TimeMajor())
    x_info, y_info = op.tensor(_LSTM_INPUT), op.out_tensor()
    if len(x_info.shape) != 3 or any(d < 0 for d in (*x_info.shape, *y_info.shape)):
        raise UnsupportedOperator("an integer sequence LSTM needs a static [batch, time, input] shape to unroll")
    steps, batch = (x_info.shape[0], x_info.shape[1]) if time_major else (x_info.shape[1], x_info.shape[0])
    input_size, output_size = x_info.shape[2], y_info.shape[2]
    x_type, y_type = c.nn_type(x_info), c.nn_type(y_info)
    # Row-major views in which the steps are blocks along one axis: axis 0 when time-major.
    axis = 0 if time_major else 1
    flat = [steps * batch, input_size] if time_major else [batch, steps * input_size]
    pieces = [c.temp(x_type, [batch, input_size]) for _ in range(steps)]
    if steps == 1:
        c.emit(Op.RESHAPE, [c.input(_LSTM_INPUT), c.vector([batch, input_size])], pieces)
    else:
        viewed = c.temp(x_type, flat)
        c.emit(Op.RESHAPE, [c.input(_LSTM_INPUT), c.vector(flat)], [viewed])
        c.emit(Op.SPLIT, [viewed, c.i32(axis), c.i32(steps)], pieces)
    state = _state_in(c, op, _LSTM_OUTPUT_STATE)
    cell = _state_in(c, op, _LSTM_CELL_STATE)
    state_type, cell_type = c.type_of(state), c.type_of(cell)
    outputs = []
    for step, piece in enumerate(pieces):
        last = step == steps - 1
        new_state = _state_out(c, op, _LSTM_OUTPUT_STATE) if last else c.temp(state_type)
        new_cell = _state_out(c, op, _LSTM_CELL_STATE) if last else c.temp(cell_type)
        step_output = c.temp(y_type, [batch, output_size])
        inputs = list(operands)
        inputs[_LSTM_INPUT], inputs[_LSTM_OUTPUT_STATE], inputs[_LSTM_CELL_STATE] = piece, state, cell
        c.emit(Op.QUANTIZED_LSTM, inputs, [new_state, new_cell, step_output])
        state, cell = new_state, new_cell
        outputs.append(step_output)
    joined = outputs[0]
    if steps > 1:
        joined = c.temp(y_type, [steps * batch, output_size] if time_major else [batch, steps * output_size])
        c.emit(Op.CONCATENATION, [*outputs, c.i32(axis)], [joined])
    c.emit(Op.RESHAPE, [joined, c.vector(y_info.shape)], [c.output()])
    c.lowered(f"fully-integer sequence LSTM unrolled over its {steps} time steps: RESHAPE + SPLIT into steps, "
              "QUANTIZED_LSTM per step with the operator's intermediate scales, CONCATENATION + RESHAPE")


# TFLite's basic LSTM kernel: concatenated weights [4 * units, input + units] in gate order
# input, cell, forget, output; NNAPI's LSTMs take one matrix per gate, in the order
# input, forget, cell, output.
_BASIC_INPUT, _BASIC_PREV_ACTIVATION, _BASIC_WEIGHTS, _BASIC_BIAS, _BASIC_PREV_STATE = 0, 1, 2, 3, 4
_BASIC_GATES = ("input", "cell", "forget", "output")
_NNAPI_GATE_ORDER = ("input", "forget", "cell", "output")


def _basic_lstm(c: _Converter, op: _Operator, options: Any) -> None:
    """TFLite's BASIC LSTM kernel: one weight matrix over [input, previous output] and one
    bias, gate blocks input, cell, forget, output; float32 -> LSTM, uint8 -> QUANTIZED_16BIT_LSTM."""
    if len(op.inputs) != 5:
        raise UnsupportedOperator(f"a BASIC LSTM with {len(op.inputs)} inputs (expected 5)")
    x_info = op.tensor(_BASIC_INPUT)
    if x_info.tfl_type not in (_FLOAT32, _UINT8):
        raise UnsupportedOperator(f"the BASIC LSTM kernel on {x_info.type_name} has no NNAPI equivalent (LSTM takes "
                                  "float, QUANTIZED_16BIT_LSTM uint8)")
    for position in (_BASIC_WEIGHTS, _BASIC_BIAS):
        if op.tensor(position).data is None:
            raise UnsupportedOperator(f"input {position} ({op.tensor(position).name}) of a BASIC LSTM must be a "
                                      "constant")
    weights_info, bias_info = op.tensor(_BASIC_WEIGHTS), op.tensor(_BASIC_BIAS)
    rows, columns = weights_info.shape
    units = rows // 4
    input_size = columns - units
    # The two temporaries TFLite also writes (the concatenated input and the gate
    # activations) have no NNAPI counterpart; nothing may read them.
    for position in range(2, len(op.outputs)):
        tensor = op.outputs[position]
        if tensor >= 0 and (tensor in op.graph.outputs or c.readers(tensor)):
            raise UnsupportedOperator(f"output {position} ({op.graph.tensors[tensor].name}), a kernel temporary, is "
                                      "read; NNAPI's LSTMs do not produce it")
    blocks = {gate: weights_info.data[i * units:(i + 1) * units] for i, gate in enumerate(_BASIC_GATES)}
    biases = {gate: bias_info.data[i * units:(i + 1) * units] for i, gate in enumerate(_BASIC_GATES)}
    weight_type, bias_type = c.nn_type(weights_info), c.nn_type(bias_info).with_dimensions([units])
    if x_info.tfl_type == _FLOAT32:
        if options.FusedActivationFunction() != _ACT_TANH or options.CellClip() or options.ProjClip():
            raise UnsupportedOperator("a float BASIC LSTM computes with tanh and no clipping only")
        # TFLite's kernel multiplies [input, previous output]: the first input_size columns
        # are the input weights.
        order = _NNAPI_GATE_ORDER
        x_weights = [c.const_operand(np.ascontiguousarray(blocks[g][:, :input_size]),
                                     weight_type.with_dimensions([units, input_size])) for g in order]
        h_weights = [c.const_operand(np.ascontiguousarray(blocks[g][:, input_size:]),
                                     weight_type.with_dimensions([units, units])) for g in order]
        bias_operands = [c.const_operand(biases[g], bias_type) for g in order]
        absent = [c.omitted(OperandType(T.TENSOR_FLOAT32, [0])) for _ in range(5)]  # peepholes, projection
        batch = x_info.shape[0]
        scratch = c.add(OperandType(T.TENSOR_FLOAT32, [max(batch, 0), 4 * units]))
        state_out = c.add(OperandType(T.TENSOR_FLOAT32, [max(batch, 0), units]))
        c.emit(Op.LSTM, [c.input(_BASIC_INPUT), *x_weights, *h_weights, *absent[:3], *bias_operands, *absent[3:],
                         c.input(_BASIC_PREV_ACTIVATION), c.input(_BASIC_PREV_STATE), c.i32(_ACT_TANH), c.f32(0.0),
                         c.f32(0.0)], [scratch, state_out, c.output(1), c.output(0)])
        c.lowered("float BASIC LSTM as LSTM: concatenated weights and biases split per gate")
        return
    # As TFLite's NNAPI delegate splits them: the first `units` columns are the recurrent
    # weights, the rest the input weights; QUANTIZED_16BIT_LSTM concatenates them back in
    # that order and multiplies by [input, previous output], as TFLite's kernel does.
    input_weights = [c.const_operand(np.ascontiguousarray(blocks[g][:, units:]),
                                     weight_type.with_dimensions([units, input_size])) for g in _NNAPI_GATE_ORDER]
    recurrent_weights = [c.const_operand(np.ascontiguousarray(blocks[g][:, :units]),
                                         weight_type.with_dimensions([units, units])) for g in _NNAPI_GATE_ORDER]
    bias_operands = [c.const_operand(biases[g], bias_type) for g in _NNAPI_GATE_ORDER]
    c.emit(Op.QUANTIZED_16BIT_LSTM,
           [c.input(_BASIC_INPUT), *input_weights, *recurrent_weights, *bias_operands, c.input(_BASIC_PREV_STATE),
            c.input(_BASIC_PREV_ACTIVATION)], [c.output(1), c.output(0)])
    c.lowered("uint8 BASIC LSTM as QUANTIZED_16BIT_LSTM: concatenated weights and biases split per gate")


@_converter("WHILE")
def _while(c: _Converter, op: _Operator) -> None:
    if not c.importer.keep_loops and keras_while_lstm(c, op):
        return
    options = op.options("WhileOptions")
    cond = c.importer.subgraph(options.CondSubgraphIndex())
    body = c.importer.subgraph(options.BodySubgraphIndex())
    cond_operand = c.add(OperandType(T.MODEL))
    c.model.set_operand_value_from_model(cond_operand, cond.model)
    body_operand = c.add(OperandType(T.MODEL))
    c.model.set_operand_value_from_model(body_operand, body.model)
    inputs = [c.input(i) for i in range(len(op.inputs))]
    outputs = [c.output(i) for i in range(len(op.outputs))]
    c.emit(Op.WHILE, [cond_operand, body_operand, *inputs], outputs)


@_converter("IF")
def _if(c: _Converter, op: _Operator) -> None:
    options = op.options("IfOptions")
    then_model = c.importer.subgraph(options.ThenSubgraphIndex())
    else_model = c.importer.subgraph(options.ElseSubgraphIndex())
    branches = []
    for branch in (then_model, else_model):
        operand = c.add(OperandType(T.MODEL))
        c.model.set_operand_value_from_model(operand, branch.model)
        branches.append(operand)
    inputs = [c.input(i) for i in range(1, len(op.inputs))]
    outputs = [c.output(i) for i in range(len(op.outputs))]
    c.emit(Op.IF, [c.input(0), *branches, *inputs], outputs)


__all__ = ["load_tflite"]
