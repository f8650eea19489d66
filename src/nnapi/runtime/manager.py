"""Device discovery: the devices the runtime knows, ``nnapi-reference`` always first.

Where devices come from, in this order, the first time anyone asks for them:

1. ``nnapi-reference``, always;
2. driver plug-ins: every entry point of the ``nnapi.drivers`` group (a package declares
   ``[project.entry-points."nnapi.drivers"] my-npu = "my_npu.driver:devices"``);
3. ``NNAPI_DRIVERS=pkg.module:factory,...`` in the environment;
4. driver services named by ``NNAPI_REMOTE_DEVICES=PATH,...`` (Unix sockets of
   ``nnapi serve``; see ``nnapi.drivers.service``), or listed one per line in the file
   named by ``NNAPI_REMOTE_DEVICES_FILE``.

A factory returns one ``IDevice`` or an iterable of them. A plug-in that fails to load (the
import fails, the factory raises, returns something else, or a name is taken) is recorded
in ``load_failures()`` with its name and error and skipped; the others still load. Code
may add devices itself with ``register_device`` (tests do) or ``load_driver_spec``
(the CLI's ``--driver``).
"""

from __future__ import annotations

import importlib
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass

from nnapi import vlog
from nnapi.codes import DeviceTypeCode, FeatureLevelCode
from nnapi.hal import IDevice
from nnapi.runtime import type_manager

#: The entry-point group driver plug-ins declare.
ENTRY_POINT_GROUP = "nnapi.drivers"

_lock = threading.RLock()
_devices: list[IDevice] = []
_failures: list[LoadFailure] = []
_discovered = False
_loaded_specs: dict[str, list[IDevice]] = {}


@dataclass(frozen=True)
class LoadFailure:
    """A driver plug-in that could not be loaded: where it came from (``entry point``,
    ``NNAPI_DRIVERS``, ``--driver``, ``NNAPI_REMOTE_DEVICES``), its name or spec, and why."""

    source: str
    name: str
    error: str

    def __str__(self) -> str:
        return f"{self.name} ({self.source}): {self.error}"


class DriverLoadError(Exception):
    """A driver spec that could not be loaded; the message names it and the cause."""


def _ensure_reference() -> None:
    if not _devices:
        from nnapi.drivers.reference import ReferenceDevice

        _devices.append(ReferenceDevice())


def _discover() -> None:
    """Load plug-ins, NNAPI_DRIVERS and remote services once (called under the lock)."""
    global _discovered
    if _discovered:
        return
    _discovered = True
    for entry_point in _entry_points():
        _try_load("entry point", f"{entry_point.name} = {entry_point.value}", entry_point.load)
    for spec in _split(os.environ.get("NNAPI_DRIVERS", "")):
        _try_load("NNAPI_DRIVERS", spec, lambda spec=spec: resolve_factory(spec))
    for path in remote_service_paths():
        _try_connect(path)


def _entry_points() -> list:
    from importlib.metadata import entry_points

    try:
        return sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name)
    except Exception as error:  # a broken installed distribution's metadata
        _failures.append(LoadFailure("entry point", ENTRY_POINT_GROUP, f"{type(error).__name__}: {error}"))
        return []


def _split(value: str) -> list[str]:
    return [part.strip() for part in value.split(",") if part.strip()]


def remote_service_paths() -> list[str]:
    """The driver-service sockets named by NNAPI_REMOTE_DEVICES and NNAPI_REMOTE_DEVICES_FILE."""
    paths = _split(os.environ.get("NNAPI_REMOTE_DEVICES", ""))
    config = os.environ.get("NNAPI_REMOTE_DEVICES_FILE")
    if config:
        try:
            with open(config, encoding="utf-8") as handle:
                for line in handle:
                    line = line.split("#", 1)[0].strip()
                    if line:
                        paths.append(line)
        except OSError as error:
            _failures.append(LoadFailure("NNAPI_REMOTE_DEVICES_FILE", config, f"{type(error).__name__}: {error}"))
    return paths


def _try_load(source: str, name: str, get_factory: Callable[[], Callable]) -> None:
    try:
        _register_all(name, _call_factory(name, get_factory()))
    except Exception as error:  # a plug-in's own failure must not stop the others
        _failures.append(LoadFailure(source, name, _describe(error)))


def _try_connect(path: str) -> None:
    try:
        from nnapi.drivers.service.client import connect_devices

        _register_all(path, connect_devices(path))
    except Exception as error:
        _failures.append(LoadFailure("NNAPI_REMOTE_DEVICES", path, _describe(error)))


def _describe(error: BaseException) -> str:
    if isinstance(error, DriverLoadError):
        return str(error)
    return f"{type(error).__name__}: {error}"


def _call_factory(name: str, factory: Callable) -> list[IDevice]:
    if not callable(factory):
        raise DriverLoadError(f"{name} is a {type(factory).__name__}, not a callable factory")
    made = factory()
    if isinstance(made, IDevice):
        return [made]
    try:
        devices = list(made)
    except TypeError:
        raise DriverLoadError(f"{name} returned {type(made).__name__}, not an IDevice or an iterable of them") from None
    for device in devices:
        if not isinstance(device, IDevice):
            raise DriverLoadError(f"{name} returned a {type(device).__name__}, not an IDevice")
    return devices


