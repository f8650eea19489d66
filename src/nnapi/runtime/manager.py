"""Device discovery: the devices the runtime knows, ``nnapi-reference`` always first.

Other drivers register with ``register_device`` (tests use it for sample drivers).
"""

from __future__ import annotations

import threading

from nnapi.hal import IDevice

_lock = threading.Lock()
_devices: list[IDevice] = []


def _ensure_reference() -> None:
    if not _devices:
        from nnapi.drivers.reference import ReferenceDevice

        _devices.append(ReferenceDevice())


def hal_devices() -> list[IDevice]:
    with _lock:
        _ensure_reference()
        return list(_devices)


def register_device(device: IDevice) -> None:
    """Make a driver's device visible to get_devices() and to compilations."""
    with _lock:
        _ensure_reference()
        if any(existing.name == device.name for existing in _devices):
            raise ValueError(f"a device named {device.name!r} is already registered")
        _devices.append(device)


def unregister_device(name: str) -> None:
    with _lock:
        _devices[:] = [d for d in _devices if d.name != name or d.name == "nnapi-reference"]
