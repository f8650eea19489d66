"""Lowerings of the normalizations: SOFTMAX, LOG_SOFTMAX, L2_NORMALIZATION,
LOCAL_RESPONSE_NORMALIZATION and INSTANCE_NORMALIZATION."""

from __future__ import annotations

import functools

import numpy as np
from onnx import TensorProto, helper

from nnapi.codes import OperationCode
from nnapi.drivers.ort.builder import (
    FLOATS,
    QUANT8,
    Declined,
    GraphBuilder,
    T,
    Value,
    constant_axis,
    from_nchw,
    internal_zero_point,
    lowers,
    probe_outputs,
    require_rank,
    to_nchw,
    type_name,
)
from nnapi.drivers.ort.fixed_point import rounding_divide_by_pot, rounding_high_multiply
from nnapi.hal import Operand, Operation
from nnapi.operations.quant_math import inverse_sqrt_multipliers


@functools.cache
def empty_quantized_softmax_has_output() -> bool:
    """Whether the installed ONNX Runtime returns an output for DequantizeLinear, Softmax,
    QuantizeLinear of an empty tensor. Releases before 1.32 fuse the three into their
    QLinearSoftmax, which then returns no value at all (found on 1.19-1.31 with a zero-sized
    CTS vector): one run of that three-node graph, once per process."""
    scale = helper.make_tensor("s", TensorProto.FLOAT, [], [0.1])
    zero = helper.make_tensor("z", TensorProto.UINT8, [], [0])
    step = helper.make_tensor("t", TensorProto.FLOAT, [], [1 / 256])
    graph = helper.make_graph(
        [helper.make_node("DequantizeLinear", ["q", "s", "z"], ["x"]), helper.make_node("Softmax", ["x"], ["y"]),
         helper.make_node("QuantizeLinear", ["y", "t", "z"], ["o"])], "probe",
        [helper.make_tensor_value_info("q", TensorProto.UINT8, [None, 2])],
        [helper.make_tensor_value_info("o", TensorProto.UINT8, None)], [scale, zero, step])
    try:
        outputs = probe_outputs(graph, {"q": np.zeros((0, 2), np.uint8)})
    except ImportError:  # lowering without a runtime (nothing will load the graph here)
        return True
    return outputs is not None and len(outputs) == 1 and isinstance(outputs[0], np.ndarray)


@lowers(OperationCode.SOFTMAX)
def lower_softmax(g: GraphBuilder, operation: Operation) -> None:
    x = g.value(operation.inputs[0])
    output = g.operand(operation.outputs[0])
    beta = float(g.scalar(operation.inputs[1]))
    axis = int(g.optional_scalar(operation, 2, -1))
    if x.rank == 0 or not -x.rank <= axis < x.rank:
        raise Declined("SOFTMAX axis out of range")
    if output.type not in FLOATS and output.type not in QUANT8:
        raise Declined(f"SOFTMAX on {type_name(output.type)} is not supported")
    if output.type in QUANT8 and not (x.dims and all(x.dims)) and not empty_quantized_softmax_has_output():
        raise Declined("a quantized SOFTMAX whose input may be empty: this onnxruntime (before 1.32) returns no "
                       "output for an empty one")
    real = g.dequantize(x)
    if beta != 1.0:
        real = g.one("Mul", [real, g.constant(np.array(beta, np.float32))])
    y = g.one("Softmax", [real], axis=axis)
    if output.type in QUANT8:
        y = g.quantize(y, output)
    g.set_output(operation.outputs[0], y)


@lowers(OperationCode.L2_NORMALIZATION)
def lower_l2_normalization(g: GraphBuilder, operation: Operation) -> None:
    """x / max(sqrt(sum(x * x)), 1e-6) along the axis in float32, as the reference and
    Android compute it; quantized inputs in the reference's fixed point
    (``_quantized_l2_normalization``)."""
    x = g.value(operation.inputs[0])
    output = g.operand(operation.outputs[0])
    if (output.type not in FLOATS or x.kind != "float") and (output.type not in QUANT8 or x.kind != "uint8"):
        raise Declined(f"L2_NORMALIZATION on {type_name(output.type)} is not supported")
    axis = int(g.optional_scalar(operation, 1, -1))
    if not 1 <= x.rank <= 4 or not -x.rank <= axis < x.rank:
        raise Declined("L2_NORMALIZATION needs rank 1 to 4 and an axis in range")
    if output.type in QUANT8:
        g.set_output(operation.outputs[0], _quantized_l2_normalization(g, operation, x, output, axis % x.rank))
        return
    squares = g.one("ReduceSum", [g.one("Mul", [x.name, x.name]), g.constant(np.array([axis % x.rank], np.int64))],
                    keepdims=1)
    norm = g.one("Max", [g.one("Sqrt", [squares]), g.constant(np.array(1e-6, np.float32))])
    y = g.one("Div", [x.name, norm])
    g.set_output(operation.outputs[0], y)


