"""An 8-bit PRELU of one positive alpha (TFLite's int8 / uint8 LEAKY_RELU, which the importer
writes as PRELU with a slope of one step) as one or two com.microsoft QLinearLeakyRelu: ORT's
256-entry table of the float values, whose parameters are searched so that the tables give
the reference's fixed point (Android's two quantized multipliers) bit for bit.

ORT builds a QLinearLeakyRelu's table in float32: d = X_scale * (u - X_zero_point), d or
alpha * d below 0, then d / Y_scale rounded to nearest even, clamped, plus Y_zero_point. With
X_scale 1 the offset is exact, so alpha and Y_scale carry the two slopes, and any float32 of
them may be taken, not only the model's: the search tries those within a few thousand ulps
of each ideal slope in a numpy copy of that arithmetic (``_table``) and keeps the middle of
the longest run that gives every wanted value; the form is then proven by running it in
ONNX Runtime on all 256 stored values (uniform_prelu.py), never taken on the copy's word.

One table gives Android's values where each side rounds once. Where a multiplier's exponent
e is negative, Android rounds twice: the doubling high multiply rounds x * alpha * m / 2**31
to an integer v, then a shift by -e rounds v / 2**-e, halves away from zero; a product whose
fraction lies in [1/2 - 2**(e-1), 1/2) rounds up where one rounding does not (YOLO's LEAKY_RELU
0.1 at exponent -2: 13-17 of the 128 negative values, too many for proven_or_table's Where
corrections, so each ran as a Gather). Two tables then give it exactly: the first computes v
(x itself on a side that rounds once), which |m / 2**31| < 1 keeps within the input's range
for an alpha of one step, the second v * 2**e rounded as the shift rounds (a slope a few ulps
above the power of two turns the halves away from zero) or the whole single rounding.

A QLinearLeakyRelu runs ~10x faster than the Gather (the reference's table at int32 indices,
Cast included): [1, 96, 96, 16] uint8, one thread, 40 us for one table, 78 for two, 414 for
the Gather (load ~2); yolo_tiny_int8's 8 LEAKY_RELU took 422 of the 730 us its nodes' medians
sum to in ORT's profile. Where neither form is exact (alphas of many steps, whose products
leave the intermediate's range) one table missing at most proven_or_table's number of values
is set right by Where corrections; elsewhere uniform_prelu.py keeps its own forms.
"""

from __future__ import annotations

import numpy as np

from nnapi.drivers.ort.builder import MS_DOMAIN, GraphBuilder
from nnapi.operations.quant_math import prelu_multipliers, rounding_doubling_high_multiply

f32 = np.float32

#: the widths (in float32 ulps either side of an ideal slope) searched, narrowest first
_SPANS = (64, 4096)

#: one table's parameters: (alpha, Y_scale, X_zero_point, Y_zero_point); X_scale is 1
Table = tuple[float, float, int, int]


def leaky_tables(table: np.ndarray, input_zero_point: int, output_zero_point: int, alpha_step: int,
                 input_scale: float, alpha_scale: float, output_scale: float,
                 corrections: int = 0) -> tuple[list[Table], np.ndarray] | None:
    """The QLinearLeakyRelu tables (applied in order) whose float arithmetic, as ORT computes
    it, gives ``table`` (the reference's 8-bit PRELU of each internal stored value, uint8; its
    quantizations: internal zero points, the alpha's stored value minus its zero point
    ``alpha_step``, the three scales), and the internal values on which they still miss (at
    most ``corrections``; for the caller's Where corrections). None where no table found
    does, or ``alpha_step`` <= 0 (a negative product would take the second table's positive
    side)."""
    if alpha_step <= 0:
        return None
    stored = np.arange(256, dtype=np.int64)
    wanted = np.asarray(table, dtype=np.int64).reshape(-1)
    (m_pos, e_pos), (m_neg, e_neg) = prelu_multipliers(input_scale, alpha_scale, output_scale)
    slope_pos = m_pos * 2.0 ** (e_pos - 31)
    slope_neg = alpha_step * m_neg * 2.0 ** (e_neg - 31)
    single = _fit(stored, wanted, input_zero_point, output_zero_point, slope_pos, slope_neg, _SPANS[:1])
    if single is not None:
        return [single], np.zeros(0, np.int64)
    two = _two_tables(stored, wanted, input_zero_point, output_zero_point, alpha_step, m_pos, e_pos, m_neg, e_neg)
    if two is not None:
        return two, np.zeros(0, np.int64)
    single = _fit(stored, wanted, input_zero_point, output_zero_point, slope_pos, slope_neg, _SPANS[1:])
    if single is not None:
        return [single], np.zeros(0, np.int64)
    if corrections <= 0:
        return None
    nearest = _fewest_misses(stored, wanted, input_zero_point, output_zero_point, slope_pos, slope_neg)
    misses = np.flatnonzero(apply_tables([nearest], stored) != wanted)
    return ([nearest], misses) if misses.size <= corrections else None


