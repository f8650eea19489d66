"""The CTS vectors again, in variations the vector files do not have (as Android's test
generator derives them): TENSOR_QUANT8_ASYMM_SIGNED instead of TENSOR_QUANT8_ASYMM,
outputs and temporaries declared with unknown dimensions, and constants set from shared
memory. Every variant of every implemented vector must pass."""

from __future__ import annotations

import pytest

from nnapi.conformance import VARIANTS, default_vector_files, is_supported, load_records, run_record

_CASES = []
for _path in default_vector_files():
    for _record in load_records(_path):
        if not is_supported(_record):
            continue
        for _name, _make in VARIANTS.items():
            _variant = _make(_record)
            if _variant is not None:
                _CASES.append(_variant)


def test_every_variant_kind_has_cases():
    kinds = {name: sum(1 for case in _CASES if case["test"].endswith(name.replace("outputs", "output_shape")))
             for name in VARIANTS}
    assert all(count > 100 for count in kinds.values()), kinds


@pytest.mark.parametrize("record", _CASES, ids=[f"{r['version']}-{r['test']}" for r in _CASES])
def test_variant(record):
    outcome = run_record(record)
    assert outcome.passed, outcome.message
