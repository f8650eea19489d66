"""Self-attention blocks recognised in a HAL subgraph, so that the ONNX lowering emits ONNX
Runtime's one com.microsoft Attention operator for the whole block.

The TFLite importer writes a transformer's attention (Keras' MultiHeadAttention, a BERT
layer) as some 16 operations: three FULLY_CONNECTED projections of one input x, each
RESHAPEd to [B, S, N, D] heads and TRANSPOSEd to [B, N, S, D] (the keys to [B, N, D, S],
or to [B, N, S, D] read by a BATCH_MATMUL with adj_y), BATCH_MATMUL of the queries and
keys, MUL by a one-value scale, a mask (SELECT of the scores or a large negative constant;
or ADD of a float bias), SOFTMAX over the keys, BATCH_MATMUL with the values and the
TRANSPOSE back to [B, S, N, D]. ORT runs those as ~14 nodes at ~0.3-0.8 us each on the
tiny models where they matter; its Attention computes the same: one GEMM of x by the three
weight matrices side by side with their biases (the projections' very products and
sums), scale * Q K^T plus the attention bias in one GEMM, a softmax over the last axis,
and the product with V, in float32 (the zoo transformer's ORT run 23.2 -> 18.2 us, its
output identical to the explicit form's).

The mask: SELECT(m, scores, c) picks c where m is false; c a constant of one value at or
below -1e30 (Keras writes -0.7 * float32's largest) or -inf. Wherever the scores it
replaces are below 1e22 in size, scores + c rounds to c itself, which makes an attention
bias of Where(m, 0, c) added to the scores the same values exactly (a fully masked row
included: all of it c either way); masked scores beyond that (inputs near float32's
limits, or an infinite score) can give other values than the explicit block (reviewer
R2). A SELECT whose mask is LOGICAL_AND(m', a constant of all true) reads m' (the AND
only broadcast it over the heads). ADD of a float bias is ORT's attention bias itself,
Expanded to [b, n, S, T] (ORT takes 1 or the full size on the first two axes only). The
matched values must be float32, every inner value read only inside the block (not a
model output), the shapes static; anything else keeps the explicit operations. Decided
once, at preparation, from constants and static shapes; a one-off probe of the installed
ONNX Runtime (``attention_runs``, per bias form) keeps the explicit operations where its
Attention does not compute the form as written. """

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from nnapi.codes import FuseCode, OperandCode, OperationCode
from nnapi.drivers.ort.builder import MS_DOMAIN, GraphBuilder, probe_form
from nnapi.hal import Model, OperandLifeTime, Operation, Subgraph
from nnapi.hal.types import constant_array

Op = OperationCode
L = OperandLifeTime
#: the ONNX operator (com.microsoft domain) a block lowers to
ATTENTION = "Attention"
#: a SELECT's constant must be at most this (or -inf): scores below 1e22 in size then
#: round away when it is added to them
_MASK_CEILING = -1e30


@dataclass
class AttentionBlock:
    """One matched block: x (the projections' input) as [batch, tokens, features], the
    heads, the projections' weights side by side ([features, 3 * hidden]) and biases, the
    scale and the mask (None; ("select", mask operand, c, picks_scores_where_true); ("add",
    bias operand)), and the root's output dims ([B, S, N, D])."""

    x: int
    batch: int
    tokens: int
    heads: int
    weights: np.ndarray
    bias: np.ndarray
    scale: float
    mask: tuple | None
    output_dims: list[int]


