"""Model: the NDK's validation rules and result codes for every ANeuralNetworksModel_* call."""

from __future__ import annotations

import numpy as np
import pytest

import nnapi
from helpers import add_model
from nnapi import OperandCode as T
from nnapi import OperandType, ResultCode
from nnapi import OperationCode as Op


def f32(*dims):
    return OperandType(T.TENSOR_FLOAT32, dims)


def code_of(excinfo) -> ResultCode:
    return excinfo.value.code


class TestOperandTypes:
    def test_indexes_count_up_from_zero(self):
        model = nnapi.Model()
        assert [model.add_operand(f32(1)) for _ in range(3)] == [0, 1, 2]

    @pytest.mark.parametrize("op_type", [
        OperandType(T.INT32, [1]),                                 # scalar with dimensions
        OperandType(T.TENSOR_QUANT8_ASYMM, [2], 0.0, 0),            # quant without scale
        OperandType(T.TENSOR_QUANT8_ASYMM, [2], 0.5, 256),          # zero point out of range
        OperandType(T.TENSOR_QUANT8_ASYMM_SIGNED, [2], 0.5, 128),
        OperandType(T.TENSOR_QUANT8_ASYMM_SIGNED, [2], 0.5, -129),
        OperandType(T.TENSOR_QUANT16_SYMM, [2], 0.5, 1),            # symmetric with zero point
        OperandType(T.TENSOR_FLOAT32, [2], 0.5, 0),                 # float with a scale
        OperandType(T.TENSOR_FLOAT32, [-1]),                        # negative dimension
        OperandType(T.TENSOR_QUANT8_ASYMM, [2], float("nan"), 0),
        OperandType(T.TENSOR_INT32, [2], 0.0, 3),                   # int32 tensor zero point
        OperandType(T.TENSOR_QUANT8_ASYMM, [2], 1e39, 0),           # inf as the NDK's float
        OperandType(T.TENSOR_QUANT8_ASYMM, [2], 1e-50, 0),          # 0 as the NDK's float
        OperandType(T.TENSOR_INT32, [2], 1e39, 0),
        OperandType(T.TENSOR_FLOAT32, [1] * 65),                    # past numpy's 64 dimensions
    ])
    def test_invalid_operand_types_are_bad_data(self, op_type):
        with pytest.raises(nnapi.BadDataError):
            nnapi.Model().add_operand(op_type)

    def test_unknown_type_code_is_bad_data(self):
        with pytest.raises(nnapi.BadDataError):
            OperandType(12345, [1])

    def test_none_type_is_unexpected_null(self):
        with pytest.raises(nnapi.UnexpectedNullError):
            nnapi.Model().add_operand(None)

    @pytest.mark.parametrize("op_type", [
        OperandType(T.TENSOR_FLOAT32, [65536, 16384]),             # 4 * 2**30 = 2**32 bytes
        OperandType(T.TENSOR_FLOAT32, [65536, 0, 16384]),          # unspecified: counts as 1
        OperandType(T.TENSOR_QUANT8_ASYMM, [65536, 65537], 0.5, 0),  # 2**32 + 2**16 bytes
        OperandType(T.TENSOR_INT32, [0, 2**31, 2]),
    ])
    def test_a_type_whose_size_overflows_uint32_is_bad_data(self, op_type):
        """ANeuralNetworksModel_addOperand applies Android's size rule (validateTensorDimensions):
        the element size times the specified dimensions must fit in uint32."""
        model = nnapi.Model()
        model.add_operand(f32(1))
        with pytest.raises(nnapi.BadDataError) as excinfo:
            model.add_operand(op_type)
        assert code_of(excinfo) == ResultCode.BAD_DATA
        message = str(excinfo.value)
        assert message.startswith(f"add_operand(1): {op_type.type.name} of {op_type.rank} dimensions")
        assert "larger than 4 GiB (its size overflows uint32" in message
        assert model.operand_count == 1

    def test_a_type_of_exactly_uint32_max_bytes_is_accepted(self):
        model = nnapi.Model()
        model.add_operand(OperandType(T.TENSOR_BOOL8, [65535, 65537]))  # 2**32 - 1 one-byte elements
        model.add_operand(OperandType(T.TENSOR_FLOAT32, [0, 65535, 0, 16384]))  # 2**32 - 2**16 bytes known
        model.add_operand(OperandType(T.TENSOR_FLOAT32, [0] * 64))
        assert model.operand_count == 3

    def test_valid_quant_types(self):
        model = nnapi.Model()
        model.add_operand(OperandType(T.TENSOR_QUANT8_ASYMM, [2], 0.5, 255))
        model.add_operand(OperandType(T.TENSOR_QUANT8_ASYMM_SIGNED, [2], 0.5, -128))
        model.add_operand(OperandType(T.TENSOR_INT32, [2], 0.25, 0))  # bias scale allowed
        model.add_operand(OperandType(T.TENSOR_FLOAT32, []))  # unknown rank (feature level 3)
        assert model.operand_count == 4


