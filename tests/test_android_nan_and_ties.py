"""NaN, infinities and equal values where Android's CPU kernels define the answer by their
comparisons (Quantize.cpp's clamp, ArgMinMax.cpp's and HeatmapMaxKeypoint.cpp's strict
scans, Reduce.cpp's std::max / std::min folds, RoiPooling.cpp's first maximum): the
reference computes Android's values and nnapi-ort-cpu gives the reference's bits."""

from __future__ import annotations

import numpy as np
import pytest

import nnapi
from helpers import reference_device, run_on
from nnapi import OperandCode as T
from nnapi import OperandType
from nnapi import OperationCode as Op

pytestmark = pytest.mark.usefixtures("calibration_file")


@pytest.fixture
def ort_device_or_none(request):
    """nnapi-ort-cpu where onnxruntime is installed, None otherwise (the reference alone)."""
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        return None
    return request.getfixturevalue("ort_device")


def _targets(ort_device_or_none) -> list[nnapi.Device]:
    return [reference_device()] + ([ort_device_or_none] if ort_device_or_none is not None else [])


@pytest.mark.parametrize("code, zero_point", [(T.TENSOR_QUANT8_ASYMM, 0), (T.TENSOR_QUANT8_ASYMM, 3),
                                              (T.TENSOR_QUANT8_ASYMM, 200), (T.TENSOR_QUANT8_ASYMM_SIGNED, -128),
                                              (T.TENSOR_QUANT8_ASYMM_SIGNED, 5)])
@pytest.mark.parametrize("size", [6, 5000])
def test_quantize_of_nan_is_the_top_of_the_range(ort_device_or_none, code, zero_point, size):
    """QUANTIZE of NaN (either sign) is 255 / 127: Quantize.cpp clamps as max(low, min(high,
    zero point + round(x / scale))) and std::min(high, NaN) is high. ONNX's QuantizeLinear
    gives NaN the zero point (nnapi-ort-cpu gave 0 / -128 before). Both sizes: the general
    rounding takes the sign with Sign below 4,096 values and with Clip from there."""
    dtype = np.uint8 if code == T.TENSOR_QUANT8_ASYMM else np.int8
    values = np.zeros(size, np.float32)
    values[:6] = [np.nan, -np.nan, 1.0, np.inf, -np.inf, -1.0]
    model = nnapi.Model()
    x = model.add_operand(OperandType(T.TENSOR_FLOAT32, [size]))
    y = model.add_operand(OperandType(code, [size], scale=1.0, zero_point=zero_point))
    model.add_operation(Op.QUANTIZE, [x], [y])
    model.identify_inputs_and_outputs([x], [y])
    model.finish()
    top, bottom = np.iinfo(dtype).max, np.iinfo(dtype).min
    expected = [top, top, min(zero_point + 1, top), top, bottom, max(zero_point - 1, bottom)]
    for device in _targets(ort_device_or_none):
        out = run_on(model, device, [values], [np.zeros(size, dtype)])[0]
        assert out[:6].tolist() == expected, device.name
        assert (out[6:] == zero_point).all(), device.name


def _single(code: Op, inputs: list[tuple[OperandType, object]], outputs: list[OperandType]) -> nnapi.Model:
    """A model of one operation: inputs with a value None are the model's inputs, the others
    constants."""
    model = nnapi.Model()
    given, indexes = [], []
    for operand_type, value in inputs:
        index = model.add_operand(operand_type)
        if value is None:
            given.append(index)
        else:
            model.set_operand_value(index, value)
        indexes.append(index)
    results = [model.add_operand(operand_type) for operand_type in outputs]
    model.add_operation(code, indexes, results)
    model.identify_inputs_and_outputs(given, results)
    model.finish()
    return model


def _android_arg(rows: np.ndarray, smallest: bool) -> list[int]:
    """ArgMinMax.cpp's scan of each row: the first value, then value > best (< for ARGMIN)."""
    found = []
    for row in rows:
        best, index = row[0], 0
        for i in range(1, row.size):
            if (row[i] < best) if smallest else (row[i] > best):
                best, index = row[i], i
        found.append(index)
    return found


