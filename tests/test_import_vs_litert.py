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


_CRASHING = '''
import os
import signal
import sys

sys.path.insert(0, os.environ["TOOLS_DIR"])
import import_vs_litert as tool  # noqa: E402

_real = tool.make_case


def make_case(seed, number, only):
    if number == 2:  # a segfault while generating case 2 (as LiteRT's on some empty tensors)
        os.kill(os.getpid(), signal.SIGSEGV)
    return _real(seed, number, only)


tool.make_case = make_case  # in the spawned worker too, which imports this module again
if __name__ == "__main__":
    sys.argv = ["import_vs_litert.py", "--count", "4", "--seed", "11", "--device", "nnapi-reference"]
    sys.exit(tool.main())
'''


def test_a_crash_is_blamed_on_the_case_and_stage_it_happened_in(tmp_path) -> None:
    """A worker that dies while generating case 2 is reported as case 2 crashing in
    generate, and case 1 is counted: the messages were sent through a Queue, whose feeder
    thread had not yet written the last ones when the worker died, so such a crash was
    blamed on case 1's last stage ("case 1: CRASH (exit -11) in nnapi-reference", case 1
    lost; seen as LiteRT segfaults reported "in nnapi-ort-cpu", seeds 503 and 512)."""
    import os

    script = tmp_path / "crashing.py"
    script.write_text(_CRASHING)
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "TOOLS_DIR": str(TOOLS)})
    crashes = [line for line in run.stdout.splitlines() if "CRASH" in line and line.startswith("case")]
    assert crashes == ["case 2: CRASH (exit -11) in generate"], run.stdout[-3000:]
    summary = next(line for line in run.stdout.splitlines() if line.startswith("4 cases (seed 11)"))
    assert "1 crashes" in summary
    valid = int(summary.split(": ")[1].split(" valid")[0])
    skipped = sum(int(part.split()[0]) for part in summary.split(", ")[1:5])
    assert valid + skipped == 3, summary  # cases 0, 1 and 3 all counted
