"""The values a Model keeps for its operands, as plain records.

``nnapi.model`` creates them and ``nnapi.runtime.model_builder`` turns them into the HAL
model's lifetimes and locations; both import them from here, so the runtime never reads
the Model's private classes and the imports run one way (model -> runtime -> here).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from nnapi.codes import OperationCode

if TYPE_CHECKING:
    from nnapi.memory import Memory
    from nnapi.model import Model


@dataclass
class OperationRecord:
    """One add_operation call."""

    code: OperationCode
    inputs: list[int]
    outputs: list[int]


class NoValue:
    """An optional operand explicitly omitted (set_operand_value(index, None))."""


@dataclass
class CopiedValue:
    """A small value the NDK copies at set_operand_value."""

    data: bytes


@dataclass
class ReferencedValue:
    """A large value the NDK keeps by reference: the caller's buffer, not a copy."""

    view: memoryview


@dataclass
class MemoryValue:
    """A value in a Memory (set_operand_value_from_memory)."""

    memory: Memory
    offset: int
    length: int


@dataclass
class ModelValue:
    """A referenced model (set_operand_value_from_model), for IF and WHILE."""

    model: Model


NO_VALUE = NoValue()