#: the most sums of squares _quantized_l2_normalization tabulates (16 elements of 128)
_L2_SUMS_MAX = 1 << 18


def _quantized_l2_normalization(g: GraphBuilder, operation: Operation, x: Value, output: Operand, axis: int) -> str:
    """8-bit L2_NORMALIZATION in the reference's fixed point (Android's kernels,
    ``quant_math.l2_normalize_fixed_point``) with exact integer operators: the offsets d
    and their int32 sum of squares S along the axis; from tables indexed by S (built at
    preparation by ``quant_math.inverse_sqrt_multipliers``), the multiplier m and the
    powers of two before and after the high multiply (128 and 2**r, or for int8 along the
    last axis 2**max(7 - r, 0) and 2**max(r - 7, 0)); then in int64 the doubling high
    multiply's rounding and the rounding division by the power after it (fixed_point.py's
    ``rounding_high_multiply`` and ``rounding_divide_by_pot``: halves away from zero, as
    the reference rounds), plus the zero point, clamped. Declined where the sums could
    exceed the tables (``_L2_SUMS_MAX``: 16 elements of up to 128 from the zero point).

    The factor before the high multiply comes with m: one int64 table of 2**max(7 - r, 0)
    * m for int8 along the last axis; where it is 128, folded into the high multiply's
    shift instead (no table): p = 128 d m rounded at 2**31 with nudges 2**30 and 1 - 2**30
    is d m rounded at 2**24 with nudges 2**23 and 1 - 2**23 (the same rational, and an
    integer d m + 2**23 - 1 / 128 truncates as d m + 2**23 - 1; checked on every offset
    against all 196,639 multipliers of the sums to 2**18)."""
    count = x.dims[axis]
    largest = max(x.zero_point, 255 - x.zero_point)
    if not count or count * largest * largest > _L2_SUMS_MAX:
        raise Declined("quantized L2_NORMALIZATION whose sums of squares could pass the fixed point's tables "
                       f"({_L2_SUMS_MAX} entries)")
    sums = np.arange(count * largest * largest + 1)
    multipliers, shifts = inverse_sqrt_multipliers(sums)
    offsets = g.one("Sub", [g.one("Cast", [x.name], to=TensorProto.INT32),
                            g.constant(np.array(x.zero_point, np.int32))])
    total = g.one("ReduceSum", [g.one("Mul", [offsets, offsets]), g.constant(np.array([axis], np.int64))],
                  keepdims=1)

    def looked_up(table: np.ndarray, name: str) -> str:
        return g.one("Gather", [g.constant(table, name), total], axis=0)

    def int64(value: int) -> str:
        return g.constant(np.array(value, np.int64))

    wide = g.one("Cast", [offsets], to=TensorProto.INT64)
    if g.operand(operation.inputs[0]).type == T.TENSOR_QUANT8_ASYMM_SIGNED and axis == x.rank - 1:
        # TFLite's int8 kernel: MultiplyByQuantizedMultiplier(d, m, 7 - r)
        product = g.one("Mul", [wide, looked_up((1 << np.maximum(7 - shifts, 0)) * multipliers, "pre_multiplier")])
        after, bits = 1 << np.maximum(shifts - 7, 0), 31
    else:  # d * 128 by m: the 128 folded into the shift (above)
        product = g.one("Mul", [wide, g.one("Cast", [looked_up(multipliers.astype(np.int32), "multiplier")],
                                            to=TensorProto.INT64)])
        after, bits = 1 << shifts, 24
    # fixed_point's multiply_by_quantized_multiplier in its parts: the power before the
    # high multiply is inside the product (an int64 table, or the shift's 2**24), and
    # d * 2**7 needs no saturation to int32 (|d| <= 255)
    high = rounding_high_multiply(g, product, bits)
    power = g.one("Cast", [looked_up(after.astype(np.int32), "post")], to=TensorProto.INT64)
    rounded = rounding_divide_by_pot(g, high, power)
    result = g.one("Add", [rounded, int64(internal_zero_point(output))])
    clamped = g.one("Min", [g.one("Max", [result, int64(0)]), int64(255)])
    return g.one("Cast", [clamped], to=TensorProto.UINT8)


