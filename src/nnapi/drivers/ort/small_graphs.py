"""Lowerings that leave ONNX Runtime fewer nodes to run, for small graphs where its ~1 us
per node is much of the run (a text CNN: 28 nodes, ~30 us): the same results as the
general lowerings in ``lowering``, which these fall back to.

- GATHER of indices that the model itself wrapped from the end (Keras' ``take``:
  SELECT(LESS(i, 0), ADD(i, n), i), n the axis' size) is ONNX's Gather of i, which wraps
  [-n, 0) the same way and fails the run for anything outside [-n, n) as the reference's
  GATHER does for the wrapped index outside [0, n); the LESS / ADD / SELECT and the
  general lowering's own check of negative indices (5 nodes) are then unread and dropped.
- REDUCE_MAX over the height and width of an NHWC image (or over the middle axes of a
  RESHAPE of one that keeps its batch and channels: a text CNN's max over time) is
  GlobalMaxPool, which ORT runs in its blocked layout straight after the convolution (no
  reorder, Reshape and ReduceMax): only where the image comes out of a RELU / RELU1 /
  RELU6, as an operation or a convolution's fused activation, because ORT's pooling starts
  from -FLT_MAX (an all -inf window would give that instead of -inf); a maximum of the
  same finite elements (NaN aside, where ORT's ReduceMax does not propagate it either).
  A CONCATENATION along the channels of such maxima only (a text CNN's three branches)
  concatenates the pooled [N, C, 1, 1] values, which ORT keeps in its blocked layout: one
  reorder and one Reshape instead of one per branch.
- MEAN over the middle axis of a RESHAPE of an NHWC image to [N, H * W, C] (a Conv1D's
  GlobalAveragePooling1D: Keras writes the convolution on [N, 1, T, C] and reshapes it to
  [N, T, C]) is GlobalAveragePool of the image in ORT's blocked layout, as ``lower_mean``
  does for a MEAN over an image's own height and width, also where T is known only at run
  time (a text model's sequence): no reorder out of the layout, Reshape and ReduceMean over
  a middle axis (zoo4's text classifier on a sequence of 64: 8.7 -> ~3 us in ORT's profile).
"""

from __future__ import annotations

import math

import numpy as np

from nnapi.codes import FuseCode, OperandCode, OperationCode
from nnapi.drivers.ort.builder import (
    NCHWC_BLOCK,
    GraphBuilder,
    check_same_quantization,
    constant_ints,
    conv_params,
    lowers,
)
from nnapi.drivers.ort.data_movement import lower_concatenation, lower_gather
from nnapi.drivers.ort.pooling import lower_mean, lower_reduce, nonempty
from nnapi.hal import OperandLifeTime, Operation

T = OperandCode
Op = OperationCode
L = OperandLifeTime
_CLAMPED = (FuseCode.FUSED_RELU, FuseCode.FUSED_RELU1, FuseCode.FUSED_RELU6)
_CONVOLUTIONS = (Op.CONV_2D, Op.DEPTHWISE_CONV_2D, Op.GROUPED_CONV_2D)


@lowers(OperationCode.GATHER)
def lower_gather_of_wrapped_indices(g: GraphBuilder, operation: Operation) -> None:
    """GATHER of model-wrapped indices as ONNX's Gather of the unwrapped ones (see the
    module's docstring); otherwise ``data_movement.lower_gather``."""
    unwrapped = _unwrapped_indices(g, operation)
    if unwrapped is None:
        lower_gather(g, operation)
        return
    x = g.value(operation.inputs[0])
    check_same_quantization(x, g.operand(operation.outputs[0]))
    axis = int(g.scalar(operation.inputs[1])) % x.rank
    g.set_output(operation.outputs[0], g.one("Gather", [x.name, g.value(unwrapped).name], axis=axis))


def _scalar_constant(g: GraphBuilder, index: int) -> int | None:
    """The value of an int32 constant of one element, else None."""
    operand = g.operand(index)
    if operand.type not in (T.TENSOR_INT32, T.INT32) or operand.lifetime not in (L.CONSTANT_COPY,
                                                                                 L.CONSTANT_REFERENCE):
        return None
    array = g.raw_constant(index)
    return int(array.reshape(-1)[0]) if array is not None and array.size == 1 else None


