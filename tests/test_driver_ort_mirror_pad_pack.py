"""MIRROR_PAD (both modes) and PACK on nnapi-ort-cpu equal the reference's, for every
value type (data movement: bit for bit); what it cannot lower it declines naming the rule."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import nnapi  # noqa: E402
from helpers import run_on  # noqa: E402
from nnapi import OperandCode as T  # noqa: E402
from nnapi import OperandType  # noqa: E402
from nnapi import OperationCode as Op  # noqa: E402
from nnapi.drivers.ort.device import OrtDevice  # noqa: E402
from nnapi.operand import dtype_of  # noqa: E402
from nnapi.runtime.model_builder import build_hal_model  # noqa: E402

pytestmark = pytest.mark.usefixtures("calibration_file")

_TYPES = [(T.TENSOR_FLOAT32, 0.0, 0), (T.TENSOR_FLOAT16, 0.0, 0), (T.TENSOR_INT32, 0.0, 0),
          (T.TENSOR_QUANT8_ASYMM, 0.5, 3), (T.TENSOR_QUANT8_ASYMM_SIGNED, 0.25, -7)]


def _values(code: int, shape: tuple[int, ...], rng) -> np.ndarray:
    dtype = dtype_of(code)
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return rng.integers(max(info.min, -1000), min(info.max, 1000) + 1, shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def _run(model: nnapi.Model, device, inputs: list[np.ndarray], output_type: OperandType) -> np.ndarray:
    return run_on(model, device, inputs, [np.zeros(output_type.dimensions, dtype_of(output_type.type))])[0]


def _both(model: nnapi.Model, ort_device, inputs, output_type) -> tuple[np.ndarray, np.ndarray]:
    assert model.get_supported_operations_for_devices([ort_device]) == [True]
    reference = next(d for d in nnapi.get_devices() if d.name == "nnapi-reference")
    return _run(model, ort_device, inputs, output_type), _run(model, reference, inputs, output_type)


def _mirror_pad_model(code, scale, zero_point, shape, paddings, mode) -> tuple[nnapi.Model, OperandType]:
    model = nnapi.Model()
    x = model.add_operand(OperandType(code, list(shape), scale, zero_point))
    pads = model.add_operand(OperandType(T.TENSOR_INT32, [len(shape), 2]))
    model.set_operand_value(pads, np.asarray(paddings, np.int32))
    mode_operand = model.add_operand(OperandType(T.INT32))
    model.set_operand_value(mode_operand, np.int32(mode))
    out_shape = [d + sum(p) for d, p in zip(shape, paddings)]
    out_type = OperandType(code, out_shape, scale, zero_point)
    y = model.add_operand(out_type)
    model.add_operation(Op.MIRROR_PAD, [x, pads, mode_operand], [y])
    model.identify_inputs_and_outputs([x], [y])
    model.finish()
    return model, out_type


@pytest.mark.parametrize("code, scale, zero_point", _TYPES)
@pytest.mark.parametrize("mode", [0, 1])
@pytest.mark.parametrize("shape, paddings", [((1, 5, 6, 3), [[0, 0], [2, 1], [3, 4], [0, 0]]),
                                             ((7,), [[6, 5]]),
                                             ((2, 3, 4), [[1, 1], [0, 2], [3, 0]])])
def test_mirror_pad_equals_the_reference(ort_device, code, scale, zero_point, mode, shape, paddings):
    if mode == 0:  # REFLECT: each padding below the dimension
        paddings = [[min(b, d - 1), min(a, d - 1)] for (b, a), d in zip(paddings, shape)]
    model, out_type = _mirror_pad_model(code, scale, zero_point, shape, paddings, mode)
    x = _values(code, shape, np.random.default_rng(len(shape) + mode))
    ours, theirs = _both(model, ort_device, [x], out_type)
    np.testing.assert_array_equal(ours, theirs)
    np.testing.assert_array_equal(ours, np.pad(x, paddings, mode="reflect" if mode == 0 else "symmetric"))


def test_symmetric_padding_as_large_as_the_dimension_is_claimed(ort_device) -> None:
    """SYMMETRIC pads up to the whole dimension (REFLECT one less): [a b c] -> [c b a a b c]."""
    model, out_type = _mirror_pad_model(T.TENSOR_FLOAT32, 0.0, 0, (1, 3), [[0, 0], [3, 0]], 1)
    hal_model, _ = build_hal_model(model)
    assert OrtDevice().get_unsupported_reasons(hal_model) == [None]
    ours, theirs = _both(model, ort_device, [np.array([[1, 2, 3]], np.float32)], out_type)
    np.testing.assert_array_equal(ours, [[3, 2, 1, 1, 2, 3]])
    np.testing.assert_array_equal(ours, theirs)


@pytest.mark.parametrize("code, scale, zero_point", _TYPES)
@pytest.mark.parametrize("axis", [0, 1, 2, -1, -3])
def test_pack_equals_the_reference(ort_device, code, scale, zero_point, axis):
    shape = (3, 4)
    rng = np.random.default_rng(axis + 5)
    parts = [_values(code, shape, rng) for _ in range(3)]
    model = nnapi.Model()
    axis_operand = model.add_operand(OperandType(T.INT32))
    model.set_operand_value(axis_operand, np.int32(axis))
    inputs = [model.add_operand(OperandType(code, list(shape), scale, zero_point)) for _ in parts]
    expected = np.stack(parts, axis=axis)
    out_type = OperandType(code, list(expected.shape), scale, zero_point)
    y = model.add_operand(out_type)
    model.add_operation(Op.PACK, [axis_operand, *inputs], [y])
    model.identify_inputs_and_outputs(inputs, [y])
    model.finish()
    ours, theirs = _both(model, ort_device, parts, out_type)
    np.testing.assert_array_equal(ours, theirs)
    np.testing.assert_array_equal(ours, expected)
