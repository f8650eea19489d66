"""Operations on a free batch (a dimension known only at run time, as TFLite files with a
shape signature of -1 import) are claimed by nnapi-ort-cpu where ONNX broadcasting keeps
NNAPI's meaning, and equal the reference's at the batch each run gives."""

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

pytestmark = pytest.mark.usefixtures("calibration_file")


def _run(model: nnapi.Model, device, x: np.ndarray, out_shape: tuple[int, ...] | None = None,
         code: int = T.TENSOR_FLOAT32) -> np.ndarray:
    """The model's one output on ``device`` alone for input ``x`` (of operand type ``code``),
    the output of ``out_shape`` (default: x's)."""
    out_shape = x.shape if out_shape is None else out_shape
    compilation = nnapi.Compilation(model, [device])
    compilation.finish()
    execution = nnapi.Execution(compilation)
    execution.set_input(0, x, OperandType(code, list(x.shape)))
    out = np.zeros(out_shape, x.dtype)
    execution.set_output(0, out, OperandType(code, list(out_shape)))
    execution.compute()
    return out


@pytest.mark.parametrize("alpha", [np.array([[[0.25, -1.5]]], np.float32), np.array([2.0, 0.5], np.float32)])
def test_prelu_on_a_free_batch_equals_the_reference(ort_device, alpha):
    """openWakeWord's embedding model: PRELUs on [?, 76, 32, 1]-shaped activations."""
    model = nnapi.Model()
    x = model.add_operand(OperandType(T.TENSOR_FLOAT32, [0, 4, 3, 2]))
    a = model.add_operand(OperandType(T.TENSOR_FLOAT32, list(alpha.shape)))
    model.set_operand_value(a, alpha)
    y = model.add_operand(OperandType(T.TENSOR_FLOAT32, [0, 4, 3, 2]))
    model.add_operation(Op.PRELU, [x, a], [y])
    model.identify_inputs_and_outputs([x], [y])
    model.finish()
    assert model.get_supported_operations_for_devices([ort_device]) == [True]
    reference = reference_device()
    for batch in (1, 3):
        value = np.random.default_rng(batch).standard_normal((batch, 4, 3, 2)).astype(np.float32)
        ours = _run(model, ort_device, value)
        np.testing.assert_array_equal(ours, _run(model, reference, value))
        np.testing.assert_array_equal(ours, np.where(value >= 0, value, value * alpha))



def test_prelu_of_an_alpha_given_at_run_time_broadcasts_a_free_batch_of_one(ort_device):
    """A run-time alpha of [2, 3] against x of [?, 3] given [1, 3]: the output is [2, 3], x
    broadcast along the batch (R1: the sign-keeping pick once joined x's [1, 3] with the
    product's [2, 3] and failed the run)."""
    model = nnapi.Model()
    x = model.add_operand(OperandType(T.TENSOR_FLOAT32, [0, 3]))
    a = model.add_operand(OperandType(T.TENSOR_FLOAT32, [2, 3]))
    y = model.add_operand(OperandType(T.TENSOR_FLOAT32, [0, 0]))
    model.add_operation(Op.PRELU, [x, a], [y])
    model.identify_inputs_and_outputs([x, a], [y])
    model.finish()
    value = np.array([[-1.0, -0.0, 2.0]], np.float32)
    alpha = np.array([[0.5, 2.0, 3.0], [4.0, 5.0, 6.0]], np.float32)
    outputs = []
    for device in (ort_device, reference_device()):
        compilation = nnapi.Compilation(model, [device])
        compilation.finish()
        execution = nnapi.Execution(compilation)
        execution.set_input(0, value, OperandType(T.TENSOR_FLOAT32, [1, 3]))
        execution.set_input(1, alpha)
        out = np.full((2, 3), 7.0, np.float32)
        execution.set_output(0, out)
        execution.compute()
        assert execution.get_output_operand_dimensions(0) == [2, 3]
        outputs.append(out)
    np.testing.assert_array_equal(outputs[0], [[-0.5, -0.0, 2.0], [-4.0, -0.0, 2.0]])
    np.testing.assert_array_equal(outputs[0], outputs[1])
    np.testing.assert_array_equal(np.signbit(outputs[0]), np.signbit(outputs[1]))

