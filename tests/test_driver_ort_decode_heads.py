"""nnapi-ort-cpu's faster forms for a keypoint / detection model's layers and decode head
(the zoo's pose heads and MoveNet): a DEPTHWISE_CONV_2D of depth multiplier above 1 as a
Gather of its input's channels then a multiplier-1 convolution (convolutions.spread_channels).
Each is compared with the reference device on real values (quantized ones bit for bit),
its node structure asserted, and the cases that keep the plain form checked."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import nnapi  # noqa: E402
from helpers import lowered_graph, reference_device, run_on  # noqa: E402
from nnapi import OperandCode as T  # noqa: E402
from nnapi import OperandType  # noqa: E402
from nnapi import OperationCode as Op  # noqa: E402
from nnapi.operand import SymmPerChannelQuantParams  # noqa: E402

pytestmark = pytest.mark.usefixtures("calibration_file")


def _scalar(model: nnapi.Model, value: int) -> int:
    index = model.add_operand(OperandType(T.INT32))
    model.set_operand_value(index, np.int32(value))
    return index


def _depthwise(code: int, channels: int, multiplier: int, size: int = 9, stride: int = 1,
               nchw: bool = False) -> nnapi.Model:
    """DEPTHWISE_CONV_2D 3x3 (padding SAME, ``stride``, RELU) of ``channels`` by
    ``multiplier``: float32, or 8-bit (``code``) with int8 per-channel weights."""
    rng = np.random.default_rng(channels * 10 + multiplier)
    model = nnapi.Model()
    out_channels, out_size = channels * multiplier, -(-size // stride)
    quantized = code != T.TENSOR_FLOAT32
    zero = {T.TENSOR_QUANT8_ASYMM: 128, T.TENSOR_QUANT8_ASYMM_SIGNED: 0}.get(code, 0)
    in_shape = [1, channels, size, size] if nchw else [1, size, size, channels]
    out_shape = [1, out_channels, out_size, out_size] if nchw else [1, out_size, out_size, out_channels]
    x = model.add_operand(OperandType(code, in_shape, 0.05 if quantized else 0.0, zero + 3 if quantized else 0))
    if quantized:
        scales = rng.uniform(0.004, 0.012, out_channels).astype(np.float32)
        w = model.add_operand(OperandType(T.TENSOR_QUANT8_SYMM_PER_CHANNEL, [1, 3, 3, out_channels]))
        model.set_operand_symm_per_channel_quant_params(w, SymmPerChannelQuantParams(3, scales))
        model.set_operand_value(w, rng.integers(-127, 128, [1, 3, 3, out_channels]).astype(np.int8))
        b = model.add_operand(OperandType(T.TENSOR_INT32, [out_channels]))
        model.set_operand_value(b, rng.integers(-600, 600, out_channels).astype(np.int32))
    else:
        w = model.add_operand(OperandType(T.TENSOR_FLOAT32, [1, 3, 3, out_channels]))
        model.set_operand_value(w, rng.standard_normal([1, 3, 3, out_channels]).astype(np.float32))
        b = model.add_operand(OperandType(T.TENSOR_FLOAT32, [out_channels]))
        model.set_operand_value(b, rng.standard_normal(out_channels).astype(np.float32))
    y = model.add_operand(OperandType(code, out_shape, 0.07 if quantized else 0.0, zero - 100 if quantized else 0))
    params = [_scalar(model, v) for v in (1, stride, stride, multiplier, 1)]  # SAME, strides, multiplier, RELU
    if nchw:
        layout = model.add_operand(OperandType(T.BOOL))
        model.set_operand_value(layout, True)
        params.append(layout)
    model.add_operation(Op.DEPTHWISE_CONV_2D, [x, w, b, *params], [y])
    model.identify_inputs_and_outputs([x], [y])
    model.finish()
    return model


def _run_both(model: nnapi.Model, ort_device: nnapi.Device, code: int, shape: list[int],
              out_shape: list[int]) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    if code == T.TENSOR_FLOAT32:
        x = rng.standard_normal(shape).astype(np.float32)
    else:
        dtype = np.uint8 if code == T.TENSOR_QUANT8_ASYMM else np.int8
        x = rng.integers(np.iinfo(dtype).min, np.iinfo(dtype).max + 1, shape).astype(dtype)
    dtype = x.dtype
    ours = run_on(model, ort_device, [x], [np.zeros(out_shape, dtype)])[0]
    theirs = run_on(model, reference_device(), [x], [np.zeros(out_shape, dtype)])[0]
    return ours, theirs


@pytest.mark.parametrize("code", [T.TENSOR_QUANT8_ASYMM_SIGNED, T.TENSOR_QUANT8_ASYMM, T.TENSOR_FLOAT32])
@pytest.mark.parametrize(("channels", "multiplier", "stride", "nchw"),
                         [(4, 2, 1, False), (3, 4, 2, False), (5, 3, 1, True)])
def test_depthwise_multiplier_runs_on_spread_channels(ort_device, code, channels, multiplier, stride, nchw):
    """A multiplier above 1: the input's channels gathered (each repeated multiplier times,
    in order), then a convolution with one group per output channel; the reference's
    values (bit for bit where quantized)."""
    model = _depthwise(code, channels, multiplier, stride=stride, nchw=nchw)
    graph = lowered_graph(model)
    convolution = next(n for n in graph.node if n.op_type in ("Conv", "QLinearConv"))
    group = next(a.i for a in convolution.attribute if a.name == "group")
    assert group == channels * multiplier
    gather = next(n for n in graph.node if n.op_type == "Gather")
    indices = next(np.frombuffer(t.raw_data, np.int64) for t in graph.initializer if t.name == gather.input[1])
    assert indices.tolist() == np.repeat(np.arange(channels), multiplier).tolist()
    assert [n.output[0] for n in graph.node].index(gather.output[0]) < list(graph.node).index(convolution)
    out_size = -(-9 // stride)
    shape = [1, channels, 9, 9] if nchw else [1, 9, 9, channels]
    out_shape = [1, channels * multiplier, out_size, out_size] if nchw else [1, out_size, out_size,
                                                                            channels * multiplier]
    ours, theirs = _run_both(model, ort_device, code, shape, out_shape)
    if code == T.TENSOR_FLOAT32:
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)
    else:
        # ORT requantizes in float32 where Android uses fixed point: within a step
        assert np.abs(ours.astype(np.int32) - theirs.astype(np.int32)).max() <= 1
        assert np.abs(ours.astype(np.int32) - theirs.astype(np.int32)).mean() < 0.05


@pytest.mark.parametrize(("channels", "multiplier"), [(6, 1), (1, 4)])
def test_depthwise_without_spread(ort_device, channels, multiplier):
    """A multiplier of 1, or one input channel (a CONV_2D of multiplier filters): no Gather."""
    code = T.TENSOR_QUANT8_ASYMM_SIGNED
    model = _depthwise(code, channels, multiplier)
    assert "Gather" not in [n.op_type for n in lowered_graph(model).node]
    ours, theirs = _run_both(model, ort_device, code, [1, 9, 9, channels], [1, 9, 9, channels * multiplier])
    assert np.abs(ours.astype(np.int32) - theirs.astype(np.int32)).max() <= 1


def _decode_head(guarded_index: bool = False, negative_column: bool = False,
                 scale_input: bool = False) -> tuple[nnapi.Model, list[int]]:
    """A keypoint decode head as TensorFlow writes it: ARGMAX over a [1, 16, 3] heatmap's
    16 cells, row = index // 4, column = index - row * 4 (its floor remainder), the row
    scaled by 0.5, floored, clamped and cast back to int32, the column bounds-checked
    (LESS 0, GREATER_EQUAL 4, LOGICAL_OR, SELECT 0) before a GATHER from an offset table
    given at run time. Outputs: the gathered offsets, the cast row, the checked column.
    ``guarded_index``: the column read from a model input (no bounds: the checks stay);
    ``negative_column``: the column less 2, which the check at 0 does not decide and the
    DIV by 2 after it may see negative; ``scale_input``: the row's scale given at run time
    (its CAST keeps the saturating form)."""
    model = nnapi.Model()
    inputs: list[int] = []

    def tensor(code: int, shape: list[int], value=None, given: bool = False) -> int:
        index = model.add_operand(OperandType(code, shape))
        if given:
            inputs.append(index)
        elif value is not None:
            model.set_operand_value(index, np.asarray(value, {T.TENSOR_FLOAT32: np.float32,
                                                              T.TENSOR_INT32: np.int32}[code]))
        return index

    def scalar(value: int) -> int:
        return _scalar(model, value)

    heatmap = tensor(T.TENSOR_FLOAT32, [1, 16, 3], given=True)
    table = tensor(T.TENSOR_FLOAT32, [4, 2], given=True)
    index = tensor(T.TENSOR_INT32, [1, 3])
    model.add_operation(Op.ARGMAX, [heatmap, scalar(1)], [index])
    four = tensor(T.TENSOR_INT32, [1], [4])
    row, product, column = (tensor(T.TENSOR_INT32, [1, 3]) for _ in range(3))
    model.add_operation(Op.DIV, [index, four, scalar(0)], [row])
    model.add_operation(Op.MUL, [row, four, scalar(0)], [product])
    model.add_operation(Op.SUB, [index, product, scalar(0)], [column])
    if guarded_index:
        column = tensor(T.TENSOR_INT32, [1, 3], given=True)
    if negative_column:
        shifted = tensor(T.TENSOR_INT32, [1, 3])
        model.add_operation(Op.SUB, [column, tensor(T.TENSOR_INT32, [1], [2]), scalar(0)], [shifted])
        halved = tensor(T.TENSOR_INT32, [1, 3])
        model.add_operation(Op.DIV, [shifted, tensor(T.TENSOR_INT32, [1], [2]), scalar(0)], [halved])
        column = halved
    real_row, scaled, floored, clamped = (tensor(T.TENSOR_FLOAT32, [1, 3]) for _ in range(4))
    model.add_operation(Op.CAST, [row], [real_row])
    scale = tensor(T.TENSOR_FLOAT32, [1], given=True) if scale_input else tensor(T.TENSOR_FLOAT32, [1], [0.5])
    model.add_operation(Op.MUL, [real_row, scale, scalar(0)], [scaled])
    model.add_operation(Op.FLOOR, [scaled], [floored])
    model.add_operation(Op.MINIMUM, [floored, tensor(T.TENSOR_FLOAT32, [1], [1.0])], [clamped])
    cast_row = tensor(T.TENSOR_INT32, [1, 3])
    model.add_operation(Op.CAST, [clamped], [cast_row])
    below, above, outside = (model.add_operand(OperandType(T.TENSOR_BOOL8, [1, 3])) for _ in range(3))
    model.add_operation(Op.LESS, [column, tensor(T.TENSOR_INT32, [1], [0])], [below])
    model.add_operation(Op.GREATER_EQUAL, [column, four], [above])
    model.add_operation(Op.LOGICAL_OR, [below, above], [outside])
    checked = tensor(T.TENSOR_INT32, [1, 3])
    model.add_operation(Op.SELECT, [outside, tensor(T.TENSOR_INT32, [1, 3], [[0, 0, 0]]), column], [checked])
    offsets = tensor(T.TENSOR_FLOAT32, [1, 3, 2])
    model.add_operation(Op.GATHER, [table, scalar(0), checked], [offsets])
    model.identify_inputs_and_outputs(inputs, [offsets, cast_row, checked])
    model.finish()
    return model, inputs


def _head_feeds(model_inputs: int, seed: int, guarded_index: bool, scale_input: bool) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = [rng.standard_normal([1, 16, 3]).astype(np.float32), rng.standard_normal([4, 2]).astype(np.float32)]
    if guarded_index:
        feeds.append(rng.integers(-3, 7, [1, 3]).astype(np.int32))
    if scale_input:
        feeds.append(np.array([rng.choice([0.5, np.nan, 1e30, -2.0])], np.float32))
    assert len(feeds) == model_inputs
    return feeds


def _head_outputs() -> list[np.ndarray]:
    return [np.zeros([1, 3, 2], np.float32), np.zeros([1, 3], np.int32), np.zeros([1, 3], np.int32)]


def _compare_head(model: nnapi.Model, inputs: list[int], ort_device, guarded_index=False, scale_input=False):
    for seed in range(12):
        feeds = _head_feeds(len(inputs), seed, guarded_index, scale_input)
        ours = run_on(model, ort_device, feeds, _head_outputs())
        theirs = run_on(model, reference_device(), feeds, _head_outputs())
        for a, b in zip(ours, theirs, strict=True):
            np.testing.assert_array_equal(a, b)


def test_decode_head_checks_fold_by_bounds(ort_device):
    """The column's bounds checks are constants (no Less, GreaterOrEqual, Or, Where left),
    the SELECT gives the column itself, index // 4 is one int32 Div (no Mod), the floored
    row one Cast (no IsNaN / Clip guard), the GATHER reads the column unguarded; the
    reference's values bit for bit."""
    from nnapi.drivers.ort.value_ranges import operand_ranges
    from nnapi.runtime.model_builder import build_hal_model

    model, inputs = _decode_head()
    types = [n.op_type for n in lowered_graph(model).node]
    for gone in ("Less", "GreaterOrEqual", "Or", "Where", "Mod", "IsNaN"):
        assert gone not in types, (gone, types)
    assert types.count("Clip") == 1, types  # the MINIMUM's own (Clip(x, -inf, 1)), no CAST guard
    assert types.count("Div") == 1 and types.count("Cast") == 3  # ArgMax's int64, row to float, back
    hal = build_hal_model(model)[0]
    ranges = operand_ranges(hal, hal.main)
    argmax, div, _, remainder = hal.main.operations[:4]
    assert [ranges[argmax.outputs[0]][side].max() for side in (0, 1)] == [0, 15]
    assert [ranges[div.outputs[0]][side].max() for side in (0, 1)] == [0, 3]
    assert [ranges[remainder.outputs[0]][side].max() for side in (0, 1)] == [0, 3]  # not [-12, 15]
    _compare_head(model, inputs, ort_device)


