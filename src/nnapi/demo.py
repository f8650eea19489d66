"""The built-in demo model that ``nnapi run`` executes by default: a small CNN classifier.

input 1x16x16x3 float32 -> CONV_2D 3x3x8 (SAME, RELU) -> MAX_POOL_2D 2x2/2
-> CONV_2D 3x3x16 (SAME, RELU6) -> AVERAGE_POOL_2D 8x8 (global) -> RESHAPE [1, 16]
-> FULLY_CONNECTED 16->4 -> SOFTMAX (beta 1). Weights are fixed pseudo-random values.

``demo_expected`` computes the same network directly in numpy, independently of the
operation kernels, so ``nnapi run`` can say whether the device got it right.
"""

from __future__ import annotations

import numpy as np

import nnapi
from nnapi import FuseCode, OperandType, PaddingCode
from nnapi import OperandCode as T
from nnapi import OperationCode as Op

INPUT_SHAPE = (1, 16, 16, 3)
CLASSES = 4


def _weights() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(2024)

    def normal(*shape, scale):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    return {
        "conv1_filter": normal(8, 3, 3, 3, scale=0.3), "conv1_bias": normal(8, scale=0.1),
        "conv2_filter": normal(16, 3, 3, 8, scale=0.2), "conv2_bias": normal(16, scale=0.1),
        "fc_weights": normal(CLASSES, 16, scale=0.5), "fc_bias": normal(CLASSES, scale=0.1),
    }


def build_demo_model() -> nnapi.Model:
    """A finished Model: one input (TENSOR_FLOAT32 1x16x16x3), one output (1x4 scores)."""
    weights = _weights()
    model = nnapi.Model()

    def tensor(*dims):
        return model.add_operand(OperandType(T.TENSOR_FLOAT32, dims))

    def constant(value, code=None):
        value = np.asarray(value)
        if code is None:
            index = model.add_operand(OperandType(T.TENSOR_FLOAT32 if value.ndim else T.FLOAT32, value.shape))
        else:
            index = model.add_operand(OperandType(code, value.shape))
        model.set_operand_value(index, value)
        return index

    def int_scalar(value):
        return constant(np.int32(value), T.INT32)

    x = tensor(*INPUT_SHAPE)
    same, one, two, relu, relu6, none = (int_scalar(v) for v in (
        PaddingCode.PADDING_SAME, 1, 2, FuseCode.FUSED_RELU, FuseCode.FUSED_RELU6, FuseCode.FUSED_NONE))
    conv1 = tensor(1, 16, 16, 8)
    model.add_operation(Op.CONV_2D, [x, constant(weights["conv1_filter"]), constant(weights["conv1_bias"]),
                                     same, one, one, relu], [conv1])
    pooled = tensor(1, 8, 8, 8)
    model.add_operation(Op.MAX_POOL_2D, [conv1, same, two, two, two, two, none], [pooled])
    conv2 = tensor(1, 8, 8, 16)
    model.add_operation(Op.CONV_2D, [pooled, constant(weights["conv2_filter"]), constant(weights["conv2_bias"]),
                                     same, one, one, relu6], [conv2])
    eight = int_scalar(8)
    averaged = tensor(1, 1, 1, 16)
    model.add_operation(Op.AVERAGE_POOL_2D, [conv2, int_scalar(PaddingCode.PADDING_VALID), one, one, eight, eight,
                                             none], [averaged])
    flat = tensor(1, 16)
    model.add_operation(Op.RESHAPE, [averaged, constant(np.array([1, 16], np.int32), T.TENSOR_INT32)], [flat])
    logits = tensor(1, CLASSES)
    model.add_operation(Op.FULLY_CONNECTED, [flat, constant(weights["fc_weights"]), constant(weights["fc_bias"]),
                                             none], [logits])
    scores = tensor(1, CLASSES)
    model.add_operation(Op.SOFTMAX, [logits, constant(np.float32(1.0))], [scores])
    model.identify_inputs_and_outputs([x], [scores])
    model.finish()
    return model


def demo_input(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(INPUT_SHAPE).astype(np.float32)


def _conv_same_3x3(x: np.ndarray, filters: np.ndarray, bias: np.ndarray) -> np.ndarray:
    padded = np.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
    height, width = x.shape[1:3]
    out = np.zeros(x.shape[:3] + (filters.shape[0],), np.float64)
    for dy in range(3):
        for dx in range(3):
            out += np.einsum("nhwc,oc->nhwo", padded[:, dy:dy + height, dx:dx + width], filters[:, dy, dx, :])
    return out + bias


def demo_expected(x: np.ndarray) -> np.ndarray:
    """The demo network computed directly in numpy (float64), for checking."""
    weights = _weights()
    conv1 = np.maximum(_conv_same_3x3(x.astype(np.float64), weights["conv1_filter"], weights["conv1_bias"]), 0)
    pooled = conv1.reshape(1, 8, 2, 8, 2, 8).max(axis=(2, 4))
    conv2 = np.clip(_conv_same_3x3(pooled, weights["conv2_filter"], weights["conv2_bias"]), 0, 6)
    flat = conv2.mean(axis=(1, 2))
    logits = flat @ weights["fc_weights"].T.astype(np.float64) + weights["fc_bias"]
    exp = np.exp(logits - logits.max(axis=1, keepdims=True))
    return (exp / exp.sum(axis=1, keepdims=True)).astype(np.float32)
