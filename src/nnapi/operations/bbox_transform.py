"""AXIS_ALIGNED_BBOX_TRANSFORM: refine box proposals with per-class deltas, clipped to the image.

Inputs: 0 boxes [num_rois, 4] ([x1, y1, x2, y2]), 1 deltas [num_rois, num_classes * 4]
([dx, dy, dw, dh]), 2 batch index of each box [num_rois] (TENSOR_INT32), 3 image sizes
[batches, 2] ([height, width]). Output: [num_rois, num_classes * 4] boxes of input 0's
type. Float types, or TENSOR_QUANT16_ASYMM boxes / image sizes (scale 0.125, zero point 0)
with TENSOR_QUANT8_ASYMM(_SIGNED) deltas. num_rois may be 0.
"""

from __future__ import annotations

import numpy as np

from nnapi.codes import OperandCode, OperationCode
from nnapi.operations.base import ExecutionContext, Operation, Shape, ValidationContext, register
from nnapi.operations.detection_common import (
    FLOAT_TENSORS,
    QUANT8_TENSORS,
    check_box_quantization,
    check_signature,
    from_float32,
    to_float32,
    transform_boxes,
)

# Input and output positions, as Android names them (kInputTensor, ...).
ROI_TENSOR = 0
DELTA_TENSOR = 1
BATCHES_TENSOR = 2
IMAGE_INFO_TENSOR = 3
OUTPUT_TENSOR = 0

T = OperandCode


@register(OperationCode.AXIS_ALIGNED_BBOX_TRANSFORM, zero_sized_inputs=True)
class AxisAlignedBboxTransform(Operation):
    def validate(self, ctx: ValidationContext) -> None:
        ctx.check_counts(inputs=4, outputs=1)
        box_type = ctx.input_type(ROI_TENSOR)
        if box_type in FLOAT_TENSORS:
            inputs = [box_type, box_type, T.TENSOR_INT32, box_type]
        elif box_type == T.TENSOR_QUANT16_ASYMM:
            ctx.check_input_type(DELTA_TENSOR, QUANT8_TENSORS)
            inputs = [box_type, ctx.input_type(DELTA_TENSOR), T.TENSOR_INT32, T.TENSOR_QUANT16_ASYMM]
        else:
            ctx.fail(f"input 0 must be TENSOR_FLOAT32, TENSOR_FLOAT16 or TENSOR_QUANT16_ASYMM, got {box_type.name}")
        check_signature(ctx, inputs, [box_type], input_ranks={0: 2, 1: 2, 2: 1, 3: 2}, output_ranks={0: 2})
        for kind, index in (("input", 0), ("input", 3), ("output", 0)):
            check_box_quantization(ctx, kind, index)

    def prepare(self, ctx: ExecutionContext) -> list[Shape]:
        boxes, deltas, batches, image = (ctx.input(i) for i in range(4))
        ctx.require(boxes.rank == 2 and deltas.rank == 2 and batches.rank == 1 and image.rank == 2,
                    "inputs must have ranks 2, 2, 1, 2")
        num_rois = boxes.shape[0]
        ctx.require(boxes.shape[1] == 4, f"boxes must be [num_rois, 4], got {list(boxes.shape)}")
        ctx.require(deltas.shape[0] == num_rois and deltas.shape[1] % 4 == 0 and deltas.shape[1] > 0,
                    f"deltas must be [{num_rois}, num_classes * 4], got {list(deltas.shape)}")
        ctx.require(batches.shape[0] == num_rois, f"batch indexes must be [{num_rois}], got {list(batches.shape)}")
        ctx.require(image.shape[0] > 0 and image.shape[1] == 2, f"image info must be [batches, 2], got "
                    f"{list(image.shape)}")
        return [(num_rois, deltas.shape[1])]

    def execute(self, ctx: ExecutionContext) -> list[np.ndarray]:
        boxes = to_float32(ctx.input(ROI_TENSOR))
        num_rois, columns = ctx.input(DELTA_TENSOR).shape
        deltas = to_float32(ctx.input(DELTA_TENSOR)).reshape(num_rois, columns // 4, 4)
        batch_ids = np.asarray(ctx.value(BATCHES_TENSOR)).astype(np.int64)
        image = to_float32(ctx.input(IMAGE_INFO_TENSOR))
        if num_rois == 0:
            return [np.zeros((0, columns), dtype=ctx.output_dtype(OUTPUT_TENSOR))]
        ctx.require(bool(np.all((batch_ids >= 0) & (batch_ids < image.shape[0]))), "batch index out of range")
        ctx.require(bool(np.all((boxes[:, 0] <= boxes[:, 2]) & (boxes[:, 1] <= boxes[:, 3]))),
                    "every box needs x1 <= x2 and y1 <= y2")
        sizes = image[batch_ids]
        out = transform_boxes(boxes, deltas, sizes[:, 0:1], sizes[:, 1:2])
        return [from_float32(out.reshape(num_rois, columns), ctx.output(OUTPUT_TENSOR))]
