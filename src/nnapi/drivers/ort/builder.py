"""The lowering's shared core: the ONNX graph builder (``GraphBuilder``, ``Value``), the registry
of operation lowerings (``lowers``, ``lower_operation``) and what every family of lowerings
uses (internal encodings and zero points, layout (channel padding: channel_padding.py), fused activations,
convolution parameters, run-time checks, probes of the installed ONNX Runtime).

Every HAL operand becomes an ONNX value in an *internal encoding* chosen so that ONNX
Runtime's fast kernels apply and the real values are unchanged:

- TENSOR_FLOAT32 and TENSOR_FLOAT16 are float32 inside (as Android's CPU driver computes
  float16 in float32); float16 model inputs and outputs are cast at the graph's edges.
  Unlike that driver, float16 values between two operations stay float32 (a round trip
  per operation would cost two Casts): each operation is within the CTS tolerance,
  and a chain that magnifies one-ulp differences (EXP into SIN) may differ from the
  reference's further, which ``nnapi fuzz`` reports as ill-conditioned.
- TENSOR_QUANT8_ASYMM is uint8 with its zero point; TENSOR_QUANT8_ASYMM_SIGNED is
  re-expressed as uint8 with zero point + 128 (q + 128 has the same real value, exactly),
  which is the form ORT's x86 QLinear kernels are fastest on.
- TENSOR_INT32 and TENSOR_BOOL8 are themselves, and so are TENSOR_QUANT16_ASYMM boxes
  (uint16; the detection operations' boxes, scale 0.125: detection.py).
- TENSOR_QUANT8_SYMM_PER_CHANNEL (and TENSOR_QUANT8_SYMM) given at run time are int8, as
  stored (zero point 0): weights, read only by the operations that take them.

NNAPI's NHWC layout becomes Transpose -> NCHW operator -> Transpose; ORT's transpose
optimizer cancels the pairs between consecutive operators. Fused activations become
Relu / Clip (float) or a Clip on the quantized values (quantized), which ORT fuses or,
when the clamp is the quantized range itself, is left out.

Each operation's lowering (in a module per family of operations, which lowering.py
imports, or in one of the modules device.py imports) registers itself with ``lowers`` and
raises ``Declined(reason)`` for anything ONNX cannot express exactly; the device asks the
same functions whether it supports an operation, so what it claims and what it can lower
never disagree.
"""

from __future__ import annotations

import functools
import math
import operator
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from nnapi.codes import FuseCode, OperandCode, OperationCode, PaddingCode
from nnapi.drivers.ort.versions import onnxruntime_at_least
from nnapi.hal import Model, Operand, OperandLifeTime, Operation, Subgraph
from nnapi.hal.types import constant_array
from nnapi.operations.common import activation_bounds_float, activation_bounds_quantized, implicit_padding

T = OperandCode
L = OperandLifeTime
OPSET = 17
MS_DOMAIN = "com.microsoft"

FLOATS = (T.TENSOR_FLOAT32, T.TENSOR_FLOAT16)
QUANT8 = (T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT8_ASYMM_SIGNED)
#: operand types with an internal encoding as activations (the 8-bit symmetric weight types have
#: one only as an operation's weights or DEQUANTIZE's input: their own int8 values)
ACTIVATION_TYPES = (*FLOATS, *QUANT8, T.TENSOR_INT32, T.TENSOR_BOOL8, T.TENSOR_QUANT16_ASYMM)
NHWC_TO_NCHW = [0, 3, 1, 2]
NCHW_TO_NHWC = [0, 2, 3, 1]
#: ORT runs float convolutions in a blocked layout (NCHWc) and keeps a tensor in it between
#: operators it has blocked kernels for (Conv, pooling, Add, Relu, Concat, ...) when the
#: channel count is a multiple of the block: 16 with AVX-512 (8 with AVX2). Any other
#: operator costs a reorder out of the layout and one back in, about a pass each.
NCHWC_BLOCK = 16
#: consumers that reorder their input into NCHWc themselves (no anchor needed before them)
_BLOCKED_CONSUMERS = (OperationCode.CONV_2D, OperationCode.DEPTHWISE_CONV_2D, OperationCode.MAX_POOL_2D,
                      OperationCode.AVERAGE_POOL_2D)


class Declined(Exception):
    """An operation (or operand) this device does not run; the message says why."""


@dataclass
class Value:
    """An operand as an ONNX value: its name, internal element type and (for uint8) the
    scale and internal zero point; ``const`` holds a constant's internal-encoded array."""

    name: str
    kind: str  # "float", "uint8", "int32", "bool", "uint16", "int8" (8-bit symmetric weights), "int16"
    dims: list[int]
    scale: float = 0.0
    zero_point: int = 0
    const: np.ndarray | None = None

    @property
    def rank(self) -> int:
        return len(self.dims)


#: the ONNX element type of each internal kind (``Value.kind``)
KIND_ELEM = {"float": TensorProto.FLOAT, "uint8": TensorProto.UINT8, "int32": TensorProto.INT32,
              "bool": TensorProto.BOOL, "uint16": TensorProto.UINT16, "int8": TensorProto.INT8,
              "int16": TensorProto.INT16}
HAL_ELEM = {T.TENSOR_FLOAT32: TensorProto.FLOAT, T.TENSOR_FLOAT16: TensorProto.FLOAT16,
             T.TENSOR_QUANT8_ASYMM: TensorProto.UINT8, T.TENSOR_QUANT8_ASYMM_SIGNED: TensorProto.INT8,
             T.TENSOR_INT32: TensorProto.INT32, T.TENSOR_BOOL8: TensorProto.BOOL,
             T.TENSOR_QUANT16_ASYMM: TensorProto.UINT16,
             T.TENSOR_QUANT8_SYMM_PER_CHANNEL: TensorProto.INT8, T.TENSOR_QUANT8_SYMM: TensorProto.INT8,
             T.TENSOR_QUANT16_SYMM: TensorProto.INT16}


