"""The public API sketch of ARCHITECTURE.md runs as written, and the CLI works."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import nnapi
from nnapi.cli import main


def test_architecture_sketch():
    from nnapi import FuseCode
    from nnapi import OperandCode as T
    from nnapi import OperationCode as Op

    m = nnapi.Model()
    a = m.add_operand(nnapi.OperandType(T.TENSOR_FLOAT32, [2, 2]))
    b = m.add_operand(nnapi.OperandType(T.TENSOR_FLOAT32, [2, 2]))
    act = m.add_operand(nnapi.OperandType(T.INT32))
    out = m.add_operand(nnapi.OperandType(T.TENSOR_FLOAT32, [2, 2]))
    assert (a, b, act, out) == (0, 1, 2, 3)
    m.set_operand_value(act, np.int32(FuseCode.FUSED_NONE))
    m.add_operation(Op.ADD, [a, b, act], [out])
    m.identify_inputs_and_outputs([a, b], [out])
    m.finish()

    c = nnapi.Compilation(m)
    c.set_preference(nnapi.PreferenceCode.PREFER_FAST_SINGLE_ANSWER)
    c.finish()

    e = nnapi.Execution(c)
    e.set_input(0, np.ones((2, 2), np.float32))
    e.set_input(1, np.ones((2, 2), np.float32))
    y = np.empty((2, 2), np.float32)
    e.set_output(0, y)
    e.compute()
    assert e.get_output_operand_dimensions(0) == [2, 2]
    np.testing.assert_array_equal(y, np.full((2, 2), 2, np.float32))


def test_demo_model_matches_numpy():
    from nnapi.demo import build_demo_model, demo_expected, demo_input

    compilation = nnapi.Compilation(build_demo_model())
    compilation.finish()
    execution = nnapi.Execution(compilation)
    x = demo_input(3)
    y = np.empty((1, 4), np.float32)
    execution.set_input(0, x)
    execution.set_output(0, y)
    execution.compute()
    expected = demo_expected(x)
    np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-6)
    assert abs(float(y.sum()) - 1.0) < 1e-5
    assert expected.max() < 0.99  # scores are informative, not saturated


def test_cli_run(capsys):
    pytest.importorskip("tflite")
    assert main(["run", "--iterations", "2"]) == 0
    printed = capsys.readouterr().out
    assert "built-in model: MediaPipe hand re-crop" in printed and "2 runs" in printed
    # The printed crop box is what a Session computes for the same seeded input.
    from nnapi.cli._model import builtin_model_path
    from nnapi.session import random_inputs

    session = nnapi.Session(builtin_model_path())
    crop = session.run(random_inputs(session.inputs, seed=0))["output_crop"]
    assert f"max {float(crop.max()):.6g}" in printed


def test_cli_devices(capsys):
    assert main(["devices"]) == 0
    printed = capsys.readouterr().out
    assert "nnapi-reference" in printed and "FEATURE_LEVEL_8" in printed and "DEVICE_CPU" in printed


def test_cli_conformance_table(capsys):
    assert main(["conformance", "--quiet", "--ops", "SUB"]) == 0
    printed = capsys.readouterr().out
    assert printed.splitlines()[0].split() == ["operation", "passed", "failed", "declined", "not", "impl."]
    sub_row = next(line for line in printed.splitlines() if line.startswith("SUB "))
    assert int(sub_row.split()[1]) > 100 and int(sub_row.split()[2]) == 0


def test_cli_unknown_device_and_help():
    result = subprocess.run([sys.executable, "-m", "nnapi", "run", "--device", "nope"],
                            capture_output=True, text=True)
    assert result.returncode != 0 and "no device named 'nope'" in result.stderr
    for command in ([], ["devices"], ["run"], ["conformance"]):
        helped = subprocess.run([sys.executable, "-m", "nnapi", *command, "--help"], capture_output=True, text=True)
        assert helped.returncode == 0 and "usage: nnapi" in helped.stdout


def test_cli_conformance_variant(capsys):
    assert main(["conformance", "--quiet", "--ops", "MUL", "--variant", "quant8_signed"]) == 0
    printed = capsys.readouterr().out
    mul_row = next(line for line in printed.splitlines() if line.startswith("MUL "))
    assert int(mul_row.split()[1]) > 0 and int(mul_row.split()[2]) == 0
