"""Vendor extensions end to end (NeuralNetworksExtensions.h, the driver guide's vendor
extensions) with the shipped example driver ``com.example.fibonacci``: extension types
from the model, operands and operations of those types, extension data, the HAL model's
prefix mapping, compilation only on devices supporting the extension (never the CPU),
real Fibonacci values, partitioning around the extension operation, and misuse with the
exact NDK result codes."""

from __future__ import annotations

import struct

import numpy as np
import pytest

import nnapi
from helpers import only_devices
from nnapi import OperandCode as T
from nnapi import OperandType
from nnapi import OperationCode as Op
from nnapi.codes import ResultCode
from nnapi.drivers.example_fibonacci import (
    EXAMPLE_FIBONACCI,
    EXAMPLE_INT64,
    EXAMPLE_TENSOR_QUANT64_ASYMM,
    EXTENSION_NAME,
    QUANT64_PARAMS,
    FibonacciDevice,
    fibonacci_float32,
)
from nnapi.hal import serialize
from nnapi.runtime import manager
from nnapi.runtime.model_builder import build_hal_model

FIRST_20 = [1, 1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144, 233, 377, 610, 987, 1597, 2584, 4181, 6765]


@pytest.fixture
def fib_device():
    """The extension device beside nnapi-reference alone (plug-ins such as nnapi-ort-cpu would
    take the standard operations the tests expect on the reference)."""
    device = FibonacciDevice("test-fibonacci")
    with only_devices(device):
        yield device


def reference():
    return next(d for d in nnapi.get_devices() if d.name == "nnapi-reference")


def wrapped(device):
    return next(d for d in nnapi.get_devices() if d.name == device.name)


def fibonacci_model(n_type="float", output="float", params=(1.0, 0)):
    """n -> EXAMPLE_FIBONACCI -> output of unspecified length."""
    model = nnapi.Model()
    fibonacci = model.get_extension_operation_type(EXTENSION_NAME, EXAMPLE_FIBONACCI)
    if n_type == "float":
        n = model.add_operand(OperandType(T.TENSOR_FLOAT32, [1]))
    else:
        n = model.add_operand(OperandType(model.get_extension_operand_type(EXTENSION_NAME, EXAMPLE_INT64)))
    if output == "float":
        out = model.add_operand(OperandType(T.TENSOR_FLOAT32, [0]))
    else:
        out = model.add_operand(OperandType(model.get_extension_operand_type(
            EXTENSION_NAME, EXAMPLE_TENSOR_QUANT64_ASYMM), [0]))
        if params is not None:
            model.set_operand_extension_data(out, QUANT64_PARAMS.pack(*params))
    model.add_operation(fibonacci, [n], [out])
    model.identify_inputs_and_outputs([n], [out])
    model.finish()
    return model


def run(compilation, n_value, out):
    execution = nnapi.Execution(compilation)
    execution.set_input(0, n_value)
    execution.set_output(0, out)
    execution.compute()
    return execution


def code_of(excinfo) -> ResultCode:
    return excinfo.value.code


# --- NDK functions ------------------------------------------------------------------------
def test_extension_types_carry_the_prefix_and_the_code(fib_device):
    model = nnapi.Model()
    operand_type = model.get_extension_operand_type(EXTENSION_NAME, EXAMPLE_TENSOR_QUANT64_ASYMM)
    operation_type = model.get_extension_operation_type(EXTENSION_NAME, EXAMPLE_FIBONACCI)
    prefix = operand_type >> 16
    assert prefix >= 1
    assert operand_type & 0xFFFF == EXAMPLE_TENSOR_QUANT64_ASYMM
    assert operation_type == prefix << 16 | EXAMPLE_FIBONACCI
    # One prefix per extension for the whole process, as Android's TypeManager.
    assert nnapi.Model().get_extension_operand_type(EXTENSION_NAME, 7) == prefix << 16 | 7
    assert EXTENSION_NAME in operand_type.name