def internal_kind(code: int) -> str:
    if code in FLOATS:
        return "float"
    if code in QUANT8:
        return "uint8"
    if code == T.TENSOR_INT32:
        return "int32"
    if code == T.TENSOR_BOOL8:
        return "bool"
    if code == T.TENSOR_QUANT16_ASYMM:
        return "uint16"
    if code in (T.TENSOR_QUANT8_SYMM_PER_CHANNEL, T.TENSOR_QUANT8_SYMM):
        return "int8"
    if code == T.TENSOR_QUANT16_SYMM:
        return "int16"  # its stored integers (QUANTIZED_16BIT_LSTM's cell state)
    raise Declined(f"{type_name(code)} operands are not supported")


#: the first ONNX Runtime release with an int16 Add on the CPU (pyproject accepts 1.16 on)
INT16_ADD_VERSION = (1, 21)


def probe_outputs(graph: onnx.GraphProto, feeds: dict[str, np.ndarray] | None = None) -> list[np.ndarray] | None:
    """A one-off probe of the installed ONNX Runtime (at preparation or first use, cached
    by its caller): ``graph`` loaded into a single-threaded CPU session with the options
    of the device's own sessions (session.py: the same kernels and graph optimizations)
    and, with ``feeds``, run once. Its outputs (none when only loaded), or None where
    onnxruntime refuses the graph or fails running it. Raises ImportError without
    onnxruntime: each caller says what a lowering without a runtime assumes."""
    import onnxruntime

    from nnapi.drivers.ort.session import disabled_optimizers, session_options

    try:
        model = onnx_model(graph, any(node.domain == MS_DOMAIN for node in graph.node))
        session = onnxruntime.InferenceSession(model.SerializeToString(), session_options(threads=1),
                                               providers=["CPUExecutionProvider"],
                                               disabled_optimizers=disabled_optimizers(graph))
        return [] if feeds is None else list(session.run(None, feeds))
    except Exception:  # noqa: BLE001 - any refusal or failure: the form cannot be trusted here
        return None


def probe_form(nodes: Iterable[onnx.NodeProto], initializers: Iterable[onnx.TensorProto],
               feeds: dict[str, np.ndarray], outputs: Sequence[tuple[str, int, Sequence[int] | None]]
               ) -> list[np.ndarray] | None:
    """A candidate ONNX form proven at preparation: ``nodes`` (reading ``initializers`` and the
    ``feeds``: every stored value of an 8-bit input, or every pair of two) as a probe graph
    whose inputs are the feeds (their element types and shapes) and whose outputs are
    ``outputs`` (name, ONNX element type, dimensions or None), run once by probe_outputs.
    Its outputs, for the caller to compare with the reference's values; None where
    onnxruntime refuses or fails it, or is absent (a lowering without a runtime): each
    caller then keeps the form it knows to be the reference's."""
    graph = helper.make_graph(
        list(nodes), "probe",
        [helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(value.dtype), list(value.shape))
         for name, value in feeds.items()],
        [helper.make_tensor_value_info(name, element, None if dims is None else list(dims))
         for name, element, dims in outputs],
        list(initializers))
    try:
        return probe_outputs(graph, feeds)
    except ImportError:
        return None


def int16_add_supported() -> bool:
    """Whether the installed ONNX Runtime runs Add on int16 and uint8 (1.21 on): older ones
    refuse to load a graph with either (NOT_IMPLEMENTED), which was every int8-input model."""
    return onnxruntime_at_least(INT16_ADD_VERSION)


def onnx_model(graph: onnx.GraphProto, ms_domain: bool = False, **attributes: Any) -> onnx.ModelProto:
    """``graph`` as a model of this lowering's opset (and the com.microsoft domain where
    asked) at IR version 8, which every onnxruntime pyproject accepts loads."""
    opsets = [helper.make_opsetid("", OPSET)]
    if ms_domain:
        opsets.append(helper.make_opsetid(MS_DOMAIN, 1))
    model = helper.make_model(graph, opset_imports=opsets, **attributes)
    model.ir_version = 8
    return model


@functools.cache
def has_kernel(op_type: str, element: int, **attributes: Any) -> bool:
    """Whether the installed ONNX Runtime has a CPU kernel for ``op_type`` on a 4-d tensor of
    ONNX element type ``element``: a one-node graph is loaded once per process (older
    releases lack some 8-bit kernels: uint8 SpaceToDepth before 1.28, DepthToSpace and
    ArgMin before 1.20, and refuse a graph with one, NOT_IMPLEMENTED)."""
    graph = helper.make_graph([helper.make_node(op_type, ["x"], ["y"], **attributes)], "probe",
                              [helper.make_tensor_value_info("x", element, None)],
                              [helper.make_empty_tensor_value_info("y")])  # its type: the operator's
    try:
        return probe_outputs(graph) is not None
    except ImportError:  # lowering without a runtime (nothing will load the graph here)
        return True


def internal_zero_point(operand: Operand) -> int:
    return operand.zero_point + 128 if operand.type == T.TENSOR_QUANT8_ASYMM_SIGNED else operand.zero_point


def type_name(code: int) -> str:
    """Operand type ``code``'s name for a Declined message (a number the enum lacks: said so)."""
    try:
        return OperandCode(code).name
    except ValueError:
        return f"operand type {code}"


def f32(g: GraphBuilder, value: float) -> str:
    """A float32 scalar constant of ``g`` holding ``value``."""
    return g.constant(np.array(value, np.float32))


def i64(g: GraphBuilder, *values: int) -> str:
    """An int64 constant of ``g`` holding ``values`` (a 1-D tensor: axes, shapes, slice bounds)."""
    return g.constant(np.array(values, np.int64))


