"""nnapi-ort-cpu's int32 moves: a TFLite int32 RESHAPE (which the importer moves as float32
high and low halves, 14 NNAPI operations) as one int32 Reshape (drivers/ort/int32_moves.py),
and a QUANTIZE of an EMBEDDING_LOOKUP of a constant float32 table as a Gather of the table
quantized at preparation (drivers/ort/lookups.py); both equal to the reference bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import nnapi  # noqa: E402
from helpers import constant, lowered_node_types, operand_adder, reference_device, run_on  # noqa: E402
from nnapi import OperandCode as T  # noqa: E402
from nnapi import OperationCode as Op  # noqa: E402

pytestmark = pytest.mark.usefixtures("calibration_file")

#: int32 values at the edges of the halves: float32 rounds those past 2**24
_EDGES = np.array([0, 1, -1, 65535, 65536, -65536, -65537, 2 ** 24 + 1, -(2 ** 24) - 1, 2 ** 31 - 1, -(2 ** 31),
                   -(2 ** 31) + 1, 2 ** 31 - 65536, 2 ** 31 - 129, 123456789, -987654321], np.int32)


def _int32_reshape_model(squeeze: bool) -> nnapi.Model:
    """TFLite RESHAPE [2, 1, 16] -> [32] of an int32 input (or SQUEEZE of its axis 1 to
    [2, 16]) as the importer writes it."""
    from tflite_builder import Tensor, single_op

    if squeeze:
        tensors = [Tensor("x", "int32", [2, 1, 16]), Tensor("y", "int32", [2, 16])]
        options = ("SqueezeOptions", {"SqueezeDims": [1]})
        return nnapi.load_tflite(single_op("SQUEEZE", tensors, [0], [1], options)).model
    tensors = [Tensor("x", "int32", [2, 1, 16]), Tensor("shape", "int32", [1], data=np.array([32], np.int32)),
               Tensor("y", "int32", [32])]
    return nnapi.load_tflite(single_op("RESHAPE", tensors, [0, 1], [2])).model


@pytest.mark.parametrize("squeeze", [False, True])
def test_an_int32_reshape_through_float_halves_is_one_reshape(ort_device, squeeze):
    """Every int32 edge of the halves (float32 rounding past 2**24, the int32 extremes) and
    random values come out where the reference puts them, in one Reshape: none of the
    halves' Floor, Cast, Where nodes."""
    from nnapi.runtime.model_builder import build_hal_model

    model = _int32_reshape_model(squeeze)
    hal = build_hal_model(model)[0]
    assert sum(op.type == Op.FLOOR for op in hal.main.operations) == 1  # the importer's halves are there
    rng = np.random.default_rng(5)
    value = np.concatenate([_EDGES, rng.integers(-(2 ** 31), 2 ** 31, 16, dtype=np.int64).astype(np.int32)])
    value = value.reshape(2, 1, 16)
    shape = (2, 16) if squeeze else (32,)
    got, want = (run_on(model, device, [value], [np.zeros(shape, np.int32)])[0]
                 for device in (ort_device, reference_device()))
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got, value.reshape(shape))
    types = lowered_node_types(model)
    assert types == ["Reshape"], types


def _lookup_model(table: np.ndarray, output: tuple, reshape: bool = True) -> nnapi.Model:
    """EMBEDDING_LOOKUP of ``table`` (constant float32 [rows, 8]) by 6 int32 ids, RESHAPEd to
    [1, 6, 8] (or not), QUANTIZEd into ``output`` ((code, scale, zero point)); the float rows
    are a second output (read by more than the QUANTIZE, as a language model's residual)."""
    model = nnapi.Model()
    operand = operand_adder(model)
    ids = operand(T.TENSOR_INT32, [6])
    values = operand(T.TENSOR_FLOAT32, list(table.shape), table)
    rows = operand(T.TENSOR_FLOAT32, [6, 8])
    model.add_operation(Op.EMBEDDING_LOOKUP, [ids, values], [rows])
    real, dims = rows, [6, 8]
    if reshape:
        dims = [1, 6, 8]
        real = operand(T.TENSOR_FLOAT32, dims)
        model.add_operation(Op.RESHAPE, [rows, constant(model, T.TENSOR_INT32, np.array(dims, np.int32), [3])],
                            [real])
    y = operand(output[0], dims, scale=output[1], zero_point=output[2])
    model.add_operation(Op.QUANTIZE, [real], [y])
    model.identify_inputs_and_outputs([ids], [y, rows])
    model.finish()
    return model


