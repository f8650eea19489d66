"""PAD, PAD_V2, MIRROR_PAD: grow a tensor by paddings[i] = (before, after) per dimension.

PAD fills with zero (the zero point for quantized tensors, i.e. a real 0); PAD_V2 fills
with its scalar input 2 (FLOAT32 / FLOAT16 for float tensors, an INT32 quantized value
for quant8 tensors). MIRROR_PAD (feature level 7) mirrors the border: mode 0 REFLECT
excludes the edge element (each padding < the dimension), mode 1 SYMMETRIC repeats it
(each padding <= the dimension).
"""

from __future__ import annotations

import numpy as np

from nnapi.codes import OperandCode, OperationCode
from nnapi.operations._shape_common import (
    DATA_TYPES,
    DATA_TYPES_INT,
    check_known_rank_at_least,
    check_output_like_input,
    check_paddings_input,
    paddings_values,
)
from nnapi.operations.base import ExecutionContext, Operation, Shape, ValidationContext, register
from nnapi.operations.common import QUANT8_TENSORS, integer_range

T = OperandCode

# Named input positions (Android's pad.cpp / mirror_pad.cpp kInputTensor, kPaddingsTensor, ...).
INPUT = 0
PADDINGS = 1
PAD_V2_VALUE = 2
MIRROR_PAD_MODE = 2

_MAX_RANK = 4
_PAD_VALUE_TYPES = {
    T.TENSOR_FLOAT32: T.FLOAT32,
    T.TENSOR_FLOAT16: T.FLOAT16,
    T.TENSOR_QUANT8_ASYMM: T.INT32,
    T.TENSOR_QUANT8_ASYMM_SIGNED: T.INT32,
}
_REFLECT, _SYMMETRIC = 0, 1


def _padded_shape(ctx: ExecutionContext) -> tuple[np.ndarray, tuple[int, ...]]:
    shape = ctx.input(INPUT).shape
    paddings = paddings_values(ctx, PADDINGS, len(shape))
    return paddings, tuple(int(d) for d in paddings[:, 0] + np.asarray(shape, dtype=np.int64) + paddings[:, 1])


def _pad_constant(value: np.ndarray, paddings: np.ndarray, fill, dtype: np.dtype) -> np.ndarray:
    """Allocate the padded output filled with ``fill`` and copy the input into its middle
    (faster than np.pad for the constant case)."""
    return _constant_padder(value.shape, paddings, fill, dtype)(value)


def _constant_padder(shape: Shape, paddings: np.ndarray, fill, dtype: np.dtype):
    """The constant pad of inputs of ``shape``, its output shape and window found once."""
    out_shape = tuple(int(d) for d in paddings[:, 0] + np.asarray(shape, dtype=np.int64) + paddings[:, 1])
    window = tuple(slice(int(b), int(b) + size) for b, size in zip(paddings[:, 0], shape, strict=True))
    dtype = np.dtype(dtype)
    zero = dtype.type(fill) == 0 and not np.signbit(dtype.type(fill))  # np.zeros: pages come zeroed

    def pad(value: np.ndarray) -> np.ndarray:
        output = np.zeros(out_shape, dtype=dtype) if zero else np.full(out_shape, fill, dtype=dtype)
        output[window] = value
        return output

    return pad


# Beyond Android's CPU kernels, which refuse a zero-sized input here: the result is well defined
# and tests/test_ops_shape.py::TestZeroSized relies on it.
@register(OperationCode.PAD, OperationCode.PAD_V2, zero_sized_inputs=True)
class Pad(Operation):
    def validate(self, ctx: ValidationContext) -> None:
        is_v2 = self.code == OperationCode.PAD_V2
        ctx.check_counts(inputs=3 if is_v2 else 2, outputs=1)
        ctx.check_input_type(INPUT, DATA_TYPES)
        ctx.check_input_max_rank(INPUT, _MAX_RANK)
        check_paddings_input(ctx, PADDINGS)
        if is_v2:
            ctx.check_input_type(PAD_V2_VALUE, _PAD_VALUE_TYPES[ctx.input_type(INPUT)])
        check_output_like_input(ctx)

    def prepare(self, ctx: ExecutionContext) -> list[Shape]:
        if self.code == OperationCode.PAD_V2 and ctx.input(INPUT).type in QUANT8_TENSORS:
            low, high = integer_range(ctx.input(INPUT).type)
            value = int(ctx.scalar(PAD_V2_VALUE))
            ctx.require(low <= value <= high, f"pad value {value} is out of range [{low}, {high}]")
        return [_padded_shape(ctx)[1]]

    def execute(self, ctx: ExecutionContext) -> list[np.ndarray]:
        paddings, _ = _padded_shape(ctx)
        return [_pad_constant(ctx.value(INPUT), paddings, self._fill(ctx), ctx.output_dtype(0))]

    def _fill(self, ctx: ExecutionContext):
        source = ctx.input(INPUT)
        if self.code == OperationCode.PAD_V2:
            return ctx.scalar(PAD_V2_VALUE)
        return source.zero_point if source.type in QUANT8_TENSORS else 0

    def plan(self, ctx: ExecutionContext):
        """Static shape and constant paddings (and value): the output shape and the window
        of the input found once."""
        paddings, _ = _padded_shape(ctx)
        pad = _constant_padder(ctx.input(INPUT).shape, paddings, self._fill(ctx), ctx.output_dtype(0))
        return lambda values: [pad(values[INPUT])]


@register(OperationCode.MIRROR_PAD)
class MirrorPad(Operation):
    def validate(self, ctx: ValidationContext) -> None:
        ctx.check_counts(inputs=3, outputs=1)
        ctx.check_input_type(INPUT, DATA_TYPES_INT)
        check_known_rank_at_least(ctx, INPUT, 1)
        check_paddings_input(ctx, PADDINGS)
        ctx.check_input_type(MIRROR_PAD_MODE, T.INT32)
        check_output_like_input(ctx)

    def prepare(self, ctx: ExecutionContext) -> list[Shape]:
        shape = np.asarray(ctx.input(INPUT).shape, dtype=np.int64)
        ctx.require(len(shape) >= 1, "input 0 must have rank at least 1")
        mode = int(ctx.scalar(MIRROR_PAD_MODE))
        ctx.require(mode in (_REFLECT, _SYMMETRIC), f"mode must be 0 (REFLECT) or 1 (SYMMETRIC), got {mode}")
        paddings, out_shape = _padded_shape(ctx)
        limit = shape[:, None] - (1 if mode == _REFLECT else 0)
        ctx.require(bool(np.all(paddings <= limit)),
                    f"paddings {paddings.tolist()} are too large for shape {shape.tolist()} in "
                    f"{'REFLECT' if mode == _REFLECT else 'SYMMETRIC'} mode")
        return [out_shape]

    def execute(self, ctx: ExecutionContext) -> list[np.ndarray]:
        paddings, _ = _padded_shape(ctx)
        mode = "reflect" if int(ctx.scalar(MIRROR_PAD_MODE)) == _REFLECT else "symmetric"
        return [np.pad(ctx.value(INPUT), [(int(b), int(a)) for b, a in paddings], mode=mode)]

    def plan(self, ctx: ExecutionContext):
        """The paddings and mode resolved once."""
        paddings, _ = _padded_shape(ctx)
        widths = [(int(b), int(a)) for b, a in paddings]
        mode = "reflect" if int(ctx.scalar(MIRROR_PAD_MODE)) == _REFLECT else "symmetric"
        return lambda values: [np.pad(values[INPUT], widths, mode=mode)]