@pytest.mark.parametrize("code", [Op.ARGMAX, Op.ARGMIN])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("repeat", [1, 40])
def test_argmax_argmin_never_take_a_later_nan(ort_device_or_none, code, dtype, repeat):
    """ARGMAX / ARGMIN as ArgMinMax.cpp scans: a NaN at index 0 stays (no comparison with it
    holds), a later NaN is never taken (the reference took the first NaN, as np.argmax does),
    ties give the first index (-0 and +0 too), an all -inf / +inf row index 0. ``repeat``
    40 gives the reference's compiled row scan (where nnapi[fast] is installed) rows enough."""
    nan, inf = np.nan, np.inf
    rows = np.array([[1, nan, 3, 2, 0], [nan, 1, 3, 2, 0], [1, 3, nan, 5, 0], [nan, nan, nan, nan, nan],
                     [2, nan, nan, nan, nan], [-inf, nan, -inf, nan, -inf], [inf, nan, inf, nan, inf],
                     [-0.0, 0.0, -1, 1, 0.0], [0.0, -0.0, 1, -1, -0.0], [3, 1, 3, 1, 3]], dtype)
    rows = np.tile(rows, (repeat, 1))
    code_type = T.TENSOR_FLOAT32 if dtype == np.float32 else T.TENSOR_FLOAT16
    model = _single(code, [(OperandType(code_type, list(rows.shape)), None), (OperandType(T.INT32), np.int32(1))],
                    [OperandType(T.TENSOR_INT32, [rows.shape[0]])])
    expected = _android_arg(rows, code == Op.ARGMIN)
    assert expected[:3] == ([2, 0, 3] if code == Op.ARGMAX else [4, 0, 4])
    for device in _targets(ort_device_or_none):
        out = run_on(model, device, [rows], [np.zeros(rows.shape[0], np.int32)])[0]
        assert out.tolist() == expected, device.name
    transposed = _single(code, [(OperandType(code_type, list(rows.T.shape)), None),
                                (OperandType(T.INT32), np.int32(0))], [OperandType(T.TENSOR_INT32, [rows.shape[0]])])
    for device in _targets(ort_device_or_none):
        out = run_on(transposed, device, [np.ascontiguousarray(rows.T)], [np.zeros(rows.shape[0], np.int32)])[0]
        assert out.tolist() == expected, device.name


def _heatmap_model(maps: np.ndarray) -> nnapi.Model:
    boxes = np.array([[0, 0, 10, 10]] * maps.shape[0], np.float32)
    n, size, _, k = maps.shape
    return _single(Op.HEATMAP_MAX_KEYPOINT,
                   [(OperandType(T.TENSOR_FLOAT32, list(maps.shape)), None),
                    (OperandType(T.TENSOR_FLOAT32, [n, 4]), boxes), (OperandType(T.BOOL), np.bool_(False))],
                   [OperandType(T.TENSOR_FLOAT32, [n, k]), OperandType(T.TENSOR_FLOAT32, [n, k, 2])])


def test_heatmap_max_keypoint_peak_and_step_as_android(ort_device_or_none):
    """HEATMAP_MAX_KEYPOINT as HeatmapMaxKeypoint.cpp: the peak is the first value above
    -FLT_MAX (its scan starts there and takes maxScore < value), so a NaN, even at index 0,
    is never the peak (the reference took the first NaN); a NaN in the peak's neighbourhood
    makes the Taylor step NaN (|det| < tolerance is false for NaN, so Android goes on: both
    devices left the pixel maximum)."""
    nan = np.nan
    plain = np.array([[0.1, 0.2, 0.5, 0.0], [0.2, 0.3, 0.1, 0.2], [0.0, 0.3, 0.9, 0.4], [0.1, 0.2, 0.6, 0.3]],
                     np.float32)
    maps = np.stack([plain, plain, plain])[..., None]
    maps[0, 0, 0] = nan                    # NaN first, outside the 3x3 around the peak 0.9 at (2, 2)
    maps[2, 0, 0], maps[2, 0, 1] = 1.0, nan  # peak 1.0 at (0, 0), a NaN beside it
    for device in _targets(ort_device_or_none):
        score, keypoint = run_on(_heatmap_model(maps), device, [maps],
                                 [np.zeros((3, 1), np.float32), np.zeros((3, 1, 2), np.float32)])
        assert np.isfinite(score[:2]).all() and np.isfinite(keypoint[:2]).all(), device.name
        np.testing.assert_array_equal(score[0], score[1], err_msg=device.name)  # the same 3x3 around (2, 2)
        np.testing.assert_array_equal(keypoint[0], keypoint[1], err_msg=device.name)
        assert (np.abs(keypoint[1, 0] - 2.5 / 4 * 10) <= 1.5 * 10 / 4).all(), device.name
        assert np.isnan(score[2]).all() and np.isnan(keypoint[2]).all(), device.name


