"""Every CTS vector whose operations are all implemented must pass through the public API."""

from __future__ import annotations

import pytest

import nnapi
from nnapi.conformance import default_vector_files, is_supported, load_records, run_record

_RECORDS = [record for path in default_vector_files() for record in load_records(path) if is_supported(record)]


def test_vectors_are_shipped():
    assert len(default_vector_files()) == 3


@pytest.mark.parametrize("record", _RECORDS, ids=[f"{r['version']}-{r['test']}" for r in _RECORDS])
def test_vector(record):
    outcome = run_record(record)
    assert outcome.passed, outcome.message


def test_public_api_report():
    """run_conformance: per-test outcomes and per-operation counts, on a chosen device."""
    from nnapi.conformance import run_conformance

    device = next(d for d in nnapi.get_devices() if d.name == "nnapi-reference")
    seen = []
    report = run_conformance(device, operations=["sub"], on_outcome=lambda done, total, o: seen.append(done))
    assert report.outcomes and seen == list(range(1, len(report.outcomes) + 1))
    assert report.failed == 0 and report.passed == len(report.outcomes)
    assert report.by_operation()["SUB"]["passed"] == report.passed
    assert all("SUB" in o.operations for o in report.outcomes)
    # a wrong expected value is caught: the runner really compares
    record = next(r for r in load_records(default_vector_files()[2]) if r["test"].startswith("sub")
                  and r["main"]["operands"][r["main"]["outputIndexes"][0]]["type"] == "TENSOR_FLOAT32")
    output = record["main"]["operands"][record["main"]["outputIndexes"][0]]
    output["data"] = [v + 1 for v in output["data"]]
    (outcome,) = run_conformance(device, records=[record]).outcomes
    assert not outcome.passed and "values differ" in outcome.message
    with pytest.raises(ValueError, match="unknown variant"):
        run_conformance(device, variant="sideways")
