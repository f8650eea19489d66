"""DEPTH_TO_SPACE, SPACE_TO_DEPTH, BATCH_TO_SPACE_ND, SPACE_TO_BATCH_ND: move blocks of
4-D tensors between the spatial, depth and batch dimensions.

Each takes an optional trailing BOOL (NCHW layout when true); the kernels work in NHWC
and convert around it. DEPTH_TO_SPACE / SPACE_TO_DEPTH take an INT32 block size;
BATCH_TO_SPACE_ND takes a [2] TENSOR_INT32 of block sizes; SPACE_TO_BATCH_ND adds a
[2, 2] TENSOR_INT32 of spatial paddings, filled with zero (the zero point for quantized
tensors). All are pure rearrangements: reshape, transpose, reshape.
"""

from __future__ import annotations

import numpy as np

from nnapi.codes import FeatureLevelCode, OperandCode, OperationCode
from nnapi.operations._shape_common import (
    DATA_TYPES,
    check_output_like_input,
    check_paddings_input,
    check_vector_input,
    int_values,
    paddings_values,
)
from nnapi.operations.base import ExecutionContext, Operation, Shape, ValidationContext, register
from nnapi.operations.common import QUANT8_TENSORS, from_nhwc, layout_shape, nhwc_shape, to_nhwc

T = OperandCode

# Named input positions (Android's depth_to_space.cpp / space_to_batch.cpp kInputTensor,
# kBlockSizeScalar / kBlockSizeTensor, kPaddingsTensor); the layout flag follows (_PARAMETERS).
INPUT = 0
BLOCK_SIZE = 1  # INT32 for DEPTH_TO_SPACE / SPACE_TO_DEPTH, [2] TENSOR_INT32 for the _ND ones
SPACE_TO_BATCH_PADDINGS = 2

_CODE = OperationCode
#: inputs before the optional layout flag
_PARAMETERS = {
    _CODE.DEPTH_TO_SPACE: 2,
    _CODE.SPACE_TO_DEPTH: 2,
    _CODE.BATCH_TO_SPACE_ND: 2,
    _CODE.SPACE_TO_BATCH_ND: 3,
}


def _block_sizes(ctx: ExecutionContext, code: OperationCode) -> tuple[int, int]:
    if code in (_CODE.DEPTH_TO_SPACE, _CODE.SPACE_TO_DEPTH):
        size = int(ctx.scalar(BLOCK_SIZE))
        blocks = (size, size)
    else:
        blocks = tuple(int(b) for b in int_values(ctx, BLOCK_SIZE, "block sizes", length=2))  # type: ignore[assignment]
    ctx.require(min(blocks) >= 1, f"block sizes must be at least 1, got {list(blocks)}")
    return blocks


def _nhwc_output_shape(ctx: ExecutionContext, code: OperationCode, shape: Shape) -> Shape:
    """The NHWC output shape for NHWC input ``shape``, after checking divisibility."""
    batches, height, width, depth = shape
    bh, bw = _block_sizes(ctx, code)
    if code == _CODE.DEPTH_TO_SPACE:
        ctx.require(depth % (bh * bw) == 0, f"depth {depth} is not divisible by block_size^2 {bh * bw}")
        return batches, height * bh, width * bw, depth // (bh * bw)
    if code == _CODE.SPACE_TO_DEPTH:
        ctx.require(height % bh == 0 and width % bw == 0,
                    f"height {height} and width {width} must be divisible by block size {bh}")
        return batches, height // bh, width // bw, depth * bh * bw
    if code == _CODE.BATCH_TO_SPACE_ND:
        ctx.require(batches % (bh * bw) == 0, f"batch {batches} is not divisible by {bh} * {bw}")
        return batches // (bh * bw), height * bh, width * bw, depth
    paddings = paddings_values(ctx, SPACE_TO_BATCH_PADDINGS, 2)
    padded_h = height + int(paddings[0].sum())
    padded_w = width + int(paddings[1].sum())
    ctx.require(padded_h % bh == 0 and padded_w % bw == 0,
                f"padded size {padded_h}x{padded_w} is not divisible by blocks {bh}x{bw}")
    return batches * bh * bw, padded_h // bh, padded_w // bw, depth


@register(_CODE.DEPTH_TO_SPACE, _CODE.SPACE_TO_DEPTH, _CODE.BATCH_TO_SPACE_ND, _CODE.SPACE_TO_BATCH_ND,
          omitted_operands=True)
