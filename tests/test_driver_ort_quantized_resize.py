"""nnapi-ort-cpu: the TFLite importer's rounding chains around a quantized RESIZE_BILINEAR
(drivers/ort/quantized_resize.py) as one Resize of the stored integers and one
QuantizeLinear: the values of the rounding formula and of the reference, and the form."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import nnapi  # noqa: E402
from helpers import constant, reference_device  # noqa: E402
from nnapi import OperandCode as T  # noqa: E402
from nnapi import OperandType  # noqa: E402
from nnapi import OperationCode as Op  # noqa: E402
from nnapi.drivers.ort import quantized_resize  # noqa: E402
from nnapi.drivers.ort.builder import int16_add_supported  # noqa: E402
from nnapi.drivers.ort.lowering import lower_model  # noqa: E402
from nnapi.operations.quant_math import HALF_BELOW_FLOAT32  # noqa: E402
from nnapi.operations.resize import weighted_taps  # noqa: E402
from nnapi.runtime.model_builder import build_hal_model  # noqa: E402

pytestmark = pytest.mark.usefixtures("calibration_file")

#: the element-wise passes the operation-by-operation lowering rounds with (QUANTIZE's
#: halves away from zero; the uint8 CAST's saturation)
_PLAIN_ROUNDING = {"Sign", "Abs", "Floor", "Div", "Where", "IsNaN", "Clip"}


def _chain(chain: str, in_size, out_size, channels: int, flags, zero_point: int, *, out_scale: float = 0.05,
           blend_out: bool = False):
    """The importer's chain around RESIZE_BILINEAR (NHWC, batch 2): ``uint8``: CAST, the
    float resize, ADD half_below(0.5), CAST; ``int8`` / ``requantized uint8``: DEQUANTIZE,
    the float resize, QUANTIZE (to ``out_scale``). ``blend_out``: the float blend is a
    model output too."""
    code = T.TENSOR_QUANT8_ASYMM if chain in ("uint8", "requantized uint8") else T.TENSOR_QUANT8_ASYMM_SIGNED
    shape_in, shape_out = [2, *in_size, channels], [2, *out_size, channels]
    model = nnapi.Model()
    x = model.add_operand(OperandType(code, shape_in, 0.05, zero_point))
    real = model.add_operand(OperandType(T.TENSOR_FLOAT32, shape_in))
    model.add_operation(Op.CAST if chain == "uint8" else Op.DEQUANTIZE, [x], [real])
    blend = model.add_operand(OperandType(T.TENSOR_FLOAT32, shape_out))
    model.add_operation(Op.RESIZE_BILINEAR, [real, constant(model, T.INT32, np.int32(out_size[1])),
                                             constant(model, T.INT32, np.int32(out_size[0])),
                                             *(constant(model, T.BOOL, np.bool_(f)) for f in (False, *flags))],
                        [blend])
    y = model.add_operand(OperandType(code, shape_out, out_scale, zero_point))
    if chain == "uint8":
        shifted = model.add_operand(OperandType(T.TENSOR_FLOAT32, shape_out))
        half = constant(model, T.TENSOR_FLOAT32, np.array([HALF_BELOW_FLOAT32], np.float32), [1])
        model.add_operation(Op.ADD, [blend, half, constant(model, T.INT32, np.int32(0))], [shifted])
        model.add_operation(Op.CAST, [shifted], [y])
    else:
        model.add_operation(Op.QUANTIZE, [blend], [y])
    model.identify_inputs_and_outputs([x], [y, blend] if blend_out else [y])
    model.finish()
    dtype = np.int8 if code == T.TENSOR_QUANT8_ASYMM_SIGNED else np.uint8
    info = np.iinfo(dtype)
    value = np.random.default_rng(7).integers(info.min, info.max + 1, shape_in).astype(dtype)
    return model, value, shape_out


def _run(model, device, value, shape_out, dtype, blend_out=False):
    compilation = nnapi.Compilation(model, [device])
    compilation.finish()
    execution = nnapi.Execution(compilation)
    execution.set_input(0, value)
    y = np.zeros(shape_out, dtype)
    execution.set_output(0, y)
    if blend_out:
        execution.set_output(1, np.zeros(shape_out, np.float32))
    execution.compute()
    return y.astype(np.float64)


def _blend(value: np.ndarray, out_size, flags) -> np.ndarray:
    """The exact (float64) bilinear blend of the stored integers with the reference's taps."""
    align_corners, half_pixel = flags
    rows = weighted_taps(value.shape[1], out_size[0], align_corners, half_pixel)
    cols = weighted_taps(value.shape[2], out_size[1], align_corners, half_pixel)
    v = value.astype(np.float64)
    top = v[:, rows[0]] * rows[2].astype(np.float64)[None, :, None, None] + \
        v[:, rows[1]] * rows[3].astype(np.float64)[None, :, None, None]
    return top[:, :, cols[0]] * cols[2].astype(np.float64)[None, None, :, None] + \
        top[:, :, cols[1]] * cols[3].astype(np.float64)[None, None, :, None]


