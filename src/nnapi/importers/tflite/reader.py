"""TFLite import: reading the flatbuffer (operator codes, buffers, subgraphs, tensors) and its
schema's constants; the shapes and types the converters start from.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from nnapi.codes import OperandCode as T
from nnapi.codes import OperationCode as Op
from nnapi.errors import BadDataError, NnapiError
from nnapi.importers import SourceOp

if TYPE_CHECKING:  # (that module imports this one)
    from nnapi.importers.tflite.converter import _Converter


try:  # the optional extra nnapi[tflite]
    import tflite as _tfl
    from tflite.utils import BUILTIN_OPCODE2NAME as _OPCODE_NAMES
except ImportError:  # pragma: no cover - exercised only without the extra
    _tfl = None
    _OPCODE_NAMES = {}

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


def _given_shape(name: str, static: tuple[int, ...], raw: Any, given: tuple[int, ...]) -> tuple[int, ...]:
    """An input's shape as given: its rank and the dimensions its signature fixes must match."""
    signature = tuple(int(d) for d in raw.ShapeSignatureAsNumpy()) if raw.ShapeSignatureLength() else static
    if len(given) != len(signature) or any(0 <= s != g for s, g in zip(signature, given)):
        raise UnsupportedOperator(f"input {name!r} is {list(signature)} (-1 open); input_shapes gives "
                                  f"{list(given)}")
    return given


#: element-wise operators whose output has the shape their inputs broadcast to (numpy's rule)
_BROADCASTING = frozenset({
    "ADD", "SUB", "MUL", "DIV", "MAXIMUM", "MINIMUM", "POW", "SQUARED_DIFFERENCE", "FLOOR_DIV", "FLOOR_MOD",
    "LESS", "LESS_EQUAL", "GREATER", "GREATER_EQUAL", "EQUAL", "NOT_EQUAL", "LOGICAL_AND", "LOGICAL_OR",
    "SELECT", "SELECT_V2"})


#: operators whose output shape moves their input's elements: RESHAPE, SQUEEZE, EXPAND_DIMS
_MOVES = frozenset({"RESHAPE", "SQUEEZE", "EXPAND_DIMS"})


def _derive_output_shape(c: _Converter, op: _Operator) -> None:
    """The output shape of an element-wise operator (_BROADCASTING: its inputs' shapes
    broadcast) or of a move (_MOVES: from its input's shape and its parameters), before its
    converter reads it, where the file left dimensions of it open and the inputs' shapes are
    known (propagated shapes: the input shapes given fix them). Nothing is derived from
    inputs or parameters that do not fit (their converter refuses them), and a derived
    shape replaces only open dimensions."""
    out = op.out_tensor()
    sources = [op.tensor(k).shape for k in range(len(op.inputs)) if op.has_input(k)] \
        if op.name in _BROADCASTING else [op.tensor(0).shape]
    if all(d >= 0 for d in out.shape) or any(d < 0 for shape in sources for d in shape):
        return
    try:
        shape = np.broadcast_shapes(*sources) if op.name in _BROADCASTING else _moved_shape(c, op, sources[0])
    except (ValueError, TypeError, ZeroDivisionError):
        return
    if shape is not None and len(shape) == len(out.shape) and all(d < 0 or d == s for d, s in zip(out.shape, shape)):
        out.shape = tuple(int(d) for d in shape)


def _moved_shape(c: _Converter, op: _Operator, source: tuple[int, ...]) -> tuple[int, ...] | None:
    """RESHAPE's, SQUEEZE's or EXPAND_DIMS's output shape from its input's (all known) and
    its parameters; None where a parameter is given at run time only."""
    if op.name == "RESHAPE":
        const = c.const_of(op.inputs[1]) if op.has_input(1) else None
        options = op.options("ReshapeOptions")
        new = const.data.reshape(-1) if const is not None else \
            options.NewShapeAsNumpy() if options is not None and options.NewShapeLength() else None
        if new is None:
            return None
        size = int(np.prod(source, dtype=np.int64))
        return np.empty(size, np.int8).reshape([int(d) for d in new]).shape
    if op.name == "SQUEEZE":
        options = op.options("SqueezeOptions")
        rank = len(source)
        axes = {int(d) % rank for d in options.SqueezeDimsAsNumpy()} if options is not None and \
            options.SqueezeDimsLength() else {i for i, d in enumerate(source) if d == 1}
        return tuple(d for i, d in enumerate(source) if i not in axes)
    const = c.const_of(op.inputs[1])
    if const is None:
        return None
    axis = int(const.data.reshape(-1)[0])
    axis = axis + len(source) + 1 if axis < 0 else axis
    return (*source[:axis], 1, *source[axis:])


def _static_shape(c: _Converter, info: _TensorInfo) -> list[int] | None:
    return list(_operand_shape(info.shape)) if all(d >= 0 for d in info.shape) else None


#: the tensor types NNAPI's RESHAPE takes (others are reshaped by _reshape_other_type)
_RESHAPE_TYPES = (*_FLOAT_TYPES, *_QUANT8)
