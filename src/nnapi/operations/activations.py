"""RELU, RELU1, RELU6, LOGISTIC, TANH, ELU, HARD_SWISH, PRELU: activation functions.

Float16 is computed in float32 and rounded once. Quantized inputs:

- RELU / RELU1 / RELU6 keep the input's scale and zero point (the output must declare
  the same), so they clamp the quantized values to the activation range directly.
- LOGISTIC and TANH have outputs of fixed quantization (the specification's values:
  LOGISTIC 1/256 with zero point 0 / -128, TANH 1/128 with zero point 128 / 0); any other
  output quantization is BAD_DATA.
- HARD_SWISH and PRELU may change scale and zero point. PRELU is computed as Android's
  and TFLite's integer kernel computes it (``quant_math.prelu_fixed_point``: two
  quantized multipliers, the negative side's applied to the int32 product x * alpha; the
  real value rounded once differed from LiteRT's by a step on 321 of 40,960 values of 40
  random quantizations). HARD_SWISH is computed as
  Android's and TFLite's kernel computes it (``hard_swish_fixed_point``: int16 fixed
  point, the input on a 2**-7 finer scale, its ReLU6-ish factor on 3 / 2**15), so a
  TFLite model's HARD_SWISH gives LiteRT's values exactly (on real values rounded once
  it was one step off on ~0.5% of an int8 MobileNetV3 block's elements, which grew to 8
  steps at PP-OCR's direction classifier's output); where that kernel refuses the
  scales (the input's 2**-7 finer scale at or above the output's, output multiplier
  exponent > 0) it is computed on real values (float64) and quantized once; like
  Android's kernels, the scaled value is then rounded (halves away from zero) before
  the output zero point is added. Quantized LOGISTIC / TANH / HARD_SWISH /
  PRELU go through lookup tables of every possible stored value (pair), which gives the
  same results faster.

Zero-sized inputs are accepted where the specification says so (all but PRELU).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from nnapi.codes import FuseCode, OperandCode, OperationCode
from nnapi.operand import dtype_of
from nnapi.operations import _jit
from nnapi.operations._native_loops import natives
from nnapi.operations.base import ExecutionContext, Operation, Shape, Tensor, ValidationContext, register
from nnapi.operations.common import (
    SCALAR_FOR_TENSOR,
    activation_bounds_float,
    activation_bounds_quantized,
    quantize_with_activation,
)
from nnapi.operations.elementwise import (
    FLOAT_TENSORS,
    QUANT8_TENSORS,
    all_stored_values,
    broadcast_output_shape,
    check_broadcast,
    check_same_shape_output,
    float_input,
    map_quant8,
    map_quant8_pair,
    prepared_quant8,
    prepared_quant8_pair,
    select_by_bits,
    tile_trailing,
)
from nnapi.operations.quant_math import (
    dequantize,
    int16_multiplier,
    prelu_fixed_point,
    rounding_divide_by_pot16,
    rounding_doubling_high_multiply16,
)

T = OperandCode

# Named input positions (Android's activation.cpp kInputTensor; elu.cpp kAlphaScalar;
# prelu.cpp kAlphaTensor).
INPUT = 0
ELU_ALPHA = 1
PRELU_ALPHA = 1

Op = OperationCode

_ALL_TYPES = FLOAT_TENSORS + QUANT8_TENSORS
_RELU_FUSE = {Op.RELU: FuseCode.FUSED_RELU, Op.RELU1: FuseCode.FUSED_RELU1, Op.RELU6: FuseCode.FUSED_RELU6}
#: (scale, zero point) the specification prescribes for LOGISTIC's and TANH's quantized
#: outputs, per type (the input's and the output's: they must be equal); the TFLite
#: importer reads it too
FIXED_OUTPUT_QUANT = {
    Op.LOGISTIC: {T.TENSOR_QUANT8_ASYMM: (1.0 / 256, 0), T.TENSOR_QUANT8_ASYMM_SIGNED: (1.0 / 256, -128)},
    Op.TANH: {T.TENSOR_QUANT8_ASYMM: (1.0 / 128, 128), T.TENSOR_QUANT8_ASYMM_SIGNED: (1.0 / 128, 0)},
}


def has_quantization(scale: float, zero_point: int, required: tuple[float, int]) -> bool:
    """Whether an operand's ``scale`` and ``zero_point`` are the ``required`` pair; scales
    compare in float32, the precision the NDK stores them in."""
    return np.float32(scale) == np.float32(required[0]) and zero_point == required[1]
_MAX_RANK = 4


def _logistic(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def _hard_swish(x: np.ndarray) -> np.ndarray:
    return x * np.clip(x + 3.0, 0.0, 6.0) / 6.0


def _float16_order_key(bits: np.ndarray) -> np.ndarray:
    """Map float16 bit patterns (as int16) to int16 keys ordered like the float values.

    Positive floats already order like their bit patterns; negative ones (sign bit set)
    order backwards, so their magnitude bits are flipped. The map is its own inverse."""
    return bits ^ ((bits >> 15) & np.int16(0x7FFF))


def _clamp_float16(x: np.ndarray, low: float, high: float) -> np.ndarray:
    """Clamp a float16 array to [low, high] on integer keys: numpy's float16 arithmetic
    converts element by element and is an order of magnitude slower."""
    bits = x.view(np.int16)
    keys = _float16_order_key(bits)
    low_key = _float16_order_key(np.array(low, np.float16).view(np.int16))
    keys = np.maximum(keys, low_key)
    if np.isfinite(high):
        keys = np.minimum(keys, _float16_order_key(np.array(high, np.float16).view(np.int16)))
    result = _float16_order_key(keys).view(np.float16)
    # NaN goes to the lower bound, as the C++ min(max(low, x), high) sends it.
    nan = (bits & np.int16(0x7FFF)) > np.int16(0x7C00)
    if nan.any():
        result[nan] = low
    return result


_SMOOTH_FUNCTIONS = {Op.LOGISTIC: _logistic, Op.TANH: np.tanh, Op.HARD_SWISH: _hard_swish}


def hard_swish_fixed_point(stored: np.ndarray, source: Tensor | Any, output: Tensor | Any) -> np.ndarray | None:
    """Quantized HARD_SWISH as Android's and TFLite's int16 fixed-point kernel: x - zero
    point on a scale 2**-7 finer (exact in int16); the output's multiplier and the factor's
    (that scale over 3 / 2**15) as Q15 mantissas; the factor relu6(x + 3) / 6 is the
    input on the 3 / 2**15 scale (shifted left by its exponent, saturating, or divided by
    a power of two, rounding), saturated to [-1, 1) and mapped to [0, 1); times the input on
    the output's scale (truncating doubling high multiply), divided by the output's power
    of two (rounding, int16 mask), plus the zero point, clamped to the type. int64 results;
    None where that kernel refuses the scales (output multiplier exponent > 0)."""
    hires = np.float32(1.0 / 128.0) * np.float32(source.scale)
    out_multiplier, out_exponent = int16_multiplier(float(np.float32(hires / np.float32(output.scale))))
    if out_exponent > 0:
        return None
    factor_multiplier, factor_exponent = int16_multiplier(float(np.float32(hires / np.float32(3.0 / 32768.0))))
    x = (np.asarray(stored, np.int64) - source.zero_point) * 128
    on_output_scale = rounding_doubling_high_multiply16(x, out_multiplier)
    factor = x
    if factor_exponent > 0:
        factor = np.clip(factor << (factor_exponent - 1), -32768, 32767)
    factor = rounding_doubling_high_multiply16(factor, factor_multiplier)
    if factor_exponent > 0:
        factor = np.clip(factor << 1, -32768, 32767)
    elif factor_exponent < 0:
        factor = rounding_divide_by_pot16(factor, -factor_exponent)
    factor = (factor + (1 << 15)) >> 1
    product = factor * on_output_scale  # a doubling high multiply that truncates (C division)
    product = np.where(product >= 0, product >> 15, -((-product) >> 15))
    info = np.iinfo(dtype_of(output.type))
    return np.clip(rounding_divide_by_pot16(product, -out_exponent) + output.zero_point, info.min, info.max)


def _logistic_in_place(x: np.ndarray) -> np.ndarray:
    """``_logistic`` on float32 with one temporary: the same operations in the same order."""
    result = np.negative(x)
    np.exp(result, out=result)
    np.add(result, np.float32(1), out=result)
    return np.divide(np.float32(1), result, out=result)


def _compiled_logistic():
    """The compiled float32 LOGISTIC (nnapi[fast]: ``_numba_kernels.logistic``, numpy's own
    exp inside, so ``_logistic_in_place``'s values) as a function of an array, or None."""
    compiled, addresses = _jit.kernels(), natives()
    if compiled is None or addresses is None:
        return None
    table, logistic = addresses.as_array(), compiled.logistic

    def run(x: np.ndarray) -> np.ndarray:
        x = _jit.kernel_input(x)
        out = np.empty_like(x)
        logistic(x.reshape(-1), out.reshape(-1), table)
        return out

    probe = np.zeros(0, np.float32)
    return run if _jit.warm_up(logistic, probe, probe.copy(), table) else None


def _compiled_hard_swish():
    """The compiled HARD_SWISH (nnapi[fast]) as a function of a float32 array, or None."""
    if _jit.kernels() is None:
        return None
    from nnapi.operations._numba_activations import hard_swish

    def run(x: np.ndarray) -> np.ndarray:
        x = _jit.kernel_input(x)
        out = np.empty_like(x)
        hard_swish(x.reshape(-1), out.reshape(-1))
        return out

    probe = np.zeros(0, np.float32)
    return run if _jit.warm_up(hard_swish, probe, probe.copy()) else None



@register(Op.RELU, Op.RELU1, Op.RELU6, Op.LOGISTIC, Op.TANH, Op.HARD_SWISH, zero_sized_inputs=True)
class Activation(Operation):
    """The one-input activations: a tensor in, a tensor of the same type and shape out."""

    def validate(self, ctx: ValidationContext) -> None:
        ctx.check_counts(inputs=1, outputs=1)
        ctx.check_input_type(INPUT, _ALL_TYPES)
        ctx.check_output_type(0, ctx.input_type(INPUT))
        if self.code != Op.HARD_SWISH:
            ctx.check_input_max_rank(INPUT, _MAX_RANK)
        check_same_shape_output(ctx)
        code = ctx.input_type(INPUT)
        if code not in QUANT8_TENSORS:
            return
        output = ctx.outputs[0]
        if self.code in _RELU_FUSE:
            scale, zero_point = ctx.inputs[INPUT].scale, ctx.inputs[INPUT].zero_point
            required = "the input's scale and zero point"
        elif self.code in FIXED_OUTPUT_QUANT:
            scale, zero_point = FIXED_OUTPUT_QUANT[self.code][code]
            required = f"scale 1/{round(1 / scale)} and zero point {zero_point}"
        else:
            return  # HARD_SWISH may requantize freely
        if not has_quantization(output.scale, output.zero_point, (scale, zero_point)):
            ctx.fail(f"output 0 ({code.name}) must have {required}, got scale {output.scale} and "
                     f"zero point {output.zero_point}")

    def prepare(self, ctx: ExecutionContext) -> list[Shape]:
        shape = ctx.input(INPUT).shape
        if self.code != Op.HARD_SWISH:
            ctx.require(len(shape) <= _MAX_RANK, f"input 0 must have rank at most {_MAX_RANK}, got {len(shape)}")
        return [shape]

    def execute(self, ctx: ExecutionContext) -> list[np.ndarray]:
        tensor = ctx.input(INPUT)
        output = ctx.output(0)
        dtype = ctx.output_dtype(0)
        if self.code in _RELU_FUSE:
            fuse = _RELU_FUSE[self.code]
            if tensor.type in QUANT8_TENSORS:
                low, high = activation_bounds_quantized(fuse, tensor)
                return [np.clip(tensor.value, low, high).astype(dtype, copy=False)]
            low, high = activation_bounds_float(fuse)
            if tensor.type == T.TENSOR_FLOAT16:
                return [_clamp_float16(tensor.value, low, high)]
            result = np.clip(tensor.value, dtype.type(low), dtype.type(high))
            # NaN goes to the lower bound, as the C++ min(max(low, x), high) sends it.
            nan = np.isnan(result)
            if nan.any():
                result[nan] = low
            return [result]
        function = _SMOOTH_FUNCTIONS[self.code]
        with np.errstate(over="ignore", invalid="ignore"):
            if tensor.type in QUANT8_TENSORS:
                def on_stored(stored: np.ndarray) -> np.ndarray:
                    if self.code == Op.HARD_SWISH:
                        fixed = hard_swish_fixed_point(stored, tensor, output)
                        if fixed is not None:
                            return fixed.astype(dtype)
                    real = function(dequantize(stored, tensor.scale, tensor.zero_point))
                    return quantize_with_activation(real, output, FuseCode.FUSED_NONE)

                return [map_quant8(tensor.value, on_stored)]
            return [function(float_input(tensor)).astype(dtype, copy=False)]

    def plan(self, ctx: ExecutionContext):
        """Quantized inputs: the whole function as a 256-entry table built once; float32
        ReLUs as fmax / fmin (NaN to the lower bound, as ``execute``)."""
        tensor = ctx.input(INPUT)
        if tensor.type in QUANT8_TENSORS:
            values = all_stored_values(dtype_of(tensor.type))
            probe = Tensor(tensor.type, values.shape, tensor.scale, tensor.zero_point, None, values)
            table = self.execute(ExecutionContext(self.code, [probe], ctx.outputs))[0]
            lookup = prepared_quant8(table)
            return lambda inputs: [lookup(inputs[INPUT])]
        if tensor.type != T.TENSOR_FLOAT32:
            return None
        if self.code not in _RELU_FUSE:
            function = _SMOOTH_FUNCTIONS[self.code]
            if self.code == Op.LOGISTIC:
                function = _compiled_logistic() or _logistic_in_place
            elif self.code == Op.HARD_SWISH:
                function = _compiled_hard_swish() or function
            return lambda inputs: [function(inputs[INPUT])]
        low, high = (np.float32(bound) for bound in activation_bounds_float(_RELU_FUSE[self.code]))

        def relu(inputs: list) -> list[np.ndarray]:
            result = np.fmax(inputs[INPUT], low)  # fmax: NaN becomes the lower bound
            if high != np.inf:
                np.fmin(result, high, out=result)
            return [result]

        return relu


@register(Op.ELU, zero_sized_inputs=True)
class Elu(Operation):
    """ELU(x) = max(0, x) + min(0, alpha * (exp(x) - 1)); input 1 is the scalar alpha."""

    def validate(self, ctx: ValidationContext) -> None:
        ctx.check_counts(inputs=2, outputs=1)
        ctx.check_input_type(INPUT, FLOAT_TENSORS)
        ctx.check_input_type(ELU_ALPHA, SCALAR_FOR_TENSOR[ctx.input_type(INPUT)])
        ctx.check_output_type(0, ctx.input_type(INPUT))
        check_same_shape_output(ctx)

    def prepare(self, ctx: ExecutionContext) -> list[Shape]:
        return [ctx.input(INPUT).shape]

    def execute(self, ctx: ExecutionContext) -> list[np.ndarray]:
        x = float_input(ctx.input(INPUT))
        alpha = np.float32(ctx.scalar(ELU_ALPHA))
        with np.errstate(over="ignore", invalid="ignore"):
            result = np.maximum(x, np.float32(0)) + np.minimum(np.float32(0), alpha * np.expm1(x))
        return [result.astype(ctx.output_dtype(0), copy=False)]

    def plan(self, ctx: ExecutionContext):
        """Float32: alpha resolved once; ``execute``'s operations."""
        if ctx.input(INPUT).type != T.TENSOR_FLOAT32:
            return None
        alpha, zero = np.float32(ctx.scalar(ELU_ALPHA)), np.float32(0)
        return lambda values: [np.maximum(values[INPUT], zero) + np.minimum(zero, alpha * np.expm1(values[INPUT]))]


@register(Op.PRELU)
class PRelu(Operation):
    """f(x) = x for x >= 0, alpha * x otherwise; alpha (input 1) broadcasts against x."""

    def validate(self, ctx: ValidationContext) -> None:
        ctx.check_counts(inputs=2, outputs=1)
        ctx.check_input_type(INPUT, _ALL_TYPES)
        ctx.check_input_type(PRELU_ALPHA, ctx.input_type(INPUT))
        ctx.check_output_type(0, ctx.input_type(INPUT))
        check_broadcast(ctx)

    def prepare(self, ctx: ExecutionContext) -> list[Shape]:
        return [broadcast_output_shape(ctx)]

    @staticmethod
    def _on_stored(ctx: ExecutionContext):
        """The quantized PRELU on stored values (x, alpha), in Android's fixed point
        (quant_math.prelu_fixed_point) for this context's quantizations."""
        x, alpha, output = ctx.input(INPUT), ctx.input(PRELU_ALPHA), ctx.output(0)
        info = np.iinfo(ctx.output_dtype(0))

        def on_stored(stored_x: np.ndarray, stored_alpha: np.ndarray) -> np.ndarray:
            result = prelu_fixed_point(np.subtract(stored_x, x.zero_point, dtype=np.int64),
                                       np.subtract(stored_alpha, alpha.zero_point, dtype=np.int64),
                                       x.scale, alpha.scale, output.scale, output.zero_point, info.min, info.max)
            return result.astype(info.dtype)

        return on_stored

    def execute(self, ctx: ExecutionContext) -> list[np.ndarray]:
        x, alpha = ctx.input(INPUT), ctx.input(PRELU_ALPHA)
        if x.type in QUANT8_TENSORS:
            return [map_quant8_pair(x.value, alpha.value, self._on_stored(ctx))]
        a, b = float_input(x), float_input(alpha)
        with np.errstate(over="ignore", invalid="ignore"):
            result = select_by_bits(a >= 0, a, a * b)
        return [result.astype(ctx.output_dtype(0), copy=False)]

    def plan(self, ctx: ExecutionContext):
        """Float32 with a constant alpha: the compiled one-pass kernel (``nnapi[fast]``);
        without it two or four full passes (``_prelu_by_maximum``) where numpy's maximum is
        known to keep its second argument on ties; otherwise one multiply by a slope that
        is 1 where x >= 0 (x * 1 is x, NaN included) and alpha elsewhere. Quantized inputs:
        the table of every (x, alpha) pair of stored values, made once here."""
        x, alpha = ctx.input(INPUT), ctx.input(PRELU_ALPHA)
        if x.type in QUANT8_TENSORS:
            return prepared_quant8_pair(self._on_stored(ctx), dtype_of(x.type), dtype_of(alpha.type), x.shape,
                                        alpha.shape)
        if x.type != T.TENSOR_FLOAT32 or not isinstance(alpha.value, np.ndarray):
            return None
        slope_alpha = np.asarray(alpha.value, dtype=np.float32)
        # the compiled loop is vectorized (compare, multiply, blend in one pass): 128x128x8
        # 0.013 ms against 0.06-0.15 for numpy's two or four passes
        compiled = _compiled_prelu(slope_alpha, x.shape)
        if compiled is not None:
            return compiled
        fast = _prelu_by_maximum(slope_alpha, x.shape)
        if fast is not None:
            return fast
        one = np.float32(1)

        def prelu(inputs: list) -> list[np.ndarray]:
            value = inputs[INPUT]
            return [value * np.where(value >= 0, one, slope_alpha)]

        return prelu


def _compiled_prelu(alpha: np.ndarray, shape: Shape):
    """The compiled one-pass PRELU (``nnapi[fast]``), or None (numba absent or disabled,
    alpha not broadcasting to the input): the slopes materialized once over the input's
    trailing axes from the first along which they vary (at least a row long, as
    ``tile_trailing`` makes them), so that the flat input repeats them with that period."""
    compiled = _jit.kernels()
    if compiled is None or not shape or alpha.ndim > len(shape) or \
            np.broadcast_shapes(alpha.shape, shape) != tuple(shape):
        return None
    tiled = tile_trailing(alpha, shape)
    full = tiled.reshape((1,) * (len(shape) - tiled.ndim) + tiled.shape)
    leading = 0
    while leading < len(shape) and full.shape[leading] == 1:
        leading += 1
    slopes = _jit.constant(np.broadcast_to(full[(0,) * leading], shape[leading:]).reshape(-1), np.float32)
    if not slopes.size or not _jit.warm_up(compiled.prelu_float, np.zeros(0, np.float32), slopes,
                                           np.empty(0, np.float32)):
        return None
    kernel = compiled.prelu_float

    def prelu(inputs: list) -> list[np.ndarray]:
        value = _jit.kernel_input(inputs[INPUT])
        out = np.empty(value.shape, np.float32)
        kernel(value.reshape(-1), slopes, out.reshape(-1))
        return [out]

    return prelu


def _maximum_keeps_second_on_ties() -> bool:
    """Whether ``np.maximum(a, b)`` returns ``b`` where a == b (+0 against -0), in its
    vector loops and their scalar tails alike: IEEE leaves it open and numpy does not
    document it, so it is probed once rather than assumed."""
    for length in (1, 3, 4, 7, 8, 15, 16, 17, 31, 33, 64, 67, 130):
        for zero in (0.0, -0.0):
            first = np.full(length, zero, np.float32)
            second = np.full(length, -zero, np.float32)
            if not np.array_equal(np.signbit(np.maximum(first, second)), np.signbit(second)):
                return False
            strided = np.maximum(np.repeat(first, 2)[::2], np.repeat(second, 2)[::2])
            if not np.array_equal(np.signbit(strided), np.signbit(second)):
                return False
    return True


_MAXIMUM_KEEPS_SECOND = _maximum_keeps_second_on_ties()


def _prelu_by_maximum(alpha: np.ndarray, shape: Shape):
    """PRELU as max(alpha * x, x), which equals x >= 0 ? x : alpha * x bit for bit when
    alpha <= 1 (rounding is monotonic, so alpha * x <= x exactly where x >= 0 and >= x
    where x < 0), +0 and -0 included because the tie keeps x. Channels with alpha > 1
    are mirrored: -max(-alpha * x, -x), negation being exact. Two passes (four with
    mirrored channels) instead of a compare, a broadcast select and a multiply, which
    are several times slower. None (use the slope form) where the identity fails:
    alpha 0 or not finite (0 * inf and inf * 0 are NaN where x >= 0 must give x), or a
    numpy whose maximum does not keep its second argument on ties. The constants are
    tiled over the input's trailing axes (``tile_trailing``)."""
    if not _MAXIMUM_KEEPS_SECOND or alpha.size == 0 or not np.isfinite(alpha).all() or (alpha == 0).any():
        return None
    alpha = tile_trailing(alpha, shape)
    mirrored = alpha > 1
    if not mirrored.any():
        def prelu(inputs: list) -> list[np.ndarray]:
            value = inputs[INPUT]
            result = np.multiply(value, alpha)
            return [np.maximum(result, value, out=result)]

        return prelu
    sign = np.where(mirrored, np.float32(-1), np.float32(1)).astype(np.float32)
    signed_alpha = (sign * alpha).astype(np.float32)  # exact: a sign change

    def mirrored_prelu(inputs: list) -> list[np.ndarray]:
        value = inputs[INPUT]
        result = np.multiply(value, signed_alpha)
        np.maximum(result, value * sign, out=result)
        return [np.multiply(result, sign, out=result)]

    return mirrored_prelu