def _one_operation(code: int, in_dims: list[int], params: list[tuple[OperandType, object]],
                   out_dims: list[int], operand_code: int = T.TENSOR_FLOAT32, scale: float = 0.0,
                   zero_point: int = 0) -> nnapi.Model:
    model = nnapi.Model()
    x = model.add_operand(OperandType(operand_code, in_dims, scale, zero_point))
    inputs = [x]
    for operand_type, value in params:
        index = model.add_operand(operand_type)
        model.set_operand_value(index, value)
        inputs.append(index)
    y = model.add_operand(OperandType(operand_code, out_dims, scale, zero_point))
    model.add_operation(code, inputs, [y])
    model.identify_inputs_and_outputs([x], [y])
    model.finish()
    return model


def test_squeeze_and_reduce_of_known_axes_on_a_free_batch_equal_the_reference(ort_device):
    """openWakeWord's melspectrogram: SQUEEZE of its [?, 1, ?, 257] spectrogram's axis 1 and
    reductions over known axes, with the other dimensions known only at run time."""
    reference = reference_device()
    axes = (OperandType(T.TENSOR_INT32, [1]), np.array([1], np.int32))
    squeeze = _one_operation(Op.SQUEEZE, [0, 1, 0, 5], [axes], [0, 0, 5])
    reduce_max = _one_operation(Op.REDUCE_MAX, [0, 3, 0], [(OperandType(T.TENSOR_INT32, [1]), np.array([-2], np.int32)),
                                                           (OperandType(T.BOOL), np.bool_(True))], [0, 1, 0])
    for model in (squeeze, reduce_max):
        assert model.get_supported_operations_for_devices([ort_device]) == [True]
    rng = np.random.default_rng(4)
    for batch, length in ((1, 7), (3, 2)):
        x = rng.standard_normal((batch, 1, length, 5)).astype(np.float32)
        ours = _run(squeeze, ort_device, x, (batch, length, 5))
        np.testing.assert_array_equal(ours, _run(squeeze, reference, x, (batch, length, 5)))
        np.testing.assert_array_equal(ours, x[:, 0])
        x = rng.standard_normal((batch, 3, length)).astype(np.float32)
        ours = _run(reduce_max, ort_device, x, (batch, 1, length))
        np.testing.assert_array_equal(ours, _run(reduce_max, reference, x, (batch, 1, length)))
        np.testing.assert_array_equal(ours, x.max(axis=1, keepdims=True))


#: REDUCE_*'s axes [1] and keep_dims false
_REDUCE_AXIS_1 = [(OperandType(T.TENSOR_INT32, [1]), np.array([1], np.int32)), (OperandType(T.BOOL), np.bool_(False))]


@pytest.mark.parametrize("code", [Op.REDUCE_MAX, Op.REDUCE_MIN, Op.REDUCE_SUM, Op.REDUCE_PROD])
@pytest.mark.parametrize("operand_code", [T.TENSOR_FLOAT32, T.TENSOR_FLOAT16])
def test_a_float_reduction_over_an_axis_known_only_at_run_time_equals_the_reference(ort_device, code, operand_code):
    """The reduced axis may be empty at run time: the run fails there on both devices, as
    Android's CPU executor fails REDUCE_* of a zero-sized input (the reference gave the
    lowest / highest finite value for a maximum / minimum of nothing, 0 and 1 for a sum and
    a product, and nnapi-ort-cpu those); an axis of only -inf has the maximum of Android's
    fold, the lowest finite value."""
    dtype = np.float16 if operand_code == T.TENSOR_FLOAT16 else np.float32
    model = _one_operation(code, [2, 0], _REDUCE_AXIS_1, [2], operand_code)
    assert model.get_supported_operations_for_devices([ort_device]) == [True]
    # an empty axis arises inside a model (NNAPI inputs cannot be zero-sized): the lowered
    # graph run on one, against the reference's kernel
    import onnxruntime

    from nnapi.drivers.ort.builder import check_failure
    from nnapi.drivers.ort.lowering import lower_model
    from nnapi.operations import ExecutionContext, OperationFailed, Tensor, get_operation
    from nnapi.runtime.model_builder import build_hal_model

    hal_model, _ = build_hal_model(model)
    onnx_model, names, _ = lower_model(hal_model)
    session = onnxruntime.InferenceSession(onnx_model.SerializeToString(), providers=["CPUExecutionProvider"])
    empty = np.zeros((2, 0), dtype)
    with pytest.raises(Exception) as caught:
        session.run(None, {names[0]: empty})
    assert check_failure(caught.value) == f"{code.name}: input 0 is zero-sized, which {code.name} does not support"
    operands = [Tensor(operand_code, (2, 0), 0.0, 0, None, empty),
                Tensor(T.TENSOR_INT32, (1,), 0.0, 0, None, np.array([1], np.int32)),
                Tensor(T.BOOL, (), 0.0, 0, None, np.bool_(False))]
    output = hal_model.main.operands[hal_model.main.output_indexes[0]]
    with pytest.raises(OperationFailed, match="input 0 is zero-sized"):
        get_operation(code).check_inputs(ExecutionContext(code, operands, [output]))
    values = [np.full((2, 3), -np.inf, dtype), np.random.default_rng(2).standard_normal((2, 5)).astype(dtype)]
    for value in values:
        ours, theirs = (_run(model, device, value, (2,), operand_code) for device in (ort_device, reference_device()))
        np.testing.assert_allclose(ours, theirs, rtol=1e-3 if dtype == np.float16 else 1e-6)


