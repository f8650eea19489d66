"""TFLite import: elementwise operators (arithmetic, comparisons, activations, GELU, ...),
broadcasting, and quantized ones computed in float32 where NNAPI has no exact form.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from nnapi.codes import OperandCode as T
from nnapi.codes import OperationCode
from nnapi.codes import OperationCode as Op
from nnapi.importers.tflite.converter import _Const, _Converter, _converter
from nnapi.importers.tflite.high_rank import _MAX_RANK, _lifted_arithmetic
from nnapi.importers.tflite.quantization import _check_stored_values_recovered
from nnapi.importers.tflite.reader import (
    _FLOAT_TYPES,
    _QUANT8,
    UnsupportedOperator,
    _operand_shape,
    _Operator,
    _static_shape,
)
from nnapi.operand import OperandType
from nnapi.operations.activations import FIXED_OUTPUT_QUANT, has_quantization
from nnapi.operations.arithmetic import quantized_mul_scales_allowed
from nnapi.operations.common import ERFC_A, ERFC_P, GELU_TANH_CUBIC
from nnapi.operations.quant_math import (
    dequantize,
    multiply_by_quantized_multiplier,
    quantize,
    quantize_multiplier,
    rescale_multiplier,
)

_ARITHMETIC = {"ADD": (Op.ADD, "AddOptions"), "SUB": (Op.SUB, "SubOptions"), "MUL": (Op.MUL, "MulOptions"),
               "DIV": (Op.DIV, "DivOptions")}


def _arithmetic(c: _Converter, op: _Operator) -> None:
    code, options_name = _ARITHMETIC[op.name]
    options = op.options(options_name)
    activation = options.FusedActivationFunction() if options is not None else 0
    if code == Op.DIV and c.nn_type(op.out_tensor()).type in _QUANT8 and activation in (0, 1, 2, 3):
        # NNAPI's DIV takes no quantized tensors; TFLite's rounds the quotient once.
        _in_float32(c, op, lambda inputs, out: c.with_activation(
            activation, lambda act, target: c.emit(Op.DIV, [*inputs, act], [target]), out))
        c.lowered("quantized DIV as DEQUANTIZE, DIV in float32, QUANTIZE (one rounding, as TFLite)")
        return
    if code == Op.DIV and c.nn_type(op.out_tensor()).type == T.TENSOR_INT32 and activation == 0:
        _truncating_int32_div(c, op)
        return
    if len(op.out_tensor().shape) > _MAX_RANK and _lifted_arithmetic(c, op, code, activation):
        return
    a, b = c.input(0), c.input(1)
    if code == Op.MUL and c.nn_type(op.out_tensor()).type in _QUANT8 and activation == 0:
        a_type, b_type, out_type = c.type_of(a), c.type_of(b), c.nn_type(op.out_tensor())
        if not quantized_mul_scales_allowed(a_type.scale, b_type.scale, out_type.scale):
            # NNAPI's quantized MUL needs output_scale > input1_scale * input2_scale; TFLite's
            # (a multiplier >= 1: yolov5's box decoding) takes any, with one rounding
            if not _float_mul_matches_tflite(a_type, b_type, out_type):
                raise UnsupportedOperator(
                    f"quantized MUL whose output scale {out_type.scale} does not exceed the product of the "
                    f"input scales ({a_type.scale} * {b_type.scale}), which NNAPI's MUL requires, and whose "
                    "float32 form (DEQUANTIZE, MUL, QUANTIZE) differs from TFLite's integer MUL")
            _in_float32(c, op, lambda inputs, out: c.emit(Op.MUL, [*inputs, c.i32(0)], [out]))
            c.lowered("quantized MUL whose output scale does not exceed the product of the input scales "
                      "(NNAPI's MUL requires it) as DEQUANTIZE, MUL in float32, QUANTIZE: equal to TFLite's "
                      "integer MUL on every pair of stored values (checked at import)")
            return
    c.with_activation(activation, lambda act, out: c.emit(code, [a, b, act], [out]))


def _truncating_int32_div(c: _Converter, op: _Operator) -> None:
    """TFLite's int32 DIV truncates toward zero (C++ ``/``: -7 / 2 = -3); NNAPI's int32 DIV
    is floor division (-4). The floor quotient q is one below the truncated one exactly where
    the quotient is negative and inexact: a - q * b != 0 (FLOOR_MOD's remainder, from the
    same ``_floor_quotient_remainder``) and q < 0; there it is q + 1."""
    if len(op.out_tensor().shape) > _MAX_RANK:
        raise UnsupportedOperator(f"int32 DIV of rank {len(op.out_tensor().shape)} (TFLite's truncating division "
                                  f"is lowered at rank {_MAX_RANK} at most)")
    a, b = c.input(0), c.input(1)
    out = c.output()
    out_type = c.type_of(out)
    flags = OperandType(T.TENSOR_BOOL8, out_type.dimensions)
    zero = c.const_operand(np.zeros([1], np.int32), OperandType(T.TENSOR_INT32, [1]))
    one = c.const_operand(np.ones([1], np.int32), OperandType(T.TENSOR_INT32, [1]))
    floor_q, remainder = _floor_quotient_remainder(c, a, b, out_type)
    q_plus_one = c.temp(out_type)
    inexact, negative, both = (c.temp(flags) for _ in range(3))
    c.emit(Op.NOT_EQUAL, [remainder, zero], [inexact])
    c.emit(Op.LESS, [floor_q, zero], [negative])
    c.emit(Op.LOGICAL_AND, [inexact, negative], [both])
    c.emit(Op.ADD, [floor_q, one, c.i32(0)], [q_plus_one])
    c.emit(Op.SELECT, [both, q_plus_one, floor_q], [out])
    c.lowered("int32 DIV (TFLite truncates toward zero) as NNAPI's floor DIV, plus one where the quotient is "
              "negative and inexact")


def _floor_quotient_remainder(c: _Converter, a: int, b: int, out_type: OperandType,
                              remainder: int | None = None) -> tuple[int, int]:
    """NNAPI's int32 DIV of ``a`` by ``b`` (floor division) and the remainder a - (a DIV b)
    * b, which is FLOOR_MOD's result and, for the truncating DIV, zero exactly where the
    division is exact: the quotient and the remainder (written into ``remainder`` where
    given), by DIV, MUL, SUB."""
    quotient, product = c.temp(out_type), c.temp(out_type)
    if remainder is None:
        remainder = c.temp(out_type)
    c.emit(Op.DIV, [a, b, c.i32(0)], [quotient])
    c.emit(Op.MUL, [quotient, b, c.i32(0)], [product])
    c.emit(Op.SUB, [a, product, c.i32(0)], [remainder])
    return quotient, remainder


def _float_mul_matches_tflite(a: OperandType, b: OperandType, out: OperandType) -> bool:
    """Whether DEQUANTIZE, MUL, QUANTIZE in float32 (NNAPI's arithmetic: (q - zero point) *
    scale, the product, round(p / scale) halves away from zero, saturated) give TFLite's
    integer MUL without activation on all 65,536 pairs of 8-bit stored values: zero point +
    MultiplyByQuantizedMultiplier((qa - za) * (qb - zb)) of the multiplier
    scale_a * scale_b / scale_out, which TFLite computes in float32 (mul.cc); also in float64,
    in case a build does, so that neither rounding of the multiplier is assumed."""
    if not np.dtype(a.dtype) == np.dtype(b.dtype) == np.dtype(out.dtype):
        return False
    info = np.iinfo(a.dtype)
    qa = np.arange(info.min, info.max + 1, dtype=np.int64)[:, None]
    qb = np.arange(info.min, info.max + 1, dtype=np.int64)[None, :]
    product = (qa - a.zero_point) * (qb - b.zero_point)
    real = dequantize(qa, a.scale, a.zero_point, np.float32) * dequantize(qb, b.scale, b.zero_point, np.float32)
    got = np.clip(quantize(real, out.scale, out.zero_point, np.float32), info.min, info.max)
    multipliers = (rescale_multiplier(a.scale, b.scale, out.scale, float32_quotient=True),
                   quantize_multiplier(float(a.scale) * float(b.scale) / float(out.scale)))
    for multiplier, shift in multipliers:
        want = np.clip(multiply_by_quantized_multiplier(product, multiplier, shift) + out.zero_point,
                       info.min, info.max)
        if not np.array_equal(got, want):
            return False
    return True


for _name in _ARITHMETIC:
    _converter(_name)(_arithmetic)

@_converter("FLOOR_DIV", "FLOOR_MOD")
def _floor_div_mod(c: _Converter, op: _Operator) -> None:
    """int32: NNAPI's int32 DIV is floor division (FLOOR_DIV), FLOOR_MOD = a - (a div b) * b;
    float FLOOR_DIV = FLOOR(a / b), as TFLite computes it. Float FLOOR_MOD refuses (TFLite's
    is fmod-exact; a - floor(a / b) * b rounds)."""
    a, b = c.input(0), c.input(1)
    out = c.output()
    out_type = c.type_of(out)
    if out_type.type == T.TENSOR_INT32:
        if op.name == "FLOOR_DIV":
            c.emit(Op.DIV, [a, b, c.i32(0)], [out])
            c.lowered("int32 FLOOR_DIV as DIV (NNAPI's int32 DIV is floor division)")
            return
        _floor_quotient_remainder(c, a, b, out_type, out)
        c.lowered("int32 FLOOR_MOD as a - (a DIV b) * b (NNAPI's int32 DIV is floor division)")
        return
    if out_type.type in _FLOAT_TYPES and op.name == "FLOOR_DIV":
        ratio = c.temp(out_type)
        c.emit(Op.DIV, [a, b, c.i32(0)], [ratio])
        c.emit(Op.FLOOR, [ratio], [out])
        c.lowered("float FLOOR_DIV as DIV + FLOOR")
        return
    raise UnsupportedOperator(f"{op.name} of {out_type.type.name} has no exact NNAPI sequence")


_SIMPLE = {
    "ABS": Op.ABS, "EXP": Op.EXP, "FLOOR": Op.FLOOR, "LOG": Op.LOG, "NEG": Op.NEG, "RSQRT": Op.RSQRT,
    "SIN": Op.SIN, "SQRT": Op.SQRT, "LOGISTIC": Op.LOGISTIC, "TANH": Op.TANH, "RELU": Op.RELU,
    "RELU6": Op.RELU6, "RELU_N1_TO_1": Op.RELU1, "HARD_SWISH": Op.HARD_SWISH, "LOGICAL_NOT": Op.LOGICAL_NOT,
    "L2_NORMALIZATION": Op.L2_NORMALIZATION,
    "MAXIMUM": Op.MAXIMUM, "MINIMUM": Op.MINIMUM, "POW": Op.POW, "PRELU": Op.PRELU,
    "LESS": Op.LESS, "LESS_EQUAL": Op.LESS_EQUAL, "GREATER": Op.GREATER, "GREATER_EQUAL": Op.GREATER_EQUAL,
    "EQUAL": Op.EQUAL, "NOT_EQUAL": Op.NOT_EQUAL, "LOGICAL_AND": Op.LOGICAL_AND, "LOGICAL_OR": Op.LOGICAL_OR,
    "SELECT": Op.SELECT, "SELECT_V2": Op.SELECT, "BATCH_MATMUL": None,
}


def _simple(c: _Converter, op: _Operator) -> None:
    code = _SIMPLE[op.name]
    if op.name == "L2_NORMALIZATION":
        options = op.options("L2NormOptions")
        if options is not None and options.FusedActivationFunction():
            raise UnsupportedOperator("L2_NORMALIZATION with a fused activation")
    if op.name == "SELECT" and len(op.tensor(0).shape) == 1 and len(op.out_tensor().shape) > 1:
        _select_by_rows(c, op)
        return
    if op.name in ("SELECT", "SELECT_V2"):
        dims = c.nn_type(op.out_tensor()).dimensions
        if {c.type_of(c.input(i)).dimensions for i in range(3)} != {dims}:
            if not all(d > 0 for d in dims):
                raise UnsupportedOperator("NNAPI SELECT needs three tensors of one shape (no broadcasting); "
                                          "the output's shape is not static")
            c.emit(Op.SELECT, [_broadcast_to(c, op, i, dims) for i in range(3)], [c.output()])
            c.lowered(f"SELECT_V2 broadcasting: inputs broadcast to {list(dims)} first (NNAPI's SELECT does not)")
            return
    if code in _COMPARISONS and c.type_of(c.input(0)).type in _QUANT8 and \
            not _comparison_matches_tflite(code, c.type_of(c.input(0)), c.type_of(c.input(1))):
        _quantized_comparison(c, op, code)
        return
    if code in _RELU_FUSE and c.type_of(c.input(0)).type in _QUANT8:
        x, out_type = c.input(0), c.nn_type(op.out_tensor())
        x_type = c.type_of(x)
        if (x_type.scale, x_type.zero_point) != (out_type.scale, out_type.zero_point):
            _requantizing_relu(c, op, code, x, x_type, out_type)
            return
    if code == Op.SQRT and c.type_of(c.input(0)).type in _QUANT8:
        _quantized_sqrt(c, op)
        return
    if code == Op.ABS and c.type_of(c.input(0)).type in _QUANT8:
        _quantized_abs(c, op)
        return
    if code in _FLOAT_ONLY and c.type_of(c.input(0)).type in _QUANT8:
        _in_float32(c, op, lambda inputs, out: c.emit(code, inputs, [out]))
        c.lowered(f"quantized {op.name} (NNAPI's {code.name} is float only) as DEQUANTIZE, {code.name}, QUANTIZE")
        return
    if code in FIXED_OUTPUT_QUANT and c.type_of(c.input(0)).type in _QUANT8:
        out_type = c.nn_type(op.out_tensor())
        if out_type.type not in FIXED_OUTPUT_QUANT[code]:
            raise UnsupportedOperator(f"quantized {op.name} of {c.type_of(c.input(0)).type.name} into "
                                      f"{out_type.type.name} (TFLite keeps the input's type)")
        scale, zero_point = FIXED_OUTPUT_QUANT[code][out_type.type]
        if not has_quantization(out_type.scale, out_type.zero_point, (scale, zero_point)):
            # PT2E quantizes them at their calibrated range; LiteRT's int8 kernels take any
            _in_float32(c, op, lambda inputs, out: c.emit(code, inputs, [out]))
            c.lowered(f"quantized {op.name} whose output is not at NNAPI's fixed scale {scale} / zero point "
                      f"{zero_point} as DEQUANTIZE, {code.name}, QUANTIZE")
            return
    inputs = [c.input(i) for i in range(len(op.inputs))]
    c.emit(code, inputs, [c.output()])


_COMPARISONS = {Op.EQUAL: np.equal, Op.NOT_EQUAL: np.not_equal, Op.LESS: np.less, Op.LESS_EQUAL: np.less_equal,
                Op.GREATER: np.greater, Op.GREATER_EQUAL: np.greater_equal}


def _tflite_comparison_values(x_type: OperandType) -> np.ndarray:
    """What TFLite's 8-bit comparisons compare for each stored value of ``x_type``, ascending
    (comparisons.cc, ComparisonWithScaling): (q - zero point) << 8 multiplied by the
    quantized multiplier of the scale itself, one rounding; about round(256 * real), so
    real values closer than ~1/256 compare equal."""
    info = np.iinfo(x_type.dtype)
    stored = np.arange(info.min, info.max + 1, dtype=np.int64)
    multiplier, shift = quantize_multiplier(float(np.float32(x_type.scale)))
    return multiply_by_quantized_multiplier((stored - x_type.zero_point) * 256, multiplier, shift)


def _comparison_matches_tflite(code: OperationCode, a: OperandType, b: OperandType) -> bool:
    """Whether NNAPI's quantized comparison (of the real values, dequantized in float32)
    gives TFLite's answer on every pair of stored values of ``a`` and ``b``."""
    if a.type not in _QUANT8 or b.type != a.type:
        return False
    compare = _COMPARISONS[code]
    info = np.iinfo(a.dtype)
    stored = np.arange(info.min, info.max + 1, dtype=np.int64)
    real_a = (stored - a.zero_point).astype(np.float32) * np.float32(a.scale)
    real_b = (stored - b.zero_point).astype(np.float32) * np.float32(b.scale)
    return bool(np.array_equal(compare(real_a[:, None], real_b[None, :]),
                               compare(_tflite_comparison_values(a)[:, None], _tflite_comparison_values(b)[None, :])))