def scalar_i64(g: GraphBuilder, value: int) -> str:
    """An int64 scalar constant of ``g`` holding ``value``."""
    return g.constant(np.array(value, np.int64))


def middle_axes_sums(g: GraphBuilder, name: str, dims: Sequence[int], zero_point: int = 0) -> str:
    """The int32 sums of an 8-bit [N, M..., C] value ``name`` (uint8 internal values, less
    ``zero_point``) over its middle axes, shaped [N, 1, C]: a MatMulInteger of a row of ones
    with each batch's [M, C] matrix, exact, the 8-bit values read once in their own layout."""
    batch, middle, channels = dims[0], int(np.prod(dims[1:-1])), dims[-1]
    rows = g.one("Reshape", [name, g.constant(np.array([batch, middle, channels], np.int64))])
    return g.one("MatMulInteger", [g.constant(np.ones((1, middle), np.uint8), "ones"), rows,
                                   g.constant(np.array(0, np.uint8)), g.constant(np.array(zero_point, np.uint8))])


class GrowingIndex:
    """Lookups over one of a builder's growing lists (its nodes, its initializers), brought
    up to date when asked by indexing only what changed since the last time, where a dict
    built over the whole list at every query cost a pass over the graph per query
    (requantizing_quantize's chain QUANTIZEs: ~65 of ~190 ms CPU lowering a synthetic PT2E-like
    graph of 1,274 nodes and 180 such QUANTIZEs).

    The items indexed are compared with the list by identity (a pass at C speed); from the
    first that was removed or replaced on (a lowering that drops or moves nodes:
    requantizing_quantize._swish, elementwise._clamp_into_conv) the entries are dropped and
    the list's items from there indexed again, since a stale entry would name a node no
    longer in the graph. Where two items ever gave one key, such a change rebuilds the whole
    index instead (the earlier item's entry would have to come back). An item edited in
    place (a node's outputs renamed) is not seen: no lowering does that before the graph is
    complete (lowering._drop_output_identities runs after every operation's lowering)."""

    def __init__(self, keys: Callable[[Any], Iterable[str]]) -> None:
        self._keys = keys
        self._indexed: list[Any] = []
        self._keys_of: list[tuple[str, ...]] = []  # each indexed item's keys, as indexed
        self._shadowed = False  # whether two items ever gave one key
        #: each key -> the last item giving it (as a dict built over the whole list holds it)
        self.by_key: dict[str, Any] = {}
        #: id(item) -> its position in the list
        self.position: dict[int, int] = {}

    def of(self, items: list[Any]) -> GrowingIndex:
        """This index brought up to date with ``items`` (the list it indexes)."""
        indexed = self._indexed
        if len(items) < len(indexed) or not all(map(operator.is_, items, indexed)):
            self._drop_from(next((i for i, (item, old) in enumerate(zip(items, indexed)) if item is not old),
                                 min(len(items), len(indexed))))
        for position in range(len(indexed), len(items)):
            item = items[position]
            keys = tuple(self._keys(item))
            for key in keys:
                self._shadowed = self._shadowed or key in self.by_key
                self.by_key[key] = item
            self.position[id(item)] = position
            indexed.append(item)
            self._keys_of.append(keys)
        return self

    def _drop_from(self, start: int) -> None:
        """Forget the items indexed from position ``start`` on (all of them where a key was
        ever given twice)."""
        if self._shadowed:
            start, self._shadowed = 0, False
            self.by_key.clear()
            self.position.clear()
        else:
            for item, keys in zip(self._indexed[start:], self._keys_of[start:]):
                for key in keys:
                    del self.by_key[key]
                del self.position[id(item)]
        del self._indexed[start:]
        del self._keys_of[start:]


