"""The NNAPI operations: one module per operation or tight family, one registry.

Importing this package imports every module in it, and each module registers its
operations with ``@register``; ``get_operation(code)`` looks one up.
"""

from __future__ import annotations

import importlib
import pkgutil

from nnapi.codes import OperationCode
from nnapi.operations.base import (
    ExecutionContext,
    Operation,
    OperationFailed,
    Tensor,
    ValidationContext,
    register,
    registry,
)

_HELPER_MODULES = {"base", "common"}


def _load_all() -> None:
    for module in pkgutil.iter_modules(__path__):
        if module.name not in _HELPER_MODULES and not module.name.startswith("_"):
            importlib.import_module(f"{__name__}.{module.name}")


_load_all()


def get_operation(code: OperationCode) -> Operation | None:
    """The registered implementation of ``code``, or None if none exists yet."""
    return registry().get(code)


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
    "register",
]