def _quantized_comparison(c: _Converter, op: _Operator, code: OperationCode) -> None:
    """An 8-bit comparison on TFLite's values (_tflite_comparison_values: two roundings, no
    float32 formula gives them), where NNAPI's comparison of the real values differs on
    some pair of stored values: each input's stored value recovered as an int32 index
    (DEQUANTIZE, MUL by 1 / scale, + zero point - lowest + 0.5, FLOOR, CAST; checked at
    import to give every stored value), its value in TFLite's table (GATHER of an int32
    constant), the int32 values compared; a constant input is its table values at import."""
    rank = max(len(op.tensor(position).shape) for position in range(2))
    if rank > _MAX_RANK:
        raise UnsupportedOperator(f"quantized {op.name} of rank {rank} whose quantizations NNAPI's comparison of the "
                                  "real values does not compare as TFLite's fixed-point values do (that lowering's "
                                  f"DEQUANTIZE is limited to rank {_MAX_RANK})")
    inputs = []
    for position in range(2):
        x = c.input(position)
        x_type = c.type_of(x)
        if x_type.type not in _QUANT8:
            raise UnsupportedOperator(f"{op.name} of {x_type.type.name} and an 8-bit quantized tensor")
        table = _tflite_comparison_values(x_type).astype(np.int32)
        lowest = int(np.iinfo(x_type.dtype).min)
        int_type = OperandType(T.TENSOR_INT32, x_type.dimensions)
        const = c.const_of(op.inputs[position])
        if const is not None and const.channel is None and op.inputs[position] not in c.operands:
            inputs.append(c.const_operand(table[np.asarray(const.data).astype(np.int64) - lowest], int_type))
            continue
        stored = np.arange(lowest, lowest + 256, dtype=np.int64)
        inverse = np.float32(1 / np.float32(x_type.scale))
        offset = np.float32(x_type.zero_point - lowest + 0.5)
        real = (stored - x_type.zero_point).astype(np.float32) * np.float32(x_type.scale)
        if not np.array_equal(np.floor(real * inverse + offset), stored - lowest):
            raise UnsupportedOperator(f"quantized {op.name}: the stored values of input {position} are not "
                                      "recovered exactly from float32")
        float_type = OperandType(T.TENSOR_FLOAT32, x_type.dimensions)
        scalar = OperandType(T.TENSOR_FLOAT32, [1])
        real_x, unscaled, shifted, floored = (c.temp(float_type) for _ in range(4))
        index, value = c.temp(int_type), c.temp(int_type)
        c.emit(Op.DEQUANTIZE, [x], [real_x])
        c.emit(Op.MUL, [real_x, c.const_operand(np.array([inverse], np.float32), scalar), c.i32(0)], [unscaled])
        c.emit(Op.ADD, [unscaled, c.const_operand(np.array([offset], np.float32), scalar), c.i32(0)], [shifted])
        c.emit(Op.FLOOR, [shifted], [floored])
        c.emit(Op.CAST, [floored], [index])
        c.emit(Op.GATHER, [c.const_operand(table, OperandType(T.TENSOR_INT32, [256])), c.i32(0), index], [value])
        inputs.append(value)
    c.emit(code, inputs, [c.output()])
    c.lowered(f"quantized {op.name} on TFLite's fixed-point values (about round(256 * real)) by a table of the "
              "stored values: NNAPI's compares the real values, which differ on some pair of stored values")