def test_device_get_extension_support(fib_device):
    assert wrapped(fib_device).get_extension_support(EXTENSION_NAME) is True
    assert wrapped(fib_device).get_extension_support("com.example.other") is False
    assert reference().get_extension_support(EXTENSION_NAME) is False
    with pytest.raises(nnapi.NnapiError) as excinfo:
        reference().get_extension_support(None)
    assert code_of(excinfo) == ResultCode.UNEXPECTED_NULL
    with pytest.raises(nnapi.NnapiError) as excinfo:
        reference().get_extension_support(b"com.example.fibonacci")
    assert code_of(excinfo) == ResultCode.BAD_DATA


def test_unknown_extension_and_bad_codes_are_bad_data(fib_device):
    model = nnapi.Model()
    for call in (model.get_extension_operand_type, model.get_extension_operation_type):
        with pytest.raises(nnapi.NnapiError) as excinfo:
            call("com.example.nobody_has_this", 0)
        assert code_of(excinfo) == ResultCode.BAD_DATA
        assert "com.example.nobody_has_this" in str(excinfo.value)
        for code in (-1, 1 << 16, 1.0, True):
            with pytest.raises(nnapi.NnapiError) as excinfo:
                call(EXTENSION_NAME, code)
            assert code_of(excinfo) == ResultCode.BAD_DATA
        with pytest.raises(nnapi.NnapiError) as excinfo:
            call(None, 0)
        assert code_of(excinfo) == ResultCode.UNEXPECTED_NULL


def test_extension_operands_follow_the_declared_type_information(fib_device):
    model = nnapi.Model()
    int64 = model.get_extension_operand_type(EXTENSION_NAME, EXAMPLE_INT64)
    quant64 = model.get_extension_operand_type(EXTENSION_NAME, EXAMPLE_TENSOR_QUANT64_ASYMM)
    scalar = model.add_operand(OperandType(int64))
    tensor = model.add_operand(OperandType(quant64, [4]))
    assert not model.operand_type(scalar).is_tensor and model.operand_type(scalar).byte_size() == 8
    assert model.operand_type(tensor).is_tensor and model.operand_type(tensor).byte_size() == 32
    model.add_operand(OperandType(quant64))  # unknown rank, like any tensor
    bad = [
        OperandType(int64, [1]),  # a scalar type with dimensions
        OperandType(quant64, [2], scale=0.5),  # quantization belongs in the extension data
        OperandType(quant64, [2], zero_point=1),
        OperandType((int64 >> 16) << 16 | 9, [2]),  # a type the extension does not declare
        OperandType(0x7FF0 << 16 | EXAMPLE_INT64),  # a prefix no extension has
    ]
    for operand_type in bad:
        with pytest.raises(nnapi.NnapiError) as excinfo:
            model.add_operand(operand_type)
        assert code_of(excinfo) == ResultCode.BAD_DATA, operand_type
    with pytest.raises(nnapi.NnapiError) as excinfo:
        OperandType(1 << 32)  # beyond 32 bits
    assert code_of(excinfo) == ResultCode.BAD_DATA


def test_extension_tensor_types_follow_the_uint32_size_rule(fib_device):
    """The rule base types follow (validateTensorDimensions), with the declared element
    size: 8 bytes times the specified dimensions must fit in uint32."""
    model = nnapi.Model()
    quant64 = model.get_extension_operand_type(EXTENSION_NAME, EXAMPLE_TENSOR_QUANT64_ASYMM)
    model.add_operand(OperandType(quant64, [65536, 0, 8191]))  # 2**32 - 2**19 bytes known
    for dims in ([65536, 8192], [65536, 0, 8192]):  # 2**32 bytes, specified or not
        with pytest.raises(nnapi.NnapiError) as excinfo:
            model.add_operand(OperandType(quant64, dims))
        assert code_of(excinfo) == ResultCode.BAD_DATA
        assert f"add_operand(1): {OperandType(quant64).type.name} of {len(dims)} dimensions" in str(excinfo.value)
        assert "its size overflows uint32: 8-byte elements" in str(excinfo.value)
    assert model.operand_count == 1