class GraphBuilder:
    """Accumulates nodes and initializers for one subgraph; ``value(i)`` is operand i."""

    def __init__(self, model: Model, subgraph: Subgraph, isolated: bool = False) -> None:
        self.model = model
        self.subgraph = subgraph
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.values: dict[int, Value] = {}
        self.uses_ms_domain = False
        #: operands computed with their channels padded (float: to the NCHWc block, see
        #: channel_padding.py; 8-bit: around depthwise layers, padded_depthwise.py): name, channels
        self.padded: dict[int, tuple[str, int]] = {}
        #: float convolutions without an activation, by output operand: their Conv node and
        #: the Transpose back to NHWC after it (a clamped ADD may take them over: _clamp_into_conv)
        self.convolutions: dict[int, tuple[onnx.NodeProto, onnx.NodeProto]] = {}
        #: float32 operands a DEQUANTIZE computes, by index: the quantized value it reads
        self.dequantized: dict[int, Value] = {}
        #: float32 MEANs computed from the 8-bit values' exact sums (_integer_mean), by index
        self.integer_means: set[int] = set()
        #: REDUCE_MAX outputs lowered as GlobalMaxPool (small_graphs.py) -> its [N, C, 1, 1] value
        self.pooled: dict[int, str] = {}
        #: operations (by id) that an earlier lowering computed along with its own (a chain
        #: lowered as one: quantized_resize.py): their own lowering is skipped
        self.covered: set[int] = set()
        self._count = 0
        self._constants: dict[tuple, str] = {}
        #: a uint8 value shift_signed made from an int8 one -> that int8 value
        self._signed_sources: dict[str, str] = {}
        # isolated: operands produced elsewhere are treated as inputs (for support queries)
        self.isolated = isolated
        #: prefix of every name made here: a nested graph's (control_flow.py) differ from its scope's
        self.prefix = ""
        #: the name of the operation being lowered (what a failed run-time check names)
        self.lowering = ""
        self._node_index = GrowingIndex(lambda node: node.output)
        self._initializer_index = GrowingIndex(lambda tensor: (tensor.name,))

    def nested(self, subgraph: Subgraph, hint: str) -> GraphBuilder:
        """A builder for a graph nested in this one (an If branch, a Loop body) lowering
        ``subgraph``: its own nodes and initializers, its names prefixed so that no scope
        reuses a name of another."""
        child = GraphBuilder(self.model, subgraph, isolated=self.isolated)
        child.prefix = f"{self.fresh(hint)}_"
        return child

    def readers(self, index: int) -> list[Operation]:
        """The subgraph's operations that read operand ``index`` (each once, in order)."""
        return self._readers.get(index, [])

    @functools.cached_property
    def ranges(self) -> dict:
        """The bounds value_ranges.py proves for the subgraph's int32, float32 and boolean
        operands, by index (none for an isolated builder: its operands' producers are not
        lowered with it)."""
        from nnapi.drivers.ort.value_ranges import operand_ranges

        return {} if self.isolated else operand_ranges(self.model, self.subgraph)

    def producer(self, index: int) -> Operation | None:
        """The subgraph's operation that writes operand ``index`` (None for an input or a constant)."""
        return self._producers.get(index)

    def position(self, operation: Operation) -> int:
        """``operation``'s place among the subgraph's operations (their order of execution)."""
        return self._positions[id(operation)]

    @functools.cached_property
    def _positions(self) -> dict[int, int]:
        return {id(operation): n for n, operation in enumerate(self.subgraph.operations)}

    @functools.cached_property
    def _producers(self) -> dict[int, Operation]:
        return {index: operation for operation in self.subgraph.operations for index in operation.outputs}

    @functools.cached_property
    def _readers(self) -> dict[int, list[Operation]]:
        readers: dict[int, list[Operation]] = {}
        for operation in self.subgraph.operations:
            for index in dict.fromkeys(operation.inputs):
                readers.setdefault(index, []).append(operation)
        return readers

    def node_index(self) -> GrowingIndex:
        """The nodes emitted so far: ``by_key`` the node writing each name (the last, where
        two do), ``position`` each node's place in ``nodes`` (by id). Up to date until more
        nodes are emitted or moved: ask again then."""
        return self._node_index.of(self.nodes)

    def initializer_index(self) -> GrowingIndex:
        """The initializers made so far by name (``by_key``), up to date until more are made."""
        return self._initializer_index.of(self.initializers)

    # --- names, constants, nodes ---------------------------------------------------------
    def fresh(self, hint: str = "t") -> str:
        self._count += 1
        return f"{self.prefix}{hint}_{self._count}"

    def constant(self, array: np.ndarray, hint: str = "c") -> str:
        array = np.asarray(array)
        if not array.flags.c_contiguous:
            array = array.copy()  # (np.ascontiguousarray would make a scalar 1-d)
        key = (array.dtype.str, array.shape, array.tobytes()) if array.size <= 16 else None
        if key is not None and key in self._constants:
            return self._constants[key]
        name = self.fresh(hint)
        if not self.isolated:  # a support query only needs the graph's shape, not the bytes
            self.initializers.append(numpy_helper.from_array(array, name))
        if key is not None:
            self._constants[key] = name
        return name

    def node(self, op_type: str, inputs: list[str], outputs: int | list[str] = 1, domain: str = "",
             name: str | None = None, **attributes: Any) -> list[str]:
        names = [self.fresh(op_type.lower()) for _ in range(outputs)] if isinstance(outputs, int) else outputs
        if domain == MS_DOMAIN:
            self.uses_ms_domain = True
        self.nodes.append(helper.make_node(op_type, inputs, names, name=name, domain=domain or None, **attributes))
        return names

    def one(self, op_type: str, inputs: list[str], domain: str = "", **attributes: Any) -> str:
        return self.node(op_type, inputs, 1, domain, **attributes)[0]

    # --- operands ---------------------------------------------------------------------
    def operand(self, index: int) -> Operand:
        return self.subgraph.operands[index]

    def raw_constant(self, index: int) -> np.ndarray | None:
        """The HAL value of a constant operand (None for one computed at run time)."""
        operand = self.operand(index)
        if operand.lifetime == L.NO_VALUE:
            raise Declined(f"operand {index} is omitted")
        if operand.lifetime not in (L.CONSTANT_COPY, L.CONSTANT_REFERENCE):
            return None
        return constant_array(self.model, operand)

    def scalar(self, index: int) -> Any:
        """A parameter's value; a parameter computed at run time is declined."""
        value = self.raw_constant(index)
        if value is None:
            raise Declined(f"operand {index} (a parameter) is not a constant")
        return value.reshape(-1)[0].item() if value.size == 1 else value

    def optional_scalar(self, operation: Operation, position: int, default: Any) -> Any:
        if position >= len(operation.inputs):
            return default
        if self.operand(operation.inputs[position]).lifetime == L.NO_VALUE:
            return default
        return self.scalar(operation.inputs[position])

    def value(self, index: int) -> Value:
        if index in self.values:
            return self.values[index]
        operand = self.operand(index)
        if index in self.padded:  # a consumer that wants the real channels only
            value = Value(self.channel_slice(self.padded[index][0], operand.dimensions[3]),
                          internal_kind(operand.type), list(operand.dimensions), operand.scale,
                          internal_zero_point(operand))
            self.values[index] = value
            return value
        kind = internal_kind(operand.type)
        if any(d == 0 for d in operand.dimensions) and operand.lifetime not in (L.SUBGRAPH_INPUT,
                                                                                 L.TEMPORARY_VARIABLE,
                                                                                 L.SUBGRAPH_OUTPUT):
            raise Declined(f"operand {index} has unknown dimensions")
        raw = self.raw_constant(index)
        zero_point = internal_zero_point(operand)
        if raw is not None:
            encoded = encode(raw, operand)
            value = Value(self.constant(encoded, "w"), kind, list(operand.dimensions), operand.scale,
                          zero_point, encoded)
        elif operand.lifetime == L.SUBGRAPH_INPUT or self.isolated:
            value = self._graph_input(index, operand, kind, zero_point)
        else:
            raise Declined(f"operand {index} is read before it is written")
        self.values[index] = value
        return value

    def blocked_value(self, index: int) -> Value:
        """Operand ``index`` as ``value`` gives it, or where it was computed with padded
        channels, that NHWC value (its dims say how many channels it has)."""
        if index in self.padded:
            name, channels = self.padded[index]
            return Value(name, "float", [*self.operand(index).dimensions[:3], channels])
        return self.value(index)

    def channel_slice(self, name: str, channels: int) -> str:
        begin, end, axis = (self.constant(np.array([v], np.int64)) for v in (0, channels, 3))
        return self.one("Slice", [name, begin, end, axis])

    def _graph_input(self, index: int, operand: Operand, kind: str, zero_point: int) -> Value:
        if not operand.dimensions and operand.type not in (T.TENSOR_INT32,):
            if operand.type in ACTIVATION_TYPES:
                raise Declined(f"operand {index} has unknown rank")
        name = f"in_{index}"
        dims = [d if d else f"d{index}_{axis}" for axis, d in enumerate(operand.dimensions)]
        self.inputs.append(helper.make_tensor_value_info(name, HAL_ELEM[operand.type], dims))
        if operand.type == T.TENSOR_FLOAT16:
            name = self.one("Cast", [name], to=TensorProto.FLOAT)
        elif operand.type == T.TENSOR_QUANT8_ASYMM_SIGNED:
            name = self.shift_signed(name, to_unsigned=True, dims=operand.dimensions)
        return Value(name, kind, list(operand.dimensions), operand.scale, zero_point)

    def shift_signed(self, name: str, to_unsigned: bool, dims: Sequence[int] | None = None) -> str:
        """q + 128 as uint8 (or u - 128 back to int8), exact. Where ONNX Runtime has integer
        Adds narrower than int32 (int16_add_supported, 1.21 on: int16 and uint8 arrived
        together): a Cast keeping the bits (q mod 256) and a wrapping uint8 Add of 128,
        which is q + 128 mod 256 either way, two passes (MobileNet's 224x224x3 input: 19.4
        -> 10.7 us against the three of Cast, int16 Add, Cast). Before that, where a session
        with either Add fails to load, a DequantizeLinear / QuantizeLinear pair of scale 1:
        q dequantized with scale 1 and zero point -128 (u - 128 back) is q + 128 as a
        float32 integer, quantized with scale 1 and zero point 0 (-128) to itself. A value
        shifted here from int8 shifts back to that int8 value itself (an int8 graph output
        of an operation computed in int8: its shift there and back dropped as unread).
        ``dims``, where known: a tensor whose last dimension is 1 (a mono waveform [1, 16000,
        1]) is added flat, [-1], and reshaped back: ORT's broadcasting Add steps through such a
        tensor one element at a time (88 us for 16,000 uint8 values against 3.7 flat)."""
        if not to_unsigned and name in self._signed_sources:
            return self._signed_sources[name]
        flat = dims is not None and len(dims) > 1 and dims[-1] == 1 and all(dims) and int16_add_supported()
        source = self.one("Reshape", [name, self.constant(np.array([-1], np.int64))]) if flat else name
        shifted = self._shift_signed(source, to_unsigned)
        if flat:
            shifted = self.one("Reshape", [shifted, self.constant(np.array(dims, np.int64))])
        if to_unsigned:
            self._signed_sources[shifted] = name
        return shifted

    def signed_source(self, name: str) -> str | None:
        """The int8 value a uint8 ``name`` was shifted from by shift_signed, if it was."""
        return self._signed_sources.get(name)

    def _shift_signed(self, name: str, to_unsigned: bool) -> str:
        if not int16_add_supported():
            one = self.constant(np.array(1.0, np.float32))
            if to_unsigned:
                real = self.one("DequantizeLinear", [name, one, self.constant(np.array(-128, np.int8))])
                return self.one("QuantizeLinear", [real, one, self.constant(np.array(0, np.uint8))])
            real = self.one("DequantizeLinear", [name, one, self.constant(np.array(128, np.uint8))])
            return self.one("QuantizeLinear", [real, one, self.constant(np.array(0, np.int8))])
        if to_unsigned:
            wrapped = self.one("Cast", [name], to=TensorProto.UINT8)
            return self.one("Add", [wrapped, self.constant(np.array(128, np.uint8))])
        shifted = self.one("Add", [name, self.constant(np.array(128, np.uint8))])
        return self.one("Cast", [shifted], to=TensorProto.INT8)

    def set_output(self, index: int, name: str) -> Value:
        operand = self.operand(index)
        value = Value(name, internal_kind(operand.type), list(operand.dimensions), operand.scale,
                      internal_zero_point(operand))
        self.values[index] = value
        return value

    # --- quantization helpers -------------------------------------------------------
    def qparams(self, value: Value | Operand) -> tuple[str, str]:
        if isinstance(value, Operand):
            scale, zero_point = value.scale, internal_zero_point(value)
        else:
            scale, zero_point = value.scale, value.zero_point
        return (self.constant(np.array(scale, np.float32), "scale"),
                self.constant(np.array(zero_point, np.uint8), "zp"))

    def dequantize(self, value: Value) -> str:
        if value.kind == "float":
            return value.name
        if value.kind != "uint8":
            raise Declined(f"cannot dequantize a {value.kind} value")
        return self.one("DequantizeLinear", [value.name, *self.qparams(value)])

    def quantize(self, name: str, operand: Operand) -> str:
        return self.one("QuantizeLinear", [name, *self.qparams(operand)])


