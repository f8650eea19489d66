"""The detection operations on nnapi-ort-cpu (drivers/ort/detection.py): each lowered
variant gives the reference's values (floats within the CTS tolerance, quantized values
equal) on the ORT device alone, on boxes crossing the image border, tiny and empty boxes,
several batches, both layouts; inputs the reference refuses at execution fail the run here
too; what stays declined names its rule."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import nnapi  # noqa: E402
from helpers import constant  # noqa: E402
from nnapi import OperandCode as T  # noqa: E402
from nnapi import OperandType  # noqa: E402
from nnapi import OperationCode as Op  # noqa: E402
from nnapi.conformance import float_tolerance, within_tolerance  # noqa: E402
from nnapi.drivers.ort.device import OrtDevice  # noqa: E402
from nnapi.runtime.model_builder import build_hal_model  # noqa: E402

BOX = {"scale": 0.125, "zero_point": 0}
DTYPES = {T.TENSOR_FLOAT32: np.float32, T.TENSOR_FLOAT16: np.float16, T.TENSOR_QUANT8_ASYMM: np.uint8,
          T.TENSOR_QUANT8_ASYMM_SIGNED: np.int8, T.TENSOR_QUANT16_ASYMM: np.uint16, T.TENSOR_INT32: np.int32}


def _devices() -> tuple[nnapi.Device, nnapi.Device]:
    found = {d.name: d for d in nnapi.get_devices()}
    return found["nnapi-reference"], found["nnapi-ort-cpu"]


class _Model:
    """One operation's model: tensors given at run time (or constants), scalars, outputs."""

    def __init__(self) -> None:
        self.model = nnapi.Model()
        self.inputs: list[int] = []
        self.values: list[np.ndarray] = []
        #: the full type of each input declared with unknown dimensions (given at execution)
        self.types: dict[int, OperandType] = {}
        self.outputs: list[tuple[int, list[int], int]] = []

    def tensor(self, code: int, value: np.ndarray, given: bool = True, unknown: tuple[int, ...] = (),
               **quant) -> int:
        """A tensor input (its ``unknown`` axes declared as 0, given at execution) or constant."""
        value = np.asarray(value, DTYPES[code])
        declared = [0 if axis in unknown else d for axis, d in enumerate(value.shape)]
        index = self.model.add_operand(OperandType(code, declared, **quant))
        if unknown:
            self.types[len(self.inputs)] = OperandType(code, list(value.shape), **quant)
        if given:
            self.inputs.append(index)
            self.values.append(value)
        else:
            self.model.set_operand_value(index, value)
        return index

    def scalar(self, code: int, value) -> int:
        return constant(self.model, code, value)

    def output(self, code: int, shape: list[int], **quant) -> int:
        index = self.model.add_operand(OperandType(code, shape, **quant))
        self.outputs.append((index, shape, code))
        return index

    def finish(self, operation: int, inputs: list[int]) -> None:
        self.model.add_operation(operation, inputs, [index for index, _, _ in self.outputs])
        self.model.identify_inputs_and_outputs(self.inputs, [index for index, _, _ in self.outputs])
        self.model.finish()

    def run(self, device: nnapi.Device) -> list[np.ndarray]:
        compilation = nnapi.Compilation(self.model, [device])
        compilation.finish()
        execution = nnapi.Execution(compilation)
        for position, value in enumerate(self.values):
            execution.set_input(position, value, self.types.get(position))
        results = [np.zeros(shape, DTYPES[code]) for _, shape, code in self.outputs]
        for position, array in enumerate(results):
            execution.set_output(position, array)
        execution.compute()
        return results

    def support(self) -> list[str | None]:
        hal, _ = build_hal_model(self.model)
        return OrtDevice().get_unsupported_reasons(hal)

    def assert_as_the_reference(self, *, exact_quantized: bool = True) -> list[np.ndarray]:
        """Runs on nnapi-ort-cpu alone (which must claim the operation) and on the
        reference; returns the reference's outputs."""
        assert self.support() == [None]
        reference, ort_device = _devices()
        expected, actual = self.run(reference), self.run(ort_device)
        for (_, _, code), want, got in zip(self.outputs, expected, actual, strict=True):
            assert got.shape == want.shape
            if code in (T.TENSOR_FLOAT32, T.TENSOR_FLOAT16):
                close = within_tolerance(code, want, got, float_tolerance(code, False))
                assert close.all(), (got[~close], want[~close])
            elif exact_quantized:
                np.testing.assert_array_equal(got, want)
            else:
                assert np.abs(got.astype(np.int64) - want.astype(np.int64)).max(initial=0) <= 1
        return expected

    def assert_both_fail(self) -> None:
        assert self.support() == [None]
        for device in _devices():
            with pytest.raises(nnapi.OpFailedError):
                self.run(device)


