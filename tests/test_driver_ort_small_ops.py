"""Small exact lowerings on nnapi-ort-cpu: element-wise math, lookups, requantizing
selections and parameters given at run time. Each is compared with the reference device
on real values (quantized ones bit for bit); a bad parameter given at run time fails the
run with the reference's result code; what stays declined names its rule."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import nnapi  # noqa: E402
from nnapi import OperandCode as T  # noqa: E402
from nnapi import OperandType  # noqa: E402
from nnapi import OperationCode as Op  # noqa: E402
from nnapi.conformance import float_tolerance, within_tolerance  # noqa: E402
from nnapi.drivers.ort.device import OrtDevice  # noqa: E402
from nnapi.operand import dtype_of  # noqa: E402
from nnapi.runtime.model_builder import build_hal_model  # noqa: E402

pytestmark = pytest.mark.usefixtures("calibration_file")


def _reference() -> nnapi.Device:
    return next(d for d in nnapi.get_devices() if d.name == "nnapi-reference")


class _Model:
    """A one-operation model: operands added as constants or as model inputs (with the
    value each run gives them)."""

    def __init__(self) -> None:
        self.model = nnapi.Model()
        self.inputs: list[int] = []
        self.values: list[np.ndarray] = []
        self.outputs: list[int] = []
        self.shapes: list[tuple[OperandType, tuple[int, ...]]] = []

    def given(self, operand: OperandType, value) -> int:
        index = self.model.add_operand(operand)
        self.inputs.append(index)
        self.values.append(np.asarray(value, dtype_of(operand.type)))
        return index

    def constant(self, operand: OperandType, value) -> int:
        index = self.model.add_operand(operand)
        self.model.set_operand_value(index, np.asarray(value, dtype_of(operand.type)) if value is not None else None)
        return index

    def scalar(self, code: int, value) -> int:
        return self.constant(OperandType(code), value)

    def output(self, operand: OperandType, shape: tuple[int, ...] | None = None) -> int:
        index = self.model.add_operand(operand)
        self.outputs.append(index)
        self.shapes.append((operand, tuple(operand.dimensions) if shape is None else shape))
        return index

    def operation(self, code: int, inputs: list[int]) -> nnapi.Model:
        self.model.add_operation(code, inputs, self.outputs)
        self.model.identify_inputs_and_outputs(self.inputs, self.outputs)
        self.model.finish()
        return self.model


def _compute(model: nnapi.Model, device: nnapi.Device, values: list[np.ndarray], shapes) -> list[np.ndarray] | int:
    """The outputs of ``model`` on ``device`` alone, or the NDK result code of its failure."""
    compilation = nnapi.Compilation(model, [device])
    compilation.finish()
    execution = nnapi.Execution(compilation)
    for position, value in enumerate(values):
        execution.set_input(position, value)
    outputs = [np.zeros(shape, dtype_of(operand.type)) for operand, shape in shapes]
    for position, array in enumerate(outputs):
        execution.set_output(position, array)
    try:
        execution.compute()
    except nnapi.NnapiError as error:
        return error.code
    return outputs


def _on_both(built: _Model, model: nnapi.Model, ort_device, values: list[np.ndarray] | None = None):
    """(ours, the reference's): outputs, or the result code where the run failed; the
    model runs on nnapi-ort-cpu alone (it claims every operation)."""
    assert model.get_supported_operations_for_devices([ort_device]) == [True]
    values = built.values if values is None else values
    return (_compute(model, ort_device, values, built.shapes), _compute(model, _reference(), values, built.shapes))


def _reasons(model: nnapi.Model) -> list[str | None]:
    hal_model, _ = build_hal_model(model)
    return OrtDevice().get_unsupported_reasons(hal_model)


# --- element-wise math ----------------------------------------------------------------------
@pytest.mark.parametrize("code", [T.TENSOR_FLOAT32, T.TENSOR_FLOAT16])
@pytest.mark.parametrize("operation", [Op.LOG, Op.SIN])
def test_log_and_sin_are_within_the_cts_tolerance_of_the_reference(ort_device, operation, code):
    """LOG and SIN as ONNX's Log and Sin: large arguments, zeros, negatives, infinities and
    NaN give the reference's values within the CTS tolerance (NaN where it gives NaN)."""
    rng = np.random.default_rng(1)
    largest = float(np.finfo(dtype_of(code)).max)
    value = np.concatenate([rng.uniform(-1e4, 1e4, 500), rng.uniform(-10, 10, 500),
                            [0.0, -0.0, 1e-7, largest, np.inf, -np.inf, np.nan, -1.0]]).astype(dtype_of(code))
    built = _Model()
    x = built.given(OperandType(code, [value.size]), value)
    built.output(OperandType(code, [value.size]))
    ours, theirs = _on_both(built, built.operation(operation, [x]), ort_device)
    if operation == Op.LOG:
        assert np.isnan(theirs[0]).sum() > 250 and np.isinf(theirs[0]).sum() == 3
    assert within_tolerance(code, theirs[0], ours[0], float_tolerance(code)).all()


@pytest.mark.parametrize("operation", [Op.NEG, Op.ABS])
def test_neg_and_abs_of_int32_wrap_as_the_reference(ort_device, operation):
    """NEG and ABS of TENSOR_INT32 (ONNX's Neg and Abs): -INT32_MIN and |INT32_MIN| wrap to
    INT32_MIN as two's complement, as on the reference; every value equal."""
    value = np.array([0, 1, -1, 7, -12345, 2 ** 31 - 1, -(2 ** 31), -(2 ** 31) + 1], np.int32)
    built = _Model()
    x = built.given(OperandType(T.TENSOR_INT32, [value.size]), value)
    built.output(OperandType(T.TENSOR_INT32, [value.size]))
    ours, theirs = _on_both(built, built.operation(operation, [x]), ort_device)
    np.testing.assert_array_equal(ours[0], theirs[0])
    assert ours[0][6] == -(2 ** 31)
