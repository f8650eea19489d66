"""ONNX Runtime devices: an NNAPI driver on ONNX Runtime (optional extra ``nnapi[onnxruntime]``).

``devices()`` is the plug-in factory (entry point ``ort`` in the ``nnapi.drivers`` group):
one device per usable execution provider, ``nnapi-ort-cpu`` always and ``nnapi-ort-cuda``
(a GPU device) where onnxruntime-gpu finds a GPU. Without onnxruntime and onnx it returns
no devices.
"""

from __future__ import annotations

from nnapi.hal import IDevice

#: execution providers exposed as devices: provider -> (device name, device type name)
PROVIDERS = {
    "CPUExecutionProvider": ("nnapi-ort-cpu", "DEVICE_CPU"),
    "CUDAExecutionProvider": ("nnapi-ort-cuda", "DEVICE_GPU"),
}


def devices() -> list[IDevice]:
    """The ONNX Runtime devices this machine can run (ANeuralNetworks_getDevice lists them)."""
    try:
        import onnx  # noqa: F401
        import onnxruntime
    except ImportError:
        return []
    from nnapi.codes import DeviceTypeCode
    from nnapi.drivers.ort.device import OrtDevice

    available = set(onnxruntime.get_available_providers())
    return [OrtDevice(provider, name, DeviceTypeCode[kind])
            for provider, (name, kind) in PROVIDERS.items() if provider in available]