@pytest.mark.parametrize(("guarded_index", "negative_column", "scale_input", "kept"), [
    (True, False, False, ("Less", "GreaterOrEqual", "Or", "Where")),
    (False, True, False, ("Mod", "Less", "Or")),
    (False, False, True, ("IsNaN", "Clip")),
])
def test_decode_head_without_bounds_keeps_guards(ort_device, guarded_index, negative_column, scale_input, kept):
    """What the bounds do not prove keeps its general form: checks of an index given at run
    time, a check the bounds leave open and a DIV of a value that may be negative, a CAST
    of a value scaled at run time (NaN, 1e30: saturated as the reference does)."""
    model, inputs = _decode_head(guarded_index, negative_column, scale_input)
    types = [n.op_type for n in lowered_graph(model).node]
    for op_type in kept:
        assert op_type in types, (op_type, types)
    _compare_head(model, inputs, ort_device, guarded_index, scale_input)


def test_floor_mod_by_float_folds_to_its_input(ort_device):
    """TensorFlow's FLOOR_MOD of an index by 65536 as the converter writes it in float
    (x - floor(x * 2^-16) * 65536): the bounds fix floor(x * 2^-16) at 0 for an index below
    16, so the int32 quotient and product are constants and x - 0 is x itself: no Floor,
    no Mul, no Sub left; the reference's values."""
    model = nnapi.Model()
    heatmap = model.add_operand(OperandType(T.TENSOR_FLOAT32, [1, 16, 3]))
    index, quotient, product, remainder = (model.add_operand(OperandType(T.TENSOR_INT32, [1, 3])) for _ in range(4))
    real, scaled, floored = (model.add_operand(OperandType(T.TENSOR_FLOAT32, [1, 3])) for _ in range(3))
    model.add_operation(Op.ARGMAX, [heatmap, _scalar(model, 1)], [index])
    model.add_operation(Op.CAST, [index], [real])
    tiny = model.add_operand(OperandType(T.TENSOR_FLOAT32, [1]))
    model.set_operand_value(tiny, np.array([2.0 ** -16], np.float32))
    model.add_operation(Op.MUL, [real, tiny, _scalar(model, 0)], [scaled])
    model.add_operation(Op.FLOOR, [scaled], [floored])
    model.add_operation(Op.CAST, [floored], [quotient])
    big = model.add_operand(OperandType(T.TENSOR_INT32, [1]))
    model.set_operand_value(big, np.array([65536], np.int32))
    model.add_operation(Op.MUL, [quotient, big, _scalar(model, 0)], [product])
    model.add_operation(Op.SUB, [index, product, _scalar(model, 0)], [remainder])
    model.identify_inputs_and_outputs([heatmap], [remainder])
    model.finish()
    types = [n.op_type for n in lowered_graph(model).node]
    assert types == ["ArgMax", "Cast"], types
    for seed in range(6):
        feed = np.random.default_rng(seed).standard_normal([1, 16, 3]).astype(np.float32)
        ours = run_on(model, ort_device, [feed], [np.zeros([1, 3], np.int32)])[0]
        theirs = run_on(model, reference_device(), [feed], [np.zeros([1, 3], np.int32)])[0]
        np.testing.assert_array_equal(ours, theirs)
        np.testing.assert_array_equal(ours, feed.argmax(axis=1))


