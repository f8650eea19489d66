"""LSH_PROJECTION on nnapi-ort-cpu (drivers/ort/lsh.py): FarmHash's Fingerprint64 as ONNX
uint64 arithmetic gives the reference's signatures bit for bit, for keys of every length
branch of the hash (up to 16 bytes, 17-32, 33-64, and past 64 in one and in several 64-byte
blocks), int32 and 8-bit inputs, the dense, sparse and deprecated sparse types, with and
without weights, float32 and float16 seeds. Seeds or a float input given at run time stay
declined, naming the missing bit cast."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import nnapi  # noqa: E402
from nnapi import OperandCode as T  # noqa: E402
from nnapi import OperandType  # noqa: E402
from nnapi import OperationCode as Op  # noqa: E402
from nnapi.drivers.ort.device import OrtDevice  # noqa: E402
from nnapi.runtime.model_builder import build_hal_model  # noqa: E402

pytestmark = pytest.mark.usefixtures("calibration_file")
DENSE, SPARSE, SPARSE_DEPRECATED = 2, 3, 1


def _lsh_model(rng: np.random.Generator, input_type: int, row_shape: tuple[int, ...], kind: int, weighted: bool,
               seed_type: int = T.TENSOR_FLOAT32, seeds_at_run_time: bool = False,
               hashes: tuple[int, int] = (4, 3)) -> nnapi.Model:
    """LSH_PROJECTION of an input [3, *row_shape] given at run time, constant seeds
    (``hashes`` functions x bits, some NaN, infinite and signed zeros among them; or
    given at run time), the weights [3] given at run time where ``weighted``."""
    model = nnapi.Model()
    seeds = model.add_operand(OperandType(seed_type, list(hashes)))
    if not seeds_at_run_time:
        values = rng.standard_normal(hashes).astype(np.float32)
        values.flat[:4] = [np.nan, -0.0, np.inf, 0.0][:values.size]
        model.set_operand_value(seeds, values.astype(np.float16 if seed_type == T.TENSOR_FLOAT16 else np.float32))
    quant = {"scale": 0.5, "zero_point": 3} if input_type == T.TENSOR_QUANT8_ASYMM else {}
    data = model.add_operand(OperandType(input_type, [3, *row_shape], **quant))
    weights = model.add_operand(OperandType(seed_type, [3]))
    if not weighted:
        model.set_operand_value(weights, None)
    kind_index = model.add_operand(OperandType(T.INT32))
    model.set_operand_value(kind_index, kind)
    out = model.add_operand(OperandType(T.TENSOR_INT32, [hashes[0] * hashes[1] if kind == DENSE else hashes[0]]))
    model.add_operation(Op.LSH_PROJECTION, [seeds, data, weights, kind_index], [out])
    inputs = ([seeds] if seeds_at_run_time else []) + [data] + ([weights] if weighted else [])
    model.identify_inputs_and_outputs(inputs, [out])
    model.finish()
    return model


def _input(rng: np.random.Generator, input_type: int, row_shape: tuple[int, ...]) -> np.ndarray:
    """Rows of random values, the last row equal to the first (equal keys)."""
    if input_type == T.TENSOR_INT32:
        value = rng.integers(-2**31, 2**31, (3, *row_shape), dtype=np.int64).astype(np.int32)
    else:
        value = rng.integers(0, 256, (3, *row_shape)).astype(np.uint8)
    value[2] = value[0]
    return value


def _outputs(model: nnapi.Model, feeds: list[np.ndarray], size: int) -> list[np.ndarray]:
    """The output on nnapi-ort-cpu alone and on the reference."""
    found = {d.name: d for d in nnapi.get_devices()}
    results = []
    for name in ("nnapi-ort-cpu", "nnapi-reference"):
        compilation = nnapi.Compilation(model, [found[name]])
        compilation.finish()
        execution = nnapi.Execution(compilation)
        for position, value in enumerate(feeds):
            execution.set_input(position, value)
        out = np.zeros(size, np.int32)
        execution.set_output(0, out)
        execution.compute()
        results.append(out)
    return results


# rows: int32 [1] -> keys of 8 bytes, [3] 16, [2, 2] 20, [10] 44, [15] 64, [20] 84 (one 64-byte
# block), [40] 164 (two); 8-bit [1] -> 5 bytes (the 4-7 branch), [13] 17, [61] 65, [100] 104
@pytest.mark.parametrize("input_type, row_shape", [
    (T.TENSOR_INT32, (1,)), (T.TENSOR_INT32, (3,)), (T.TENSOR_INT32, (2, 2)), (T.TENSOR_INT32, (10,)),
    (T.TENSOR_INT32, (15,)), (T.TENSOR_INT32, (20,)), (T.TENSOR_INT32, (40,)),
    (T.TENSOR_QUANT8_ASYMM, (1,)), (T.TENSOR_QUANT8_ASYMM, (13,)), (T.TENSOR_QUANT8_ASYMM, (61,)),
    (T.TENSOR_QUANT8_ASYMM, (100,))])
def test_lsh_projection_hashes_as_the_reference(ort_device, input_type, row_shape):
    rng = np.random.default_rng(sum(row_shape) + input_type)
    for kind, weighted, seed_type in ((DENSE, True, T.TENSOR_FLOAT32), (DENSE, False, T.TENSOR_FLOAT16),
                                      (SPARSE, False, T.TENSOR_FLOAT32), (SPARSE_DEPRECATED, False, T.TENSOR_FLOAT16)):
        model = _lsh_model(rng, input_type, row_shape, kind, weighted, seed_type)
        assert OrtDevice().get_unsupported_reasons(build_hal_model(model)[0]) == [None]
        size = 12 if kind == DENSE else 4
        bits_seen = set()
        for _ in range(3):
            feeds = [_input(rng, input_type, row_shape)]
            if weighted:
                feeds.append(rng.standard_normal(3).astype(np.float32))
            got, want = _outputs(model, feeds, size)
            np.testing.assert_array_equal(got, want)
            bits_seen.update(want.tolist() if kind == DENSE else [])
        if kind == DENSE:
            assert bits_seen == {0, 1}  # both signs occur: the sums are compared, not guessed


def test_lsh_projection_sparse_signatures_of_32_bits_wrap_as_int32(ort_device):
    """One hash function of 32 bits: its signature's top bit is the int32's sign."""
    rng = np.random.default_rng(3)
    model = _lsh_model(rng, T.TENSOR_INT32, (2,), SPARSE, False, hashes=(1, 32))
    signs = set()
    for _ in range(8):
        got, want = _outputs(model, [_input(rng, T.TENSOR_INT32, (2,))], 1)
        np.testing.assert_array_equal(got, want)
        signs.add(bool(want[0] < 0))
    assert signs == {True, False}


@pytest.mark.parametrize("seeds_at_run_time, input_type", [(True, T.TENSOR_INT32), (False, T.TENSOR_FLOAT32)])
def test_lsh_projection_of_float_bits_given_at_run_time_is_declined(seeds_at_run_time, input_type):
    model = _lsh_model(np.random.default_rng(0), input_type, (2,), DENSE, True, seeds_at_run_time=seeds_at_run_time)
    [why] = OrtDevice().get_unsupported_reasons(build_hal_model(model)[0])
    assert why is not None and "bit cast" in why and ("seeds" in why if seeds_at_run_time else "input" in why)
