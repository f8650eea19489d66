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