# --- AXIS_ALIGNED_BBOX_TRANSFORM -------------------------------------------------------------
def _random_boxes(rng: np.random.Generator, count: int, height: float, width: float, tiny: int = 2) -> np.ndarray:
    """[count, 4] ordered boxes inside [0, width] x [0, height], the first ``tiny`` of them
    narrower than a pixel (one at the far corner), the rest of every size."""
    x = np.sort(rng.uniform(0, width, (count, 2)), axis=1)
    y = np.sort(rng.uniform(0, height, (count, 2)), axis=1)
    boxes = np.stack([x[:, 0], y[:, 0], x[:, 1], y[:, 1]], axis=1)
    if tiny:
        boxes[0] = [width - 0.3, height - 0.2, width, height]
        boxes[1:tiny] = [[1.0, 2.0, 1.25, 2.5]]
    return boxes


@pytest.mark.parametrize("code", [T.TENSOR_FLOAT32, T.TENSOR_FLOAT16, T.TENSOR_QUANT8_ASYMM,
                                  T.TENSOR_QUANT8_ASYMM_SIGNED])
def test_bbox_transform_matches_the_reference(code):
    rng = np.random.default_rng(int(code))
    rois, classes, batches = 7, 3, 2
    image = np.array([[48.0, 64.0], [30.0, 20.0]])
    batch = np.array([0, 1, 1, 0, 1, 0, 0], np.int32)
    boxes = _random_boxes(rng, rois, 60.0, 70.0)                       # some outside the smaller image
    deltas = rng.uniform(-1.5, 1.5, (rois, classes * 4))
    m = _Model()
    if code in (T.TENSOR_FLOAT32, T.TENSOR_FLOAT16):
        inputs = [m.tensor(code, boxes), m.tensor(code, deltas), m.tensor(T.TENSOR_INT32, batch),
                  m.tensor(code, image[:batches])]
        m.output(code, [rois, classes * 4])
    else:
        low = -128 if code == T.TENSOR_QUANT8_ASYMM_SIGNED else 0
        q_deltas = np.clip(np.round(deltas / 0.0125) + low + 128, low, low + 255)
        inputs = [m.tensor(T.TENSOR_QUANT16_ASYMM, np.round(boxes * 8), **BOX),
                  m.tensor(code, q_deltas, scale=0.0125, zero_point=low + 128),
                  m.tensor(T.TENSOR_INT32, batch), m.tensor(T.TENSOR_QUANT16_ASYMM, image * 8, **BOX)]
        m.output(T.TENSOR_QUANT16_ASYMM, [rois, classes * 4], **BOX)
    m.finish(Op.AXIS_ALIGNED_BBOX_TRANSFORM, inputs)
    expected = m.assert_as_the_reference()
    assert np.ptp(expected[0].astype(np.float64)) > 0


@pytest.mark.parametrize("batch, boxes", [([0, 2], [[1, 1, 4, 4], [2, 2, 3, 3]]),     # no image 2
                                          ([0, -1], [[1, 1, 4, 4], [2, 2, 3, 3]]),    # negative
                                          ([0, 1], [[1, 1, 4, 4], [3, 2, 2, 3]])])    # x1 > x2
