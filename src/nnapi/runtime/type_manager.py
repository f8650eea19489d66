"""Vendor extension types known to the runtime (Android's TypeManager).

An extension operand or operation type is ``prefix << 16 | type_within_extension``. The
runtime gives each extension name a prefix (1, 2, ... in the order it first meets them;
0 means "not an extension") the first time a device reports it through
``IDevice.get_supported_extensions``. Prefixes never change while the process runs, so a
type obtained from one model is valid in every model, and the HAL model of a compilation
lists, in ``extension_name_to_prefix``, exactly the extensions it uses with these prefixes.

The operand types an extension declares (``ExtensionOperandTypeInformation``: tensor or
scalar, bytes per element) are what the runtime knows of them: it checks operands of these
types as the NDK does (tensor or scalar dimensions, no scale or zero point) and sizes
their values; everything else about an extension is for its driver to validate.

This module imports nothing that imports operands (the import graph stays acyclic): the
device manager hands it the function listing the devices (``set_device_source``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from nnapi import vlog

#: An extension type value is its prefix above this many bits of type within the extension.
_TYPE_WITHIN_EXTENSION_BITS = 16
#: Operand and operation type values at or above this are extension types.
EXTENSION_TYPE_BASE = 1 << _TYPE_WITHIN_EXTENSION_BITS
#: The largest value an extension type may have (the NDK's types are 32-bit).
MAX_EXTENSION_TYPE = 0xFFFFFFFF
#: The largest type number within one extension (uint16_t in NeuralNetworksExtensions.h).
MAX_TYPE_WITHIN_EXTENSION = 0xFFFF


@dataclass(frozen=True)
class OperandTypeInfo:
    """What a device declares about one operand type of its extension."""

    is_tensor: bool
    byte_size: int  # of a scalar, or of one tensor element


@dataclass(frozen=True)
class KnownExtension:
    name: str
    prefix: int
    operand_types: dict[int, OperandTypeInfo]


_lock = threading.RLock()
_by_name: dict[str, KnownExtension] = {}
_by_prefix: dict[int, KnownExtension] = {}
_device_source: Callable[[], Iterable[Any]] | None = None


def set_device_source(source: Callable[[], Iterable[Any]]) -> None:
    """The function listing the runtime's devices (set by nnapi.runtime.manager)."""
    global _device_source
    _device_source = source


def _declared_types(extension: Any) -> dict[int, OperandTypeInfo] | None:
    """An extension's operand types, or None when the declaration is malformed."""
    types: dict[int, OperandTypeInfo] = {}
    for info in list(getattr(extension, "operand_types", None) or []):
        code, is_tensor, size = (getattr(info, "type", None), getattr(info, "is_tensor", None),
                                 getattr(info, "byte_size", None))
        if (not isinstance(code, int) or isinstance(code, bool) or not 0 <= code <= MAX_TYPE_WITHIN_EXTENSION
                or not isinstance(is_tensor, bool) or not isinstance(size, int) or isinstance(size, bool)
                or not 0 < size <= MAX_EXTENSION_TYPE or code in types):
            return None
        types[code] = OperandTypeInfo(is_tensor, size)
    return types


def _learn(device: Any) -> None:
    """Record the extensions ``device`` reports (called under the lock)."""
    try:
        extensions = list(device.get_supported_extensions())
    except Exception as error:  # noqa: BLE001 - a broken driver just contributes nothing
        vlog.model.debug("%s: get_supported_extensions failed: %s", getattr(device, "name", device), error)
        return
    for extension in extensions:
        name = getattr(extension, "name", None)
        types = _declared_types(extension)
        if not isinstance(name, str) or not name or types is None:
            vlog.model.debug("%s: ignoring a malformed extension declaration %r",
                             getattr(device, "name", device), extension)
            continue
        known = _by_name.get(name)
        if known is not None:
            if known.operand_types != types:
                # Android refuses such a pair too: one name must mean one set of types.
                vlog.model.debug("%s declares extension %s with other operand types than before; ignored",
                                 getattr(device, "name", device), name)
            continue
        prefix = len(_by_prefix) + 1
        if prefix > MAX_TYPE_WITHIN_EXTENSION:
            return
        _by_name[name] = _by_prefix[prefix] = KnownExtension(name, prefix, types)


def _refresh() -> None:
    if _device_source is None:
        return
    try:
        devices = list(_device_source())
    except Exception:  # noqa: BLE001 - discovery problems are reported by the manager
        return
    for device in devices:
        _learn(device)


def extension_named(name: str) -> KnownExtension | None:
    """The extension ``name`` if some device has reported it."""
    with _lock:
        if name not in _by_name:
            _refresh()
        return _by_name.get(name)


def extension_with_prefix(prefix: int) -> KnownExtension | None:
    """The extension that was given ``prefix``, if any."""
    with _lock:
        if prefix not in _by_prefix:
            _refresh()
        return _by_prefix.get(prefix)


def is_extension_type(value: int) -> bool:
    return int(value) >= EXTENSION_TYPE_BASE


def extension_prefix(value: int) -> int:
    """The prefix (the extension's number within a model) of an extension type value."""
    return int(value) >> _TYPE_WITHIN_EXTENSION_BITS


def split(value: int) -> tuple[int, int]:
    """(prefix, type within the extension) of an extension type value."""
    return extension_prefix(value), int(value) & MAX_TYPE_WITHIN_EXTENSION


def operand_type_info(value: int) -> OperandTypeInfo | None:
    """What the extension declares about operand type ``value``; None if unknown."""
    prefix, within = split(value)
    extension = extension_with_prefix(prefix)
    return None if extension is None else extension.operand_types.get(within)


def describe(value: int, kind: str) -> str:
    """A readable name for an extension type: ``com.example.fibonacci operand type 1``."""
    prefix, within = split(value)
    with _lock:
        extension = _by_prefix.get(prefix)
    if extension is None:
        return f"extension {kind} {within} (unknown prefix {prefix})"
    return f"{extension.name} {kind} {within}"


class ExtensionOperandCode(int):
    """An extension operand type value; ``name`` makes it read like an OperandCode."""

    __slots__ = ()

    @property
    def name(self) -> str:
        return describe(self, "operand type")

    @property
    def value(self) -> int:
        return int(self)

    def __repr__(self) -> str:
        return f"<{self.name}: {int(self):#x}>"


class ExtensionOperationCode(int):
    """An extension operation type value; ``name`` makes it read like an OperationCode."""

    __slots__ = ()

    @property
    def name(self) -> str:
        return describe(self, "operation")

    @property
    def value(self) -> int:
        return int(self)

    def __repr__(self) -> str:
        return f"<{self.name}: {int(self):#x}>"