class _Blocks:
    def __init__(self, model: Model, subgraph: Subgraph) -> None:
        self.model, self.subgraph = model, subgraph
        self.producers = {index: op for op in subgraph.operations for index in op.outputs}
        self.readers: dict[int, list[Operation]] = {}
        for op in subgraph.operations:
            for index in dict.fromkeys(op.inputs):
                self.readers.setdefault(index, []).append(op)
        self.outputs = set(subgraph.output_indexes)

    # --- operand tests ---------------------------------------------------------------
    def dims(self, index: int) -> list[int]:
        return list(self.subgraph.operands[index].dimensions)

    def float32(self, index: int) -> bool:
        operand = self.subgraph.operands[index]
        return operand.type == OperandCode.TENSOR_FLOAT32 and bool(operand.dimensions) and all(operand.dimensions)

    def constant(self, index: int) -> np.ndarray | None:
        operand = self.subgraph.operands[index]
        if operand.lifetime not in (L.CONSTANT_COPY, L.CONSTANT_REFERENCE):
            return None
        return constant_array(self.model, operand)

    def flag(self, op: Operation, position: int, default: int) -> int | None:
        """An optional constant scalar input's value (``default`` where omitted), None where
        it is given at run time."""
        if position >= len(op.inputs) or self.subgraph.operands[op.inputs[position]].lifetime == L.NO_VALUE:
            return default
        value = self.constant(op.inputs[position])
        return None if value is None or value.size != 1 else int(value.reshape(-1)[0])

    def private(self, index: int, reader: Operation) -> bool:
        """Whether ``index`` is read by ``reader`` alone and is no model output."""
        readers = self.readers.get(index, [])
        return index not in self.outputs and len(readers) == 1 and readers[0] is reader

    def producer(self, index: int, code: int, reader: Operation) -> Operation | None:
        """The ``code`` operation writing float32 ``index``, which only ``reader`` reads."""
        op = self.producers.get(index)
        if op is None or op.type != code or not self.float32(index) or not self.private(index, reader):
            return None
        return op

    def unfused(self, op: Operation) -> bool:
        return self.flag(op, 2, -1) == FuseCode.FUSED_NONE

    # --- the block -------------------------------------------------------------------
    def heads(self, index: int, reader: Operation, perm: list[int], inner: list[Operation]
              ) -> tuple[int, np.ndarray, np.ndarray, list[int]] | None:
        """(x, weights [units, features], bias [units], [B, S, N, D]) where ``index`` is
        TRANSPOSE(perm) of RESHAPEs of FULLY_CONNECTED(x) to [B, S, N, D]."""
        transpose = self.producer(index, Op.TRANSPOSE, reader)
        if transpose is None or len(transpose.inputs) != 2:
            return None
        order = self.constant(transpose.inputs[1])
        if order is None or [int(p) for p in order.reshape(-1)] != perm:
            return None
        split = transpose.inputs[0]
        split_dims = self.dims(split)
        if len(split_dims) != 4 or not self.float32(split):
            return None
        found = [transpose]
        index, reader = split, transpose
        while (reshape := self.producer(index, Op.RESHAPE, reader)) is not None:
            found.append(reshape)
            index, reader = reshape.inputs[0], reshape
        dense = self.producer(index, Op.FULLY_CONNECTED, reader)
        if dense is None or len(dense.inputs) != 4 or not self.unfused_dense(dense):
            return None
        x = dense.inputs[0]
        weights = self.constant(dense.inputs[1])
        bias_operand = self.subgraph.operands[dense.inputs[2]]
        bias = np.zeros(len(weights), np.float32) if weights is not None and bias_operand.lifetime == L.NO_VALUE \
            else self.constant(dense.inputs[2])
        units = self.dims(index)
        if weights is None or bias is None or not self.float32(x) or len(units) != 2 or weights.ndim != 2 or \
                self.subgraph.operands[dense.inputs[1]].type != OperandCode.TENSOR_FLOAT32 or \
                bias.size != weights.shape[0] or units != [math.prod(split_dims[:2]), math.prod(split_dims[2:])] or \
                weights.shape[0] != units[1] or math.prod(self.dims(x)) != units[0] * weights.shape[1]:
            return None
        inner.extend([*found, dense])
        return x, weights.astype(np.float32), bias.reshape(-1).astype(np.float32), split_dims

    def unfused_dense(self, dense: Operation) -> bool:
        fuse = self.constant(dense.inputs[3])
        return fuse is not None and int(fuse.reshape(-1)[0]) == FuseCode.FUSED_NONE

    def match(self, softmax: Operation) -> tuple[AttentionBlock, Operation, list[Operation]] | None:
        """The block around ``softmax`` (its root, the last TRANSPOSE, and its other
        operations), or None."""
        scores = softmax.inputs[0]
        probabilities = softmax.outputs[0]
        dims = self.dims(scores)
        if len(dims) != 4 or not self.float32(scores) or len(softmax.inputs) not in (2, 3):
            return None
        beta = self.constant(softmax.inputs[1])
        if beta is None or beta.size != 1 or float(beta.reshape(-1)[0]) != 1.0 or \
                self.flag(softmax, 2, -1) not in (-1, 3):
            return None
        readers = self.readers.get(probabilities, [])
        if probabilities in self.outputs or len(readers) != 1 or readers[0].type != Op.BATCH_MATMUL:
            return None
        context = readers[0]
        if context.inputs[0] != probabilities or self.flag(context, 2, 0) != 0 or self.flag(context, 3, 0) != 0:
            return None
        inner: list[Operation] = [softmax, context]
        readers = self.readers.get(context.outputs[0], [])
        if context.outputs[0] in self.outputs or len(readers) != 1 or readers[0].type != Op.TRANSPOSE:
            return None
        root = readers[0]
        order = self.constant(root.inputs[1]) if len(root.inputs) == 2 else None
        if order is None or [int(p) for p in order.reshape(-1)] != [0, 2, 1, 3] or not self.float32(root.outputs[0]):
            return None
        # the mask and the scale, walking back from the softmax
        mask = None
        index, reader = scores, softmax
        select = self.producer(index, Op.SELECT, reader)
        add = self.producer(index, Op.ADD, reader)
        if select is not None:
            mask = self.select_mask(select, inner)
            if mask is None:
                return None
            index, reader = (select.inputs[1] if mask[3] else select.inputs[2]), select
        elif add is not None and self.unfused(add):
            for s, bias in (add.inputs[:2], add.inputs[1::-1]):
                if self.producers.get(s) is not None and self.producers[s].type in (Op.MUL, Op.BATCH_MATMUL) and \
                        self.private(s, add) and self.float32(bias) and bias != s and self.broadcasts(bias, dims):
                    mask = ("add", bias)
                    index, reader = s, add
                    inner.append(add)
                    break
            else:
                return None
        scale = 1.0
        multiply = self.producer(index, Op.MUL, reader)
        if multiply is not None:
            if not self.unfused(multiply):
                return None
            for s, c in (multiply.inputs[:2], multiply.inputs[1::-1]):
                value = self.constant(c)
                if value is not None and value.size == 1 and \
                        self.subgraph.operands[c].type == OperandCode.TENSOR_FLOAT32:
                    scale = float(value.reshape(-1)[0])
                    index, reader = s, multiply
                    inner.append(multiply)
                    break
            else:
                return None
        if scale == 0.0 or not math.isfinite(scale):  # ORT's Attention reads a scale of 0 as 1 / sqrt(D)
            return None
        product = self.producer(index, Op.BATCH_MATMUL, reader)
        if product is None or self.flag(product, 2, 0) != 0 or self.flag(product, 3, 0) not in (0, 1):
            return None
        inner.append(product)
        keys_perm = [0, 2, 1, 3] if self.flag(product, 3, 0) else [0, 2, 3, 1]
        q = self.heads(product.inputs[0], product, [0, 2, 1, 3], inner)
        k = self.heads(product.inputs[1], product, keys_perm, inner)
        v = self.heads(context.inputs[1], context, [0, 2, 1, 3], inner)
        if q is None or k is None or v is None or product.inputs[0] == product.inputs[1]:
            return None
        x = q[0]
        batch, tokens, heads, size = q[3]
        if k[0] != x or v[0] != x or k[3] != q[3] or v[3] != q[3] or dims != [batch, heads, tokens, tokens] or \
                self.dims(root.outputs[0]) != q[3] or len({id(op) for op in inner}) != len(inner):
            return None
        if mask is not None and mask[0] == "add" and not self.broadcasts(mask[1], dims):
            return None
        weights = np.concatenate([q[1].T, k[1].T, v[1].T], axis=1)
        bias = np.concatenate([q[2], k[2], v[2]])
        block = AttentionBlock(x, batch, tokens, heads, np.ascontiguousarray(weights), bias, scale, mask, q[3])
        return block, root, inner

    def broadcasts(self, index: int, dims: list[int]) -> bool:
        """Whether ``index``'s shape broadcasts to ``dims`` ([B, N, S, T]) as NNAPI's
        binary operations broadcast (right-aligned, 1 or equal)."""
        own = self.dims(index)
        return 0 < len(own) <= 4 and all(d in (1, full) for d, full in zip(own[::-1], dims[::-1]))

    def select_mask(self, select: Operation, inner: list[Operation]) -> tuple | None:
        """("select", mask, c, picks_scores_where_true) for SELECT(m, scores, c) or
        SELECT(m, c, scores) with c a constant of one value at or below -1e30 (or -inf); the
        mask seen through a LOGICAL_AND with a constant of all true."""
        condition, first, second = select.inputs
        for constant_side, picks_scores in ((second, True), (first, False)):
            value = self.constant(constant_side)
            if value is None or self.subgraph.operands[constant_side].type != OperandCode.TENSOR_FLOAT32:
                continue
            flat = value.reshape(-1)
            if flat.size == 0 or not np.all(flat == flat[0]) or not (flat[0] <= _MASK_CEILING):
                return None
            scores = first if picks_scores else second
            if self.producers.get(scores) is None or not self.private(scores, select):
                return None
            operand = self.subgraph.operands[condition]
            if operand.type != OperandCode.TENSOR_BOOL8 or not self.broadcasts(condition, self.dims(select.outputs[0])):
                return None
            inner.append(select)
            conjunction = self.producers.get(condition)
            if conjunction is not None and conjunction.type == Op.LOGICAL_AND and self.private(condition, select):
                for m, other in (conjunction.inputs, conjunction.inputs[::-1]):
                    everywhere = self.constant(other)
                    if everywhere is not None and everywhere.all() and self.broadcasts(m, self.dims(condition)) and \
                            self.subgraph.operands[m].type == OperandCode.TENSOR_BOOL8 and \
                            list(np.broadcast_shapes(tuple(self.dims(m)), everywhere.shape)) == self.dims(condition):
                        inner.append(conjunction)
                        condition = m
                        break
            return "select", condition, float(flat[0]), picks_scores
        return None


