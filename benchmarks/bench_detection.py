"""Benchmark the detection operations at realistic sizes, end to end through the public API
(big tensors are model inputs, parameters constants, one Execution.compute per run):

- ROI_ALIGN / ROI_POOLING: a 1x50x50x256 feature map, 300 regions, 7x7 bins (Faster
  R-CNN's box head), float32 and quant8, fixed and adaptive sampling;
- BOX_WITH_NMS_LIMIT: 1000 regions x 21 classes (Pascal VOC), hard and gaussian kernels;
- GENERATE_PROPOSALS: 38x50 positions x 9 anchors, 6000 before / 300 after NMS;
- DETECTION_POSTPROCESSING: 1917 anchors x 91 classes (SSD MobileNet), regular and fast NMS;
- HEATMAP_MAX_KEYPOINT: 100 boxes x 17 keypoints on 56x56 heatmaps.

Run:  .venv/bin/python benchmarks/bench_detection.py [--repeat 5]
Prints one row per case: median and best milliseconds of Execution.compute.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import numpy as np

import nnapi
from nnapi import OperandCode as T
from nnapi import OperandType
from nnapi import OperationCode as Op

FLOAT, INT, BOOL = OperandType(T.FLOAT32), OperandType(T.INT32), OperandType(T.BOOL)
RNG = np.random.default_rng(0)


def _rois(count: int, image: float, min_size: float = 8.0) -> np.ndarray:
    """Random valid [x1, y1, x2, y2] boxes inside an image of side ``image``."""
    corner = RNG.uniform(0, image - min_size, (count, 2))
    size = RNG.uniform(min_size, image / 2, (count, 2))
    far = np.minimum(corner + size, image)
    return np.concatenate([corner, far], axis=1).astype(np.float32)


def _model(code: Op, inputs: list[tuple[OperandType, Any, bool]], outputs: list[OperandType]):
    """A compiled one-operation model; inputs are (type, value, value_is_a_model_input)."""
    model = nnapi.Model()
    keep, feeds, model_inputs, indexes = [], [], [], []
    for op_type, value, is_input in inputs:
        index = model.add_operand(op_type)
        indexes.append(index)
        array = np.asarray(value, dtype=op_type.dtype)
        if is_input:
            model_inputs.append(index)
            feeds.append(array)
        else:
            keep.append(array)
            model.set_operand_value(index, array)
    out_indexes = [model.add_operand(t) for t in outputs]
    model.add_operation(code, indexes, out_indexes)
    model.identify_inputs_and_outputs(model_inputs, out_indexes)
    model.finish()
    compilation = nnapi.Compilation(model, [nnapi.get_devices()[0]])  # nnapi-reference: its kernels
    compilation.finish()
    return compilation, feeds, keep


def _needed_dimensions(execution: nnapi.Execution, index: int) -> list[int]:
    # an output whose buffer was too small reports the shape it needs through the error
    try:
        return execution.get_output_operand_dimensions(index)
    except nnapi.OutputInsufficientSizeError as error:
        return list(error.dimensions)


def _time(compilation, feeds, outputs: list[OperandType], repeat: int) -> list[float]:
    # Size the outputs with one run, then time the following ones.
    buffers = [np.zeros(t.dimensions if t.is_fully_specified else (0,), dtype=t.dtype) for t in outputs]
    times = []
    for attempt in range(repeat + 1):
        execution = nnapi.Execution(compilation)
        for position, feed in enumerate(feeds):
            execution.set_input(position, feed)
        for position, buffer in enumerate(buffers):
            execution.set_output(position, buffer)
        start = time.perf_counter()
        try:
            execution.compute()
        except nnapi.OutputInsufficientSizeError:
            buffers = [np.zeros(_needed_dimensions(execution, i), dtype=t.dtype)
                       for i, t in enumerate(outputs)]
            continue
        if attempt:
            times.append((time.perf_counter() - start) * 1e3)
    return times


def cases():
    feature = RNG.standard_normal((1, 50, 50, 256)).astype(np.float32)
    rois = _rois(300, 800.0)
    batch = np.zeros(300, np.int32)
    q_feature = np.clip(np.round(feature / 0.05) + 128, 0, 255).astype(np.uint8)
    q_rois = np.round(rois / 0.125).astype(np.uint16)
    boxes16 = OperandType(T.TENSOR_QUANT16_ASYMM, (300, 4), 0.125, 0)
    for sampling in (2, 0):
        yield (f"ROI_ALIGN f32 300x7x7x256 s={sampling}", Op.ROI_ALIGN, [
            (OperandType(T.TENSOR_FLOAT32, feature.shape), feature, True),
            (OperandType(T.TENSOR_FLOAT32, (300, 4)), rois, True), (OperandType(T.TENSOR_INT32, (300,)), batch, False),
            (INT, 7, False), (INT, 7, False), (FLOAT, 16.0, False), (FLOAT, 16.0, False), (INT, sampling, False),
            (INT, sampling, False), (BOOL, False, False)], [OperandType(T.TENSOR_FLOAT32, (300, 7, 7, 256))])
    yield ("ROI_ALIGN q8 300x7x7x256 s=2", Op.ROI_ALIGN, [
        (OperandType(T.TENSOR_QUANT8_ASYMM, feature.shape, 0.05, 128), q_feature, True), (boxes16, q_rois, True),
        (OperandType(T.TENSOR_INT32, (300,)), batch, False), (INT, 7, False), (INT, 7, False), (FLOAT, 16.0, False),
        (FLOAT, 16.0, False), (INT, 2, False), (INT, 2, False), (BOOL, False, False)],
        [OperandType(T.TENSOR_QUANT8_ASYMM, (300, 7, 7, 256), 0.05, 128)])
    yield ("ROI_POOLING f32 300x7x7x256", Op.ROI_POOLING, [
        (OperandType(T.TENSOR_FLOAT32, feature.shape), feature, True),
        (OperandType(T.TENSOR_FLOAT32, (300, 4)), rois, True), (OperandType(T.TENSOR_INT32, (300,)), batch, False),
        (INT, 7, False), (INT, 7, False), (FLOAT, 16.0, False), (FLOAT, 16.0, False), (BOOL, False, False)],
        [OperandType(T.TENSOR_FLOAT32, (300, 7, 7, 256))])

    num_rois, classes = 1000, 21
    scores = RNG.uniform(0, 1, (num_rois, classes)).astype(np.float32)
    base = _rois(num_rois, 600.0)
    jitter = RNG.normal(0, 4, (num_rois, classes, 4)).astype(np.float32)
    jittered = base[:, None, :] + jitter                     # [rois, classes, 4]
    low = np.minimum(jittered[..., :2], jittered[..., 2:])
    high = np.maximum(jittered[..., :2], jittered[..., 2:])
    boxes = np.concatenate([low, high], axis=-1).reshape(num_rois, classes * 4)
    for kernel, name in ((0, "hard"), (2, "gaussian")):
        yield (f"BOX_WITH_NMS_LIMIT 1000x21 {name}", Op.BOX_WITH_NMS_LIMIT, [
            (OperandType(T.TENSOR_FLOAT32, scores.shape), scores, True),
            (OperandType(T.TENSOR_FLOAT32, boxes.shape), boxes, True),
            (OperandType(T.TENSOR_INT32, (num_rois,)), np.zeros(num_rois), False), (FLOAT, 0.05, False),
            (INT, 100, False), (INT, kernel, False), (FLOAT, 0.5, False), (FLOAT, 0.5, False), (FLOAT, 0.001, False)],
            [OperandType(T.TENSOR_FLOAT32, (0,)), OperandType(T.TENSOR_FLOAT32, (0, 4)),
             OperandType(T.TENSOR_INT32, (0,)), OperandType(T.TENSOR_INT32, (0,))])

    height, width, anchors = 38, 50, 9
    sizes = np.array([32, 64, 128], np.float32)
    ratios = np.array([0.5, 1, 2], np.float32)
    half_w = (sizes[None, :] * np.sqrt(ratios[:, None])).reshape(-1) / 2
    half_h = (sizes[None, :] / np.sqrt(ratios[:, None])).reshape(-1) / 2
    anchor_boxes = np.stack([8 - half_w, 8 - half_h, 8 + half_w, 8 + half_h], axis=1).astype(np.float32)
    yield ("GENERATE_PROPOSALS 38x50x9 6000/300", Op.GENERATE_PROPOSALS, [
        (OperandType(T.TENSOR_FLOAT32, (1, height, width, anchors)),
         RNG.uniform(0, 1, (1, height, width, anchors)), True),
        (OperandType(T.TENSOR_FLOAT32, (1, height, width, anchors * 4)),
         RNG.normal(0, 0.1, (1, height, width, anchors * 4)), True),
        (OperandType(T.TENSOR_FLOAT32, (anchors, 4)), anchor_boxes, False),
        (OperandType(T.TENSOR_FLOAT32, (1, 2)), [[600, 800]], False), (FLOAT, 16.0, False), (FLOAT, 16.0, False),
        (INT, 6000, False), (INT, 300, False), (FLOAT, 0.7, False), (FLOAT, 16.0, False), (BOOL, False, False)],
        [OperandType(T.TENSOR_FLOAT32, (0,)), OperandType(T.TENSOR_FLOAT32, (0, 4)),
         OperandType(T.TENSOR_INT32, (0,))])

    num_anchors, ssd_classes = 1917, 91
    ssd_scores = (RNG.uniform(0, 1, (1, num_anchors, ssd_classes)) ** 8).astype(np.float32)
    ssd_anchors = np.concatenate([RNG.uniform(0, 1, (num_anchors, 2)), RNG.uniform(0.05, 0.5, (num_anchors, 2))],
                                 axis=1).astype(np.float32)
    for regular in (True, False):
        yield (f"DETECTION_POSTPROCESSING 1917x91 {'regular' if regular else 'fast'}", Op.DETECTION_POSTPROCESSING, [
            (OperandType(T.TENSOR_FLOAT32, ssd_scores.shape), ssd_scores, True),
            (OperandType(T.TENSOR_FLOAT32, (1, num_anchors, 4)), RNG.normal(0, 0.5, (1, num_anchors, 4)), True),
            (OperandType(T.TENSOR_FLOAT32, (num_anchors, 4)), ssd_anchors, False),
            (FLOAT, 10.0, False), (FLOAT, 10.0, False), (FLOAT, 5.0, False), (FLOAT, 5.0, False),
            (BOOL, regular, False), (INT, 100, False), (INT, 1, False), (INT, 100, False), (FLOAT, 0.3, False),
            (FLOAT, 0.6, False), (BOOL, False, False)],
            [OperandType(T.TENSOR_FLOAT32, (1, 100)), OperandType(T.TENSOR_FLOAT32, (1, 100, 4)),
             OperandType(T.TENSOR_INT32, (1, 100)), OperandType(T.TENSOR_INT32, (1,))])

    yield ("HEATMAP_MAX_KEYPOINT 100x56x56x17", Op.HEATMAP_MAX_KEYPOINT, [
        (OperandType(T.TENSOR_FLOAT32, (100, 56, 56, 17)), RNG.standard_normal((100, 56, 56, 17)), True),
        (OperandType(T.TENSOR_FLOAT32, (100, 4)), _rois(100, 800.0), True), (BOOL, False, False)],
        [OperandType(T.TENSOR_FLOAT32, (100, 17)), OperandType(T.TENSOR_FLOAT32, (100, 17, 2))])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print(f"{'case':42} {'median ms':>10} {'best ms':>10}")
    for name, code, inputs, outputs in cases():
        compilation, feeds, _keep = _model(code, inputs, outputs)
        times = _time(compilation, feeds, outputs, args.repeat)
        print(f"{name:42} {statistics.median(times):10.2f} {min(times):10.2f}")


if __name__ == "__main__":
    main()