def test_a_quantized_reduction_over_an_axis_of_unknown_size_stays_declined():
    """Where the identities are not known to agree (8-bit values, booleans) the reduced
    axes must have known sizes."""
    from nnapi.drivers.ort.device import OrtDevice
    from nnapi.runtime.model_builder import build_hal_model

    model = _one_operation(Op.REDUCE_MAX, [2, 0], _REDUCE_AXIS_1, [2], T.TENSOR_QUANT8_ASYMM, 0.5, 3)
    hal_model, _ = build_hal_model(model)
    assert OrtDevice().get_unsupported_reasons(hal_model) == ["REDUCE_MAX needs the size of each axis it reduces"]


def test_mean_over_height_and_width_on_a_free_batch_is_a_global_pool(ort_device):
    """A Keras GlobalAveragePooling2D after a convolution on a free batch (zoo4's
    dyn_batch CNNs): MEAN over [?, 5, 4, 32]'s height and width lowers to ORT's
    GlobalAveragePool in its blocked layout, as it does at a known batch (not ReduceMean,
    which reorders the whole image out of the layout first), and equals the reference's
    within float32 summation order at batches 1 and 3, keep_dims either way."""
    from nnapi.drivers.ort.device import OrtDevice  # noqa: F401  (registers every lowering)
    from nnapi.drivers.ort.lowering import lower_model
    from nnapi.runtime.model_builder import build_hal_model

    reference = reference_device()
    for keep in (False, True):
        model = nnapi.Model()
        x = model.add_operand(OperandType(T.TENSOR_FLOAT32, [0, 5, 4, 3]))
        filters = model.add_operand(OperandType(T.TENSOR_FLOAT32, [32, 1, 1, 3]))
        model.set_operand_value(filters, np.random.default_rng(0).standard_normal((32, 1, 1, 3)).astype(np.float32))
        bias = model.add_operand(OperandType(T.TENSOR_FLOAT32, [32]))
        model.set_operand_value(bias, np.zeros(32, np.float32))
        scalars = []
        for value in (0, 0, 0, 0, 1, 1, 1):  # explicit padding 0, strides 1, RELU
            scalars.append(model.add_operand(OperandType(T.INT32)))
            model.set_operand_value(scalars[-1], np.int32(value))
        image = model.add_operand(OperandType(T.TENSOR_FLOAT32, [0, 5, 4, 32]))
        model.add_operation(Op.CONV_2D, [x, filters, bias, *scalars], [image])
        axes = model.add_operand(OperandType(T.TENSOR_INT32, [2]))
        model.set_operand_value(axes, np.array([1, 2], np.int32))
        keep_dims = model.add_operand(OperandType(T.INT32))
        model.set_operand_value(keep_dims, np.int32(keep))
        mean = model.add_operand(OperandType(T.TENSOR_FLOAT32, [0, 1, 1, 32] if keep else [0, 32]))
        model.add_operation(Op.MEAN, [image, axes, keep_dims], [mean])
        model.identify_inputs_and_outputs([x], [mean])
        model.finish()
        assert model.get_supported_operations_for_devices([ort_device]) == [True, True]
        nodes = [node.op_type for node in lower_model(build_hal_model(model)[0])[0].graph.node]
        assert "GlobalAveragePool" in nodes and "ReduceMean" not in nodes
        for batch in (1, 3):
            value = np.random.default_rng(batch).standard_normal((batch, 5, 4, 3)).astype(np.float32)
            shape = (batch, 1, 1, 32) if keep else (batch, 32)
            ours, theirs = _run(model, ort_device, value, shape), _run(model, reference, value, shape)
            np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)