@pytest.mark.parametrize("reshape", [True, False])
@pytest.mark.parametrize("output", [(T.TENSOR_QUANT8_ASYMM_SIGNED, 0.05, -3), (T.TENSOR_QUANT8_ASYMM, 0.5, 128)])
def test_a_quantized_embedding_lookup_gathers_the_table_quantized_once(ort_device, output, reshape):
    """Rows of a table whose values include exact halves of the output's scale (which the
    reference rounds away from zero, QuantizeLinear to even) and values past the range:
    the reference's values bit for bit, gathered from a quantized table (no rounding node,
    two Gathers: the float rows stay a model output)."""
    rng = np.random.default_rng(9)
    table = (np.round(rng.uniform(-300, 300, (12, 8))) + 0.5).astype(np.float32) * np.float32(output[1])
    table[0, :3] = [1e9, -1e9, 0.0]
    model = _lookup_model(table, output, reshape)
    ids = np.array([0, 3, 11, 3, 7, 1], np.int32)
    shape = (1, 6, 8) if reshape else (6, 8)
    dtype = np.int8 if output[0] == T.TENSOR_QUANT8_ASYMM_SIGNED else np.uint8
    got, want = (run_on(model, device, [ids], [np.zeros(shape, dtype), np.zeros((6, 8), np.float32)])
                 for device in (ort_device, reference_device()))
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])
    types = lowered_node_types(model)
    assert not {"Floor", "QuantizeLinear", "Div"} & set(types) and types.count("Gather") == 2, types


def test_a_quantized_lookup_of_an_id_out_of_range_fails_as_the_reference(ort_device):
    """An id past the table's rows fails the run on both devices (the quantized table's
    Gather reads the same checked rows)."""
    table = np.arange(96, dtype=np.float32).reshape(12, 8)
    model = _lookup_model(table, (T.TENSOR_QUANT8_ASYMM, 0.5, 0))
    for device in (ort_device, reference_device()):
        with pytest.raises(nnapi.NnapiError):
            run_on(model, device, [np.array([0, 1, 2, 12, 4, 5], np.int32)],
                   [np.zeros((1, 6, 8), np.uint8), np.zeros((6, 8), np.float32)])


def _int32_slice_model(end: list[int]) -> nnapi.Model:
    """TFLite STRIDED_SLICE of an int32 [2, 1, 16] input from [0, 0, 0] to ``end``, stride 1,
    as the importer writes it (through float32 halves, as BERT-like models slice their mask)."""
    from tflite_builder import Tensor, single_op

    out = [e - b for b, e in zip([0, 0, 0], end)]
    tensors = [Tensor("x", "int32", [2, 1, 16]), Tensor("begin", "int32", [3], data=np.zeros(3, np.int32)),
               Tensor("end", "int32", [3], data=np.array(end, np.int32)),
               Tensor("strides", "int32", [3], data=np.ones(3, np.int32)), Tensor("y", "int32", out)]
    return nnapi.load_tflite(single_op("STRIDED_SLICE", tensors, [0, 1, 2, 3], [4],
                                       ("StridedSliceOptions", {}))).model


@pytest.mark.parametrize("end, whole", [([2, 1, 16], True), ([1, 1, 16], False), ([2, 1, 9], False)])
def test_an_int32_slice_of_the_whole_tensor_through_float_halves_is_one_reshape(ort_device, end, whole):
    """A STRIDED_SLICE keeping the whole tensor moves every element in order: one Reshape, the
    reference's values at every int32 edge; a slice of part of it keeps the halves' nodes (a
    Reshape would move the wrong elements), with the reference's values too."""
    from nnapi.runtime.model_builder import build_hal_model

    model = _int32_slice_model(end)
    hal = build_hal_model(model)[0]
    assert sum(op.type == Op.FLOOR for op in hal.main.operations) == 1  # the importer's halves are there
    rng = np.random.default_rng(6)
    value = np.concatenate([_EDGES, rng.integers(-(2 ** 31), 2 ** 31, 16, dtype=np.int64).astype(np.int32)])
    value = value.reshape(2, 1, 16)
    got, want = (run_on(model, device, [value], [np.zeros(end, np.int32)])[0]
                 for device in (ort_device, reference_device()))
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got, value[:end[0], :end[1], :end[2]])
    types = lowered_node_types(model)
    assert (types == ["Reshape"]) == whole, types