def apply_tables(tables: list[Table], stored: np.ndarray) -> np.ndarray:
    """``stored`` (internal uint8 values) through ``tables`` as ORT computes them (int64)."""
    values = np.asarray(stored, dtype=np.int64)
    for alpha, scale, zero_point, output_zero_point in tables:
        values = _table(values, zero_point, alpha, scale, output_zero_point)
    return values


def emit_tables(g: GraphBuilder, name: str, tables: list[Table]) -> str:
    """``name`` (internal uint8) through one QLinearLeakyRelu per table."""
    one = g.constant(np.array(1.0, np.float32), "scale")
    for alpha, scale, zero_point, output_zero_point in tables:
        name = g.one("QLinearLeakyRelu", [name, one, g.constant(np.array(zero_point, np.uint8), "zp"),
                                          g.constant(np.array(scale, np.float32), "scale"),
                                          g.constant(np.array(output_zero_point, np.uint8), "zp")],
                     domain=MS_DOMAIN, alpha=float(alpha))
    return name


def _table(stored: np.ndarray, zero_point: int, alpha, scale, output_zero_point: int) -> np.ndarray:
    """ORT's QLinearLeakyRelu table (X_scale 1) at ``stored``, in float32 as it builds it:
    alpha * d below 0, d / Y_scale clamped to the output's range, rounded to nearest even,
    plus the zero point. ``alpha`` / ``scale`` may be columns of candidates (one row each)."""
    dequantized = (np.asarray(stored, dtype=np.int64) - zero_point).astype(f32)
    alpha, scale = np.asarray(alpha, f32), np.asarray(scale, f32)
    y = np.where(dequantized >= 0, dequantized, alpha * dequantized).astype(f32)
    quotient = np.clip((y / scale).astype(f32), f32(-output_zero_point), f32(255 - output_zero_point))
    return np.rint(quotient).astype(np.int64) + output_zero_point


def _around(center: float, span: int) -> np.ndarray:
    """The float32 values within ``span`` ulps of ``center`` (ascending, for positive ones)."""
    bits = np.array(center, f32).view(np.int32) + np.arange(-span, span + 1, dtype=np.int32)
    return bits.view(f32)


