"""nnapi-ort-cpu's lowerings for fewer ONNX Runtime nodes (drivers/ort/small_graphs.py): a
GATHER of indices the model wrapped from the end as one Gather, a clamped image's
REDUCE_MAX over height and width as GlobalMaxPool. Each equals the reference on real
values (the gathered rows and the maxima of the same convolution bit for bit);
out-of-range indices fail the run as there; what the rules exclude keeps the general
lowering."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import nnapi  # noqa: E402
from helpers import reference_device  # noqa: E402
from nnapi import OperandCode as T  # noqa: E402
from nnapi import OperandType  # noqa: E402
from nnapi import OperationCode as Op  # noqa: E402
from nnapi.conformance import float_tolerance, within_tolerance  # noqa: E402
from nnapi.drivers.ort import builder, data_movement, pooling  # noqa: E402
from nnapi.drivers.ort.lowering import lower_model  # noqa: E402
from nnapi.runtime.model_builder import build_hal_model  # noqa: E402

pytestmark = pytest.mark.usefixtures("calibration_file")


def _run(model: nnapi.Model, device: nnapi.Device, values: list[np.ndarray], shape, dtype=np.float32):
    """The output of ``model`` on ``device`` alone, or the NDK result code of its failure."""
    assert model.get_supported_operations_for_devices([device]) == [True] * len(
        model.get_supported_operations_for_devices([device]))
    compilation = nnapi.Compilation(model, [device])
    compilation.finish()
    execution = nnapi.Execution(compilation)
    for position, value in enumerate(values):
        execution.set_input(position, value)
    out = np.zeros(shape, dtype)
    execution.set_output(0, out)
    try:
        execution.compute()
    except nnapi.NnapiError as error:
        return error.code
    return out


def _node_types(model: nnapi.Model) -> list[str]:
    hal, _ = build_hal_model(model)
    onnx_model, _, _ = lower_model(hal)
    return [node.op_type for node in onnx_model.graph.node]


def _constant(model: nnapi.Model, code, value, shape=None) -> int:
    index = model.add_operand(OperandType(code, list(np.shape(value)) if shape is None else shape))
    model.set_operand_value(index, np.asarray(value))
    return index


def _embedding_model(rows: int, wrap_size: int, less_than: int = 0, dims: tuple[int, int] = (2, 5)) -> nnapi.Model:
    """Keras 3's embedding: GATHER(table, 0, SELECT(LESS(i, 0), ADD(i, n), i)), the indices
    of ``dims`` (a 0: known only at run time, a text model's sequence)."""
    model = nnapi.Model()
    indices = model.add_operand(OperandType(T.TENSOR_INT32, list(dims)))
    table = _constant(model, T.TENSOR_FLOAT32, np.arange(rows * 3, dtype=np.float32).reshape(rows, 3))
    negative = model.add_operand(OperandType(T.TENSOR_BOOL8, list(dims)))
    model.add_operation(Op.LESS, [indices, _constant(model, T.TENSOR_INT32, np.array([less_than], np.int32))],
                        [negative])
    wrapped = model.add_operand(OperandType(T.TENSOR_INT32, list(dims)))
    model.add_operation(Op.ADD, [indices, _constant(model, T.TENSOR_INT32, np.array([wrap_size], np.int32)),
                                 _constant(model, T.INT32, np.int32(0), [])], [wrapped])
    chosen = model.add_operand(OperandType(T.TENSOR_INT32, list(dims)))
    model.add_operation(Op.SELECT, [negative, wrapped, indices], [chosen])
    out = model.add_operand(OperandType(T.TENSOR_FLOAT32, [*dims, 3]))
    model.add_operation(Op.GATHER, [table, _constant(model, T.INT32, np.int32(0), []), chosen], [out])
    model.identify_inputs_and_outputs([indices], [out])
    model.finish()
    return model


@pytest.mark.parametrize("dims", [(2, 5), (2, 0)])
def test_wrapped_indices_gather_as_one_node_equal_to_the_reference(ort_device, dims):
    """Indices in [-n, n) give the reference's rows through one Gather (no Less / Where /
    Add left), also where their length is known only at run time; an index below -n or
    at n and past fails the run on both devices."""
    model = _embedding_model(7, 7, dims=dims)
    assert _node_types(model) == ["Gather"]
    good = np.array([[0, 6, -1, -7, 3], [-3, 2, 5, -6, 1]], np.int32)
    ours, theirs = (_run(model, device, [good], (2, 5, 3)) for device in (ort_device, reference_device()))
    np.testing.assert_array_equal(ours, theirs)
    np.testing.assert_array_equal(ours[0, 2], [18, 19, 20])  # -1: the last row
    for bad in (7, -8, 2 ** 31 - 1, -(2 ** 31)):
        values = good.copy()
        values[1, 4] = bad
        ours, theirs = (_run(model, device, [values], (2, 5, 3)) for device in (ort_device, reference_device()))
        assert isinstance(theirs, int) and ours == theirs


@pytest.mark.parametrize(("wrap_size", "less_than"), [(6, 0), (7, 1)])
def test_other_wraps_keep_the_general_gather(ort_device, wrap_size, less_than):
    """A wrap by another size than the axis', or a comparison with another bound, is not
    ONNX's wrap: the nodes stay and the result is the reference's."""
    model = _embedding_model(7, wrap_size, less_than)
    assert "Where" in _node_types(model)
    values = np.array([[0, 6, -1, -6, 3], [-3, 2, 5, -2, 1]], np.int32)
    ours, theirs = (_run(model, device, [values], (2, 5, 3)) for device in (ort_device, reference_device()))
    np.testing.assert_array_equal(ours, theirs)


def _conv_max_model(fuse: int, through_reshape: bool, axes=(1, 2), keep: bool = False):
    """CONV_2D [1, 1, 9, 4] -> [1, 1, 7, 16] (fused ``fuse``), then REDUCE_MAX over
    ``axes``, of the image or of its RESHAPE to [1, 7, 16]."""
    rng = np.random.default_rng(5)
    model = nnapi.Model()
    x = model.add_operand(OperandType(T.TENSOR_FLOAT32, [1, 1, 9, 4]))
    filters = _constant(model, T.TENSOR_FLOAT32, rng.normal(size=(16, 1, 3, 4)).astype(np.float32))
    bias = _constant(model, T.TENSOR_FLOAT32, rng.normal(size=16).astype(np.float32))
    conv = model.add_operand(OperandType(T.TENSOR_FLOAT32, [1, 1, 7, 16]))
    scalars = [_constant(model, T.INT32, np.int32(v), []) for v in (PADDING_VALID, 1, 1, fuse)]
    model.add_operation(Op.CONV_2D, [x, filters, bias, *scalars], [conv])
    source = conv
    if through_reshape:
        source = model.add_operand(OperandType(T.TENSOR_FLOAT32, [1, 7, 16]))
        model.add_operation(Op.RESHAPE, [conv, _constant(model, T.TENSOR_INT32, np.array([1, 7, 16], np.int32))],
                            [source])
    rank = 3 if through_reshape else 4
    kept = [1 if i in [a % rank for a in axes] else d
            for i, d in enumerate([1, 7, 16] if through_reshape else [1, 1, 7, 16])]
    shape = kept if keep else [1, 16]
    out = model.add_operand(OperandType(T.TENSOR_FLOAT32, shape))
    model.add_operation(Op.REDUCE_MAX, [source, _constant(model, T.TENSOR_INT32, np.array(axes, np.int32)),
                                        _constant(model, T.BOOL, np.bool_(keep), [])], [out])
    model.identify_inputs_and_outputs([x], [out])
    model.finish()
    assert rank == len(kept)
    return model, tuple(shape)


PADDING_VALID = 2


@pytest.mark.parametrize(("through_reshape", "axes", "keep"), [
    (True, (1,), False), (True, (-2,), True), (False, (1, 2), False), (False, (2, 1), True)])
@pytest.mark.parametrize("fuse", [1, 2, 3])
def test_a_clamped_images_max_over_height_and_width_is_global_max_pool(ort_device, fuse, through_reshape, axes,
                                                                      keep):
    """RELU / RELU1 / RELU6 convolutions' maxima over time (through a RESHAPE) or over
    height and width: GlobalMaxPool, the general lowering's ReduceMax of the same
    convolution bit for bit (and the reference's within the CTS tolerance: its
    convolution sums in another order)."""
    model, shape = _conv_max_model(fuse, through_reshape, axes, keep)
    types = _node_types(model)
    assert "GlobalMaxPool" in types and "ReduceMax" not in types
    value = np.random.default_rng(6).normal(size=(1, 1, 9, 4)).astype(np.float32) * (0.1 if fuse == 2 else 0.5)
    ours, theirs = (_run(model, device, [value], shape) for device in (ort_device, reference_device()))
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(builder.LOWERINGS, Op.REDUCE_MAX, pooling.lower_reduce)
        assert "ReduceMax" in _node_types(model)
        general = _run(_conv_max_model(fuse, through_reshape, axes, keep)[0], ort_device, [value], shape)
    np.testing.assert_array_equal(ours, general)
    assert within_tolerance(T.TENSOR_FLOAT32, theirs, ours, float_tolerance(T.TENSOR_FLOAT32)).all()
    assert len(np.unique(ours)) > 4


@pytest.mark.parametrize(("fuse", "axes"), [(0, (1, 2)), (1, (2,)), (1, (1, 2, 3))])
def test_unclamped_images_and_other_axes_keep_reduce_max(ort_device, fuse, axes):
    """No activation (an all -inf window: ORT's pooling would give -FLT_MAX), or axes that
    are not exactly height and width: ReduceMax, equal to the reference."""
    model, _ = _conv_max_model(fuse, False, axes, True)
    assert "ReduceMax" in _node_types(model)
    value = np.random.default_rng(7).normal(size=(1, 1, 9, 4)).astype(np.float32)
    shape = tuple(1 if i in axes else d for i, d in enumerate([1, 1, 7, 16]))
    ours, theirs = (_run(model, device, [value], shape) for device in (ort_device, reference_device()))
    assert within_tolerance(T.TENSOR_FLOAT32, theirs, ours, float_tolerance(T.TENSOR_FLOAT32)).all()



def _branches_model(pooled_second: bool) -> nnapi.Model:
    """Two RELU convolutions over time of one [1, 1, 9, 4] input, each's maximum over time
    (through a RESHAPE), concatenated along the channels: a text CNN's head; or the second
    part a plain RESHAPE of a mean (not a pool)."""
    rng = np.random.default_rng(8)
    model = nnapi.Model()
    x = model.add_operand(OperandType(T.TENSOR_FLOAT32, [1, 1, 9, 4]))
    parts = []
    for branch, (kernel, channels) in enumerate(((3, 16), (4, 8))):
        filters = _constant(model, T.TENSOR_FLOAT32, rng.normal(size=(channels, 1, kernel, 4)).astype(np.float32))
        bias = _constant(model, T.TENSOR_FLOAT32, rng.normal(size=channels).astype(np.float32))
        length = 9 - kernel + 1
        conv = model.add_operand(OperandType(T.TENSOR_FLOAT32, [1, 1, length, channels]))
        scalars = [_constant(model, T.INT32, np.int32(v), []) for v in (PADDING_VALID, 1, 1, 1)]
        model.add_operation(Op.CONV_2D, [x, filters, bias, *scalars], [conv])
        rows = model.add_operand(OperandType(T.TENSOR_FLOAT32, [1, length, channels]))
        model.add_operation(Op.RESHAPE, [conv, _constant(model, T.TENSOR_INT32,
                                                         np.array([1, length, channels], np.int32))], [rows])
        part = model.add_operand(OperandType(T.TENSOR_FLOAT32, [1, channels]))
        code = Op.REDUCE_MAX if branch == 0 or pooled_second else Op.MEAN
        keep = (_constant(model, T.BOOL, np.bool_(False), []) if code == Op.REDUCE_MAX
                else _constant(model, T.INT32, np.int32(0), []))
        model.add_operation(code, [rows, _constant(model, T.TENSOR_INT32, np.array([1], np.int32)), keep], [part])
        parts.append(part)
    out = model.add_operand(OperandType(T.TENSOR_FLOAT32, [1, 24]))
    model.add_operation(Op.CONCATENATION, [*parts, _constant(model, T.INT32, np.int32(1), [])], [out])
    model.identify_inputs_and_outputs([x], [out])
    model.finish()
    return model


@pytest.mark.parametrize("pooled_second", [True, False])
def test_a_concatenation_of_pooled_maxima_joins_the_pools(ort_device, pooled_second):
    """Maxima lowered as GlobalMaxPool concatenated along the channels: one Concat of the
    pooled values and one Reshape (the general lowering's values bit for bit; the
    reference's within the CTS tolerance); with another part, the general Concat."""
    model = _branches_model(pooled_second)
    hal, _ = build_hal_model(model)
    graph = lower_model(hal)[0].graph
    producers = {name: node for node in graph.node for name in node.output}
    concat = next(node for node in graph.node if node.op_type == "Concat")
    sources = [producers[name].op_type for name in concat.input]
    assert (sources == ["GlobalMaxPool", "GlobalMaxPool"]) == pooled_second, sources
    value = np.random.default_rng(9).normal(size=(1, 1, 9, 4)).astype(np.float32)
    ours, theirs = (_run(model, device, [value], (1, 24)) for device in (ort_device, reference_device()))
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(builder.LOWERINGS, Op.CONCATENATION, data_movement.lower_concatenation)
        patch.setitem(builder.LOWERINGS, Op.REDUCE_MAX, pooling.lower_reduce)
        general = _run(_branches_model(pooled_second), ort_device, [value], (1, 24))
    np.testing.assert_array_equal(ours, general)
    assert within_tolerance(T.TENSOR_FLOAT32, theirs, ours, float_tolerance(T.TENSOR_FLOAT32)).all()
    assert len(np.unique(ours)) > 12


def _segmentation_head(then_conv: bool) -> nnapi.Model:
    """CONV_2D to 21 channels (computed padded to the NCHWc block) -> RESIZE_BILINEAR 9x9 to
    33x33 -> ARGMAX over the channels, or -> a 1x1 CONV_2D (which takes padded channels)."""
    rng = np.random.default_rng(8)
    model = nnapi.Model()

    def const(value, code=T.TENSOR_FLOAT32):
        index = model.add_operand(OperandType(code, list(np.shape(value))) if np.ndim(value) else OperandType(code))
        model.set_operand_value(index, value)
        return index
    x = model.add_operand(OperandType(T.TENSOR_FLOAT32, [1, 9, 9, 16]))
    logits = model.add_operand(OperandType(T.TENSOR_FLOAT32, [1, 9, 9, 21]))
    model.add_operation(Op.CONV_2D, [x, const(rng.standard_normal((21, 1, 1, 16)).astype(np.float32)),
                                     const(rng.standard_normal(21).astype(np.float32)),
                                     *(const(np.int32(v), T.INT32) for v in (1, 1, 1, 0))], [logits])
    big = model.add_operand(OperandType(T.TENSOR_FLOAT32, [1, 33, 33, 21]))
    model.add_operation(Op.RESIZE_BILINEAR, [logits, const(np.int32(33), T.INT32), const(np.int32(33), T.INT32)],
                        [big])
    if then_conv:
        y = model.add_operand(OperandType(T.TENSOR_FLOAT32, [1, 33, 33, 4]))
        model.add_operation(Op.CONV_2D, [big, const(rng.standard_normal((4, 1, 1, 21)).astype(np.float32)),
                                         const(np.zeros(4, np.float32)),
                                         *(const(np.int32(v), T.INT32) for v in (1, 1, 1, 0))], [y])
    else:
        y = model.add_operand(OperandType(T.TENSOR_INT32, [1, 33, 33]))
        model.add_operation(Op.ARGMAX, [big, const(np.int32(3), T.INT32)], [y])
    model.identify_inputs_and_outputs([x], [y])
    model.finish()
    return model


@pytest.mark.parametrize("then_conv", [False, True])
def test_an_enlarging_resize_takes_padded_channels_only_if_kept_padded(ort_device, then_conv):
    """The resize blends the 21 real channels where its result is cut back to them (ARGMAX
    reads it: before, it blended and moved 32, the zero channels included, at the large
    size), the padded ones where a convolution reads it padded; same values as the
    reference either way."""
    import onnx

    model = _segmentation_head(then_conv)
    graph = onnx.shape_inference.infer_shapes(lower_model(build_hal_model(model)[0])[0]).graph
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in graph.value_info}
    resize = next(node for node in graph.node if node.op_type == "Resize")
    assert shapes[resize.input[0]][1] == (32 if then_conv else 21)
    x = np.random.default_rng(2).standard_normal((1, 9, 9, 16)).astype(np.float32)
    shape, dtype = ((1, 33, 33, 4), np.float32) if then_conv else ((1, 33, 33), np.int32)
    got, want = (_run(model, device, [x], shape, dtype) for device in (ort_device, reference_device()))
    if then_conv:   # sums of 21 products rounded in another order: relative to the output's scale
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())
    else:
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("rows", [3, 300])
def test_quantized_fully_connected_over_many_rows_runs_them_as_pixels(ort_device, rows):
    """A quantized FULLY_CONNECTED over many rows (a per-pixel dense layer) runs as one
    image of rows x 1 pixels (QLinearConv [1, depth, rows, 1]; as its batch, each row was an
    image of its own: ~200x slower at 76,800 rows); a few rows are one QGemm of the rows as
    they are. Bit for bit the reference's either way."""
    import onnx

    rng = np.random.default_rng(rows)
    model = nnapi.Model()
    x = model.add_operand(OperandType(T.TENSOR_QUANT8_ASYMM_SIGNED, [rows, 5], 0.05, -3))
    w = model.add_operand(OperandType(T.TENSOR_QUANT8_ASYMM_SIGNED, [4, 5], 0.02, 0))
    model.set_operand_value(w, rng.integers(-127, 128, (4, 5)).astype(np.int8))
    b = model.add_operand(OperandType(T.TENSOR_INT32, [4], 0.05 * 0.02))
    model.set_operand_value(b, rng.integers(-300, 300, 4).astype(np.int32))
    act = model.add_operand(OperandType(T.INT32))
    model.set_operand_value(act, np.int32(1))
    y = model.add_operand(OperandType(T.TENSOR_QUANT8_ASYMM_SIGNED, [rows, 4], 0.04, 2))
    model.add_operation(Op.FULLY_CONNECTED, [x, w, b, act], [y])
    model.identify_inputs_and_outputs([x], [y])
    model.finish()
    graph = onnx.shape_inference.infer_shapes(lower_model(build_hal_model(model)[0])[0]).graph
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in graph.value_info}
    product = next(node for node in graph.node if node.op_type in ("QLinearConv", "QGemm"))
    assert (product.op_type, shapes[product.input[0]]) == (("QLinearConv", [1, 5, rows, 1]) if rows >= 8 else
                                                           ("QGemm", [rows, 5]))
    value = rng.integers(-128, 128, (rows, 5)).astype(np.int8)
    got, want = (_run(model, device, [value], (rows, 4), np.int8) for device in (ort_device, reference_device()))
    np.testing.assert_array_equal(got, want)
    assert len(np.unique(want)) > 10 or rows < 8


