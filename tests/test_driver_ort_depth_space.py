"""nnapi-ort-cpu's 8-bit NHWC DEPTH_TO_SPACE / SPACE_TO_DEPTH as a Reshape, one Transpose and
a Reshape (data_movement._depth_space_rows) and its float DEPTH_TO_SPACE as two Transposes of
NCHW planes (data_movement._depth_to_space_planes): the reference's values bit for bit (TF's
channel order), no DepthToSpace / SpaceToDepth node; float SPACE_TO_DEPTH and the other 8-bit
ones keep the ONNX operators."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import nnapi  # noqa: E402
from helpers import constant, reference_device, run_on  # noqa: E402
from nnapi import OperandCode as T  # noqa: E402
from nnapi import OperandType  # noqa: E402
from nnapi import OperationCode as Op  # noqa: E402
from nnapi.drivers.ort.lowering import lower_model  # noqa: E402
from nnapi.runtime.model_builder import build_hal_model  # noqa: E402

pytestmark = pytest.mark.usefixtures("calibration_file")

_DTYPES = {T.TENSOR_FLOAT32: np.float32, T.TENSOR_QUANT8_ASYMM: np.uint8, T.TENSOR_QUANT8_ASYMM_SIGNED: np.int8}


@pytest.mark.parametrize("code", [T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT8_ASYMM_SIGNED, T.TENSOR_FLOAT32])
@pytest.mark.parametrize("to_space, block, nchw, channels", [
    (True, 2, False, 5), (False, 2, False, 5), (True, 3, False, 5), (False, 3, False, 4), (True, 2, True, 5),
    (True, 3, False, 1), (False, 2, False, 3)])
def test_depth_space_moves_rows(ort_device, code, to_space, block, nchw, channels):
    """Batch 2, distinct values everywhere (a channel or pixel out of place shows): the
    reference's output exactly; 8-bit values of fewer than 4 channels per block position
    (ESPCN's one) or in NCHW keep the operators, float SPACE_TO_DEPTH too."""
    height, width = 3 * block, 2 * block
    space, depth = [2, height, width, channels], [2, height // block, width // block, channels * block * block]
    shape_in, shape_out = (depth, space) if to_space else (space, depth)
    if nchw:
        shape_in, shape_out = ([s[i] for i in (0, 3, 1, 2)] for s in (shape_in, shape_out))
    quant = {} if code == T.TENSOR_FLOAT32 else {"scale": 0.5, "zero_point": 3}
    model = nnapi.Model()
    x = model.add_operand(OperandType(code, shape_in, **quant))
    y = model.add_operand(OperandType(code, shape_out, **quant))
    inputs = [x, constant(model, T.INT32, block)] + ([constant(model, T.BOOL, True)] if nchw else [])
    model.add_operation(Op.DEPTH_TO_SPACE if to_space else Op.SPACE_TO_DEPTH, inputs, [y])
    model.identify_inputs_and_outputs([x], [y])
    model.finish()
    graph = lower_model(build_hal_model(model)[0])[0].graph
    operators = [node.op_type for node in graph.node]
    onnx_op = "DepthToSpace" if to_space else "SpaceToDepth"
    if code == T.TENSOR_FLOAT32:
        assert (onnx_op in operators) == (not to_space), operators
    else:
        assert (onnx_op in operators) == (nchw or channels < 4), operators
    if code == T.TENSOR_FLOAT32 and to_space:
        # the planes form: block rows moved with their image rows, then the column phases
        perms = [list(node.attribute[0].ints) for node in graph.node if node.op_type == "Transpose"]
        assert [0, 2, 3, 1, 4] in perms and [0, 2, 1] in perms, perms
    dtype = _DTYPES[code]
    value = (np.arange(np.prod(shape_in)) % 251 - (128 if dtype == np.int8 else 0)).astype(dtype).reshape(shape_in)
    ours = run_on(model, ort_device, [value], [np.zeros(shape_out, dtype)])[0]
    theirs = run_on(model, reference_device(), [value], [np.zeros(shape_out, dtype)])[0]
    np.testing.assert_array_equal(ours, theirs)
    assert len(np.unique(theirs)) > 50
