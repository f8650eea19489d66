"""Shape-manipulation and reduction operations: what the CTS vectors do not cover.

TENSOR_QUANT8_ASYMM_SIGNED (feature level 4), outputs declared with unspecified
dimensions, constants through shared memory, the feature level 4-7 operations (FILL,
RANK, PACK, MIRROR_PAD, REVERSE), bad signatures (BAD_DATA at add_operation), bad
values (OP_FAILED at compute) and zero-sized tensors.
"""

from __future__ import annotations

import numpy as np
import pytest

import nnapi
from helpers import reference_devices, run_single_op
from nnapi import OperandCode as T
from nnapi import OperandType
from nnapi import OperationCode as Op


# --- operand type shorthands -----------------------------------------------------------
def f32(*dims):
    return OperandType(T.TENSOR_FLOAT32, dims)


def f16(*dims):
    return OperandType(T.TENSOR_FLOAT16, dims)


def i32(*dims):
    return OperandType(T.TENSOR_INT32, dims)


def q8s(*dims, scale=0.5, zero_point=-10):
    return OperandType(T.TENSOR_QUANT8_ASYMM_SIGNED, dims, scale, zero_point)


def q8(*dims, scale=0.5, zero_point=100):
    return OperandType(T.TENSOR_QUANT8_ASYMM, dims, scale, zero_point)


def b8(*dims):
    return OperandType(T.TENSOR_BOOL8, dims)


INT = OperandType(T.INT32)
BOOL = OperandType(T.BOOL)
FLOAT = OperandType(T.FLOAT32)


def scalar(value):
    return (INT, value)


def vector(values):
    return (i32(len(values)), np.asarray(values, dtype=np.int32))


def run(code, inputs, outputs, feeds=(), constant_memory=False):
    return run_single_op(code, inputs, outputs, feeds, constant_memory=constant_memory)


SIGNED = np.arange(-12, 12, dtype=np.int8).reshape(2, 3, 4)