def test_heatmap_max_keypoint_of_only_nan_and_minus_infinity(ort_device_or_none):
    """A heatmap of NaN and -inf only: Android's scan takes nothing (index 0, score -FLT_MAX
    before the step); its neighbourhood gives a NaN determinant, so the score and the
    keypoint are NaN on both devices, not an error."""
    maps = np.array([[[-np.inf, np.nan], [np.nan, -np.inf]]], np.float32)[..., None]
    for device in _targets(ort_device_or_none):
        score, keypoint = run_on(_heatmap_model(maps), device, [maps],
                                 [np.zeros((1, 1), np.float32), np.zeros((1, 1, 2), np.float32)])
        assert np.isnan(score).all() and np.isnan(keypoint).all(), device.name


def _android_fold(x: np.ndarray, axes: tuple[int, ...], largest: bool) -> np.ndarray:
    """Reduce.cpp's REDUCE_MAX / MIN: each output from the type's lowest / highest finite
    value, acc = std::max(acc, v) (acc < v ? v : acc) or std::min (v < acc ? v : acc) over
    the input in row-major order."""
    info = np.finfo(x.dtype)
    kept = [a for a in range(x.ndim) if a not in axes]
    out = np.full([x.shape[a] for a in kept], info.min if largest else info.max, x.dtype)
    for index in np.ndindex(*x.shape):
        at = tuple(index[a] for a in kept)
        acc, v = out[at], x[index]
        out[at] = (v if acc < v else acc) if largest else (v if v < acc else acc)
    return out


@pytest.mark.parametrize("code", [Op.REDUCE_MAX, Op.REDUCE_MIN])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("axes", [(2, 3), (1,), (0, 1), (2,), (0, 2)])
def test_float_reduce_max_min_fold_as_android(ort_device_or_none, code, dtype, axes):
    """REDUCE_MAX / MIN as Reduce.cpp folds: a NaN never enters, a group of only -inf (+inf
    for MIN) or NaN gives the lowest (highest) finite value of the type (float16's 65504),
    equal zeros keep the first in scan order.
    The reference gave NaN and -inf / +inf, numpy's choice of zero; nnapi-ort-cpu ORT's."""
    nan, inf = np.nan, np.inf
    groups = [[-inf, -inf, -inf, -inf], [1, nan, 3, nan], [nan, 1, 3, 2], [-0.0, 0.0, -1, -0.0],
              [0.0, -0.0, -1, 0.0], [inf, inf, inf, inf], [nan, nan, nan, nan], [-0.0, 2, -0.0, 0.0],
              [0.0, -0.0, 1, 0.0], [-0.0, 0.0, 1, 0.0], [-1, -2, -inf, nan], [nan, -inf, inf, 0.0]]
    x = np.array(groups, dtype).reshape(3, 4, 2, 2)  # the groups along axes (2, 3); mixed along others
    x = np.concatenate([x, -x], axis=0)              # MIN's cases: the negated groups
    model = nnapi.Model()
    code_type = T.TENSOR_FLOAT32 if dtype == np.float32 else T.TENSOR_FLOAT16
    given = model.add_operand(OperandType(code_type, list(x.shape)))
    axes_operand = model.add_operand(OperandType(T.TENSOR_INT32, [len(axes)]))
    model.set_operand_value(axes_operand, np.array(axes, np.int32))
    keep = model.add_operand(OperandType(T.BOOL))
    model.set_operand_value(keep, np.bool_(False))
    expected = _android_fold(x, axes, code == Op.REDUCE_MAX)
    y = model.add_operand(OperandType(code_type, list(expected.shape)))
    model.add_operation(code, [given, axes_operand, keep], [y])
    model.identify_inputs_and_outputs([given], [y])
    model.finish()
    assert np.isnan(x).any() and not np.isnan(expected).any()
    for device in _targets(ort_device_or_none):
        out = run_on(model, device, [x], [np.zeros(expected.shape, dtype)])[0]
        np.testing.assert_array_equal(out, expected, err_msg=device.name)
        np.testing.assert_array_equal(np.signbit(out), np.signbit(expected), err_msg=device.name)


