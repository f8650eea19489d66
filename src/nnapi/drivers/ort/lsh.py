"""LSH_PROJECTION lowered to ONNX integer arithmetic, bit for bit the reference's (and
Android's) hashing.

Each (seed, input row) key, the seed's float32 bytes followed by the row's bytes, is hashed
with FarmHash's Fingerprint64: 64-bit multiplications, additions, shifts, rotations and
xors, which ONNX Runtime's uint64 Mul / Add / BitShift compute wrapping as C does (the
bitwise operators bit by bit: opset 17 has no BitwiseXor). The hash itself is the
reference's: ``lsh_projection.hash_keys`` runs on ``_SymbolicKeys``, whose loads are
``_U64`` values that write each operator as an ONNX node, so the graph is the reference's
arithmetic over every key at once (the key length, which picks the hash's branch, is
fixed by the shapes). The signatures are then read as
int64 and double, weighted, summed per seed and signed, as the reference does.

The key's bytes come from integer values: a constant's at preparation, a TENSOR_INT32 or
TENSOR_QUANT8_ASYMM input's by shifts and masks, float32 seeds given as a model input from
their bits, the graph input declared uint32 so that execution binds the request's bytes
as they are (Signature.of). What stays declined, and why: seeds computed in the model and
a float input given at run time (the hash reads their float32 / float16 bits, and the
driver's ONNX opset 17 has no bit cast, BitCast being opset 26; arithmetic recovers the
bits of every float but a NaN, whose payload no ONNX operator before BitCast reads);
float16 seeds given at run time (their float32 conversion's bits: not written here; a
signalling NaN is quieted by Android's hardware conversion, kept by numpy's);
inputs of unknown shape (the key length decides the hash's branch); shapes the reference
refuses at run time (more than 32 bits per hash function, sparse signatures needing more
than 32 bits, weights not one per row); an onnxruntime without exact uint64 kernels for the
hash (1.19 has no uint64 Add: found by a probe run once, _uint64_arithmetic).

The device module imports this one, which registers the lowering with ``lowering``.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from nnapi.codes import OperandCode, OperationCode
from nnapi.drivers.ort.builder import FLOATS, Declined, GraphBuilder, i64, lowers, probe_form, scalar_i64, type_name
from nnapi.drivers.ort.omitted import optional_inputs, presence
from nnapi.hal import OperandLifeTime as L
from nnapi.hal import Operation
from nnapi.operations.lsh_projection import fingerprint64, hash_keys

T = OperandCode
_SPARSE_DEPRECATED, _DENSE, _SPARSE = 1, 2, 3
#: input types whose bytes are read here (the reference takes float16 / float32 too)
_BYTES_OF = {T.TENSOR_INT32: 4, T.TENSOR_QUANT8_ASYMM: 1}
_NO_BIT_CAST = ("the hash reads its float bits, and ONNX opset 17 has no bit cast (BitCast is opset 26): "
                "no operator reads a NaN's payload")


class _U64:
    """A uint64 ONNX value being built: the operators FarmHash uses write nodes (wrapping
    as C's unsigned arithmetic); numpy uint64 scalars and arrays on either side become
    constants (``__array_ufunc__ = None`` makes numpy defer to the reflected methods).

    The driver's opset 17 has no bitwise And / Or / Xor (opset 18): those go bit by bit,
    each operand spread into its 64 bits ([..., 64] of 0 / 1, bit i by shifting it to the
    top and back), the bits combined by integer arithmetic (and: a * b, or: a + b - a * b,
    xor: a + b mod 2) and gathered back (each bit shifted to its place and the 64 added
    pairwise: the places are distinct, so the sum is their or)."""

    __array_ufunc__ = None

    def __init__(self, g: GraphBuilder, name: str) -> None:
        self.g, self.name = g, name

    def _name(self, other: Any) -> str:
        if isinstance(other, _U64):
            return other.name
        return self.g.constant(np.asarray(other, np.uint64), "u64")

    def _node(self, op_type: str, other: Any, reflected: bool = False, **attributes: Any) -> _U64:
        names = [self._name(other), self.name] if reflected else [self.name, self._name(other)]
        return _U64(self.g, self.g.one(op_type, names, **attributes))

    def _bits(self, other: Any) -> str:
        """``other``'s (or, for None, this value's) bits: [..., 64], bit i at position i."""
        g = self.g
        if not isinstance(other, _U64) and other is not None:
            value = np.asarray(other, np.uint64)[..., np.newaxis]
            return g.constant((value >> np.arange(64, dtype=np.uint64)) & np.uint64(1), "bits")
        name = self.name if other is None else other.name
        top = g.one("BitShift", [g.one("Unsqueeze", [name, i64(g, -1)]),
                                 g.constant(np.arange(63, -1, -1, dtype=np.uint64), "to_top")], direction="LEFT")
        return g.one("BitShift", [top, g.constant(np.array(63, np.uint64))], direction="RIGHT")

    def _bitwise(self, other: Any, combine: str) -> _U64:
        g = self.g
        a, b = self._bits(None), self._bits(other)
        if combine == "and":
            bits = g.one("Mul", [a, b])
        elif combine == "or":
            bits = g.one("Sub", [g.one("Add", [a, b]), g.one("Mul", [a, b])])
        else:  # xor: the sum's low bit
            low = g.one("BitShift", [g.one("Add", [a, b]), g.constant(np.array(63, np.uint64))], direction="LEFT")
            bits = g.one("BitShift", [low, g.constant(np.array(63, np.uint64))], direction="RIGHT")
        placed = g.one("BitShift", [bits, g.constant(np.arange(64, dtype=np.uint64), "places")], direction="LEFT")
        # summed by halving Adds in uint64 (ORT's int64 ReduceSum is not exact past 2**53)
        width = 64
        while width > 1:
            width //= 2
            placed = g.one("Add", [g.one("Slice", [placed, i64(g, 0), i64(g, width), i64(g, -1)]),
                                   g.one("Slice", [placed, i64(g, width), i64(g, 2 * width), i64(g, -1)])])
        return _U64(g, g.one("Squeeze", [placed, i64(g, -1)]))

    def __add__(self, other: Any) -> _U64:
        return self._node("Add", other)

    def __radd__(self, other: Any) -> _U64:
        return self._node("Add", other, reflected=True)

    def __mul__(self, other: Any) -> _U64:
        return self._node("Mul", other)

    def __rmul__(self, other: Any) -> _U64:
        return self._node("Mul", other, reflected=True)

    def __xor__(self, other: Any) -> _U64:
        return self._bitwise(other, "xor")

    __rxor__ = __xor__

    def __or__(self, other: Any) -> _U64:
        return self._bitwise(other, "or")

    __ror__ = __or__

    def __and__(self, other: Any) -> _U64:
        return self._bitwise(other, "and")

    __rand__ = __and__

    def __lshift__(self, other: Any) -> _U64:
        return self._node("BitShift", other, direction="LEFT")

    def __rshift__(self, other: Any) -> _U64:
        return self._node("BitShift", other, direction="RIGHT")


class _SymbolicKeys:
    """``count`` keys of ``length`` bytes, uint64 [count, length] value ``keys`` (one byte
    per element), with the little-endian loads of the reference's ``_Keys`` as ``_U64``s:
    every window of 8 (4) bytes is assembled once by adding its shifted bytes (disjoint
    bits: their or), a load gathers one."""

    def __init__(self, g: GraphBuilder, keys: str, count: int, length: int) -> None:
        self.g, self.keys, self.count, self.length = g, keys, count, length
        self._windows: dict[int, str] = {}

    def _window(self, size: int) -> str:
        if size not in self._windows:
            g, span = self.g, self.length - size + 1
            total = None
            for k in range(size):
                part = g.one("Slice", [self.keys, i64(g, k), i64(g, k + span), i64(g, 1)])
                if k:
                    part = g.one("BitShift", [part, g.constant(np.array(8 * k, np.uint64))], direction="LEFT")
                total = part if total is None else g.one("Add", [total, part])  # disjoint bytes: their or
            self._windows[size] = total
        return self._windows[size]

    def _load(self, size: int, offset: int) -> _U64:
        return _U64(self.g, self.g.one("Gather", [self._window(size), self.g.constant(np.array(offset, np.int64))],
                                       axis=1))

    def fetch64(self, offset: int) -> _U64:
        return self._load(8, offset)

    def fetch32(self, offset: int) -> _U64:
        return self._load(4, offset)


class _ProbeBuilder:
    """The two GraphBuilder methods _U64 and _SymbolicKeys use, for the kernel probe."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []

    def constant(self, array: np.ndarray, hint: str = "c") -> str:
        name = f"{hint}_{len(self.initializers)}"
        self.initializers.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def one(self, op_type: str, inputs: list[str], **attributes: Any) -> str:
        name = f"t_{len(self.nodes)}"
        self.nodes.append(helper.make_node(op_type, inputs, [name], **attributes))
        return name


