"""nnapi-ort-cpu: a float32 activation of a convolution's DEPTH_TO_SPACE runs before the
DEPTH_TO_SPACE (activated_depth_space.py), where ORT fuses it into the convolution: the same
values bit for bit as the graph that keeps the order, and within the float tolerance of the
reference; left where it would not fuse."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import nnapi  # noqa: E402
from helpers import lowered_graph, operand_adder, reference_device, run_on  # noqa: E402
from nnapi import OperandCode as T  # noqa: E402
from nnapi import OperationCode as Op  # noqa: E402
from nnapi.drivers.ort.activated_depth_space import activate_before_depth_to_space  # noqa: E402
from nnapi.runtime.model_builder import build_hal_model  # noqa: E402

pytestmark = pytest.mark.usefixtures("calibration_file")

_SHAPE_IN, _SHAPE_OUT = [1, 6, 5, 3], [1, 12, 10, 16]


def _model(activation: Op, alpha: np.ndarray | None = None, conv_output: bool = False,
           moved_output: bool = False, code: T = T.TENSOR_FLOAT32) -> nnapi.Model:
    """[1, 6, 5, 3] -> CONV_2D 3x3 to 64 -> DEPTH_TO_SPACE 2 -> ``activation`` (PRELU of
    ``alpha``) -> [1, 12, 10, 16]; ``conv_output`` / ``moved_output``: the convolution's /
    the DEPTH_TO_SPACE's result a model output too."""
    rng = np.random.default_rng(7)
    model = nnapi.Model()
    operand = operand_adder(model)
    x = operand(code, _SHAPE_IN)
    dtype = np.float32 if code == T.TENSOR_FLOAT32 else np.float16
    w = operand(code, [64, 3, 3, 3], rng.standard_normal((64, 3, 3, 3)).astype(dtype))
    b = operand(code, [64], rng.standard_normal(64).astype(dtype))
    conv = operand(code, [1, 6, 5, 64])
    model.add_operation(Op.CONV_2D, [x, w, b, *(operand(T.INT32, None, np.int32(v)) for v in (1, 1, 1, 0))], [conv])
    moved = operand(code, _SHAPE_OUT)
    model.add_operation(Op.DEPTH_TO_SPACE, [conv, operand(T.INT32, None, np.int32(2))], [moved])
    y = operand(code, _SHAPE_OUT)
    inputs = [moved] + ([operand(code, list(alpha.shape), alpha.astype(dtype))] if alpha is not None else [])
    model.add_operation(activation, inputs, [y])
    outputs = [y] + ([conv] if conv_output else []) + ([moved] if moved_output else [])
    model.identify_inputs_and_outputs([x], outputs)
    model.finish()
    return model


def _run(model: nnapi.Model, device, value: np.ndarray, count: int) -> list[np.ndarray]:
    shapes = [_SHAPE_OUT, [1, 6, 5, 64], _SHAPE_OUT][:count]
    return run_on(model, device, [value], [np.zeros(s, value.dtype) for s in shapes])


def _activation_reads_conv(model: nnapi.Model, onnx_type: str) -> bool:
    """Whether the lowered ``onnx_type`` node reads the Conv's result (through layout
    Transposes only), not the DEPTH_TO_SPACE's."""
    graph = lowered_graph(model)
    producer = {output: node for node in graph.node for output in node.output}
    node = next(n for n in graph.node if n.op_type == onnx_type)
    source = producer.get(node.input[0])
    while source is not None and source.op_type == "Transpose":
        source = producer.get(source.input[0])
    return source is not None and source.op_type == "Conv"


_VALUE = np.random.default_rng(3).standard_normal(_SHAPE_IN).astype(np.float32)


@pytest.mark.parametrize("activation, alpha, onnx_type", [
    (Op.PRELU, np.array([0.2], np.float32), "LeakyRelu"),       # TFLite's LEAKY_RELU as imported
    (Op.PRELU, np.full((1, 1, 16), 0.75, np.float32), "LeakyRelu"),
    (Op.RELU, None, "Relu"),
    (Op.RELU6, None, "Clip"),
])
def test_activation_moves_before_depth_to_space(ort_device, activation, alpha, onnx_type):
    """The activation reads the convolution's result; the outputs equal those of the graph
    where the convolution's result is also a model output (which keeps the order) bit for
    bit, and the reference's within 1e-5 of the largest value."""
    model = _model(activation, alpha)
    hal = build_hal_model(model)[0]
    assert activate_before_depth_to_space(hal) is not hal
    assert _activation_reads_conv(model, onnx_type)
    kept = _model(activation, alpha, conv_output=True)
    assert not _activation_reads_conv(kept, onnx_type)
    ours = _run(model, ort_device, _VALUE, 1)[0]
    np.testing.assert_array_equal(ours, _run(kept, ort_device, _VALUE, 2)[0])
    theirs = _run(model, reference_device(), _VALUE, 1)[0]
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-5 * np.abs(theirs).max())
    assert (ours < 0).any() == (activation == Op.PRELU)


@pytest.mark.parametrize("case", ["moved output", "per-channel alpha", "float16"])
def test_activation_stays_after_depth_to_space(ort_device, case):
    """Left in place where the DEPTH_TO_SPACE's result is read elsewhere (a model output),
    for a PRELU alpha of several values (which would not fuse) and for float16 values."""
    alpha = np.linspace(0.1, 0.4, 16, dtype=np.float32) if case == "per-channel alpha" else np.array([0.2], np.float32)
    code = T.TENSOR_FLOAT16 if case == "float16" else T.TENSOR_FLOAT32
    model = _model(Op.PRELU, alpha, moved_output=case == "moved output", code=code)
    hal = build_hal_model(model)[0]
    assert activate_before_depth_to_space(hal) is hal
    value = _VALUE.astype(np.float16) if code == T.TENSOR_FLOAT16 else _VALUE
    outputs = [np.zeros(_SHAPE_OUT, value.dtype) for _ in range(2 if case == "moved output" else 1)]
    ours = run_on(model, ort_device, [value], [o.copy() for o in outputs])
    theirs = run_on(model, reference_device(), [value], [o.copy() for o in outputs])
    tolerance = 1e-2 if code == T.TENSOR_FLOAT16 else 1e-5
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a.astype(np.float32), b.astype(np.float32), rtol=0,
                                   atol=tolerance * np.abs(b.astype(np.float32)).max())