def _conv1d_mean_model(length: int, channels: int, target: list[int], keep: bool) -> nnapi.Model:
    """Keras' Conv1D + GlobalAveragePooling1D as TFLite writes it: CONV_2D (1x1, RELU) on
    [1, 1, length, 3] (0: known only at run time), RESHAPE to ``target``, MEAN over axis 1."""
    model = nnapi.Model()
    x = model.add_operand(OperandType(T.TENSOR_FLOAT32, [1, 1, length, 3]))
    filters = _constant(model, T.TENSOR_FLOAT32,
                        np.random.default_rng(0).standard_normal((channels, 1, 1, 3)).astype(np.float32))
    bias = _constant(model, T.TENSOR_FLOAT32, np.full(channels, 0.25, np.float32))
    scalars = [_constant(model, T.INT32, np.int32(v), []) for v in (0, 0, 0, 0, 1, 1, 1)]  # no padding, RELU
    image = model.add_operand(OperandType(T.TENSOR_FLOAT32, [1, 1, length, channels]))
    model.add_operation(Op.CONV_2D, [x, filters, bias, *scalars], [image])
    rows = model.add_operand(OperandType(T.TENSOR_FLOAT32, [1, length, channels]))
    model.add_operation(Op.RESHAPE, [image, _constant(model, T.TENSOR_INT32, np.array(target, np.int32))], [rows])
    mean = model.add_operand(OperandType(T.TENSOR_FLOAT32, [1, 1, channels] if keep else [1, channels]))
    model.add_operation(Op.MEAN, [rows, _constant(model, T.TENSOR_INT32, np.array([1], np.int32)),
                                  _constant(model, T.INT32, np.int32(keep), [])], [mean])
    model.identify_inputs_and_outputs([x], [mean])
    model.finish()
    return model


@pytest.mark.parametrize(("length", "channels", "target", "pooled"),
                         [(0, 32, [1, -1, 32], True), (7, 32, [1, 7, 32], True), (0, 24, [1, -1, 24], False)])
@pytest.mark.parametrize("keep", [False, True])
def test_a_conv1d_global_average_is_global_average_pool(ort_device, length, channels, target, pooled, keep):
    """MEAN over the sequence of a Conv1D's output reshaped to [1, T, C] (T known or not,
    C a multiple of ORT's block) is one GlobalAveragePool of the image (no ReduceMean);
    channels off the block keep ReduceMean; all equal the
    reference's within float32 summation order at sequences 5 and 9."""
    model = _conv1d_mean_model(length, channels, target, keep)
    nodes = _node_types(model)
    assert ("GlobalAveragePool" in nodes and "ReduceMean" not in nodes) == pooled
    for steps in (5, 9) if not length else (length,):
        value = np.random.default_rng(steps).standard_normal((1, 1, steps, 3)).astype(np.float32)
        shape = (1, 1, channels) if keep else (1, channels)
        ours, theirs = (_run(model, device, [value], shape) for device in (ort_device, reference_device()))
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)