def encode(raw: np.ndarray, operand: Operand) -> np.ndarray:
    """A HAL constant in its internal encoding."""
    if operand.type in FLOATS:
        return raw.astype(np.float32)
    if operand.type == T.TENSOR_QUANT8_ASYMM_SIGNED:
        return (raw.view(np.uint8) ^ np.uint8(0x80)).reshape(raw.shape)
    if operand.type in (T.TENSOR_QUANT8_ASYMM, T.TENSOR_INT32, T.TENSOR_BOOL8, T.TENSOR_QUANT16_ASYMM):
        return raw
    if operand.type in (T.TENSOR_QUANT8_SYMM_PER_CHANNEL, T.TENSOR_QUANT8_SYMM, T.TENSOR_QUANT16_SYMM):
        return raw  # weights: read by the operation that owns them
    if operand.type in (T.FLOAT32, T.INT32, T.BOOL, T.FLOAT16, T.UINT32):
        return raw
    raise Declined(f"{type_name(operand.type)} constants are not supported")


Lowering = Callable[[GraphBuilder, Operation], None]
LOWERINGS: dict[OperationCode, Lowering] = {}


def lowers(*codes: OperationCode) -> Callable[[Lowering], Lowering]:
    def register(function: Lowering) -> Lowering:
        for code in codes:
            LOWERINGS[code] = function
        return function
    return register