# --- TENSOR_QUANT8_ASYMM_SIGNED ------------------------------------------------------------
class TestQuant8Signed:
    def test_reshape(self):
        (out,) = run(Op.RESHAPE, [(q8s(2, 3, 4), None), vector([4, -1])], [q8s(4, 6)], [SIGNED])
        np.testing.assert_array_equal(out, SIGNED.reshape(4, 6))

    def test_transpose(self):
        (out,) = run(Op.TRANSPOSE, [(q8s(2, 3, 4), None), vector([2, 0, 1])], [q8s(4, 2, 3)], [SIGNED])
        np.testing.assert_array_equal(out, SIGNED.transpose(2, 0, 1))

    def test_concatenation_requantizes_to_the_output(self):
        a = np.array([[-10, 0, 10]], dtype=np.int8)        # scale 0.5, zp -10: reals 0, 5, 10
        b = np.array([[0, 20, -128]], dtype=np.int8)       # scale 0.25, zp 0: reals 0, 5, -32
        out_type = q8s(2, 3, scale=1.0, zero_point=1)
        (out,) = run(Op.CONCATENATION, [(q8s(1, 3), None), (q8s(1, 3, scale=0.25, zero_point=0), None), scalar(0)],
                     [out_type], [a, b])
        np.testing.assert_array_equal(out, [[1, 6, 11], [1, 6, -31]])

    def test_concatenation_requantizes_as_androids_kernel(self):
        """Every stored value of inputs in other quantizations, requantized as Android's
        CONCATENATION computes it (written out here: int8 as uint8 + 128, C float
        s = scale * (1 / out_scale), b = -zero_point * s, round(u * s + b) halves away from
        zero, plus the output zero point, saturated). With scales of powers of two the real
        values have ties, where rounding the float64 real value with the zero point inside
        (another requantization order) differs."""
        for code, dtype, shift in ((T.TENSOR_QUANT8_ASYMM_SIGNED, np.int8, 128), (T.TENSOR_QUANT8_ASYMM, np.uint8, 0)):
            values = np.arange(-shift, 256 - shift).astype(dtype).reshape(1, 256)
            inputs = [(0.5, 131 - shift), (0.125, 121 - shift), (0.03, 148 - shift)]  # zero points 131, 121, 148
            out_scale, out_zero = 0.25, 123 - shift  # in the uint8 domain
            expected = []
            for scale, zero in inputs:
                factor = np.float32(scale) * (np.float32(1) / np.float32(out_scale))
                bias = np.float32(-(zero + shift)) * factor
                real = (values.astype(np.int64) + shift).astype(np.float32) * factor + bias
                rounded = np.sign(real) * np.floor(np.abs(real).astype(np.float64) + 0.5)
                expected.append(np.clip(rounded + out_zero + shift, 0, 255) - shift)
            (out,) = run(Op.CONCATENATION,
                         [*[(OperandType(code, [1, 256], scale, zero), None) for scale, zero in inputs], scalar(0)],
                         [OperandType(code, [3, 256], out_scale, out_zero)], [values] * 3)
            np.testing.assert_array_equal(out, np.concatenate(expected))
            real_rounded = np.clip(np.floor((values.astype(np.float64) - inputs[1][1]) * 0.125 / out_scale + out_zero
                                            + 0.5), -shift, 255 - shift)
            assert np.any(real_rounded != expected[1])  # the ties this checks

    def test_split(self):
        outs = run(Op.SPLIT, [(q8s(2, 3, 4), None), scalar(-1), scalar(2)], [q8s(2, 3, 2), q8s(2, 3, 2)], [SIGNED])
        np.testing.assert_array_equal(outs[0], SIGNED[..., :2])
        np.testing.assert_array_equal(outs[1], SIGNED[..., 2:])

    def test_slice_and_strided_slice(self):
        (out,) = run(Op.SLICE, [(q8s(2, 3, 4), None), vector([1, 0, 1]), vector([1, -1, 2])], [q8s(1, 3, 2)],
                     [SIGNED])
        np.testing.assert_array_equal(out, SIGNED[1:2, :, 1:3])
        (out,) = run(Op.STRIDED_SLICE, [(q8s(2, 3, 4), None), vector([0, 2, 0]), vector([1, -4, 4]),
                                        vector([1, -1, 2]), scalar(0), scalar(0), scalar(1)],
                     [q8s(3, 2)], [SIGNED])
        np.testing.assert_array_equal(out, SIGNED[0, 2::-1, ::2])

    def test_pad_fills_with_the_zero_point(self):
        x = np.array([[5, -5]], dtype=np.int8)
        (out,) = run(Op.PAD, [(q8s(1, 2), None), (i32(2, 2), np.array([[0, 1], [1, 0]], np.int32))],
                     [q8s(2, 3)], [x])
        np.testing.assert_array_equal(out, [[-10, 5, -5], [-10, -10, -10]])

    def test_pad_v2_fills_with_the_given_quantized_value(self):
        x = np.array([[5, -5]], dtype=np.int8)
        (out,) = run(Op.PAD_V2, [(q8s(1, 2), None), (i32(2, 2), np.array([[0, 0], [2, 0]], np.int32)),
                                 scalar(-128)], [q8s(1, 4)], [x])
        np.testing.assert_array_equal(out, [[-128, -128, 5, -5]])

    def test_space_to_batch_pads_with_the_zero_point(self):
        x = np.arange(1, 5, dtype=np.int8).reshape(1, 2, 2, 1)
        (out,) = run(Op.SPACE_TO_BATCH_ND, [(q8s(1, 2, 2, 1), None), vector([2, 2]),
                                            (i32(2, 2), np.array([[0, 0], [0, 2]], np.int32))],
                     [q8s(4, 1, 2, 1)], [x])
        np.testing.assert_array_equal(out.reshape(4, 2), [[1, -10], [2, -10], [3, -10], [4, -10]])

    def test_depth_to_space_and_back(self):
        x = np.arange(-8, 8, dtype=np.int8).reshape(1, 1, 2, 8)
        (space,) = run(Op.DEPTH_TO_SPACE, [(q8s(1, 1, 2, 8), None), scalar(2)], [q8s(1, 2, 4, 2)], [x])
        np.testing.assert_array_equal(space[0, :, :, 0], [[-8, -6, 0, 2], [-4, -2, 4, 6]])
        (depth,) = run(Op.SPACE_TO_DEPTH, [(q8s(1, 2, 4, 2), None), scalar(2)], [q8s(1, 1, 2, 8)], [space])
        np.testing.assert_array_equal(depth, x)

    def test_batch_to_space_nchw(self):
        x = np.arange(8, dtype=np.int8).reshape(4, 2, 1, 1)    # NCHW: 4 batches, 2 channels
        (out,) = run(Op.BATCH_TO_SPACE_ND, [(q8s(4, 2, 1, 1), None), vector([2, 2]), (BOOL, True)],
                     [q8s(1, 2, 2, 2)], [x])
        np.testing.assert_array_equal(out[0, 0], [[0, 2], [4, 6]])
        np.testing.assert_array_equal(out[0, 1], [[1, 3], [5, 7]])

    def test_channel_shuffle_tile_gather_reverse(self):
        x = np.arange(-3, 3, dtype=np.int8).reshape(1, 6)
        (out,) = run(Op.CHANNEL_SHUFFLE, [(q8s(1, 6), None), scalar(2), scalar(-1)], [q8s(1, 6)], [x])
        np.testing.assert_array_equal(out, [[-3, 0, -2, 1, -1, 2]])
        (out,) = run(Op.TILE, [(q8s(1, 6), None), vector([2, 1])], [q8s(2, 6)], [x])
        np.testing.assert_array_equal(out, np.tile(x, (2, 1)))
        (out,) = run(Op.GATHER, [(q8s(1, 6), None), scalar(1), (i32(2, 2), np.array([[5, 0], [1, 1]], np.int32))],
                     [q8s(1, 2, 2)], [x])
        np.testing.assert_array_equal(out, [[[2, -3], [-2, -2]]])
        (out,) = run(Op.REVERSE, [(q8s(1, 6), None), vector([1])], [q8s(1, 6)], [x])
        np.testing.assert_array_equal(out, x[:, ::-1])

    def test_reductions_and_arg_ops(self):
        (out,) = run(Op.MEAN, [(q8s(2, 3, 4), None), vector([1, -1]), scalar(1)], [q8s(2, 1, 1)], [SIGNED])
        np.testing.assert_array_equal(out.reshape(-1), [-7, 6])     # means -6.5 and 5.5 round away from 0
        (out,) = run(Op.REDUCE_MAX, [(q8s(2, 3, 4), None), vector([0]), (BOOL, False)], [q8s(3, 4)], [SIGNED])
        np.testing.assert_array_equal(out, SIGNED[1])
        (out,) = run(Op.REDUCE_MIN, [(q8s(2, 3, 4), None), vector([0, 1, 2]), (BOOL, False)], [q8s(1)], [SIGNED])
        np.testing.assert_array_equal(out, [-12])
        (out,) = run(Op.ARGMAX, [(q8s(2, 3, 4), None), scalar(1)], [i32(2, 4)], [SIGNED])
        np.testing.assert_array_equal(out, np.full((2, 4), 2))
        (out,) = run(Op.ARGMIN, [(q8s(2, 3, 4), None), scalar(-1)], [i32(2, 3)], [SIGNED])
        np.testing.assert_array_equal(out, np.zeros((2, 3)))

    def test_topk_and_embedding_lookup(self):
        x = np.array([[3, -1, 3, 7]], dtype=np.int8)
        values, indices = run(Op.TOPK_V2, [(q8s(1, 4), None), scalar(3)], [q8s(1, 3), i32(1, 3)], [x])
        np.testing.assert_array_equal(values, [[7, 3, 3]])
        np.testing.assert_array_equal(indices, [[3, 2, 0]])       # equal values: larger index first
        table = np.arange(-6, 6, dtype=np.int8).reshape(4, 3)
        (out,) = run(Op.EMBEDDING_LOOKUP, [vector([3, 0, 3]), (q8s(4, 3), None)], [q8s(3, 3)], [table])
        np.testing.assert_array_equal(out, table[[3, 0, 3]])

    def test_pack(self):
        a = np.array([1, 2], dtype=np.int8)
        b = np.array([3, 4], dtype=np.int8)
        (out,) = run(Op.PACK, [scalar(-1), (q8s(2), None), (q8s(2), None)], [q8s(2, 2)], [a, b])
        np.testing.assert_array_equal(out, [[1, 3], [2, 4]])


