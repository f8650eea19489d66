"""Every CTS vector whose operations are all implemented must pass through the public API."""

from __future__ import annotations

import pytest

from nnapi.conformance import default_vector_files, is_supported, load_records, run_record

_RECORDS = [record for path in default_vector_files() for record in load_records(path) if is_supported(record)]


def test_vectors_are_shipped():
    assert len(default_vector_files()) == 3


@pytest.mark.parametrize("record", _RECORDS, ids=[f"{r['version']}-{r['test']}" for r in _RECORDS])
def test_vector(record):
    outcome = run_record(record)
    assert outcome.passed, outcome.message