def _middle(candidates: np.ndarray, passing: np.ndarray) -> np.float32 | None:
    """The candidate in the middle of the longest run of passing ones (the farthest from
    where the arithmetic starts to round otherwise), or None."""
    if not passing.any():
        return None
    edges = np.diff(np.concatenate(([0], passing.astype(np.int8), [0])))
    starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    k = int(np.argmax(ends - starts))
    return f32(candidates[(starts[k] + ends[k] - 1) // 2])


def _fit(stored: np.ndarray, wanted: np.ndarray, zero_point: int, output_zero_point: int,
         slope_pos: float, slope_neg: float, spans: tuple[int, ...]) -> Table | None:
    """A table giving ``wanted`` at every ``stored``: Y_scale from those at or above the zero
    point (1 / slope_pos, searched), then alpha from those below (slope_neg * Y_scale)."""
    positive = stored >= zero_point
    for span in spans:
        scales = _around(f32(1.0) / f32(slope_pos), span)
        passing = np.all(_table(stored[positive], zero_point, 1.0, scales[:, None], output_zero_point)
                         == wanted[positive], axis=1)
        scale = _middle(scales, passing)
        if scale is None:
            continue
        if positive.all():
            return 1.0, float(scale), zero_point, output_zero_point
        alphas = _around(f32(slope_neg) * scale, span)
        passing = np.all(_table(stored[~positive], zero_point, alphas[:, None], scale, output_zero_point)
                         == wanted[~positive], axis=1)
        alpha = _middle(alphas, passing)
        if alpha is not None:
            return float(alpha), float(scale), zero_point, output_zero_point
    return None


def _fewest_misses(stored: np.ndarray, wanted: np.ndarray, zero_point: int, output_zero_point: int,
                   slope_pos: float, slope_neg: float) -> Table:
    """The table (searched as ``_fit`` over the widest span) missing the fewest values."""
    positive = stored >= zero_point
    scales = _around(f32(1.0) / f32(slope_pos), _SPANS[-1])
    wrong = np.sum(_table(stored[positive], zero_point, 1.0, scales[:, None], output_zero_point)
                   != wanted[positive], axis=1)
    scale = _middle(scales, wrong == wrong.min())
    alphas = _around(f32(slope_neg) * scale, _SPANS[-1])
    wrong = np.sum(_table(stored[~positive], zero_point, alphas[:, None], scale, output_zero_point)
                   != wanted[~positive], axis=1)
    return float(_middle(alphas, wrong == wrong.min())), float(scale), zero_point, output_zero_point


def _two_tables(stored: np.ndarray, wanted: np.ndarray, zero_point: int, output_zero_point: int, alpha_step: int,
                m_pos: int, e_pos: int, m_neg: int, e_neg: int) -> list[Table] | None:
    """The first table computing Android's high multiply v on each side whose exponent is
    negative (x elsewhere), the second v's rounding shift or single rescale; None where the
    intermediate values do not fit 8 bits or no table gives them."""
    if e_pos >= 0 and e_neg >= 0:
        return None  # both round once: one table or none
    x = stored - zero_point
    v = np.where(x >= 0, rounding_doubling_high_multiply(x, m_pos) if e_pos < 0 else x,
                 rounding_doubling_high_multiply(x * alpha_step, m_neg) if e_neg < 0 else x)
    # the intermediate's range: values beyond the first (last) change of the result may clamp
    order = np.argsort(v, kind="stable")
    ordered, results = v[order], wanted[order]
    low, high = int(ordered[0]), int(ordered[-1])
    differs = ordered[results != results[0]]
    if differs.size:
        low = max(low, int(differs.min()) - 1)
    differs = ordered[results != results[-1]]
    if differs.size:
        high = min(high, int(differs.max()) + 1)
    if max(-low, 0) > min(255 - high, 255):
        return None
    middle = int(np.clip(zero_point, max(-low, 0), min(255 - high, 255)))
    first = _fit(stored, np.clip(v, -middle, 255 - middle) + middle, zero_point, middle,
                 m_pos * 2.0 ** -31 if e_pos < 0 else 1.0,
                 alpha_step * m_neg * 2.0 ** -31 if e_neg < 0 else 1.0, _SPANS)
    if first is None:
        return None
    intermediate = apply_tables([first], stored)
    values, index, inverse = np.unique(intermediate, return_index=True, return_inverse=True)
    if not np.array_equal(wanted[index][inverse.reshape(-1)], wanted):
        return None  # two stored values of one intermediate value want different results
    second = _fit(values, wanted[index], middle, output_zero_point,
                  2.0 ** e_pos if e_pos < 0 else m_pos * 2.0 ** (e_pos - 31),
                  2.0 ** e_neg if e_neg < 0 else alpha_step * m_neg * 2.0 ** (e_neg - 31), _SPANS)
    return None if second is None else [first, second]
