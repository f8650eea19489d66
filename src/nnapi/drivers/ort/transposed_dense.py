"""1x1 convolutions between two TRANSPOSEs of a value's last two axes, lowered to ONNX
Runtime as matrix products in the value's own layout, with no transposition at all.

An MLP-Mixer's token mixing (MediaPipe's face_blendshapes: 97 tokens of 64 channels, four
blocks) transposes its [N, 1, T, C] value to [N, 1, C, T], runs 1x1 CONV_2Ds over the
tokens (T -> 384 -> T) and transposes back. Lowered operation by operation, ORT runs the
convolutions on a 1 x C image of T channels: a Transpose to NCHW, the channels padded to
its block (97 -> 112), reorders in and out of its blocked layout, and the transposition
back, ~16 us for 6,208 floats (its generic Transpose): ~75 of the model's ~420 us went
to those passes around its convolutions. But a 1x1 convolution of the
transposed value is a product of matrices on the value as it is: for each batch, with X
the [T, C] matrix, the convolution by filters W [O, T] and biases b gives the transpose of
W @ X + b (b added to each column), so the chain is

    TRANSPOSE, CONV_2D(W1, b1, act1), ..., CONV_2D(Wk, bk, actk), TRANSPOSE
    ->  act_k(Wk @ ... act1(W1 @ X + b1) ... + bk)

each a Gemm (one image: the value seen as its [T, C] matrix, a Reshape) or a MatMul and an
Add (a batch of them, broadcast), its activation after it. Every output element is the
same sum of the same products plus the bias as the convolution's, in the GEMM's order
(float32 rounding). Only float32 values [N, 1, T, C] with T and C known, both TRANSPOSEs
of perm [0, 1, 3, 2], convolutions 1x1 of stride 1 without padding in NHWC with constant
filters and biases, and every value of the chain read only by the next operation.
face_blendshapes on ORT (its own run, median of 300 interleaved rounds): 0.42 -> 0.35 ms;
its convolutions as NCHW Conv nodes on the same matrices (a Reshape makes [1, 1, T, C] an
NCHW [1, T, 1, C] image) were 0.36 ms (ORT's Gemm adds its bias and activation in passes
of their own, but packs and multiplies faster than its padded blocked convolution).
"""

from __future__ import annotations

import numpy as np

from nnapi.codes import FuseCode, OperandCode, OperationCode
from nnapi.drivers.ort.builder import GraphBuilder, conv_params, fused_activation, lowers
from nnapi.drivers.ort.data_movement import lower_transpose
from nnapi.hal import OperandLifeTime, Operation

T = OperandCode
Op = OperationCode

#: the permutation that swaps the last two axes of a rank-4 value
SWAP_LAST = [0, 1, 3, 2]


def _swaps_last_axes(g: GraphBuilder, operation: Operation) -> bool:
    if len(operation.inputs) < 2 or g.operand(operation.inputs[1]).lifetime == OperandLifeTime.NO_VALUE:
        return False  # (an omitted perm reverses the axes)
    perm = g.raw_constant(operation.inputs[1])
    return perm is not None and [int(p) for p in perm.reshape(-1)] == SWAP_LAST


def _next(g: GraphBuilder, index: int) -> Operation | None:
    """The one operation reading ``index`` (as its first input, once), where ``index`` is
    no graph output."""
    readers = g.readers(index)
    if len(readers) != 1 or index in g.subgraph.output_indexes:
        return None
    reader = readers[0]
    return reader if reader.inputs[0] == index and list(reader.inputs).count(index) == 1 else None


def _pointwise(g: GraphBuilder, conv: Operation, rows: int, columns: int) -> bool:
    """Whether ``conv`` is a float32 NHWC CONV_2D 1x1 of stride 1 without padding, with a
    constant filter and bias, on a [N, 1, columns, rows] value (the transposed matrix)."""
    inputs = conv.inputs
    weights, bias = g.raw_constant(inputs[1]), g.raw_constant(inputs[2])
    if (weights is None or bias is None or weights.ndim != 4 or weights.shape[1:] != (1, 1, rows)
            or g.operand(conv.outputs[0]).type != T.TENSOR_FLOAT32):
        return False
    params = conv_params(g, conv, False)
    return (not params.nchw and params.strides == [1, 1] and not any(params.pads or [])
            and params.fuse in (FuseCode.FUSED_NONE, FuseCode.FUSED_RELU, FuseCode.FUSED_RELU1, FuseCode.FUSED_RELU6)
            and list(g.operand(conv.outputs[0]).dimensions)[1:3] == [1, columns])


def _chain(g: GraphBuilder, first: Operation) -> tuple[list[Operation], Operation] | None:
    """(the CONV_2Ds, the closing TRANSPOSE) of the chain ``first`` opens, or None."""
    source = g.operand(first.inputs[0])
    dims = list(source.dimensions)
    if (g.isolated or source.type != T.TENSOR_FLOAT32 or len(dims) != 4 or dims[1] != 1 or not all(dims[1:])
            or not _swaps_last_axes(g, first)):
        return None
    rows, columns = dims[2], dims[3]
    convolutions: list[Operation] = []
    index = first.outputs[0]
    while True:
        reader = _next(g, index)
        if reader is None:
            return None
        if reader.type == Op.TRANSPOSE:
            return (convolutions, reader) if convolutions and _swaps_last_axes(g, reader) else None
        if reader.type != Op.CONV_2D or not _pointwise(g, reader, rows, columns):
            return None
        convolutions.append(reader)
        rows = int(g.raw_constant(reader.inputs[1]).shape[0])
        index = reader.outputs[0]


@lowers(Op.TRANSPOSE)
def lower_transpose_chain(g: GraphBuilder, operation: Operation) -> None:
    """TRANSPOSE, and where it opens a chain of the module's docstring, the whole chain as
    matrix products."""
    chain = _chain(g, operation)
    if chain is None:
        lower_transpose(g, operation)
        return
    convolutions, last = chain
    x = g.value(operation.inputs[0])
    batch, _, rows, columns = x.dims
    single = batch == 1
    value = g.one("Reshape", [x.name, g.constant(np.array([rows, columns], np.int64))]) if single else x.name
    for conv in convolutions:
        weights = g.raw_constant(conv.inputs[1]).astype(np.float32)
        rows = weights.shape[0]
        matrix = g.constant(np.ascontiguousarray(weights.reshape(rows, -1)), "filter")
        bias = g.constant(g.raw_constant(conv.inputs[2]).astype(np.float32).reshape(rows, 1), "w")
        if single:
            value = g.one("Gemm", [matrix, value, bias])
        else:
            value = g.one("Add", [g.one("MatMul", [matrix, value]), bias])
        value = fused_activation(g, value, conv_params(g, conv, False).fuse, g.operand(conv.outputs[0]))
    if single:
        value = g.one("Reshape", [value, g.constant(np.array([1, 1, rows, columns], np.int64))])
    g.set_output(last.outputs[0], value)
    g.covered.update(id(op) for op in (*convolutions, last))