def _quantized_sqrt(c: _Converter, op: _Operator) -> None:
    """TFLite's 8-bit SQRT rounds down: floor(sqrt(real) / output scale) + zero point (LiteRT's
    builtin and reference kernels alike, on every stored value of random quantizations), where
    DEQUANTIZE, SQRT, QUANTIZE rounds to nearest (a step above on ~a third of the values):
    DEQUANTIZE, SQRT, DIV by the output scale, FLOOR, MUL by it, QUANTIZE (which gives back
    the whole number of steps exactly)."""
    out_type = c.nn_type(op.out_tensor())
    scale = c.const_operand(np.array([out_type.scale], np.float32), OperandType(T.TENSOR_FLOAT32, [1]))

    def build(inputs: list[int], out: int) -> None:
        float_type = c.type_of(out)
        root, steps, whole = c.temp(float_type), c.temp(float_type), c.temp(float_type)
        c.emit(Op.SQRT, inputs, [root])
        c.emit(Op.DIV, [root, scale, c.i32(0)], [steps])
        c.emit(Op.FLOOR, [steps], [whole])
        c.emit(Op.MUL, [whole, scale, c.i32(0)], [out])

    _in_float32(c, op, build)
    c.lowered("quantized SQRT as DEQUANTIZE, SQRT, DIV by the output scale, FLOOR, MUL, QUANTIZE (TFLite's rounds "
              "down)")


