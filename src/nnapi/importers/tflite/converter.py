"""TFLite import: the converter of one subgraph (operands, constants, emitted operations, the
operator loop) and the registry of operator converters (``_converter``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from nnapi.codes import OperandCode, OperationCode
from nnapi.codes import OperandCode as T
from nnapi.codes import OperationCode as Op
from nnapi.errors import BadDataError, NnapiError
from nnapi.importers import ImportedModel, Lowering, SourceOp, StateSpec, TensorSpec
from nnapi.importers.tflite.float_moves import _MOVES_BOOL, _MOVES_DATA, _int32_concatenation, _through_float32
from nnapi.importers.tflite.fold import folded_values
from nnapi.importers.tflite.reader import (
    _ACT_NAMES,
    _ACT_TANH,
    _BOOL,
    _BROADCASTING,
    _FLOAT16,
    _FLOAT32,
    _FLOAT64,
    _FUSE_AS_OP,
    _INT8,
    _INT16,
    _INT32,
    _INT64,
    _MOVES,
    _NUMPY,
    _OPCODE_NAMES,
    _UINT8,
    UnsupportedOperator,
    _derive_output_shape,
    _Graph,
    _operand_shape,
    _Operator,
    _TensorInfo,
)
from nnapi.importers.tflite.variables import variable_states
from nnapi.model import Model
from nnapi.operand import OperandType, SymmPerChannelQuantParams
from nnapi.operations.quant_math import dequantize

if TYPE_CHECKING:  # (that module imports this one)
    from nnapi.importers.tflite.load import _Importer


@dataclass
class _Const:
    """A constant known to the importer (a buffer, or a folded DEQUANTIZE / DENSIFY)."""

    data: np.ndarray
    code: OperandCode
    scale: float = 0.0
    zero_point: int = 0
    channel: SymmPerChannelQuantParams | None = None


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
        #: resource variables (variables.py): VAR_HANDLE tensor -> (container, shared
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
        #: operands broadcast for operations that do not broadcast (_broadcast_to), by
        #: (source operand, shape): a mask read by every layer's SELECT_V2 is broadcast once
        self.broadcasts: dict[tuple[int, tuple[int, ...]], int] = {}
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
        if t == _INT64 and info.index in self.narrowed:
            return OperandType(T.TENSOR_INT32, dims)
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
            if graph.propagate and op.custom is None and (op.name in _MOVES or op.name in _BROADCASTING):
                _derive_output_shape(self, op)
            try:
                convert = _CONVERTERS.get(op.builtin) if op.custom is None else _CUSTOM_CONVERTERS.get(op.custom)
                folded = op.custom is None and _fold_constants(self, op)
                if op.custom is not None and convert is None:
                    if op.custom.startswith("Flex"):
                        # the converter's SELECT_TF_OPS: LiteRT itself needs its Flex delegate
                        raise UnsupportedOperator(f"TensorFlow operator '{op.custom[4:]}' (a Flex / SELECT_TF_OPS "
                                                  "operator, run by TensorFlow's own kernels) has no NNAPI equivalent")
                    raise UnsupportedOperator(f"custom operator '{op.custom}' has no NNAPI equivalent")
                if convert is None and not folded:
                    raise UnsupportedOperator("this builtin operator has no NNAPI equivalent")
                if op.custom is None:
                    _narrow_moved_indices(self, op)
                moved_type = op.out_tensor().tfl_type if op.custom is None and op.outputs else None
                if moved_type == _INT64 and op.outputs[0] in self.narrowed:
                    moved_type = _INT32
                if folded or \
                        op.name == "CONCATENATION" and moved_type == _INT32 and _int32_concatenation(self, op):
                    pass
                elif convert is not None and any(first(self, op, convert) for first in _FIRST_CONVERTERS):
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


#: operators that only move elements: where every int64 tensor they move is an index held
#: as int32 (narrowed: ARG_MAX / ARG_MIN's), their int64 outputs are held as int32 too
_INDEX_MOVES = frozenset({"RESHAPE", "SQUEEZE", "EXPAND_DIMS", "STRIDED_SLICE", "SLICE", "GATHER", "GATHER_ND",
                          "TRANSPOSE", "CONCATENATION", "PACK", "UNPACK", "SPLIT", "SPLIT_V", "TILE",
                          "REVERSE_V2", "BROADCAST_TO"})


def _narrow_moved_indices(c: _Converter, op: _Operator) -> None:
    """Mark the int64 outputs of ``op`` narrowed (held as TENSOR_INT32, widened back to
    int64 by Session where they are model outputs) when ``op`` only moves elements and
    every int64 tensor it reads is a narrowed one computed at run time: tf.argmax's int64
    indices sliced, reshaped or gathered keep fitting int32. (An int64 constant among its
    inputs leaves it alone: refused as before.)"""
    if op.name not in _INDEX_MOVES or not any(c.graph.tensors[t].tfl_type == _INT64 for t in op.outputs):
        return
    moved = [t for t in op.inputs if t >= 0 and c.graph.tensors[t].tfl_type == _INT64]
    if moved and all(t in c.narrowed and c.const_of(t) is None for t in moved):
        c.narrowed.update(t for t in op.outputs if c.graph.tensors[t].tfl_type == _INT64)


# === operator converters ================================================================
_CONVERTERS: dict[int, Callable[[_Converter, _Operator], None]] = {}
#: custom operators (by custom code) whose meaning one NNAPI operation has
_CUSTOM_CONVERTERS: dict[str, Callable[[_Converter, _Operator], None]] = {}
#: converters for a class of operators, tried before an operator's own (given to them):
#: True when one converted it (high_rank's element-wise operators of lifted tensors)
_FIRST_CONVERTERS: list[Callable[[_Converter, _Operator, Callable[[_Converter, _Operator], None]], bool]] = []


def _fold_constants(c: _Converter, op: _Operator) -> bool:
    """Folds ``op`` into constants of its outputs when every input is a constant
    (fold.py); whether it did. A value of another shape than the file declares
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
        if not codes:  # no tflite package (the extra nnapi[tflite]): nothing can be imported, nothing to register
            return function
        for name in names:
            _CONVERTERS[codes[name]] = function
        return function

    return wrap


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