def _constant(model: nnapi.Model, code: int, value: np.ndarray) -> int:
    index = model.add_operand(OperandType(code, list(value.shape)))
    model.set_operand_value(index, value)
    return index


@pytest.mark.parametrize("move", [Op.GATHER, Op.SLICE], ids=["GATHER", "SLICE"])
def test_a_move_at_a_run_time_position_keeps_its_failure(ort_device, move):
    """A GATHER / SLICE of a constant of one value at an index or begin given at run time:
    no bounds for its output (every value would be 5, and the CAST + ADD after it folded to
    the constant 6, the move dropped), so that an index out of range fails the run
    (OP_FAILED) on both devices, as Android's executor does; it gave [6] before."""
    from nnapi.drivers.ort.value_ranges import operand_ranges
    from nnapi.runtime.model_builder import build_hal_model

    model = nnapi.Model()
    data = _constant(model, T.TENSOR_INT32, np.array([5, 5, 5], np.int32))
    where = model.add_operand(OperandType(T.TENSOR_INT32, [1]))
    picked = model.add_operand(OperandType(T.TENSOR_INT32, [1]))
    if move == Op.GATHER:
        model.add_operation(Op.GATHER, [data, _scalar(model, 0), where], [picked])
    else:
        model.add_operation(Op.SLICE, [data, where, _constant(model, T.TENSOR_INT32, np.array([1], np.int32))],
                            [picked])
    real, y = (model.add_operand(OperandType(T.TENSOR_FLOAT32, [1])) for _ in range(2))
    model.add_operation(Op.CAST, [picked], [real])
    model.add_operation(Op.ADD, [real, _constant(model, T.TENSOR_FLOAT32, np.array([1], np.float32)),
                                 _scalar(model, 0)], [y])
    model.identify_inputs_and_outputs([where], [y])
    model.finish()
    hal = build_hal_model(model)[0]
    assert hal.main.operations[0].outputs[0] not in operand_ranges(hal, hal.main)
    for device in (ort_device, reference_device()):
        out = run_on(model, device, [np.array([1], np.int32)], [np.zeros([1], np.float32)])[0]
        np.testing.assert_array_equal(out, [6.0])
        with pytest.raises(nnapi.OpFailedError):
            run_on(model, device, [np.array([7], np.int32)], [np.zeros([1], np.float32)])


