import sys
from pathlib import Path

import pytest

# tests/helpers.py is imported as a plain module by the tests.
sys.path.insert(0, str(Path(__file__).parent))


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
