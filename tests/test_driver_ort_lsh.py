"""LSH_PROJECTION on nnapi-ort-cpu (drivers/ort/lsh.py): FarmHash's Fingerprint64 as ONNX
uint64 arithmetic gives the reference's signatures bit for bit, for keys of every length
branch of the hash (up to 16 bytes, 17-32, 33-64, and past 64 in one and in several 64-byte
blocks), int32 and 8-bit inputs, the dense, sparse and deprecated sparse types, with and
without weights, float32 and float16 seeds. Float32 seeds given at run time (a model
input) are bound as their bits, NaN payloads included, and compiled through the cache too;
computed seeds, float16 seeds and a float input given at run time stay declined with the
reason, and so is every LSH_PROJECTION where the probe of ORT's uint64 kernels fails. The
weighted hashes are summed row after row, as Android adds them."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import nnapi  # noqa: E402
from nnapi import OperandCode as T  # noqa: E402
from nnapi import OperandType  # noqa: E402
from nnapi import OperationCode as Op  # noqa: E402
from nnapi.drivers.ort import lsh  # noqa: E402
from nnapi.drivers.ort.device import OrtDevice  # noqa: E402
from nnapi.operations.lsh_projection import fingerprint64  # noqa: E402
from nnapi.runtime.model_builder import build_hal_model  # noqa: E402

pytestmark = pytest.mark.usefixtures("calibration_file")
#: the claims need ORT's uint64 kernels (1.19 has no uint64 Add: the device declines LSH there)
needs_uint64 = pytest.mark.skipif(not lsh._uint64_arithmetic(), reason="this onnxruntime lacks exact uint64 kernels")
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


def _outputs(model: nnapi.Model, feeds: list[np.ndarray], size: int, cache: str | None = None) -> list[np.ndarray]:
    """The output on nnapi-ort-cpu alone (compiled with caching in ``cache`` where given)
    and on the reference."""
    found = {d.name: d for d in nnapi.get_devices()}
    results = []
    for name in ("nnapi-ort-cpu", "nnapi-reference"):
        compilation = nnapi.Compilation(model, [found[name]])
        if cache is not None and name == "nnapi-ort-cpu":
            compilation.set_caching(cache, bytes(range(32)))
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
@needs_uint64
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


@needs_uint64
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


@needs_uint64
def test_lsh_projection_seeds_given_at_run_time_are_bound_as_their_bits(ort_device, tmp_path):
    """Float32 seeds as a model input: the graph takes them as uint32 (the request's bytes
    as they are), so NaNs of different payloads, -0.0 and 0.0 hash as on the reference; the
    same again from a cached compilation (its signature binds them as uint32 too)."""
    rng = np.random.default_rng(5)
    model = _lsh_model(rng, T.TENSOR_INT32, (2,), DENSE, True, seeds_at_run_time=True)
    assert OrtDevice().get_unsupported_reasons(build_hal_model(model)[0]) == [None]
    seed_bits = np.array([0x7FC00000, 0x7FC00001, 0xFFC12345, 0x7F800001, 0x80000000, 0x00000000,
                          0x00000001, 0x3F800000, 0xBF800000, 0x7F800000, 0xFF7FFFFF, 0x12345678], np.uint32)
    seeds = seed_bits.view(np.float32).reshape(4, 3)
    for cache in (None, str(tmp_path), str(tmp_path)):  # the second cached compilation loads the cache
        for _ in range(3):
            feeds = [seeds, _input(rng, T.TENSOR_INT32, (2,)), rng.standard_normal(3).astype(np.float32)]
            got, want = _outputs(model, feeds, 12, cache)
            np.testing.assert_array_equal(got, want)
    # (the comparison's power: seeds 0 and 1, quiet NaNs of two payloads, hash apart on the reference)
    differ = 0
    for _ in range(8):
        row = _input(rng, T.TENSOR_INT32, (2,))
        _, want = _outputs(model, [seeds, row, np.ones(3, np.float32)], 12)
        differ += int(want[0] != want[1])
    assert differ > 0


@needs_uint64
def test_lsh_projection_seeds_computed_or_float16_or_a_float_input_at_run_time_are_declined():
    """Seeds computed in the model (an ADD's output) have no bytes to bind; float16 seeds
    given at run time and a float input given at run time are not lowered: each names why."""
    rng = np.random.default_rng(0)
    model = nnapi.Model()
    given = model.add_operand(OperandType(T.TENSOR_FLOAT32, [2, 2]))
    zero = model.add_operand(OperandType(T.TENSOR_FLOAT32, [1]))
    model.set_operand_value(zero, np.zeros(1, np.float32))
    none = model.add_operand(OperandType(T.INT32))
    model.set_operand_value(none, 0)
    seeds = model.add_operand(OperandType(T.TENSOR_FLOAT32, [2, 2]))
    model.add_operation(Op.ADD, [given, zero, none], [seeds])
    data = model.add_operand(OperandType(T.TENSOR_INT32, [3, 2]))
    weights = model.add_operand(OperandType(T.TENSOR_FLOAT32, [3]))
    kind = model.add_operand(OperandType(T.INT32))
    model.set_operand_value(kind, DENSE)
    out = model.add_operand(OperandType(T.TENSOR_INT32, [4]))
    model.add_operation(Op.LSH_PROJECTION, [seeds, data, weights, kind], [out])
    model.identify_inputs_and_outputs([given, data, weights], [out])
    model.finish()
    reasons = OrtDevice().get_unsupported_reasons(build_hal_model(model)[0])
    assert reasons[0] is None and "computed at run time" in reasons[1] and "bit cast" in reasons[1]
    half = _lsh_model(rng, T.TENSOR_INT32, (2,), DENSE, True, T.TENSOR_FLOAT16, seeds_at_run_time=True)
    [why] = OrtDevice().get_unsupported_reasons(build_hal_model(half)[0])
    assert why is not None and "float16 seeds" in why
    floats = _lsh_model(rng, T.TENSOR_FLOAT32, (2,), DENSE, True)
    [why] = OrtDevice().get_unsupported_reasons(build_hal_model(floats)[0])
    assert why is not None and "input" in why and "bit cast" in why


def _in_order_bits(seeds: np.ndarray, rows: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """The dense bits as Android's runningSignBit computes them: per seed, each row's
    Fingerprint64 as a double times its weight as a double, added to the score row after
    row (a plain loop in Python floats, which are doubles)."""
    row_bytes = rows.reshape(rows.shape[0], -1).view(np.uint8)
    bits = []
    for seed in seeds.astype(np.float32).ravel():
        score = 0.0
        for row, weight in zip(row_bytes, weights):
            key = np.concatenate([np.frombuffer(seed.tobytes(), np.uint8), row])[np.newaxis]
            score += float(weight) * float(fingerprint64(key).view(np.int64)[0])
        bits.append(int(score > 0))
    return np.array(bits, np.int32)


def _weighted_lsh(seeds: np.ndarray, rows: int) -> nnapi.Model:
    """Dense LSH_PROJECTION of constant ``seeds``, int32 rows [rows, 2] and float32 weights [rows]
    both given at run time."""
    model = nnapi.Model()
    hashes = model.add_operand(OperandType(T.TENSOR_FLOAT32, list(seeds.shape)))
    model.set_operand_value(hashes, seeds)
    data = model.add_operand(OperandType(T.TENSOR_INT32, [rows, 2]))
    weights = model.add_operand(OperandType(T.TENSOR_FLOAT32, [rows]))
    kind = model.add_operand(OperandType(T.INT32))
    model.set_operand_value(kind, DENSE)
    out = model.add_operand(OperandType(T.TENSOR_INT32, [seeds.size]))
    model.add_operation(Op.LSH_PROJECTION, [hashes, data, weights, kind], [out])
    model.identify_inputs_and_outputs([data, weights], [out])
    model.finish()
    return model


@needs_uint64
def test_lsh_projection_adds_weighted_rows_in_order(ort_device):
    """Rows whose weighted hashes cancel ([A, A, B] weighted [1, -1, 1e-30]; 200 rows where
    the first and the 151st cancel, the rest weighted 1e-30) set the bits Android's in-order
    double sum sets, on nnapi-ort-cpu and on the reference: the sum is then that of the
    small rows after the cancellation, which a pairwise sum, a matmul or ORT's ReduceSum
    (other orders) absorbs into the large ones and loses."""
    rng = np.random.default_rng(12)
    seeds = rng.standard_normal((4, 8)).astype(np.float32)
    a, b = rng.integers(-2**31, 2**31, (2, 2), dtype=np.int64).astype(np.int32)
    short = (np.stack([a, a, b]), np.array([1, -1, 1e-30], np.float32))
    many = rng.integers(-2**31, 2**31, (200, 2), dtype=np.int64).astype(np.int32)
    many[150] = many[0]
    weights = np.full(200, 1e-30, np.float32)
    weights[0], weights[150] = 1, -1
    for rows, weight in (short, (many, weights)):
        want = _in_order_bits(seeds, rows, weight)
        assert 0 < want.sum() < want.size  # both signs: the small rows decide
        got, reference = _outputs(_weighted_lsh(seeds, len(rows)), [rows, weight], seeds.size)
        np.testing.assert_array_equal(reference, want)
        np.testing.assert_array_equal(got, want)


def test_lsh_projection_is_declined_where_onnxruntime_lacks_exact_uint64_kernels(monkeypatch):
    """The probe of ORT's uint64 arithmetic fails where onnxruntime refuses the graph (1.19
    has no uint64 Add: probe_form gives None) or computes other values; LSH_PROJECTION is
    then declined, naming why, where the device claims it on an onnxruntime that passes."""
    probe = lsh._uint64_arithmetic.__wrapped__
    if lsh._uint64_arithmetic():
        assert probe() is True
    monkeypatch.setattr(lsh, "probe_form", lambda *args: None)
    assert probe() is False
    wrong = [np.zeros(3, np.uint64), np.zeros(4, np.uint64), np.zeros(3, np.float64)]  # shaped, not the hashes
    monkeypatch.setattr(lsh, "probe_form", lambda *args: wrong)
    assert probe() is False
    monkeypatch.setattr(lsh, "_uint64_arithmetic", lambda: False)
    model = _lsh_model(np.random.default_rng(1), T.TENSOR_INT32, (2,), DENSE, True)
    [why] = OrtDevice().get_unsupported_reasons(build_hal_model(model)[0])
    assert why is not None and "uint64" in why and "1.19 has no uint64 Add" in why