# --- outputs with unspecified dimensions --------------------------------------------------
class TestDynamicOutputShapes:
    def test_reshape_output_of_unknown_rank(self):
        x = np.arange(12, dtype=np.float32)
        (out,) = run(Op.RESHAPE, [(f32(12), None), vector([-1, 2, 3])], [f32()], [x])
        assert out.shape == (2, 2, 3)
        np.testing.assert_array_equal(out, x.reshape(2, 2, 3))

    def test_shape_from_a_model_input(self):
        x = np.arange(6, dtype=np.float32).reshape(2, 3)
        (out,) = run(Op.RESHAPE, [(f32(2, 3), None), (i32(2), None)], [f32(0, 0)],
                     [x, np.array([3, 2], np.int32)])
        np.testing.assert_array_equal(out, x.reshape(3, 2))

    def test_strided_slice_squeeze_and_gather(self):
        x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
        # begin_mask bit 0 ignores begin[0]; a negative stride walks dimension 2 backwards
        (out,) = run(Op.STRIDED_SLICE, [(f32(2, 3, 4), None), vector([1, 0, -1]), vector([2, 3, 0]),
                                        vector([1, 2, -1]), scalar(1), scalar(0), scalar(0)], [f32(0, 0, 0)], [x])
        np.testing.assert_array_equal(out, x[:, 0:3:2, 3:0:-1])
        (out,) = run(Op.SQUEEZE, [(f32(1, 3, 1), None), (i32(1), "omitted")], [f32(0)],
                     [np.ones((1, 3, 1), np.float32)])
        assert out.shape == (3,)
        (out,) = run(Op.GATHER, [(f32(2, 3, 4), None), scalar(2), vector([3, 1])], [f32()], [x])
        np.testing.assert_array_equal(out, x[..., [3, 1]])

    def test_topk_reduce_and_argmax(self):
        x = np.array([[1, 5, 2], [9, 0, 9]], np.float32)
        values, indices = run(Op.TOPK_V2, [(f32(2, 3), None), scalar(2)], [f32(0, 0), i32(0, 0)], [x])
        np.testing.assert_array_equal(values, [[5, 2], [9, 9]])
        np.testing.assert_array_equal(indices, [[1, 2], [2, 0]])
        (out,) = run(Op.REDUCE_SUM, [(f32(2, 3), None), vector([1]), (BOOL, True)], [f32()], [x])
        np.testing.assert_array_equal(out, [[8], [18]])
        (out,) = run(Op.ARGMAX, [(f32(2, 3), None), scalar(0)], [i32(0)], [x])
        np.testing.assert_array_equal(out, [1, 0, 1])

    def test_split_space_to_batch_and_pad_v2(self):
        x = np.arange(16, dtype=np.float32).reshape(1, 4, 4, 1)
        outs = run(Op.SPLIT, [(f32(1, 4, 4, 1), None), scalar(1), scalar(2)], [f32(), f32(0, 0, 0, 0)], [x])
        np.testing.assert_array_equal(outs[0], x[:, :2])
        np.testing.assert_array_equal(outs[1], x[:, 2:])
        (out,) = run(Op.SPACE_TO_BATCH_ND, [(f32(1, 4, 4, 1), None), vector([2, 2]),
                                            (i32(2, 2), np.zeros((2, 2), np.int32))], [f32()], [x])
        np.testing.assert_array_equal(out[:, :, :, 0], [x[0, ::2, ::2, 0], x[0, ::2, 1::2, 0],
                                                        x[0, 1::2, ::2, 0], x[0, 1::2, 1::2, 0]])
        (out,) = run(Op.PAD_V2, [(f32(1, 4, 4, 1), None), (i32(4, 2), None), (FLOAT, -1.0)], [f32()],
                     [x, np.array([[0, 0], [0, 1], [0, 0], [0, 0]], np.int32)])
        assert out.shape == (1, 5, 4, 1)
        np.testing.assert_array_equal(out[0, 4, :, 0], [-1, -1, -1, -1])

    def test_concatenation_and_tile(self):
        a = np.ones((1, 2), np.float32)
        b = np.zeros((2, 2), np.float32)
        (out,) = run(Op.CONCATENATION, [(f32(1, 2), None), (f32(2, 2), None), scalar(0)], [f32(0, 2)], [a, b])
        np.testing.assert_array_equal(out, [[1, 1], [0, 0], [0, 0]])
        (out,) = run(Op.TILE, [(f32(1, 2), None), (i32(2), None)], [f32()], [a, np.array([3, 2], np.int32)])
        assert out.shape == (3, 4)


