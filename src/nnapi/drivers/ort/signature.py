"""What an ORT prepared model binds: its graph's inputs and outputs (names, element types,
shapes), as prepared and as a cache file holds them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper

from nnapi.codes import OperationCode
from nnapi.drivers.ort.versions import onnxruntime_at_least
from nnapi.hal import Model
from nnapi.operand import dtype_of

#: the first onnxruntime whose IOBinding takes a bound buffer's element type as an ONNX
#: type number; before it only as a numpy dtype (else every bind failed: "Not a valid
#: numpy type", all of an execution on the 1.16-1.19 that pyproject accepts)
ONNX_TYPES_BIND_VERSION = (1, 20)
BINDS_ONNX_TYPES = onnxruntime_at_least(ONNX_TYPES_BIND_VERSION)


@dataclass
class IoSpec:
    name: str
    dtype: np.dtype
    dimensions: list[int]

    def __post_init__(self) -> None:
        #: what execution binds when a request names no other shape: the shape and its
        #: byte count, None when the model leaves a dimension (or the rank) unspecified
        self.shape = tuple(self.dimensions)
        self.nbytes = _nbytes(self, self.dimensions) if self.dimensions and all(self.dimensions) else None
        #: the strides of a C-contiguous array of that shape: a numpy array pool with this
        #: dtype, shape and strides is bound as the array itself (see _Binding)
        self.strides = _c_strides(self.shape, self.dtype.itemsize)
        #: the ONNX element type, as IOBinding takes it without looking the dtype up (the
        #: dtype itself, which it takes too, for one ONNX has no type for: binding fails),
        #: where onnxruntime takes one (BINDS_ONNX_TYPES); else the dtype
        self.element_type = self.dtype
        if BINDS_ONNX_TYPES:
            try:
                self.element_type = helper.np_dtype_to_tensor_dtype(self.dtype)
            except (ValueError, KeyError, TypeError):
                pass


@dataclass
class Signature:
    """The graph's inputs and outputs, in HAL order: what execution binds."""

    inputs: list[IoSpec]
    outputs: list[IoSpec]
    #: the graph has a loop (a WHILE): every run is bounded by the loop timeout
    loops: bool = False

    @classmethod
    def of(cls, model: Model, input_names: list[str], output_names: list[str],
           graph: onnx.GraphProto | None = None) -> Signature:
        """The signature of ``model`` lowered with these input and output names; an input
        ``graph`` declares of another element type of the same size (a float's bits as
        unsigned integers: lsh.py) is bound as that type, its bytes as they are."""
        main = model.main
        declared = {} if graph is None else {value.name: value.type.tensor_type.elem_type for value in graph.input}

        def dtype(index: int, name: str) -> np.dtype:
            own = dtype_of(main.operands[index].type)
            elem = declared.get(name)
            if elem is None or elem == helper.np_dtype_to_tensor_dtype(own):
                return own
            bound = helper.tensor_dtype_to_np_dtype(elem)
            return bound if bound.itemsize == own.itemsize else own

        def specs(indexes: Sequence[int], names: list[str]) -> list[IoSpec]:
            return [IoSpec(name, dtype(i, name), list(main.operands[i].dimensions))
                    for i, name in zip(indexes, names, strict=True)]
        loops = any(operation.type == OperationCode.WHILE
                    for subgraph in (main, *model.referenced) for operation in subgraph.operations)
        return cls(specs(main.input_indexes, input_names), specs(main.output_indexes, output_names), loops)

    def to_json(self) -> dict:
        def encode(specs: list[IoSpec]) -> list[list]:
            return [[s.name, s.dtype.str, s.dimensions] for s in specs]
        return {"inputs": encode(self.inputs), "outputs": encode(self.outputs), "loops": self.loops}

    @classmethod
    def from_json(cls, data: dict) -> Signature:
        def decode(items: list) -> list[IoSpec]:
            specs = []
            for name, dtype, dims in items:
                if not isinstance(name, str) or not all(isinstance(d, int) and d >= 0 for d in dims):
                    raise ValueError("bad signature entry")
                if not isinstance(dtype, str) or np.dtype(dtype).kind not in "biuf":
                    raise ValueError(f"bad signature entry: element type {dtype!r}")
                specs.append(IoSpec(name, np.dtype(dtype), list(dims)))
            return specs
        loops = data.get("loops", False)
        if not isinstance(loops, bool):
            raise ValueError("bad signature entry")
        return cls(decode(data["inputs"]), decode(data["outputs"]), loops)


def _nbytes(spec: IoSpec, dims: list[int]) -> int:
    return math.prod(dims) * spec.dtype.itemsize


def _c_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    strides = []
    step = itemsize
    for dim in reversed(shape):
        strides.append(step)
        step *= max(dim, 1)
    return tuple(reversed(strides))
