"""nnapi-ort-cpu's Slice / chain / Concat merge (drivers/ort/sliced_columns.py): the columns
of one 8-bit value sliced, each part through its own element-wise chain and joined back
(a YOLO head's decoding) run as each distinct chain over the whole value, the columns
picked by Min / Max with constant masks; ORT's outputs are the same bytes."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx")
onnxruntime = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import nnapi  # noqa: E402
from helpers import reference_device, run_on  # noqa: E402
from nnapi import OperandCode as T  # noqa: E402
from nnapi import OperandType  # noqa: E402
from nnapi import OperationCode as Op  # noqa: E402
from nnapi.drivers.ort import lowering  # noqa: E402
from nnapi.drivers.ort.builder import has_kernel, onnx_model  # noqa: E402
from nnapi.drivers.ort.lowering import lower_model  # noqa: E402
from nnapi.drivers.ort.session import disabled_optimizers, session_options  # noqa: E402
from nnapi.drivers.ort.sliced_columns import merge_sliced_columns  # noqa: E402
from nnapi.runtime.model_builder import build_hal_model  # noqa: E402


def _skip_without_min_max(elem: int) -> None:
    """The merge of two or more chains picks columns by 8-bit Min / Max, which onnxruntime
    1.20 and older lack (test_without_8_bit_min_max_kernels_only_one_chain_merges)."""
    if not (has_kernel("Min", elem) and has_kernel("Max", elem)):
        pytest.skip("this onnxruntime has no 8-bit Min / Max")


_SIGMOID = ("sigmoid",)
_EXP = ("exp",)


def _head(columns, kinds, dims=(1, 256, 9), elem=TensorProto.UINT8, axis=-1, extra=None):
    """x of ``dims`` sliced into ``columns`` ([start, end) of the last axis), part i through
    the chain ``kinds[i]`` (DequantizeLinear, Sigmoid or Exp, QuantizeLinear into one scale;
    a sigmoid requantized through its 1/256 grid first), Concat on ``axis``."""
    low = 0 if elem == TensorProto.UINT8 else -128
    dtype = np.uint8 if elem == TensorProto.UINT8 else np.int8
    initializers = [numpy_helper.from_array(np.array(0.02, np.float32), "xs"),
                    numpy_helper.from_array(np.array(low + 140, dtype), "xz"),
                    numpy_helper.from_array(np.array(1 / 256, np.float32), "gs"),
                    numpy_helper.from_array(np.array(low, dtype), "gz"),
                    numpy_helper.from_array(np.array(0.03, np.float32), "ys"),
                    numpy_helper.from_array(np.array(low + 3, dtype), "yz"),
                    numpy_helper.from_array(np.array(list(range(len(dims))), np.int64), "axes")]
    nodes, parts = [], []
    for i, ((start, end), kind) in enumerate(zip(columns, kinds)):
        starts, ends = [0] * (len(dims) - 1) + [start], list(dims[:-1]) + [end]
        initializers += [numpy_helper.from_array(np.array(starts, np.int64), f"s{i}"),
                         numpy_helper.from_array(np.array(ends, np.int64), f"e{i}")]
        nodes.append(helper.make_node("Slice", ["x", f"s{i}", f"e{i}", "axes"], [f"p{i}"]))
        nodes.append(helper.make_node("DequantizeLinear", [f"p{i}", "xs", "xz"], [f"d{i}"]))
        if kind == "sigmoid":
            nodes += [helper.make_node("Sigmoid", [f"d{i}"], [f"f{i}"]),
                      helper.make_node("QuantizeLinear", [f"f{i}", "gs", "gz"], [f"g{i}"]),
                      helper.make_node("DequantizeLinear", [f"g{i}", "gs", "gz"], [f"h{i}"])]
        elif kind == "exp":
            nodes.append(helper.make_node("Exp", [f"d{i}"], [f"h{i}"]))
        else:  # a Mul by a per-column constant: not element-wise in the slice's own shape
            initializers.append(numpy_helper.from_array(np.linspace(0.5, 1.5, end - start).astype(np.float32), f"k{i}"))
            nodes.append(helper.make_node("Mul", [f"d{i}", f"k{i}"], [f"h{i}"]))
        nodes.append(helper.make_node("QuantizeLinear", [f"h{i}", "ys", "yz"], [f"q{i}"]))
        parts.append(f"q{i}")
    nodes.append(helper.make_node("Concat", parts, ["y"], axis=axis))
    outputs = [helper.make_tensor_value_info("y", elem, None)]
    if extra:
        outputs.append(helper.make_tensor_value_info(extra, TensorProto.FLOAT, None))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", elem, list(dims))], outputs, initializers)
    return onnx_model(graph)


def _outputs(model, x):
    session = onnxruntime.InferenceSession(model.SerializeToString(), session_options(1),
                                           providers=["CPUExecutionProvider"],
                                           disabled_optimizers=disabled_optimizers(model.graph))
    return session.run(None, {"x": x})


def _every_value(dims, elem):
    """x of ``dims`` whose every column holds every stored value (rows of 256)."""
    rows = int(np.prod(dims[:-1]))
    values = (np.arange(rows)[:, None] + 37 * np.arange(dims[-1])[None, :]) % 256
    return (values - (0 if elem == TensorProto.UINT8 else 128)).astype(
        np.uint8 if elem == TensorProto.UINT8 else np.int8).reshape(dims)


@pytest.mark.parametrize("elem", [TensorProto.UINT8, TensorProto.INT8])
@pytest.mark.parametrize("columns, kinds, chains", [
    ([(0, 2), (2, 4), (4, 5), (5, 9)], ["sigmoid", "exp", "sigmoid", "sigmoid"], 2),  # a YOLO head's
    ([(0, 4), (4, 9)], ["exp", "sigmoid"], 2),
    ([(0, 3), (3, 9)], ["sigmoid", "sigmoid"], 1),  # one chain: no masks
])
def test_sliced_chains_run_over_the_whole_value(elem, columns, kinds, chains):
    """Each distinct chain runs once over x, the Slices and the Concat go, one Min per chain
    and one Max pick the columns (none for one chain); the outputs are the same bytes on
    every stored value of every column."""
    if chains > 1:
        _skip_without_min_max(elem)
    model = _head(columns, kinds, elem=elem)
    before = model.SerializeToString()
    x = _every_value([1, 256, 9], elem)
    expected = _outputs(model, x)
    merge_sliced_columns(model)
    types = [node.op_type for node in model.graph.node]
    assert "Slice" not in types and "Concat" not in types, types
    assert types.count("Exp") == kinds.count("exp") and 0 < types.count("Exp") + types.count("Sigmoid") == chains
    assert types.count("Min") == (chains if chains > 1 else 0) and types.count("Max") == (chains > 1)
    assert model.SerializeToString() != before
    got = _outputs(model, x)
    assert got[0].tobytes() == expected[0].tobytes()
    assert len(np.unique(got[0])) > 20


@pytest.mark.parametrize("case", ["gap", "axis", "per_column", "read_elsewhere"])
def test_other_slices_and_concats_stay(case):
    """Left as they are: parts that skip a column, a Concat on another axis, a chain with a
    per-column constant (its values depend on the slice's shape), a part read elsewhere."""
    columns, kinds, axis, extra = [(0, 2), (2, 4), (4, 9)], ["sigmoid", "exp", "sigmoid"], -1, None
    if case == "gap":
        columns = [(0, 2), (3, 4), (4, 9)]
    elif case == "axis":
        axis = 1
    elif case == "per_column":
        kinds = ["sigmoid", "mul", "sigmoid"]
    else:
        extra = "d1"
    model = _head(columns, kinds, axis=axis, extra=extra)
    before = model.SerializeToString()
    merge_sliced_columns(model)
    assert model.SerializeToString() == before


@pytest.mark.parametrize("elem", [TensorProto.UINT8, TensorProto.INT8])
def test_without_8_bit_min_max_kernels_only_one_chain_merges(elem, monkeypatch):
    """Where the installed ONNX Runtime has no 8-bit Min / Max (1.20 and older: the merged
    graph would not load), parts through two distinct chains stay as they are (the kernel
    probe asked for this type); parts through one chain, which need no picks, still merge."""
    from nnapi.drivers.ort import sliced_columns

    asked = []

    def probe(op_type, element, **attributes):
        asked.append((op_type, element))
        return op_type not in ("Min", "Max")

    monkeypatch.setattr(sliced_columns, "has_kernel", probe)
    model = _head([(0, 2), (2, 4), (4, 5), (5, 9)], ["sigmoid", "exp", "sigmoid", "sigmoid"], elem=elem)
    before = model.SerializeToString()
    merge_sliced_columns(model)
    assert model.SerializeToString() == before
    assert asked and all(element == elem for _, element in asked)
    model = _head([(0, 3), (3, 9)], ["sigmoid", "sigmoid"], elem=elem)
    merge_sliced_columns(model)
    types = [node.op_type for node in model.graph.node]
    assert "Slice" not in types and "Concat" not in types and "Min" not in types, types


def _yolo_head(signed: bool) -> nnapi.Model:
    """A YOLO-style decoding of [1, 48, 9] 8-bit rows: SLICE of the box centres (LOGISTIC),
    sizes (DEQUANTIZE, EXP, QUANTIZE), objectness and classes (LOGISTIC), each LOGISTIC's
    1/256 output requantized (DEQUANTIZE, QUANTIZE), CONCATENATION on the last axis."""
    qtype = T.TENSOR_QUANT8_ASYMM_SIGNED if signed else T.TENSOR_QUANT8_ASYMM
    shift = -128 if signed else 0
    model = nnapi.Model()

    def q(dims, scale, zero_point):
        return model.add_operand(OperandType(qtype, dims, scale=scale, zero_point=zero_point + shift))

    def ints(values):
        index = model.add_operand(OperandType(T.TENSOR_INT32, [len(values)]))
        model.set_operand_value(index, np.array(values, np.int32))
        return index

    x = q([1, 48, 9], 0.0229, 89)
    parts = []
    for start, end, kind in ((0, 2, "sigmoid"), (2, 4, "exp"), (4, 9, "sigmoid")):
        part = q([1, 48, end - start], 0.0229, 89)
        model.add_operation(Op.SLICE, [x, ints([0, 0, start]), ints([1, 48, end - start])], [part])
        floats = model.add_operand(OperandType(T.TENSOR_FLOAT32, [1, 48, end - start]))
        if kind == "sigmoid":
            gated = q([1, 48, end - start], 1 / 256, 0)
            model.add_operation(Op.LOGISTIC, [part], [gated])
            model.add_operation(Op.DEQUANTIZE, [gated], [floats])
        else:
            raw = model.add_operand(OperandType(T.TENSOR_FLOAT32, [1, 48, end - start]))
            model.add_operation(Op.DEQUANTIZE, [part], [raw])
            model.add_operation(Op.EXP, [raw], [floats])
        out = q([1, 48, end - start], 0.0049, 0)
        model.add_operation(Op.QUANTIZE, [floats], [out])
        parts.append(out)
    axis = model.add_operand(OperandType(T.INT32))
    model.set_operand_value(axis, np.int32(2))
    y = q([1, 48, 9], 0.0049, 0)
    model.add_operation(Op.CONCATENATION, [*parts, axis], [y])
    model.identify_inputs_and_outputs([x], [y])
    model.finish()
    return model


@pytest.mark.parametrize("signed", [False, True])
def test_yolo_head_decoding_runs_without_slices(ort_device, signed, monkeypatch):
    """The head lowers to no Slice and no Concat (zoo2 yolo_tiny_int8's ORT run 201 -> 183
    us); ORT's outputs are the unmerged graph's bytes on every stored value of every
    column, and the device's the reference's within a step (the float EXP and LOGISTIC
    round as before)."""
    _skip_without_min_max(TensorProto.INT8 if signed else TensorProto.UINT8)
    model = _yolo_head(signed)
    lowered, _, _ = lower_model(build_hal_model(model)[0])
    types = [node.op_type for node in lowered.graph.node]
    assert "Slice" not in types and "Concat" not in types and types.count("Max") == 1, types
    monkeypatch.setattr(lowering, "merge_sliced_columns", lambda graph, shapes=None: None)
    unmerged, _, _ = lower_model(build_hal_model(model)[0])
    monkeypatch.undo()
    assert "Concat" in [node.op_type for node in unmerged.graph.node]
    dtype = np.int8 if signed else np.uint8
    rows = (np.arange(48 * 6)[:, None] + 37 * np.arange(9)[None, :]) % 256 - (128 if signed else 0)
    name = lowered.graph.input[0].name
    for block in rows.astype(dtype).reshape(6, 1, 48, 9):
        sessions = [onnxruntime.InferenceSession(m.SerializeToString(), session_options(1),
                                                 providers=["CPUExecutionProvider"],
                                                 disabled_optimizers=disabled_optimizers(m.graph))
                    for m in (lowered, unmerged)]
        merged_out, unmerged_out = (session.run(None, {name: block})[0] for session in sessions)
        assert merged_out.tobytes() == unmerged_out.tobytes()
        ours = run_on(model, ort_device, [block], [np.zeros((1, 48, 9), dtype)])[0]
        theirs = run_on(model, reference_device(), [block], [np.zeros((1, 48, 9), dtype)])[0]
        assert np.abs(ours.astype(np.int32) - theirs).max() <= 1
