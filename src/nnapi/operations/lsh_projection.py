"""LSH_PROJECTION: locality-sensitive hashing of the input rows into sign bits.

Inputs: hash seeds [num_hash, num_bits] (float32 / float16), the input (rank >= 1, any
listed type; its rows are the slices along dimension 0), optional weights [rows]
(float), and the projection type (1 sparse without offsets, 2 dense, 3 sparse).

For every seed, each input row is hashed together with the seed: the key is the seed's
float32 bytes followed by the row's raw bytes, hashed with FarmHash's Fingerprint64
(as Android does), read as a signed 64-bit integer. The bit is 1 when the weighted sum
of those hash values over the rows is positive. Dense output: one 0/1 per seed;
sparse output: the num_bits bits of each hash function packed into an int32 (plus
k << num_bits for hash function k, except in the deprecated sparse type).

Fingerprint64 is implemented here in numpy (uint64 arithmetic wraps as in C), vectorized
over all keys at once: every key of one execution has the same length, so every key
takes the same branch of the hash. ``hash_keys`` runs it on any keys object with the
``_Keys`` interface whose loads support uint64 arithmetic: nnapi-ort-cpu runs it on
symbolic values that write the same arithmetic as ONNX nodes (drivers/ort/lsh.py).
"""

from __future__ import annotations

import numpy as np

from nnapi.codes import OperandCode, OperationCode
from nnapi.operations.base import ExecutionContext, Operation, Shape, ValidationContext, register
from nnapi.operations.common import FLOAT_TENSORS

# Input and output positions, as Android names them (kInputTensor, ...).
HASH_TENSOR = 0
INPUT_TENSOR = 1
WEIGHT_TENSOR = 2
TYPE_PARAM = 3

T = OperandCode
_SPARSE_DEPRECATED, _DENSE, _SPARSE = 1, 2, 3
_INPUT_TYPES = (T.TENSOR_FLOAT16, T.TENSOR_FLOAT32, T.TENSOR_INT32, T.TENSOR_QUANT8_ASYMM)

_U64 = np.uint64
_K0 = _U64(0xC3A5C85C97CB3127)
_K1 = _U64(0xB492B66FBE98F273)
_K2 = _U64(0x9AE16A3B2F90404F)


def _rotate(value: np.ndarray, shift: int) -> np.ndarray:
    """Rotate right, as FarmHash's Rotate64."""
    if shift == 0:
        return value
    return (value >> _U64(shift)) | (value << _U64(64 - shift))


def _shift_mix(value: np.ndarray) -> np.ndarray:
    return value ^ (value >> _U64(47))


def _hash_len16(u: np.ndarray, v: np.ndarray, mul: np.ndarray) -> np.ndarray:
    a = _shift_mix((u ^ v) * mul)
    b = _shift_mix((v ^ a) * mul)
    return b * mul


class _Keys:
    """A batch of equal-length byte keys [count, length] with little-endian loads."""

    def __init__(self, keys: np.ndarray):
        self.bytes = np.ascontiguousarray(keys, dtype=np.uint8)
        self.count, self.length = self.bytes.shape

    def fetch64(self, offset: int) -> np.ndarray:
        return np.ascontiguousarray(self.bytes[:, offset:offset + 8]).view("<u8")[:, 0].astype(_U64)

    def fetch32(self, offset: int) -> np.ndarray:
        return np.ascontiguousarray(self.bytes[:, offset:offset + 4]).view("<u4")[:, 0].astype(_U64)


def _len_0_to_16(k: _Keys) -> np.ndarray:
    n = k.length
    count = k.count
    if n >= 8:
        mul = _K2 + _U64(n * 2)
        a = k.fetch64(0) + _K2
        b = k.fetch64(n - 8)
        c = _rotate(b, 37) * mul + a
        d = (_rotate(a, 25) + b) * mul
        return _hash_len16(c, d, mul)
    if n >= 4:
        mul = _K2 + _U64(n * 2)
        a = k.fetch32(0)
        return _hash_len16(_U64(n) + (a << _U64(3)), k.fetch32(n - 4), mul)
    if n > 0:
        a = k.bytes[:, 0].astype(_U64)
        b = k.bytes[:, n >> 1].astype(_U64)
        c = k.bytes[:, n - 1].astype(_U64)
        y = a + (b << _U64(8))
        z = _U64(n) + (c << _U64(2))
        return _shift_mix(y * _K2 ^ z * _K0) * _K2
    return np.full(count, _K2, dtype=_U64)


