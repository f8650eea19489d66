"""TFLite import: CONV_2D, DEPTHWISE_CONV_2D, TRANSPOSE_CONV, FULLY_CONNECTED, BATCH_MATMUL and
the pools; their weights (hybrid ones dequantized) and biases.
"""

from __future__ import annotations

import numpy as np

from nnapi.codes import OperandCode as T
from nnapi.codes import OperationCode
from nnapi.codes import OperationCode as Op
from nnapi.importers.tflite.converter import _CUSTOM_CONVERTERS, _Const, _Converter, _converter, _dequantize_const
from nnapi.importers.tflite.padding import _data_input, _folded_padding
from nnapi.importers.tflite.reader import (
    _FLOAT32,
    _FLOAT_TYPES,
    _PADDING,
    UnsupportedOperator,
    _operand_shape,
    _Operator,
)
from nnapi.operand import OperandType, SymmPerChannelQuantParams


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
