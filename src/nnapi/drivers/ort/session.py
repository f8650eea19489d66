"""The ONNX Runtime session options of every nnapi-ort-cpu session, and of the one-off
probes that decide at preparation whether ORT computes a lowered form exactly
(builder.probe_outputs): a probe must see the kernels and graph optimizations the
device's own sessions will run, or it vouches for another computation.
"""

from __future__ import annotations

import functools
import os
import platform
from collections.abc import Iterator

import onnx
import onnxruntime as ort

from nnapi.drivers.ort.versions import onnxruntime_at_least
from nnapi.errors import NnapiError
from nnapi.hal import Model, OperandLifeTime
from nnapi.operand import value_byte_size

#: ORT's log level, for the device's sessions and the probes alike: fatal only. Failures
#: reach the caller as HalErrors (or a probe's False), not as log lines (at 3, "error",
#: every failed run also printed its node's error to stderr, in red)
ORT_LOG_SEVERITY = 4

#: ONNX Runtime's session option that runs int8 weights through its uint8 x uint8 kernels
X64_QUANT_PRECISION = "session.x64quantprecision"


@functools.cache
def u8s8_products_saturate() -> bool:
    """Whether ORT's uint8 x int8 kernels can saturate on this CPU: x86 without VNNI, whose
    kernels add pairs of 8-bit products in 16 bits (vpmaddubsw), so that two products of a
    large activation and a large int8 weight (255 * 127 * 2 > 32767) clip before the int32
    sum: a wrong result, far more than a step, on real int8 models. With VNNI (avx512_vnni,
    avx_vnni: one instruction into int32) and on other architectures the sums are exact."""
    if platform.machine().lower() not in ("x86_64", "amd64", "i386", "i686"):
        return False
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as info:
            flags = {word for line in info if line.startswith("flags") for word in line.split(":", 1)[1].split()}
    except OSError:
        return True  # unknown: take the exact kernels
    return not flags & {"avx512_vnni", "avx_vnni"}


def session_options(threads: int | None = None, mem_pattern: bool = False) -> ort.SessionOptions:
    """Single-threaded by default (NNAPI_ORT_THREADS overrides): one execution, one core,
    as the benchmarks compare engines.

    Without ORT's memory pattern unless ``mem_pattern`` (``plans_memory``): each intermediate
    value then comes from the CPU arena as it is computed, mostly into the block its
    predecessor just freed (warm in the caches), where the pattern's one planned block put
    MobileNet v1 int8's 112x112 layers elsewhere (its 112x112x64 stride-2 depthwise 127 ->
    70 us, 112x112x32 -> 64 pointwise 139 -> 103 per-node medians). Through the runtime, two
    sessions of each interleaved with LiteRT (60 rounds, process time, load ~7): v1 int8
    1.26 / 1.26x -> 1.22 / 1.19x, float MobileNet v2 and face_landmark unchanged within the
    sessions' spread. On an x86 CPU without VNNI, int8 weights run through ORT's exact
    uint8 kernels (``u8s8_products_saturate``)."""
    options = ort.SessionOptions()
    count = threads if threads is not None else int(os.environ.get("NNAPI_ORT_THREADS", "1"))
    options.intra_op_num_threads = count
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.log_severity_level = ORT_LOG_SEVERITY
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.enable_mem_pattern = mem_pattern
    if u8s8_products_saturate():
        # ORT then stores constant int8 weights as uint8 (+128, the zero point with them:
        # the same products) for its uint8 x uint8 kernels, which do not saturate; ~2.4x
        # slower on MobileNet v2 int8 (measured with the option forced on a VNNI CPU, where
        # ORT applies it too: hence only here)
        options.add_session_config_entry(X64_QUANT_PRECISION, "1")
    return options


#: the largest intermediate value (bytes) of a model whose sessions plan their memory
#: (``plans_memory``)
MEM_PATTERN_LARGEST = 1 << 17


def plans_memory(model: Model) -> bool:
    """Whether sessions of ``model`` run with ORT's memory pattern (one block planned for
    every intermediate value, allocated once): where every temporary of every subgraph has
    known dimensions and none holds more than MEM_PATTERN_LARGEST bytes. Small models then
    skip the arena's allocation per node, and their values sit in the caches wherever the
    plan puts them: ORT's own run, the two sessions interleaved (15 rounds, process-time
    medians, onnxruntime 1.32, load ~1-6): zoo3 mnv2_035 int8 203 -> 196 us, mnv2_035 uint8
    213 -> 208, vgg_small int8 192 -> 187, effv2b1 int8 1797 -> 1749, zoo2 yolo_tiny int8
    200 -> 191, yolo_topk int8 261 -> 250, the shared fused LSTM 237 -> 230, WHILE LSTM 59.1
    -> 56.8. Larger values (MobileNet's 224x224 layers: 784 KiB and more) keep the arena
    (``session_options``)."""
    for subgraph in (model.main, *model.referenced):
        for operand in subgraph.operands:
            if operand.lifetime != OperandLifeTime.TEMPORARY_VARIABLE:
                continue
            if not operand.dimensions or not all(operand.dimensions):
                return False
            try:
                size = value_byte_size(operand.type, operand.dimensions)
            except NnapiError:  # (an extension type: its size is not known here)
                return False
            if size > MEM_PATTERN_LARGEST:
                return False
    return True


