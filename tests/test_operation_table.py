"""Generic checks over every registered operation, driven by one table of samples (one
valid signature with values per operation, in the manner of JAX's lax test tables).

The samples come from the CTS vectors (the first single-operation test of each operation,
NHWC float32 where there is a choice) plus hand-written ones for the operations the
vectors do not cover. Every sample is checked for:

- wrong signatures (an unknown operand type in, or out, extra inputs) give BAD_DATA at
  ``add_operation``, while the sample's own signature is accepted;
- ``prepare`` gives the shapes ``execute`` produces, in the output operands' dtypes;
- zero-sized and omitted inputs are refused or accepted as the registration flags say;
- NCHW equals NHWC transposed, for operations with a layout input.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pytest

import nnapi
from helpers import f32, i32, scalar
from nnapi import FeatureLevelCode, OperandType
from nnapi import OperandCode as T
from nnapi import OperationCode as Op
from nnapi.conformance import _array, _operand_type, default_vector_files, load_records
from nnapi.errors import BadDataError
from nnapi.operand import dtype_of
from nnapi.operations import (
    ExecutionContext,
    OperationFailed,
    Tensor,
    ValidationContext,
    get_operation,
    implemented_operations,
)
from nnapi.operations.base import introduced_in

# Control flow needs referenced models; tests/test_control_flow.py covers IF and WHILE.
NOT_IN_TABLE = {Op.IF, Op.WHILE}
# Operations with a data layout input: the inputs and outputs that are NHWC / NCHW images.
LAYOUT = {
    **{code: ((0,), (0,)) for code in (
        Op.CONV_2D, Op.DEPTHWISE_CONV_2D, Op.GROUPED_CONV_2D, Op.TRANSPOSE_CONV_2D, Op.AVERAGE_POOL_2D,
        Op.MAX_POOL_2D, Op.L2_POOL_2D, Op.RESIZE_BILINEAR, Op.RESIZE_NEAREST_NEIGHBOR, Op.DEPTH_TO_SPACE,
        Op.SPACE_TO_DEPTH, Op.BATCH_TO_SPACE_ND, Op.SPACE_TO_BATCH_ND, Op.ROI_ALIGN, Op.ROI_POOLING,
        Op.INSTANCE_NORMALIZATION)},
    Op.GENERATE_PROPOSALS: ((0, 1), ()),
    Op.HEATMAP_MAX_KEYPOINT: ((0,), ()),
}


@dataclass(frozen=True)
class Sample:
    """One valid use of an operation: input types with values (None = omitted) and the
    output types (as the CTS vector declares them)."""

    code: Op
    inputs: tuple[tuple[OperandType, np.ndarray | None], ...]
    outputs: tuple[OperandType, ...]
    source: str

    def tensors(self) -> list[Tensor]:
        return [Tensor(t.type, tuple(t.dimensions) if value is None else value.shape, t.scale, t.zero_point,
                       t.channel_quant, value) for t, value in self.inputs]

    def context(self, inputs: list[Tensor] | None = None, outputs=None) -> ExecutionContext:
        return ExecutionContext(self.code, inputs if inputs is not None else self.tensors(),
                                list(outputs if outputs is not None else self.outputs))


def _from_record(record: dict) -> Sample:
    operands = record["main"]["operands"]
    operation = record["main"]["operations"][0]
    inputs = []
    for index in operation["inputs"]:
        operand = operands[index]
        op_type = _operand_type(operand)
        empty = operand["lifetime"] == "NO_VALUE" or (op_type.is_tensor and not operand["data"])
        value = None if empty else _array(operand["data"], op_type.type).reshape(op_type.dimensions)
        inputs.append((op_type, value))
    outputs = tuple(_operand_type(operands[i]) for i in operation["outputs"])
    return Sample(Op[operation["type"]], tuple(inputs), outputs, record["test"])


def _preference(record: dict) -> tuple:
    """Lower is better: NHWC float32 non-relaxed single answers first."""
    name = record["test"]
    input_type = record["main"]["operands"][record["main"]["operations"][0]["inputs"][0]]["type"]
    layout_op = Op[record["main"]["operations"][0]["type"]] in LAYOUT
    return (layout_op and "nhwc" not in name, "nchw" in name, record.get("isRelaxed", False),
            input_type != "TENSOR_FLOAT32", "dynamic" in name or "zero_sized" in name, len(name))


def _cts_samples() -> dict[Op, Sample]:
    chosen: dict[str, dict] = {}
    for path in default_vector_files():
        for record in load_records(path):
            main = record["main"]
            if len(main["operations"]) != 1 or record["referenced"] or record["expectFailure"]:
                continue
            if any(0 in o["dimensions"] for o in main["operands"] if o["lifetime"] == "SUBGRAPH_OUTPUT"):
                continue
            name = main["operations"][0]["type"]
            if name not in chosen or _preference(record) < _preference(chosen[name]):
                chosen[name] = record
    return {Op[name]: _from_record(record) for name, record in chosen.items()}


def _q16(dims, scale):
    return OperandType(T.TENSOR_QUANT16_SYMM, dims, scale)


def _hand_samples() -> dict[Op, Sample]:
    """Operations of feature level 4 and later, which the vectors do not reach."""
    rng = np.random.default_rng(7)
    x = rng.uniform(-2, 2, (2, 3, 4)).astype(np.float32)

    def sample(code, inputs, outputs):
        return Sample(code, tuple(inputs), tuple(outputs), "hand")

    import test_ops_quantized_lstm_cts as qlstm

    lstm_inputs, lstm_outputs, lstm_feeds = qlstm._operands(False, 3, True)
    return {
        Op.ELU: sample(Op.ELU, [(f32(x.shape), x), scalar(T.FLOAT32, np.float32(0.5))], [f32(x.shape)]),
        Op.HARD_SWISH: sample(Op.HARD_SWISH, [(f32(x.shape), x)], [f32(x.shape)]),
        Op.FILL: sample(Op.FILL, [(i32((2,)), np.array([2, 3], np.int32)), scalar(T.FLOAT32, np.float32(1.5))],
                        [f32((2, 3))]),
        Op.RANK: sample(Op.RANK, [(f32(x.shape), x)], [OperandType(T.INT32)]),
        Op.BATCH_MATMUL: sample(Op.BATCH_MATMUL, [(f32((2, 3, 4)), x), (f32((2, 4, 5)),
                                                   rng.uniform(-1, 1, (2, 4, 5)).astype(np.float32)),
                                                  scalar(T.BOOL, np.bool_(False)), scalar(T.BOOL, np.bool_(False))],
                                [f32((2, 3, 5))]),
        Op.PACK: sample(Op.PACK, [scalar(T.INT32, np.int32(1)), (f32(x.shape), x), (f32(x.shape), -x)],
                        [f32((2, 2, 3, 4))]),
        Op.MIRROR_PAD: sample(Op.MIRROR_PAD, [(f32(x.shape), x), (i32((3, 2)), np.array([[1, 1], [0, 2], [1, 0]],
                                                                                          np.int32)),
                                              scalar(T.INT32, np.int32(0))], [f32((4, 5, 5))]),
        Op.REVERSE: sample(Op.REVERSE, [(f32(x.shape), x), (i32((1,)), np.array([1], np.int32))], [f32(x.shape)]),
        Op.QUANTIZED_LSTM: Sample(Op.QUANTIZED_LSTM, tuple(
            (t, None if isinstance(v, str) else np.asarray(v, dtype=t.dtype).reshape(t.dimensions))
            for t, v in lstm_inputs), tuple(lstm_outputs), "qlstm_projection (CTS)"),
    }


SAMPLES = {**_cts_samples(), **_hand_samples()}
CODES = sorted(SAMPLES, key=lambda code: code.name)


def _ids(codes):
    return [code.name for code in codes]


def test_table_covers_every_registered_operation():
    missing = set(implemented_operations()) - set(SAMPLES) - NOT_IN_TABLE
    assert not missing, f"no sample for {sorted(c.name for c in missing)}"
    assert set(LAYOUT) <= set(SAMPLES)


# --- signatures at add_operation ----------------------------------------------------------


def _add(sample: Sample, inputs, outputs) -> None:
    model = nnapi.Model()
    input_indexes = []
    for op_type in inputs:
        index = model.add_operand(op_type.with_channel_quant(None))
        if op_type.channel_quant is not None:
            model.set_operand_symm_per_channel_quant_params(index, op_type.channel_quant)
        input_indexes.append(index)
    output_indexes = [model.add_operand(t.with_channel_quant(None)) for t in outputs]
    for position, t in enumerate(outputs):
        if t.channel_quant is not None:
            model.set_operand_symm_per_channel_quant_params(output_indexes[position], t.channel_quant)
    model.add_operation(sample.code, input_indexes, output_indexes)


@pytest.mark.parametrize("code", CODES, ids=_ids(CODES))
def test_wrong_signatures_are_bad_data_at_add_operation(code):
    sample = SAMPLES[code]
    types = [t for t, _ in sample.inputs]
    outputs = list(sample.outputs)
    _add(sample, types, outputs)  # the sample itself is accepted
    alien = OperandType(T.UINT32)  # a type no operation takes or gives
    for wrong_inputs, wrong_outputs, what in (
            ([alien, *types[1:]], outputs, "input 0 of an unknown type"),
            (types, [alien, *outputs[1:]], "output 0 of an unknown type"),
            ([alien, *types[1:]], [alien, *outputs[1:]], "input 0 and output 0 of an unknown type"),
            ([*types, alien, alien, alien], outputs, "three extra inputs")):
        with pytest.raises(BadDataError):
            _add(sample, wrong_inputs, wrong_outputs)
            pytest.fail(f"{code.name}: {what} passed add_operation")


@pytest.mark.parametrize("code", CODES, ids=_ids(CODES))
def test_validate_reports_the_feature_level_of_the_signature(code):
    sample = SAMPLES[code]
    ctx = ValidationContext(code, [t for t, _ in sample.inputs], list(sample.outputs))
    level = get_operation(code).check_signature(ctx)
    assert level >= introduced_in(code)
    if any(t.type >= T.BOOL for t in (*ctx.inputs, *ctx.outputs)):
        assert level >= FeatureLevelCode.FEATURE_LEVEL_3  # operand types of feature level 3


def test_optional_arguments_raise_the_feature_level():
    x = f32((1, 2, 2, 1))
    resize = [x, OperandType(T.INT32), OperandType(T.INT32)]

    def level(code, inputs):
        return get_operation(code).check_signature(ValidationContext(code, inputs, [f32((1, 4, 4, 1))]))
    assert level(Op.RESIZE_BILINEAR, resize) == FeatureLevelCode.FEATURE_LEVEL_1
    assert level(Op.RESIZE_BILINEAR, [*resize, OperandType(T.BOOL)]) == FeatureLevelCode.FEATURE_LEVEL_3
    assert level(Op.RESIZE_BILINEAR, [*resize, *[OperandType(T.BOOL)] * 3]) == FeatureLevelCode.FEATURE_LEVEL_4
    assert level(Op.RESIZE_NEAREST_NEIGHBOR, [*resize, OperandType(T.BOOL)]) == FeatureLevelCode.FEATURE_LEVEL_3
    softmax = [f32((2, 3)), OperandType(T.FLOAT32)]
    with_axis = [*softmax, OperandType(T.INT32)]
    assert get_operation(Op.SOFTMAX).check_signature(
        ValidationContext(Op.SOFTMAX, softmax, [f32((2, 3))])) == FeatureLevelCode.FEATURE_LEVEL_1
    assert get_operation(Op.SOFTMAX).check_signature(
        ValidationContext(Op.SOFTMAX, with_axis, [f32((2, 3))])) == FeatureLevelCode.FEATURE_LEVEL_3
    assert introduced_in(Op.REVERSE) == FeatureLevelCode.FEATURE_LEVEL_7
    assert introduced_in(Op.BATCH_MATMUL) == FeatureLevelCode.FEATURE_LEVEL_6


@pytest.mark.parametrize("code", CODES, ids=_ids(CODES))
def test_runtime_gives_an_operation_to_devices_of_its_signature_level(code):
    """The partitioner's feature level for an operation (which devices may be given it)
    is the one its signature needs, not more: a feature level 6 device runs PACK."""
    from nnapi.runtime.execution_plan import operation_feature_level
    from nnapi.runtime.model_builder import build_hal_model

    sample = SAMPLES[code]
    inputs = [t for t, _ in sample.inputs]
    needed = get_operation(code).check_signature(ValidationContext(code, inputs, list(sample.outputs)))
    model = nnapi.Model()
    indexes = [model.add_operand(t) for t in inputs]
    for index, (t, value) in zip(indexes, sample.inputs, strict=True):
        if not t.is_tensor or value is None:  # constants and omitted operands
            model.set_operand_value(index, value)
    outputs = [model.add_operand(t) for t in sample.outputs]
    model.add_operation(code, indexes, outputs)
    model.identify_inputs_and_outputs([i for i, (t, value) in zip(indexes, sample.inputs, strict=True)
                                       if t.is_tensor and value is not None], outputs)
    model.finish()
    hal_model, _ = build_hal_model(model)
    level = operation_feature_level(hal_model, hal_model.main, hal_model.main.operations[0])
    assert introduced_in(code) <= level <= needed


# --- declared shapes checked at add_operation ------------------------------------------------


@dataclass(frozen=True)
class Mismatch:
    """A sample with some operands' declared dimensions changed so that they disagree;
    ``needs_constant``: the check needs a constant scalar's value (a layout flag, a
    multiplier, an axis), so it can only be made once that value is set."""

    code: Op
    changes: tuple[tuple[str, int, tuple[int, ...]], ...]  # ("input" | "output", index, dims)
    message: str
    needs_constant: bool


MISMATCHES = [
    Mismatch(Op.CONV_2D, (("input", 0, (1, 3, 3, 2)),), "filter depth 1", True),
    Mismatch(Op.CONV_2D, (("input", 2, (2,)),), "bias", False),
    Mismatch(Op.CONV_2D, (("output", 0, (1, 2, 2, 3)),), "output 0 depth", True),
    Mismatch(Op.CONV_2D, (("output", 0, (2, 2, 2, 1)),), "batch", False),
    Mismatch(Op.DEPTHWISE_CONV_2D, (("input", 0, (1, 3, 3, 3)),), "depth multiplier 2", True),
    Mismatch(Op.DEPTHWISE_CONV_2D, (("input", 1, (2, 2, 2, 4)),), "depthwise filter", False),
    Mismatch(Op.DEPTHWISE_CONV_2D, (("input", 2, (3,)),), "bias", False),
    Mismatch(Op.GROUPED_CONV_2D, (("input", 0, (1, 3, 3, 4)),), "2 group", True),
    Mismatch(Op.GROUPED_CONV_2D, (("input", 1, (3, 2, 2, 1)), ("input", 2, (3,)), ("output", 0, (1, 2, 2, 3))),
             "do not divide into 2 groups", True),
    Mismatch(Op.TRANSPOSE_CONV_2D, (("input", 0, (1, 1, 2, 2)),), "filter depth 1", True),
    Mismatch(Op.TRANSPOSE_CONV_2D, (("input", 2, (2,)),), "bias", False),
    Mismatch(Op.FULLY_CONNECTED, (("input", 1, (1, 2)),), "rows of the weights' input size 2", False),
    Mismatch(Op.FULLY_CONNECTED, (("output", 0, (3, 2)),), "number of units", False),
    Mismatch(Op.FULLY_CONNECTED, (("output", 0, (6, 1)),), "input's rows", False),
    Mismatch(Op.CONCATENATION, (("input", 1, (2, 4)),), "only axis 0 may differ", True),
    Mismatch(Op.CONCATENATION, (("output", 0, (5, 3)),), "sum of the inputs", True),
    Mismatch(Op.BATCH_MATMUL, (("input", 1, (2, 5, 5)),), "inner dimensions 4 and 5", True),
    Mismatch(Op.BATCH_MATMUL, (("output", 0, (2, 3, 4)),), "dimension 2 must be 5", True),
]


def _changed(sample: Sample, mismatch: Mismatch, unknown: bool = False):
    """The sample's input and output types with the mismatch's changes (``unknown``: the
    changed operands' dimensions all 0 instead)."""
    inputs, outputs = [t for t, _ in sample.inputs], list(sample.outputs)
    for kind, index, dims in mismatch.changes:
        types = inputs if kind == "input" else outputs
        types[index] = types[index].with_dimensions((0,) * len(dims) if unknown else dims)
    return inputs, outputs


def _build(sample: Sample, inputs, outputs, constants_first: bool) -> nnapi.Model:
    """A one-operation model: tensors are model inputs, scalars constants set before
    add_operation (``constants_first``, the usual order) or after it; then finished."""
    model = nnapi.Model()
    indexes = [model.add_operand(t) for t in inputs]
    output_indexes = [model.add_operand(t) for t in outputs]
    scalars = [(i, value) for i, (t, (_, value)) in zip(indexes, zip(inputs, sample.inputs, strict=True), strict=True)
               if not t.is_tensor]
    if constants_first:
        for index, value in scalars:
            model.set_operand_value(index, value)
    model.add_operation(sample.code, indexes, output_indexes)
    if not constants_first:
        for index, value in scalars:
            model.set_operand_value(index, value)
    model.identify_inputs_and_outputs([i for i, t in zip(indexes, inputs, strict=True) if t.is_tensor],
                                      output_indexes)
    model.finish()
    return model


def _mismatch_id(mismatch: Mismatch) -> str:
    return f"{mismatch.code.name}-{mismatch.message.replace(' ', '_')}"


def test_mismatch_table_samples_are_accepted():
    for code in sorted({m.code for m in MISMATCHES}, key=lambda c: c.name):
        sample = SAMPLES[code]
        _build(sample, [t for t, _ in sample.inputs], list(sample.outputs), constants_first=True)


@pytest.mark.parametrize("mismatch", MISMATCHES, ids=[_mismatch_id(m) for m in MISMATCHES])
def test_declared_shape_mismatches_are_bad_data_at_add_operation(mismatch):
    """Everything the declared shapes (and the constants set so far) show is checked at
    add_operation, not left for compute (CONV_2D filter depth, DEPTHWISE multiplier, ...)."""
    sample = SAMPLES[mismatch.code]
    inputs, outputs = _changed(sample, mismatch)
    with pytest.raises(BadDataError, match=f"add_operation.*{re.escape(mismatch.message)}"):
        _build(sample, inputs, outputs, constants_first=True)
    # A check that needs a constant's value is skipped while the value is unknown, and
    # made when finish validates the operation again.
    if mismatch.needs_constant:
        with pytest.raises(BadDataError, match=re.escape(mismatch.message)) as raised:
            _build(sample, inputs, outputs, constants_first=False)
        assert "finish" in "".join(line.name for line in raised.traceback)
    else:
        with pytest.raises(BadDataError, match=f"add_operation.*{re.escape(mismatch.message)}"):
            _build(sample, inputs, outputs, constants_first=False)
    # Unknown dimensions (0) skip the check: the shapes are then checked at execution.
    model = nnapi.Model()
    unknown_inputs, unknown_outputs = _changed(sample, mismatch, unknown=True)
    indexes = [model.add_operand(t) for t in unknown_inputs]
    for index, (t, (_, value)) in zip(indexes, zip(unknown_inputs, sample.inputs, strict=True), strict=True):
        if not t.is_tensor:
            model.set_operand_value(index, value)
    model.add_operation(sample.code, indexes, [model.add_operand(t) for t in unknown_outputs])


@dataclass(frozen=True)
class Refusal:
    """A sample with some constant inputs' values (``values``: input index -> value) or
    declared dimensions (``changes``, as in Mismatch) changed so that ``prepare`` refuses
    it, or infers other output dimensions than declared: BAD_DATA at add_operation."""

    code: Op
    values: tuple[tuple[int, object], ...]
    changes: tuple[tuple[str, int, tuple[int, ...]], ...]
    message: str


REFUSALS = [
    Refusal(Op.AVERAGE_POOL_2D, ((7, 3), (8, 3)), (), "filter 3x3 is larger than the padded input 2x2"),
    Refusal(Op.MAX_POOL_2D, ((1, 3), (2, 3), (3, 3), (4, 3), (7, 3), (8, 3)), (),
            "padding must be smaller than the filter"),
    Refusal(Op.MAX_POOL_2D, (), (("output", 0, (1, 1, 1, 1)),),
            "output 0 is declared [1, 1, 1, 1], but the inputs give [1, 2, 2, 1]"),
    Refusal(Op.SPACE_TO_DEPTH, ((1, 3),), (), "must be divisible by block size 3"),
    Refusal(Op.DEPTH_TO_SPACE, ((1, 3),), (), "not divisible by block_size^2 9"),
    Refusal(Op.GATHER, ((1, 2),), (), "axis 2"),
    Refusal(Op.RESHAPE, ((1, np.array([4], np.int32)),), (), "does not hold 9 elements"),
    Refusal(Op.TRANSPOSE, (), (("output", 0, (1, 2, 1, 2)),), "output 0 is declared [1, 2, 1, 2]"),
    Refusal(Op.PAD, (), (("output", 0, (1, 3, 3, 1)),), "but the inputs give [1, 4, 4, 1]"),
    Refusal(Op.SLICE, ((2, np.array([4], np.int32)),), (), "size [4] exceeds shape [4]"),
    Refusal(Op.SPLIT, ((2, 4),), (("output", 0, (2,)),), "num_splits 4"),
    Refusal(Op.MEAN, ((1, np.array([4], np.int32)),), (), "axis 4"),
]


def _build_with_constants(sample: Sample, refusal: Refusal, constants_first: bool, unknown: bool = False):
    """A one-operation model of ``sample`` with the refusal's changes: scalars and int32
    tensors (shapes, axes, paddings) are constants, set before add_operation or after it;
    other tensors model inputs (``unknown``: of unknown dimensions)."""
    values = dict(refusal.values)
    inputs, outputs = _changed(sample, Mismatch(sample.code, refusal.changes, "", False))
    model = nnapi.Model()
    indexes, constants, model_inputs = [], [], []
    for position, (t, (_, value)) in enumerate(zip(inputs, sample.inputs, strict=True)):
        value = values.get(position, value)
        is_constant = not t.is_tensor or t.type == T.TENSOR_INT32
        if is_constant and t.is_tensor:
            value = np.asarray(value, np.int32)
            t = t.with_dimensions(value.shape)
        elif not is_constant and unknown:
            t = t.with_dimensions((0,) * len(t.dimensions))
        index = model.add_operand(t)
        indexes.append(index)
        (constants if is_constant else model_inputs).append((index, value))
    output_indexes = [model.add_operand(t) for t in outputs]

    def set_constants():
        for index, value in constants:
            model.set_operand_value(index, value)
    if constants_first:
        set_constants()
    model.add_operation(sample.code, indexes, output_indexes)
    if not constants_first:
        set_constants()
    model.identify_inputs_and_outputs([i for i, _ in model_inputs], output_indexes)
    model.finish()
    return model


def _refusal_id(refusal: Refusal) -> str:
    return f"{refusal.code.name}-{refusal.message.replace(' ', '_')}"


def test_refusal_table_samples_are_accepted():
    for code in sorted({r.code for r in REFUSALS}, key=lambda c: c.name):
        _build_with_constants(SAMPLES[code], Refusal(code, (), (), ""), constants_first=True)


@pytest.mark.parametrize("refusal", REFUSALS, ids=[_refusal_id(r) for r in REFUSALS])
def test_what_prepare_refuses_on_declared_shapes_is_bad_data_at_add_operation(refusal):
    """prepare runs on the declared shapes and constant values at add_operation: a
    pooling filter larger than its padded input, a block size that does not divide, an
    axis out of range, a RESHAPE whose constant shape does not hold the elements, an
    output declared with other dimensions than the inputs give."""
    sample = SAMPLES[refusal.code]
    with pytest.raises(BadDataError, match=f"add_operation.*{re.escape(refusal.message)}"):
        _build_with_constants(sample, refusal, constants_first=True)
    # constants set after add_operation: finish validates the operation again
    with pytest.raises(BadDataError, match=re.escape(refusal.message)) as raised:
        _build_with_constants(sample, refusal, constants_first=False)
    assert "finish" in "".join(line.name for line in raised.traceback)
    # inputs of unknown dimensions: checked at execution instead
    if not refusal.changes:
        _build_with_constants(sample, refusal, constants_first=True, unknown=True)


def test_shape_checks_read_constants_in_the_driver_too():
    """nnapi-reference validates HAL models with their CONSTANT_COPY scalars: a CONV_2D
    whose filter depth disagrees with the input is refused, not failed at compute."""
    from nnapi.drivers.reference import unsupported_reason
    from nnapi.runtime.model_builder import build_hal_model

    sample = SAMPLES[Op.CONV_2D]
    model = _build(sample, [t for t, _ in sample.inputs], list(sample.outputs), constants_first=True)
    hal_model, _ = build_hal_model(model)
    operation = hal_model.main.operations[0]
    assert unsupported_reason(hal_model, hal_model.main, operation) is None
    data = hal_model.main.operands[operation.inputs[0]]
    data.dimensions = [1, 3, 3, 2]
    reason = unsupported_reason(hal_model, hal_model.main, operation)
    assert reason is not None and "filter depth 1" in reason


def test_driver_support_query_runs_prepare_on_constant_tensors():
    """nnapi-reference's HAL check sees small CONSTANT_COPY tensors too: a RESHAPE whose
    constant shape does not hold the input's elements is refused, not failed at compute."""
    from nnapi.drivers.reference import unsupported_reason
    from nnapi.runtime.model_builder import build_hal_model

    sample = SAMPLES[Op.RESHAPE]
    model = _build_with_constants(sample, Refusal(Op.RESHAPE, (), (), ""), constants_first=True)
    hal_model, _ = build_hal_model(model)
    operation = hal_model.main.operations[0]
    assert unsupported_reason(hal_model, hal_model.main, operation) is None
    shape = hal_model.main.operands[operation.inputs[1]]
    start = shape.location.offset
    values = bytearray(hal_model.operand_values)
    values[start: start + 4] = np.array([4], np.int32).tobytes()
    hal_model.operand_values = bytes(values)
    reason = unsupported_reason(hal_model, hal_model.main, operation)
    assert reason is not None and "does not hold 9 elements" in reason


# --- prepare / execute contract -----------------------------------------------------------


def _run(sample: Sample, ctx: ExecutionContext) -> list[np.ndarray]:
    operation = get_operation(sample.code)
    operation.check_inputs(ctx)
    shapes = [tuple(s) for s in operation.prepare(ctx)]
    results = operation.execute(ctx)
    assert len(shapes) == len(results) == len(sample.outputs)
    for position, (shape, result, declared) in enumerate(zip(shapes, results, ctx.outputs, strict=True)):
        result = np.asarray(result)
        assert result.shape == shape, f"output {position}: prepare said {shape}, execute gave {result.shape}"
        assert result.dtype == dtype_of(declared.type), f"output {position} is {result.dtype}"
    return [np.asarray(r) for r in results]


@pytest.mark.parametrize("code", CODES, ids=_ids(CODES))
def test_prepare_shapes_equal_execute_shapes_in_the_declared_dtypes(code):
    sample = SAMPLES[code]
    results = _run(sample, sample.context())
    for result, declared in zip(results, sample.outputs, strict=True):
        if declared.dimensions and 0 not in declared.dimensions:
            assert list(result.shape) == list(declared.dimensions)


# --- registration flags -------------------------------------------------------------------


def _zero_batch(sample: Sample) -> list[Tensor] | None:
    tensors = sample.tensors()
    first = tensors[0]
    if first.value is None or first.rank == 0:
        return None
    empty = np.zeros((0, *first.shape[1:]), dtype=first.value.dtype)
    tensors[0] = replace(first, shape=empty.shape, value=empty)
    return tensors


@pytest.mark.parametrize("code", CODES, ids=_ids(CODES))
def test_zero_sized_inputs_follow_the_registration_flag(code):
    sample = SAMPLES[code]
    tensors = _zero_batch(sample)
    if tensors is None:
        pytest.skip("input 0 is not a tensor")
    operation = get_operation(code)
    unknown = [replace(t, dimensions=(0,) * len(t.dimensions)) if t.dimensions else t for t in sample.outputs]
    ctx = sample.context(tensors, unknown)
    if not operation.zero_sized_inputs:
        with pytest.raises(OperationFailed, match="zero-sized"):
            operation.check_inputs(ctx)
        return
    operation.check_inputs(ctx)
    try:
        shapes = [tuple(s) for s in operation.prepare(ctx)]
    except OperationFailed:
        return  # a zero batch may not fit the other inputs; refusing it is allowed
    results = operation.execute(ctx)
    assert [np.asarray(r).shape for r in results] == shapes


@pytest.mark.parametrize("code", CODES, ids=_ids(CODES))
def test_omitted_inputs_follow_the_registration_flag(code):
    sample = SAMPLES[code]
    operation = get_operation(code)
    tensors = sample.tensors()
    tensors[0] = replace(tensors[0], value=None)
    if operation.omitted_operands:
        operation.check_inputs(sample.context(tensors))  # refusing is the kernel's business
    else:
        with pytest.raises(BadDataError, match="omitted"):
            operation.check_inputs(sample.context(tensors))


# --- layouts -------------------------------------------------------------------------------


def _to_nchw(shape):
    return (shape[0], shape[3], shape[1], shape[2])


@pytest.mark.parametrize("code", sorted(LAYOUT, key=lambda c: c.name), ids=_ids(sorted(LAYOUT, key=lambda c: c.name)))
def test_nchw_equals_nhwc_transposed(code):
    sample = SAMPLES[code]
    layout = next((i for i, (t, _) in enumerate(sample.inputs) if t.type == T.BOOL), None)
    assert layout is not None, f"the {code.name} sample ({sample.source}) has no layout input"
    assert not bool(sample.inputs[layout][1]), f"the {code.name} sample is not NHWC"
    image_inputs, image_outputs = LAYOUT[code]
    nhwc = _run(sample, sample.context())
    inputs = list(sample.inputs)
    for index in image_inputs:
        t, value = inputs[index]
        inputs[index] = (replace(t, dimensions=_to_nchw(t.dimensions)), np.transpose(value, (0, 3, 1, 2)))
    if code == Op.TRANSPOSE_CONV_2D and len(inputs) == 9:
        # with implicit padding input 3 is the output shape, given in the layout's order
        t, value = inputs[3]
        inputs[3] = (t, value[[0, 3, 1, 2]])
    inputs[layout] = (inputs[layout][0], np.bool_(True))
    outputs = [replace(t, dimensions=_to_nchw(t.dimensions)) if i in image_outputs else t
               for i, t in enumerate(sample.outputs)]
    nchw_sample = replace(sample, inputs=tuple(inputs), outputs=tuple(outputs))
    nchw = _run(nchw_sample, nchw_sample.context())
    for position, (a, b) in enumerate(zip(nhwc, nchw, strict=True)):
        if position in image_outputs:
            b = np.transpose(b, (0, 2, 3, 1))
        np.testing.assert_array_equal(a, b, err_msg=f"{code.name} output {position}")


def test_docs_table_lists_every_operation_with_its_module_and_flags():
    docs = (Path(__file__).parents[1] / "docs" / "operations.md").read_text()
    rows = {}
    for line in docs.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0] in Op.__members__:
            rows[Op[cells[0]]] = (cells[1].strip("`"), cells[2])
    for code in implemented_operations():
        operation = get_operation(code)
        flags = ", ".join(name for name, on in (("zero-sized", operation.zero_sized_inputs),
                                                 ("omitted", operation.omitted_operands)) if on)
        module = type(operation).__module__.rsplit(".", 1)[1] + ".py"
        assert rows.get(code) == (module, flags), f"docs/operations.md row for {code.name}"
    assert set(rows) == set(implemented_operations())
