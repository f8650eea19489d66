"""EMBEDDING_LOOKUP and HASHTABLE_LOOKUP: select rows of a values tensor.

EMBEDDING_LOOKUP: input 0 a 1-D TENSOR_INT32 of row indices (each in range, or the
execution fails), input 1 the values (rank >= 2); output row i is values[lookups[i]].
HASHTABLE_LOOKUP: inputs lookups [k] and keys [n] (TENSOR_INT32, keys sorted
ascending), values [n, ...]; output row i is the values row whose key equals
lookups[i] (the first of equal keys), or stored zeros on a miss (raw 0 bytes, also for
quant8, as Android fills them); output 1 ("hits", TENSOR_QUANT8_ASYMM with scale 1 and
zero point 0) is 1 for a hit and 0 for a miss. The keys "MUST be sorted in ascending
order" (NeuralNetworks.h): Android's kernel binary-searches them without checking, so
unsorted keys may miss a key that is there, and another device (a comparison with every
key) would find it. Here keys out of order are refused, never searched: constant ones
at add_operation / finish (BAD_DATA), ones known only at run time by the run (OP_FAILED).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from nnapi.codes import OperandCode, OperationCode
from nnapi.operations._shape_common import check_known_rank_at_least, check_output_like_input, check_vector_input
from nnapi.operations.base import ExecutionContext, Operation, Shape, ValidationContext, register

T = OperandCode

# Named input positions (Android's embedding_lookup.cpp / hashtable_lookup.cpp kLookupTensor,
# kValueTensor, kKeyTensor).
LOOKUPS = 0
EMBEDDING_VALUES = 1
HASHTABLE_KEYS = 1
HASHTABLE_VALUES = 2

_EMBEDDING_TYPES = (T.TENSOR_FLOAT32, T.TENSOR_FLOAT16, T.TENSOR_INT32, T.TENSOR_QUANT8_ASYMM,
                    T.TENSOR_QUANT8_ASYMM_SIGNED)
_HASHTABLE_TYPES = (T.TENSOR_FLOAT32, T.TENSOR_INT32, T.TENSOR_QUANT8_ASYMM)


@register(OperationCode.EMBEDDING_LOOKUP)
class EmbeddingLookup(Operation):
    def validate(self, ctx: ValidationContext) -> None:
        ctx.check_counts(inputs=2, outputs=1)
        check_vector_input(ctx, LOOKUPS, "lookups")
        ctx.check_input_type(EMBEDDING_VALUES, _EMBEDDING_TYPES)
        check_known_rank_at_least(ctx, EMBEDDING_VALUES, 2)
        check_output_like_input(ctx, 0, source=EMBEDDING_VALUES)

    def prepare(self, ctx: ExecutionContext) -> list[Shape]:
        lookups = ctx.value(LOOKUPS)
        values = ctx.input(EMBEDDING_VALUES)
        ctx.require(lookups.ndim == 1, f"input 0 (lookups) must be 1-D, got shape {list(lookups.shape)}")
        ctx.require(values.rank >= 2, f"input 1 (values) must have rank at least 2, got {values.rank}")
        rows = values.shape[0]
        ctx.require(bool(np.all((lookups >= 0) & (lookups < rows))), f"lookups must be in [0, {rows})")
        return [(lookups.shape[0],) + values.shape[1:]]

    def execute(self, ctx: ExecutionContext) -> list[np.ndarray]:
        return [np.take(ctx.value(EMBEDDING_VALUES), ctx.value(LOOKUPS), axis=0)]


@register(OperationCode.HASHTABLE_LOOKUP)
class HashtableLookup(Operation):
    def validate(self, ctx: ValidationContext) -> None:
        ctx.check_counts(inputs=3, outputs=2)
        check_vector_input(ctx, LOOKUPS, "lookups")
        check_vector_input(ctx, HASHTABLE_KEYS, "keys")
        ctx.check_input_type(HASHTABLE_VALUES, _HASHTABLE_TYPES)
        check_known_rank_at_least(ctx, HASHTABLE_VALUES, 2)
        keys, values = ctx.inputs[HASHTABLE_KEYS].dimensions, ctx.inputs[HASHTABLE_VALUES].dimensions
        if len(keys) == 1 and values and keys[0] and values[0] and keys[0] != values[0]:
            ctx.fail(f"input 1 (keys) has {keys[0]} entries but input 2 (values) has {values[0]} rows")
        check_output_like_input(ctx, 0, source=HASHTABLE_VALUES)
        ctx.check_output_type(1, T.TENSOR_QUANT8_ASYMM)
        hits = ctx.outputs[1]
        if (hits.scale, hits.zero_point) != (1.0, 0):
            ctx.fail(f"output 1 (hits) must have scale 1.0 and zero point 0, got ({hits.scale}, {hits.zero_point})")
        constant_keys = ctx.constant(HASHTABLE_KEYS)
        if isinstance(constant_keys, np.ndarray) and not keys_sorted(constant_keys):
            ctx.fail(f"{UNSORTED_KEYS}, got {constant_keys.reshape(-1).tolist()}")

    def prepare(self, ctx: ExecutionContext) -> list[Shape]:
        lookups, keys, values = ctx.input(LOOKUPS), ctx.input(HASHTABLE_KEYS), ctx.input(HASHTABLE_VALUES)
        ctx.require(lookups.rank == 1 and keys.rank == 1, "lookups and keys must be 1-D")
        ctx.require(values.rank >= 2, f"input 2 (values) must have rank at least 2, got {values.rank}")
        ctx.require(keys.shape[0] == values.shape[0],
                    f"{keys.shape[0]} keys for {values.shape[0]} rows of values")
        return [(lookups.shape[0],) + values.shape[1:], (lookups.shape[0],)]

    def execute(self, ctx: ExecutionContext) -> list[np.ndarray]:
        keys = ctx.value(HASHTABLE_KEYS)
        ctx.require(keys_sorted(keys), UNSORTED_KEYS)
        return _hashtable_lookup(ctx.value(LOOKUPS), keys, ctx.value(HASHTABLE_VALUES))

    def plan(self, ctx: ExecutionContext) -> Callable[[list[Any]], list[np.ndarray]] | None:
        """Constant keys checked for order once, here; keys given at run time at each run."""
        constant = ctx.value(HASHTABLE_KEYS)
        checked = isinstance(constant, np.ndarray)
        if checked and not keys_sorted(constant):
            return None  # ``execute`` reports it at every run

        def kernel(values: list[Any]) -> list[np.ndarray]:
            if not checked:
                ctx.require(keys_sorted(values[HASHTABLE_KEYS]), UNSORTED_KEYS)
            return _hashtable_lookup(values[LOOKUPS], values[HASHTABLE_KEYS], values[HASHTABLE_VALUES])

        return kernel


#: the message for keys out of order (NNAPI: "Keys tensor *MUST* be sorted in ascending order")
UNSORTED_KEYS = "input 1 (keys) must be sorted ascending (NNAPI requires it; a binary search over unsorted keys " \
    "may miss one that is there)"


def keys_sorted(keys: np.ndarray) -> bool:
    """Whether HASHTABLE_LOOKUP's keys are in ascending order (equal neighbours allowed)."""
    flat = np.asarray(keys).reshape(-1)
    return bool(np.all(flat[1:] >= flat[:-1]))


def _hashtable_lookup(lookups: np.ndarray, keys: np.ndarray, values: np.ndarray) -> list[np.ndarray]:
    # Keys are sorted (checked): a binary search finds each lookup's first equal key.
    rows = np.searchsorted(keys, lookups)
    safe_rows = np.minimum(rows, max(keys.size - 1, 0))
    hits = (rows < keys.size) & (keys[safe_rows] == lookups) if keys.size else np.zeros(lookups.shape, bool)
    output = np.zeros((lookups.size,) + values.shape[1:], dtype=values.dtype)
    output[hits] = values[rows[hits]]
    return [output, hits.astype(np.uint8)]
