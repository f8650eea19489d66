"""tools/import_vs_litert.py, the differential fuzzer of the TFLite importer against LiteRT:
a short run finds no difference, cases are reproducible, and a planted difference is
reported (skipped without ai-edge-litert)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tflite")
pytest.importorskip("ai_edge_litert")

TOOLS = Path(__file__).resolve().parent.parent / "tools"
sys.path.insert(0, str(TOOLS))
import import_vs_litert as tool  # noqa: E402


def test_a_short_run_agrees_everywhere() -> None:
    """40 random cases (single operators and chains) on both devices: none DIFFER, RAW or
    CRASH, and the summary counts every case."""
    run = subprocess.run([sys.executable, str(TOOLS / "import_vs_litert.py"), "--count", "40", "--seed", "11"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    summary = next(line for line in run.stdout.splitlines() if line.startswith("40 cases (seed 11)"))
    assert "0 crashes, 0 hangs" in summary
    for device in tool.DEVICES:
        line = next(line for line in run.stdout.splitlines() if line.strip().startswith(device))
        assert "DIFFER 0" in line and "RAW 0" in line and "agree 0 " not in line, line


def test_cases_are_reproducible_and_a_planted_difference_is_reported() -> None:
    """The same seed and case number give the same model and inputs; LiteRT's outputs
    perturbed by one quantized step beyond the tolerance (or a float's 1e-3) are a DIFFER."""
    made = [tool.make_case(5, number, []) for number in range(30)]
    again = [tool.make_case(5, number, []) for number in range(30)]
    cases = [c for c in made if not isinstance(c, str)]
    assert cases and [getattr(c, "model", c) for c in made] == [getattr(c, "model", c) for c in again]
    checked = 0
    for case in cases:
        theirs = tool.litert(case.model, case.feeds)
        cls, _ = tool.classify(case, theirs, "nnapi-reference")
        if cls != "agree" or not any(t.dtype.kind in "fiu" and t.size for t in theirs):
            continue
        perturbed = []
        for t in theirs:
            if t.dtype.kind == "f":
                perturbed.append(t + np.float32(1e-3) * max(1.0, float(np.abs(t).max())))
            elif t.dtype.kind in "iu" and t.size:
                shifted = t.astype(np.int64) + tool.STEPS + 1
                perturbed.append(np.where(shifted > np.iinfo(t.dtype).max, t.astype(np.int64) - tool.STEPS - 1,
                                          shifted).astype(t.dtype))
            else:
                perturbed.append(t)
        assert tool.classify(case, perturbed, "nnapi-reference")[0] == "DIFFER", case.label
        checked += 1
    assert checked >= 5


def test_vs_reference_holds_a_device_to_the_reference_exactly() -> None:
    """--vs-reference: a quantized output one step from the reference's is a DIFFER (LiteRT's
    two-step tolerance would call it agree: how ORT's DoubleQDQPairsRemover went unseen),
    equal outputs keep their class, and a refusal where the reference ran is "declined"."""
    checked = 0
    for number in range(60):
        case = tool.make_case(9, number, ["ADD", "MUL", "QUANTIZE"])
        if isinstance(case, str) or case.kind not in tool.QUANT:
            continue
        reference = tool.device_outputs(case, tool.REFERENCE)
        if reference[2] is None or not any(o.dtype.kind in "iu" and o.size for o in reference[2]):
            continue
        assert tool._against_reference(case, reference[2], "agree", "", reference) == ("agree", "")
        moved = [np.where(o == np.iinfo(o.dtype).max, o - 1, o + 1).astype(o.dtype) if o.dtype.kind in "iu" else o
                 for o in reference[2]]
        cls, detail = tool._against_reference(case, reference[2], "agree", "", ("ran", "", moved))
        assert cls == "DIFFER" and ("1 steps" in detail or "1 off" in detail), detail
        assert tool._against_reference(case, None, "refused", "why", reference) == ("declined", "why")
        checked += 1
    assert checked >= 3