def _formula(chain: str, blend: np.ndarray, zero_point: int) -> np.ndarray:
    """The chain's value: C's round (halves away from zero) of the blend, about 0 for the
    uint8 chain (the stored integers' blend, never negative), about the zero point for a
    requantizing one (its real values' blend over the scale)."""
    center = 0 if chain == "uint8" else zero_point
    y = blend - center
    return np.copysign(np.floor(np.abs(y) + 0.5), y) + center


def _operators(model) -> list[str]:
    return [node.op_type for node in lower_model(build_hal_model(model)[0])[0].graph.node]


_EXACT = [((8, 8), (64, 64), 5, (False, True)), ((4, 4), (8, 8), 3, (False, False)),
          ((5, 5), (9, 9), 4, (True, False)), ((6, 6), (12, 12), 1, (False, True))]


@pytest.mark.parametrize("chain, zero_point", [("uint8", 0), ("uint8", 131), ("int8", 3), ("int8", -128),
                                               ("requantized uint8", 77)])
@pytest.mark.parametrize("in_size, out_size, channels, flags", _EXACT)
def test_a_rounding_resize_chain_is_one_resize_and_the_formula_bit_for_bit(ort_device, chain, zero_point, in_size,
                                                                           out_size, channels, flags):
    """Where the taps are exact binary fractions (8x and 2x half-pixel, 2x, align_corners
    5 -> 9; one channel through NCHW), the chain is DequantizeLinear, Resize,
    QuantizeLinear (no element-wise rounding passes over the resized output: deeplab's
    8x head went from ~0.75 to ~7 ms of node time with them) and gives the rounding
    formula bit for bit: C's round of the exact blend of the stored integers, halves
    away from the zero point. The reference: the same values for the uint8 chain (its
    float32 blend of the integers is exact too); for int8 the same except where the blend
    is exactly a half, which its float32 roundings of the real values decide (a step
    either way)."""
    model, value, shape_out = _chain(chain, in_size, out_size, channels, flags, zero_point)
    operators = _operators(model)
    assert operators.count("Resize") == 1 and operators[-1] == "QuantizeLinear"
    assert not _PLAIN_ROUNDING & set(operators), operators
    dtype = value.dtype
    ours = _run(model, ort_device, value, shape_out, dtype)
    blend = _blend(value, out_size, flags)
    expected = _formula(chain, blend, zero_point)
    np.testing.assert_array_equal(ours, expected)
    theirs = _run(model, reference_device(), value, shape_out, dtype)
    halves = (blend - np.floor(blend)) == 0.5
    if out_size[0] > in_size[0] + 1:
        assert halves.any()  # the ties this is about
    if chain == "uint8":
        np.testing.assert_array_equal(theirs, ours)
    else:
        np.testing.assert_array_equal(theirs[~halves], ours[~halves])
        assert np.abs(theirs - ours).max() <= 1


@pytest.mark.parametrize("chain, zero_point", [("uint8", 0), ("int8", -128), ("int8", 5), ("requantized uint8", 77)])
@pytest.mark.parametrize("out_size, flags", [((16, 16), (False, True)), ((7, 5), (False, False)),
                                             ((9, 3), (True, False))])
def test_a_one_pixel_chain_is_the_pixel_expanded(ort_device, chain, zero_point, out_size, flags):
    """DeepLab's image-pooling branch: a chain blending a 1x1 input is one Expand (no Resize,
    DequantizeLinear or QuantizeLinear), every output pixel the input's stored value, the
    reference's values bit for bit (its blend of v with itself rounds back to v). The int8
    input's shift to uint8 and back is a DequantizeLinear / QuantizeLinear pair each way
    where ONNX Runtime has no uint8 Add (before 1.21), no part of the chain."""
    model, value, shape_out = _chain(chain, (1, 1), out_size, 24, flags, zero_point)
    operators = _operators(model)
    assert operators.count("Expand") == 1 and "Resize" not in operators, operators
    shifts = 2 if chain == "int8" and not int16_add_supported() else 0
    assert operators.count("DequantizeLinear") == operators.count("QuantizeLinear") == shifts, operators
    ours = _run(model, ort_device, value, shape_out, value.dtype)
    np.testing.assert_array_equal(ours, np.broadcast_to(value.astype(np.float64), shape_out))
    np.testing.assert_array_equal(ours, _run(model, reference_device(), value, shape_out, value.dtype))


@pytest.mark.parametrize("chain", ["uint8", "int8"])
@pytest.mark.parametrize("in_size, out_size, flags", [((13, 11), (40, 31), (False, True)),
                                                      ((5, 7), (9, 12), (True, False)),
                                                      ((9, 12), (4, 5), (False, True))])