def test_bbox_transform_fails_where_the_reference_does(batch, boxes):
    m = _Model()
    inputs = [m.tensor(T.TENSOR_FLOAT32, boxes), m.tensor(T.TENSOR_FLOAT32, np.zeros((2, 4))),
              m.tensor(T.TENSOR_INT32, batch), m.tensor(T.TENSOR_FLOAT32, [[10.0, 10.0], [8.0, 8.0]])]
    m.output(T.TENSOR_FLOAT32, [2, 4])
    m.finish(Op.AXIS_ALIGNED_BBOX_TRANSFORM, inputs)
    m.assert_both_fail()


# --- ROI_ALIGN / ROI_POOLING --------------------------------------------------------------
def _roi_model(operation: int, code: int, nchw: bool, *, ratios=(2, 2), strides=(2.0, 0.5), rois: int = 9,
               out: tuple[int, int] = (3, 2), seed: int = 0, boxes: np.ndarray | None = None,
               batch: list[int] | None = None, feature_shape=(3, 5, 7, 4), unknown: tuple[int, ...] = ()) -> _Model:
    """ROI_ALIGN (ratios: its sampling ratios) or ROI_POOLING over a [3, 5, 7, 4] map
    (NHWC; image 10 x 3.5 with the strides) given at run time with the regions: tiny
    ones at the far corner and every size inside."""
    rng = np.random.default_rng(seed)
    batches, height, width, depth = feature_shape
    stride_h, stride_w = strides
    if boxes is None:
        boxes = _random_boxes(rng, rois, height * stride_h, width * stride_w)
    if batch is None:
        batch = rng.integers(0, batches, len(boxes))
    real = rng.uniform(-4, 4, feature_shape)
    m = _Model()
    quantized = code in (T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT8_ASYMM_SIGNED)
    zero_point = (-3 if code == T.TENSOR_QUANT8_ASYMM_SIGNED else 125) if quantized else 0
    quant = {"scale": 0.04, "zero_point": zero_point} if quantized else {}
    stored = np.clip(np.round(real / 0.04) + zero_point, *((-128, 127) if zero_point < 0 else (0, 255))) \
        if quantized else real
    feature = m.tensor(code, stored.transpose(0, 3, 1, 2) if nchw else stored, unknown=unknown, **quant)
    scalar = T.FLOAT16 if code == T.TENSOR_FLOAT16 else T.FLOAT32
    regions = m.tensor(T.TENSOR_QUANT16_ASYMM, np.round(np.asarray(boxes) * 8), **BOX) if quantized else \
        m.tensor(code, boxes)
    inputs = [feature, regions, m.tensor(T.TENSOR_INT32, batch), m.scalar(T.INT32, out[0]),
              m.scalar(T.INT32, out[1]), m.scalar(scalar, stride_h), m.scalar(scalar, stride_w)]
    if operation == Op.ROI_ALIGN:
        inputs += [m.scalar(T.INT32, ratios[0]), m.scalar(T.INT32, ratios[1])]
    inputs.append(m.scalar(T.BOOL, nchw))
    shape = [len(boxes), depth, *out] if nchw else [len(boxes), *out, depth]
    m.output(code, shape, **quant)
    m.finish(operation, inputs)
    return m


@pytest.mark.parametrize("nchw", [False, True])
@pytest.mark.parametrize("code", [T.TENSOR_FLOAT32, T.TENSOR_FLOAT16])
@pytest.mark.parametrize("ratios", [(0, 0), (2, 2), (1, 1)])
def test_roi_align_matches_the_reference(code, nchw, ratios):
    m = _roi_model(Op.ROI_ALIGN, code, nchw, ratios=ratios, seed=sum(ratios) + nchw)
    expected = m.assert_as_the_reference()
    assert np.ptp(expected[0].astype(np.float64)) > 0