def _select_by_rows(c: _Converter, op: _Operator) -> None:
    """TFLite's SELECT (version 1) with a rank-1 condition of x's first dimension picks whole
    rows (select.cc's RankOneSelect), where NumPy's rule would align it with the last one.
    The condition is broadcast along the leading axis: a constant at import; a run-time one
    as SELECT of int32 1 / 0, EXPAND_DIMS to [n, 1, ...], TILE and NOT_EQUAL 0 (NNAPI has no
    RESHAPE or TILE of bool)."""
    dims = _static_shape(c, op.out_tensor())
    if dims is None or not all(d > 0 for d in dims):
        raise UnsupportedOperator("SELECT of a rank-1 condition over rows needs a static, non-empty output shape")
    dims = list(dims)
    if list(op.tensor(0).shape) != dims[:1]:
        raise UnsupportedOperator(f"SELECT's rank-1 condition of shape {list(op.tensor(0).shape)} must be as long "
                                  f"as x's first dimension ({dims[0]}), TFLite's rule for selecting rows")
    rows = [dims[0]] + [1] * (len(dims) - 1)
    full = OperandType(T.TENSOR_BOOL8, dims)
    const = c.const_of(op.inputs[0])
    if const is not None and op.inputs[0] not in c.operands:
        cond = c.const_operand(np.broadcast_to(np.asarray(const.data, np.bool_).reshape(rows), dims), full)
    else:
        flags = OperandType(T.TENSOR_INT32, [dims[0]])
        ones = c.const_operand(np.ones([dims[0]], np.int32), flags)
        zeros = c.const_operand(np.zeros([dims[0]], np.int32), flags)
        as_int = c.temp(flags)
        c.emit(Op.SELECT, [c.input(0), ones, zeros], [as_int])
        for rank in range(2, len(dims) + 1):
            ranked = c.temp(flags, rows[:rank])
            c.emit(Op.EXPAND_DIMS, [as_int, c.i32(-1)], [ranked])
            as_int = ranked
        tiled = c.temp(flags, dims)
        c.emit(Op.TILE, [as_int, c.vector([1] + dims[1:])], [tiled])
        cond = c.temp(full)
        c.emit(Op.NOT_EQUAL, [tiled, c.const_operand(np.zeros([1], np.int32), flags.with_dimensions([1]))], [cond])
    c.emit(Op.SELECT, [cond, _broadcast_to(c, op, 1, dims), _broadcast_to(c, op, 2, dims)], [c.output()])
    c.lowered("SELECT with a rank-1 condition: the condition broadcast along the first dimension (TFLite "
              "selects rows)")


def _requantizing_relu(c: _Converter, op: _Operator, code: OperationCode, x: int, x_type: OperandType,
                       out_type: OperandType) -> None:
    """A quantized RELU / RELU1 / RELU6 whose output quantization differs from its input's.

    NNAPI's keeps the input's scale; TFLite's rescales x - zero point by the quantized
    multiplier of s_in / s_out = m * 2**e, adds the output zero point and clamps. NNAPI's
    8-bit MUL by a constant 2**k (stored 2**k above its zero point, scale 2**-k, k =
    max(e, 0)) with the activation fused is that: its product (x - z) * 2**k rescaled by
    m * 2**(e - k) is TFLite's one high multiply of (x - z) << e when e > 0, and the same
    multiply and rounding shift when e <= 0 (Android derives the multiplier by a double
    division of the float32 scales, TFLite by a float one: the Q31 mantissas may differ in
    their last bits). An ADD of 0 (the earlier lowering) rescales each input onto a common
    2**-20 finer scale first and rounds twice: a step off on ~1.5% of stored values. Kept
    for multipliers of 128 and more, where 2**k has no 8-bit constant."""
    exponent = rescale_multiplier(x_type.scale, 1, out_type.scale)[1]
    shift = max(exponent, 0)
    fuse = c.i32(_RELU_FUSE[code])
    if shift <= 7:
        zero_point = 0 if x_type.type == T.TENSOR_QUANT8_ASYMM else -128
        factor = c.const_operand(np.array([zero_point + (1 << shift)], x_type.dtype),
                                 OperandType(x_type.type, [1], 2.0 ** -shift, zero_point))
        c.emit(Op.MUL, [x, factor, fuse], [c.output()])
        c.lowered(f"requantizing {op.name} as MUL by a constant {2 ** shift} (scale 2**-{shift}) with the "
                  f"activation fused (NNAPI's {code.name} keeps the input's scale)")
        return
    zero = c.const_operand(np.array([x_type.zero_point], x_type.dtype), x_type.with_dimensions([1]))
    c.emit(Op.ADD, [x, zero, fuse], [c.output()])
    c.lowered(f"requantizing {op.name} (scale ratio 128 or more) as ADD of 0 with the activation fused "
              f"(NNAPI's {code.name} keeps the input's scale)")


#: NNAPI's activation operations and the fuse code that means the same
_RELU_FUSE = {Op.RELU: 1, Op.RELU1: 2, Op.RELU6: 3}
#: the unary operations of _SIMPLE that NNAPI defines on float tensors only
_FLOAT_ONLY = (Op.RSQRT, Op.SQRT, Op.EXP, Op.LOG, Op.SIN, Op.POW)



@_converter("GELU")
def _gelu(c: _Converter, op: _Operator) -> None:
    options = op.options("GeluOptions")
    approximate = bool(options.Approximate()) if options is not None else False
    form = "tanh form" if approximate else "erf form, erf to 1.5e-7 by Abramowitz & Stegun 7.1.26"
    if c.nn_type(op.out_tensor()).type in _QUANT8:
        _in_float32(c, op, lambda inputs, out: _gelu_float(c, inputs[0], out, approximate))
        c.lowered(f"quantized GELU ({form}) as DEQUANTIZE, elementwise float32 operations, QUANTIZE")
        return
    _gelu_float(c, c.input(0), c.output(), approximate)
    c.lowered(f"GELU ({form}) as elementwise NNAPI operations (NNAPI has no GELU)")