def _len_17_to_32(k: _Keys) -> np.ndarray:
    n = k.length
    mul = _K2 + _U64(n * 2)
    a = k.fetch64(0) * _K1
    b = k.fetch64(8)
    c = k.fetch64(n - 8) * mul
    d = k.fetch64(n - 16) * _K2
    return _hash_len16(_rotate(a + b, 43) + _rotate(c, 30) + d, a + _rotate(b + _K2, 18) + c, mul)


def _len_33_to_64(k: _Keys) -> np.ndarray:
    n = k.length
    mul = _K2 + _U64(n * 2)
    a = k.fetch64(0) * _K2
    b = k.fetch64(8)
    c = k.fetch64(n - 8) * mul
    d = k.fetch64(n - 16) * _K2
    y = _rotate(a + b, 43) + _rotate(c, 30) + d
    z = _hash_len16(y, a + _rotate(b + _K2, 18) + c, mul)
    e = k.fetch64(16) * mul
    f = k.fetch64(24)
    g = (y + k.fetch64(n - 32)) * mul
    h = (z + k.fetch64(n - 24)) * mul
    return _hash_len16(_rotate(e + f, 43) + _rotate(g, 30) + h, e + _rotate(f + a, 18) + g, mul)


def _weak_hash_32(k: _Keys, offset: int, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    w, x, y, z = (k.fetch64(offset + 8 * i) for i in range(4))
    a = a + w
    b = _rotate(b + a + z, 21)
    c = a
    a = a + x + y
    b = b + _rotate(a, 44)
    return a + z, b + c


def _len_over_64(k: _Keys) -> np.ndarray:
    n = k.length
    count = k.count
    seed = _U64(81)
    zeros = np.zeros(count, dtype=_U64)
    x = np.full(count, seed, dtype=_U64)
    y = np.full(count, seed * _K1 + _U64(113), dtype=_U64)
    z = _shift_mix(y * _K2 + _U64(113)) * _K2
    v = (zeros, zeros)
    w = (zeros, zeros)
    x = x * _K2 + k.fetch64(0)
    end = ((n - 1) // 64) * 64
    last64 = end + ((n - 1) & 63) - 63
    # The loop runs over 64-byte blocks of the key (a fixed count for all keys).
    for s in range(0, end, 64):
        x = _rotate(x + y + v[0] + k.fetch64(s + 8), 37) * _K1
        y = _rotate(y + v[1] + k.fetch64(s + 48), 42) * _K1
        x = x ^ w[1]
        y = y + v[0] + k.fetch64(s + 40)
        z = _rotate(z + w[0], 33) * _K1
        v = _weak_hash_32(k, s, v[1] * _K1, x + w[0])
        w = _weak_hash_32(k, s + 32, z + w[1], y + k.fetch64(s + 16))
        x, z = z, x
    mul = _K1 + ((z & _U64(0xFF)) << _U64(1))
    s = last64
    w = (w[0] + _U64((n - 1) & 63), w[1])
    v = (v[0] + w[0], v[1])
    w = (w[0] + v[0], w[1])
    x = _rotate(x + y + v[0] + k.fetch64(s + 8), 37) * mul
    y = _rotate(y + v[1] + k.fetch64(s + 48), 42) * mul
    x = x ^ (w[1] * _U64(9))
    y = y + v[0] * _U64(9) + k.fetch64(s + 40)
    z = _rotate(z + w[0], 33) * mul
    v = _weak_hash_32(k, s, v[1] * mul, x + w[0])
    w = _weak_hash_32(k, s + 32, z + w[1], y + k.fetch64(s + 16))
    x, z = z, x
    return _hash_len16(_hash_len16(v[0], w[0], mul) + _shift_mix(y) * _K0 + z,
                       _hash_len16(v[1], w[1], mul) + x, mul)


def fingerprint64(keys: np.ndarray) -> np.ndarray:
    """FarmHash Fingerprint64 of each row of ``keys`` (uint8 [count, length]), as uint64."""
    return hash_keys(_Keys(keys))


def hash_keys(k: _Keys) -> np.ndarray:
    """FarmHash Fingerprint64 of ``k``'s keys: a ``_Keys`` or an object with its ``count``,
    ``length``, ``fetch64`` and ``fetch32`` (and ``bytes`` for keys shorter than 4 bytes)
    whose loads support the uint64 operators used here with numpy uint64 scalars and
    arrays of ``count`` elements."""
    with np.errstate(over="ignore"):
        if k.length <= 16:
            return _len_0_to_16(k)
        if k.length <= 32:
            return _len_17_to_32(k)
        if k.length <= 64:
            return _len_33_to_64(k)
        return _len_over_64(k)


@register(OperationCode.LSH_PROJECTION, omitted_operands=True)
class LshProjection(Operation):
    def validate(self, ctx: ValidationContext) -> None:
        ctx.check_counts(inputs=4, outputs=1)
        ctx.check_input_types([FLOAT_TENSORS, _INPUT_TYPES, FLOAT_TENSORS, T.INT32])
        ctx.check_output_type(0, T.TENSOR_INT32)
        ctx.check_input_rank(HASH_TENSOR, 2)
        if ctx.inputs[INPUT_TENSOR].rank == 0 and ctx.inputs[INPUT_TENSOR].dimensions == ():
            return  # unknown rank: checked at execution
        ctx.require(ctx.inputs[INPUT_TENSOR].rank >= 1, "input 1 must have rank at least 1")

    def _setup(self, ctx: ExecutionContext):
        ctx.require(not ctx.is_omitted(HASH_TENSOR) and not ctx.is_omitted(INPUT_TENSOR),
                    "hash and input must be present")
        hashes = ctx.input(HASH_TENSOR)
        data = ctx.input(INPUT_TENSOR)
        ctx.require(hashes.rank == 2, "hash tensor must be 2-D")
        ctx.require(hashes.shape[1] <= 32, f"at most 32 bits per hash function, got {hashes.shape[1]}")
        ctx.require(data.rank >= 1, "input must have rank at least 1")
        kind = int(ctx.scalar(TYPE_PARAM))
        ctx.require(kind in (_SPARSE_DEPRECATED, _DENSE, _SPARSE), f"unknown projection type {kind}")
        if kind == _SPARSE and hashes.shape[0] > 1:
            # the per-function offsets k << num_bits must fit the int32 signature
            needed = hashes.shape[1] + int(np.ceil(np.log2(hashes.shape[0])))
            ctx.require(needed <= 32, f"sparse signatures need {needed} bits, more than 32")
        weights = None if ctx.is_omitted(WEIGHT_TENSOR) else np.asarray(ctx.value(WEIGHT_TENSOR), dtype=np.float64)
        if weights is not None:
            ctx.require(weights.shape == (data.shape[0],),
                        f"weights must have shape [{data.shape[0]}], got {list(weights.shape)}")
        return hashes, data, weights, kind

    def prepare(self, ctx: ExecutionContext) -> list[Shape]:
        hashes, _, _, kind = self._setup(ctx)
        num_hash, num_bits = hashes.shape
        return [(num_hash * num_bits,) if kind == _DENSE else (num_hash,)]

    def execute(self, ctx: ExecutionContext) -> list[np.ndarray]:
        hashes, data, weights, kind = self._setup(ctx)
        num_hash, num_bits = hashes.shape
        rows = data.shape[0]
        seeds = np.asarray(hashes.value, dtype=np.float32).reshape(-1)
        if rows == 0 or seeds.size == 0:
            bits = np.zeros(seeds.size, dtype=np.int64)
        else:
            row_bytes = np.ascontiguousarray(data.value).reshape(rows, -1).view(np.uint8).reshape(rows, -1)
            seed_bytes = seeds.view(np.uint8).reshape(-1, 4)
            # keys[s, r] = seed s bytes ++ row r bytes
            keys = np.concatenate([np.repeat(seed_bytes[:, np.newaxis, :], rows, axis=1),
                                   np.broadcast_to(row_bytes, (seeds.size, *row_bytes.shape))], axis=2)
            signatures = fingerprint64(keys.reshape(seeds.size * rows, -1)).view(np.int64)
            values = signatures.astype(np.float64).reshape(seeds.size, rows)
            if weights is not None:
                values = values * np.asarray(weights, np.float64)
            # summed row after row in double, as Android's runningSignBit adds them: np.sum
            # (pairwise) and np.matmul add in other orders, and cancelling rows then round apart
            scores = np.add.accumulate(values, axis=1)[:, -1]
            bits = (scores > 0).astype(np.int64)
        if kind == _DENSE:
            return [bits.astype(np.int32)]
        bits = bits.reshape(num_hash, num_bits)
        weights_of_bits = np.left_shift(np.int64(1), np.arange(num_bits - 1, -1, -1, dtype=np.int64))
        signature = np.matmul(bits, weights_of_bits) if num_bits else np.zeros(num_hash, dtype=np.int64)
        if kind == _SPARSE:
            signature = signature + np.arange(num_hash, dtype=np.int64) * (np.int64(1) << num_bits)
        # int32 wrap-around, as the C++ shifts and adds do for 32-bit signatures
        return [(signature & 0xFFFFFFFF).astype(np.uint32).view(np.int32)]
