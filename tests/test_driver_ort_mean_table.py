"""nnapi-ort-cpu's lowering of the TFLite importer's quantized MEAN as a table (DEQUANTIZE,
REDUCE_SUM, MUL by 1 / scale, ADD 0.5, FLOOR, ADD, CAST, GATHER; or the sum after the
FLOOR: drivers/ort/mean_table.py): the GATHER reads ReduceSum(Cast(q)) + a constant, no Floor
or range check left, and gives the reference's values bit for bit (the chain's float32 sum is
proven exact); a chain whose MUL is not exactly 1 / scale keeps the general lowering."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
pytest.importorskip("tflite")

import nnapi  # noqa: E402
from helpers import constant, reference_device, run_on  # noqa: E402
from nnapi import OperandCode as T  # noqa: E402
from nnapi import OperandType  # noqa: E402
from nnapi import OperationCode as Op  # noqa: E402
from nnapi.drivers.ort.lowering import lower_model  # noqa: E402
from nnapi.runtime.model_builder import build_hal_model  # noqa: E402

pytestmark = pytest.mark.usefixtures("calibration_file")


def _operators(model: nnapi.Model) -> list[str]:
    return [node.op_type for node in lower_model(build_hal_model(model)[0])[0].graph.node]


def _imported_mean(dtype: str, shape: list[int], axes: list[int], keep: bool) -> tuple[nnapi.Model, list[int]]:
    from tflite_builder import Tensor, single_op

    zero = -9 if dtype == "int8" else 120
    out_shape = [1 if a in axes else d for a, d in enumerate(shape)] if keep else \
        [d for a, d in enumerate(shape) if a not in axes]
    # scales whose multiplier no FULLY_CONNECTED matches, so the importer writes the table
    tensors = [Tensor("x", dtype, shape, scale=0.05, zero_point=zero),
               Tensor("axes", "int32", [len(axes)], data=np.array(axes, np.int32)),
               Tensor("y", dtype, out_shape, scale=0.02, zero_point=zero + 5)]
    data = single_op("MEAN", tensors, [0, 1], [2], ("ReducerOptions", {"KeepDims": keep}))
    model = nnapi.load_tflite(data).model
    written = [operation.type for operation in build_hal_model(model)[0].main.operations]
    assert written[-1] == Op.GATHER and Op.FLOOR in written, written
    return model, out_shape


@pytest.mark.parametrize("dtype, shape, axes, keep", [
    ("int8", [1, 47, 64], [1], False),        # a Conv1D classifier's global pool: the sum first
    ("int8", [2, 200, 12], [1], False),       # 200 values: each recovered, then summed
    ("uint8", [1, 6, 5, 8], [1], True),
    ("int8", [2, 3, 4, 16], [1, 2, 3], False),
])
def test_imported_table_mean_reads_the_integer_sum(ort_device, dtype, shape, axes, keep):
    """Every sum's extremes included (the input all at the type's minimum, then maximum,
    then random over the whole range and near the zero point): the reference's values
    exactly; 4 nodes where the chain took ~15 (a global pool 3: the stored values' sums index
    the table's slice from the shift on)."""
    model, out_shape = _imported_mean(dtype, shape, axes, keep)
    operators = _operators(model)
    assert "Floor" not in operators and "Where" not in operators and operators.count("Gather") == 1, operators
    if axes == list(range(1, len(shape) - 1)):  # a global pool: the sums index the table's slice, no Add
        graph = lower_model(build_hal_model(model)[0])[0].graph
        producer = {output: node for node in graph.node for output in node.output}
        gather = next(node for node in graph.node if node.op_type == "Gather")
        index = producer[gather.input[1]]
        assert index.op_type == "Reshape" and producer[index.input[0]].op_type == "MatMulInteger", index
    info = np.iinfo(dtype)
    rng = np.random.default_rng(len(shape))
    values = [np.full(shape, info.min), np.full(shape, info.max), rng.integers(info.min, int(info.max) + 1, shape),
              np.clip(rng.integers(-40, 20, shape) + (-9 if dtype == "int8" else 120), info.min, info.max)]
    seen = set()
    for value in values:
        value = value.astype(dtype)
        ours = run_on(model, ort_device, [value], [np.zeros(out_shape, dtype)])[0]
        theirs = run_on(model, reference_device(), [value], [np.zeros(out_shape, dtype)])[0]
        np.testing.assert_array_equal(ours, theirs)
        seen.update(np.unique(theirs).tolist())
    assert len(seen) > 3


def test_a_chain_whose_factor_is_not_one_over_the_scale_keeps_the_general_form(ort_device):
    """The same chain built by hand with the MUL one float32 ulp off 1 / scale: no proof,
    so the Floor and the range check stay, still the reference's values."""
    scale = np.float32(0.037)
    model = nnapi.Model()
    x = model.add_operand(OperandType(T.TENSOR_QUANT8_ASYMM_SIGNED, [1, 10, 4], scale=float(scale), zero_point=-9))
    real = model.add_operand(OperandType(T.TENSOR_FLOAT32, [1, 10, 4]))
    model.add_operation(Op.DEQUANTIZE, [x], [real])
    total = model.add_operand(OperandType(T.TENSOR_FLOAT32, [1, 4]))
    model.add_operation(Op.REDUCE_SUM, [real, constant(model, T.TENSOR_INT32, np.array([1], np.int32), [1]),
                                        constant(model, T.BOOL, False)], [total])
    factor = np.nextafter(np.float32(1) / scale, np.float32(np.inf), dtype=np.float32)
    chain = [(Op.MUL, factor), (Op.ADD, np.float32(0.5)), (Op.FLOOR, None), (Op.ADD, np.float32(1190))]
    value = total
    for code, operand in chain:
        out = model.add_operand(OperandType(T.TENSOR_FLOAT32, [1, 4]))
        inputs = [value] if operand is None else [value, constant(model, T.TENSOR_FLOAT32, np.array([operand]), [1]),
                                                  constant(model, T.INT32, 0)]
        model.add_operation(code, inputs, [out])
        value = out
    index = model.add_operand(OperandType(T.TENSOR_INT32, [1, 4]))
    model.add_operation(Op.CAST, [value], [index])
    table = np.arange(2400).astype(np.int64) % 256 - 128
    y = model.add_operand(OperandType(T.TENSOR_QUANT8_ASYMM_SIGNED, [1, 4], scale=0.01, zero_point=0))
    values = model.add_operand(OperandType(T.TENSOR_QUANT8_ASYMM_SIGNED, [2400], scale=0.01, zero_point=0))
    model.set_operand_value(values, table.astype(np.int8))
    model.add_operation(Op.GATHER, [values, constant(model, T.INT32, 0), index], [y])
    model.identify_inputs_and_outputs([x], [y])
    model.finish()
    assert "Floor" in _operators(model)
    value = np.random.default_rng(4).integers(-128, 128, (1, 10, 4)).astype(np.int8)
    ours = run_on(model, ort_device, [value], [np.zeros((1, 4), np.int8)])[0]
    theirs = run_on(model, reference_device(), [value], [np.zeros((1, 4), np.int8)])[0]
    np.testing.assert_array_equal(ours, theirs)