def _gelu_float(c: _Converter, x: int, out: int, approximate: bool) -> None:
    """gelu(x) = x * Phi(x). Exact form: x * Phi(x) = relu(x) - |x| * erfc(|x| / sqrt 2) / 2
    (erf is odd), with no select; approximate: x / 2 * (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))."""
    x_type = c.type_of(x)

    def k(value: float) -> int:
        return c.const_operand(np.array([value], x_type.dtype), x_type.with_dimensions([1]))

    def op2(code: OperationCode, a: int, b: int, target: int | None = None) -> int:
        target = c.temp(x_type) if target is None else target
        c.emit(code, [a, b, c.i32(0)], [target])
        return target

    def op1(code: OperationCode, a: int) -> int:
        target = c.temp(x_type)
        c.emit(code, [a], [target])
        return target

    if approximate:
        cube = op2(Op.MUL, op2(Op.MUL, x, x), x)
        inner = op2(Op.MUL, op2(Op.ADD, op2(Op.MUL, cube, k(GELU_TANH_CUBIC)), x), k(float(np.sqrt(2 / np.pi))))
        op2(Op.MUL, op2(Op.MUL, x, k(0.5)), op2(Op.ADD, op1(Op.TANH, inner), k(1.0)), out)
        return
    magnitude = op1(Op.ABS, x)
    t = op2(Op.DIV, k(1.0), op2(Op.ADD, op2(Op.MUL, magnitude, k(ERFC_P / np.sqrt(2))), k(1.0)))
    poly = op2(Op.MUL, t, k(ERFC_A[4]))
    for coefficient in reversed(ERFC_A[:4]):
        poly = op2(Op.MUL, op2(Op.ADD, poly, k(coefficient)), t)
    erfc = op2(Op.MUL, poly, op1(Op.EXP, op2(Op.MUL, op2(Op.MUL, x, x), k(-0.5))))
    op2(Op.SUB, op1(Op.RELU, x), op2(Op.MUL, op2(Op.MUL, magnitude, erfc), k(0.5)), out)


def _broadcast_to(c: _Converter, op: _Operator, position: int, dims: Sequence[int]) -> int:
    """Input ``position`` broadcast to ``dims`` (NumPy's rule): a constant at import; a
    bool by LOGICAL_AND with true; others by RESHAPE (EXPAND_DIMS for int32) and TILE.
    Once per operand and shape (c.broadcasts): later readers share the first result."""
    x = c.input(position)
    x_type = c.type_of(x)
    dims = list(dims)
    if list(x_type.dimensions) == dims:
        return x
    key = (x, tuple(dims))
    if key not in c.broadcasts:
        c.broadcasts[key] = _broadcast_once(c, op, position, x, dims)
    return c.broadcasts[key]


