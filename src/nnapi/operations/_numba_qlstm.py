"""Compiled QUANTIZED_LSTM time step (the optional ``nnapi[fast]`` extra).

Imported by ``quantized_lstm`` only when ``_jit.kernels()`` says numba is in use.
``PreparedQuantizedLstm``'s numpy step is the reference: the two products stay numpy's
(exact float64 BLAS), and this kernel does everything after them element by element with
the same integer steps (the rescales: its quant_math OutputStages, as _numba_kernels
computes one; saturation to int16 after each accumulation, the gemmlowp tables, the int16
wrap-around of the cell products), so the results are equal bit for bit; tests compare
the two. The numpy step makes ~80 calls on a few hundred values per time step, which a
generated int8 conv1d + LSTM model (200 steps) pays 200 times per run. Without peephole
and layer normalization only (Keras's LSTM); those variants keep the numpy step.
"""

from __future__ import annotations

import numba
import numpy as np

from nnapi.operations._numba_cache import kernel
from nnapi.operations._numba_kernels import _round_shift_clamp, _saturated_high_mul

_jit = kernel(nogil=True, fastmath=False, boundscheck=False, error_model="numpy")
_inline = numba.njit(cache=True, nogil=True, boundscheck=False, inline="always")


@_inline
def _rescale(value, c, stage, low, high):
    """quant_math's OutputStage of one int64 value in column ``c`` as the compiled kernels
    compute it (``_numba_kernels``' saturating form: x = value + bias shifted left and
    saturated to int32, the floor form of the doubling high multiply, the rounding right
    shift, the zero point, the clamp to [``low``, ``high``]); ``stage``: the rows bias,
    multipliers, left shifts, right shifts, offsets, negatives of
    ``_jit.stage_parameters``."""
    high_mul = _saturated_high_mul(value, c, stage[0], stage[2], stage[1])
    return _round_shift_clamp(high_mul, c, stage[3], stage[4], stage[5], low, high)


@_inline
def _round_shift(value, exponent):
    """rounding_divide_by_pot for one exponent > 0 (halves away from zero)."""
    if value < 0:
        value -= 1
    return (value + (1 << (exponent - 1))) >> exponent


@_inline
def _wrap16(value):
    """int16 two's-complement wrap-around of an int64."""
    return ((value + 32768) & 65535) - 32768


@_jit
def qlstm_step(input_products, recurrent_products, input_stage, input_low, input_high, recurrent_stage,
               recurrent_low, recurrent_high, offsets, previous_cell, logistic, tanh, cell_tanh, cell_shift,
               cell_limit, hidden_stage, hidden_low, hidden_high, gates, cell_out, hidden_out):
    """One QUANTIZED_LSTM step after its products. ``input_products`` / ``recurrent_products``
    (float64 [batch, gates * units], exact integers: x . W' and h . R' of the stored
    values), ``input_stage`` / ``recurrent_stage`` (``_rescale``'s rows of their output
    stages, one column each: the gate biases and the zero points' column sums, the
    multipliers and shifts) with their clamp ranges (int16; int64's: none),
    ``offsets`` (the forget, cell, input (-1: CIFG, i = 1 - f) and output gates' first
    column), ``previous_cell`` (int16 [batch, units]), the Q3.12 logistic and tanh tables
    and the cell state's tanh table (int64, indexed by value + 32768), ``cell_shift`` (log2
    of the cell scale), ``cell_limit`` (0: no clip), the hidden state's output stage (its
    zero point negated) and range (int8). Writes the saturated gates into ``gates`` (int64
    scratch [batch, columns]), the new cell state into ``cell_out`` (int16) and the hidden
    state's int8 values (v - zero point, clamped) into ``hidden_out`` (int64)."""
    batch, columns = gates.shape
    units = previous_cell.shape[1]
    forget, cell, input_gate, output = offsets[0], offsets[1], offsets[2], offsets[3]
    for b in range(batch):
        for j in range(columns):
            g = _rescale(np.int64(input_products[b, j]), j, input_stage, input_low, input_high)
            g += _rescale(np.int64(recurrent_products[b, j]), j, recurrent_stage, recurrent_low, recurrent_high)
            gates[b, j] = min(max(g, -32768), 32767)
        for u in range(units):
            previous = np.int64(previous_cell[b, u])
            f = logistic[gates[b, forget + u] + 32768]
            m = tanh[gates[b, cell + u] + 32768]
            i = 32767 - f if input_gate < 0 else logistic[gates[b, input_gate + u] + 32768]
            kept = _wrap16(_round_shift(f * previous, 15))
            added = _wrap16(_round_shift(i * m, 30 + cell_shift))
            new = min(max(kept + added, -32768), 32767)
            if cell_limit > 0:
                new = min(max(new, -cell_limit), cell_limit)
            o = logistic[gates[b, output + u] + 32768]
            hidden_out[b, u] = _rescale(o * cell_tanh[new + 32768], 0, hidden_stage, hidden_low, hidden_high)
            cell_out[b, u] = new


@_inline
def _exact_products(rows, weights, out):
    """out = rows . weights for stored integer ``rows`` [batch, size] and integer-valued
    float64 ``weights`` [size, columns]: every product and partial sum is an integer below
    2^53, so exact in any order, the same values as numpy's float64 BLAS product."""
    batch, size = rows.shape
    columns = weights.shape[1]
    for b in range(batch):
        for j in range(columns):
            out[b, j] = 0.0
        for k in range(size):
            value = np.float64(rows[b, k])
            if value != 0.0:
                for j in range(columns):
                    out[b, j] += value * weights[k, j]


@_jit
def qlstm_step_with_products(x, h, input_weights, recurrent_weights, input_products, recurrent_products, input_stage,
                             input_low, input_high, recurrent_stage, recurrent_low, recurrent_high, offsets,
                             previous_cell, logistic, tanh, cell_tanh, cell_shift, cell_limit, hidden_stage,
                             hidden_low, hidden_high, gates, cell_out, hidden_out):
    """``qlstm_step`` with its two products done here (``_exact_products`` of the stored
    input ``x`` and previous output ``h``, into the float64 scratch ``input_products`` /
    ``recurrent_products``): a whole time step in one call."""
    _exact_products(x, input_weights, input_products)
    _exact_products(h, recurrent_weights, recurrent_products)
    qlstm_step(input_products, recurrent_products, input_stage, input_low, input_high, recurrent_stage,
               recurrent_low, recurrent_high, offsets, previous_cell, logistic, tanh, cell_tanh, cell_shift,
               cell_limit, hidden_stage, hidden_low, hidden_high, gates, cell_out, hidden_out)