def test_a_gather_at_topk_indices_keeps_its_bounds(ort_device):
    """A GATHER at TOPK_V2's indices (a YOLO head's picks) cannot fail: the indices lie in
    [0, the last dimension), so its output keeps the union of the data's bounds; the
    reference's values."""
    from nnapi.drivers.ort.value_ranges import operand_ranges
    from nnapi.runtime.model_builder import build_hal_model

    model = nnapi.Model()
    scores = model.add_operand(OperandType(T.TENSOR_FLOAT32, [6]))
    values = model.add_operand(OperandType(T.TENSOR_FLOAT32, [2]))
    picks, classes = (model.add_operand(OperandType(T.TENSOR_INT32, [2])) for _ in range(2))
    model.add_operation(Op.TOPK_V2, [scores, _scalar(model, 2)], [values, picks])
    table = _constant(model, T.TENSOR_INT32, np.array([4, 9, 7, 5, 8, 6], np.int32))
    model.add_operation(Op.GATHER, [table, _scalar(model, 0), picks], [classes])
    model.identify_inputs_and_outputs([scores], [classes])
    model.finish()
    hal = build_hal_model(model)[0]
    ranges = operand_ranges(hal, hal.main)
    assert [ranges[picks][side].tolist() for side in (0, 1)] == [[0, 0], [5, 5]]
    assert (int(ranges[classes][0].min()), int(ranges[classes][1].max())) == (4, 9)
    for seed in range(4):
        feed = np.random.default_rng(seed).permutation(6).astype(np.float32)
        ours = run_on(model, ort_device, [feed], [np.zeros([2], np.int32)])[0]
        np.testing.assert_array_equal(ours, run_on(model, reference_device(), [feed], [np.zeros([2], np.int32)])[0])
        np.testing.assert_array_equal(ours, np.array([4, 9, 7, 5, 8, 6])[np.argsort(-feed)[:2]])


