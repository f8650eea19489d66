"""nnapi-ort-cpu's compilation cache refuses a graph that does not bind as its signature
says (compilation_cache.check_graph): one case per rule, each asserting its own message
(each rule turned off, the suite passed before these), and a patterns file's graph that
does not bind is left out (that pattern is lowered afresh)."""

from __future__ import annotations

import os

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")

import file_fuzz  # noqa: E402
import nnapi  # noqa: E402
from nnapi.drivers.ort import compilation_cache  # noqa: E402
from nnapi.drivers.ort.signature import IoSpec, Signature  # noqa: E402
from nnapi.hal import HalError  # noqa: E402

F32 = np.dtype(np.float32)


def _graph(inputs=(("x", [2, 3]),), outputs=(("y", [2, 3]),), initializers=()) -> bytes:
    """An ONNX model summing its inputs (and initializers) into each output."""
    from onnx import TensorProto, helper, numpy_helper

    names = [name for name, _ in inputs] + [name for name, _ in initializers]
    nodes = [helper.make_node("Sum", names, [name]) for name, _ in outputs]
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, shape) for name, shape in inputs],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, shape) for name, shape in outputs],
        [numpy_helper.from_array(np.zeros(shape, np.float32), name) for name, shape in initializers])
    return helper.make_model(graph).SerializeToString()


def _signature(inputs=(("x", F32, [2, 3]),), outputs=(("y", F32, [2, 3]),)) -> Signature:
    return Signature([IoSpec(*spec) for spec in inputs], [IoSpec(*spec) for spec in outputs])


def test_a_graph_that_binds_its_signature_is_kept():
    compilation_cache.check_graph(_signature(), _graph())
    # an initializer the graph also lists as an input is no input the signature must feed
    compilation_cache.check_graph(_signature(), _graph(inputs=(("x", [2, 3]), ("c", [2, 3])),
                                                       initializers=(("c", [2, 3]),)))


BROKEN = [
    (_signature(), _graph(inputs=(("x", [2, 4]),)),
     r"the cached graph's input 'x' has shape \[2, 4\], its signature says \[2, 3\]"),
    (_signature(), _graph(outputs=(("y", [3, 2]),)),
     r"the cached graph's output 'y' has shape \[3, 2\], its signature says \[2, 3\]"),
    (_signature(), _graph(inputs=(("x", [2, 3]), ("z", [2, 3]))),
     r"the cached graph has inputs its signature does not feed: \['z'\]"),
    (_signature(inputs=(("w", F32, [2, 3]),)), _graph(), "the cached graph has no input 'w'"),
    (_signature(outputs=(("y", F32, [2, 3]), ("q", F32, [2, 3]))), _graph(), "the cached graph has no output 'q'"),
    (_signature(outputs=(("y", np.dtype(np.int32), [2, 3]),)), _graph(),
     "the cached graph's output 'y' is of ONNX type 1, its signature says int32"),
]


@pytest.mark.parametrize("signature, graph, rule", BROKEN, ids=[rule[:40] for _, _, rule in BROKEN])
def test_a_graph_that_does_not_bind_is_refused(signature, graph, rule):
    with pytest.raises(HalError, match=f"^cache refused: {rule}"):
        compilation_cache.check_graph(signature, graph)


def test_a_patterns_file_graph_that_does_not_bind_is_left_out(tmp_path):
    """A pattern's graph replaced by another valid ONNX model (the checksum resealed): that
    pattern is left out of what the file gives, so it is lowered afresh."""
    from nnapi.drivers.ort.device import OrtDevice
    from nnapi.runtime import manager

    if not any(d.name == "nnapi-ort-cpu" for d in manager.hal_devices()):
        manager.register_device(OrtDevice())
    devices = [d for d in nnapi.get_devices() if d.name == "nnapi-ort-cpu"]
    case = file_fuzz.Case("transpose_omittable", file_fuzz.ORT_BUILDERS["transpose_omittable"])
    file_fuzz.compile_and_run(case, devices, str(tmp_path))
    (name,) = os.listdir(tmp_path)
    header, payload = file_fuzz.split_ort_cache((tmp_path / name).read_bytes())
    assert header["kind"] == "patterns" and len(header["patterns"]) == 1
    token = bytes.fromhex(header["token"])
    _, graphs = compilation_cache._decode_patterns(header, payload, token)
    assert len(graphs) == 1
    offset = header["model_bytes"] + header["data_bytes"]
    other = _graph()
    header["patterns"][0]["bytes"] = len(other)
    _, graphs = compilation_cache._decode_patterns(header, payload[:offset] + other, token)
    assert graphs == {}