def test_other_taps_blend_in_float32_within_a_step(ort_device, chain, in_size, out_size, flags):
    """Taps that are not exact binary fractions (13 -> 40, align_corners 7 -> 12, a
    downscale) blend in float32, as the operation-by-operation lowering's Resize did: the
    formula's value wherever the blend is not within float32's rounding of a half, within
    a step of it and of the reference everywhere."""
    model, value, shape_out = _chain(chain, in_size, out_size, 3, flags, -5 if chain == "int8" else 0)
    assert not _PLAIN_ROUNDING & set(_operators(model))
    ours = _run(model, ort_device, value, shape_out, value.dtype)
    blend = _blend(value, out_size, flags)
    expected = _formula(chain, blend, -5 if chain == "int8" else 0)
    clear = np.abs(blend - np.floor(blend) - 0.5) > 1e-3
    assert clear.mean() > 0.9
    np.testing.assert_array_equal(ours[clear], expected[clear])
    theirs = _run(model, reference_device(), value, shape_out, value.dtype)
    assert np.abs(ours - expected).max() <= 1 and np.abs(ours - theirs).max() <= 1


@pytest.mark.parametrize("case", ["another scale", "blend read elsewhere"])
def test_a_chain_that_is_not_the_importers_lowers_operation_by_operation(ort_device, case):
    """A QUANTIZE to another scale (a requantization, not the resize's rounding) or a blend
    that is also a model output: each operation lowers on its own, the reference's values
    within a step."""
    blend_out = case == "blend read elsewhere"
    model, value, shape_out = _chain("int8", (4, 4), (8, 8), 3, (False, True), 3,
                                     out_scale=0.07 if case == "another scale" else 0.05, blend_out=blend_out)
    assert _PLAIN_ROUNDING & set(_operators(model))
    ours = _run(model, ort_device, value, shape_out, np.int8, blend_out)
    theirs = _run(model, reference_device(), value, shape_out, np.int8, blend_out)
    assert np.abs(ours - theirs).max() <= 1 and len(np.unique(ours)) > 20


def test_the_rounding_probe_refuses_a_quantize_that_rounds_halves_to_even(ort_device, monkeypatch):
    """The one-off probe is what allows the form: QuantizeLinear of scale 1 (halves to
    even, 2.5 -> 2) fails it, and the chain then lowers operation by operation, with the
    formula's values all the same."""
    assert quantized_resize._quantize_rounds_halves_away()
    monkeypatch.setattr(quantized_resize, "ROUNDING_SCALE", np.float32(1.0))
    quantized_resize._quantize_rounds_halves_away.cache_clear()
    try:
        assert not quantized_resize._quantize_rounds_halves_away()
        model, value, shape_out = _chain("int8", (4, 4), (8, 8), 3, (False, True), 3)
        assert _PLAIN_ROUNDING & set(_operators(model))
        ours = _run(model, ort_device, value, shape_out, np.int8)
        assert np.abs(ours - _formula("int8", _blend(value, (8, 8), (False, True)), 3)).max() <= 1
    finally:
        monkeypatch.undo()
        quantized_resize._quantize_rounds_halves_away.cache_clear()
    assert quantized_resize._quantize_rounds_halves_away()


@pytest.mark.parametrize("dtype, zero_point", [("uint8", 131), ("int8", -7)])
def test_the_imported_tflite_resize_is_recognised(ort_device, dtype, zero_point):
    """What the TFLite importer writes for a quantized RESIZE_BILINEAR (16 -> 32, half
    pixel, 21 channels) is the chain recognised here: one Resize and one QuantizeLinear,
    the formula's values on nnapi-ort-cpu."""
    pytest.importorskip("tflite")
    from tflite_builder import Tensor, single_op

    tensors = [Tensor("x", dtype, [1, 16, 16, 21], scale=0.05, zero_point=zero_point),
               Tensor("size", "int32", [2], data=np.array([32, 32], np.int32)),
               Tensor("y", dtype, [1, 32, 32, 21], scale=0.05, zero_point=zero_point)]
    data = single_op("RESIZE_BILINEAR", tensors, [0, 1], [2],
                     ("ResizeBilinearOptions", {"HalfPixelCenters": True, "AlignCorners": False}))
    imported = nnapi.load_tflite(data)
    operators = _operators(imported.model)
    assert operators.count("Resize") == 1 and not _PLAIN_ROUNDING & set(operators), operators
    info = np.iinfo(dtype)
    x = np.random.default_rng(3).integers(info.min, info.max + 1, (1, 16, 16, 21)).astype(dtype)
    got = nnapi.Session(data, devices=["nnapi-ort-cpu"]).run({"x": x})["y"].astype(np.float64)
    chain = "uint8" if dtype == "uint8" else "int8"
    np.testing.assert_array_equal(got, _formula(chain, _blend(x, (32, 32), (False, True)), zero_point))