@functools.cache
def _uint64_arithmetic() -> bool:
    """Whether the installed ONNX Runtime computes this lowering's uint64 arithmetic as
    C does (its Add, Mul, Sub, BitShift and Cast kernels on uint64: 1.19 has no uint64 Add),
    proven once on keys of every byte value through the longest branch of the hash, and
    the casts between int32, int64, uint64 and double this lowering uses."""
    keys = (np.arange(3 * 70, dtype=np.uint64) * np.uint64(97) % np.uint64(256)).astype(np.uint8).reshape(3, 70)
    words = np.array([-1, 0, 2**31 - 1, -2**31], np.int32)
    g = _ProbeBuilder()
    hashed = hash_keys(_SymbolicKeys(g, g.one("Cast", ["keys"], to=TensorProto.UINT64), 3, 70))
    widened = g.one("Cast", [g.one("Cast", ["words"], to=TensorProto.INT64)], to=TensorProto.UINT64)
    doubled = g.one("Cast", [g.one("Cast", [hashed.name], to=TensorProto.INT64)], to=TensorProto.DOUBLE)
    outputs = [(hashed.name, TensorProto.UINT64, [3]), (widened, TensorProto.UINT64, [4]),
               (doubled, TensorProto.DOUBLE, [3])]
    try:
        import onnxruntime  # noqa: F401
    except ImportError:  # lowering without a runtime (nothing will load the graph here)
        return True
    got = probe_form(g.nodes, g.initializers, {"keys": keys, "words": words}, outputs)
    if got is None:
        return False
    expected = fingerprint64(keys)
    return (np.array_equal(got[0], expected) and np.array_equal(got[1], words.astype(np.int64).astype(np.uint64))
            and np.array_equal(got[2], expected.view(np.int64).astype(np.float64)))