def test_extension_operand_values_have_the_declared_size(fib_device):
    model = nnapi.Model()
    int64 = model.get_extension_operand_type(EXTENSION_NAME, EXAMPLE_INT64)
    quant64 = model.get_extension_operand_type(EXTENSION_NAME, EXAMPLE_TENSOR_QUANT64_ASYMM)
    scalar = model.add_operand(OperandType(int64))
    tensor = model.add_operand(OperandType(quant64, [3]))
    for index, value in ((scalar, b"\0" * 4), (scalar, 5), (tensor, np.zeros(2, np.uint64))):
        with pytest.raises(nnapi.NnapiError) as excinfo:
            model.set_operand_value(index, value)
        assert code_of(excinfo) == ResultCode.BAD_DATA
    model.set_operand_value(scalar, np.int64(5))
    model.set_operand_value(tensor, np.zeros(3, np.uint64))


def test_set_operand_extension_data(fib_device):
    model = nnapi.Model()
    quant64 = model.get_extension_operand_type(EXTENSION_NAME, EXAMPLE_TENSOR_QUANT64_ASYMM)
    plain = model.add_operand(OperandType(T.TENSOR_FLOAT32, [2]))
    ext = model.add_operand(OperandType(quant64, [2]))
    params = QUANT64_PARAMS.pack(0.25, 7)
    model.set_operand_extension_data(ext, params)
    assert model.extension_data(ext) == params
    # Only extension operands have extension data; empty data is the NDK's (data, 0).
    for index, data in ((plain, params), (ext, b""), (2, params), (-1, params), (ext, 3)):
        with pytest.raises(nnapi.NnapiError) as excinfo:
            model.set_operand_extension_data(index, data)
        assert code_of(excinfo) == ResultCode.BAD_DATA, (index, data)
    model.set_operand_extension_data(ext, None)  # (NULL, 0) removes it
    assert model.extension_data(ext) is None
    model.set_operand_extension_data(ext, np.frombuffer(params, np.uint8))
    out = model.add_operand(OperandType(T.TENSOR_FLOAT32, [2]))
    act = model.add_operand(OperandType(T.INT32))
    model.set_operand_value(act, 0)
    model.add_operation(Op.ADD, [plain, plain, act], [out])
    model.identify_inputs_and_outputs([plain, ext], [out])
    model.finish()
    with pytest.raises(nnapi.NnapiError) as excinfo:
        model.set_operand_extension_data(ext, params)
    assert code_of(excinfo) == ResultCode.BAD_STATE
    # The HAL model carries the data on the operand and the extension's prefix.
    hal_model, _ = build_hal_model(model)
    assert hal_model.main.operands[ext].extension_data == params
    assert hal_model.main.operands[plain].extension_data is None
    assert [(e.name, e.prefix) for e in hal_model.extension_name_to_prefix] == [(EXTENSION_NAME, quant64 >> 16)]


def test_extension_operations(fib_device):
    model = nnapi.Model()
    fibonacci = model.get_extension_operation_type(EXTENSION_NAME, EXAMPLE_FIBONACCI)
    quant64 = model.get_extension_operand_type(EXTENSION_NAME, EXAMPLE_TENSOR_QUANT64_ASYMM)
    n = model.add_operand(OperandType(T.TENSOR_FLOAT32, [1]))
    out = model.add_operand(OperandType(T.TENSOR_FLOAT32, [0]))
    q = model.add_operand(OperandType(quant64, [2]))
    act = model.add_operand(OperandType(T.INT32))
    model.set_operand_value(act, 0)
    for code in (0x7FF0 << 16 | EXAMPLE_FIBONACCI, 1 << 32, -5):
        with pytest.raises(nnapi.NnapiError) as excinfo:
            model.add_operation(code, [n], [out])
        assert code_of(excinfo) == ResultCode.BAD_DATA
    with pytest.raises(nnapi.NnapiError) as excinfo:
        model.add_operation(fibonacci, [n], [7])  # operand index out of range
    assert code_of(excinfo) == ResultCode.BAD_DATA
    # Standard operations check their operands' types: an extension type is not theirs.
    with pytest.raises(nnapi.NnapiError) as excinfo:
        model.add_operation(Op.ADD, [q, q, act], [out])
    assert code_of(excinfo) == ResultCode.BAD_DATA
    model.add_operation(fibonacci, [n], [out])  # the runtime cannot check more than this
    with pytest.raises(nnapi.NnapiError) as excinfo:
        model.add_operation(fibonacci, [n], [out])  # written twice
    assert code_of(excinfo) == ResultCode.BAD_DATA


