"""nnapi-ort-cpu's 8-bit operations that are a function of one input's stored value (a
quantized ADD / SUB / MUL by a one-element constant: the TFLite importer's requantizing
RELU family is a MUL by 2**k with the activation fused; a quantized HARD_SWISH): ONNX
Runtime's form where a probe on all 256 stored values proves it gives the reference's
values, else a Gather from the reference's own results. Each is compared with
nnapi-reference on every stored value."""

from __future__ import annotations

import numpy as np
import pytest

import nnapi
from helpers import imported_output, lowered_node_types, reference_device, run_on
from nnapi.codes import FuseCode, OperandCode, OperationCode
from nnapi.operand import OperandType

pytest.importorskip("onnxruntime")
pytest.importorskip("tflite")

T = OperandCode
_RANGES = {"uint8": (0, 255), "int8": (-128, 127)}
#: (input scale, zero point, output scale, zero point) on which ONNX Runtime's QLinearMul
#: (the RELU family) or quantized HardSwish differed from the reference by a step
#: (RELU: tools/quant_vs_litert.py -v --device nnapi-ort-cpu before the tables; HARD_SWISH:
#: random quantizations whose probe failed, the first on many values, the second on few)
_RELU_DIFFERING = {"uint8": [(0.002749, 22, 0.02258, 220), (0.002045, 2, 0.04149, 171)],
                   "int8": [(0.003153, 66, 0.00818, 113), (0.01156, 114, 0.3074, 30)]}
_HARD_SWISH_DIFFERING = {"uint8": [(0.09281, 86, 0.00137, 202), (0.24585, 201, 0.04182, 72)],
                         "int8": [(0.09281, -42, 0.00137, 74), (0.27143, 113, 0.00609, -52)]}


def _model(name: str, kind: str, quant: tuple[float, int, float, int]) -> bytes:
    from tflite_builder import Operator, Subgraph, Tensor, build

    in_scale, in_zero, out_scale, out_zero = quant
    tensors = [Tensor("x", kind, [256], scale=in_scale, zero_point=in_zero),
               Tensor("y", kind, [256], scale=out_scale, zero_point=out_zero)]
    return build(Subgraph(tensors, [Operator(name, [0], [1])], [0], [1]))


def _quantizations(kind: str, differing: list, seed: int) -> list[tuple[float, int, float, int]]:
    rng = np.random.default_rng(seed)
    low, high = _RANGES[kind]
    random = [(float(np.float32(10 ** rng.uniform(-3, -0.5))), int(rng.integers(low, high + 1)),
               float(np.float32(10 ** rng.uniform(-3, -0.5))), int(rng.integers(low, high + 1))) for _ in range(8)]
    return list(differing) + random


def _form(data: bytes) -> str:
    """Which form nnapi-ort-cpu lowers a one-operation model to: the reference's table (a
    Gather), ONNX Runtime's corrected on a few values (Where), or as it is."""
    types = lowered_node_types(nnapi.load_tflite(data).model)
    return "table" if "Gather" in types else "corrected" if "Where" in types else "fast"


def _check_every_stored_value(name: str, kind: str, quantizations: list) -> list[str]:
    """Asserts nnapi-ort-cpu's output equals nnapi-reference's on every stored value for each
    quantization; returns the form each lowering took."""
    low, high = _RANGES[kind]
    stored = np.arange(low, high + 1).astype(kind)
    forms = []
    for quant in quantizations:
        data = _model(name, kind, quant)
        np.testing.assert_array_equal(imported_output(data, stored, "nnapi-ort-cpu"), imported_output(data, stored),
                                      err_msg=str(quant))
        forms.append(_form(data))
    return forms


@pytest.mark.parametrize("name", ["RELU", "RELU6", "RELU_N1_TO_1"])
@pytest.mark.parametrize("kind", ["uint8", "int8"])
def test_requantizing_relu_equals_the_reference_on_every_stored_value(name, kind):
    forms = _check_every_stored_value(name, kind, _quantizations(kind, _RELU_DIFFERING[kind], 5))
    assert forms[0] == "table"  # QLinearMul's rescale differs on many values there
    assert "fast" in forms  # and is proven on others


@pytest.mark.parametrize("kind", ["uint8", "int8"])
def test_quantized_hard_swish_equals_the_reference_on_every_stored_value(kind):
    forms = _check_every_stored_value("HARD_SWISH", kind, _quantizations(kind, _HARD_SWISH_DIFFERING[kind], 6))
    assert forms[:2] == ["table", "corrected"] and "fast" in forms[2:]


