"""ONNX Runtime devices: an NNAPI driver on ONNX Runtime (optional extra ``nnapi[onnxruntime]``).

``devices()`` is the plug-in factory (entry point ``ort`` in the ``nnapi.drivers`` group):
one device per usable execution provider, ``nnapi-ort-cpu`` always and ``nnapi-ort-cuda``
(a GPU device) where onnxruntime-gpu finds a GPU. Without onnxruntime and onnx it returns
no devices.
"""

from __future__ import annotations

import os

from nnapi.hal import IDevice

#: execution providers exposed as devices: provider -> (device name, device type name)
PROVIDERS = {
    "CPUExecutionProvider": ("nnapi-ort-cpu", "DEVICE_CPU"),
    "CUDAExecutionProvider": ("nnapi-ort-cuda", "DEVICE_GPU"),
}


def gpu_present() -> bool:
    """Whether the kernel exposes a GPU the CUDA provider could use (an NVIDIA driver's
    /proc entries or device nodes, WSL's /dev/dxg): read from the file system, so listing
    devices loads no CUDA library. The provider itself is checked when a model is
    prepared (OrtDevice refuses a session onnxruntime moved to the CPU)."""
    try:
        if any(os.scandir("/proc/driver/nvidia/gpus")):
            return True
    except OSError:
        pass
    return os.path.exists("/dev/nvidia0") or os.path.exists("/dev/dxg")


def usable_providers() -> list[str]:
    """The providers of PROVIDERS this machine can run: onnxruntime's available ones, the
    CUDA provider only where a GPU is present (onnxruntime-gpu lists it on any machine)."""
    import onnxruntime

    available = set(onnxruntime.get_available_providers())
    return [provider for provider in PROVIDERS if provider in available
            and (provider != "CUDAExecutionProvider" or gpu_present())]


#: what to install for these devices
INSTALL = "pip install 'nnapi[onnxruntime]'"


def missing_dependency() -> str | None:
    """Why these devices cannot exist here (onnxruntime or onnx does not import), naming
    what to install; None when both import."""
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
    except ImportError as error:
        return f"the ONNX Runtime devices need onnxruntime and onnx ({INSTALL}): {error}"
    return None


def absence_note(name: str) -> str:
    """What to add to "no device named NAME": why, when NAME is an ONNX Runtime device that
    cannot exist here for a missing dependency ("; the ONNX Runtime devices need ..."),
    else nothing."""
    if name not in {device_name for device_name, _ in PROVIDERS.values()}:
        return ""
    missing = missing_dependency()
    return f"; {missing}" if missing is not None else ""


def devices() -> list[IDevice]:
    """The ONNX Runtime devices this machine can run (ANeuralNetworks_getDevice lists them)."""
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
    except ImportError:
        return []
    from nnapi.codes import DeviceTypeCode
    from nnapi.drivers.ort.device import OrtDevice

    found: list[IDevice] = []
    for provider in usable_providers():
        name, kind = PROVIDERS[provider]
        found.append(OrtDevice(provider, name, DeviceTypeCode[kind]))
    return found