def _diagonal_pack(code: int, scales: tuple[float, float] = (0.05, 0.05), second_source: bool = False,
                   join: int = Op.PACK) -> nnapi.Model:
    """[1, 3, 3, 2] (a model input) -> STRIDED_SLICE [0, i, i, :] shrinking axes 1 and 2
    for i = 0, 1, 2 -> PACK on axis 1 (or CONCATENATION on axis 0) into [1, 3, 2] ([3, 2]).
    ``scales``: the pieces' and the output's scale (8-bit); ``second_source``: the last
    piece cut from another input."""
    model = nnapi.Model()
    quantized = code != T.TENSOR_FLOAT32

    def operand(shape: list[int], scale: float) -> int:
        return model.add_operand(OperandType(code, shape, scale if quantized else 0.0, 3 if quantized else 0))

    def vector(values: list[int]) -> int:
        index = model.add_operand(OperandType(T.TENSOR_INT32, [len(values)]))
        model.set_operand_value(index, np.array(values, np.int32))
        return index

    sources = [operand([1, 3, 3, 2], scales[0]) for _ in range(2 if second_source else 1)]
    pieces = []
    for i in range(3):
        piece = operand([1, 2], scales[0])
        source = sources[-1] if i == 2 else sources[0]
        model.add_operation(Op.STRIDED_SLICE, [source, vector([0, i, i, 0]), vector([1, i + 1, i + 1, 2]),
                                               vector([1, 1, 1, 1]), _scalar(model, 0), _scalar(model, 0),
                                               _scalar(model, 6)], [piece])
        pieces.append(piece)
    if join == Op.PACK:
        out = operand([1, 3, 2], scales[1])
        model.add_operation(Op.PACK, [_scalar(model, 1), *pieces], [out])
    else:
        out = operand([3, 2], scales[1])
        model.add_operation(Op.CONCATENATION, [*pieces, _scalar(model, 0)], [out])
    model.identify_inputs_and_outputs(sources, [out])
    model.finish()
    return model