def _binary_model(code: OperationCode, kind: str, x_quant: tuple[float, int], constant: tuple[float, int, int],
                  y_quant: tuple[float, int], fuse: int) -> nnapi.Model:
    operand_code = T.TENSOR_QUANT8_ASYMM if kind == "uint8" else T.TENSOR_QUANT8_ASYMM_SIGNED
    model = nnapi.Model()
    x = model.add_operand(OperandType(operand_code, [1, 16, 16, 1], *x_quant))
    c = model.add_operand(OperandType(operand_code, [1, 1, 1, 1], constant[0], constant[1]))
    model.set_operand_value(c, np.full([1, 1, 1, 1], constant[2], kind))
    f = model.add_operand(OperandType(T.INT32, []))
    model.set_operand_value(f, np.array(fuse, np.int32))
    y = model.add_operand(OperandType(operand_code, [1, 16, 16, 1], *y_quant))
    model.add_operation(code, [x, c, f], [y])
    model.identify_inputs_and_outputs([x], [y])
    model.finish()
    return model


def _every_stored_value(model: nnapi.Model, ort_device, kind: str) -> None:
    low, high = _RANGES[kind]
    feed = np.arange(low, high + 1).astype(kind).reshape(1, 16, 16, 1)
    ours, theirs = (run_on(model, device, [feed], [np.zeros_like(feed)])[0]
                    for device in (ort_device, reference_device()))
    np.testing.assert_array_equal(ours, theirs)


@pytest.mark.parametrize("kind", ["uint8", "int8"])
def test_exact_quantized_mul_keeps_qlinearmul(ort_device, kind):
    # (x - z) * 0.5 times 2 on a scale of 1: integers, no rounding, so the probe proves it
    shift = 0 if kind == "uint8" else -128
    model = _binary_model(OperationCode.MUL, kind, (0.5, 128 + shift), (1.0, shift, 2 + shift),
                          (1.0, 128 + shift), FuseCode.FUSED_NONE)
    types = lowered_node_types(model)
    assert "QLinearMul" in types and "Gather" not in types
    _every_stored_value(model, ort_device, kind)


@pytest.mark.parametrize("kind", ["uint8", "int8"])
@pytest.mark.parametrize("code", [OperationCode.ADD, OperationCode.SUB, OperationCode.MUL])
@pytest.mark.parametrize("fuse", [FuseCode.FUSED_NONE, FuseCode.FUSED_RELU6])
def test_quantized_binary_of_a_scalar_constant_equals_the_reference(ort_device, kind, code, fuse):
    low, high = _RANGES[kind]
    rng = np.random.default_rng(int(code) * 10 + int(fuse))
    for _ in range(6):
        scales = [float(np.float32(10 ** rng.uniform(-2.5, -0.5))) for _ in range(3)]
        if code == OperationCode.MUL:  # NNAPI: the output scale exceeds the inputs' product
            scales[2] = float(np.float32(scales[0] * scales[1] * 10 ** rng.uniform(0.1, 2)))
        zeros = [int(v) for v in rng.integers(low, high + 1, size=4)]
        model = _binary_model(code, kind, (scales[0], zeros[0]), (scales[1], zeros[1], zeros[2]),
                              (scales[2], zeros[3]), fuse)
        _every_stored_value(model, ort_device, kind)


@pytest.mark.parametrize("kind", ["uint8", "int8"])
def test_corrected_form_is_the_same_graph_on_first_and_later_preparations(kind, monkeypatch):
    """The Where(Equal) corrections are emitted once, whether proven now (a first
    preparation: probed as they stand) or recalled from the cache: both lowerings are the
    same graph, names included."""
    from helpers import lowered_graph
    from nnapi.drivers.ort import elementwise

    monkeypatch.setattr(elementwise, "_FORM_PROVEN", {})
    model = nnapi.load_tflite(_model("HARD_SWISH", kind, _HARD_SWISH_DIFFERING[kind][1])).model
    first = lowered_graph(model)
    assert "Where" in [node.op_type for node in first.node]  # the corrected form
    assert len(elementwise._FORM_PROVEN) == 1
    assert lowered_graph(model).SerializeToString() == first.SerializeToString()


def test_stored_value_caches_stay_bounded(monkeypatch):
    """The reference's tables and the probes' findings are cached up to a bound; a full
    cache is emptied to take the newest (it keeps working in bounded memory)."""
    from nnapi.drivers.ort import elementwise

    monkeypatch.setattr(elementwise, "_TABLE_LIMIT", 2)
    monkeypatch.setattr(elementwise, "_TABLES", {})
    monkeypatch.setattr(elementwise, "_FORM_PROVEN", {})
    sizes = []
    for quant in _HARD_SWISH_DIFFERING["uint8"] + _HARD_SWISH_DIFFERING["int8"][1:]:
        data = _model("HARD_SWISH", "uint8", (quant[0], quant[1] % 256, quant[2], quant[3] % 256))
        _form(data)
        sizes.append((len(elementwise._TABLES), len(elementwise._FORM_PROVEN)))
    assert sizes == [(1, 1), (2, 2), (1, 1)]