#: the first ONNX Runtime release whose GatherSliceToSplitFusion names each fused node apart
GATHER_SLICE_FUSION_VERSION = (1, 22)


#: ORT's optimizer that replaces QuantizeLinear > DequantizeLinear > QuantizeLinear >
#: DequantizeLinear of two quantizations by one pair of a third scale and zero point
#: spanning the ranges' intersection: a requantization (DEQUANTIZE > QUANTIZE into another
#: scale) between a QUANTIZE and a DEQUANTIZE then rounds to that third grid, not to the
#: two of the model (241 of 256 int8 values a step of it off the reference's; found by
#: tools/import_vs_litert.py, SQUARED_DIFFERENCE > QUANTIZE > LOGISTIC)
DOUBLE_QDQ_REMOVER = "DoubleQDQPairsRemover"

#: ORT's optimizer that drops a DequantizeLinear > QuantizeLinear pair of one quantization:
#: where an If / Loop body reads that QuantizeLinear's value by its outer name, onnxruntime
#: 1.32 aborts the whole process in it (a std::vector index assertion; an int8
#: RESIZE_BILINEAR into a TRANSPOSE of a run-time permutation, whose lowering picks the
#: permutation in nested Ifs: tools/import_vs_litert.py seed 520 case 308). Disabled only
#: in graphs with such bodies, where the pair it would drop costs a pass over a value.
QDQ_FINAL_CLEANUP = "QDQFinalCleanupTransformer"

#: ORT's optimizer that fuses an Add before a LayerNormalization of the same shape (a
#: transformer's residual Add and its norm) into its SkipLayerNormalization: slower on CPU
#: than the two (onnxruntime 1.32, 128 x 128: 79 us against 6 + 12; bert_tiny's ORT run
#: 98 -> 90 us without it) and rounding the sum's norm otherwise (composites.py's layer
#: norm is ORT's own LayerNormalization of NNAPI's values; the Add stays NNAPI's ADD)
SKIP_LAYER_NORM_FUSION = "SkipLayerNormFusion"


#: ORT's optimizer that drops x + 0, x - 0, x * 1 and x / 1 of a constant: x + 0 is not x
#: where x is -0 (NNAPI's ADD, and TFLite's sums into zeros, give +0: the importer's
#: SCATTER_ND / SEGMENT_SUM add a row of zeros for that), so graphs with a float Add of a
#: constant of zeros run without it (the other three are exact)
NOOP_ELIMINATION = "NoopElimination"

_FLOAT_ELEMENTS = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE)


def _graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """``graph`` and every If / Loop / Scan body in it, however deep."""
    yield graph
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                yield from _graphs(attribute.g)
            elif attribute.type == onnx.AttributeProto.GRAPHS:
                for body in attribute.graphs:
                    yield from _graphs(body)


def _adds_constant_zeros(graph: onnx.GraphProto) -> bool:
    """Whether a float Add of ``graph`` or of a body in it reads an initializer of zeros
    (NoopElimination's x + 0; ORT optimizes bodies too). Names are taken across all the
    graphs: a body reads its outer graphs' values by name, and a name of another scope
    taken too only disables the optimizer."""
    graphs = list(_graphs(graph))
    added = {name for body in graphs for node in body.node if node.op_type == "Add"
             and node.domain in ("", "ai.onnx") for name in node.input}
    return any(initializer.name in added and initializer.data_type in _FLOAT_ELEMENTS
               and not onnx.numpy_helper.to_array(initializer).any()
               for body in graphs for initializer in body.initializer)


def disabled_optimizers(graph: onnx.GraphProto | None = None) -> list[str]:
    """ORT's graph optimizers a session of ``graph`` must not run here: DoubleQDQPairsRemover,
    which changes the values of a requantization (``DOUBLE_QDQ_REMOVER``); SkipLayerNormFusion,
    slower than the Add and LayerNormalization it fuses (``SKIP_LAYER_NORM_FUSION``); in a graph with
    If / Loop / Scan bodies, QDQFinalCleanupTransformer, which can abort the process there
    (``QDQ_FINAL_CLEANUP``); before 1.22, GatherSliceToSplitFusion too: fusing Gathers /
    Slices of one tensor into a Split twice in a graph gives both nodes the same name and
    ORT then refuses its own optimized model ("two nodes with same node name
    (/GatherSliceToSplitFusion/)": the NMS lowering's Loop bodies on 1.19-1.21); in a graph
    adding a float constant of zeros (in it or in a body), NoopElimination, which turns
    -0 + 0 into -0 (``NOOP_ELIMINATION``)."""
    disabled = [DOUBLE_QDQ_REMOVER, SKIP_LAYER_NORM_FUSION]
    if graph is not None and _adds_constant_zeros(graph):
        disabled.append(NOOP_ELIMINATION)
    if graph is not None and any(attribute.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
                                 for node in graph.node for attribute in node.attribute):
        disabled.append(QDQ_FINAL_CLEANUP)
    if not onnxruntime_at_least(GATHER_SLICE_FUSION_VERSION):
        disabled.append("GatherSliceToSplitFusion")
    return disabled
