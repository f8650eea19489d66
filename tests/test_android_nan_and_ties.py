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