# --- compiling and running --------------------------------------------------------------
@pytest.mark.parametrize("n", [1, 2, 7, 20])
def test_fibonacci_float(fib_device, n):
    model = fibonacci_model()
    compilation = nnapi.Compilation(model)
    compilation.finish()
    assert compilation.step_devices == [fib_device.name]
    out = np.zeros(n, np.float32)
    execution = run(compilation, np.array([n], np.float32), out)
    assert out.tolist() == FIRST_20[:n]
    assert execution.get_output_operand_dimensions(0) == [n]


def test_fibonacci_int64_to_quant64(fib_device):
    model = fibonacci_model("int64", "quant64", params=(0.5, 3))
    compilation = nnapi.Compilation(model, [wrapped(fib_device)])
    compilation.finish()
    out = np.zeros(10, np.uint64)
    run(compilation, np.array(10, np.int64), out)
    assert out.tolist() == [f * 2 + 3 for f in FIRST_20[:10]]
    # bytes work as well as arrays for an extension operand
    raw = bytearray(8 * 10)
    run(compilation, struct.pack("<q", 10), raw)
    assert np.frombuffer(raw, np.uint64).tolist() == out.tolist()


def test_quant64_is_exact_over_the_whole_uint64_range(fib_device):
    model = fibonacci_model("int64", "quant64", params=(1.0, 0))
    compilation = nnapi.Compilation(model)
    compilation.finish()
    out = np.zeros(93, np.uint64)
    run(compilation, np.array(93, np.int64), out)
    expected = [1, 1]
    while len(expected) < 93:
        expected.append(expected[-1] + expected[-2])
    assert [int(v) for v in out] == expected  # F(93) = 12200160415121876738 < 2**64
    with pytest.raises(nnapi.NnapiError) as excinfo:  # F(94) does not fit
        run(compilation, np.array(94, np.int64), np.zeros(94, np.uint64))
    assert code_of(excinfo) == ResultCode.BAD_DATA


def test_float_values_beyond_float32_are_infinite():
    values = fibonacci_float32(200)
    assert np.isfinite(values[:185]).all() and np.isinf(values[186:]).all()
    assert values[99] == np.float32(354224848179261915075)


def test_output_too_small_reports_the_needed_dimensions(fib_device):
    model = fibonacci_model()
    compilation = nnapi.Compilation(model)
    compilation.finish()
    execution = nnapi.Execution(compilation)
    execution.set_input(0, np.array([9], np.float32))
    execution.set_output(0, np.zeros(4, np.float32))
    with pytest.raises(nnapi.NnapiError) as excinfo:
        execution.compute()
    assert code_of(excinfo) == ResultCode.OUTPUT_INSUFFICIENT_SIZE
    with pytest.raises(nnapi.NnapiError) as dims:
        execution.get_output_operand_dimensions(0)
    assert dims.value.dimensions == [9]


@pytest.mark.parametrize("n", [0, -3, 2.5, np.nan, np.inf])
def test_bad_n_is_refused_by_the_driver_without_cpu_fallback(fib_device, n):
    model = fibonacci_model()
    compilation = nnapi.Compilation(model)
    compilation.finish()
    with pytest.raises(nnapi.NnapiError) as excinfo:
        run(compilation, np.array([n], np.float32), np.zeros(4, np.float32))
    assert code_of(excinfo) == ResultCode.BAD_DATA
    assert "input n" in str(excinfo.value)
    assert compilation._plan.fallback_count == 0