# --- constants through shared memory ------------------------------------------------------
class TestConstantMemory:
    def test_transpose_with_constant_input_and_permutation(self):
        x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
        (out,) = run(Op.TRANSPOSE, [(f32(2, 3, 4), x), vector([1, 2, 0])], [f32(3, 4, 2)], constant_memory=True)
        np.testing.assert_array_equal(out, x.transpose(1, 2, 0))

    def test_pad_and_mean_with_constant_parameters(self):
        x = np.arange(6, dtype=np.float32).reshape(2, 3)
        (out,) = run(Op.PAD, [(f32(2, 3), None), (i32(2, 2), np.array([[1, 0], [0, 1]], np.int32))],
                     [f32(3, 4)], [x], constant_memory=True)
        np.testing.assert_array_equal(out, np.pad(x, [(1, 0), (0, 1)]))
        (out,) = run(Op.MEAN, [(f32(2, 3), x), vector([0, 1]), scalar(0)], [f32(1)], constant_memory=True)
        np.testing.assert_allclose(out, [2.5])

    def test_hashtable_lookup_with_constant_table(self):
        keys = np.array([-3, 2, 10], np.int32)
        table = np.arange(6, dtype=np.float32).reshape(3, 2) + 1
        hits_type = OperandType(T.TENSOR_QUANT8_ASYMM, [4], 1.0, 0)
        out, hits = run(Op.HASHTABLE_LOOKUP, [(i32(4), None), (i32(3), keys), (f32(3, 2), table)],
                        [f32(4, 2), hits_type], [np.array([10, 4, -3, 2], np.int32)], constant_memory=True)
        np.testing.assert_array_equal(out, [[5, 6], [0, 0], [1, 2], [3, 4]])
        np.testing.assert_array_equal(hits, [1, 0, 1, 1])

    def test_hashtable_lookup_with_unsorted_constant_keys_is_bad_data(self):
        """NNAPI: the keys "MUST be sorted in ascending order"; a binary search over unsorted
        keys may miss one that is there, so constant keys out of order are refused when the
        operation is added (keys given later, at finish), naming the rule."""
        hits_type = OperandType(T.TENSOR_QUANT8_ASYMM, [2], 1.0, 0)
        with pytest.raises(nnapi.BadDataError, match=r"input 1 \(keys\) must be sorted ascending"):
            run(Op.HASHTABLE_LOOKUP, [(i32(2), None), (i32(3), np.array([7, 3, 5], np.int32)),
                                      (f32(3, 1), np.ones((3, 1), np.float32))],
                [f32(2, 1), hits_type], [np.array([3, 7], np.int32)])

    def test_hashtable_lookup_with_unsorted_keys_at_run_time_fails_the_run(self):
        """Keys given at run time out of order: OP_FAILED naming the rule (never a silent
        miss of a key that is there); equal neighbours are sorted and accepted."""
        hits_type = OperandType(T.TENSOR_QUANT8_ASYMM, [2], 1.0, 0)
        table = np.arange(3, dtype=np.float32).reshape(3, 1) + 1
        with pytest.raises(nnapi.OpFailedError, match=r"input 1 \(keys\) must be sorted ascending"):
            run(Op.HASHTABLE_LOOKUP, [(i32(2), None), (i32(3), None), (f32(3, 1), table)],
                [f32(2, 1), hits_type], [np.array([3, 7], np.int32), np.array([7, 3, 5], np.int32)])
        out, hits = run(Op.HASHTABLE_LOOKUP, [(i32(2), None), (i32(3), None), (f32(3, 1), table)],
                        [f32(2, 1), hits_type], [np.array([3, 7], np.int32), np.array([3, 3, 7], np.int32)])
        np.testing.assert_array_equal(out, [[1], [3]])
        np.testing.assert_array_equal(hits, [1, 1])


# --- feature level 4-7 operations ---------------------------------------------------------
class TestFillAndRank:
    @pytest.mark.parametrize("out_type, value_type, value", [
        (f32(), FLOAT, 1.5), (f16(), OperandType(T.FLOAT16), -2.0), (i32(), INT, 7),
    ])
    def test_fill_shape_comes_from_the_value(self, out_type, value_type, value):
        (out,) = run(Op.FILL, [(i32(3), None), (value_type, value)], [out_type], [np.array([2, 1, 3], np.int32)])
        assert out.shape == (2, 1, 3)
        assert out.dtype == out_type.dtype
        np.testing.assert_array_equal(out, np.full((2, 1, 3), value))

    def test_fill_rejects_a_mismatched_value_type(self):
        with pytest.raises(nnapi.BadDataError):
            run(Op.FILL, [vector([2]), (INT, 1)], [f32(2)])

    def test_fill_rejects_negative_dimensions(self):
        with pytest.raises(nnapi.OpFailedError):
            run(Op.FILL, [(i32(2), None), (FLOAT, 1.0)], [f32(0, 0)], [np.array([2, -1], np.int32)])

    @pytest.mark.parametrize("op_type, shape", [
        (f32(2, 3, 4), (2, 3, 4)), (b8(5), (5,)), (q8s(1, 1, 1, 1, 2), (1, 1, 1, 1, 2)),
        (OperandType(T.TENSOR_QUANT16_SYMM, [3, 1], 0.5, 0), (3, 1)),
    ])
    def test_rank_is_an_int32_scalar(self, op_type, shape):
        (out,) = run(Op.RANK, [(op_type, None)], [INT], [np.zeros(shape, op_type.dtype)])
        assert int(out) == len(shape)

    def test_rank_of_a_float_output_is_bad_data(self):
        with pytest.raises(nnapi.BadDataError):
            run(Op.RANK, [(f32(2), None)], [FLOAT])