#: the forms of operations whose parameters (or input shape) are known only at run time, by
#: operation, each giving its output's name: registered by runtime_parameters.py, which
#: imports this module as the other lowering modules do
RunTimeForm = Callable[["GraphBuilder", Operation, Value], str]
RUN_TIME_FORMS: dict[OperationCode, RunTimeForm] = {}


def lowers_at_run_time(*codes: OperationCode) -> Callable[[RunTimeForm], RunTimeForm]:
    def register(function: RunTimeForm) -> RunTimeForm:
        for code in codes:
            RUN_TIME_FORMS[code] = function
        return function
    return register


def run_time_form(g: GraphBuilder, operation: Operation, x: Value) -> str:
    """``operation`` of ``x`` in its form for parameters known only at run time."""
    form = RUN_TIME_FORMS.get(OperationCode(operation.type))
    if form is None:  # runtime_parameters.py not loaded (the device module loads it)
        raise Declined(f"{OperationCode(operation.type).name} with parameters known only at run time")
    return form(g, operation, x)


def check_types(g: GraphBuilder, operation: Operation, allowed: Sequence[int] = ACTIVATION_TYPES) -> None:
    """Declines ``operation`` unless its first input and every output are of a type in
    ``allowed``."""
    for index in [*operation.inputs[:1], *operation.outputs]:
        code = g.operand(index).type
        if code not in allowed:
            raise Declined(f"{OperationCode(operation.type).name} on {type_name(code)} is not supported")


def fused_activation(g: GraphBuilder, name: str, fuse: int, output: Operand) -> str:
    """``name`` with the fused activation applied, in the output's internal encoding."""
    if fuse == FuseCode.FUSED_NONE:
        return name
    if fuse not in (FuseCode.FUSED_RELU, FuseCode.FUSED_RELU1, FuseCode.FUSED_RELU6):
        raise Declined(f"fused activation {fuse} is not valid")
    low, high = activation_bounds_float(fuse)
    if output.type in FLOATS:
        if high == math.inf:
            return g.one("Relu", [name])
        return g.one("Clip", [name, g.constant(np.array(low, np.float32)), g.constant(np.array(high, np.float32))])
    if output.type in QUANT8:
        q_low, q_high = activation_bounds_quantized(fuse, output)
        shift = internal_zero_point(output) - output.zero_point  # int8 travels as uint8 (+128)
        q_low, q_high = q_low + shift, q_high + shift
        if q_low <= 0 and q_high >= 255:
            return name  # the clamp is the quantized range itself
        return g.one("Clip", [name, g.constant(np.array(q_low, np.uint8)), g.constant(np.array(q_high, np.uint8))])
    raise Declined(f"fused activation on {type_name(output.type)}")


def to_nchw(g: GraphBuilder, name: str, nchw: bool) -> str:
    return name if nchw else g.one("Transpose", [name], perm=NHWC_TO_NCHW)


def from_nchw(g: GraphBuilder, name: str, nchw: bool) -> str:
    return name if nchw else g.one("Transpose", [name], perm=NCHW_TO_NHWC)


def channel_scale(g: GraphBuilder, nchw_name: str, scales: np.ndarray) -> str:
    """``x * scales[c]`` per channel of an NCHW value, as a 1x1 depthwise convolution: one
    multiplication per element (the same value as Mul), and an operator ORT runs in NCHWc."""
    channels = scales.size
    weights = g.constant(np.asarray(scales, np.float32).reshape(channels, 1, 1, 1), "scale")
    return g.one("Conv", [nchw_name, weights], group=channels, kernel_shape=[1, 1])


def blocked(value_dims: list[int], kind: str) -> bool:
    """Whether an NHWC float value ORT can hold in NCHWc (rank 4, channels a block multiple,
    height and width known; the batch may be free: a 0 here, known only at run time)."""
    return kind == "float" and len(value_dims) == 4 and all(value_dims[1:]) and value_dims[3] % NCHWC_BLOCK == 0