def _blaze_block(batch: int, rng_seed: int = 5) -> nnapi.Model:
    """MediaPipe's face mesh blocks in small on a batch of ``batch`` (0: free): a first
    CONV_2D on an image's 3 channels, PRELU, a 1x1 CONV_2D to 12 channels (computed padded
    to the NCHWc block), PRELU, DEPTHWISE_CONV_2D, a 1x1 CONV_2D back to 16, the residual ADD,
    PRELU, then a channel PAD 16 -> 32 of the skip connection added to a PRELU of a 1x1
    CONV_2D's 32 channels, and a last PRELU (the graph output)."""
    rng = np.random.default_rng(rng_seed)
    model = nnapi.Model()

    def tensor(shape, value=None):
        index = model.add_operand(OperandType(T.TENSOR_FLOAT32, shape))
        if value is not None:
            model.set_operand_value(index, np.asarray(value, np.float32))
        return index

    def scalar(value):
        index = model.add_operand(OperandType(T.INT32))
        model.set_operand_value(index, np.int32(value))
        return index

    def conv(x, channels_in, channels_out, size, kernel=1, depthwise=False):
        shape = [1, kernel, kernel, channels_in] if depthwise else [channels_out, kernel, kernel, channels_in]
        w = tensor(shape, rng.standard_normal(shape) * 0.5)
        bias = tensor([channels_out], rng.standard_normal(channels_out) * 0.5)
        y = tensor([batch, size, size, channels_out])
        tail = [scalar(1), scalar(1), scalar(1), *([scalar(1)] if depthwise else []), scalar(0)]  # SAME, strides 1
        model.add_operation(Op.DEPTHWISE_CONV_2D if depthwise else Op.CONV_2D, [x, w, bias, *tail], [y])
        return y

    def prelu(x, channels, size):
        y = tensor([batch, size, size, channels])
        model.add_operation(Op.PRELU, [x, tensor([1, 1, channels], rng.uniform(-1, 2, (1, 1, channels)))], [y])
        return y

    def add(a, b, channels, size):
        y = tensor([batch, size, size, channels])
        model.add_operation(Op.ADD, [a, b, scalar(0)], [y])
        return y

    x = tensor([batch, 8, 8, 3])
    first = prelu(conv(x, 3, 16, 8, kernel=3), 16, 8)
    narrow = prelu(conv(first, 16, 12, 8), 12, 8)
    wide = conv(conv(narrow, 12, 12, 8, kernel=3, depthwise=True), 12, 16, 8)
    block = prelu(add(first, wide, 16, 8), 16, 8)
    skip = tensor([batch, 8, 8, 32])
    paddings = model.add_operand(OperandType(T.TENSOR_INT32, [4, 2]))
    model.set_operand_value(paddings, np.array([[0, 0], [0, 0], [0, 0], [0, 16]], np.int32))
    model.add_operation(Op.PAD, [block, paddings], [skip])
    y = prelu(add(skip, prelu(conv(block, 16, 32, 8), 32, 8), 32, 8), 32, 8)
    model.identify_inputs_and_outputs([x], [y])
    model.finish()
    return model


