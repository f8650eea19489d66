"""Write small TensorFlow Lite models for the import tests, with the flatbuffers builder
API that the ``tflite`` package generates from TFLite's schema.

A model is described with plain Python: tensors (``Tensor``), operators (``Operator``)
and subgraphs (``Subgraph``); ``build`` returns the .tflite bytes, which LiteRT and
``nnapi.load_tflite`` both read. Covers what the lowerings need: per-tensor and
per-channel quantization, constants, variable tensors, sparse constants, builtin options
with scalar, string and vector fields, several subgraphs, operator intermediates.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import flatbuffers
import numpy as np
import tflite
from tflite.utils import BUILTIN_OPCODE2NAME

_OPCODES = {name: code for code, name in BUILTIN_OPCODE2NAME.items()}
#: operators whose first version in TFLite's schema is not 1 (LiteRT registers no version 1)
_FIRST_VERSION = {_OPCODES["BROADCAST_TO"]: 2}
_TYPES = {"float32": 0, "float16": 1, "int32": 2, "uint8": 3, "int64": 4, "bool": 6, "int16": 7, "complex64": 8,
          "int8": 9, "resource": 13}


@dataclass
class Tensor:
    name: str
    type: str
    shape: list[int]
    data: np.ndarray | None = None
    scale: float | list[float] | None = None
    zero_point: int | list[int] | None = None
    quantized_dimension: int = 0
    variable: bool = False
    #: (traversal_order, block_map, [(format, dense_size, segments, indices), ...]) for a sparse constant
    sparsity: tuple | None = None
    shape_signature: list[int] | None = None


@dataclass
class Operator:
    op: str
    inputs: list[int]
    outputs: list[int]
    options: tuple[str, dict[str, Any]] | None = None
    custom: str | None = None
    #: tensors the kernel reads only the quantization of (the integer LSTM's scales)
    intermediates: list[int] | None = None
    #: a custom operator's options, raw bytes
    custom_options: bytes | None = None


@dataclass
class Subgraph:
    tensors: list[Tensor]
    operators: list[Operator]
    inputs: list[int]
    outputs: list[int]
    name: str = "main"


@dataclass
class _State:
    builder: flatbuffers.Builder
    buffers: list[bytes] = field(default_factory=lambda: [b""])
    opcodes: list[tuple[int, str | None]] = field(default_factory=list)


def _int_vector(builder: flatbuffers.Builder, start, values, kind: str = "int32") -> int:
    start(builder, len(values))
    prepend = {"int32": builder.PrependInt32, "float32": builder.PrependFloat32, "int64": builder.PrependInt64,
               "uint8": builder.PrependUint8}[kind]
    for value in reversed(list(values)):
        prepend(value)
    return builder.EndVector()


def _generic_vector(builder: flatbuffers.Builder, values, kind: str = "int32") -> int:
    builder.StartVector(4 if kind in ("int32", "float32") else 8 if kind == "int64" else 1, len(values),
                        4 if kind in ("int32", "float32") else 8 if kind == "int64" else 1)
    prepend = {"int32": builder.PrependInt32, "float32": builder.PrependFloat32, "int64": builder.PrependInt64,
               "uint8": builder.PrependUint8}[kind]
    for value in reversed(list(values)):
        prepend(value)
    return builder.EndVector()


def _options(state: _State, name: str, fields: dict[str, Any]) -> tuple[int, int]:
    b = state.builder
    vectors = {key: _generic_vector(b, value) for key, value in fields.items() if isinstance(value, list)}
    # a float32 numpy array: a float vector (BucketizeOptions' boundaries)
    vectors.update({key: _generic_vector(b, value.tolist(), "float32") for key, value in fields.items()
                    if isinstance(value, np.ndarray) and value.dtype == np.float32})
    vectors.update({key: b.CreateString(value) for key, value in fields.items() if isinstance(value, str)})
    getattr(tflite, f"{name}Start")(b)
    for key, value in fields.items():
        getattr(tflite, f"{name}Add{key}")(b, vectors.get(key, value))
    return getattr(tflite.BuiltinOptions, name), getattr(tflite, f"{name}End")(b)


def _sparsity(b: flatbuffers.Builder, spec: tuple) -> int:
    order, block_map, dims = spec
    metas = []
    for fmt, dense_size, segments, indices in dims:
        seg = idx = None
        if fmt == 1:
            seg_vec = _generic_vector(b, segments)
            tflite.Int32VectorStart(b)
            tflite.Int32VectorAddValues(b, seg_vec)
            seg = tflite.Int32VectorEnd(b)
            idx_vec = _generic_vector(b, indices)
            tflite.Int32VectorStart(b)
            tflite.Int32VectorAddValues(b, idx_vec)
            idx = tflite.Int32VectorEnd(b)
        tflite.DimensionMetadataStart(b)
        tflite.DimensionMetadataAddFormat(b, fmt)
        tflite.DimensionMetadataAddDenseSize(b, dense_size)
        if seg is not None:
            tflite.DimensionMetadataAddArraySegmentsType(b, 1)
            tflite.DimensionMetadataAddArraySegments(b, seg)
            tflite.DimensionMetadataAddArrayIndicesType(b, 1)
            tflite.DimensionMetadataAddArrayIndices(b, idx)
        metas.append(tflite.DimensionMetadataEnd(b))
    order_vec = _generic_vector(b, order)
    block_vec = _generic_vector(b, block_map) if block_map else None
    tflite.SparsityParametersStartDimMetadataVector(b, len(metas))
    for meta in reversed(metas):
        b.PrependUOffsetTRelative(meta)
    meta_vec = b.EndVector()
    tflite.SparsityParametersStart(b)
    tflite.SparsityParametersAddTraversalOrder(b, order_vec)
    if block_vec is not None:
        tflite.SparsityParametersAddBlockMap(b, block_vec)
    tflite.SparsityParametersAddDimMetadata(b, meta_vec)
    return tflite.SparsityParametersEnd(b)


def _tensor(state: _State, tensor: Tensor) -> int:
    b = state.builder
    buffer_index = 0
    if tensor.data is not None:
        state.buffers.append(np.ascontiguousarray(tensor.data).tobytes())
        buffer_index = len(state.buffers) - 1
    elif not tensor.variable:
        state.buffers.append(b"")
        buffer_index = len(state.buffers) - 1
    name = b.CreateString(tensor.name)
    shape = _generic_vector(b, tensor.shape)
    signature = _generic_vector(b, tensor.shape_signature) if tensor.shape_signature is not None else None
    quant = None
    if tensor.scale is not None:
        scales = tensor.scale if isinstance(tensor.scale, list) else [tensor.scale]
        zps = tensor.zero_point if isinstance(tensor.zero_point, list) else [tensor.zero_point or 0] * len(scales)
        scale_vec = _generic_vector(b, scales, "float32")
        zp_vec = _generic_vector(b, zps, "int64")
        tflite.QuantizationParametersStart(b)
        tflite.QuantizationParametersAddScale(b, scale_vec)
        tflite.QuantizationParametersAddZeroPoint(b, zp_vec)
        tflite.QuantizationParametersAddQuantizedDimension(b, tensor.quantized_dimension)
        quant = tflite.QuantizationParametersEnd(b)
    sparsity = _sparsity(b, tensor.sparsity) if tensor.sparsity is not None else None
    tflite.TensorStart(b)
    tflite.TensorAddShape(b, shape)
    if signature is not None:
        tflite.TensorAddShapeSignature(b, signature)
    tflite.TensorAddType(b, _TYPES[tensor.type])
    tflite.TensorAddBuffer(b, buffer_index)
    tflite.TensorAddName(b, name)
    if quant is not None:
        tflite.TensorAddQuantization(b, quant)
    if sparsity is not None:
        tflite.TensorAddSparsity(b, sparsity)
    tflite.TensorAddIsVariable(b, tensor.variable)
    return tflite.TensorEnd(b)


def _operator(state: _State, op: Operator) -> int:
    b = state.builder
    key = (_OPCODES[op.op] if op.custom is None else 32, op.custom)
    if key not in state.opcodes:
        state.opcodes.append(key)
    inputs = _generic_vector(b, op.inputs)
    outputs = _generic_vector(b, op.outputs)
    options = _options(state, *op.options) if op.options is not None else None
    intermediates = _generic_vector(b, op.intermediates) if op.intermediates is not None else None
    custom_options = _generic_vector(b, list(op.custom_options), "uint8") if op.custom_options is not None else None
    tflite.OperatorStart(b)
    tflite.OperatorAddOpcodeIndex(b, state.opcodes.index(key))
    tflite.OperatorAddInputs(b, inputs)
    tflite.OperatorAddOutputs(b, outputs)
    if options is not None:
        tflite.OperatorAddBuiltinOptionsType(b, options[0])
        tflite.OperatorAddBuiltinOptions(b, options[1])
    if intermediates is not None:
        tflite.OperatorAddIntermediates(b, intermediates)
    if custom_options is not None:
        tflite.OperatorAddCustomOptions(b, custom_options)
    return tflite.OperatorEnd(b)


def _subgraph(state: _State, graph: Subgraph) -> int:
    b = state.builder
    tensors = [_tensor(state, t) for t in graph.tensors]
    operators = [_operator(state, op) for op in graph.operators]
    tflite.SubGraphStartTensorsVector(b, len(tensors))
    for t in reversed(tensors):
        b.PrependUOffsetTRelative(t)
    tensor_vec = b.EndVector()
    tflite.SubGraphStartOperatorsVector(b, len(operators))
    for o in reversed(operators):
        b.PrependUOffsetTRelative(o)
    op_vec = b.EndVector()
    inputs = _generic_vector(b, graph.inputs)
    outputs = _generic_vector(b, graph.outputs)
    name = b.CreateString(graph.name)
    tflite.SubGraphStart(b)
    tflite.SubGraphAddTensors(b, tensor_vec)
    tflite.SubGraphAddOperators(b, op_vec)
    tflite.SubGraphAddInputs(b, inputs)
    tflite.SubGraphAddOutputs(b, outputs)
    tflite.SubGraphAddName(b, name)
    return tflite.SubGraphEnd(b)


def _signature(b: flatbuffers.Builder, key: str, subgraph: int, inputs: dict[str, int],
               outputs: dict[str, int]) -> int:
    maps = []
    for names in (inputs, outputs):
        entries = []
        for name, tensor in names.items():
            name_offset = b.CreateString(name)
            tflite.TensorMapStart(b)
            tflite.TensorMapAddName(b, name_offset)
            tflite.TensorMapAddTensorIndex(b, tensor)
            entries.append(tflite.TensorMapEnd(b))
        b.StartVector(4, len(entries), 4)
        for entry in reversed(entries):
            b.PrependUOffsetTRelative(entry)
        maps.append(b.EndVector())
    key_offset = b.CreateString(key)
    tflite.SignatureDefStart(b)
    tflite.SignatureDefAddInputs(b, maps[0])
    tflite.SignatureDefAddOutputs(b, maps[1])
    tflite.SignatureDefAddSignatureKey(b, key_offset)
    tflite.SignatureDefAddSubgraphIndex(b, subgraph)
    return tflite.SignatureDefEnd(b)


def build(*subgraphs: Subgraph, signatures: list[tuple[str, int, dict[str, int], dict[str, int]]] | None = None
          ) -> bytes:
    """The .tflite flatbuffer of ``subgraphs`` (the first is the main one); ``signatures``:
    SignatureDefs as (key, subgraph index, {input key: tensor}, {output key: tensor})."""
    state = _State(flatbuffers.Builder(1024))
    b = state.builder
    graphs = [_subgraph(state, g) for g in subgraphs]
    signature_vec = None
    if signatures:
        defs = [_signature(b, *signature) for signature in signatures]
        tflite.ModelStartSignatureDefsVector(b, len(defs))
        for item in reversed(defs):
            b.PrependUOffsetTRelative(item)
        signature_vec = b.EndVector()
    codes = []
    for builtin, custom in state.opcodes:
        custom_offset = b.CreateString(custom) if custom is not None else None
        tflite.OperatorCodeStart(b)
        tflite.OperatorCodeAddBuiltinCode(b, builtin)
        tflite.OperatorCodeAddDeprecatedBuiltinCode(b, min(builtin, 127))
        tflite.OperatorCodeAddVersion(b, _FIRST_VERSION.get(builtin, 1))
        if custom_offset is not None:
            tflite.OperatorCodeAddCustomCode(b, custom_offset)
        codes.append(tflite.OperatorCodeEnd(b))
    buffers = []
    for data in state.buffers:
        data_vec = None
        if data:
            b.StartVector(1, len(data), 16)
            b.head -= len(data)
            b.Bytes[b.head:b.head + len(data)] = data
            data_vec = b.EndVector()
        tflite.BufferStart(b)
        if data_vec is not None:
            tflite.BufferAddData(b, data_vec)
        buffers.append(tflite.BufferEnd(b))
    description = b.CreateString("nnapi test model")
    for start, items in ((tflite.ModelStartOperatorCodesVector, codes), (tflite.ModelStartSubgraphsVector, graphs),
                         (tflite.ModelStartBuffersVector, buffers)):
        start(b, len(items))
        for item in reversed(items):
            b.PrependUOffsetTRelative(item)
        vec = b.EndVector()
        if start is tflite.ModelStartOperatorCodesVector:
            codes_vec = vec
        elif start is tflite.ModelStartSubgraphsVector:
            graphs_vec = vec
        else:
            buffers_vec = vec
    tflite.ModelStart(b)
    tflite.ModelAddVersion(b, 3)
    tflite.ModelAddOperatorCodes(b, codes_vec)
    tflite.ModelAddSubgraphs(b, graphs_vec)
    tflite.ModelAddBuffers(b, buffers_vec)
    tflite.ModelAddDescription(b, description)
    if signature_vec is not None:
        tflite.ModelAddSignatureDefs(b, signature_vec)
    model = tflite.ModelEnd(b)
    b.Finish(model, file_identifier=b"TFL3")
    return bytes(b.Output())


def single_op(op: str, tensors: list[Tensor], inputs: list[int], outputs: list[int],
              options: tuple[str, dict[str, Any]] | None = None,
              model_inputs: list[int] | None = None) -> bytes:
    """A one-operator model: tensors without data among ``inputs`` are the model inputs."""
    if model_inputs is None:
        model_inputs = [i for i in inputs if i >= 0 and tensors[i].data is None and not tensors[i].variable]
    return build(Subgraph(tensors, [Operator(op, inputs, outputs, options)], model_inputs, outputs))
