"""TFLite import: RFFT2D and the complex tensors it makes (COMPLEX_ABS, REAL, IMAG).
"""

from __future__ import annotations

import numpy as np

from nnapi.codes import OperandCode as T
from nnapi.codes import OperationCode
from nnapi.codes import OperationCode as Op
from nnapi.importers.tflite.converter import _Converter, _converter
from nnapi.importers.tflite.reader import UnsupportedOperator, _operand_shape, _Operator
from nnapi.operand import OperandType


@_converter("RFFT2D")
def _rfft2d(c: _Converter, op: _Operator) -> None:
    """RFFT2D over the last axis only (fft_length [1, n], as tf.signal.stft writes it; the
    axis before it of size 1): the real and imaginary parts of the DFT as two
    FULLY_CONNECTEDs by cos / -sin matrices (computed in float64 here, the input cropped or
    zero-padded to n by their rows), kept as the complex tensor's parts for COMPLEX_ABS,
    REAL, IMAG and RESHAPE to read. NNAPI has no FFT and no complex type."""
    fft = c.const_values(1, "fft_length").astype(np.int64).reshape(-1)
    shape = list(_operand_shape(op.tensor(0).shape))
    if len(fft) != 2 or fft[0] != 1 or len(shape) < 2 or shape[-2] != 1 or 0 in shape or fft[1] < 1:
        raise UnsupportedOperator("RFFT2D other than a 1-D transform of the last axis (fft_length [1, n] "
                                  "on an axis of size 1) has no NNAPI sequence")
    if c.type_of(c.input(0)).type != T.TENSOR_FLOAT32:
        raise UnsupportedOperator("RFFT2D of a non-float32 input")
    n, width = int(fft[1]), shape[-1]
    bins = n // 2 + 1
    out_shape = [*shape[:-1], bins]
    declared = op.out_tensor().shape
    if len(declared) != len(out_shape) or any(0 <= d != s for d, s in zip(declared, out_shape)):
        raise UnsupportedOperator(f"RFFT2D's output is declared {list(declared)}; fft_length [1, {n}] of its "
                                  f"input gives {out_shape}")
    rows = int(np.prod(shape[:-1]))
    factors = _rfft_factors(n, width, bins)
    if factors is not None:
        parts = _rfft_factored(c, c.input(0), rows, width, n, factors, out_shape)
        c.complex_parts[op.outputs[0]] = parts
        c.lowered(f"RFFT2D (fft_length [1, {n}]) as two DFT stages of {factors[0]} and {factors[1]} points by "
                  "matrices, the twiddle factors in the second's (two BATCH_MATMULs; NNAPI has no FFT "
                  "or complex type); its complex result kept as real and imaginary parts")
        return
    samples = np.arange(min(width, n))[:, None] * np.arange(bins)[None, :] % n   # exact phase index
    angle = 2 * np.pi * samples / n
    real_w = np.zeros((bins, width), np.float64)
    imag_w = np.zeros((bins, width), np.float64)
    real_w[:, :min(width, n)] = np.cos(angle).T
    imag_w[:, :min(width, n)] = -np.sin(angle).T
    x = c.input(0)
    flat = c.temp(OperandType(T.TENSOR_FLOAT32, [rows, width]))
    c.emit(Op.RESHAPE, [x, c.vector([rows, width])], [flat])
    zero_bias = c.const_operand(np.zeros(bins, np.float32), OperandType(T.TENSOR_FLOAT32, [bins]))
    parts = []
    for weights in (real_w, imag_w):
        w = c.const_operand(weights.astype(np.float32), OperandType(T.TENSOR_FLOAT32, [bins, width]))
        flat_part = c.temp(OperandType(T.TENSOR_FLOAT32, [rows, bins]))
        c.emit(Op.FULLY_CONNECTED, [flat, w, zero_bias, c.i32(0)], [flat_part])
        part = c.temp(OperandType(T.TENSOR_FLOAT32, out_shape))
        c.emit(Op.RESHAPE, [flat_part, c.vector(out_shape)], [part])
        parts.append(part)
    c.complex_parts[op.outputs[0]] = (parts[0], parts[1])
    c.lowered(f"RFFT2D (fft_length [1, {n}]) as two FULLY_CONNECTEDs by the DFT's cos / -sin matrices "
              "(NNAPI has no FFT or complex type); its complex result kept as real and imaginary parts")