class TestPack:
    def test_axis_zero_stacks_the_tensors(self):
        a = np.arange(6, dtype=np.float32).reshape(2, 3)
        (out,) = run(Op.PACK, [scalar(0), (f32(2, 3), None), (f32(2, 3), None), (f32(2, 3), None)],
                     [f32(3, 2, 3)], [a, a + 10, a + 20])
        np.testing.assert_array_equal(out, np.stack([a, a + 10, a + 20]))

    def test_middle_axis_and_int32(self):
        a = np.arange(6, dtype=np.int32).reshape(2, 3)
        (out,) = run(Op.PACK, [scalar(1), (i32(2, 3), None), (i32(2, 3), None)], [i32()], [a, -a])
        assert out.shape == (2, 2, 3)
        np.testing.assert_array_equal(out[:, 1], -a)

    def test_single_input_float16(self):
        a = np.array([1.5, 2.5], np.float16)
        (out,) = run(Op.PACK, [scalar(1), (f16(2), None)], [f16(2, 1)], [a])
        np.testing.assert_array_equal(out, [[1.5], [2.5]])

    def test_quantization_must_match(self):
        with pytest.raises(nnapi.BadDataError):
            run(Op.PACK, [scalar(0), (q8(2), None), (q8(2, scale=0.25), None)], [q8(2, 2)])
        with pytest.raises(nnapi.BadDataError):
            run(Op.PACK, [scalar(0), (q8(2), None), (q8(2), None)], [q8(2, 2, zero_point=0)])

    def test_shapes_must_match(self):
        with pytest.raises(nnapi.OpFailedError):
            run(Op.PACK, [scalar(0), (f32(0), None), (f32(0), None)], [f32()],
                [np.ones(2, np.float32), np.ones(3, np.float32)])

    def test_axis_out_of_range_fails(self):
        # refused at add_operation when the inputs' shapes are declared (#17), at compute otherwise
        with pytest.raises(nnapi.BadDataError, match="add_operation.*axis 2 is out of range"):
            run(Op.PACK, [scalar(2), (f32(2), None)], [f32()], [np.ones(2, np.float32)])
        with pytest.raises(nnapi.OpFailedError):
            run(Op.PACK, [scalar(2), (f32(0), None)], [f32()], [np.ones(2, np.float32)])


class TestMirrorPad:
    def test_spec_example(self):
        x = np.array([1, 2, 3], np.float32)
        paddings = (i32(1, 2), np.array([[0, 2]], np.int32))
        (reflect,) = run(Op.MIRROR_PAD, [(f32(3), None), paddings, scalar(0)], [f32(5)], [x])
        np.testing.assert_array_equal(reflect, [1, 2, 3, 2, 1])
        (symmetric,) = run(Op.MIRROR_PAD, [(f32(3), None), paddings, scalar(1)], [f32(5)], [x])
        np.testing.assert_array_equal(symmetric, [1, 2, 3, 3, 2])

    def test_two_dimensions_int32(self):
        x = np.array([[1, 2, 3], [4, 5, 6]], np.int32)
        paddings = (i32(2, 2), np.array([[1, 1], [2, 0]], np.int32))
        (out,) = run(Op.MIRROR_PAD, [(i32(2, 3), None), paddings, scalar(1)], [i32(0, 0)], [x])
        np.testing.assert_array_equal(out, [[2, 1, 1, 2, 3], [2, 1, 1, 2, 3], [5, 4, 4, 5, 6], [5, 4, 4, 5, 6]])
        (out,) = run(Op.MIRROR_PAD, [(i32(2, 3), None), paddings, scalar(0)], [i32(4, 5)], [x])
        np.testing.assert_array_equal(out, [[6, 5, 4, 5, 6], [3, 2, 1, 2, 3], [6, 5, 4, 5, 6], [3, 2, 1, 2, 3]])

    def test_quant8_keeps_values(self):
        x = np.array([[10, 20]], np.uint8)
        (out,) = run(Op.MIRROR_PAD, [(q8(1, 2), None), (i32(2, 2), np.array([[0, 0], [1, 1]], np.int32)),
                                     scalar(0)], [q8(1, 4)], [x])
        np.testing.assert_array_equal(out, [[20, 10, 20, 10]])

    @pytest.mark.parametrize("mode, padding", [(0, 3), (1, 4), (2, 0)])
    def test_paddings_too_large_or_bad_mode_fail(self, mode, padding):
        with pytest.raises(nnapi.OpFailedError):
            run(Op.MIRROR_PAD, [(f32(0), None), (i32(1, 2), np.array([[padding, 0]], np.int32)), scalar(mode)],
                [f32(0)], [np.ones(3, np.float32)])

    def test_bad_mode_is_refused_at_add_operation_when_the_input_is_declared(self):
        with pytest.raises(nnapi.BadDataError, match="add_operation.*mode must be 0"):
            run(Op.MIRROR_PAD, [(f32(3), None), (i32(1, 2), np.array([[0, 0]], np.int32)), scalar(2)],
                [f32(0)], [np.ones(3, np.float32)])


class TestReverse:
    @pytest.mark.parametrize("axis", [0, 1, 2])
    def test_each_axis(self, axis):
        x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
        (out,) = run(Op.REVERSE, [(f32(2, 3, 4), None), vector([axis])], [f32(2, 3, 4)], [x])
        np.testing.assert_array_equal(out, np.flip(x, axis))

    def test_rank_eight_int32(self):
        x = np.arange(2 ** 8, dtype=np.int32).reshape((2,) * 8)
        (out,) = run(Op.REVERSE, [(i32(*(2,) * 8), None), vector([7])], [i32(*(2,) * 8)], [x])
        np.testing.assert_array_equal(out, x[..., ::-1])

    def test_negative_axis_fails(self):
        with pytest.raises(nnapi.BadDataError, match="add_operation"):  # a constant axis, a declared shape
            run(Op.REVERSE, [(f32(2), None), vector([-1])], [f32(2)], [np.ones(2, np.float32)])
        with pytest.raises(nnapi.OpFailedError):
            run(Op.REVERSE, [(f32(0), None), vector([-1])], [f32(2)], [np.ones(2, np.float32)])

    def test_axis_must_have_shape_one(self):
        with pytest.raises(nnapi.BadDataError):
            run(Op.REVERSE, [(f32(2, 2), None), vector([0, 1])], [f32(2, 2)])