def test_a_free_batch_keeps_the_blocked_lowerings_of_a_known_batch(ort_device):
    """A free batch leaves the lowering as it is at a known batch: channels padded to the
    NCHWc block (12 computed as 16, no Slice), the image's first convolution read in rows
    (a Reshape, no Transpose), the identity convolution that brings the channel PAD back
    into the blocked layout before its ADD. Before, a batch of 0 (unknown) turned all three
    off (MediaPipe's face_landmarks_detector: ~30% slower than at batch 1). The free-batch
    graph's nodes and weights are the known batch's, so its values at batch 1 are the same
    bit for bit; the reference's at batches 1 and 3 to float32 rounding."""
    from nnapi.drivers.ort.lowering import lower_model
    from nnapi.runtime.model_builder import build_hal_model

    free, known = (lower_model(build_hal_model(_blaze_block(batch))[0])[0].graph for batch in (0, 1))
    assert [(n.op_type, list(n.input)) for n in free.node] == [(n.op_type, list(n.input)) for n in known.node]
    weights = [[t.SerializeToString() for t in graph.initializer if t.data_type == 1] for graph in (free, known)]
    assert weights[0] == weights[1]  # (the rows' Reshape takes the batch from its input: 0 there)
    ops = [n.op_type for n in free.node]
    assert "Slice" not in ops and ops[0] == "Reshape"
    assert [16, 16, 1, 1] in [list(t.dims) for t in free.initializer]  # 12 filters computed as 16
    assert any(n.op_type == "Conv" and ("group", 32) in [(a.name, a.i) for a in n.attribute] for n in free.node)
    model, reference = _blaze_block(0), reference_device()
    assert all(model.get_supported_operations_for_devices([ort_device]))
    at_one = _run(_blaze_block(1), ort_device, np.ones((1, 8, 8, 3), np.float32), (1, 8, 8, 32))
    for batch in (1, 3):
        value = np.random.default_rng(batch).uniform(-1, 1, (batch, 8, 8, 3)).astype(np.float32)
        ours = _run(model, ort_device, value, (batch, 8, 8, 32))
        theirs = _run(model, reference, value, (batch, 8, 8, 32))
        scale = np.abs(theirs).max()
        assert np.abs(ours - theirs).max() <= 2e-6 * scale and len(np.unique(ours)) > 1000
        if batch == 1:
            np.testing.assert_array_equal(_run(_blaze_block(1), ort_device, value, (1, 8, 8, 32)), ours)
    np.testing.assert_array_equal(at_one, _run(model, ort_device, np.ones((1, 8, 8, 3), np.float32), (1, 8, 8, 32)))


@pytest.mark.parametrize("code", [Op.MEAN, Op.REDUCE_SUM, Op.REDUCE_MAX])
def test_a_reduction_of_a_slice_left_empty_at_run_time_fails_on_both_devices(ort_device, code):
    """A SLICE of a size given at run time may leave nothing: the reduction after it then
    fails (OP_FAILED) on both devices, as Android's CPU executor refuses a zero-sized input
    to MEAN and REDUCE_* (nnapi-ort-cpu's MEAN gave 0, the reference's NaN; sums 0)."""
    model = nnapi.Model()
    x = model.add_operand(OperandType(T.TENSOR_FLOAT32, [2, 3]))
    size = model.add_operand(OperandType(T.TENSOR_INT32, [2]))
    begin = model.add_operand(OperandType(T.TENSOR_INT32, [2]))
    model.set_operand_value(begin, np.array([0, 0], np.int32))
    part = model.add_operand(OperandType(T.TENSOR_FLOAT32, [0, 0]))
    model.add_operation(Op.SLICE, [x, begin, size], [part])
    axes = model.add_operand(OperandType(T.TENSOR_INT32, [1]))
    model.set_operand_value(axes, np.array([0], np.int32))
    keep = model.add_operand(OperandType(T.INT32) if code == Op.MEAN else OperandType(T.BOOL))
    model.set_operand_value(keep, np.int32(0) if code == Op.MEAN else np.bool_(False))
    y = model.add_operand(OperandType(T.TENSOR_FLOAT32, [0]))
    model.add_operation(code, [part, axes, keep], [y])
    model.identify_inputs_and_outputs([x, size], [y])
    model.finish()
    value = np.arange(6, dtype=np.float32).reshape(2, 3) - 2.5
    for device in (ort_device, reference_device()):
        compilation = nnapi.Compilation(model, [device])
        compilation.finish()
        for sizes in ([2, 3], [0, 3], [2, 0]):
            execution = nnapi.Execution(compilation)
            execution.set_input(0, value)
            execution.set_input(1, np.array(sizes, np.int32))
            out = np.zeros(3, np.float32)
            execution.set_output(0, out)
            if 0 in sizes:
                with pytest.raises(nnapi.OpFailedError, match=f"{code.name}: input 0 is zero-sized"):
                    execution.compute()
                continue
            execution.compute()
            want = {Op.MEAN: value.mean(0), Op.REDUCE_SUM: value.sum(0), Op.REDUCE_MAX: value.max(0)}[code]
            np.testing.assert_allclose(out, want, rtol=1e-6)
