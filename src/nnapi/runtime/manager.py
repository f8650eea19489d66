"""Device discovery: the devices the runtime knows, ``nnapi-reference`` always first.

Other drivers register with ``register_device`` (tests use it for sample drivers).
"""

from __future__ import annotations

import threading

from nnapi import vlog
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


def reference_device() -> IDevice:
    """The nnapi-reference device: the CPU fallback."""
    with _lock:
        _ensure_reference()
        return _devices[0]


def register_device(device: IDevice) -> None:
    """Make a driver's device visible to get_devices() and to compilations."""
    with _lock:
        _ensure_reference()
        if any(existing.name == device.name for existing in _devices):
            raise ValueError(f"a device named {device.name!r} is already registered")
        _devices.append(device)
    vlog.manager.debug("registered device %s", device.name)


def unregister_device(name: str) -> None:
    with _lock:
        _devices[:] = [d for d in _devices if d.name != name or d.name == "nnapi-reference"]


def load_driver_spec(spec: str) -> list[IDevice]:
    """Import ``pkg.module:factory``, call the factory and register the devices it returns
    (one IDevice or an iterable of them)."""
    import importlib

    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise ValueError(f"expected pkg.module:factory, got {spec!r}")
    factory = getattr(importlib.import_module(module_name), attribute)
    made = factory()
    devices = [made] if isinstance(made, IDevice) else list(made)
    for device in devices:
        if not isinstance(device, IDevice):
            raise TypeError(f"{spec} returned {type(device).__name__}, not an IDevice")
        register_device(device)
    return devices
