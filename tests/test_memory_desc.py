"""MemoryDesc and device memories: roles, dimensions, initialization, copies."""

from __future__ import annotations

import numpy as np
import pytest

import nnapi
from helpers import add_model
from nnapi import OperandCode as T
from nnapi import OperandType


def add_compilation(dims=(2,)):
    compilation = nnapi.Compilation(add_model(dims))
    compilation.finish()
    return compilation


def test_roles_are_checked():
    compilation = add_compilation()
    desc = nnapi.MemoryDesc()
    with pytest.raises(nnapi.BadDataError):
        desc.finish()  # no role yet
    with pytest.raises(nnapi.BadDataError):
        desc.add_input_role(compilation, 2)
    with pytest.raises(nnapi.BadDataError):
        desc.add_input_role(compilation, 0, 0.0)
    with pytest.raises(nnapi.BadDataError):
        desc.add_input_role(nnapi.Compilation(compilation.model), 0)  # not finished
    desc.add_input_role(compilation, 0)
    with pytest.raises(nnapi.BadDataError):
        desc.add_input_role(compilation, 0)  # the same role twice
    with pytest.raises(nnapi.BadDataError):
        desc.add_input_role(add_compilation((3,)), 0)  # incompatible dimensions
    with pytest.raises(nnapi.BadDataError):
        desc.set_dimensions([4])
    desc.set_dimensions([2])
    desc.finish()
    with pytest.raises(nnapi.BadStateError):
        desc.add_output_role(compilation, 0)


def test_device_memory_round_trip():
    compilation = add_compilation()
    desc = nnapi.MemoryDesc()
    desc.add_output_role(compilation, 0)
    desc.add_input_role(compilation, 0)
    with pytest.raises(nnapi.BadStateError):
        nnapi.Memory.from_desc(desc)  # not finished
    desc.finish()
    device_memory = nnapi.Memory.from_desc(desc)
    assert device_memory.size == 8 and device_memory.is_from_desc

    reader = nnapi.Execution(compilation)
    reader.set_input_from_memory(0, device_memory, 0, 0)
    reader.set_input(1, np.ones(2, np.float32))
    reader.set_output(0, np.zeros(2, np.float32))
    with pytest.raises(nnapi.OpFailedError):
        reader.compute()  # never written: OP_FAILED, as Android's ExecutionBuilder

    writer = nnapi.Execution(compilation)
    writer.set_input(0, np.array([1, 2], np.float32))
    writer.set_input(1, np.array([10, 20], np.float32))
    with pytest.raises(nnapi.BadDataError):
        writer.set_output_from_memory(0, device_memory, 0, 8)  # offset/length must be 0
    with pytest.raises(nnapi.BadDataError):
        writer.set_input_from_memory(1, device_memory, 0, 0)   # not a described role
    writer.set_output_from_memory(0, device_memory, 0, 0)
    writer.compute()

    second = nnapi.Execution(compilation)
    second.set_input_from_memory(0, device_memory, 0, 0)
    second.set_input(1, np.array([100, 100], np.float32))
    out = np.zeros(2, np.float32)
    second.set_output(0, out)
    second.compute()
    np.testing.assert_array_equal(out, [111, 122])

    host = nnapi.Memory.create_shared(8)
    nnapi.Memory.copy(device_memory, host)
    np.testing.assert_array_equal(np.frombuffer(host.buffer, np.float32), [11, 22])
    with pytest.raises(nnapi.BadStateError):
        device_memory.buffer  # noqa: B018 - no CPU mapping


def test_copy_into_device_memory_initializes_it():
    compilation = add_compilation()
    desc = nnapi.MemoryDesc()
    desc.add_input_role(compilation, 1)
    desc.finish()
    device_memory = nnapi.Memory.from_desc(desc)
    fresh = nnapi.Memory.from_desc(desc)
    with pytest.raises(nnapi.BadDataError):
        nnapi.Memory.copy(fresh, device_memory)  # source never written
    host = nnapi.Memory.create_shared(8)
    np.frombuffer(host.buffer, np.float32)[:] = [3, 4]
    nnapi.Memory.copy(host, device_memory)
    execution = nnapi.Execution(compilation)
    execution.set_input(0, np.array([1, 1], np.float32))
    execution.set_input_from_memory(1, device_memory, 0, 0)
    out = np.zeros(2, np.float32)
    execution.set_output(0, out)
    execution.compute()
    np.testing.assert_array_equal(out, [4, 5])
    model = nnapi.Model()
    model.add_operand(OperandType(T.TENSOR_FLOAT32, [2]))
    with pytest.raises(nnapi.BadDataError) as excinfo:
        model.set_operand_value_from_memory(0, device_memory, 0, 8)
    assert "MemoryDesc" in str(excinfo.value)


def test_unknown_dimensions_cannot_be_allocated():
    compilation = add_compilation((0,))
    desc = nnapi.MemoryDesc()
    desc.add_output_role(compilation, 0)
    desc.finish()
    with pytest.raises(nnapi.OpFailedError):
        nnapi.Memory.from_desc(desc)