def _rfft_factors(n: int, width: int, bins: int) -> tuple[int, int] | None:
    """(n1, n2), n = n1 * n2, for an RFFT of n points in two DFT stages by matrices
    (_rfft_factored), where that takes at most a third of the multiply-adds of one DFT by
    matrices of the ``width`` samples; None otherwise (small or prime n)."""
    direct = 2 * width * bins
    best = None
    for n1 in range(2, n):
        if n % n1:
            continue
        n2 = n // n1
        cost = 2 * n * n2 + 4 * n2 * n1 * (n1 // 2 + 1)  # per row: stage 1 + stage 2
        if best is None or cost < best[0]:
            best = (cost, n1, n2)
    if best is None or 3 * best[0] > direct:
        return None
    return best[1], best[2]


def _rfft_factored(c: _Converter, x: int, rows: int, width: int, n: int, factors: tuple[int, int],
                   out_shape: list[int]) -> tuple[int, int]:
    """The real and imaginary parts of the RFFT of n = n1 * n2 points of ``x`` (``rows``
    rows of ``width`` samples, cropped or zero-padded to n) in two DFT stages (Cooley-Tukey,
    sample m = m1 + n1 * m2, bin k = k2 + n2 * k1), the samples of every row side by side
    (their axis last), so that each stage is one matrix product from the left:

    - stage 1, the n2-point DFTs over m2 of the real samples: [(re, im) k2, m2] @ [m2, (m1, row)];
    - stage 2, for each k2, the n1-point DFTs over m1 of those complex values, times the
      twiddle factors e^(-2 pi i m1 k2 / n), only the k1 up to the last bin: one constant
      matrix [(re, im) k1, (re, im) m1] per k2 (BATCH_MATMUL over k2).

    The transposes between move whole rows of values (the row axis stays last), but for the
    first and last, 2-D. About 4 n (n1 + n2) multiply-adds per row where one DFT by
    matrices takes 2 n (n + 2) (n = 2048: 10x fewer); float32 like it. The matrices are
    computed in float64, phases by exact integer indices."""
    n1, n2 = factors
    bins = n // 2 + 1
    k1s = n1 // 2 + 1  # stage 2 outputs: every bin k = k2 + n2 * k1 up to n / 2
    f32 = T.TENSOR_FLOAT32

    def step(code: OperationCode, inputs: list[int], dims: list[int]) -> int:
        out = c.temp(OperandType(f32, dims))
        c.emit(code, inputs, [out])
        return out

    def const(values: np.ndarray) -> int:
        return c.const_operand(values.astype(np.float32), OperandType(f32, list(values.shape)))

    flat = step(Op.RESHAPE, [x, c.vector([rows, width])], [rows, width])
    if width > n:
        flat = step(Op.SLICE, [flat, c.vector([0, 0]), c.vector([rows, n])], [rows, n])
    elif width < n:
        paddings = c.const_operand(np.array([[0, 0], [0, n - width]], np.int32), OperandType(T.TENSOR_INT32, [2, 2]))
        flat = step(Op.PAD, [flat, paddings], [rows, n])
    samples = step(Op.TRANSPOSE, [flat, c.vector([1, 0])], [n, rows])              # [m, row]
    grid = step(Op.RESHAPE, [samples, c.vector([n2, n1 * rows])], [n2, n1 * rows])  # [m2, (m1, row)]
    theta = 2 * np.pi * ((np.arange(n2)[:, None] * np.arange(n2)[None, :]) % n2) / n2   # [k2, m2]
    first = np.concatenate([np.cos(theta), -np.sin(theta)])                            # [(re, im) k2, m2]
    stage1 = step(Op.BATCH_MATMUL, [const(first), grid, c.boolean(False), c.boolean(False)], [2 * n2, n1 * rows])
    split = step(Op.RESHAPE, [stage1, c.vector([2, n2, n1 * rows])], [2, n2, n1 * rows])
    by_k2 = step(Op.TRANSPOSE, [split, c.vector([1, 0, 2])], [n2, 2, n1 * rows])   # [k2, (re, im), (m1, row)]
    pairs = step(Op.RESHAPE, [by_k2, c.vector([n2, 2 * n1, rows])], [n2, 2 * n1, rows])
    # (a + ib) e^(-i phi) = (a cos + b sin) + i (b cos - a sin), phi = 2 pi (m1 k1 / n1 + m1 k2 / n)
    k2, k1, m1 = np.ogrid[:n2, :k1s, :n1]
    phi = 2 * np.pi * ((m1 * (k1 * n2 + k2)) % n) / n                                  # [k2, k1, m1]
    cos, sin = np.cos(phi), np.sin(phi)
    second = np.concatenate([np.concatenate([cos, sin], axis=2),
                             np.concatenate([-sin, cos], axis=2)], axis=1)            # [k2, (re, im) k1, (re, im) m1]
    stage2 = step(Op.BATCH_MATMUL, [const(second), pairs, c.boolean(False), c.boolean(False)],
                  [n2, 2 * k1s, rows])                                                 # [k2, (re, im) k1, row]
    grouped = step(Op.RESHAPE, [stage2, c.vector([n2, 2, k1s, rows])], [n2, 2, k1s, rows])
    ordered = step(Op.TRANSPOSE, [grouped, c.vector([1, 2, 0, 3])], [2, k1s, n2, rows])  # [(re, im), k1, k2, row]
    spectrum = step(Op.RESHAPE, [ordered, c.vector([2, k1s * n2, rows])], [2, k1s * n2, rows])  # [(re, im), k, row]
    parts = []
    for which in (0, 1):
        kept = step(Op.SLICE, [spectrum, c.vector([which, 0, 0]), c.vector([1, bins, rows])], [1, bins, rows])
        by_bin = step(Op.RESHAPE, [kept, c.vector([bins, rows])], [bins, rows])
        by_row = step(Op.TRANSPOSE, [by_bin, c.vector([1, 0])], [rows, bins])
        parts.append(step(Op.RESHAPE, [by_row, c.vector(out_shape)], out_shape))
    return parts[0], parts[1]


def _complex_input(c: _Converter, op: _Operator) -> tuple[int, int]:
    parts = c.complex_parts.get(op.inputs[0])
    if parts is None:
        raise UnsupportedOperator("complex input not computed by RFFT2D (NNAPI has no complex type)")
    return parts


@_converter("COMPLEX_ABS")
def _complex_abs(c: _Converter, op: _Operator) -> None:
    real, imag = _complex_input(c, op)
    like = c.type_of(real)
    squares = [c.temp(like), c.temp(like)]
    for part, square in zip((real, imag), squares, strict=True):
        c.emit(Op.MUL, [part, part, c.i32(0)], [square])
    total = c.temp(like)
    c.emit(Op.ADD, [*squares, c.i32(0)], [total])
    c.emit(Op.SQRT, [total], [c.output()])
    c.lowered("COMPLEX_ABS of RFFT2D's parts as SQRT(re * re + im * im)")


@_converter("REAL", "IMAG")
def _complex_part(c: _Converter, op: _Operator) -> None:
    part = _complex_input(c, op)[0 if op.name == "REAL" else 1]
    c.emit(Op.RESHAPE, [part, c.vector(list(c.type_of(part).dimensions))], [c.output()])
    c.lowered(f"{op.name} of RFFT2D's result: its {'real' if op.name == 'REAL' else 'imaginary'} part")