def _run_diagonal(model: nnapi.Model, ort_device, code: int, inputs: int, shape: list[int]) -> None:
    rng = np.random.default_rng(3)
    dtype = {T.TENSOR_FLOAT32: np.float32, T.TENSOR_QUANT8_ASYMM_SIGNED: np.int8}[code]
    feeds = [(rng.standard_normal([1, 3, 3, 2]) * 50).astype(dtype) for _ in range(inputs)]
    ours = run_on(model, ort_device, feeds, [np.zeros(shape, dtype)])[0]
    theirs = run_on(model, reference_device(), feeds, [np.zeros(shape, dtype)])[0]
    np.testing.assert_array_equal(ours, theirs)
    if inputs == 1:
        np.testing.assert_array_equal(ours.reshape(3, 2), feeds[0][0, [0, 1, 2], [0, 1, 2], :])


@pytest.mark.parametrize("code", [T.TENSOR_QUANT8_ASYMM_SIGNED, T.TENSOR_FLOAT32])
@pytest.mark.parametrize("join", [Op.PACK, Op.CONCATENATION])
def test_diagonal_pack_is_one_gather(ort_device, code, join):
    """A PACK / CONCATENATION of STRIDED_SLICEs of one tensor (a decode head's diagonal
    pick): one Gather of the flattened source at constant positions, no Slice, Squeeze or
    Concat; the reference's values bit for bit."""
    model = _diagonal_pack(code, join=join)
    graph = lowered_graph(model)
    types = [n.op_type for n in graph.node]
    assert "Slice" not in types and "Concat" not in types and types.count("Gather") == 1, types
    gather = next(n for n in graph.node if n.op_type == "Gather")
    positions = next(np.frombuffer(t.raw_data, np.int64) for t in graph.initializer if t.name == gather.input[1])
    assert positions.tolist() == [0, 1, 8, 9, 16, 17]
    _run_diagonal(model, ort_device, code, 1, [1, 3, 2] if join == Op.PACK else [3, 2])