def _row_bytes(g: GraphBuilder, index: int, rows: int, row_bytes: int) -> str:
    """Input ``index``'s rows as their bytes, uint64 [rows, row_bytes], little-endian."""
    operand = g.operand(index)
    raw = g.raw_constant(index)
    if raw is not None:
        data = np.ascontiguousarray(raw).reshape(rows, -1).view(np.uint8).reshape(rows, row_bytes)
        return g.constant(data.astype(np.uint64), "row_bytes")
    if operand.type not in _BYTES_OF:
        if operand.type in FLOATS:
            raise Declined(f"LSH_PROJECTION's input given at run time is {type_name(operand.type)}: {_NO_BIT_CAST}")
        raise Declined(f"LSH_PROJECTION's input of type {type_name(operand.type)} is not supported")
    width = _BYTES_OF[operand.type]
    value = g.value(index).name
    if width == 1:
        return g.one("Cast", [g.one("Reshape", [value, i64(g, rows, row_bytes)])], to=TensorProto.UINT64)
    # int32 -> int64 (exact) -> uint64 (modulo 2**64): bits 0..31 are the int32's own
    words = g.one("Cast", [g.one("Cast", [g.one("Reshape", [value, i64(g, rows, row_bytes // 4, 1)])],
                                 to=TensorProto.INT64)], to=TensorProto.UINT64)
    # byte k of each word: shifted to the top 8 bits, then down to the bottom 8
    top = g.one("BitShift", [words, g.constant(np.array([56, 48, 40, 32], np.uint64))], direction="LEFT")
    octets = g.one("BitShift", [top, g.constant(np.array(56, np.uint64))], direction="RIGHT")  # [rows, words, 4]
    return g.one("Reshape", [octets, i64(g, rows, row_bytes)])


def _seed_bits(g: GraphBuilder, operation: Operation, index: int) -> str:
    """The bits of float32 seeds given at run time: the model input's graph input declared
    uint32 instead, so that execution binds the request's bytes as they are (Signature.of)
    and no bit cast is needed. Only for seeds that are a
    model input read by this operation alone (a computed float has no bits ONNX opset 17
    can read: no bit cast, BitCast being opset 26; another reader would need the float)."""
    operand = g.operand(index)
    if operand.lifetime != L.SUBGRAPH_INPUT:
        raise Declined(f"LSH_PROJECTION's seeds are computed at run time: {_NO_BIT_CAST}")
    if operand.type != T.TENSOR_FLOAT32:
        # their float32 bits would be a float16 -> float32 conversion of bits, not written here
        # (a signalling NaN: Android's hardware conversion quiets it, numpy's, the reference's, not)
        raise Declined("LSH_PROJECTION's float16 seeds given at run time are not lowered: the hash reads the bits "
                       "of their float32 conversion")
    if [reader is operation for reader in g.readers(index)] != [True] or index in g.subgraph.output_indexes:
        raise Declined("LSH_PROJECTION's seeds given at run time must be read by it alone (their bytes are bound "
                       f"as integers): {_NO_BIT_CAST}")
    name = f"in_{index}"
    for value in g.inputs:
        if value.name == name:  # declared float32 by lower_model, and read by no node yet
            value.type.tensor_type.elem_type = TensorProto.UINT32
            break
    else:  # (a support query, whose builder makes inputs as it reads them)
        g.inputs.append(helper.make_tensor_value_info(name, TensorProto.UINT32, operand.dimensions))
    g.values.pop(index, None)
    return name


def _float32_bytes(g: GraphBuilder, bits: str) -> str:
    """The bytes of float32 seeds given as their bits (uint32 [h, b]): uint64 [h * b, 1, 4],
    little-endian."""
    words = g.one("Cast", [g.one("Reshape", [bits, i64(g, -1, 1, 1)])], to=TensorProto.UINT64)
    top = g.one("BitShift", [words, g.constant(np.array([56, 48, 40, 32], np.uint64))], direction="LEFT")
    return g.one("BitShift", [top, g.constant(np.array(56, np.uint64))], direction="RIGHT")


def _packed(g: GraphBuilder, bits: str, kind: int, num_hash: int, num_bits: int) -> str:
    """The int32 output of the 0/1 ``bits`` (int64 [num_hash * num_bits]): dense as they
    are, sparse packed per hash function (first bit highest), plus k << num_bits for
    function k (type 3), wrapped to int32 as C's int32 shifts are."""
    if kind == _DENSE:
        return g.one("Cast", [bits], to=TensorProto.INT32)
    weights = np.left_shift(np.int64(1), np.arange(num_bits - 1, -1, -1, dtype=np.int64))
    # (below 2**32: exact in ORT's int64 ReduceSum, which is not past 2**53)
    signature = g.one("ReduceSum", [g.one("Mul", [g.one("Reshape", [bits, i64(g, num_hash, num_bits)]),
                                                  g.constant(weights)]), i64(g, 1)], keepdims=0)
    if kind == _SPARSE:
        signature = g.one("Add", [signature, g.constant(np.arange(num_hash, dtype=np.int64) << num_bits)])
    # below 2**32 (checked): the int32 of the same 32 bits, without a narrowing Cast's overflow
    high = g.one("GreaterOrEqual", [signature, g.constant(np.array(1 << 31, np.int64))])
    wrapped = g.one("Where", [high, g.one("Sub", [signature, g.constant(np.array(1 << 32, np.int64))]), signature])
    return g.one("Cast", [wrapped], to=TensorProto.INT32)


@lowers(OperationCode.LSH_PROJECTION)
def lower_lsh_projection(g: GraphBuilder, operation: Operation) -> None:
    """LSH_PROJECTION as the reference computes it (lsh_projection.py): per seed, the
    Fingerprint64 of each (seed, row) key read as int64 and double, weighted by the rows'
    weights (where given) and summed; the bit is whether the sum is positive."""
    hash_index, input_index, weight_index, type_index = operation.inputs[:4]
    if not _uint64_arithmetic():
        raise Declined("this onnxruntime has no exact uint64 Add / Mul / Sub / BitShift / Cast kernels for the hash "
                       "(1.19 has no uint64 Add)")
    kind = int(g.scalar(type_index))
    if kind not in (_SPARSE_DEPRECATED, _DENSE, _SPARSE):
        raise Declined(f"LSH_PROJECTION's projection type {kind} is not 1, 2 or 3")
    hashes = g.operand(hash_index)
    seeds_raw = g.raw_constant(hash_index)
    if len(hashes.dimensions) != 2 or not all(hashes.dimensions):
        raise Declined("LSH_PROJECTION needs the hash tensor's shape [num_hash, num_bits]")
    num_hash, num_bits = hashes.dimensions
    if num_bits > 32:
        raise Declined(f"LSH_PROJECTION takes at most 32 bits per hash function, not {num_bits}")
    if kind == _SPARSE and num_hash > 1 and num_bits + int(np.ceil(np.log2(num_hash))) > 32:
        raise Declined("LSH_PROJECTION's sparse signatures would need more than 32 bits")
    seed_bits = None if seeds_raw is not None else _seed_bits(g, operation, hash_index)
    data = g.operand(input_index)
    if not data.dimensions or not all(data.dimensions):
        raise Declined("LSH_PROJECTION needs its input's shape (the key length decides the hash's branch)")
    rows = data.dimensions[0]
    row_bytes = int(np.prod(data.dimensions[1:], dtype=np.int64)) * _BYTES_OF.get(
        data.type, np.dtype(np.float16 if data.type == T.TENSOR_FLOAT16 else np.float32).itemsize)
    # (None: a model input a request may omit, in a support query: the pattern with it
    # lowers wherever the one without does, which only leaves out the Mul)
    weighted = presence(g, weight_index) is not False
    if weighted and g.operand(weight_index).dimensions != [rows]:
        raise Declined(f"LSH_PROJECTION's weights must have shape [{rows}]")
    seed_count = num_hash * num_bits
    count = seed_count * rows
    keys = _row_bytes(g, input_index, rows, row_bytes)
    if seed_bits is None:
        seeds = np.asarray(seeds_raw, np.float32).reshape(-1)
        seed_bytes = g.constant(seeds.view(np.uint8).reshape(-1, 1, 4).astype(np.uint64), "seed_bytes")
    else:
        seed_bytes = _float32_bytes(g, seed_bits)
    # keys[seed, row] = the seed's 4 bytes, then the row's
    keys = g.one("Concat", [g.one("Expand", [seed_bytes, i64(g, seed_count, rows, 4)]),
                            g.one("Expand", [g.one("Unsqueeze", [keys, i64(g, 0)]),
                                             i64(g, seed_count, rows, row_bytes)])], axis=2)
    keys = g.one("Reshape", [keys, i64(g, count, 4 + row_bytes)])
    signatures = hash_keys(_SymbolicKeys(g, keys, count, 4 + row_bytes))
    values = g.one("Cast", [g.one("Cast", [g.one("Reshape", [signatures.name, i64(g, seed_count, rows)])],
                                  to=TensorProto.INT64)], to=TensorProto.DOUBLE)
    if weighted:
        weights = g.one("Cast", [g.value(weight_index).name], to=TensorProto.DOUBLE)
        values = g.one("Mul", [values, weights])
    # summed row after row, as Android adds them: ORT's CumSum adds each slice along the axis
    # to the sum of those before it, where ReduceSum adds in another order (cancelling rows
    # then round apart); its last column is the sum
    sums = g.one("CumSum", [values, scalar_i64(g, 1)])
    scores = g.one("Reshape", [g.one("Slice", [sums, i64(g, rows - 1), i64(g, rows), i64(g, 1)]), i64(g, seed_count)])
    bits = g.one("Cast", [g.one("Greater", [scores, g.constant(np.array(0.0, np.float64))])], to=TensorProto.INT64)
    g.set_output(operation.outputs[0], _packed(g, bits, kind, num_hash, num_bits))


# the weights are optional: omitted for the sparse types, a request may omit a model input there
optional_inputs(OperationCode.LSH_PROJECTION, (2,))
