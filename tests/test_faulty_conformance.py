"""CTS vectors through a non-faulty FaultyDevice beside nnapi-reference give exactly the
reference's results: whole models on the other device, and models partitioned between
the two (the FaultyDevice claiming only even-numbered operations). A subset runs in the
suite; NNAPI_FULL_CONFORMANCE=1 runs every vector."""

from __future__ import annotations

import os

import numpy as np
import pytest

import nnapi
from helpers import only_devices
from nnapi import OperationCode as Op
from nnapi.conformance import (
    DTYPES,
    _array,
    _operand_type,
    build_model,
    default_vector_files,
    is_supported,
    load_records,
)
from nnapi.drivers.sample import FaultyDevice
from nnapi.operand import OperandCode as T

_ALL = [record for path in default_vector_files() for record in load_records(path) if is_supported(record)]
_STRIDE = 1 if os.environ.get("NNAPI_FULL_CONFORMANCE") else 25
_RECORDS = [record for number, record in enumerate(_ALL) if number % _STRIDE == 0 and not record.get("expectFailure")]


def outputs_of(record: dict, devices) -> tuple[list[np.ndarray], list[str]]:
    keep: list = []
    model = build_model(record, keep=keep)
    compilation = nnapi.Compilation(model, devices)
    compilation.finish()
    execution = nnapi.Execution(compilation)
    main = record["main"]
    for position, index in enumerate(main["inputIndexes"]):
        operand = main["operands"][index]
        if not operand["data"]:
            execution.set_input(position, None)
            continue
        value = _array(operand["data"], T[operand["type"]])
        dims = operand["dimensions"]
        value = value.reshape([value.size] if dims and 0 in dims else dims)
        keep.append(value)
        execution.set_input(position, value)
    outputs = []
    for position, index in enumerate(main["outputIndexes"]):
        operand = main["operands"][index]
        declared = _operand_type(operand)
        count = len(operand["data"] or []) if not declared.is_fully_specified else declared.element_count()
        buffer = np.zeros(max(count, 0), dtype=DTYPES[T[operand["type"]]])
        outputs.append(buffer)
        execution.set_output(position, buffer)
    execution.compute()
    return outputs, compilation.step_devices


@pytest.fixture(scope="module", params=["whole", "partitioned"])
def faulty(request):
    supported = None if request.param == "whole" else {op for op in Op if op % 2 == 0}
    device = FaultyDevice(f"faulty-{request.param}", supported=supported)
    with only_devices(device):  # the runtime chooses between it and nnapi-reference alone
        yield device


@pytest.mark.parametrize("record", _RECORDS, ids=[f"{r['version']}-{r['test']}" for r in _RECORDS])
def test_same_results_as_the_reference_alone(faulty, record):
    reference = [d for d in nnapi.get_devices() if d.name == "nnapi-reference"]
    expected, _ = outputs_of(record, reference)
    actual, steps = outputs_of(record, None)
    if faulty.supported is None:
        assert steps == [faulty.name]
    for position, (want, got) in enumerate(zip(expected, actual, strict=True)):
        assert want.dtype == got.dtype and want.shape == got.shape
        assert np.array_equal(want, got, equal_nan=want.dtype.kind in "fc"), f"output {position} differs"