def keep_blocked(g: GraphBuilder, operation: Operation, name: str) -> str:
    """``name`` (the NHWC output of an operator ORT has no NCHWc kernel for: PAD, STRIDED_SLICE)
    passed through an identity 1x1 depthwise convolution (x * 1.0, exact), so that it enters
    NCHWc once, here, rather than dragging the element-wise operators after it (residual ADDs,
    PRELUs) out of the layout: without it each of those costs two reorders (face_landmark:
    1.45 -> 1.14 ms). Not done where every consumer is a convolution or pooling (those reorder
    their input anyway) or where the value is the graph's output."""
    index = operation.outputs[0]
    output = g.operand(index)
    if g.isolated or not blocked(list(output.dimensions), internal_kind(output.type)):
        return name
    consumers = g.readers(index)
    if index in g.subgraph.output_indexes or all(
            op.type in _BLOCKED_CONSUMERS and list(op.inputs).index(index) == 0 and op.inputs.count(index) == 1
            for op in consumers):
        return name
    identity = channel_scale(g, to_nchw(g, name, False), np.ones(output.dimensions[3], np.float32))
    return from_nchw(g, identity, False)


def require_rank(value: Value, rank: int, what: str) -> None:
    if value.rank != rank:
        raise Declined(f"{what} must have rank {rank}")


@dataclass
class ConvParams:
    """A convolution's scalar arguments (NNAPI's explicit or implicit padding forms alike)
    as the ONNX Conv attributes take them (``conv_params``)."""

    pads: list[int] | None  # ONNX order: top, left, bottom, right
    auto_pad: str | None
    strides: list[int]
    dilations: list[int]
    fuse: int
    nchw: bool
    multiplier: int = 1


def conv_params(g: GraphBuilder, operation: Operation, depthwise: bool) -> ConvParams:
    """The padding, strides, dilations, fused activation, layout and (depthwise) multiplier
    of CONV_2D / DEPTHWISE_CONV_2D ``operation``, whichever of its signatures it uses: an
    explicit padding as ONNX pads, SAME as the pads NNAPI computes (``same_pads``), VALID as
    auto_pad."""
    inputs = operation.inputs
    n = len(inputs)
    shift = 1 if depthwise else 0  # depthwise has depth_multiplier before the activation
    explicit_lengths = (11, 12, 14) if depthwise else (10, 11, 13)
    explicit = n in explicit_lengths and not (n == explicit_lengths[0] and
                                              g.operand(inputs[7 + shift]).type == T.BOOL)
    if explicit:
        left, right, top, bottom = (int(g.scalar(inputs[i])) for i in (3, 4, 5, 6))
        stride_w, stride_h = int(g.scalar(inputs[7])), int(g.scalar(inputs[8]))
        multiplier = int(g.scalar(inputs[9])) if depthwise else 1
        rest = 9 + shift
        fuse = int(g.scalar(inputs[rest]))
        nchw = bool(g.optional_scalar(operation, rest + 1, False))
        dil_w = int(g.optional_scalar(operation, rest + 2, 1))
        dil_h = int(g.optional_scalar(operation, rest + 3, 1))
        return ConvParams([top, left, bottom, right], None, [stride_h, stride_w], [dil_h, dil_w], fuse, nchw,
                          multiplier)
    scheme = int(g.scalar(inputs[3]))
    stride_w, stride_h = int(g.scalar(inputs[4])), int(g.scalar(inputs[5]))
    multiplier = int(g.scalar(inputs[6])) if depthwise else 1
    rest = 6 + shift
    fuse = int(g.scalar(inputs[rest]))
    nchw = bool(g.optional_scalar(operation, rest + 1, False))
    dil_w = int(g.optional_scalar(operation, rest + 2, 1))
    dil_h = int(g.optional_scalar(operation, rest + 3, 1))
    if scheme not in (1, 2):
        raise Declined(f"padding scheme {scheme} is not valid")
    pads = None
    if scheme == 1:
        filter_dims = g.operand(inputs[1]).dimensions
        kernel = (filter_dims[1], filter_dims[2]) if len(filter_dims) == 4 else (0, 0)
        pads = same_pads(g.operand(inputs[0]).dimensions, nchw, kernel, (stride_h, stride_w), (dil_h, dil_w))
    return ConvParams(pads, "VALID" if scheme == 2 else None, [stride_h, stride_w], [dil_h, dil_w], fuse, nchw,
                      multiplier)


def same_pads(dims: list[int], nchw: bool, kernel: Sequence[int], strides: Sequence[int], dilations: Sequence[int]
              ) -> list[int]:
    """NNAPI's SAME padding as explicit ONNX pads (top, left, bottom, right): the odd pixel
    goes at the end. ORT's SAME_UPPER would do the same but refuses dilations, so the pads
    are computed here from the input's known size."""
    if len(dims) != 4:
        raise Declined("the input must have rank 4")
    sizes = (dims[2], dims[3]) if nchw else (dims[1], dims[2])
    if min(*strides, *dilations) < 1:
        raise Declined("strides and dilations must be positive")
    if not all(kernel) or any(size == 0 and stride != 1 for size, stride in zip(sizes, strides)):
        raise Declined("SAME padding needs the filter's spatial sizes, and the input's where the stride is not 1")
    # at stride 1 SAME pads (kernel - 1) * dilation whatever the size: a size known only at
    # run time (a sequence's length) takes that of any size
    sizes = tuple(size or 1 for size in sizes)
    (top, bottom), (left, right) = (implicit_padding(size, stride, k, dilation, PaddingCode.PADDING_SAME)
                                    for size, k, stride, dilation in zip(sizes, kernel, strides, dilations))
    return [top, left, bottom, right]


CLAMPS = {OperationCode.RELU: (0.0, math.inf), OperationCode.RELU1: (-1.0, 1.0), OperationCode.RELU6: (0.0, 6.0)}


def check_same_quantization(x: Value, output: Operand) -> None:
    """Declines unless ``output`` has ``x``'s internal kind and quantization: for operations
    that move values without requantizing them (copies, pads, gathers)."""
    if output.type in QUANT8 and (x.scale != output.scale or x.zero_point != internal_zero_point(output)):
        raise Declined("output quantization differs from the input's")
    if internal_kind(output.type) != x.kind:
        raise Declined("output type differs from the input's")