def test_quant64_without_its_parameters_is_not_supported(fib_device):
    model = fibonacci_model("int64", "quant64", params=None)
    assert model.get_supported_operations_for_devices([wrapped(fib_device)]) == [False]
    with pytest.raises(nnapi.NnapiError) as excinfo:
        nnapi.Compilation(model).finish()
    assert code_of(excinfo) == ResultCode.BAD_DATA
    hal_model, _ = build_hal_model(model)
    assert "16 bytes of extension data" in fib_device.get_unsupported_reasons(hal_model)[0]


def test_only_devices_with_the_extension_are_given_it(fib_device):
    model = fibonacci_model()
    assert model.get_supported_operations_for_devices([reference()]) == [False]
    assert model.get_supported_operations_for_devices([wrapped(fib_device)]) == [True]
    with pytest.raises(nnapi.NnapiError) as excinfo:
        nnapi.Compilation(model, [reference()]).finish()
    assert code_of(excinfo) == ResultCode.BAD_DATA
    assert EXTENSION_NAME in str(excinfo.value)


def test_without_a_supporting_device_compilation_fails_with_bad_data(fib_device):
    model = fibonacci_model()
    manager.unregister_device(fib_device.name)  # the model stays valid: its types are known
    with pytest.raises(nnapi.NnapiError) as excinfo:
        nnapi.Compilation(model).finish()
    assert code_of(excinfo) == ResultCode.BAD_DATA  # no CPU fallback for an extension operation
    assert EXTENSION_NAME in str(excinfo.value)


def test_extension_operation_between_reference_operations(fib_device):
    """y = 2 * fibonacci(x + 1): reference, extension device, reference."""
    model = nnapi.Model()
    fibonacci = model.get_extension_operation_type(EXTENSION_NAME, EXAMPLE_FIBONACCI)
    x = model.add_operand(OperandType(T.TENSOR_FLOAT32, [1]))
    one = model.add_operand(OperandType(T.TENSOR_FLOAT32, [1]))
    two = model.add_operand(OperandType(T.TENSOR_FLOAT32, [1]))
    act = model.add_operand(OperandType(T.INT32))
    n = model.add_operand(OperandType(T.TENSOR_FLOAT32, [1]))
    fib = model.add_operand(OperandType(T.TENSOR_FLOAT32, [0]))
    y = model.add_operand(OperandType(T.TENSOR_FLOAT32, [0]))
    model.set_operand_value(one, np.array([1], np.float32))
    model.set_operand_value(two, np.array([2], np.float32))
    model.set_operand_value(act, 0)
    model.add_operation(Op.ADD, [x, one, act], [n])
    model.add_operation(fibonacci, [n], [fib])
    model.add_operation(Op.MUL, [fib, two, act], [y])
    model.identify_inputs_and_outputs([x], [y])
    model.finish()
    compilation = nnapi.Compilation(model)
    compilation.finish()
    assert compilation.step_devices == ["nnapi-reference", fib_device.name, "nnapi-reference"]
    for x_value in (0, 5, 11):
        out = np.zeros(16, np.float32)
        execution = run(compilation, np.array([x_value], np.float32), out)
        count = x_value + 1
        assert execution.get_output_operand_dimensions(0) == [count]
        assert out[:count].tolist() == [2 * f for f in FIRST_20[:count]]
    placement = compilation.placement()
    operation = placement["operations"][1]
    assert operation["device"] == fib_device.name
    assert operation["type"] == f"{EXTENSION_NAME} operation {EXAMPLE_FIBONACCI}"
    assert operation["refused"]["nnapi-reference"] == (
        f"uses vendor extension {EXTENSION_NAME}, which the device does not support")