def test_roi_align_samples_past_the_far_edge_read_the_last_pixel():
    """A region narrower than a pixel at the map's far corner: its samples lie up to a
    pixel past the map, where the reference reads the last row and column (ONNX's RoiAlign
    alone would give them no weight)."""
    boxes = np.array([[3.45, 9.95, 3.5, 10.0], [3.5, 10.0, 3.5, 10.0], [0.0, 0.0, 0.0, 0.0]])
    m = _roi_model(Op.ROI_ALIGN, T.TENSOR_FLOAT32, False, ratios=(0, 0), boxes=boxes, batch=[2, 0, 1])
    expected = m.assert_as_the_reference()
    assert np.abs(expected[0]).min() > 0


@pytest.mark.parametrize("nchw", [False, True])
def test_roi_align_far_from_the_origin_samples_where_the_reference_does(nchw):
    """Regions near row 500 of a 512-row map, ten samples per bin: the sampling positions
    must round as the reference's (bin start + half a sample step + i steps). ONNX's
    RoiAlign, which places them at (i + 0.5) steps, was an ulp (3e-5) off there and its
    outputs up to 1.7e-5 off, past the CTS tolerance (``nnapi fuzz --seed 7``)."""
    boxes = np.array([[450.0, 500.0, 466.0, 508.0], [0.0, 480.0, 511.0, 511.0], [3.0, 250.0, 500.0, 509.5]])
    m = _roi_model(Op.ROI_ALIGN, T.TENSOR_FLOAT32, nchw, ratios=(10, 10), strides=(1.0, 64.0), boxes=boxes,
                   batch=[0, 0, 0], out=(128, 4), feature_shape=(1, 512, 8, 2), seed=7)
    expected = m.assert_as_the_reference()
    assert np.ptp(expected[0]) > 0


@pytest.mark.parametrize("operation", [Op.ROI_ALIGN, Op.ROI_POOLING])
@pytest.mark.parametrize("batch, boxes", [([0, 3], [[1, 1, 4, 4], [2, 2, 3, 3]]),       # batch 3 of 3
                                          ([0, -1], [[1, 1, 4, 4], [2, 2, 3, 3]]),      # negative
                                          ([0, 1], [[1, 1, 4, 4], [3, 2, 2, 3]]),       # x1 > x2
                                          ([0, 1], [[1, 1, 4, 4], [2, 2, 3, 10.5]]),    # past the map
                                          ([0, 1], [[1, 1, 4, 4], [2, -0.5, 3, 3]])])   # negative corner
def test_roi_operations_fail_where_the_reference_does(operation, batch, boxes):
    _roi_model(operation, T.TENSOR_FLOAT32, False, boxes=np.array(boxes), batch=batch).assert_both_fail()


@pytest.mark.parametrize("nchw", [False, True])
@pytest.mark.parametrize("code, ratios", [
    *[(code, ratios) for code in (T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT8_ASYMM_SIGNED)
      for ratios in ((0, 0), (2, 2), (0, 3), (3, 1))],
    (T.TENSOR_FLOAT32, (0, 3)), (T.TENSOR_FLOAT32, (3, 1)), (T.TENSOR_FLOAT16, (0, 2))])
def test_roi_align_explicit_form_matches_the_reference(code, nchw, ratios):
    """Quantized (Android's integer pipeline: equal to the reference) or with different
    height and width sampling ratios: every bilinear tap gathered, samples per bin up to
    the map's size where adaptive."""
    boxes = np.concatenate([[[3.45, 9.95, 3.5, 10.0], [0.0, 0.0, 3.5, 10.0]],
                            _random_boxes(np.random.default_rng(sum(ratios)), 7, 10.0, 3.5)])
    m = _roi_model(Op.ROI_ALIGN, code, nchw, ratios=ratios, boxes=boxes, seed=nchw)
    expected = m.assert_as_the_reference()
    assert np.ptp(expected[0].astype(np.float64)) > 0