# --- other semantics ------------------------------------------------------------------------
class TestSemantics:
    def test_squeeze_all_and_expand_dims_negative_axis(self):
        x = np.ones((1, 1), np.float32)
        (out,) = run(Op.SQUEEZE, [(f32(1, 1), None), (i32(1), "omitted")], [f32(1)], [x])
        assert out.shape == (1,)
        (out,) = run(Op.EXPAND_DIMS, [(i32(2, 3), None), scalar(-1)], [i32(2, 3, 1)],
                     [np.arange(6, dtype=np.int32).reshape(2, 3)])
        assert out.shape == (2, 3, 1)

    def test_transpose_without_permutation_reverses_dimensions(self):
        x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
        (out,) = run(Op.TRANSPOSE, [(f32(2, 3, 4), None), (i32(3), "omitted")], [f32(4, 3, 2)], [x])
        np.testing.assert_array_equal(out, x.T)

    def test_strided_slice_masks(self):
        x = np.arange(12, dtype=np.float32).reshape(3, 4)
        # begin_mask on dim 0, end_mask on dim 1, shrink dim 0 is not allowed here (range 3)
        (out,) = run(Op.STRIDED_SLICE, [(f32(3, 4), None), vector([2, 1]), vector([1, 0]), vector([1, 2]),
                                        scalar(1), scalar(2), scalar(0)], [f32(1, 2)], [x])
        np.testing.assert_array_equal(out, x[:1, 1::2])
        (out,) = run(Op.STRIDED_SLICE, [(f32(3, 4), None), vector([1, 3]), vector([2, 4]), vector([1, 1]),
                                        scalar(0), scalar(0), scalar(3)], [f32(1)], [x])
        np.testing.assert_array_equal(out, [7])

    def test_strided_slice_backwards_from_before_the_first_index_is_empty(self):
        """A backwards slice whose begin lies below -dim starts before index 0 (clamped to
        -1): it selects nothing, as Android's ClampedIndex gives, not the last element."""
        x = np.arange(12, dtype=np.float32).reshape(3, 4)
        (out,) = run(Op.STRIDED_SLICE, [(f32(3, 4), None), vector([0, -5]), vector([3, 0]), vector([1, -1]),
                                        scalar(0), scalar(2), scalar(0)], [f32(0, 0)], [x])
        assert out.shape == (3, 0)

    def test_reduce_prod_zero_beats_infinity_and_bool_reductions(self):
        x = np.array([[0, np.inf], [2, 3]], np.float32)
        (out,) = run(Op.REDUCE_PROD, [(f32(2, 2), None), vector([1]), (BOOL, False)], [f32(2)], [x])
        np.testing.assert_array_equal(out, [0, 6])
        flags = np.array([[True, False], [True, True]])
        (out,) = run(Op.REDUCE_ALL, [(b8(2, 2), None), vector([-1]), (BOOL, False)], [b8(2)], [flags])
        np.testing.assert_array_equal(out, [False, True])
        (out,) = run(Op.REDUCE_ANY, [(b8(2, 2), None), vector([0, 1]), (BOOL, True)], [b8(1, 1)], [flags])
        np.testing.assert_array_equal(out, [[True]])

    def test_reduce_max_of_negative_infinities_is_the_lowest_float(self):
        """Android folds from the lowest float32 with std::max, which -inf never passes."""
        x = np.array([[-np.inf, -np.inf], [1, -np.inf]], np.float32)
        (out,) = run(Op.REDUCE_MAX, [(f32(2, 2), None), vector([1]), (BOOL, False)], [f32(2)], [x])
        np.testing.assert_array_equal(out, [np.finfo(np.float32).min, 1])

    def test_topk_many_ties_int32(self):
        x = np.array([[4, 1, 4, 4, 0, 4], [2, 2, 2, 2, 2, 2]], np.int32)
        values, indices = run(Op.TOPK_V2, [(i32(2, 6), None), scalar(4)], [i32(2, 4), i32(2, 4)], [x])
        np.testing.assert_array_equal(values, [[4, 4, 4, 4], [2, 2, 2, 2]])
        np.testing.assert_array_equal(indices, [[5, 3, 2, 0], [5, 4, 3, 2]])

    def test_mean_float16_and_repeated_axes(self):
        x = np.arange(8, dtype=np.float16).reshape(2, 4)
        (out,) = run(Op.MEAN, [(f16(2, 4), None), vector([1, -1]), scalar(0)], [f16(2)], [x])
        np.testing.assert_array_equal(out, [1.5, 5.5])

    # Constant indices or shapes against a declared input shape are refused at add_operation
    # (#17); against a shape known only at compute, the execution fails.
    def test_gather_index_out_of_range_fails(self):
        with pytest.raises(nnapi.BadDataError, match="add_operation"):
            run(Op.GATHER, [(f32(3), None), scalar(0), vector([3])], [f32(1)], [np.ones(3, np.float32)])
        with pytest.raises(nnapi.OpFailedError):
            run(Op.GATHER, [(f32(0), None), scalar(0), vector([3])], [f32(1)], [np.ones(3, np.float32)])

    def test_gather_runtime_indices_are_checked_at_every_execution(self):
        """Indices that are a model input: the output shape is known at preparation (the
        operation runs prepared), their values are checked when each execution runs."""
        x = np.arange(12, dtype=np.float32).reshape(3, 4)
        inputs = [(f32(3, 4), None), scalar(0), (i32(2), None)]
        (out,) = run(Op.GATHER, inputs, [f32(2, 4)], [x, np.array([2, 0], np.int32)])
        np.testing.assert_array_equal(out, x[[2, 0]])
        for bad in ([3, 0], [0, -1]):
            with pytest.raises(nnapi.OpFailedError, match=r"indices must be in \[0, 3\)"):
                run(Op.GATHER, inputs, [f32(2, 4)], [x, np.array(bad, np.int32)])

    def test_embedding_lookup_out_of_range_fails(self):
        with pytest.raises(nnapi.BadDataError, match="add_operation"):
            run(Op.EMBEDDING_LOOKUP, [vector([-1]), (f32(2, 2), None)], [f32(1, 2)], [np.ones((2, 2), np.float32)])
        with pytest.raises(nnapi.OpFailedError):
            run(Op.EMBEDDING_LOOKUP, [vector([-1]), (f32(0, 2), None)], [f32(1, 2)], [np.ones((2, 2), np.float32)])

    def test_reshape_element_count_mismatch_fails(self):
        with pytest.raises(nnapi.BadDataError, match="add_operation.*does not hold 6 elements"):
            run(Op.RESHAPE, [(f32(6), None), vector([4, -1])], [f32(0, 0)], [np.ones(6, np.float32)])
        with pytest.raises(nnapi.OpFailedError):
            run(Op.RESHAPE, [(f32(0), None), vector([4, -1])], [f32(0, 0)], [np.ones(6, np.float32)])

    def test_topk_k_out_of_range_fails(self):
        with pytest.raises(nnapi.BadDataError, match="add_operation.*k = 4 is out of range"):
            run(Op.TOPK_V2, [(f32(3), None), scalar(4)], [f32(0), i32(0)], [np.ones(3, np.float32)])
        with pytest.raises(nnapi.OpFailedError):
            run(Op.TOPK_V2, [(f32(0), None), scalar(4)], [f32(0), i32(0)], [np.ones(3, np.float32)])

    def test_split_count_must_match_outputs(self):
        with pytest.raises(nnapi.BadDataError, match="add_operation.*num_splits 4"):
            run(Op.SPLIT, [(f32(4), None), scalar(0), scalar(4)], [f32(2), f32(2)], [np.ones(4, np.float32)])
        with pytest.raises(nnapi.OpFailedError):
            run(Op.SPLIT, [(f32(0), None), scalar(0), scalar(4)], [f32(2), f32(2)], [np.ones(4, np.float32)])