def identity_problem(device: IDevice) -> str | None:
    """What is wrong with what ``device`` says it is -- its name, version string, type and
    feature level, which ANeuralNetworksDevice_getName / _getVersion / _getType /
    _getFeatureLevel hand to applications as they are -- or None when nothing is (Android
    refuses to register a driver whose device information does not validate)."""
    try:
        name, version = device.name, device.version_string
        device_type, level = device.device_type, device.feature_level
    except Exception as error:  # noqa: BLE001 - a driver's broken attribute
        return f"its identity cannot be read ({type(error).__name__}: {error})"
    if not isinstance(name, str) or not name:
        return f"a device without a name (name {name!r})"
    if not isinstance(version, str):
        return f"device {name!r}: version_string is a {type(version).__name__}, not a str"
    for field, value, kind in (("device_type", device_type, DeviceTypeCode),
                               ("feature_level", level, FeatureLevelCode)):
        try:
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError
            kind(value)
        except ValueError:
            return f"device {name!r}: {field} {value!r} is no {kind.__name__}"
    return None


def _register_all(name: str, devices: list[IDevice]) -> None:
    """Register every device of one plug-in, or none of them (a clash is the plug-in's failure)."""
    taken = {device.name for device in _devices}
    for device in devices:
        if (problem := identity_problem(device)) is not None:
            raise DriverLoadError(f"{name}: {problem}")
        if device.name in taken:
            raise DriverLoadError(f"{name}: a device named {device.name!r} is already registered")
        taken.add(device.name)
    _devices.extend(devices)


def hal_devices() -> list[IDevice]:
    """Every known device: nnapi-reference first, then plug-ins, then the rest."""
    with _lock:
        _ensure_reference()
        _discover()
        return list(_devices)


# Extension names get their prefixes from the devices' declarations.
type_manager.set_device_source(hal_devices)


def reference_device() -> IDevice:
    """The nnapi-reference device: the CPU fallback."""
    with _lock:
        _ensure_reference()
        return _devices[0]


def load_failures() -> list[LoadFailure]:
    """The driver plug-ins and services that could not be loaded, with their errors."""
    with _lock:
        _ensure_reference()
        _discover()
        return list(_failures)


def register_device(device: IDevice) -> None:
    """Make a driver's device visible to get_devices() and to compilations."""
    if not isinstance(device, IDevice):
        raise ValueError(f"register_device: expected an IDevice, got {type(device).__name__}")
    if (problem := identity_problem(device)) is not None:
        raise ValueError(f"register_device: {problem}")
    with _lock:
        _ensure_reference()
        if any(existing.name == device.name for existing in _devices):
            raise ValueError(f"a device named {device.name!r} is already registered")
        _devices.append(device)
    vlog.manager.debug("registered device %s", device.name)


def unregister_device(name: str) -> None:
    """Forget the device named ``name`` (never nnapi-reference): get_devices() no longer
    lists it and the runtime keeps no reference to it, so its driver's resources (a driver
    service's connection, shared memory and sockets) are freed once no Compilation or
    Memory uses it; those that still do keep working, as Android's compilations hold
    their device."""
    with _lock:
        _devices[:] = [d for d in _devices if d.name != name or d.name == "nnapi-reference"]
        for spec, devices in list(_loaded_specs.items()):
            if any(d.name == name for d in devices):
                del _loaded_specs[spec]  # loading the spec again makes its devices afresh


def resolve_factory(spec: str) -> Callable:
    """The factory a driver spec names: ``pkg.module:factory`` (an attribute path after the
    colon, ``pkg.mod:Class.create`` works) or a shipped driver's short name
    (``nnapi.drivers.catalog``: reference, sample, faulty, ort, fibonacci).
    Raises DriverLoadError naming the spec and the cause."""
    from nnapi.drivers.catalog import SHIPPED

    spec = spec.strip()
    target = SHIPPED.get(spec, spec)
    module_name, _, attribute = target.partition(":")
    if not module_name or not attribute:
        known = ", ".join(SHIPPED)
        raise DriverLoadError(f"{spec!r}: expected pkg.module:factory or a shipped driver ({known})")
    try:
        value = importlib.import_module(module_name)
    except Exception as error:
        raise DriverLoadError(f"{spec}: cannot import {module_name}: {type(error).__name__}: {error}") from error
    for part in attribute.split("."):
        try:
            value = getattr(value, part)
        except AttributeError:
            raise DriverLoadError(f"{spec}: {module_name} has no attribute {attribute!r}") from None
    return value


def make_devices(spec: str) -> list[IDevice]:
    """The devices a driver spec's factory makes, not registered (``nnapi serve`` hosts them)."""
    try:
        return _call_factory(spec, resolve_factory(spec))
    except DriverLoadError:
        raise
    except Exception as error:
        raise DriverLoadError(f"{spec}: the factory failed: {type(error).__name__}: {error}") from error


def load_driver_spec(spec: str) -> list[IDevice]:
    """Import ``pkg.module:factory`` (or a shipped driver's short name), call the factory and
    register the devices it returns (one IDevice or an iterable of them). Raises
    DriverLoadError naming the spec and the cause; nothing is registered then. Loading the
    same spec again returns the devices already loaded, and so does naming a driver already
    discovered (an entry point such as ``ort``): its devices, same names and classes, are
    registered already. One of its devices unregistered since is made and registered again;
    its siblings still registered stay as they are."""
    with _lock:
        if spec in _loaded_specs:
            return list(_loaded_specs[spec])
    devices = make_devices(spec)
    with _lock:
        _ensure_reference()
        _discover()
        registered = {device.name: device for device in _devices}
        same = [registered.get(device.name) for device in devices]
        # A device already registered under the same name and class is this spec's (loaded
        # before, or discovered): kept. The others -- all of them the first time, one that
        # was unregistered since -- are registered, all or none.
        _register_all(spec, [new for old, new in zip(same, devices, strict=True)
                             if old is None or type(old) is not type(new)])
        devices = [new if old is None else old for old, new in zip(same, devices, strict=True)]
        _loaded_specs[spec] = devices
    return devices