def test_hal_model_round_trips_through_the_service_codec(fib_device):
    model = fibonacci_model("int64", "quant64", params=(0.5, 3))
    hal_model, _ = build_hal_model(model)
    back = serialize.model_from_plain(serialize.model_to_plain(hal_model))
    assert back.extension_name_to_prefix == hal_model.extension_name_to_prefix
    assert [o.type for o in back.main.operands] == [o.type for o in hal_model.main.operands]
    assert back.main.operands[1].extension_data == QUANT64_PARAMS.pack(0.5, 3)
    assert back.main.operations[0].type == hal_model.main.operations[0].type
    assert fib_device.get_supported_operations(back) == [True]


def test_driver_validates_what_the_runtime_cannot(fib_device):
    """EXAMPLE_FIBONACCI with operands of the wrong kinds is refused by the driver (the
    runtime accepts any operands for an extension operation, as Android's does)."""
    model = nnapi.Model()
    fibonacci = model.get_extension_operation_type(EXTENSION_NAME, EXAMPLE_FIBONACCI)
    n = model.add_operand(OperandType(T.TENSOR_INT32, [1]))
    out = model.add_operand(OperandType(T.TENSOR_FLOAT32, [0]))
    model.add_operation(fibonacci, [n], [out])
    model.identify_inputs_and_outputs([n], [out])
    model.finish()
    with pytest.raises(nnapi.NnapiError) as excinfo:
        nnapi.Compilation(model, [wrapped(fib_device)]).finish()
    assert code_of(excinfo) == ResultCode.BAD_DATA
    hal_model, _ = build_hal_model(model)
    reason = fib_device.get_unsupported_reasons(hal_model)[0]
    assert "EXAMPLE_INT64 or TENSOR_FLOAT32" in reason and "TENSOR_INT32" in reason
    with pytest.raises(nnapi.hal.HalError) as hal_error:
        fib_device.prepare_model(hal_model)
    assert hal_error.value.status == nnapi.hal.ErrorStatus.INVALID_ARGUMENT


def test_fibonacci_from_a_constant_n(fib_device):
    model = nnapi.Model()
    fibonacci = model.get_extension_operation_type(EXTENSION_NAME, EXAMPLE_FIBONACCI)
    int64 = model.get_extension_operand_type(EXTENSION_NAME, EXAMPLE_INT64)
    unused = model.add_operand(OperandType(T.TENSOR_FLOAT32, [1]))
    n = model.add_operand(OperandType(int64))
    out = model.add_operand(OperandType(T.TENSOR_FLOAT32, [6]))
    model.set_operand_value(n, np.int64(6))
    model.add_operation(fibonacci, [n], [out])
    model.identify_inputs_and_outputs([unused], [out])
    model.finish()
    compilation = nnapi.Compilation(model)
    compilation.finish()
    result = np.zeros(6, np.float32)
    run(compilation, np.zeros(1, np.float32), result)
    assert result.tolist() == FIRST_20[:6]


def test_shipped_short_name_loads_the_driver():
    from nnapi.drivers.catalog import SHIPPED

    factory = manager.resolve_factory("fibonacci")
    device = factory()
    assert SHIPPED["fibonacci"] == "nnapi.drivers.catalog:fibonacci"
    assert [e.name for e in device.get_supported_extensions()] == [EXTENSION_NAME]


def test_devices_command_lists_the_extension(capsys):
    import json

    from nnapi.cli import main

    try:
        assert main(["devices", "--driver", "fibonacci", "--json"]) == 0
        listed = {d["name"]: d for d in json.loads(capsys.readouterr().out)["devices"]}
        assert listed["example-fibonacci"]["extensions"] == [EXTENSION_NAME]
        assert listed["nnapi-reference"]["extensions"] == []
        assert main(["devices", "--driver", "fibonacci"]) == 0
        assert f"extensions:    {EXTENSION_NAME}" in capsys.readouterr().out
    finally:
        manager.unregister_device("example-fibonacci")
        manager._loaded_specs.pop("fibonacci", None)