class TestOperandValues:
    def test_length_must_match(self):
        model = nnapi.Model()
        index = model.add_operand(f32(2))
        with pytest.raises(nnapi.BadDataError) as excinfo:
            model.set_operand_value(index, np.zeros(3, np.float32))
        assert "needs 8 bytes, got 12" in str(excinfo.value)
        with pytest.raises(nnapi.BadDataError):
            model.set_operand_value(index, np.zeros(2, np.float64))

    def test_index_out_of_range(self):
        model = nnapi.Model()
        model.add_operand(f32(2))
        for bad in (1, -1, 100):
            with pytest.raises(nnapi.BadDataError):
                model.set_operand_value(bad, np.zeros(2, np.float32))

    def test_unspecified_dimensions_cannot_hold_a_value(self):
        model = nnapi.Model()
        index = model.add_operand(f32(0, 2))
        with pytest.raises(nnapi.BadDataError):
            model.set_operand_value(index, np.zeros(2, np.float32))

    def test_small_values_are_copied_large_ones_referenced(self):
        model = add_model(finish=False)
        small = model.add_operand(f32(32))          # 128 bytes: copied
        large = model.add_operand(f32(33))          # 132 bytes: referenced
        small_value = np.ones(32, np.float32)
        large_value = np.ones(33, np.float32)
        model.set_operand_value(small, small_value)
        model.set_operand_value(large, large_value)
        small_value[:] = 7
        large_value[:] = 7
        assert bytes(model._values[small].data) == np.ones(32, np.float32).tobytes()
        assert np.frombuffer(model._values[large].view, np.float32)[0] == 7

    def test_python_scalars_convert_to_the_operand_type(self):
        model = nnapi.Model()
        index = model.add_operand(OperandType(T.INT32))
        model.set_operand_value(index, 3)
        assert model._values[index].data == np.int32(3).tobytes()
        with pytest.raises(nnapi.BadDataError):
            model.set_operand_value(index, 2**40)

    def test_none_marks_omitted(self):
        model = nnapi.Model()
        index = model.add_operand(f32(2))
        model.set_operand_value(index, None)
        from nnapi.model import NO_VALUE
        assert model._values[index] is NO_VALUE

    def test_value_from_memory_bounds(self):
        memory = nnapi.Memory.create_shared(16)
        model = nnapi.Model()
        index = model.add_operand(f32(2))
        with pytest.raises(nnapi.BadDataError):
            model.set_operand_value_from_memory(index, memory, 12, 8)   # past the end
        with pytest.raises(nnapi.BadDataError):
            model.set_operand_value_from_memory(index, memory, 0, 4)    # wrong length
        with pytest.raises(nnapi.UnexpectedNullError):
            model.set_operand_value_from_memory(index, None, 0, 8)
        model.set_operand_value_from_memory(index, memory, 8, 8)

    def test_value_from_model(self):
        inner = add_model()
        model = nnapi.Model()
        operand = model.add_operand(OperandType(T.MODEL))
        tensor = model.add_operand(f32(2))
        with pytest.raises(nnapi.BadDataError):
            model.set_operand_value_from_model(tensor, inner)        # not a MODEL operand
        with pytest.raises(nnapi.BadDataError):
            model.set_operand_value_from_model(operand, add_model(finish=False))  # not finished
        with pytest.raises(nnapi.BadDataError):
            model.set_operand_value(operand, b"\0")                   # MODEL needs a model
        model.set_operand_value_from_model(operand, inner)

    def test_per_channel_params(self):
        model = nnapi.Model()
        per_channel = model.add_operand(OperandType(T.TENSOR_QUANT8_SYMM_PER_CHANNEL, [3, 2]))
        plain = model.add_operand(f32(3, 2))
        params = nnapi.SymmPerChannelQuantParams(0, [0.5, 0.25, 1.0])
        with pytest.raises(nnapi.BadDataError):
            model.set_operand_symm_per_channel_quant_params(plain, params)
        with pytest.raises(nnapi.BadDataError):
            model.set_operand_symm_per_channel_quant_params(per_channel, nnapi.SymmPerChannelQuantParams(0, [1.0]))
        with pytest.raises(nnapi.BadDataError):
            model.set_operand_symm_per_channel_quant_params(per_channel, nnapi.SymmPerChannelQuantParams(2, [1.0]))
        with pytest.raises(nnapi.BadDataError):
            model.set_operand_symm_per_channel_quant_params(
                per_channel, nnapi.SymmPerChannelQuantParams(0, [0.5, 0.0, 1.0]))
        model.set_operand_symm_per_channel_quant_params(per_channel, params)
        assert model.operand_type(per_channel).channel_quant == params

    # 1e39 is inf and 1e-50 is 0 in the NDK's float field
    @pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf"), float("-inf"), 1e39, 1e-50])
    @pytest.mark.parametrize("channels", [3, 64])  # a few scales, and many (checked vectorized)
    def test_per_channel_scales_must_be_positive_and_finite(self, bad, channels):
        model = nnapi.Model()
        per_channel = model.add_operand(OperandType(T.TENSOR_QUANT8_SYMM_PER_CHANNEL, [channels, 2]))
        scales = [0.5] * channels
        scales[channels // 2] = bad
        with pytest.raises(nnapi.BadDataError, match="per-channel scales must be positive"):
            model.set_operand_symm_per_channel_quant_params(per_channel, nnapi.SymmPerChannelQuantParams(0, scales))
        scales[channels // 2] = 1e-30
        model.set_operand_symm_per_channel_quant_params(per_channel, nnapi.SymmPerChannelQuantParams(0, scales))


class TestOperations:
    def test_signature_is_validated_when_added(self):
        model = nnapi.Model()
        a = model.add_operand(f32(2))
        b = model.add_operand(f32(2))
        wrong = model.add_operand(f32(2))
        out = model.add_operand(f32(2))
        with pytest.raises(nnapi.BadDataError) as excinfo:
            model.add_operation(Op.ADD, [a, b, wrong], [out])
        assert str(excinfo.value) == "add_operation(ADD): input 2 must be INT32, got TENSOR_FLOAT32"
        with pytest.raises(nnapi.BadDataError) as excinfo:
            model.add_operation(Op.ADD, [a, b], [out])
        assert "expected 3 inputs, got 2" in str(excinfo.value)

    def test_mixed_input_types_are_bad_data(self):
        model = nnapi.Model()
        a = model.add_operand(f32(2))
        b = model.add_operand(OperandType(T.TENSOR_INT32, [2]))
        act = model.add_operand(OperandType(T.INT32))
        out = model.add_operand(f32(2))
        with pytest.raises(nnapi.BadDataError):
            model.add_operation(Op.ADD, [a, b, act], [out])

    def test_unknown_operation_and_bad_indexes(self):
        model = nnapi.Model()
        a = model.add_operand(f32(2))
        with pytest.raises(nnapi.BadDataError):
            model.add_operation(999, [a], [a])
        with pytest.raises(nnapi.BadDataError):
            model.add_operation(Op.ADD, [a, 5, 6], [a])
        with pytest.raises(nnapi.UnexpectedNullError):
            model.add_operation(Op.ADD, None, [a])

    def test_output_written_twice_is_bad_data(self):
        model = add_model(finish=False)
        with pytest.raises(nnapi.BadDataError):
            model.add_operation(Op.ADD, [0, 1, 2], [3])

    def test_constant_output_is_bad_data(self):
        model = nnapi.Model()
        a = model.add_operand(f32(2))
        act = model.add_operand(OperandType(T.INT32))
        out = model.add_operand(f32(2))
        model.set_operand_value(act, 0)
        model.set_operand_value(out, np.zeros(2, np.float32))
        with pytest.raises(nnapi.BadDataError):
            model.add_operation(Op.ADD, [a, a, act], [out])

    def test_incompatible_broadcast_is_bad_data(self):
        model = nnapi.Model()
        a = model.add_operand(f32(2, 3))
        b = model.add_operand(f32(4))
        act = model.add_operand(OperandType(T.INT32))
        out = model.add_operand(f32(0, 0))
        with pytest.raises(nnapi.BadDataError):
            model.add_operation(Op.ADD, [a, b, act], [out])


class TestInputsOutputsAndFinish:
    def test_operand_cannot_be_input_and_output(self):
        model = nnapi.Model()
        a = model.add_operand(f32(2))
        with pytest.raises(nnapi.BadDataError):
            model.identify_inputs_and_outputs([a], [a])

    def test_duplicate_input_is_bad_data(self):
        model = nnapi.Model()
        a = model.add_operand(f32(2))
        b = model.add_operand(f32(2))
        with pytest.raises(nnapi.BadDataError):
            model.identify_inputs_and_outputs([a, a], [b])

    def test_constant_cannot_be_an_input(self):
        model = nnapi.Model()
        a = model.add_operand(f32(2))
        b = model.add_operand(f32(2))
        model.set_operand_value(a, np.zeros(2, np.float32))
        with pytest.raises(nnapi.BadDataError):
            model.identify_inputs_and_outputs([a], [b])

    def test_finish_requires_every_operand_written(self):
        model = add_model(finish=False)
        model.add_operand(f32(2))  # dangling operand: never written
        with pytest.raises(nnapi.BadDataError) as excinfo:
            model.finish()
        assert "operand 4 is never written" in str(excinfo.value)

    def test_finish_requires_outputs(self):
        model = nnapi.Model()
        with pytest.raises(nnapi.BadDataError):
            model.finish()

    def test_finish_requires_per_channel_params(self):
        model = add_model(finish=False)
        index = model.add_operand(OperandType(T.TENSOR_QUANT8_SYMM_PER_CHANNEL, [2]))
        model.set_operand_value(index, np.zeros(2, np.int8))
        with pytest.raises(nnapi.BadDataError):
            model.finish()

    def test_every_call_after_finish_is_bad_state(self):
        model = add_model()
        calls = [
            lambda: model.add_operand(f32(2)),
            lambda: model.set_operand_value(2, 0),
            lambda: model.add_operation(Op.ADD, [0, 1, 2], [3]),
            lambda: model.identify_inputs_and_outputs([0, 1], [3]),
            lambda: model.relax_computation_float32_to_float16(True),
            lambda: model.finish(),
        ]
        for call in calls:
            with pytest.raises(nnapi.BadStateError):
                call()

    def test_use_after_free_is_bad_state(self):
        model = add_model(finish=False)
        model.free()
        model.free()  # twice is harmless
        with pytest.raises(nnapi.BadStateError):
            model.add_operand(f32(2))
        with pytest.raises(nnapi.BadStateError):
            model.finish()

    def test_context_manager_frees(self):
        with nnapi.Model() as model:
            model.add_operand(f32(1))
        with pytest.raises(nnapi.BadStateError):
            model.add_operand(f32(1))

    def test_operations_may_be_added_in_any_order(self):
        model = nnapi.Model()
        x = model.add_operand(f32(2))
        act = model.add_operand(OperandType(T.INT32))
        middle = model.add_operand(f32(2))
        out = model.add_operand(f32(2))
        model.set_operand_value(act, 0)
        model.add_operation(Op.MUL, [middle, middle, act], [out])   # reads middle before it exists
        model.add_operation(Op.ADD, [x, x, act], [middle])
        model.identify_inputs_and_outputs([x], [out])
        model.finish()
        compilation = nnapi.Compilation(model)
        compilation.finish()
        execution = nnapi.Execution(compilation)
        execution.set_input(0, np.array([1, 2], np.float32))
        y = np.zeros(2, np.float32)
        execution.set_output(0, y)
        execution.compute()
        np.testing.assert_array_equal(y, [4, 16])


class TestSupportedOperations:
    def test_per_operation_flags(self):
        model = add_model()
        assert model.get_supported_operations_for_devices(nnapi.get_devices()) == [True]

    def test_requires_finished_model_and_devices(self):
        unfinished = add_model(finish=False)
        with pytest.raises(nnapi.BadStateError):
            unfinished.get_supported_operations_for_devices(nnapi.get_devices())
        model = add_model()
        with pytest.raises(nnapi.BadDataError):
            model.get_supported_operations_for_devices([])
        device = nnapi.get_devices()[0]
        with pytest.raises(nnapi.BadDataError):
            model.get_supported_operations_for_devices([device, device])
        with pytest.raises(nnapi.UnexpectedNullError):
            model.get_supported_operations_for_devices(None)


def test_error_classes_carry_their_codes():
    assert nnapi.BadDataError().code == ResultCode.BAD_DATA
    assert isinstance(nnapi.NnapiError("x", ResultCode.BAD_STATE), nnapi.BadStateError)
    assert {cls.code for cls in nnapi.NnapiError.__subclasses__()} == set(ResultCode) - {ResultCode.NO_ERROR}
