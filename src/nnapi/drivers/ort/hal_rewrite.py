"""What the ORT driver's HAL rewrites (``twins``, ``padded_add``) share: a main subgraph's
operands, constants and readers, new constants and temporaries appended to them, and the
rewritten Model built from the operations a rewrite emits.

The rewrites run before lowering to ONNX, on the HAL model the driver was given; they leave
that model untouched (operands and constant bytes are copied) and return a new one.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from nnapi.codes import OperandCode
from nnapi.hal import DataLocation, Model, Operand, OperandLifeTime, Operation, Subgraph
from nnapi.hal.types import constant_array
from nnapi.operand import dtype_of

L = OperandLifeTime
#: channel counts a rewrite works on: ORT's NCHWc block, so the rewritten values stay blocked
CHANNEL_MULTIPLE = 16
CONSTANTS = (L.CONSTANT_COPY, L.CONSTANT_REFERENCE)


class HalRewriter:
    """The main subgraph of ``model`` being rewritten: ``operands`` (a copy, grown by
    ``constant`` / ``temporary``), ``values`` (the constant bytes, grown likewise), and per
    operand the position of the operation producing it and those reading it."""

    def __init__(self, model: Model) -> None:
        self.model = model
        self.subgraph = model.main
        self.operands = list(self.subgraph.operands)
        self.values = bytearray(model.operand_values)
        self.producer: dict[int, int] = {}
        self.readers: dict[int, list[int]] = {}
        for position, operation in enumerate(self.subgraph.operations):
            for index in operation.outputs:
                self.producer[index] = position
            for index in operation.inputs:
                self.readers.setdefault(index, []).append(position)

    def array(self, index: int) -> np.ndarray | None:
        """The value of a constant operand (None for one computed at run time)."""
        operand = self.operands[index]
        return constant_array(self.model, operand) if operand.lifetime in CONSTANTS else None

    def constant(self, array: np.ndarray, code: OperandCode) -> int:
        """A new constant operand holding ``array`` as ``code``."""
        array = np.array(array, dtype=dtype_of(code), order="C")  # (ascontiguousarray makes a scalar 1-d)
        while len(self.values) % 8:
            self.values.append(0)
        offset = len(self.values)
        self.values.extend(array.tobytes())
        self.operands.append(Operand(code, list(array.shape), 0.0, 0, L.CONSTANT_COPY,
                                     DataLocation(0, offset, array.nbytes), number_of_consumers=1))
        return len(self.operands) - 1

    def temporary(self, like: int, channels: int) -> int:
        """A new temporary of operand ``like``'s type and NHWC shape with ``channels``."""
        operand = self.operands[like]
        self.operands.append(Operand(operand.type, [*operand.dimensions[:3], channels], 0.0, 0,
                                     L.TEMPORARY_VARIABLE, number_of_consumers=1))
        return len(self.operands) - 1

    def blocked_float(self, index: int) -> bool:
        """A float32 NHWC value computed at run time whose channels fill ORT's blocks."""
        operand = self.operands[index]
        dims = operand.dimensions
        return (operand.type == OperandCode.TENSOR_FLOAT32 and len(dims) == 4 and all(dims)
                and dims[3] % CHANNEL_MULTIPLE == 0 and operand.lifetime not in CONSTANTS)

    def replacing(self, replaced: dict[int, list[Operation]]) -> list[Operation]:
        """The main subgraph's operations in order, each position ``replaced`` names replaced by
        its list (an empty list drops the operation)."""
        return [new for position, operation in enumerate(self.subgraph.operations)
                for new in replaced.get(position, [operation])]

    def rewritten(self, emitted: list[Operation]) -> Model:
        """The model with ``emitted`` as its main subgraph's operations."""
        subgraph = Subgraph(self.operands, emitted, list(self.subgraph.input_indexes),
                            list(self.subgraph.output_indexes))
        return dataclasses.replace(self.model, main=subgraph, operand_values=bytes(self.values))