def resize_in_rows(g: GraphBuilder, operation: Operation) -> bool:
    """Whether a float NHWC RESIZE_BILINEAR is better resized in NHWC itself (the Resize on
    the NHWC value, no Transpose around it): where its output is a graph output read by
    nothing else, which leaves ORT's blocked layout anyway. Blocked, the resize works on
    the channels padded to the block and its whole (upscaled) output is then reordered to
    NHWC and cut to the real channels: deeplab's 21-class 32x32 -> 256x256 head spent
    1.6 ms of 8.9 in those three passes (Upsample 628 us on 32 channels, ReorderOutput
    406, Slice 570); in NHWC ORT reorders the small input and resizes the 21 real
    channels once: 600 us, the whole model 1.12x -> 0.99x LiteRT."""
    index = operation.outputs[0]
    return (not g.isolated and g.operand(index).type in FLOATS and not g.optional_scalar(operation, 3, False)
            and index in g.subgraph.output_indexes and not g.readers(index))


def constant_axis(g: GraphBuilder, index: int, rank: int) -> int:
    axis = int(g.scalar(index))
    if rank == 0 or not -rank <= axis < rank:
        raise Declined(f"axis {axis} is out of range for rank {rank}")
    return axis % rank


def constant_ints(g: GraphBuilder, index: int, what: str) -> np.ndarray:
    """Constant operand ``index`` as a flat int64 array; Declined (naming it ``what``) when it
    is given at run time."""
    value = g.raw_constant(index)
    if value is None:
        raise Declined(f"{what} must be a constant")
    return np.asarray(value).reshape(-1).astype(np.int64)


#: what a failed run-time check (``fail_unless``) names in its node, and the run's error reports
CHECK_PREFIX = "nnapi check"


def all_hold(g: GraphBuilder, conditions: Sequence[str]) -> str:
    """A boolean scalar: whether every element of every boolean tensor holds (an empty one
    holds), counted as int64 (ORT reduces an empty sum to 0, where an empty min has no
    identity to give): what ``fail_unless`` checks."""
    holds = None
    for condition in conditions:
        failures = g.one("ReduceSum", [g.one("Cast", [g.one("Not", [condition])], to=TensorProto.INT64)], keepdims=0)
        none = g.one("Equal", [failures, g.constant(np.array(0, np.int64))])
        holds = none if holds is None else g.one("And", [holds, none])
    return holds


def fail_unless(g: GraphBuilder, condition: str, value: str, why: str = "") -> str:
    """The int64 ``value`` unchanged where the boolean scalar ``condition`` holds; otherwise
    the run fails (a Gather of index 1 from a one-element tensor, which ORT refuses): how a
    parameter given at run time is checked as NNAPI requires instead of ONNX clamping it.
    The Gather is named after the operation lowered and ``why`` (the rule broken), which
    ORT's error quotes: the device reports that (``check_failure``), not an index error."""
    index = g.one("Cast", [g.one("Not", [condition])], to=TensorProto.INT64)
    rule = why or "a value given at run time is outside what NNAPI allows"
    name = f"{CHECK_PREFIX} {g.fresh('c')}: {g.lowering}: {rule}".replace("'", "")
    zero = g.node("Gather", [g.constant(np.zeros(1, np.int64)), index], 1, name=name, axis=0)[0]
    return g.one("Add", [value, zero])


def check_failure(error: Exception) -> str | None:
    """The rule a run broke where ``error`` is ORT's refusal of a ``fail_unless`` check
    (e.g. "HASHTABLE_LOOKUP: input 1 (keys) must be sorted ascending"), else None."""
    found = re.search(rf"Name:'{CHECK_PREFIX} [^:']*: ([^']*)'", str(error))
    return found.group(1) if found else None


NUMPY_KIND = {"float": np.float32, "int32": np.int32, "uint8": np.uint8, "bool": np.bool_}


def read_counts(nodes: Iterable[onnx.NodeProto]) -> dict[str, int]:
    """How many times each name is read by ``nodes``, the nodes of their subgraphs (an If's
    branches, a Loop's body: control_flow.py) included, since those read the enclosing
    graph's values by name."""
    reads: dict[str, int] = {}
    for node in nodes:
        for name in node.input:
            reads[name] = reads.get(name, 0) + 1
        for attribute in node.attribute:
            for graph in (*([attribute.g] if attribute.HasField("g") else []), *attribute.graphs):
                for name, count in read_counts(graph.node).items():
                    reads[name] = reads.get(name, 0) + count
    return reads


def lower_operation(g: GraphBuilder, operation: Operation) -> None:
    try:
        code = OperationCode(operation.type)
    except ValueError:
        raise Declined(f"operation type {operation.type} is unknown") from None
    lowering = LOWERINGS.get(code)
    if lowering is None:
        raise Declined(f"{code.name} has no ONNX lowering")
    if id(operation) in g.covered or operation.outputs and all(index in g.values for index in operation.outputs):
        return  # computed with others by an earlier lowering (_slices_as_split, _split_rows, a chain)
    for index in operation.outputs:
        operand = g.operand(index)
        if operand.type not in ACTIVATION_TYPES and operand.type != T.TENSOR_QUANT16_SYMM:
            raise Declined(f"{code.name} output of type {type_name(operand.type)} is not supported")
    g.lowering = code.name
    try:
        lowering(g, operation)
    except Declined:
        raise
    except (ValueError, TypeError, IndexError, KeyError, ZeroDivisionError, OverflowError) as error:
        raise Declined(f"{code.name}: {type(error).__name__}: {error}") from None