class SpaceDepthBatch(Operation):
    def validate(self, ctx: ValidationContext) -> None:
        parameters = _PARAMETERS[self.code]
        ctx.check_counts(inputs=(parameters, parameters + 1), outputs=1)
        ctx.check_input_type(INPUT, DATA_TYPES)
        ctx.check_input_rank(INPUT, 4)
        if self.code in (_CODE.DEPTH_TO_SPACE, _CODE.SPACE_TO_DEPTH):
            ctx.check_input_type(BLOCK_SIZE, T.INT32)
        else:
            check_vector_input(ctx, BLOCK_SIZE, "block sizes")
            dims = ctx.inputs[BLOCK_SIZE].dimensions
            if len(dims) == 1 and dims[0] and dims[0] != 2:
                ctx.fail(f"input 1 (block sizes) must have 2 elements, got {dims[0]}")
        if self.code == _CODE.SPACE_TO_BATCH_ND:
            check_paddings_input(ctx, SPACE_TO_BATCH_PADDINGS, rows=2)
        if len(ctx.inputs) > parameters:
            ctx.at_least(FeatureLevelCode.FEATURE_LEVEL_3)  # the layout flag
            ctx.check_input_type(parameters, T.BOOL)
        check_output_like_input(ctx)

    def _nchw(self, ctx: ExecutionContext) -> bool:
        parameters = _PARAMETERS[self.code]
        return len(ctx.inputs) > parameters and not ctx.is_omitted(parameters) and bool(ctx.scalar(parameters))

    def prepare(self, ctx: ExecutionContext) -> list[Shape]:
        shape = ctx.input(INPUT).shape
        ctx.require(len(shape) == 4, f"input 0 must have rank 4, got shape {list(shape)}")
        nchw = self._nchw(ctx)
        return [layout_shape(_nhwc_output_shape(ctx, self.code, nhwc_shape(shape, nchw)), nchw)]

    def _parameters(self, ctx: ExecutionContext) -> tuple:
        """(NCHW, block sizes, NHWC output shape, paddings, fill) of ``_rearrange``."""
        nchw = self._nchw(ctx)
        source = ctx.input(INPUT)
        out_shape = _nhwc_output_shape(ctx, self.code, nhwc_shape(source.shape, nchw))
        paddings = fill = None
        if self.code == _CODE.SPACE_TO_BATCH_ND:
            paddings = paddings_values(ctx, SPACE_TO_BATCH_PADDINGS, 2)
            fill = source.zero_point if source.type in QUANT8_TENSORS else 0
        return nchw, _block_sizes(ctx, self.code), out_shape, paddings, fill

    def execute(self, ctx: ExecutionContext) -> list[np.ndarray]:
        return [_rearrange(self.code, ctx.value(INPUT), *self._parameters(ctx))]

    def plan(self, ctx: ExecutionContext):
        """The block sizes, paddings and shapes resolved once."""
        code, parameters = self.code, self._parameters(ctx)
        return lambda values: [_rearrange(code, values[INPUT], *parameters)]


def _rearrange(code: OperationCode, value: np.ndarray, nchw: bool, blocks: tuple[int, int], out_shape: Shape,
               paddings: np.ndarray | None, fill: int | None) -> np.ndarray:
    """``code``'s rearrangement of ``value`` into the NHWC ``out_shape`` (in the layout)."""
    x = to_nhwc(value, nchw)
    batches, height, width, depth = x.shape
    bh, bw = blocks
    if code == _CODE.DEPTH_TO_SPACE:
        # depth index (i * bw + j) * out_depth + k goes to spatial offset (i, j)
        blocks_view = x.reshape(batches, height, width, bh, bw, depth // (bh * bw))
        y = blocks_view.transpose(0, 1, 3, 2, 4, 5)
    elif code == _CODE.SPACE_TO_DEPTH:
        blocks_view = x.reshape(batches, height // bh, bh, width // bw, bw, depth)
        y = blocks_view.transpose(0, 1, 3, 2, 4, 5)
    elif code == _CODE.BATCH_TO_SPACE_ND:
        # input batch (i * bw + j) * out_batches + b holds block offset (i, j) of image b
        blocks_view = x.reshape(bh, bw, batches // (bh * bw), height, width, depth)
        y = blocks_view.transpose(2, 3, 0, 4, 1, 5)
    else:
        assert paddings is not None
        padded = np.full((batches, height + int(paddings[0].sum()), width + int(paddings[1].sum()), depth),
                         fill, dtype=x.dtype)
        padded[:, paddings[0, 0]:paddings[0, 0] + height, paddings[1, 0]:paddings[1, 0] + width] = x
        blocks_view = padded.reshape(batches, out_shape[1], bh, out_shape[2], bw, depth)
        y = blocks_view.transpose(2, 4, 0, 1, 3, 5)
    return np.ascontiguousarray(from_nhwc(y.reshape(out_shape), nchw))