def _unwrapped_indices(g: GraphBuilder, operation: Operation) -> int | None:
    """i where GATHER ``operation``'s indices are SELECT(LESS(i, 0), ADD(i, n), i) of an
    int32 tensor i computed at run time, n the gathered axis' known size; else None. Its
    dimensions may be known only at run time (a text model's sequence): the comparison and
    the addition of one-element constants keep i's shape when the SELECT keeps its rank."""
    x = g.value(operation.inputs[0])
    axis_operand = g.operand(operation.inputs[1])
    if x.rank == 0 or axis_operand.lifetime not in (L.CONSTANT_COPY, L.CONSTANT_REFERENCE):
        return None
    axis = int(g.scalar(operation.inputs[1]))
    if not -x.rank <= axis < x.rank or not x.dims[axis % x.rank]:
        return None
    size = x.dims[axis % x.rank]
    select = g.producer(operation.inputs[2])
    if select is None or select.type != Op.SELECT:
        return None
    condition, wrapped, unwrapped = select.inputs
    less, add = g.producer(condition), g.producer(wrapped)
    indices = g.operand(unwrapped)
    if less is None or add is None or less.type != Op.LESS or add.type != Op.ADD \
            or indices.type != T.TENSOR_INT32 or indices.lifetime in (L.CONSTANT_COPY, L.CONSTANT_REFERENCE) \
            or list(g.operand(operation.inputs[2]).dimensions) != list(indices.dimensions) or not indices.dimensions:
        return None
    if list(less.inputs) != [unwrapped, less.inputs[1]] or _scalar_constant(g, less.inputs[1]) != 0:
        return None
    if unwrapped not in add.inputs[:2] or _scalar_constant(g, add.inputs[2]) != 0:
        return None
    other = add.inputs[1] if add.inputs[0] == unwrapped else add.inputs[0]
    if other == unwrapped or _scalar_constant(g, other) != size:
        return None
    return unwrapped


@lowers(OperationCode.REDUCE_MAX, OperationCode.REDUCE_MIN, OperationCode.REDUCE_SUM, OperationCode.REDUCE_PROD,
        OperationCode.REDUCE_ANY, OperationCode.REDUCE_ALL)
def lower_reduce_as_global_pool(g: GraphBuilder, operation: Operation) -> None:
    """REDUCE_MAX over a clamped image's height and width as GlobalMaxPool (see the
    module's docstring); otherwise ``pooling.lower_reduce``."""
    image = _pooled_image(g, operation) if operation.type == Op.REDUCE_MAX else None
    if image is None:
        lower_reduce(g, operation)
        return
    nchw = g.one("Transpose", [g.value(image).name], perm=[0, 3, 1, 2])
    pooled = g.one("GlobalMaxPool", [nchw])  # [N, C, 1, 1]: in memory the output's [N, ..., C]
    g.pooled[operation.outputs[0]] = pooled
    shape = g.constant(np.array(g.operand(operation.outputs[0]).dimensions, np.int64))
    g.set_output(operation.outputs[0], g.one("Reshape", [pooled, shape]))


def _clamped_below(g: GraphBuilder, index: int) -> bool:
    """Whether float operand ``index`` is the output of a RELU / RELU1 / RELU6 (an
    operation, or a convolution's fused activation): never -inf."""
    producer = g.producer(index)
    if producer is None or g.operand(index).type != T.TENSOR_FLOAT32:
        return False
    if producer.type in (Op.RELU, Op.RELU1, Op.RELU6):
        return True
    if producer.type not in _CONVOLUTIONS:
        return False
    try:
        return conv_params(g, producer, producer.type != Op.CONV_2D).fuse in _CLAMPED
    except Exception:  # noqa: BLE001 - parameters the general lowering declines
        return False


def _pooled_image(g: GraphBuilder, operation: Operation) -> int | None:
    """The NHWC float image (operand index) whose every channel's maximum over height and
    width is REDUCE_MAX ``operation``'s output, read directly or through a RESHAPE that
    keeps the batch first and the channels last; None where it is not so."""
    if g.isolated or g.operand(operation.outputs[0]).type != T.TENSOR_FLOAT32:
        return None
    source = operation.inputs[0]
    dims = list(g.operand(source).dimensions)
    output_dims = list(g.operand(operation.outputs[0]).dimensions)
    if not dims or not all(dims) or not output_dims or not all(output_dims) or any(
            g.operand(i).lifetime not in (L.CONSTANT_COPY, L.CONSTANT_REFERENCE) for i in operation.inputs[1:3]):
        return None
    axes = sorted({int(a) % len(dims) for a in constant_ints(g, operation.inputs[1], "the axes")
                   if -len(dims) <= a < len(dims)})
    if len(dims) < 3 or axes != list(range(1, len(dims) - 1)):
        return None
    image = source
    producer = g.producer(source)
    if producer is not None and producer.type == Op.RESHAPE:
        image = producer.inputs[0]
    image_dims = list(g.operand(image).dimensions)
    if len(image_dims) != 4 or not all(image_dims) or image_dims[0] != dims[0] or image_dims[3] != dims[-1] \
            or math.prod(image_dims[1:3]) != math.prod(dims[1:-1]) or not _clamped_below(g, image):
        return None
    return image


