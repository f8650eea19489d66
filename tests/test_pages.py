"""nnapi-reference keeps its intermediates' pages between executions (drivers/_pages.py):
counted as page faults per execution in a fresh interpreter, with and without it."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                                reason="mallopt settings are glibc's")

# A chain of ADDs on 1 MiB tensors: 8 MiB of intermediates freed after each execution.
_SCRIPT = """
import json, resource
import numpy as np
import nnapi
from nnapi import OperandCode as T, OperandType, OperationCode as Op
from nnapi.drivers import _pages

model = nnapi.Model()
tensor = OperandType(T.TENSOR_FLOAT32, [512, 512])
fuse = model.add_operand(OperandType(T.INT32, []))
model.set_operand_value(fuse, np.int32(0))
first = current = model.add_operand(tensor)
for _ in range(8):
    following = model.add_operand(tensor)
    model.add_operation(Op.ADD, [current, current, fuse], [following])
    current = following
model.identify_inputs_and_outputs([first], [current])
model.finish()
compilation = nnapi.Compilation(model, [d for d in nnapi.get_devices() if d.name == "nnapi-reference"])
compilation.finish()
x, out = np.ones((512, 512), np.float32), np.empty((512, 512), np.float32)

def run():
    execution = nnapi.Execution(compilation)
    execution.set_input(0, x)
    execution.set_output(0, out)
    execution.compute()

for _ in range(3):
    run()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    run()
faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 10
assert out[0, 0] == 256.0
print(json.dumps({"faults": faults, "trim": _pages._trim_set}))
"""


def _faults(keep: bool) -> dict:
    env = dict(os.environ, NNAPI_KEEP_PAGES="1" if keep else "0")
    result = subprocess.run([sys.executable, "-c", _SCRIPT], env=env, capture_output=True, text=True, timeout=120,
                            check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_intermediate_pages_are_not_faulted_in_again_at_every_execution():
    without, kept = _faults(False), _faults(True)
    assert without["trim"] == 0
    assert without["faults"] > 500  # glibc gave the 8 MiB back and faulted it in again: the case exists
    assert kept["trim"] >= 2 * 8 * (1 << 20)
    assert kept["faults"] < without["faults"] / 20


def test_the_kept_bytes_are_twice_the_intermediates_within_bounds():
    from nnapi.drivers import _pages

    assert _pages.trim_threshold(0) == 64 << 20
    assert _pages.trim_threshold(100 << 20) == 200 << 20
    assert _pages.trim_threshold(3 << 40) == 1 << 30


def test_keep_pages_never_lowers_the_threshold():
    from nnapi.drivers import _pages

    if os.environ.get("NNAPI_KEEP_PAGES") == "0":
        pytest.skip("turned off in this environment")
    current = _pages.keep_pages(0)  # the minimum: changes nothing once a model was prepared
    assert current >= 64 << 20
    assert _pages.keep_pages(1 << 20) == current