# --- bad signatures: BAD_DATA at add_operation -----------------------------------------------
BAD_SIGNATURES = {
    "reshape wrong input count": (Op.RESHAPE, [f32(2)], [f32(2)]),
    "reshape bool8 input": (Op.RESHAPE, [b8(2), i32(1)], [b8(2)]),
    "reshape rank 5": (Op.RESHAPE, [f32(1, 1, 1, 1, 2), i32(1)], [f32(2)]),
    "reshape shape is 2-D": (Op.RESHAPE, [f32(2), i32(1, 1)], [f32(2)]),
    "reshape output scale differs": (Op.RESHAPE, [q8s(2), i32(1)], [q8s(2, scale=0.25)]),
    "squeeze int32 input": (Op.SQUEEZE, [i32(2), i32(1)], [i32(2)]),
    "expand_dims float axis": (Op.EXPAND_DIMS, [f32(2), FLOAT], [f32(2, 1)]),
    "transpose permutation length": (Op.TRANSPOSE, [f32(2, 3), i32(3)], [f32(3, 2)]),
    "concatenation mixed types": (Op.CONCATENATION, [f32(2), f16(2), INT], [f32(4)]),
    "concatenation mixed ranks": (Op.CONCATENATION, [f32(2), f32(2, 1), INT], [f32(4)]),
    "concatenation int32": (Op.CONCATENATION, [i32(2), i32(2), INT], [i32(4)]),
    "split no outputs": (Op.SPLIT, [f32(2), INT, INT], []),
    "split output zero point": (Op.SPLIT, [q8(2), INT, INT], [q8(2, zero_point=0)]),
    "pack axis is a tensor": (Op.PACK, [i32(1), f32(2)], [f32(1, 2)]),
    "pack output rank": (Op.PACK, [INT, f32(2), f32(2)], [f32(4)]),
    "pack shapes differ": (Op.PACK, [INT, f32(2), f32(3)], [f32(2, 2)]),
    "slice bool8": (Op.SLICE, [b8(2), i32(1), i32(1)], [b8(1)]),
    "strided_slice int32 masks as bool": (Op.STRIDED_SLICE, [f32(2), i32(1), i32(1), i32(1), BOOL, INT, INT],
                                          [f32(1)]),
    "pad paddings shape": (Op.PAD, [f32(2, 2), i32(2, 3)], [f32(3, 3)]),
    "pad_v2 float value for quant8": (Op.PAD_V2, [q8(2), i32(1, 2), FLOAT], [q8(3)]),
    "pad_v2 float16 value for float32": (Op.PAD_V2, [f32(2), i32(1, 2), OperandType(T.FLOAT16)], [f32(3)]),
    "mirror_pad bool8": (Op.MIRROR_PAD, [b8(2), i32(1, 2), INT], [b8(3)]),
    "reverse rank 9": (Op.REVERSE, [f32(*(1,) * 9), i32(1)], [f32(*(1,) * 9)]),
    "tile multiples length": (Op.TILE, [f32(2, 2), i32(3)], [f32(2, 2)]),
    "gather indices float": (Op.GATHER, [f32(2), INT, f32(1)], [f32(1)]),
    "depth_to_space rank 3": (Op.DEPTH_TO_SPACE, [f32(1, 2, 8), INT], [f32(1, 4, 2)]),
    "space_to_depth layout int": (Op.SPACE_TO_DEPTH, [f32(1, 2, 2, 1), INT, INT], [f32(1, 1, 1, 4)]),
    "batch_to_space block sizes 3": (Op.BATCH_TO_SPACE_ND, [f32(4, 1, 1, 1), i32(3)], [f32(1, 2, 2, 1)]),
    "space_to_batch paddings rows": (Op.SPACE_TO_BATCH_ND, [f32(1, 2, 2, 1), i32(2), i32(3, 2)], [f32(4, 1, 1, 1)]),
    "channel_shuffle int32": (Op.CHANNEL_SHUFFLE, [i32(4), INT, INT], [i32(4)]),
    "fill quant8 output": (Op.FILL, [i32(1), INT], [q8(2)]),
    "rank two outputs": (Op.RANK, [f32(2)], [INT, INT]),
    "mean bool keep_dims": (Op.MEAN, [f32(2), i32(1), BOOL], [f32(1)]),
    "reduce_sum quant8": (Op.REDUCE_SUM, [q8(2), i32(1), BOOL], [q8(1)]),
    "reduce_all float": (Op.REDUCE_ALL, [f32(2), i32(1), BOOL], [f32(1)]),
    "reduce_max int keep_dims": (Op.REDUCE_MAX, [f32(2), i32(1), INT], [f32(1)]),
    "argmax float output": (Op.ARGMAX, [f32(2, 2), INT], [f32(2)]),
    "topk one output": (Op.TOPK_V2, [f32(4), INT], [f32(2)]),
    "topk output scale": (Op.TOPK_V2, [q8(4), INT], [q8(2, scale=1.0), i32(2)]),
    "embedding_lookup rank 1 values": (Op.EMBEDDING_LOOKUP, [i32(1), f32(4)], [f32(1)]),
    "hashtable_lookup hits scale": (Op.HASHTABLE_LOOKUP, [i32(1), i32(2), f32(2, 2)],
                                    [f32(1, 2), OperandType(T.TENSOR_QUANT8_ASYMM, [1], 0.5, 0)]),
    "hashtable_lookup float16 values": (Op.HASHTABLE_LOOKUP, [i32(1), i32(2), f16(2, 2)],
                                        [f16(1, 2), OperandType(T.TENSOR_QUANT8_ASYMM, [1], 1.0, 0)]),
}