@pytest.mark.parametrize(("scales", "second_source"), [((0.05, 0.07), False), ((0.05, 0.05), True)])
def test_pack_of_other_pieces_keeps_its_form(ort_device, scales, second_source):
    """A CONCATENATION into another quantization (it requantizes) and pieces of two sources
    keep the Slices and the join; the reference's values (within a step where requantized)."""
    code = T.TENSOR_QUANT8_ASYMM_SIGNED
    join = Op.CONCATENATION if scales[0] != scales[1] else Op.PACK
    model = _diagonal_pack(code, scales, second_source, join)
    types = [n.op_type for n in lowered_graph(model).node]
    assert "Slice" in types and "Concat" in types, types
    rng = np.random.default_rng(4)
    feeds = [rng.integers(-128, 128, [1, 3, 3, 2]).astype(np.int8) for _ in range(2 if second_source else 1)]
    shape = [3, 2] if join == Op.CONCATENATION else [1, 3, 2]
    ours = run_on(model, ort_device, feeds, [np.zeros(shape, np.int8)])[0]
    theirs = run_on(model, reference_device(), feeds, [np.zeros(shape, np.int8)])[0]
    assert np.abs(ours.astype(np.int32) - theirs.astype(np.int32)).max() <= 1


@pytest.mark.parametrize("full", [True, False])
def test_whole_strided_slice_is_its_input(ort_device, full):
    """A STRIDED_SLICE of the whole [1, 5, 1] tensor (the converter's slice of a decode
    head's scores) lowers to no node; one that cuts keeps its Slice; the reference's values."""
    model = nnapi.Model()
    code = T.TENSOR_QUANT8_ASYMM_SIGNED
    x = model.add_operand(OperandType(code, [1, 5, 1], 0.05, 3))
    y = model.add_operand(OperandType(code, [1, 5 if full else 4, 1], 0.05, 3))

    def vector(values: list[int]) -> int:
        index = model.add_operand(OperandType(T.TENSOR_INT32, [3]))
        model.set_operand_value(index, np.array(values, np.int32))
        return index

    end = [1, 5, 1] if full else [1, 4, 1]
    model.add_operation(Op.STRIDED_SLICE, [x, vector([0, 0, 0]), vector(end), vector([1, 1, 1]),
                                           _scalar(model, 0), _scalar(model, 0), _scalar(model, 0)], [y])
    model.identify_inputs_and_outputs([x], [y])
    model.finish()
    assert ("Slice" in [n.op_type for n in lowered_graph(model).node]) != full
    feed = np.arange(-2, 3, dtype=np.int8).reshape(1, 5, 1) * 40
    shape = [1, 5 if full else 4, 1]
    ours = run_on(model, ort_device, [feed], [np.zeros(shape, np.int8)])[0]
    theirs = run_on(model, reference_device(), [feed], [np.zeros(shape, np.int8)])[0]
    np.testing.assert_array_equal(ours, theirs)
    np.testing.assert_array_equal(ours, feed[:, :shape[1]])


@pytest.mark.parametrize("bounded", [True, False])
def test_quantize_of_a_bounded_index_rounds_halves_up(ort_device, bounded):
    """QUANTIZE into a zero point above the bottom of a float the bounds keep non-negative
    (an ARGMAX index cast to float): halves away from zero are halves up, Floor(x / s + 0.5)
    without the Abs / Sign form; a float given at run time keeps it. Scale 2: the odd
    indices land on halves; the reference's values bit for bit."""
    model = nnapi.Model()
    if bounded:
        heatmap = model.add_operand(OperandType(T.TENSOR_FLOAT32, [1, 16, 3]))
    real = model.add_operand(OperandType(T.TENSOR_FLOAT32, [1, 3]))
    if bounded:
        inputs = [heatmap]
        index = model.add_operand(OperandType(T.TENSOR_INT32, [1, 3]))
        model.add_operation(Op.ARGMAX, [heatmap, _scalar(model, 1)], [index])
        model.add_operation(Op.CAST, [index], [real])
    else:
        inputs = [real]
    y = model.add_operand(OperandType(T.TENSOR_QUANT8_ASYMM_SIGNED, [1, 3], 2.0, -5))
    model.add_operation(Op.QUANTIZE, [real], [y])
    model.identify_inputs_and_outputs(inputs, [y])
    model.finish()
    types = [n.op_type for n in lowered_graph(model).node]
    assert ("Abs" in types or "Sign" in types) != bounded, types
    for seed in range(8):
        rng = np.random.default_rng(seed)
        feed = rng.standard_normal([1, 16, 3]).astype(np.float32) if bounded else \
            rng.integers(-9, 10, [1, 3]).astype(np.float32)
        ours = run_on(model, ort_device, [feed], [np.zeros([1, 3], np.int8)])[0]
        theirs = run_on(model, reference_device(), [feed], [np.zeros([1, 3], np.int8)])[0]
        np.testing.assert_array_equal(ours, theirs)