def _broadcast_once(c: _Converter, op: _Operator, position: int, x: int, dims: list[int]) -> int:
    x_type = c.type_of(x)
    const = c.const_of(op.inputs[position])
    full = x_type.with_dimensions(dims)
    source = [1] * (len(dims) - x_type.rank) + list(x_type.dimensions)
    if len(source) != len(dims) or any(s not in (1, d) for s, d in zip(source, dims)) or 0 in source:
        raise UnsupportedOperator(f"input {position} of shape {list(x_type.dimensions)} does not broadcast to "
                                  f"{dims}" + (" (an empty tensor)" if 0 in source else ""))
    if const is not None and const.channel is None:
        return c.const_operand(np.broadcast_to(const.data.reshape(x_type.dimensions), dims), full)
    if x_type.type == T.TENSOR_BOOL8:
        out = c.temp(full)
        c.emit(Op.LOGICAL_AND, [x, c.const_operand(np.ones(dims, np.bool_), full)], [out])
        return out
    if x_type.rank < len(dims) and x_type.type == T.TENSOR_INT32:  # NNAPI's RESHAPE takes no int32
        for rank in range(x_type.rank + 1, len(dims) + 1):
            ranked = c.temp(x_type, source[len(dims) - rank:])
            c.emit(Op.EXPAND_DIMS, [x, c.i32(0)], [ranked])
            x = ranked
    elif x_type.rank < len(dims):
        ranked = c.temp(x_type, source)
        c.emit(Op.RESHAPE, [x, c.vector(source)], [ranked])
        x = ranked
    out = c.temp(full)
    c.emit(Op.TILE, [x, c.vector([d // s for s, d in zip(source, dims)])], [out])
    return out


for _name, _code in _SIMPLE.items():
    if _code is not None:
        _converter(_name)(_simple)


@_converter("ELU")
def _elu(c: _Converter, op: _Operator) -> None:
    x = c.input(0)
    c.emit(Op.ELU, [x, c.float_scalar(1.0, x)], [c.output()])


@_converter("LEAKY_RELU")
def _leaky_relu(c: _Converter, op: _Operator) -> None:
    alpha = op.options("LeakyReluOptions").Alpha()
    x = c.input(0)
    x_type = c.type_of(x)
    if x_type.type in _FLOAT_TYPES:
        slope = c.const_operand(np.array([alpha], x_type.dtype), OperandType(x_type.type, [1]))
    elif x_type.type in _QUANT8 and alpha > 0:
        # alpha is exactly representable as one step of a quantized tensor of scale alpha.
        slope = c.const_operand(np.array([1], x_type.dtype), OperandType(x_type.type, [1], float(alpha), 0))
    else:
        raise UnsupportedOperator(f"LEAKY_RELU with alpha {alpha} on {x_type.type.name}")
    c.emit(Op.PRELU, [x, slope], [c.output()])
    c.lowered(f"LEAKY_RELU as PRELU with a constant slope {alpha:g}")


@_converter("SQUARED_DIFFERENCE")
def _squared_difference(c: _Converter, op: _Operator) -> None:
    a, b = c.input(0), c.input(1)
    out_type = c.nn_type(op.out_tensor())
    if out_type.type in _QUANT8:
        _in_float32(c, op, lambda inputs, out: _squared_difference_float(c, *inputs, out))
        c.lowered("quantized SQUARED_DIFFERENCE as DEQUANTIZE, SUB + MUL in float32, QUANTIZE (one rounding, "
                  "where TFLite's integer kernel rounds in fixed point: within a step of it)")
        return
    if out_type.type not in _FLOAT_TYPES:
        raise UnsupportedOperator(f"SQUARED_DIFFERENCE of {out_type.type.name} has no NNAPI sequence")
    _squared_difference_float(c, a, b, c.output())
    c.lowered("SQUARED_DIFFERENCE as SUB + MUL")


def _squared_difference_float(c: _Converter, a: int, b: int, out: int) -> None:
    out_type = c.type_of(out)
    difference = c.temp(out_type)
    c.emit(Op.SUB, [a, b, c.i32(0)], [difference])
    c.emit(Op.MUL, [difference, difference, c.i32(0)], [out])


def _in_float32(c: _Converter, op: _Operator, build: Callable[[list[int], int], None]) -> None:
    """A quantized operator computed in float32: every quantized input DEQUANTIZEd, ``build``
    emits the float operation into a float32 temporary, QUANTIZE writes the output."""
    inputs = []
    for position in range(len(op.inputs)):
        x = c.input(position)
        x_type = c.type_of(x)
        if x_type.type in _QUANT8:
            real = c.temp(OperandType(T.TENSOR_FLOAT32, x_type.dimensions))
            c.emit(Op.DEQUANTIZE, [x], [real])
            x = real
        inputs.append(x)
    out = c.output()
    real_out = c.temp(OperandType(T.TENSOR_FLOAT32, c.type_of(out).dimensions))
    build(inputs, real_out)
    c.emit(Op.QUANTIZE, [real_out], [out])


@_converter("SQUARE")
def _square(c: _Converter, op: _Operator) -> None:
    x = c.input(0)
    if c.type_of(x).type not in _FLOAT_TYPES + (T.TENSOR_INT32,):
        raise UnsupportedOperator("quantized SQUARE")
    c.emit(Op.MUL, [x, x, c.i32(0)], [c.output()])
    c.lowered("SQUARE as MUL of the input by itself")


@_converter("ADD_N")
def _add_n(c: _Converter, op: _Operator) -> None:
    operands = [c.input(i) for i in range(len(op.inputs))]
    out_type = c.nn_type(op.out_tensor())
    total = operands[0]
    for i, operand in enumerate(operands[1:], 1):
        target = c.output() if i == len(operands) - 1 else c.temp(out_type)
        c.emit(Op.ADD, [total, operand, c.i32(0)], [target])
        total = target
    if len(operands) == 1:
        c.identity(total, c.output())
    c.lowered(f"ADD_N of {len(operands)} tensors as a chain of ADD")


@_converter("BROADCAST_TO")
def _broadcast_to_op(c: _Converter, op: _Operator) -> None:
    dims = _static_shape(c, op.out_tensor())
    if dims is None:
        raise UnsupportedOperator("BROADCAST_TO an unknown shape has no NNAPI equivalent")
    const = c.const_of(op.inputs[0])
    if const is not None and const.channel is None and op.inputs[0] not in c.operands:
        c.consts[op.outputs[0]] = _Const(np.broadcast_to(const.data.reshape(_operand_shape(const.data.shape)), dims)
                                         .copy(), const.code, const.scale, const.zero_point)
        c.lowered("BROADCAST_TO of a constant folded at import")
        return
    c.identity(_broadcast_to(c, op, 0, dims), c.output())
    c.lowered(f"BROADCAST_TO {dims} as RESHAPE / EXPAND_DIMS and TILE (LOGICAL_AND for bool)")


@_converter("CEIL")
def _ceil(c: _Converter, op: _Operator) -> None:
    x = c.input(0)
    x_type = c.type_of(x)
    if x_type.type not in _FLOAT_TYPES:
        raise UnsupportedOperator(f"CEIL of {x_type.type.name}")
    negated, floored = c.temp(x_type), c.temp(x_type)
    c.emit(Op.NEG, [x], [negated])
    c.emit(Op.FLOOR, [negated], [floored])
    c.emit(Op.NEG, [floored], [c.output()])
    c.lowered("CEIL as NEG, FLOOR, NEG (ceil(x) = -floor(-x))")


@_converter("COS")
def _cos(c: _Converter, op: _Operator) -> None:
    x = c.input(0)
    x_type = c.type_of(x)
    if x_type.type not in _FLOAT_TYPES:
        raise UnsupportedOperator(f"COS of {x_type.type.name} (TFLite's COS is float only)")
    dtype = np.float32 if x_type.type == T.TENSOR_FLOAT32 else np.float16

    def const(value: float) -> int:
        return c.const_operand(np.array([value], dtype), OperandType(x_type.type, [1]))

    # cos(x) = 1 - 2 sin(x / 2)^2: x / 2 is exact, so this keeps SIN's accuracy for any x
    # (within a few units of the last place of 1 near cos = 0); sin(x + pi / 2) would round
    # x + pi / 2 first, an error of ulp(x) (6e-5 at x = 1000)
    half, sine, square, twice = (c.temp(x_type) for _ in range(4))
    c.emit(Op.MUL, [x, const(0.5), c.i32(0)], [half])
    c.emit(Op.SIN, [half], [sine])
    c.emit(Op.MUL, [sine, sine, c.i32(0)], [square])
    c.emit(Op.MUL, [square, const(2.0), c.i32(0)], [twice])
    c.emit(Op.SUB, [const(1.0), twice, c.i32(0)], [c.output()])
    c.lowered("COS as 1 - 2 SIN(x / 2)^2 (MUL, SIN, MUL, MUL, SUB)")


@_converter("BUCKETIZE")
def _bucketize(c: _Converter, op: _Operator) -> None:
    """BUCKETIZE of float32 (TFLite: the number of boundaries at or below each value, its
    std::upper_bound): per boundary LESS and SELECT of 0.0 / 1.0, ADDed, CAST to int32 (the
    counts are exact in float32). upper_bound counts a boundary b unless x < b, so a NaN
    counts every boundary: GREATER_EQUAL(NaN, b), false, would count none."""
    options = op.options("BucketizeOptions")
    x = c.input(0)
    x_type = c.type_of(x)
    boundaries = [float(options.Boundaries(i)) for i in range(options.BoundariesLength())] if options else []
    if x_type.type != T.TENSOR_FLOAT32 or not x_type.is_fully_specified:
        raise UnsupportedOperator(f"BUCKETIZE of {x_type.type.name} (float32 of a static shape only here)")
    if not boundaries or any(b > a for b, a in zip(boundaries, boundaries[1:], strict=False)):
        raise UnsupportedOperator("BUCKETIZE boundaries must be given and sorted (TFLite refuses others)")
    dims = list(x_type.dimensions)
    ones = c.const_operand(np.ones(dims, np.float32), x_type)
    zeros = c.const_operand(np.zeros(dims, np.float32), x_type)
    total = None
    for boundary in boundaries:
        below = c.temp(OperandType(T.TENSOR_BOOL8, dims))
        c.emit(Op.LESS, [x, c.const_operand(np.array([boundary], np.float32),
                                            OperandType(T.TENSOR_FLOAT32, [1]))], [below])
        counted = c.temp(x_type)
        c.emit(Op.SELECT, [below, zeros, ones], [counted])
        if total is not None:
            summed = c.temp(x_type)
            c.emit(Op.ADD, [total, counted, c.i32(0)], [summed])
            counted = summed
        total = counted
    c.emit(Op.CAST, [total], [c.output()])
    c.lowered(f"BUCKETIZE as LESS + SELECT 0 / 1 per boundary ({len(boundaries)}), ADD, CAST to int32")


@_converter("RELU_0_TO_1")
def _relu_0_to_1(c: _Converter, op: _Operator) -> None:
    x = c.input(0)
    x_type = c.type_of(x)
    out = c.output()
    out_type = c.type_of(out)
    if x_type.type not in (*_FLOAT_TYPES, *_QUANT8):
        raise UnsupportedOperator(f"RELU_0_TO_1 of {x_type.type.name}")

    def bound(value: float) -> int:
        if out_type.type in _FLOAT_TYPES:
            return c.const_operand(np.array([value], out_type.dtype), out_type.with_dimensions([1]))
        # the bound in the output's quantization: the clamp of TFLite's kernel, on stored values
        info = np.iinfo(out_type.dtype)
        stored = np.clip(np.round(value / out_type.scale) + out_type.zero_point, info.min, info.max)
        return c.const_operand(np.array([stored], out_type.dtype), out_type.with_dimensions([1]))

    below = c.temp(out_type)
    c.emit(Op.MINIMUM, [x, bound(1.0)], [below])
    c.emit(Op.MAXIMUM, [below, bound(0.0)], [out])
    c.lowered("RELU_0_TO_1 as MINIMUM 1, MAXIMUM 0 (NNAPI has no such activation)")


@_converter("ONE_HOT")
def _one_hot(c: _Converter, op: _Operator) -> None:
    """ONE_HOT of int32 indices with a constant depth: EQUAL of the indices (EXPAND_DIMS at
    the new axis) and the constant positions 0 .. depth - 1 shaped to broadcast along it,
    then SELECT of on_value / off_value broadcast to the output (NNAPI has no ONE_HOT; an
    index outside [0, depth) matches no position: all off_value, as TFLite's)."""
    options = op.options("OneHotOptions")
    indices = c.input(0)
    i_type = c.type_of(indices)
    if i_type.type != T.TENSOR_INT32:
        raise UnsupportedOperator(f"ONE_HOT of {i_type.type.name} indices (NNAPI's comparisons here take int32)")
    depth = int(np.asarray(c.const_values(1, "depth")).reshape(-1)[0])
    dims = _static_shape(c, op.out_tensor())
    if dims is None or depth <= 0:
        raise UnsupportedOperator("ONE_HOT to an output of unknown shape or an empty depth")
    out_type = c.nn_type(op.out_tensor())
    if out_type.type not in (*_FLOAT_TYPES, *_QUANT8, T.TENSOR_INT32):
        raise UnsupportedOperator(f"ONE_HOT of {out_type.type.name} values (NNAPI's SELECT takes none)")
    rank = len(dims)
    axis = (options.Axis() if options is not None else -1) % rank
    if len(op.tensor(0).shape) == 0:
        expanded = indices  # a rank-0 index is an NNAPI [1]: it broadcasts along the depth as it is
    else:
        expanded = c.temp(i_type, dims[:axis] + [1] + dims[axis + 1:])
        c.emit(Op.EXPAND_DIMS, [indices, c.i32(axis)], [expanded])
    positions = c.const_operand(np.arange(depth, dtype=np.int32).reshape([depth] + [1] * (rank - 1 - axis)),
                                OperandType(T.TENSOR_INT32, [depth] + [1] * (rank - 1 - axis)))
    hot = c.temp(OperandType(T.TENSOR_BOOL8, dims))
    c.emit(Op.EQUAL, [expanded, positions], [hot])
    c.emit(Op.SELECT, [hot, _one_hot_value(c, op, 2, out_type, dims), _one_hot_value(c, op, 3, out_type, dims)],
           [c.output()])
    c.lowered(f"ONE_HOT (depth {depth}, axis {axis}) as EXPAND_DIMS, EQUAL to the positions and SELECT of "
              "on_value / off_value")


def _one_hot_value(c: _Converter, op: _Operator, position: int, out_type: OperandType, dims: list[int]) -> int:
    """ONE_HOT's on_value / off_value (input ``position``) broadcast to ``dims``. TFLite's
    kernel copies the stored value into the output, whatever the two quantizations: a
    quantized constant becomes a constant of the output's type holding that stored value
    (SELECT would keep the real value, requantized); a run-time one must already share
    the output's quantization, as no NNAPI operation moves stored values between two."""
    if out_type.type not in _QUANT8:
        return _broadcast_to(c, op, position, dims)
    const = c.const_of(op.inputs[position])
    name = ("on_value", "off_value")[position - 2]
    if const is not None and const.channel is None:
        stored = np.asarray(const.data).reshape(-1)
        if stored.size != 1 or const.code != out_type.type:
            raise UnsupportedOperator(f"quantized ONE_HOT: {name} must be one value of the output's type")
        return c.const_operand(np.full(dims, stored[0], out_type.dtype), out_type.with_dimensions(dims))
    x_type = c.type_of(c.input(position))
    if (x_type.type, np.float32(x_type.scale), x_type.zero_point) != \
            (out_type.type, np.float32(out_type.scale), out_type.zero_point):
        raise UnsupportedOperator(f"quantized ONE_HOT: {name} is computed at run time in a quantization other than "
                                  "the output's (TFLite copies its stored value; NNAPI's SELECT keeps the real value)")
    return _broadcast_to(c, op, position, dims)


@_converter("SIGN")
def _sign(c: _Converter, op: _Operator) -> None:
    """SIGN of a float or int32 tensor of static shape, as LiteRT computes it (1 above 0, -1
    below, zeros kept, NaN kept): SELECT of 1 where GREATER 0, else SELECT of -1 where
    LESS 0, else the input minus itself (+0 for either zero, NaN for NaN). NNAPI has no SIGN; the
    constants are of the input's shape, as SELECT takes no broadcasting."""
    x = c.input(0)
    x_type = c.type_of(x)
    dims = list(x_type.dimensions)
    if x_type.type not in (*_FLOAT_TYPES, T.TENSOR_INT32) or not all(d > 0 for d in dims):
        raise UnsupportedOperator(f"SIGN of {x_type.type.name}" + ("" if all(d > 0 for d in dims) else
                                                                    " of an unknown shape") +
                                  " has no NNAPI sequence")
    flags = OperandType(T.TENSOR_BOOL8, dims)
    positive, negative, kept, rest = c.temp(flags), c.temp(flags), c.temp(x_type), c.temp(x_type)
    zero = c.const_operand(np.zeros([1], x_type.dtype), x_type.with_dimensions([1]))
    c.emit(Op.GREATER, [x, zero], [positive])
    c.emit(Op.LESS, [x, zero], [negative])
    # x - x: +0 for either zero (as LiteRT's SIGN gives; x * 0 kept -0's sign), NaN for NaN
    c.emit(Op.SUB, [x, x, c.i32(0)], [kept])

    def full(value: int) -> int:
        return c.const_operand(np.full(dims, value, x_type.dtype), x_type)

    c.emit(Op.SELECT, [negative, full(-1), kept], [rest])
    c.emit(Op.SELECT, [positive, full(1), rest], [c.output()])
    c.lowered("SIGN as GREATER / LESS than 0 and two SELECTs of 1, -1 and the input minus itself")


def _lookup_stored_values(c: _Converter, x: int, table: np.ndarray, out: int) -> None:
    """``out`` = ``table``[q - the type's lowest value] for each stored value q of quantized
    ``x`` (a table of the operator's output for every stored value, made at import). The
    index comes exactly from float32: DEQUANTIZE gives (q - zero point) * scale within
    2**-23 relative, MUL by 1 / scale gives q - zero point within 1e-4 (|q - zero point| <=
    255), ADD of 0.5 + zero point - lowest value and FLOOR round it to the index, CAST makes
    it int32, GATHER reads the table; refused at import where an extreme scale breaks that
    (_check_stored_values_recovered)."""
    x_type = c.type_of(x)
    shift = x_type.zero_point - int(np.iinfo(x_type.dtype).min)
    _check_stored_values_recovered(x_type, shift, f"quantized {c.current.name}")
    f32 = OperandType(T.TENSOR_FLOAT32, x_type.dimensions)
    real, scaled, shifted, whole = (c.temp(f32) for _ in range(4))
    start = 0.5 + shift

    def scalar(value: float) -> int:
        return c.const_operand(np.float32(value), OperandType(T.TENSOR_FLOAT32, [1]))

    c.emit(Op.DEQUANTIZE, [x], [real])
    c.emit(Op.MUL, [real, scalar(np.float32(1.0) / np.float32(x_type.scale)), c.i32(0)], [scaled])
    c.emit(Op.ADD, [scaled, scalar(start), c.i32(0)], [shifted])
    c.emit(Op.FLOOR, [shifted], [whole])
    index = c.temp(OperandType(T.TENSOR_INT32, x_type.dimensions))
    c.emit(Op.CAST, [whole], [index])
    out_type = c.type_of(out)
    values = c.const_operand(table, OperandType(out_type.type, [table.size], out_type.scale, out_type.zero_point))
    c.emit(Op.GATHER, [values, c.i32(0), index], [out])


def _quantized_abs(c: _Converter, op: _Operator) -> None:
    """Quantized ABS (NNAPI's takes float and int32 only) as TFLite's integer kernel: |q -
    input zero point|, rescaled by MultiplyByQuantizedMultiplier(QuantizeMultiplier(float32
    input scale / output scale)) where the scales differ, plus the output zero point,
    clamped: a table of every stored value (_lookup_stored_values)."""
    x = c.input(0)
    x_type, out_type = c.type_of(x), c.nn_type(op.out_tensor())
    if x_type.type != T.TENSOR_QUANT8_ASYMM_SIGNED:
        raise UnsupportedOperator(f"ABS of {x_type.type.name} (TFLite's kernel takes int8 and int16 only, "
                                  "NNAPI's no quantized tensors)")
    info = np.iinfo(x_type.dtype)
    magnitudes = np.abs(np.arange(int(info.min), int(info.max) + 1, dtype=np.int64) - x_type.zero_point)
    if np.float32(x_type.scale) != np.float32(out_type.scale):
        fixed, exponent = quantize_multiplier(float(np.float32(x_type.scale) / np.float32(out_type.scale)))
        magnitudes = multiply_by_quantized_multiplier(magnitudes, fixed, exponent)
    out_info = np.iinfo(out_type.dtype)
    table = np.clip(magnitudes + out_type.zero_point, out_info.min, out_info.max)
    _lookup_stored_values(c, x, table, c.output())
    c.lowered("quantized ABS as TFLite's integer kernel: a table of its output for every stored value (DEQUANTIZE, "
              "MUL by 1 / scale, ADD, FLOOR, CAST, GATHER)")


@_converter("ROUND")
def _round(c: _Converter, op: _Operator) -> None:
    """Float ROUND, TFLite's round half to even (NNAPI has no ROUND; it was refused), exactly:
    f = FLOOR(x), d = x - f (exact), the result f + 1 where d > 0.5 or d == 0.5 with f odd
    (f - 2 * FLOOR(f / 2) == 1, exact), else f (also for infinities and NaN, whose d is
    NaN); a zero result is x * 0, the zero of the input's sign, as LiteRT's."""
    x = c.input(0)
    x_type = c.type_of(x)
    if x_type.type not in _FLOAT_TYPES:
        raise UnsupportedOperator(f"ROUND of {x_type.type.name} has no NNAPI sequence")
    flags = OperandType(T.TENSOR_BOOL8, x_type.dimensions)

    def scalar(value: float) -> int:
        return c.const_operand(np.array([value], x_type.dtype), x_type.with_dimensions([1]))

    def emit(code: OperationCode, inputs: list[int], like: OperandType) -> int:
        out = c.temp(like)
        c.emit(code, inputs, [out])
        return out

    floor = emit(Op.FLOOR, [x], x_type)
    fraction = emit(Op.SUB, [x, floor, c.i32(0)], x_type)
    halves = emit(Op.FLOOR, [emit(Op.MUL, [floor, scalar(0.5), c.i32(0)], x_type)], x_type)
    parity = emit(Op.SUB, [floor, emit(Op.ADD, [halves, halves, c.i32(0)], x_type), c.i32(0)], x_type)
    tie_up = emit(Op.LOGICAL_AND, [emit(Op.EQUAL, [fraction, scalar(0.5)], flags),
                                   emit(Op.EQUAL, [parity, scalar(1.0)], flags)], flags)
    up = emit(Op.LOGICAL_OR, [emit(Op.GREATER, [fraction, scalar(0.5)], flags), tie_up], flags)
    rounded = emit(Op.SELECT, [up, emit(Op.ADD, [floor, scalar(1.0), c.i32(0)], x_type), floor], x_type)
    # a zero takes the input's sign (LiteRT: -0 for x in [-0.5, 0], where floor + 1 gave +0):
    # x * 0. It is SELECT's third operand, as ONNX Runtime's Where (1.32) gives +0 for a -0
    # taken from its second (it merges the two sides by "the first where nonzero"); and the
    # condition is |r| > 0, not NOT_EQUAL: nnapi-ort-cpu's Equal + Not is fused by ORT's
    # optimizer into a Where of swapped sides, which put x * 0 second again
    nonzero = emit(Op.GREATER, [emit(Op.ABS, [rounded], x_type), scalar(0.0)], flags)
    c.emit(Op.SELECT, [nonzero, rounded, emit(Op.MUL, [x, scalar(0.0), c.i32(0)], x_type)], [c.output()])
    c.lowered("ROUND (half to even) as FLOOR, the fraction's comparisons with 0.5 and the floor's parity, SELECT; "
              "a zero of the input's sign")