@pytest.mark.parametrize("case", BAD_SIGNATURES, ids=list(BAD_SIGNATURES))
def test_bad_signature_is_bad_data_at_add_operation(case):
    code, inputs, outputs = BAD_SIGNATURES[case]
    model = nnapi.Model()
    input_indexes = [model.add_operand(t) for t in inputs]
    output_indexes = [model.add_operand(t) for t in outputs]
    with pytest.raises(nnapi.BadDataError) as excinfo:
        model.add_operation(code, input_indexes, output_indexes)
    assert code.name in str(excinfo.value)


# --- zero-sized tensors ----------------------------------------------------------------------
def _zero_sized_then(code, extra_inputs, output_type, feed):
    """A model: SLICE of size 0 along dim 0 of a [2, 3] input, then ``code`` on it."""
    model = nnapi.Model()
    x = model.add_operand(f32(2, 3))
    begin = model.add_operand(i32(2))
    size = model.add_operand(i32(2))
    empty = model.add_operand(f32(0, 3))
    model.set_operand_value(begin, np.array([1, 0], np.int32))
    model.set_operand_value(size, np.array([0, 3], np.int32))
    model.add_operation(Op.SLICE, [x, begin, size], [empty])
    inputs = [empty]
    for op_type, value in extra_inputs:
        index = model.add_operand(op_type)
        model.set_operand_value(index, np.asarray(value, dtype=op_type.dtype))
        inputs.append(index)
    out = model.add_operand(output_type)
    model.add_operation(code, inputs, [out])
    model.identify_inputs_and_outputs([x], [empty, out])
    model.finish()
    compilation = nnapi.Compilation(model, reference_devices())
    compilation.finish()
    execution = nnapi.Execution(compilation)
    execution.set_input(0, feed)
    empty_buffer = np.zeros(0, np.float32)
    out_buffer = np.zeros(max(output_type.element_count(), 1), np.float32)
    execution.set_output(0, empty_buffer)
    execution.set_output(1, out_buffer)
    execution.compute()
    return execution.get_output_operand_dimensions(1), out_buffer


class TestZeroSized:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)

    def test_transpose(self):
        dims, _ = _zero_sized_then(Op.TRANSPOSE, [vector([1, 0])], f32(3, 0), self.x)
        assert dims == [3, 0]

    def test_reshape_with_inferred_dimension(self):
        dims, _ = _zero_sized_then(Op.RESHAPE, [vector([3, -1])], f32(3, 0), self.x)
        assert dims == [3, 0]

    def test_concatenation_with_an_empty_input(self):
        model = nnapi.Model()
        x = model.add_operand(f32(2, 3))
        begin = model.add_operand(i32(2))
        size = model.add_operand(i32(2))
        empty = model.add_operand(f32(0, 3))
        axis = model.add_operand(INT)
        out = model.add_operand(f32(2, 3))
        model.set_operand_value(begin, np.array([0, 0], np.int32))
        model.set_operand_value(size, np.array([0, 3], np.int32))
        model.set_operand_value(axis, np.int32(0))
        model.add_operation(Op.SLICE, [x, begin, size], [empty])
        model.add_operation(Op.CONCATENATION, [empty, x, axis], [out])
        model.identify_inputs_and_outputs([x], [out])
        model.finish()
        compilation = nnapi.Compilation(model, reference_devices())
        compilation.finish()
        execution = nnapi.Execution(compilation)
        execution.set_input(0, self.x)
        result = np.zeros((2, 3), np.float32)
        execution.set_output(0, result)
        execution.compute()
        np.testing.assert_array_equal(result, self.x)

    @pytest.mark.parametrize("code", [Op.REDUCE_MAX, Op.REDUCE_SUM, Op.MEAN])
    def test_reductions_of_a_zero_sized_input_fail_as_on_android(self, code):
        # Android's CPU executor refuses a zero-sized input to MEAN and the REDUCE_*
        # operations (no allowZeroSizedInput); here REDUCE_MAX kept the empty batch and
        # MEAN over the empty axis gave NaN
        keep = (INT, 0) if code == Op.MEAN else (BOOL, False)
        for axis, out_type in ((1, f32(0)), (0, f32(3))):
            with pytest.raises(nnapi.OpFailedError, match=f"{code.name}: input 0 is zero-sized"):
                _zero_sized_then(code, [vector([axis]), keep], out_type, self.x)

    def test_gather_and_tile(self):
        dims, _ = _zero_sized_then(Op.GATHER, [scalar(1), vector([2, 0, 1, 1])], f32(0, 4), self.x)
        assert dims == [0, 4]
        dims, _ = _zero_sized_then(Op.TILE, [vector([5, 2])], f32(0, 6), self.x)
        assert dims == [0, 6]

    def test_pad_grows_an_empty_tensor(self):
        dims, out = _zero_sized_then(Op.PAD, [(i32(2, 2), [[1, 1], [0, 0]])], f32(2, 3), self.x)
        assert dims == [2, 3]
        np.testing.assert_array_equal(out, np.zeros(6))