def test_roi_align_declines_the_explicit_form_without_the_map_shape():
    m = _Model()
    feature = m.model.add_operand(OperandType(T.TENSOR_QUANT8_ASYMM, [1, 0, 4, 2], 0.1, 128))
    m.inputs.append(feature)
    inputs = [feature, m.tensor(T.TENSOR_QUANT16_ASYMM, [[0, 0, 8, 8]], **BOX), m.tensor(T.TENSOR_INT32, [0]),
              m.scalar(T.INT32, 2), m.scalar(T.INT32, 2), m.scalar(T.FLOAT32, 1.0), m.scalar(T.FLOAT32, 1.0),
              m.scalar(T.INT32, 0), m.scalar(T.INT32, 0), m.scalar(T.BOOL, False)]
    m.output(T.TENSOR_QUANT8_ASYMM, [1, 2, 2, 2], scale=0.1, zero_point=128)
    m.finish(Op.ROI_ALIGN, inputs)
    [why] = m.support()
    assert why is not None and "needs the feature map's shape" in why



@pytest.mark.parametrize("unknown", [(), (1, 2, 3)])
@pytest.mark.parametrize("nchw", [False, True])
@pytest.mark.parametrize("code", [T.TENSOR_FLOAT32, T.TENSOR_FLOAT16, T.TENSOR_QUANT8_ASYMM,
                                  T.TENSOR_QUANT8_ASYMM_SIGNED])
def test_roi_pooling_matches_the_reference(code, nchw, unknown):
    """Negative values (ONNX's MaxRoiPool starts each maximum at the smallest positive
    float), regions rounding to the map's far edge (empty bins: zero, the zero point), bins
    sharing pixels, three batches; each bin read as a window, or (the map's shape known only
    at run time) the whole map masked per bin."""
    boxes = np.concatenate([[[3.5, 10.0, 3.5, 10.0], [3.3, 9.1, 3.5, 10.0], [0.0, 0.0, 0.2, 0.1]],
                            _random_boxes(np.random.default_rng(int(code)), 8, 10.0, 3.5)])
    m = _roi_model(Op.ROI_POOLING, code, nchw, boxes=boxes, out=(3, 4), seed=nchw, unknown=unknown)
    expected = m.assert_as_the_reference()
    assert np.ptp(expected[0].astype(np.float64)) > 0
    if code == T.TENSOR_FLOAT32:
        first = expected[0][0]
        assert (first == 0).any() and (expected[0] < 0).any()


@pytest.mark.parametrize("code", [T.TENSOR_FLOAT32, T.TENSOR_QUANT8_ASYMM])
def test_roi_corners_just_below_a_half_round_as_c_rounds(code):
    """Region corners (ROI_POOLING) and bilinear weights times 255 (quantized ROI_ALIGN)
    rounded as the reference rounds, C's round exactly: a corner of 0.49999997 (the float32
    below one half, where |x| + 0.5 rounds up to 1.0 in float32) is pixel 0, not 1; every
    region's result equal to the reference's."""
    below = float(np.nextafter(np.float32(0.5), np.float32(0)))
    boxes = np.array([[below, below, 3.0, 4.0], [below, 2.0, 2.0, 9.0], [0.0, below, 1.0, 1.0]])
    m = _roi_model(Op.ROI_POOLING, code, False, boxes=boxes, out=(2, 2), strides=(1.0, 1.0), seed=3,
                   feature_shape=(1, 10, 4, 3), batch=[0, 0, 0])
    m.assert_as_the_reference()


# --- HEATMAP_MAX_KEYPOINT ----------------------------------------------------------------------
def _heatmaps(rng: np.random.Generator, boxes: int, size: int, keypoints: int) -> np.ndarray:
    """[boxes, size, size, keypoints] (NHWC): smooth bumps anywhere (corners and edges
    included: mirrored neighbourhoods), a flat map (singular: the pixel maximum), tied
    maxima (the first one counts) and noise (steps clipped at 1.5 pixels)."""
    grid = np.arange(size, dtype=np.float64)
    maps = np.empty((boxes, size, size, keypoints))
    for n in range(boxes):
        for k in range(keypoints):
            cy, cx = rng.uniform(-0.5, size - 0.5, 2)
            width = rng.uniform(0.6, 2.5)
            maps[n, :, :, k] = 3 * np.exp(-((grid[:, None] - cy) ** 2 + (grid[None, :] - cx) ** 2) / width)
    maps[0, :, :, 0] = 1.5                                      # flat
    maps[0, :, :, 1] = 0.0
    maps[0, 0, size - 1, 1] = maps[0, size - 1, 0, 1] = 2.0     # tied, at two corners
    maps[-1, :, :, -1] = rng.uniform(-1, 1, (size, size))       # noise
    return maps


