"""Random arguments to public calls raise NnapiError, never a raw Python exception."""

from __future__ import annotations

import inspect

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import nnapi
from nnapi import OperandCode as T
from nnapi import OperandType
from nnapi import OperationCode as Op

junk = st.one_of(
    st.none(), st.integers(-(2**40), 2**40), st.floats(allow_nan=True), st.text(max_size=3),
    st.binary(max_size=16), st.booleans(), st.lists(st.integers(-5, 5), max_size=4),
    st.sampled_from([np.zeros(2, np.float32), np.zeros((2, 2), np.int8), object()]),
)


def small_model(finish: bool = True) -> nnapi.Model:
    model = nnapi.Model()
    for _ in range(2):
        model.add_operand(OperandType(T.TENSOR_FLOAT32, [2]))
    act = model.add_operand(OperandType(T.INT32))
    out = model.add_operand(OperandType(T.TENSOR_FLOAT32, [2]))
    model.set_operand_value(act, 0)
    model.add_operation(Op.ADD, [0, 1, act], [out])
    model.identify_inputs_and_outputs([0, 1], [out])
    if finish:
        model.finish()
    return model


def call_with_junk(target, method: str, data) -> None:
    """Call ``target.method`` with as many junk arguments as it takes."""
    function = getattr(target, method)
    parameters = [p for p in inspect.signature(function).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = sum(1 for p in parameters if p.default is p.empty)
    count = data.draw(st.integers(required, len(parameters)))
    args = [data.draw(junk) for _ in range(count)]
    only_nnapi_errors(lambda: function(*args))


def only_nnapi_errors(call) -> None:
    try:
        call()
    except nnapi.NnapiError:
        pass


@settings(max_examples=150, deadline=None)
@given(method=st.sampled_from(["add_operand", "set_operand_value", "set_operand_value_from_memory",
                               "set_operand_value_from_model", "set_operand_symm_per_channel_quant_params",
                               "add_operation", "identify_inputs_and_outputs"]),
       data=st.data())
def test_model_calls(method, data):
    call_with_junk(small_model(finish=False), method, data)


@settings(max_examples=150, deadline=None)
@given(type_code=junk, dims=junk, scale=junk, zero_point=junk)
def test_operand_type_construction(type_code, dims, scale, zero_point):
    def build():
        nnapi.Model().add_operand(OperandType(type_code, dims, scale, zero_point))

    only_nnapi_errors(build)


@settings(max_examples=150, deadline=None)
@given(method=st.sampled_from(["set_input", "set_output", "set_input_from_memory", "set_output_from_memory",
                               "set_measure_timing", "set_timeout", "set_loop_timeout", "get_duration",
                               "get_output_operand_rank", "get_output_operand_dimensions",
                               "burst_compute", "start_compute_with_dependencies"]),
       data=st.data())
def test_execution_calls(method, data):
    compilation = nnapi.Compilation(small_model())
    compilation.finish()
    call_with_junk(nnapi.Execution(compilation), method, data)


@settings(max_examples=100, deadline=None)
@given(method=st.sampled_from(["set_preference", "set_priority", "set_timeout", "set_caching",
                               "get_preferred_memory_alignment_for_input",
                               "get_preferred_memory_padding_for_output"]),
       data=st.data())
def test_compilation_calls(method, data):
    call_with_junk(nnapi.Compilation(small_model()), method, data)


# --- random sequences of calls across all objects (tools/fuzz_api.py) ---------------------------
def load_sequence_fuzzer():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "tools" / "fuzz_api.py"
    spec = importlib.util.spec_from_file_location("fuzz_api", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_random_call_sequences():
    """A short run of the sequence fuzzer (lifetimes, use after free, calls after finish,
    hostile descriptors, strided and odd-dtype arrays, numpy error states), each worker in
    a subprocess: no raw exception, crash, hang or wrong result. The long run is
    ``python tools/fuzz_api.py --minutes 5``."""
    from concurrent.futures import ThreadPoolExecutor

    fuzz = load_sequence_fuzzer()
    with ThreadPoolExecutor(2) as pool:
        reports = list(pool.map(fuzz.run_worker, [101, 202], [600, 600], [0, 0]))
    summary = fuzz.summarize(reports)
    assert summary["calls"] == 1200, summary
    assert summary["checked"] > 0  # some computations succeeded and were compared with numpy
    assert summary["raw_causes"] == {}, summary["raw_examples"]
    assert summary["crashes"] == [] and summary["hangs"] == []
    assert summary["wrong_results"] == 0, summary["wrong_examples"]


def test_sequence_fuzzer_catches_a_raw_exception(monkeypatch):
    """The harness itself: a raw exception inside nnapi is counted with where it came from."""
    fuzz = load_sequence_fuzzer()
    worker = fuzz.Worker(1)

    def broken(*args):
        raise KeyError("planted")

    monkeypatch.setattr(nnapi.Memory, "create_shared", staticmethod(broken))
    monkeypatch.setattr(worker.rng, "random", lambda: 0.0)
    worker.act_memory = lambda: nnapi.Memory.create_shared(8)
    worker.ACTIONS = ["act_memory"]
    worker.step()
    assert sum(worker.raw.values()) == 1 and next(iter(worker.raw)).startswith("KeyError at test_fuzz_api.py")
