"""Devices: ANeuralNetworks_getDeviceCount / _getDevice and ANeuralNetworksDevice_*."""

from __future__ import annotations

import weakref

from nnapi.codes import DEFAULT_LOOP_TIMEOUT_NS, MAXIMUM_LOOP_TIMEOUT_NS, DeviceTypeCode, FeatureLevelCode
from nnapi.errors import NotConstructibleError, UnexpectedNullError
from nnapi.hal import Capabilities, IDevice
from nnapi.runtime import capabilities as _capabilities
from nnapi.runtime import manager


class Device:
    """ANeuralNetworksDevice: a handle on one driver device."""

    def __init__(self, hal_device: IDevice) -> None:
        """Devices come from get_devices / get_device; this wraps a driver's IDevice."""
        if hal_device is None:
            raise UnexpectedNullError("Device: no driver device given; use nnapi.get_devices()")
        if not isinstance(hal_device, IDevice):
            raise NotConstructibleError("Device cannot be constructed from "
                                        f"{type(hal_device).__name__}; use nnapi.get_devices()")
        self._hal = hal_device

    @property
    def name(self) -> str:
        """ANeuralNetworksDevice_getName."""
        return self._hal.name

    @property
    def version(self) -> str:
        """ANeuralNetworksDevice_getVersion."""
        return self._hal.version_string

    @property
    def type(self) -> DeviceTypeCode:
        """ANeuralNetworksDevice_getType."""
        return DeviceTypeCode(self._hal.device_type)

    @property
    def feature_level(self) -> FeatureLevelCode:
        """ANeuralNetworksDevice_getFeatureLevel."""
        return FeatureLevelCode(self._hal.feature_level)

    @property
    def capabilities(self) -> Capabilities:
        """The device's performance figures (no NDK call: what the partitioner weighs), as
        the runtime validated its driver's answer once (runtime.capabilities): "no
        performance information" -- every figure infinite -- where it did not validate
        (``capabilities_problem`` says why)."""
        return _capabilities.of(self._hal)

    @property
    def capabilities_problem(self) -> str | None:
        """What was wrong with the capabilities the device's driver answered; None when
        nothing was."""
        return _capabilities.read(self._hal)[1]

    def get_extension_support(self, extension_name: str) -> bool:
        """ANeuralNetworksDevice_getExtensionSupport: whether the device's driver supports
        the vendor extension ``extension_name`` (IDevice.get_supported_extensions). A
        driver whose query fails supports none."""
        from nnapi.errors import BadDataError

        if extension_name is None:
            raise UnexpectedNullError("get_extension_support: extension_name is None")
        if not isinstance(extension_name, str):
            raise BadDataError(f"get_extension_support: extension_name must be a str, got "
                               f"{type(extension_name).__name__}")
        try:
            extensions = list(self._hal.get_supported_extensions())
        except Exception:  # noqa: BLE001 - a broken driver's answer: no extensions
            return False
        return any(getattr(extension, "name", None) == extension_name for extension in extensions)

    def wait(self) -> None:
        """ANeuralNetworksDevice_wait: block until the device is available."""
        self._hal.wait()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Device) and other._hal is self._hal

    def __hash__(self) -> int:
        return id(self._hal)

    def __repr__(self) -> str:
        return f"Device(name={self.name!r}, type={self.type.name}, feature_level={self.feature_level.name})"


#: One Device per driver device while anyone holds it, so get_devices() hands out the same
#: objects each time. Weak: a device unregistered (manager.unregister_device) is not kept
#: here -- a driver service's connection, its shared memory and sockets, goes with the last
#: Compilation or Memory still using it.
_wrappers: weakref.WeakValueDictionary[int, Device] = weakref.WeakValueDictionary()


def get_devices() -> list[Device]:
    """All devices (ANeuralNetworks_getDeviceCount + ANeuralNetworks_getDevice), the same
    Device objects on every call."""
    return [wrap(hal_device) for hal_device in manager.hal_devices()]


def no_device_message(name: str, names: list[str]) -> str:
    """What every caller taking a device by name says when none has it: "no device named
    NAME (devices: the ``names`` there are)", and why, when NAME is an ONNX Runtime device
    missing a dependency here."""
    from nnapi.drivers.ort import absence_note

    return f"no device named {name!r} (devices: {', '.join(names)}){absence_note(name)}"


def wrap(hal_device: IDevice) -> Device:
    """The one Device object for a driver device."""
    wrapper = _wrappers.get(id(hal_device))
    if wrapper is None or wrapper._hal is not hal_device:
        wrapper = _wrappers[id(hal_device)] = Device(hal_device)
    return wrapper


def get_device(index: int) -> Device:
    """ANeuralNetworks_getDevice; BAD_DATA for an index out of range."""
    from nnapi.errors import BadDataError

    devices = get_devices()
    if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(devices):
        raise BadDataError(f"get_device: index {index!r} out of range ({len(devices)} devices)")
    return devices[index]


def get_device_count() -> int:
    """ANeuralNetworks_getDeviceCount."""
    return len(manager.hal_devices())


def get_runtime_feature_level() -> FeatureLevelCode:
    """ANeuralNetworks_getRuntimeFeatureLevel."""
    return FeatureLevelCode.FEATURE_LEVEL_8


def get_default_loop_timeout() -> int:
    """ANeuralNetworks_getDefaultLoopTimeout, in nanoseconds."""
    return DEFAULT_LOOP_TIMEOUT_NS


def get_maximum_loop_timeout() -> int:
    """ANeuralNetworks_getMaximumLoopTimeout, in nanoseconds."""
    return MAXIMUM_LOOP_TIMEOUT_NS
