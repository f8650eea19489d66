"""nnapi-ort-cpu's boolean masks turned into numbers and back (drivers/ort/mask_round_trips.py):
NOT_EQUAL(views of SELECT(m, non-zeros, zeros), 0) lowers to a Reshape of m itself (EQUAL to
its Not), where that is what it computes; the reference's values either way."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import nnapi  # noqa: E402
from helpers import constant, lowered_node_types, reference_device, run_on  # noqa: E402
from nnapi import OperandCode as T  # noqa: E402
from nnapi import OperandType  # noqa: E402
from nnapi import OperationCode as Op  # noqa: E402

TOKENS = 8


def _round_trip_model(compare=Op.NOT_EQUAL, true_value=1.0, false_value=0.0, stride=1, select_out=False,
                      code=T.TENSOR_FLOAT32):
    """tokens [1, 8] int32 -> NOT_EQUAL 0 -> SELECT(m, true_value, false_value) -> RESHAPE [1,
    1, 8] -> STRIDED_SLICE (``stride``) -> ``compare`` with 0 -> the bool output (and the
    SELECT's numbers as a second output with ``select_out``). int32 numbers (which NNAPI's
    RESHAPE does not take) are compared as the SELECT gives them."""
    model = nnapi.Model()

    def op(kind, inputs, shape, out_code):
        out = model.add_operand(OperandType(out_code, list(shape)))
        model.add_operation(kind, inputs, [out])
        return out

    dtype = np.float32 if code == T.TENSOR_FLOAT32 else np.int32
    tokens = model.add_operand(OperandType(T.TENSOR_INT32, [1, TOKENS]))
    zero = constant(model, T.TENSOR_INT32, np.zeros(1, np.int32), [1])
    mask = op(Op.NOT_EQUAL, [tokens, zero], [1, TOKENS], T.TENSOR_BOOL8)
    shape = [1, 1, TOKENS]
    select_dims = [1, TOKENS]
    numbers = op(Op.SELECT, [mask, constant(model, code, np.full(select_dims, true_value, dtype), select_dims),
                             constant(model, code, np.full(select_dims, false_value, dtype), select_dims)],
                 select_dims, code)
    kept = TOKENS if stride == 1 else TOKENS // 2
    sliced, result_dims = numbers, select_dims
    if code == T.TENSOR_FLOAT32:
        viewed = op(Op.RESHAPE, [numbers, constant(model, T.TENSOR_INT32, np.array(shape, np.int32), [3])], shape,
                    code)
        ints = [constant(model, T.TENSOR_INT32, np.array(v, np.int32), [3]) for v in ([0, 0, 0], [0, 0, 0],
                                                                                      [1, 1, stride])]
        sliced = op(Op.STRIDED_SLICE, [viewed, *ints, constant(model, T.INT32, np.int32(7)),
                                       constant(model, T.INT32, np.int32(7)), constant(model, T.INT32, np.int32(0))],
                    [1, 1, kept], code)
        result_dims = [1, 1, kept]
    result = op(compare, [sliced, constant(model, code, np.zeros(1, dtype), [1])], result_dims, T.TENSOR_BOOL8)
    model.identify_inputs_and_outputs([tokens], [result, numbers] if select_out else [result])
    model.finish()
    values = [np.array([[3, 0, 7, 0, 0, 1, 9, 0]], np.int32)]
    outputs = [np.zeros(result_dims, np.bool_)] + ([np.zeros(select_dims, dtype)] if select_out else [])
    return model, values, outputs


def _check(model, values, outputs, ort_device):
    ours = run_on(model, ort_device, values, [np.zeros_like(o) for o in outputs])
    theirs = run_on(model, reference_device(), values, [np.zeros_like(o) for o in outputs])
    for mine, reference in zip(ours, theirs, strict=True):
        np.testing.assert_array_equal(mine, reference)
    return ours


@pytest.mark.parametrize("compare, true_value, false_value, code, select_out", [
    (Op.NOT_EQUAL, 1.0, 0.0, T.TENSOR_FLOAT32, False), (Op.EQUAL, 1.0, 0.0, T.TENSOR_FLOAT32, False),
    (Op.NOT_EQUAL, 0.0, -2.5, T.TENSOR_FLOAT32, False), (Op.NOT_EQUAL, float("nan"), -0.0, T.TENSOR_FLOAT32, False),
    (Op.NOT_EQUAL, 1, 0, T.TENSOR_INT32, False), (Op.NOT_EQUAL, 1.0, 0.0, T.TENSOR_FLOAT32, True),
])
def test_mask_read_back_from_its_numbers_is_the_mask(ort_device, compare, true_value, false_value, code, select_out):
    """Ones / zeros, zeros / non-zeros (the negation), NaN / -0 (NaN != 0, -0 == 0), int32, EQUAL
    (the negation) and a SELECT also read as an output: the comparison is the mask's own view
    (no Where left unless the SELECT's numbers are an output), with the reference's values."""
    model, values, outputs = _round_trip_model(compare, true_value, false_value, code=code, select_out=select_out)
    kinds = lowered_node_types(model)
    assert kinds.count("Equal") == 1, kinds  # the first NOT_EQUAL's only
    assert ("Where" in kinds) == select_out, kinds
    result = _check(model, values, outputs, ort_device)[0]
    assert result.any() and not result.all()


@pytest.mark.parametrize("change", [{"true_value": 0.5, "false_value": 0.0, "stride": 2},
                                    {"true_value": 1.0, "false_value": 0.25},
                                    {"true_value": 1.0, "false_value": float("nan")}])
def test_numbers_that_are_not_the_mask_are_compared(ort_device, change):
    """A slice of stride 2 (not the whole mask) and a false side that is not zero (0.25, NaN:
    not equal to 0) keep the comparison, with the reference's values."""
    model, values, outputs = _round_trip_model(**change)
    kinds = lowered_node_types(model)
    assert kinds.count("Equal") == 2 and "Where" in kinds, kinds
    _check(model, values, outputs, ort_device)


def test_a_slice_of_open_shape_is_not_read_as_the_whole_mask(ort_device):
    """SELECT(m, 1, 0) -> RESHAPE to a run-time shape -> STRIDED_SLICE from a run-time begin
    -> RESHAPE [8] -> NOT_EQUAL 0: the slice's input and output shapes are both unknown, which
    says nothing of what it keeps, so no Reshape of m (reviewer R2: it became one and the run
    failed in ORT's Reshape); the rows it cuts, on both devices."""
    f32, i32 = T.TENSOR_FLOAT32, T.TENSOR_INT32
    model = nnapi.Model()
    mask = model.add_operand(OperandType(T.TENSOR_BOOL8, [1, 16]))
    shape = model.add_operand(OperandType(i32, [2]))
    begin = model.add_operand(OperandType(i32, [2]))
    ones = constant(model, f32, np.ones([1, 16], np.float32), [1, 16])
    zeros = constant(model, f32, np.zeros([1, 16], np.float32), [1, 16])

    def op(kind, inputs, dims, code=f32):
        out = model.add_operand(OperandType(code, dims))
        model.add_operation(kind, inputs, [out])
        return out

    numbers = op(Op.SELECT, [mask, ones, zeros], [1, 16])
    square = op(Op.RESHAPE, [numbers, shape], [0, 0])
    none = [constant(model, T.INT32, np.int32(0)) for _ in range(3)]
    cut = op(Op.STRIDED_SLICE, [square, begin, constant(model, i32, np.array([4, 4], np.int32), [2]),
                                constant(model, i32, np.array([1, 1], np.int32), [2]), *none], [0, 0])
    flat = op(Op.RESHAPE, [cut, constant(model, i32, np.array([8], np.int32), [1])], [8])
    out = op(Op.NOT_EQUAL, [flat, constant(model, f32, np.zeros([1], np.float32), [1])], [8], T.TENSOR_BOOL8)
    model.identify_inputs_and_outputs([mask, shape, begin], [out])
    model.finish()
    m = np.random.default_rng(0).random((1, 16)) < 0.5
    feeds = [m, np.array([4, 4], np.int32), np.array([2, 0], np.int32)]
    expected = m.reshape(4, 4)[2:4].reshape(-1)
    for device in (ort_device, reference_device()):
        (got,) = run_on(model, device, feeds, [np.zeros([8], np.bool_)])
        np.testing.assert_array_equal(got, expected)