@pytest.mark.parametrize("nchw", [False, True])
@pytest.mark.parametrize("code", [T.TENSOR_FLOAT32, T.TENSOR_FLOAT16, T.TENSOR_QUANT8_ASYMM,
                                  T.TENSOR_QUANT8_ASYMM_SIGNED])
@pytest.mark.parametrize("size", [2, 5])
def test_heatmap_max_keypoint_matches_the_reference(code, nchw, size):
    rng = np.random.default_rng(size * 10 + nchw)
    boxes, keypoints = 4, 3
    maps = _heatmaps(rng, boxes, size, keypoints)
    corners = _random_boxes(rng, boxes, 40.0, 30.0, tiny=1)
    m = _Model()
    if code in (T.TENSOR_FLOAT32, T.TENSOR_FLOAT16):
        heat, quant, box_code, box_quant = maps, {}, code, {}
    else:
        zero_point = -20 if code == T.TENSOR_QUANT8_ASYMM_SIGNED else 108
        limits = (-128, 127) if code == T.TENSOR_QUANT8_ASYMM_SIGNED else (0, 255)
        heat = np.clip(np.round(maps / 0.02) + zero_point, *limits)
        quant, box_code, box_quant = {"scale": 0.02, "zero_point": zero_point}, T.TENSOR_QUANT16_ASYMM, BOX
        corners = np.round(corners * 8)
    inputs = [m.tensor(code, heat.transpose(0, 3, 1, 2) if nchw else heat, **quant),
              m.tensor(box_code, corners, **box_quant), m.scalar(T.BOOL, nchw)]
    score_quant = {"scale": 0.03, "zero_point": quant["zero_point"] // 2} if quant else {}
    m.output(code, [boxes, keypoints], **score_quant)
    m.output(box_code, [boxes, keypoints, 2], **box_quant)
    m.finish(Op.HEATMAP_MAX_KEYPOINT, inputs)
    scores, points = m.assert_as_the_reference()
    assert np.ptp(scores.astype(np.float64)) > 0 and np.ptp(points.astype(np.float64)) > 0


def test_heatmap_max_keypoint_fails_where_the_reference_does():
    """A box with x1 > x2 fails the run on both devices."""
    m = _Model()
    inputs = [m.tensor(T.TENSOR_FLOAT32, np.zeros((2, 3, 3, 1))),
              m.tensor(T.TENSOR_FLOAT32, [[0, 0, 4, 4], [5, 0, 4, 4]]), m.scalar(T.BOOL, False)]
    m.output(T.TENSOR_FLOAT32, [2, 1])
    m.output(T.TENSOR_FLOAT32, [2, 1, 2])
    m.finish(Op.HEATMAP_MAX_KEYPOINT, inputs)
    m.assert_both_fail()


@pytest.mark.parametrize("operation, code, ratios", [(Op.ROI_ALIGN, T.TENSOR_FLOAT32, (2, 2)),
                                                     (Op.ROI_ALIGN, T.TENSOR_QUANT8_ASYMM, (0, 0)),
                                                     (Op.ROI_POOLING, T.TENSOR_FLOAT32, None),
                                                     (Op.ROI_POOLING, T.TENSOR_QUANT8_ASYMM_SIGNED, None)])
def test_roi_operations_take_zero_regions(operation, code, ratios):
    """No regions (as a BOX_WITH_NMS_LIMIT before may give, its output's count known only
    at run time): the lowered graph gives an empty [0, 3, 2, 4] result."""
    import onnxruntime

    from nnapi.drivers.ort.lowering import lower_model

    m = _roi_model(operation, code, False, ratios=ratios or (0, 0), boxes=np.zeros((1, 4)), batch=[0])
    hal, _ = build_hal_model(m.model)
    for index in hal.main.input_indexes[1:3]:        # the regions and batch indexes: [?, 4], [?]
        operand = hal.main.operands[index]
        operand.dimensions = [0, *operand.dimensions[1:]]
    onnx_model, inputs, _ = lower_model(hal)
    session = onnxruntime.InferenceSession(onnx_model.SerializeToString(), providers=["CPUExecutionProvider"])
    regions = np.zeros((0, 4), np.uint16 if code in (T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT8_ASYMM_SIGNED)
                       else np.float32)
    [result] = session.run(None, dict(zip(inputs, [m.values[0], regions, np.zeros(0, np.int32)], strict=True)))
    assert result.shape == (0, 3, 2, 4) and result.dtype == DTYPES[code]



@pytest.mark.parametrize("unknown", [(), (1, 2)])
def test_roi_pooling_keeps_a_negative_zero_maximum(unknown):
    """A bin whose largest value is -0 pools to -0 as on the reference (the largest of its
    values); where the map's shape is known only at run time, the mask's Where gave +0 (ORT's
    Where turns a -0 it picks from its X input into +0)."""
    feature = np.full((1, 4, 4, 2), -1.0, np.float32)
    feature[0, :2, :2, :] = -0.0
    m = _Model()
    inputs = [m.tensor(T.TENSOR_FLOAT32, feature, unknown=unknown),
              m.tensor(T.TENSOR_FLOAT32, np.array([[0.0, 0.0, 3.0, 3.0]])), m.tensor(T.TENSOR_INT32, [0]),
              m.scalar(T.INT32, 2), m.scalar(T.INT32, 2), m.scalar(T.FLOAT32, 1.0), m.scalar(T.FLOAT32, 1.0),
              m.scalar(T.BOOL, False)]
    m.output(T.TENSOR_FLOAT32, [1, 2, 2, 2])
    m.finish(Op.ROI_POOLING, inputs)
    expected = m.assert_as_the_reference()[0]
    assert np.signbit(expected[0, 0, 0]).all() and expected[0, 0, 0, 0] == 0 and (expected[0, 1, 1] == -1).all()
    got = m.run(_devices()[1])[0]
    np.testing.assert_array_equal(got.view(np.uint32), expected.view(np.uint32))


def test_heatmap_max_keypoint_keeps_a_negative_zero_score():
    """Maxima of -0 whose Taylor step gives a score of -0 (found by a search of heatmaps of
    -0 and small negatives): the reference's bits. ORT's Where gave +0 for the -0 it
    picked for the refined score and for a step d0 (whose sign reaches the score)."""
    maps = np.array([[[-0.5, -0.5, -3.0], [-0.5, -0.0, -0.5], [-3.0, -0.5, -0.0]],
                     [[-0.0, -1.0, -0.5], [-0.0, -1.0, -0.5], [-1.0, -0.0, -0.0]]], np.float32)[..., None]
    m = _Model()
    inputs = [m.tensor(T.TENSOR_FLOAT32, maps), m.tensor(T.TENSOR_FLOAT32, [[0, 0, 10, 10], [0, 0, 10, 10]]),
              m.scalar(T.BOOL, False)]
    m.output(T.TENSOR_FLOAT32, [2, 1])
    m.output(T.TENSOR_FLOAT32, [2, 1, 2])
    m.finish(Op.HEATMAP_MAX_KEYPOINT, inputs)
    scores, points = m.assert_as_the_reference()
    assert np.signbit(scores).all() and (scores == 0).all()
    got = m.run(_devices()[1])
    np.testing.assert_array_equal(got[0].view(np.uint32), scores.view(np.uint32))
    np.testing.assert_array_equal(got[1].view(np.uint32), points.view(np.uint32))
