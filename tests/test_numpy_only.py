"""numpy is the only required dependency: with every optional package hidden, nnapi imports,
runs a model on nnapi-reference, and what needs an extra says which one."""

from __future__ import annotations

import subprocess
import sys
import textwrap

#: the import names of every optional extra's packages (pyproject.toml) and of the test tools
OPTIONAL = ["tflite", "flatbuffers", "onnx", "onnxruntime", "msgpack", "numba", "cffi", "tqdm", "ai_edge_litert",
            "threadpoolctl", "hypothesis"]

SCRIPT = textwrap.dedent("""
    import sys
    for name in {optional!r}:
        sys.modules[name] = None  # an import of it raises ImportError, as if not installed
    import numpy as np
    import nnapi
    from nnapi import OperandCode as T, OperandType, OperationCode as Op
    print([device.name for device in nnapi.get_devices()])
    model = nnapi.Model()
    a = model.add_operand(OperandType(T.TENSOR_FLOAT32, [2]))
    b = model.add_operand(OperandType(T.TENSOR_FLOAT32, [2]))
    act = model.add_operand(OperandType(T.INT32))
    model.set_operand_value(act, 0)
    y = model.add_operand(OperandType(T.TENSOR_FLOAT32, [2]))
    model.add_operation(Op.ADD, [a, b, act], [y])
    model.identify_inputs_and_outputs([a, b], [y])
    model.finish()
    compilation = nnapi.Compilation(model)
    compilation.finish()
    execution = nnapi.Execution(compilation)
    out = np.zeros(2, np.float32)
    execution.set_input(0, np.array([1, 2], np.float32))
    execution.set_input(1, np.array([10, 20], np.float32))
    execution.set_output(0, out)
    execution.compute()
    print(out.tolist())
    try:
        nnapi.load_tflite(sys.argv[1])
    except nnapi.NnapiError as error:
        print(type(error).__name__, error)
""")


def test_nnapi_runs_with_numpy_alone(tmp_path):
    model = tmp_path / "any.tflite"
    model.write_bytes(b"\0" * 64)
    result = subprocess.run([sys.executable, "-c", SCRIPT.format(optional=OPTIONAL), str(model)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    devices, values, refusal = result.stdout.strip().splitlines()
    assert devices == "['nnapi-reference']"
    assert values == "[11.0, 22.0]"
    assert refusal.startswith("BadDataError") and "needs the 'tflite' package" in refusal