def _android_roi_max(feature: np.ndarray, bins: int) -> np.ndarray:
    """RoiPooling.cpp's maximum of each of the bins x bins 2x2 bins of a 4x4 [1, 4, 4, C] map
    under the region [0, 0, 3, 3] at scale 1: the first value in row-major order, then each
    value > the maximum so far."""
    out = np.zeros((1, bins, bins, feature.shape[3]), feature.dtype)
    for i, j, k in np.ndindex(bins, bins, feature.shape[3]):
        first, best = True, feature.dtype.type(0)
        for h in range(2 * i, 2 * i + 2):
            for w in range(2 * j, 2 * j + 2):
                value = feature[0, h, w, k]
                if first or value > best:
                    best, first = value, False
        out[0, i, j, k] = best
    return out


@pytest.mark.parametrize("open_shape", [False, True])
def test_roi_pooling_keeps_the_first_maximum(open_shape):
    """ROI_POOLING's bins on the reference as RoiPooling.cpp scans them: of -0 and +0 the
    first in row-major order (np.max gave +0 or -0 by its own order), a NaN first stays, a
    later NaN is never taken (np.max gave NaN). The map's shape known, and given only at run
    time. (nnapi-ort-cpu's bin maxima, ReduceMax over the columns then the rows, still give
    ORT's zero and NaN here: not covered.)"""
    nan = np.nan
    patterns = [[-0.0, 0.0, -1, 0.0], [0.0, -0.0, -1, -0.0], [-1, -0.0, 0.0, -2], [nan, 1, 3, 2],
                [1, nan, 3, 2], [nan, nan, nan, nan], [-np.inf, nan, -np.inf, nan], [2, 2, nan, -0.0]]
    feature = np.zeros((1, 4, 4, len(patterns)), np.float32)
    for h, w, k in np.ndindex(4, 4, len(patterns)):  # each 2x2 bin holds the patterns in scan order
        feature[0, h, w, k] = patterns[k][2 * (h % 2) + w % 2]
    channels = feature.shape[3]
    model = nnapi.Model()
    declared = [0, 0, 0, channels] if open_shape else list(feature.shape)
    x = model.add_operand(OperandType(T.TENSOR_FLOAT32, declared))
    operands = [x]
    for code, value, shape in ((T.TENSOR_FLOAT32, np.array([[0, 0, 3, 3]], np.float32), [1, 4]),
                               (T.TENSOR_INT32, np.array([0], np.int32), [1]), (T.INT32, np.int32(2), None),
                               (T.INT32, np.int32(2), None), (T.FLOAT32, np.float32(1), None),
                               (T.FLOAT32, np.float32(1), None), (T.BOOL, np.bool_(False), None)):
        index = model.add_operand(OperandType(code, shape) if shape else OperandType(code))
        model.set_operand_value(index, value)
        operands.append(index)
    y = model.add_operand(OperandType(T.TENSOR_FLOAT32, [1, 2, 2, channels]))
    model.add_operation(Op.ROI_POOLING, operands, [y])
    model.identify_inputs_and_outputs([x], [y])
    model.finish()
    expected = _android_roi_max(feature, 2)
    assert np.signbit(expected[0, 0, 0, :2]).tolist() == [True, False]
    out = run_on(model, reference_device(), [feature], [np.zeros(expected.shape, np.float32)], typed=open_shape)[0]
    np.testing.assert_array_equal(out, expected)
    np.testing.assert_array_equal(np.signbit(out), np.signbit(expected))
