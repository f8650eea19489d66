"""nnapi-ort-cpu: 1x1 CONV_2Ds between two TRANSPOSEs of the last two axes (an MLP-Mixer's
token mixing, MediaPipe's face_blendshapes) lowered as matrix products in the value's own
layout (transposed_dense.py): no Transpose and no Conv left, the reference's values."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import nnapi  # noqa: E402
from helpers import lowered_node_types, operand_adder, reference_device, run_on  # noqa: E402
from nnapi import OperandCode as T  # noqa: E402
from nnapi import OperationCode as Op  # noqa: E402

pytestmark = pytest.mark.usefixtures("calibration_file")

TOKENS, CHANNELS = 13, 24


def _mixer(batch: int, fuses: tuple[int, ...] = (1, 0), output_inside: bool = False,
           residual: bool = True) -> nnapi.Model:
    """[batch, 1, TOKENS, CHANNELS] -> TRANSPOSE [0, 1, 3, 2] -> CONV_2D 1x1 per entry of
    ``fuses`` (TOKENS -> 40 -> ... -> TOKENS, that fused activation) -> TRANSPOSE back ->
    ADD of the input (``residual``). ``output_inside``: the first convolution's output is
    a model output too."""
    rng = np.random.default_rng(len(fuses))
    model = nnapi.Model()
    operand = operand_adder(model)

    x = operand(T.TENSOR_FLOAT32, [batch, 1, TOKENS, CHANNELS])
    perm = operand(T.TENSOR_INT32, [4], np.array([0, 1, 3, 2], np.int32))
    value = operand(T.TENSOR_FLOAT32, [batch, 1, CHANNELS, TOKENS])
    model.add_operation(Op.TRANSPOSE, [x, perm], [value])
    depth = TOKENS
    outputs = []
    for position, fuse in enumerate(fuses):
        filters = TOKENS if position == len(fuses) - 1 else 40
        weights = operand(T.TENSOR_FLOAT32, [filters, 1, 1, depth],
                          rng.standard_normal((filters, 1, 1, depth)).astype(np.float32))
        bias = operand(T.TENSOR_FLOAT32, [filters], rng.standard_normal(filters).astype(np.float32))
        scalars = [operand(T.INT32, [], np.int32(v)) for v in (1, 1, 1, fuse)]  # SAME, strides 1
        y = operand(T.TENSOR_FLOAT32, [batch, 1, CHANNELS, filters])
        model.add_operation(Op.CONV_2D, [value, weights, bias, *scalars], [y])
        if position == 0 and output_inside:
            outputs.append(y)
        value, depth = y, filters
    back = operand(T.TENSOR_FLOAT32, [batch, 1, TOKENS, CHANNELS])
    model.add_operation(Op.TRANSPOSE, [value, perm], [back])
    if residual:
        total = operand(T.TENSOR_FLOAT32, [batch, 1, TOKENS, CHANNELS])
        model.add_operation(Op.ADD, [back, x, operand(T.INT32, [], np.int32(0))], [total])
        back = total
    model.identify_inputs_and_outputs([x], [back, *outputs])
    model.finish()
    return model


def _check(model: nnapi.Model, device: nnapi.Device, batch: int, shapes: list[tuple[int, ...]]) -> None:
    x = np.random.default_rng(batch).uniform(-1, 1, (batch, 1, TOKENS, CHANNELS)).astype(np.float32)
    ours, theirs = (run_on(model, d, [x], [np.zeros(shape, np.float32) for shape in shapes], typed=True)
                    for d in (device, reference_device()))
    for a, b in zip(ours, theirs):
        scale = np.abs(b).max()
        assert np.abs(a - b).max() <= 2e-6 * scale and len(np.unique(a)) > 100


@pytest.mark.parametrize("fuses", [(1, 0), (3, 2, 1), (0,)])
def test_token_mixing_is_a_chain_of_gemms_with_the_reference_values(ort_device, fuses):
    """One image: the transposed value is the [T, C] matrix itself (a Reshape), each
    convolution a Gemm by its [O, T] filters with the bias as a column, RELU / RELU1 / RELU6
    after it (Relu, Clip); no Transpose, no Conv (operation by operation: a Transpose to
    NCHW, the Conv nodes, a Transpose back)."""
    model = _mixer(1, fuses)
    assert all(model.get_supported_operations_for_devices([ort_device]))
    ops = lowered_node_types(model)
    assert "Transpose" not in ops and "Conv" not in ops and ops.count("Gemm") == len(fuses)
    assert ops.count("Relu") == fuses.count(1) and ops.count("Clip") == sum(f in (2, 3) for f in fuses)
    _check(model, ort_device, 1, [(1, 1, TOKENS, CHANNELS)])


def test_token_mixing_on_a_batch_broadcasts_the_filters(ort_device):
    """A batch of 2 and a free batch (known at run time, 1 and 3): MatMul by the filters
    (broadcast over the batch) and an Add of the bias column; the reference's values."""
    for batch in (2, 0):
        model = _mixer(batch)
        ops = lowered_node_types(model)
        assert "Transpose" not in ops and "Conv" not in ops and ops.count("MatMul") == 2
        for run_batch in ((2,) if batch else (1, 3)):
            _check(model, ort_device, run_batch, [(run_batch, 1, TOKENS, CHANNELS)])


def test_a_chain_read_inside_is_lowered_operation_by_operation(ort_device):
    """A convolution's output that is also a model output (or a chain without its second
    TRANSPOSE) keeps the operation-by-operation lowering, with the reference's values."""
    model = _mixer(1, output_inside=True)
    ops = lowered_node_types(model)
    assert "Gemm" not in ops and "Conv" in ops
    _check(model, ort_device, 1, [(1, 1, TOKENS, CHANNELS), (1, 1, CHANNELS, 40)])
