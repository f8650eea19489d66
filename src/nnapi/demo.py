"""The built-in demo model that ``nnapi run`` executes by default.

A small graph of element-wise operations with broadcasting, a fused activation and a
constant: y = relu((x * scale + bias) - x / 4), over a 1x8x8x3 image-like input.
"""

from __future__ import annotations

import numpy as np

import nnapi
from nnapi import FuseCode, OperandType
from nnapi import OperandCode as T
from nnapi import OperationCode as Op

INPUT_SHAPE = (1, 8, 8, 3)


def build_demo_model() -> nnapi.Model:
    """A finished Model with one input x (TENSOR_FLOAT32 1x8x8x3) and one output y."""
    model = nnapi.Model()
    tensor = OperandType(T.TENSOR_FLOAT32, INPUT_SHAPE)
    x = model.add_operand(tensor)
    scale = model.add_operand(OperandType(T.TENSOR_FLOAT32, [3]))
    bias = model.add_operand(OperandType(T.TENSOR_FLOAT32, [1, 1, 1, 3]))
    four = model.add_operand(OperandType(T.TENSOR_FLOAT32, [1]))
    none = model.add_operand(OperandType(T.INT32))
    relu = model.add_operand(OperandType(T.INT32))
    scaled, shifted, quarter, y = (model.add_operand(tensor) for _ in range(4))
    model.set_operand_value(scale, np.array([0.5, 1.0, 2.0], np.float32))
    model.set_operand_value(bias, np.array([0.1, -0.2, 0.3], np.float32).reshape(1, 1, 1, 3))
    model.set_operand_value(four, np.array([4.0], np.float32))
    model.set_operand_value(none, np.int32(FuseCode.FUSED_NONE))
    model.set_operand_value(relu, np.int32(FuseCode.FUSED_RELU))
    model.add_operation(Op.MUL, [x, scale, none], [scaled])
    model.add_operation(Op.ADD, [scaled, bias, none], [shifted])
    model.add_operation(Op.DIV, [x, four, none], [quarter])
    model.add_operation(Op.SUB, [shifted, quarter, relu], [y])
    model.identify_inputs_and_outputs([x], [y])
    model.finish()
    return model


def demo_input(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(INPUT_SHAPE).astype(np.float32)


def demo_expected(x: np.ndarray) -> np.ndarray:
    """The demo model's output computed directly with numpy (for checking)."""
    scale = np.array([0.5, 1.0, 2.0], np.float32)
    bias = np.array([0.1, -0.2, 0.3], np.float32)
    return np.maximum(x * scale + bias - x / np.float32(4.0), 0).astype(np.float32)
