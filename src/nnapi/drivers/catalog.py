"""The drivers that ship with nnapi, by short name: what ``--driver NAME`` and
``nnapi serve --driver NAME`` accept besides ``pkg.module:factory``.

Each factory returns the devices of one driver; a driver whose optional dependency is
missing raises an error that says so (the plug-in loader reports it).
"""

from __future__ import annotations

import importlib

from nnapi.hal import IDevice


def reference() -> IDevice:
    """``nnapi-reference``, the reference CPU driver."""
    from nnapi.drivers.reference import ReferenceDevice

    return ReferenceDevice()


def sample() -> IDevice:
    """``nnapi-sample``: the sample driver claiming every implemented operation."""
    from nnapi.drivers.sample import SampleDevice

    return SampleDevice("nnapi-sample")


def faulty() -> IDevice:
    """``nnapi-faulty``: the fault-injecting sample driver (nnapi.drivers.sample.FaultyDevice)."""
    module = importlib.import_module("nnapi.drivers.sample")
    faulty_class = getattr(module, "FaultyDevice", None)
    if faulty_class is None:
        raise RuntimeError("this nnapi has no fault-injecting driver (nnapi.drivers.sample.FaultyDevice)")
    try:
        return faulty_class("nnapi-faulty")
    except TypeError:
        return faulty_class()


def ort() -> list[IDevice]:
    """The ONNX Runtime driver (``pip install 'nnapi[onnxruntime]'``); asked for by name
    without onnxruntime, it says what to install (its entry point finds no devices quietly)."""
    module = importlib.import_module("nnapi.drivers.ort")
    missing = getattr(module, "missing_dependency", lambda: None)()
    if missing is not None:
        raise RuntimeError(missing)
    for name in ("devices", "create_devices", "OrtDevice"):
        factory = getattr(module, name, None)
        if callable(factory):
            made = factory()
            return [made] if isinstance(made, IDevice) else list(made)
    raise RuntimeError("nnapi.drivers.ort has no device factory")


def fibonacci() -> IDevice:
    """``example-fibonacci``: the example vendor-extension driver (``com.example.fibonacci``;
    nnapi.drivers.example_fibonacci)."""
    from nnapi.drivers.example_fibonacci import FibonacciDevice

    return FibonacciDevice()


#: short name -> ``pkg.module:factory``
SHIPPED = {
    "reference": "nnapi.drivers.catalog:reference",
    "sample": "nnapi.drivers.catalog:sample",
    "faulty": "nnapi.drivers.catalog:faulty",
    "ort": "nnapi.drivers.catalog:ort",
    "fibonacci": "nnapi.drivers.catalog:fibonacci",
}