@lowers(OperationCode.CONCATENATION)
def lower_concatenation_of_pools(g: GraphBuilder, operation: Operation) -> None:
    """CONCATENATION along the last axis of maxima lowered as GlobalMaxPool (see the
    module's docstring) as one Concat of the pooled values; otherwise
    ``data_movement.lower_concatenation``."""
    pooled = g.pooled
    parts = operation.inputs[:-1]
    output = g.operand(operation.outputs[0])
    dims = list(output.dimensions)
    axis_operand = g.operand(operation.inputs[-1])
    if len(parts) < 2 or any(i not in pooled for i in parts) or not dims or not all(dims) \
            or axis_operand.lifetime not in (L.CONSTANT_COPY, L.CONSTANT_REFERENCE) \
            or int(g.scalar(operation.inputs[-1])) not in (-1, len(dims) - 1) \
            or output.type != T.TENSOR_FLOAT32:
        lower_concatenation(g, operation)
        return
    joined = g.one("Concat", [pooled[i] for i in parts], axis=1)
    g.set_output(operation.outputs[0], g.one("Reshape", [joined, g.constant(np.array(dims, np.int64))]))


@lowers(OperationCode.MEAN)
def lower_mean_of_reshaped_image(g: GraphBuilder, operation: Operation) -> None:
    """MEAN over the middle axis of a RESHAPE of an image as GlobalAveragePool (see the
    module's docstring); otherwise ``pooling.lower_mean``."""
    image = _averaged_image(g, operation)
    if image is None:
        lower_mean(g, operation)
        return
    nchw = g.one("Transpose", [g.value(image).name], perm=[0, 3, 1, 2])
    pooled = g.one("GlobalAveragePool", [nchw])  # [N, C, 1, 1]: in memory the output's [N, (1,) C]
    shape = g.constant(np.array(g.operand(operation.outputs[0]).dimensions, np.int64))
    y = g.one("Reshape", [pooled, shape])
    g.set_output(operation.outputs[0], nonempty(g, operation, nchw, list(g.operand(image).dimensions), y))


def _averaged_image(g: GraphBuilder, operation: Operation) -> int | None:
    """The NHWC float image (operand index) of known batch and channels (a multiple of the
    NCHWc block) whose RESHAPE to [N, H * W, C] MEAN ``operation`` averages over axis 1;
    None where it is not so."""
    output = g.operand(operation.outputs[0])
    if g.isolated or output.type != T.TENSOR_FLOAT32 or not output.dimensions or not all(output.dimensions) \
            or any(g.operand(i).lifetime not in (L.CONSTANT_COPY, L.CONSTANT_REFERENCE) for i in operation.inputs[1:3]):
        return None
    if len(g.operand(operation.inputs[0]).dimensions) != 3 or {
            int(a) % 3 for a in constant_ints(g, operation.inputs[1], "the axes") if -3 <= a < 3} != {1}:
        return None
    reshape = g.producer(operation.inputs[0])
    if reshape is None or reshape.type != Op.RESHAPE \
            or g.operand(reshape.inputs[1]).lifetime not in (L.CONSTANT_COPY, L.CONSTANT_REFERENCE):
        return None
    image = reshape.inputs[0]
    dims = list(g.operand(image).dimensions)
    if g.operand(image).type != T.TENSOR_FLOAT32 or len(dims) != 4 or not dims[0] or not dims[3] \
            or dims[3] % NCHWC_BLOCK:
        return None
    target = [int(d) for d in constant_ints(g, reshape.inputs[1], "the shape")]
    if len(target) != 3 or target[0] != dims[0] or target[2] != dims[3]:
        return None
    # the middle axis is the image's pixels: -1 (what the batch and channels leave), or their count
    if target[1] != -1 and (not all(dims[1:3]) or target[1] != dims[1] * dims[2]):
        return None
    return image