@dataclass
class AttentionBlocks:
    """What ``find_attention`` found: per root operation (by identity) its block; the
    other operations of every block, which lower to nothing."""

    roots: dict[int, AttentionBlock]
    inner: set[int]


def bias_dims(block: AttentionBlock, subgraph: Subgraph) -> tuple[int, int] | None:
    """The form of ``block``'s attention bias for attention_runs' probe (batch 2, 2 heads):
    2 where the bias runs over the batch / the heads, 1 where it broadcasts; None for a
    block without a mask. (The block's own counts would not match the probe's.)"""
    if block.mask is None:
        return None
    dims = list(subgraph.operands[block.mask[1]].dimensions)
    dims = [1] * (4 - len(dims)) + dims
    return (2 if dims[0] != 1 else 1, 2 if dims[1] != 1 else 1)


@functools.cache
def attention_runs(bias: tuple[int, int] | None) -> bool:
    """Whether the installed ONNX Runtime runs com.microsoft Attention as lower_attention
    writes it (a one-off probe: batch 2, 3 tokens, 2 heads of 2, scale 0.5; with an
    attention bias whose first two dimensions are ``bias`` when given) to within 1e-5 of
    numpy's float64 form of the same math: older releases name or broadcast that input
    otherwise. True without onnxruntime (lowering alone: nothing will load the graph)."""
    batch, tokens, heads, size = 2, 3, 2, 2
    hidden = heads * size
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (batch, tokens, hidden)).astype(np.float32)
    weights = rng.uniform(-1, 1, (hidden, 3 * hidden)).astype(np.float32)
    offsets = rng.uniform(-1, 1, 3 * hidden).astype(np.float32)
    inputs = ["x", "w", "b"]
    initializers = [numpy_helper.from_array(weights, "w"), numpy_helper.from_array(offsets, "b")]
    added = np.zeros((1, 1, tokens, tokens))
    if bias is not None:
        added = rng.uniform(-2, 2, (*bias, tokens, tokens)).astype(np.float32)
        initializers.append(numpy_helper.from_array(added, "bias"))
        inputs += ["", "", "bias"]
    node = helper.make_node(ATTENTION, inputs, ["y"], domain=MS_DOMAIN, num_heads=heads, scale=0.5)
    try:
        got = probe_form([node], initializers, {"x": x}, [("y", TensorProto.FLOAT, None)])
    except ImportError:
        return True
    if got is None:
        return False
    q, k, v = (part.reshape(batch, tokens, heads, size).transpose(0, 2, 1, 3)
               for part in np.split(x.astype(np.float64) @ weights + offsets, 3, axis=-1))
    scores = q @ k.transpose(0, 1, 3, 2) * 0.5 + added
    e = np.exp(scores - scores.max(-1, keepdims=True))
    want = ((e / e.sum(-1, keepdims=True)) @ v).transpose(0, 2, 1, 3).reshape(batch, tokens, hidden)
    return got[0].shape == want.shape and bool(np.allclose(got[0], want, rtol=1e-5, atol=1e-5))


