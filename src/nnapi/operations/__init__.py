"""The NNAPI operations: one module per operation or tight family, one registry.

Importing this package imports every module in it, and each module registers its
operations with ``@register``; ``get_operation(code)`` looks one up.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Sequence

from nnapi.codes import OperationCode
from nnapi.operand import OperandType
from nnapi.operations.base import (
    ExecutionContext,
    Operation,
    OperationFailed,
    Tensor,
    ValidationContext,
    register,
    registry,
)

#: modules of shared pieces, not operations (as are those whose names start with "_"): the
#: operation modules import them, and so do drivers (the ONNX Runtime driver's lowerings)
_HELPER_MODULES = {"base", "common", "detection_common", "elementwise", "lstm_cell"}


def _load_all() -> None:
    for module in pkgutil.iter_modules(__path__):
        if module.name not in _HELPER_MODULES and not module.name.startswith("_"):
            importlib.import_module(f"{__name__}.{module.name}")


_load_all()


def get_operation(code: OperationCode) -> Operation | None:
    """The registered implementation of ``code``, or None if none exists yet."""
    return registry().get(code)


def prepared_shapes(code: OperationCode, inputs: Sequence[Tensor], outputs: Sequence[OperandType],
                    relaxed: bool = False) -> list[tuple[int, ...]] | None:
    """The output shapes ``code``'s ``prepare`` gives for ``inputs`` before a run: constants
    with their values, values computed at run time as ``RunTimeValue``. None where it needs
    such a value, refuses the inputs, or the operation has no implementation or runs a
    referenced model (IF / WHILE)."""
    implementation = get_operation(code)
    if implementation is None or code in (OperationCode.IF, OperationCode.WHILE):
        return None
    try:
        return [tuple(int(d) for d in shape)
                for shape in implementation.prepare(ExecutionContext(code, inputs, outputs, relaxed=relaxed))]
    except Exception:  # noqa: BLE001 - a shape that needs a run-time value, or inputs it refuses
        return None


def implemented_operations() -> list[OperationCode]:
    return sorted(registry())


__all__ = [
    "ExecutionContext",
    "Operation",
    "OperationFailed",
    "Tensor",
    "ValidationContext",
    "get_operation",
    "implemented_operations",
    "prepared_shapes",
    "register",
]
