import sys
from pathlib import Path

import pytest

# tests/helpers.py is imported as a plain module by the tests.
sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="session", autouse=True)
def cache_records(tmp_path_factory):
    """The drivers' private record of the cache files they wrote (drivers/cache_record.py)
    in a temporary directory for the whole run (the environment, so the processes the tests
    start use it too): the tests never read nor write ~/.cache/nnapi."""
    import os

    previous = os.environ.get("NNAPI_CACHE_RECORDS")
    os.environ["NNAPI_CACHE_RECORDS"] = str(tmp_path_factory.mktemp("cache-records"))
    yield os.environ["NNAPI_CACHE_RECORDS"]
    if previous is None:
        del os.environ["NNAPI_CACHE_RECORDS"]
    else:
        os.environ["NNAPI_CACHE_RECORDS"] = previous


@pytest.fixture
def register():
    """Register devices for one test: the runtime chooses among them and nnapi-reference
    only (plug-ins discovered on this machine are hidden meanwhile), and forgets them after."""
    from helpers import only_devices
    from nnapi.runtime import manager

    with only_devices():

        def add(device):
            manager.register_device(device)
            return device

        yield add


@pytest.fixture(scope="module")
def calibration_file():
    """nnapi-ort-cpu's calibration cache in a fresh temporary file for one test module (its
    path), so a module measures the device itself; the ORT test modules use it throughout."""
    import os
    import tempfile

    with tempfile.TemporaryDirectory() as directory:
        previous = os.environ.get("NNAPI_ORT_CALIBRATION")
        os.environ["NNAPI_ORT_CALIBRATION"] = os.path.join(directory, "calibration.json")
        yield os.environ["NNAPI_ORT_CALIBRATION"]
        if previous is None:
            del os.environ["NNAPI_ORT_CALIBRATION"]
        else:
            os.environ["NNAPI_ORT_CALIBRATION"] = previous


@pytest.fixture(scope="module")
def ort_device():
    """nnapi-ort-cpu registered with the runtime (found by plug-in discovery when that is
    in place, registered here otherwise)."""
    import nnapi
    from nnapi.drivers.ort import devices
    from nnapi.runtime import manager

    registered = [d for d in manager.hal_devices() if d.name == "nnapi-ort-cpu"]
    if registered:
        yield nnapi.Device(registered[0])
        return
    device = devices()[0]
    manager.register_device(device)
    yield nnapi.Device(device)
    manager.unregister_device("nnapi-ort-cpu")
