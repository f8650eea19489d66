"""Operations on a free batch (a dimension known only at run time, as TFLite files with a
shape signature of -1 import) are claimed by nnapi-ort-cpu where ONNX broadcasting keeps
NNAPI's meaning, and equal the reference's at the batch each run gives."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import nnapi  # noqa: E402
from nnapi import OperandCode as T  # noqa: E402
from nnapi import OperandType  # noqa: E402
from nnapi import OperationCode as Op  # noqa: E402

pytestmark = pytest.mark.usefixtures("calibration_file")


def _run(model: nnapi.Model, device, x: np.ndarray) -> np.ndarray:
    compilation = nnapi.Compilation(model, [device])
    compilation.finish()
    execution = nnapi.Execution(compilation)
    execution.set_input(0, x, OperandType(T.TENSOR_FLOAT32, list(x.shape)))
    out = np.zeros(x.shape, np.float32)
    execution.set_output(0, out, OperandType(T.TENSOR_FLOAT32, list(x.shape)))
    execution.compute()
    return out


@pytest.mark.parametrize("alpha", [np.array([[[0.25, -1.5]]], np.float32), np.array([2.0, 0.5], np.float32)])
def test_prelu_on_a_free_batch_equals_the_reference(ort_device, alpha):
    """openWakeWord's embedding model: PRELUs on [?, 76, 32, 1]-shaped activations."""
    model = nnapi.Model()
    x = model.add_operand(OperandType(T.TENSOR_FLOAT32, [0, 4, 3, 2]))
    a = model.add_operand(OperandType(T.TENSOR_FLOAT32, list(alpha.shape)))
    model.set_operand_value(a, alpha)
    y = model.add_operand(OperandType(T.TENSOR_FLOAT32, [0, 4, 3, 2]))
    model.add_operation(Op.PRELU, [x, a], [y])
    model.identify_inputs_and_outputs([x], [y])
    model.finish()
    assert model.get_supported_operations_for_devices([ort_device]) == [True]
    reference = next(d for d in nnapi.get_devices() if d.name == "nnapi-reference")
    for batch in (1, 3):
        value = np.random.default_rng(batch).standard_normal((batch, 4, 3, 2)).astype(np.float32)
        ours = _run(model, ort_device, value)
        np.testing.assert_array_equal(ours, _run(model, reference, value))
        np.testing.assert_array_equal(ours, np.where(value >= 0, value, value * alpha))


def _one_operation(code: int, in_dims: list[int], params: list[tuple[OperandType, object]],
                   out_dims: list[int]) -> nnapi.Model:
    model = nnapi.Model()
    x = model.add_operand(OperandType(T.TENSOR_FLOAT32, in_dims))
    inputs = [x]
    for operand_type, value in params:
        index = model.add_operand(operand_type)
        model.set_operand_value(index, value)
        inputs.append(index)
    y = model.add_operand(OperandType(T.TENSOR_FLOAT32, out_dims))
    model.add_operation(code, inputs, [y])
    model.identify_inputs_and_outputs([x], [y])
    model.finish()
    return model


def _run_shaped(model: nnapi.Model, device, x: np.ndarray, out_shape: tuple[int, ...]) -> np.ndarray:
    compilation = nnapi.Compilation(model, [device])
    compilation.finish()
    execution = nnapi.Execution(compilation)
    execution.set_input(0, x, OperandType(T.TENSOR_FLOAT32, list(x.shape)))
    out = np.zeros(out_shape, np.float32)
    execution.set_output(0, out, OperandType(T.TENSOR_FLOAT32, list(out_shape)))
    execution.compute()
    return out


def test_squeeze_and_reduce_of_known_axes_on_a_free_batch_equal_the_reference(ort_device):
    """openWakeWord's melspectrogram: SQUEEZE of its [?, 1, ?, 257] spectrogram's axis 1 and
    reductions over known axes, with the other dimensions known only at run time."""
    reference = next(d for d in nnapi.get_devices() if d.name == "nnapi-reference")
    axes = (OperandType(T.TENSOR_INT32, [1]), np.array([1], np.int32))
    squeeze = _one_operation(Op.SQUEEZE, [0, 1, 0, 5], [axes], [0, 0, 5])
    reduce_max = _one_operation(Op.REDUCE_MAX, [0, 3, 0], [(OperandType(T.TENSOR_INT32, [1]), np.array([-2], np.int32)),
                                                           (OperandType(T.BOOL), np.bool_(True))], [0, 1, 0])
    for model in (squeeze, reduce_max):
        assert model.get_supported_operations_for_devices([ort_device]) == [True]
    rng = np.random.default_rng(4)
    for batch, length in ((1, 7), (3, 2)):
        x = rng.standard_normal((batch, 1, length, 5)).astype(np.float32)
        ours = _run_shaped(squeeze, ort_device, x, (batch, length, 5))
        np.testing.assert_array_equal(ours, _run_shaped(squeeze, reference, x, (batch, length, 5)))
        np.testing.assert_array_equal(ours, x[:, 0])
        x = rng.standard_normal((batch, 3, length)).astype(np.float32)
        ours = _run_shaped(reduce_max, ort_device, x, (batch, 1, length))
        np.testing.assert_array_equal(ours, _run_shaped(reduce_max, reference, x, (batch, 1, length)))
        np.testing.assert_array_equal(ours, x.max(axis=1, keepdims=True))