def find_attention(model: Model, subgraph: Subgraph) -> AttentionBlocks:
    """The self-attention blocks of ``subgraph`` (see the module's docstring) that the
    installed ONNX Runtime runs as written (``attention_runs``)."""
    found = AttentionBlocks({}, set())
    if not any(op.type == Op.SOFTMAX for op in subgraph.operations):
        return found
    blocks = _Blocks(model, subgraph)
    for op in subgraph.operations:
        if op.type != Op.SOFTMAX:
            continue
        matched = blocks.match(op)
        if matched is None or not attention_runs(bias_dims(matched[0], subgraph)):
            continue
        block, root, inner = matched
        ids = {id(o) for o in inner}
        if ids & found.inner or id(root) in found.roots:
            continue
        found.roots[id(root)] = block
        found.inner.update(ids)
    return found


def lower_attention(g: GraphBuilder, block: AttentionBlock) -> str:
    """ORT's Attention for ``block``, its output as the root's [B, S, N, D]."""
    batch, tokens, heads, size = block.output_dims
    x = g.value(block.x)
    features = block.weights.shape[0]
    source = x.name
    if x.dims != [batch, tokens, features]:
        source = g.one("Reshape", [x.name, g.constant(np.array([batch, tokens, features], np.int64))])
    inputs = [source, g.constant(block.weights, "qkv_w"), g.constant(block.bias, "qkv_b")]
    if block.mask is not None:
        keys = [1, 1, tokens, tokens]
        if block.mask[0] == "select":
            _, condition, c, picks_scores = block.mask
            zeros = g.constant(np.zeros(keys, np.float32))
            fill = g.constant(np.array(c, np.float32))
            bias = g.one("Where", [g.value(condition).name, *((zeros, fill) if picks_scores else (fill, zeros))])
        else:
            value = g.value(block.mask[1])
            own = [1] * (4 - len(value.dims)) + list(value.dims)
            bias = value.name
            if own[2:] != keys[2:]:
                bias = g.one("Expand", [bias, g.constant(np.array([*own[:2], tokens, tokens], np.int64))])
            elif len(value.dims) != 4:
                bias = g.one("Reshape", [bias, g.constant(np.array(own, np.int64))])
        inputs += ["", "", bias]
    attended = g.one(ATTENTION, inputs, domain=MS_DOMAIN, num_heads=heads, scale=block.scale)
    return g.one("Reshape", [attended, g.constant(np.array(block.output_dims, np.int64))])
