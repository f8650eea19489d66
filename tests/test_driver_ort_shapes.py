"""nnapi-ort-cpu with temporaries declared with unknown dimensions: the shapes the
reference's ``prepare`` gives from known input shapes and constants are filled in before
lowering (drivers/ort/shapes.py); shapes that need a value computed at run time stay unknown."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import nnapi  # noqa: E402
from nnapi import OperandCode as T  # noqa: E402
from nnapi import OperandType  # noqa: E402
from nnapi import OperationCode as Op  # noqa: E402
from nnapi.drivers.ort.device import OrtDevice  # noqa: E402
from nnapi.drivers.ort.shapes import infer_temporary_shapes  # noqa: E402
from nnapi.runtime.model_builder import build_hal_model  # noqa: E402

pytestmark = pytest.mark.usefixtures("calibration_file")


def _scalar(model: nnapi.Model, code: int, value) -> int:
    index = model.add_operand(OperandType(code))
    model.set_operand_value(index, value)
    return index


def _conv_after_add(quantized: bool) -> nnapi.Model:
    """ADD(x, 0) -> CONV_2D (SAME, stride 2) -> y, the temporary and the output declared
    [0, 0, 0, 0] (as Android's dynamic-output-shape tests declare them)."""
    rng = np.random.default_rng(4)
    model = nnapi.Model()
    if quantized:
        activation = {"type": T.TENSOR_QUANT8_ASYMM, "scale": 0.05, "zero_point": 120}
        x = model.add_operand(OperandType(dimensions=[1, 9, 7, 5], **activation))
        zero = model.add_operand(OperandType(dimensions=[1], **activation))
        model.set_operand_value(zero, np.array([120], np.uint8))
        t = model.add_operand(OperandType(dimensions=[0, 0, 0, 0], **activation))
        w = model.add_operand(OperandType(T.TENSOR_QUANT8_ASYMM, [6, 3, 3, 5], scale=0.01, zero_point=128))
        model.set_operand_value(w, rng.integers(0, 256, (6, 3, 3, 5)).astype(np.uint8))
        b = model.add_operand(OperandType(T.TENSOR_INT32, [6], scale=0.05 * 0.01))
        model.set_operand_value(b, rng.integers(-500, 500, 6).astype(np.int32))
        y = model.add_operand(OperandType(T.TENSOR_QUANT8_ASYMM, [0, 0, 0, 0], scale=0.5, zero_point=100))
    else:
        x = model.add_operand(OperandType(T.TENSOR_FLOAT32, [1, 9, 7, 5]))
        zero = model.add_operand(OperandType(T.TENSOR_FLOAT32, [1]))
        model.set_operand_value(zero, np.zeros(1, np.float32))
        t = model.add_operand(OperandType(T.TENSOR_FLOAT32, [0, 0, 0, 0]))
        w = model.add_operand(OperandType(T.TENSOR_FLOAT32, [6, 3, 3, 5]))
        model.set_operand_value(w, rng.standard_normal((6, 3, 3, 5)).astype(np.float32))
        b = model.add_operand(OperandType(T.TENSOR_FLOAT32, [6]))
        model.set_operand_value(b, rng.standard_normal(6).astype(np.float32))
        y = model.add_operand(OperandType(T.TENSOR_FLOAT32, [0, 0, 0, 0]))
    model.add_operation(Op.ADD, [x, zero, _scalar(model, T.INT32, 0)], [t])
    model.add_operation(Op.CONV_2D, [t, w, b, *(_scalar(model, T.INT32, v) for v in (1, 2, 2, 0))], [y])
    model.identify_inputs_and_outputs([x], [y])
    model.finish()
    return model


@pytest.mark.parametrize("quantized", [False, True])
def test_a_temporary_of_unknown_shape_gets_its_shape_and_runs_on_ort(ort_device, quantized):
    """The convolution's SAME padding needs its input's size, declared unknown: inferred as
    ADD's broadcast [1, 9, 7, 5], so nnapi-ort-cpu takes the whole model; the output (still
    declared unknown) is [1, 5, 4, 6] with the reference's values (quantized: within a step,
    as the constant-filter QLinearConv is)."""
    model = _conv_after_add(quantized)
    hal = build_hal_model(model)[0]
    shaped = infer_temporary_shapes(hal)
    assert shaped.main.operands[2].dimensions == [1, 9, 7, 5]
    assert shaped.main.operations is hal.main.operations  # the same operations, outputs left as declared
    assert [shaped.main.operands[i].dimensions for i in shaped.main.output_indexes] == [[0, 0, 0, 0]]
    assert hal.main.operands[2].dimensions == [0, 0, 0, 0]  # the model itself is not changed
    x = (np.random.default_rng(1).integers(0, 256, (1, 9, 7, 5)).astype(np.uint8) if quantized
         else np.random.default_rng(1).standard_normal((1, 9, 7, 5)).astype(np.float32))
    results = []
    for device in (ort_device, next(d for d in nnapi.get_devices() if d.name == "nnapi-reference")):
        compilation = nnapi.Compilation(model, [device])
        compilation.finish()
        assert compilation.step_devices == [device.name]
        execution = nnapi.Execution(compilation)
        execution.set_input(0, x)
        y = np.zeros((1, 5, 4, 6), x.dtype)
        execution.set_output(0, y)
        execution.compute()
        assert execution.get_output_operand_dimensions(0) == [1, 5, 4, 6]
        results.append(y)
    if quantized:
        assert np.abs(results[0].astype(int) - results[1]).max() <= 1 and len(np.unique(results[1])) > 20
    else:
        np.testing.assert_allclose(results[0], results[1], rtol=1e-5, atol=1e-5)


def test_a_shape_that_needs_a_run_time_value_stays_unknown():
    """RESHAPE to a shape given as a model input: its output's shape is known only at run
    time, and so is the shape of what reads it (nothing is guessed); the device declines the
    convolution after it naming its need; a model without unknown temporaries comes back
    as itself."""
    model = nnapi.Model()
    x = model.add_operand(OperandType(T.TENSOR_FLOAT32, [1, 4, 4, 2]))
    shape = model.add_operand(OperandType(T.TENSOR_INT32, [4]))
    t = model.add_operand(OperandType(T.TENSOR_FLOAT32, [0, 0, 0, 0]))
    u = model.add_operand(OperandType(T.TENSOR_FLOAT32, [0, 0, 0, 0]))
    w = model.add_operand(OperandType(T.TENSOR_FLOAT32, [1, 3, 3, 2]))
    model.set_operand_value(w, np.ones((1, 3, 3, 2), np.float32))
    b = model.add_operand(OperandType(T.TENSOR_FLOAT32, [1]))
    model.set_operand_value(b, np.zeros(1, np.float32))
    y = model.add_operand(OperandType(T.TENSOR_FLOAT32, [0, 0, 0, 0]))
    model.add_operation(Op.RESHAPE, [x, shape], [t])
    model.add_operation(Op.RELU, [t], [u])
    model.add_operation(Op.CONV_2D, [u, w, b, *(_scalar(model, T.INT32, v) for v in (1, 2, 2, 0))], [y])
    model.identify_inputs_and_outputs([x, shape], [y])
    model.finish()
    hal = build_hal_model(model)[0]
    assert infer_temporary_shapes(hal) is hal
    reasons = OrtDevice().get_unsupported_reasons(hal)
    # (at stride 2 SAME's padding depends on the size; at stride 1 it would not)
    assert reasons[2] == "SAME padding needs the filter's spatial sizes, and the input's where the stride is not 1"
    known = build_hal_model(_conv_after_add(False))[0]
    known.main.operands[2].dimensions = [1, 9, 7, 5]
    assert infer_temporary_shapes(known) is known


@pytest.mark.parametrize("strides, dilation, runs_on_ort", [((1, 1), 2, True), ((1, 2), 1, False)])
def test_same_padding_at_stride_1_needs_no_input_size(ort_device, strides, dilation, runs_on_ort):
    """A convolution with SAME padding on an input whose width is known only at run time (a
    Conv1D over a sequence of any length): at stride 1 the padding, (kernel - 1) * dilation,
    does not depend on the width, so nnapi-ort-cpu takes it (it declined before) and
    matches the reference at widths 5 and 11; at stride 2 it still declines."""
    rng = np.random.default_rng(6)
    model = nnapi.Model()
    x = model.add_operand(OperandType(T.TENSOR_FLOAT32, [1, 1, 0, 4]))
    w = model.add_operand(OperandType(T.TENSOR_FLOAT32, [3, 1, 3, 4]))
    model.set_operand_value(w, rng.standard_normal((3, 1, 3, 4)).astype(np.float32))
    b = model.add_operand(OperandType(T.TENSOR_FLOAT32, [3]))
    model.set_operand_value(b, rng.standard_normal(3).astype(np.float32))
    y = model.add_operand(OperandType(T.TENSOR_FLOAT32, [1, 1, 0, 3]))
    params = [_scalar(model, T.INT32, v) for v in (1, strides[1], strides[0], 0)]
    params += [_scalar(model, T.BOOL, False), _scalar(model, T.INT32, dilation), _scalar(model, T.INT32, dilation)]
    model.add_operation(Op.CONV_2D, [x, w, b, *params], [y])
    model.identify_inputs_and_outputs([x], [y])
    model.finish()
    assert model.get_supported_operations_for_devices([ort_device]) == [runs_on_ort]
    if not runs_on_ort:
        return
    reference = next(d for d in nnapi.get_devices() if d.name == "nnapi-reference")
    for width in (5, 11):
        value = rng.standard_normal((1, 1, width, 4)).astype(np.float32)
        results = []
        for device in (ort_device, reference):
            compilation = nnapi.Compilation(model, [device])
            compilation.finish()
            execution = nnapi.Execution(compilation)
            execution.set_input(0, value)
            out = np.zeros((1, 1, width, 3), np.float32)
            execution.set_output(0, out)
            execution.compute()
            results.append(out)
        np.testing.assert_allclose(results[0], results[1], rtol=1e-5, atol=1e-5)
