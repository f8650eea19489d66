"""A bounded, seeded run of file_fuzz.py (the structure-aware fuzzer of the files nnapi reads
back): nnapi-reference's compilation cache, nnapi-ort-cpu's, and CTS vector files, each
decoded, its content mutated and written back with valid checksums. The fuzzer raises
AssertionError on a property broken (a raw exception at the HAL or the public API, a changed
cache used by a compilation, outputs other than a fresh compilation's, a vector file refused
without naming its file and line); the counts show both paths were taken, and that files
holding another valid model were made (the driver prepares them when the fuzzer grants them
a record; the public API, whose driver has none, recompiles).
A long run: ``python tests/file_fuzz.py --target reference|ort|vectors --cases N --seed S``."""

from __future__ import annotations

import pytest

import file_fuzz


def test_reference_cache_files(tmp_path):
    counts = file_fuzz.fuzz_reference_cache(seed=11, cases=300, directory=str(tmp_path))
    assert sum(counts.values()) >= 600  # the driver's outcome and the public API's, per case
    assert counts["rejected: INVALID_ARGUMENT"] > 50 and counts["rejected: GENERAL_FAILURE"] > 20
    assert counts["same outputs recompiled"] > 100 and counts["same outputs from cache"] > 0
    assert counts["prepared another model (record granted)"] > 0


def test_ort_cache_files(tmp_path):
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    counts = file_fuzz.fuzz_ort_cache(seed=11, cases=150, directory=str(tmp_path))
    assert counts["prepared"] > 20 and counts["rejected: GENERAL_FAILURE"] > 20
    assert counts["same outputs recompiled"] > 20 and counts["same outputs from cache"] > 10
    assert counts["prepared a changed file (record granted)"] > 0


def test_vector_files(tmp_path):
    counts = file_fuzz.fuzz_vector_files(seed=11, cases=300, directory=str(tmp_path), run_every=2)
    assert counts["refused"] > 100 and counts["passed"] > 10 and counts["failed cleanly"] > 10