@pytest.mark.parametrize("code", [Op.REDUCE_MAX, Op.REDUCE_MIN, Op.REDUCE_SUM, Op.REDUCE_PROD])
@pytest.mark.parametrize("operand_code", [T.TENSOR_FLOAT32, T.TENSOR_FLOAT16])
def test_a_float_reduction_over_an_axis_known_only_at_run_time_equals_the_reference(ort_device, code, operand_code):
    """The reduced axis may be empty at run time: the reference gives the lowest / highest
    finite value for a maximum / minimum of nothing (ONNX -inf / inf), 0 and 1 for a sum and
    a product; an axis of only -inf still has the maximum -inf."""
    reference = next(d for d in nnapi.get_devices() if d.name == "nnapi-reference")
    dtype = np.float16 if operand_code == T.TENSOR_FLOAT16 else np.float32
    model = nnapi.Model()
    x = model.add_operand(OperandType(operand_code, [2, 0]))
    axes = model.add_operand(OperandType(T.TENSOR_INT32, [1]))
    model.set_operand_value(axes, np.array([1], np.int32))
    keep = model.add_operand(OperandType(T.BOOL))
    model.set_operand_value(keep, np.bool_(False))
    y = model.add_operand(OperandType(operand_code, [2]))
    model.add_operation(code, [x, axes, keep], [y])
    model.identify_inputs_and_outputs([x], [y])
    model.finish()
    assert model.get_supported_operations_for_devices([ort_device]) == [True]
    # an empty axis arises inside a model (NNAPI inputs cannot be zero-sized): the lowered
    # graph run on one, against the reference's kernel
    import onnxruntime

    from nnapi.drivers.ort.lowering import lower_model
    from nnapi.operations import ExecutionContext, Tensor, get_operation
    from nnapi.runtime.model_builder import build_hal_model

    onnx_model, names, _ = lower_model(build_hal_model(model)[0])
    session = onnxruntime.InferenceSession(onnx_model.SerializeToString(), providers=["CPUExecutionProvider"])
    empty = np.zeros((2, 0), dtype)
    ours = session.run(None, {names[0]: empty})[0]
    operands = [Tensor(operand_code, (2, 0), 0.0, 0, None, empty),
                Tensor(T.TENSOR_INT32, (1,), 0.0, 0, None, np.array([1], np.int32)),
                Tensor(T.BOOL, (), 0.0, 0, None, np.bool_(False))]
    hal_output = build_hal_model(model)[0].main.operands[y]
    theirs = get_operation(code).execute(ExecutionContext(code, operands, [hal_output]))[0]
    np.testing.assert_array_equal(ours, theirs)
    if code in (Op.REDUCE_MAX, Op.REDUCE_MIN):
        assert np.isfinite(ours).all()
    values = [np.full((2, 3), -np.inf, dtype), np.random.default_rng(2).standard_normal((2, 5)).astype(dtype)]
    for value in values:
        results = []
        for device in (ort_device, reference):
            compilation = nnapi.Compilation(model, [device])
            compilation.finish()
            execution = nnapi.Execution(compilation)
            execution.set_input(0, value, OperandType(operand_code, list(value.shape)))
            out = np.zeros(2, dtype)
            execution.set_output(0, out)
            execution.compute()
            results.append(out)
        np.testing.assert_allclose(results[0], results[1], rtol=1e-3 if dtype == np.float16 else 1e-6)


def test_a_quantized_reduction_over_an_axis_of_unknown_size_stays_declined():
    """Where the identities are not known to agree (8-bit values, booleans) the reduced
    axes must have known sizes."""
    from nnapi.drivers.ort.device import OrtDevice
    from nnapi.runtime.model_builder import build_hal_model

    model = nnapi.Model()
    x = model.add_operand(OperandType(T.TENSOR_QUANT8_ASYMM, [2, 0], 0.5, 3))
    axes = model.add_operand(OperandType(T.TENSOR_INT32, [1]))
    model.set_operand_value(axes, np.array([1], np.int32))
    keep = model.add_operand(OperandType(T.BOOL))
    model.set_operand_value(keep, np.bool_(False))
    y = model.add_operand(OperandType(T.TENSOR_QUANT8_ASYMM, [2], 0.5, 3))
    model.add_operation(Op.REDUCE_MAX, [x, axes, keep], [y])
    model.identify_inputs_and_outputs([x], [y])
    model.finish()
    hal_model, _ = build_hal_model(model)
    assert OrtDevice().get_unsupported_reasons(hal_model) == ["REDUCE_MAX needs the size of each axis it reduces"]
