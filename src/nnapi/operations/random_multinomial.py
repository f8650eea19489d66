"""RANDOM_MULTINOMIAL: draw class indexes from softmax(logits) per batch row.

Inputs: logits [batches, classes] (float32 / float16), the sample count (INT32) and two
int32 seeds (both 0: seeded from the operating system). Output: int32 [batches, samples].

Like Android's kernel, non-finite logits get no probability mass, and a sample is the
first class whose cumulative mass exceeds uniform * total (upper bound on the CDF). The
generator is numpy's PCG64 seeded with the two seeds, so equal seeds give equal samples.
"""

from __future__ import annotations

import numpy as np

from nnapi.codes import OperandCode, OperationCode
from nnapi.operations.base import ExecutionContext, Operation, Shape, ValidationContext, register
from nnapi.operations.common import FLOAT_TENSORS

T = OperandCode

# Named input positions (Android's multinomial.cpp kInputTensor, kSampleCountParam, kRandomSeedsTensor).
LOGITS = 0
SAMPLE_COUNT = 1
SEEDS = 2



@register(OperationCode.RANDOM_MULTINOMIAL)
class RandomMultinomial(Operation):
    def validate(self, ctx: ValidationContext) -> None:
        ctx.check_counts(inputs=3, outputs=1)
        ctx.check_input_types([FLOAT_TENSORS, T.INT32, T.TENSOR_INT32])
        ctx.check_output_type(0, T.TENSOR_INT32)
        ctx.check_input_rank(LOGITS, 2)
        ctx.check_input_rank(SEEDS, 1)

    def _setup(self, ctx: ExecutionContext):
        ctx.require(not ctx.is_omitted(LOGITS) and not ctx.is_omitted(SEEDS), "logits and seeds must be present")
        logits = ctx.input(LOGITS)
        ctx.require(logits.rank == 2, f"logits must be 2-D, got rank {logits.rank}")
        samples = int(ctx.scalar(SAMPLE_COUNT))
        ctx.require(samples >= 0, f"sample count must not be negative, got {samples}")
        seeds = np.asarray(ctx.value(SEEDS)).reshape(-1)
        ctx.require(seeds.size == 2, f"seeds must have 2 values, got {seeds.size}")
        return logits, samples, seeds

    def prepare(self, ctx: ExecutionContext) -> list[Shape]:
        logits, samples, _ = self._setup(ctx)
        return [(logits.shape[0], samples)]

    def execute(self, ctx: ExecutionContext) -> list[np.ndarray]:
        logits, samples, seeds = self._setup(ctx)
        values = np.asarray(logits.value, dtype=np.float64)
        batches, classes = values.shape
        if batches == 0 or samples == 0:
            return [np.zeros((batches, samples), dtype=np.int32)]
        ctx.require(classes > 0, "logits need at least one class")
        finite = np.isfinite(values)
        # Subtract each row's finite maximum before exponentiating, for range.
        row_max = np.max(np.where(finite, values, -np.inf), axis=1, keepdims=True)
        row_max = np.where(np.isfinite(row_max), row_max, 0.0)
        mass = np.where(finite, np.exp(np.where(finite, values, 0.0) - row_max), 0.0)
        cdf = np.cumsum(mass, axis=1)
        entropy = None if (seeds == 0).all() else [int(s) & 0xFFFFFFFF for s in seeds]
        generator = np.random.default_rng(entropy)
        total = cdf[:, -1:]
        total = np.where(total > 0, total, 1.0)
        # One searchsorted for all rows: row r's normalized CDF lives in [r, r + 1].
        offsets = np.arange(batches, dtype=np.float64)[:, np.newaxis]
        flat_cdf = (cdf / total + offsets).reshape(-1)
        targets = generator.random((batches, samples)) + offsets
        # side="right" is C++'s upper_bound: the first class whose CDF exceeds the target.
        found = np.searchsorted(flat_cdf, targets.reshape(-1), side="right").reshape(batches, samples)
        indexes = found - offsets.astype(np.int64) * classes
        return [np.clip(indexes, 0, classes - 1).astype(np.int32)]