@lowers(OperationCode.LOCAL_RESPONSE_NORMALIZATION)
def lower_local_response_normalization(g: GraphBuilder, operation: Operation) -> None:
    """x / (bias + alpha * sum of squares within radius along the axis) ** beta, as ONNX's
    LRN over channels of size 2 * radius + 1 (whose alpha is divided by the size): the
    axis is moved last, the other dimensions flattened to [rows, depth, 1, 1], and back."""
    x = g.value(operation.inputs[0])
    if x.kind != "float":
        raise Declined("LOCAL_RESPONSE_NORMALIZATION takes float tensors")
    if not 1 <= x.rank <= 4 or not all(x.dims):
        raise Declined("the input's shape must be known, of rank 1 to 4")
    radius = int(g.scalar(operation.inputs[1]))
    bias, alpha, beta = (float(g.scalar(i)) for i in operation.inputs[2:5])
    axis = int(g.optional_scalar(operation, 5, -1))
    if radius < 0 or not -x.rank <= axis < x.rank:
        raise Declined("the radius must be non-negative and the axis in range")
    axis %= x.rank
    size = 2 * radius + 1
    perm = [a for a in range(x.rank) if a != axis] + [axis]
    moved = x.name if axis == x.rank - 1 else g.one("Transpose", [x.name], perm=perm)
    depth = x.dims[axis]
    rows = g.one("Reshape", [moved, g.constant(np.array([-1, depth, 1, 1], np.int64))])
    y = g.one("LRN", [rows], size=size, alpha=alpha * size, beta=beta, bias=bias)
    y = g.one("Reshape", [y, g.constant(np.array([x.dims[a] for a in perm], np.int64))])
    if axis != x.rank - 1:
        y = g.one("Transpose", [y], perm=list(np.argsort(perm)))
    g.set_output(operation.outputs[0], y)


@lowers(OperationCode.INSTANCE_NORMALIZATION)
def lower_instance_normalization(g: GraphBuilder, operation: Operation) -> None:
    """(x - mean) * gamma / sqrt(var + epsilon) + beta per image and channel: ONNX's
    InstanceNormalization on NCHW with gamma and beta repeated per channel."""
    x = g.value(operation.inputs[0])
    require_rank(x, 4, "the input")
    if x.kind != "float":
        raise Declined("INSTANCE_NORMALIZATION takes float tensors")
    gamma, beta, epsilon = (float(g.scalar(i)) for i in operation.inputs[1:4])
    nchw = bool(g.scalar(operation.inputs[4]))
    channels = x.dims[1 if nchw else 3]
    if not channels or epsilon <= 0:
        raise Declined("the channel count must be known and epsilon positive")
    scale = g.constant(np.full(channels, gamma, np.float32), "gamma")
    shift = g.constant(np.full(channels, beta, np.float32), "beta")
    y = g.one("InstanceNormalization", [to_nchw(g, x.name, nchw), scale, shift], epsilon=epsilon)
    g.set_output(operation.outputs[0], from_nchw(g, y, nchw))


@lowers(OperationCode.LOG_SOFTMAX)
def lower_log_softmax(g: GraphBuilder, operation: Operation) -> None:
    x = g.value(operation.inputs[0])
    if x.kind != "float":
        raise Declined("LOG_SOFTMAX takes float tensors")
    beta = float(g.scalar(operation.inputs[1]))
    axis = constant_axis(g, operation.inputs[2], x.rank)
    scaled = x.name if beta == 1.0 else g.one("Mul", [x.name, g.constant(np.array(beta, np.float32))])
    g.set_output(operation.outputs[0], g.one("LogSoftmax", [scaled], axis=axis))
