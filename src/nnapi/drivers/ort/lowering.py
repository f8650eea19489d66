"""Lowering: one HAL subgraph to one ONNX graph (``lower_model``), and the device's question
whether one operation lowers (``operation_support``).

The operations' lowerings live one family per module (convolutions.py, elementwise.py,
pooling.py, normalization.py, quantization.py, data_movement.py, resize.py, on the shared
core builder.py), each registered once by importing its module here; the more specialised
forms (padded_depthwise.py, small_graphs.py, ...) register over them when device.py
imports them. This module adds what belongs to the whole graph: the composites ORT runs as
one operator (composites.py, attention.py), the outputs' external encodings, and the nodes
nothing reads.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

# every module that registers lowerings, so that lower_model sees them all whoever imports
# it first (the device, a test, a tool); a specialised module imports the family lowering
# it wraps, which orders the registration
from nnapi.drivers.ort import (
    control_flow,  # noqa: F401  (importing it registers its lowerings)
    convolutions,  # noqa: F401  (importing it registers its lowerings)
    data_movement,  # noqa: F401  (importing it registers its lowerings)
    detection,  # noqa: F401  (importing it registers its lowerings)
    elementwise,  # noqa: F401  (importing it registers its lowerings)
    gru_loop,  # noqa: F401  (importing it registers its lowerings)
    integer_div,  # noqa: F401  (importing it registers its lowerings)
    lookups,  # noqa: F401  (importing it registers its lowerings)
    lsh,  # noqa: F401  (importing it registers its lowerings)
    mirror_pad_pack,  # noqa: F401  (importing it registers its lowerings)
    multinomial,  # noqa: F401  (importing it registers its lowerings)
    nms,  # noqa: F401  (importing it registers its lowerings)
    normalization,  # noqa: F401  (importing it registers its lowerings)
    padded_depthwise,  # noqa: F401  (importing it registers its lowerings)
    pooling,  # noqa: F401  (importing it registers its lowerings)
    quantization,  # noqa: F401  (importing it registers its lowerings)
    quantized_recurrent,  # noqa: F401  (importing it registers its lowerings)
    quantized_resize,  # noqa: F401  (importing it registers its lowerings)
    quantized_softmax,  # noqa: F401  (importing it registers its lowerings)
    recurrent,  # noqa: F401  (importing it registers its lowerings)
    requantizing_quantize,  # noqa: F401  (importing it registers its lowerings)
    resize,  # noqa: F401  (importing it registers its lowerings)
    resize_pointwise,  # noqa: F401  (importing it registers its lowerings)
    runtime_parameters,  # noqa: F401  (importing it registers its lowerings)
    small_graphs,  # noqa: F401  (importing it registers its lowerings)
    transposed_dense,  # noqa: F401  (importing it registers its lowerings)
    uniform_prelu,  # noqa: F401  (importing it registers its lowerings)
)
from nnapi.drivers.ort.activated_depth_space import activate_before_depth_to_space
from nnapi.drivers.ort.attention import find_attention, lower_attention
from nnapi.drivers.ort.builder import (
    HAL_ELEM,
    MS_DOMAIN,
    Declined,
    GraphBuilder,
    T,
    fused_activation,
    lower_operation,
    onnx_model,
    read_counts,
)
from nnapi.drivers.ort.composites import LAYER_NORM, QUANTIZED_SWISH, find_composites
from nnapi.drivers.ort.elementwise import fixed_by_bounds, identity_by_bounds
from nnapi.drivers.ort.gathered_moves import gathered_moves, identity_move
from nnapi.drivers.ort.mask_round_trips import find_mask_round_trips
from nnapi.drivers.ort.pad_into_conv import fold_pads_into_convs
from nnapi.drivers.ort.padded_add import split_padded_adds
from nnapi.drivers.ort.pooled_prelu import pool_before_prelu
from nnapi.drivers.ort.reshape_views import simplify_reshapes
from nnapi.drivers.ort.scalar_broadcast import widen_constants
from nnapi.drivers.ort.shapes import infer_temporary_shapes
from nnapi.drivers.ort.sliced_columns import merge_sliced_columns
from nnapi.drivers.ort.twins import merge_twin_branches
from nnapi.hal import Model, Operation


def lower_model(model: Model, shaped: Model | None = None) -> tuple[onnx.ModelProto, list[str], list[str]]:
    """The ONNX model of ``model.main`` with its input and output names (one per HAL
    input / output, in order). Raises Declined if any part cannot be lowered.
    ``shaped``: infer_temporary_shapes(model) when the caller has it already (the device
    computes it to check the operations), not computed again."""
    model = infer_temporary_shapes(model) if shaped is None else shaped
    model = split_padded_adds(merge_twin_branches(pool_before_prelu(activate_before_depth_to_space(
        fold_pads_into_convs(model)))))
    subgraph = model.main
    g = GraphBuilder(model, subgraph)
    for index in subgraph.input_indexes:
        g.value(index)
    input_names = [i.name for i in g.inputs]
    composites = find_composites(model, subgraph)
    attention = find_attention(model, subgraph)
    round_trips = find_mask_round_trips(model, subgraph)
    for operation in subgraph.operations:
        if id(operation) in composites.inner or id(operation) in attention.inner:
            continue  # computed by its composite's one operator, at the composite's last operation
        fused = composites.roots.get(id(operation))
        block = attention.roots.get(id(operation))
        if block is not None:
            g.set_output(operation.outputs[0], lower_attention(g, block))
            continue
        if fused is None and (fixed_by_bounds(g, operation) or identity_by_bounds(g, operation)):
            continue  # a constant, or its input, by the bounds value_ranges.py proves
        if fused is None and (gathered_moves(g, operation) or identity_move(g, operation)):
            continue
        if id(operation) in round_trips:
            mask, same = round_trips[id(operation)]
            dims = g.constant(np.array(subgraph.operands[operation.outputs[0]].dimensions, np.int64))
            viewed = g.one("Reshape", [g.value(mask).name, dims])
            g.set_output(operation.outputs[0], viewed if same else g.one("Not", [viewed]))
        elif fused is not None:
            g.set_output(operation.outputs[0], _composite(g, operation, *fused))
        else:
            lower_operation(g, operation)
    outputs, output_names = [], []
    for position, index in enumerate(subgraph.output_indexes):
        operand = subgraph.operands[index]
        value = g.value(index)
        name = f"out_{position}"
        if operand.type == T.TENSOR_FLOAT16:
            g.node("Cast", [value.name], [name], to=TensorProto.FLOAT16)
        elif operand.type == T.TENSOR_QUANT8_ASYMM_SIGNED:
            if not _quantize_to_int8(g, value.name, name):
                g.node("Identity", [g.shift_signed(value.name, to_unsigned=False, dims=value.dims)], [name])
        else:
            g.node("Identity", [value.name], [name])
        dims = [d if d else None for d in operand.dimensions]
        outputs.append(helper.make_tensor_value_info(name, HAL_ELEM[operand.type], dims))
        output_names.append(name)
    _drop_unread_nodes(g, output_names)  # first, so that a value read only by its output's Identity is seen so
    _drop_output_identities(g)
    graph = helper.make_graph(g.nodes, "nnapi", g.inputs, outputs, g.initializers)
    lowered = onnx_model(graph, g.uses_ms_domain, producer_name="nnapi")
    merge_sliced_columns(lowered, widen_constants(lowered, simplify_reshapes(lowered)))
    return lowered, input_names, output_names


def _composite(g: GraphBuilder, root: Operation, op_type: str, source: int, parameters: tuple) -> str:
    """A composite (composites.py) ending at ``root`` as ORT's one operator on ``source``;
    a quantized swish computes it on the dequantized values and quantizes into the root's
    output with its fused activation."""
    x = g.value(source)
    if op_type == LAYER_NORM:
        # over the last axis in x's own shape: the sessions run without ORT's fusion of an
        # Add before it into SkipLayerNormalization (session.SKIP_LAYER_NORM_FUSION), which
        # Reshapes to [rows, channels] used to stop (two nodes each, now left to reshape_views)
        gamma, beta, epsilon = parameters
        return g.one(LAYER_NORM, [x.name, g.constant(gamma, "gamma"), g.constant(beta, "beta")], axis=-1,
                     epsilon=epsilon)
    if op_type != QUANTIZED_SWISH:
        return g.one(op_type, [x.name], domain=MS_DOMAIN)
    output = g.operand(root.outputs[0])
    swish = g.one(QUANTIZED_SWISH, [g.dequantize(x)], domain=MS_DOMAIN, alpha=1.0)
    return fused_activation(g, g.quantize(swish, output), int(g.scalar(root.inputs[2])), output)


def _drop_output_identities(g: GraphBuilder) -> None:
    """Let the node producing a graph output write it directly (no Identity copy) where the
    value is produced by a node, its other readers then reading the output. Not only a
    saved copy: ORT's EliminateIdentity (onnxruntime 1.32, basic level) made an invalid
    graph of an Identity into a graph output whose value other nodes also read (an LSTM
    whose output is a graph output and whose state feeds a second LSTM: "Node input
    'mul_22' is not a graph input, initializer, or output of a previous node"; found by
    ``nnapi fuzz`` once LSTM signatures were in it). A value a control-flow body reads by
    its outer name keeps its name."""
    captured = _body_reads(g.nodes)
    renamed = True
    while renamed:  # again after a rename: an Identity of an Identity now writes an output
        renamed = False
        producers = {output: node for node in g.nodes for output in node.output}
        for node in list(g.nodes):
            if node.op_type != "Identity" or not node.output[0].startswith("out_"):
                continue
            source, output = node.input[0], node.output[0]
            producer = producers.get(source)
            if producer is None or source.startswith("out_") or source in captured:
                continue
            producer.output[list(producer.output).index(source)] = output
            g.nodes.remove(node)
            for reader in g.nodes:
                reader.input[:] = [output if name == source else name for name in reader.input]
            producers[output] = producer
            renamed = True


def _body_reads(nodes) -> set[str]:
    """The value names read inside the subgraph attributes (If / Loop bodies) of ``nodes``,
    at any depth: outer values a body captures by name."""
    names: set[str] = set()
    for node in nodes:
        for attribute in node.attribute:
            bodies = [attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else list(attribute.graphs)
            for body in bodies:
                names.update(name for inner in body.node for name in inner.input)
                names |= _body_reads(body.node)
    return names


def _quantize_to_int8(g: GraphBuilder, name: str, output: str) -> bool:
    """An int8 graph output computed by a QuantizeLinear read by nothing else (a padded
    quantized AVERAGE_POOL_2D's) as that QuantizeLinear to int8 with its zero
    point - 128: the same q = u - 128, saturated alike, in one pass where shift_signed
    adds two more over the output (its int16 Cast, Add, Cast took ~0.6 of deeplab_like_int8's
    ~8 ms at 257x257x21). The uint8 one, now unread, is dropped. False where it does not apply."""
    def only_producer(value: str, readers: int) -> onnx.NodeProto | None:
        """The node computing ``value``, where ``readers`` nodes read it."""
        if read_counts(g.nodes).get(value, 0) != readers:
            return None
        return next((node for node in g.nodes if value in node.output), None)

    producer = only_producer(name, 0)
    transpose = None
    if producer is not None and producer.op_type == "Transpose":  # from_nchw after an NCHW operator
        transpose, producer = producer, only_producer(producer.input[0], 1)
    if producer is None or producer.op_type != "QuantizeLinear" or len(producer.input) != 3:
        return False
    zero_point = next((numpy_helper.to_array(tensor) for tensor in g.initializers
                       if tensor.name == producer.input[2]), None)
    if zero_point is None or zero_point.dtype != np.uint8 or zero_point.size != 1:
        return False
    shifted = np.array(int(zero_point.reshape(-1)[0]) - 128, np.int8)
    q = g.one("QuantizeLinear", [producer.input[0], producer.input[1], g.constant(shifted)],
              **{a.name: helper.get_attribute_value(a) for a in producer.attribute})
    g.node("Transpose", [q], [output], perm=list(transpose.attribute[0].ints)) if transpose is not None else \
        g.node("Identity", [q], [output])
    return True


#: ONNX operators that fail a run on an index out of range
_INDEXING = frozenset({"Gather", "GatherElements", "GatherND"})


def _drop_unread_nodes(g: GraphBuilder, outputs: list[str]) -> None:
    """Drop the nodes whose results nothing reads (a DEQUANTIZE whose only reader took the
    quantized value instead: _integer_mean); ORT would run them. Kept: a gather at indices
    given at run time (an NNAPI GATHER whose output nothing reads, a fail_unless check),
    which may fail the run, as Android's executor runs every operation."""
    constants = {tensor.name for tensor in g.initializers}
    while True:
        read = set(outputs).union(read_counts(g.nodes))
        kept = [node for node in g.nodes if any(name in read for name in node.output) or (
            node.op_type in _INDEXING and not node.domain and node.input[1] not in constants)]
        if len(kept) == len(g.nodes):
            return
        g.nodes[:] = kept


def operation_support(model: Model, operation: Operation) -> str | None:
    """None if ``operation`` (of the main subgraph) lowers, else why not."""
    g = GraphBuilder(model, model.main, isolated=True)
    try:
        lower_operation(g, operation)
    except Declined as reason:
        return str(reason)
    return None
