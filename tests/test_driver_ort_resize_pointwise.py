"""nnapi-ort-cpu: a float RESIZE_BILINEAR read only by a 1x1 CONV_2D to fewer channels is
lowered with the convolution first (resize_pointwise.py), with the reference's values."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import nnapi  # noqa: E402
from helpers import lowered_graph, lowered_node_types, operand_adder, reference_device, run_on  # noqa: E402
from nnapi import OperandCode as T  # noqa: E402
from nnapi import OperationCode as Op  # noqa: E402

pytestmark = pytest.mark.usefixtures("calibration_file")


def _pyramid_step(batch: int, channels: int, filters: int, fuse: int, flags: tuple[bool, bool],
                  also_read: bool = False) -> nnapi.Model:
    """[batch, 5, 6, channels] -> RESIZE_BILINEAR to 10x12 (align_corners, half_pixel) ->
    CONV_2D 1x1 to ``filters`` with fused activation ``fuse``; ``also_read``: the resized
    value is a model output too."""
    rng = np.random.default_rng(channels + filters)
    model = nnapi.Model()
    operand = operand_adder(model)

    x = operand(T.TENSOR_FLOAT32, [batch, 5, 6, channels])
    resized = operand(T.TENSOR_FLOAT32, [batch, 10, 12, channels])
    model.add_operation(Op.RESIZE_BILINEAR, [x, operand(T.INT32, [], np.int32(12)), operand(T.INT32, [], np.int32(10)),
                                             operand(T.BOOL, [], np.bool_(False)),
                                             operand(T.BOOL, [], np.bool_(flags[0])),
                                             operand(T.BOOL, [], np.bool_(flags[1]))], [resized])
    weights = operand(T.TENSOR_FLOAT32, [filters, 1, 1, channels],
                      rng.standard_normal((filters, 1, 1, channels)).astype(np.float32))
    bias = operand(T.TENSOR_FLOAT32, [filters], rng.standard_normal(filters).astype(np.float32))
    y = operand(T.TENSOR_FLOAT32, [batch, 10, 12, filters])
    scalars = [operand(T.INT32, [], np.int32(v)) for v in (2, 1, 1, fuse)]  # VALID, strides 1
    model.add_operation(Op.CONV_2D, [resized, weights, bias, *scalars], [y])
    model.identify_inputs_and_outputs([x], [y, *([resized] if also_read else [])])
    model.finish()
    return model


def _check(model, device, batch, shapes) -> None:
    x = np.random.default_rng(batch).uniform(-1, 1, (batch, 5, 6, 48)).astype(np.float32)
    ours, theirs = (run_on(model, d, [x], [np.zeros(shape, np.float32) for shape in shapes], typed=True)
                    for d in (device, reference_device()))
    for a, b in zip(ours, theirs):
        scale = np.abs(b).max()
        assert np.abs(a - b).max() <= 4e-6 * scale and len(np.unique(a)) > 100


@pytest.mark.parametrize("fuse", [0, 1, 3])
@pytest.mark.parametrize("flags", [(False, False), (True, False), (False, True)])
def test_a_resize_before_a_reducing_pointwise_convolution_runs_after_it(ort_device, fuse, flags):
    """48 channels resized to twice the size then reduced to 16: lowered as the 1x1
    convolution on the small image (no bias), the Resize of its 16 channels, and a 1x1
    depthwise convolution adding the bias with the activation; the reference's values to
    float32 rounding, in each coordinate mode, with no activation, RELU and RELU6."""
    model = _pyramid_step(1, 48, 16, fuse, flags)
    assert all(model.get_supported_operations_for_devices([ort_device]))
    graph = lowered_graph(model)
    ops = [node.op_type for node in graph.node]
    assert ops.index("Conv") < ops.index("Resize") < len(ops) - 1 - ops[::-1].index("Conv")
    assert [16, 48, 1, 1] in [list(t.dims) for t in graph.initializer]
    _check(model, ort_device, 1, [(1, 10, 12, 16)])


def test_a_resize_read_elsewhere_or_before_a_widening_convolution_stays_first(ort_device):
    """Where the resized value is also a model output, or the convolution widens (48 ->
    64), the resize runs first as written; the reference's values either way."""
    for model, shapes in ((_pyramid_step(1, 48, 16, 1, (False, True), also_read=True), [(1, 10, 12, 16),
                                                                                        (1, 10, 12, 48)]),
                          (_pyramid_step(1, 48, 64, 1, (False, True)), [(1, 10, 12, 64)])):
        ops = lowered_node_types(model)
        assert ops.index("Resize") < ops.index("Conv")
        _check(model, ort_device, 1, shapes)


def test_a_resize_on_a_free_batch_runs_after_the_convolution(ort_device):
    """A free batch (1 and 3 at run time): the same lowering, the reference's values."""
    model = _pyramid_step(0, 48, 16, 3, (False, True))
    ops = lowered_node_types(model)
    assert ops.index("Conv") < ops.index("Resize")
    for batch in (1, 3):
        _check(model, ort_device, batch, [(batch, 10, 12, 16)])
