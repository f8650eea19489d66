"""Quantized convolution as an integer matrix product on AVX-512 or AVX2 (``nnapi[fast]``):
the 8-bit products of CONV_2D summed exactly in int32 by the processor's 16-bit
multiply-add instructions, with no float conversion of the input.

Imported only through ``nnapi.operations._jit.integer_forms()``, which offers the forms
(``Form``) this processor runs, widest first: ``AVX512`` where its features include
AVX-512 F and BW (``vpmaddwd`` on 512-bit registers, panels of 32 output channels),
``AVX2`` where they include AVX2 (``vpmaddwd`` on 256-bit registers, panels of 16); with
VNNI (AVX-512 VNNI, AVX-VNNI) the compiler fuses the multiply-add with the addition into
``vpdpwssd``. Two 16-bit products summed in one 32-bit lane per instruction: 32 (16) per
instruction, twice the products of a float32 fused multiply-add of the same width (what
BLAS's kernels, which the quantized path otherwise runs, do), and exact by construction (|x -
zero_point| <= 255 and |w - zero_point| <= 255 in 16 bits; the caller bounds every sum
below 2**31).

The product (``conv_quantized``, one per form): output pixels in tiles of up to
``TILE_ROWS``; each tile's im2col rows are gathered from the stored 8-bit input into
int16 scratch (taps in the padding are zeros: the zero point less itself), multiplied by
every panel of output channels (``pack_filter``: the filter as int16 pairs of
consecutive summed values, panel by panel, laid out at preparation), and the tile's
int32 sums go through the shared output stage (``_numba_kernels._finish``) straight into
the output. The micro-kernel (``_tile``, one intrinsic for every register width) keeps a
tile's 2 x rows accumulators in registers over the whole summed axis; it is written in
LLVM IR (numba's intrinsics), since a loop in Python form does not vectorize this way.
A form's function is compiled at its first call only, so a processor without AVX-512
never compiles the AVX-512 form.

The numpy path (int16 or float products, ``quant_math``'s output stage) is the
reference; tests compare each form with it bit for bit.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba.core import cgutils
from numba.core import types as nbtypes
from numba.extending import intrinsic

from nnapi.operations._numba_cache import kernel
from nnapi.operations._numba_kernels import _finish

#: output pixels of one tile: 2 x 6 accumulator registers, 2 filter loads and 1 broadcast,
#: 15 of the 16 registers AVX2 has
TILE_ROWS = 6

_jit = kernel(nogil=True, fastmath=False, boundscheck=False)
_I16, _I32, _I64 = ir.IntType(16), ir.IntType(32), ir.IntType(64)
#: the multiply-add of each vector width (int32 lanes per register): int16 pairs summed
#: into one int32 lane each
_MADD = {16: "llvm.x86.avx512.pmaddw.d.512", 8: "llvm.x86.avx2.pmadd.wd"}


@intrinsic
def _tile(typingctx, lanes, rows, a, lda, w, pairs, c, ldc):
    """The micro-kernel for ``rows`` output pixels on registers of ``lanes`` int32 (both
    constants: 16 for AVX-512, 8 for AVX2; panel = 2 * lanes channels): ``c[r, 0:panel]
    = sum over k of a[r, 2k: 2k + 2] . w[k, 0:panel, 0:2]`` (int32), the other arguments
    byte addresses and byte strides (int64): a (rows, 2 * pairs) int16 rows ``lda`` apart,
    w (pairs, panel, 2) int16 contiguous, c (rows, panel) int32 rows ``ldc`` apart."""
    if not isinstance(lanes, nbtypes.IntegerLiteral) or not isinstance(rows, nbtypes.IntegerLiteral) \
            or lanes.literal_value not in _MADD:
        return None
    signature = nbtypes.void(lanes, rows, nbtypes.int64, nbtypes.int64, nbtypes.int64, nbtypes.int64,
                             nbtypes.int64, nbtypes.int64)
    width, count = lanes.literal_value, rows.literal_value
    pairs_type, lanes_type = ir.VectorType(_I16, 2 * width), ir.VectorType(_I32, width)
    register = 4 * width  # bytes

    def codegen(context, builder, sig, args):
        _, _, a, lda, w, pairs, c, ldc = args
        madd = cgutils.get_or_insert_function(builder.module, ir.FunctionType(lanes_type, [pairs_type, pairs_type]),
                                              _MADD[width])
        entry, function = builder.block, builder.function
        loop, done = function.append_basic_block("tile_loop"), function.append_basic_block("tile_done")
        zero = ir.Constant(lanes_type, None)
        builder.cbranch(builder.icmp_signed(">", pairs, ir.Constant(_I64, 0)), loop, done)

        builder.position_at_end(loop)
        k = builder.phi(_I64)
        sums = [[builder.phi(lanes_type) for _ in range(2)] for _ in range(count)]
        panel_row = builder.add(w, builder.mul(k, ir.Constant(_I64, 2 * register)))
        filters = [builder.load(builder.inttoptr(builder.add(panel_row, ir.Constant(_I64, register * half)),
                                                 pairs_type.as_pointer()), align=2) for half in range(2)]
        pair_offset = builder.mul(k, ir.Constant(_I64, 4))
        updated = []
        for r in range(count):
            address = builder.add(builder.add(a, builder.mul(ir.Constant(_I64, r), lda)), pair_offset)
            pair = builder.load(builder.inttoptr(address, _I32.as_pointer()), align=2)
            lane = builder.insert_element(ir.Constant(lanes_type, ir.Undefined), pair, ir.Constant(_I32, 0))
            broadcast = builder.shuffle_vector(lane, ir.Constant(lanes_type, ir.Undefined),
                                               ir.Constant(lanes_type, [0] * width))
            values = builder.bitcast(broadcast, pairs_type)
            updated.append([builder.add(sums[r][half], builder.call(madd, [values, filters[half]]))
                            for half in range(2)])
        k_next = builder.add(k, ir.Constant(_I64, 1))
        k.add_incoming(ir.Constant(_I64, 0), entry)
        k.add_incoming(k_next, loop)
        for r in range(count):
            for half in range(2):
                sums[r][half].add_incoming(zero, entry)
                sums[r][half].add_incoming(updated[r][half], loop)
        builder.cbranch(builder.icmp_signed("<", k_next, pairs), loop, done)

        builder.position_at_end(done)
        results = []
        for r in range(count):  # every phi first: LLVM wants them at the top of the block
            for half in range(2):
                result = builder.phi(lanes_type)
                result.add_incoming(zero, entry)
                result.add_incoming(updated[r][half], loop)
                results.append(result)
        for r in range(count):
            for half in range(2):
                address = builder.add(builder.add(c, builder.mul(ir.Constant(_I64, r), ldc)),
                                      ir.Constant(_I64, register * half))
                builder.store(results[2 * r + half], builder.inttoptr(address, lanes_type.as_pointer()), align=4)
        return context.get_dummy_value()

    return signature, codegen


def pack_filter(columns: np.ndarray, panel: int) -> np.ndarray:
    """The (outputs, summed) int16 filter (zero point subtracted) as the micro-kernel
    reads it: (panels, pairs, panel, 2), zero-padded to whole panels and an even summed
    length."""
    outputs, summed = columns.shape
    panels, pairs = -(-outputs // panel), -(-summed // 2)
    padded = np.zeros((panels * panel, pairs * 2), np.int16)
    padded[:outputs, :summed] = columns
    return np.ascontiguousarray(padded.reshape(panels, panel, pairs, 2).transpose(0, 2, 1, 3))


def _conv_form(lanes: int):
    """``conv_quantized`` on registers of ``lanes`` int32. A closure over that one int, so
    numba's cache tells the forms apart (its key hashes a closure's values) and a
    processor compiles only the form it runs (numba compiles at the first call)."""

    @_jit
    def conv_quantized(x, flip, offset, geometry, packed, params, out, start, stop, rows, sums):
        """Output pixels [start, stop) of a quantized CONV_2D into ``out``.

        ``x``: the stored 8-bit input (N, H, W * C) read as uint8 (value ``(q ^ flip) -
        offset``: ``_jit.uint8_reading``); ``geometry``: int64 (KH, KW, stride h, stride w,
        dilation h, dilation w, pad top, pad left, OH, OW, C); ``packed``: ``pack_filter``'s;
        ``params``: the output stage (``_jit.stage_parameters``); ``out``: (N * OH * OW,
        channels) as uint8 (the kernel's narrowing store keeps int8's bits too); ``rows``:
        int16 scratch (TILE_ROWS, 2 * pairs); ``sums``: int32 scratch (TILE_ROWS, panels *
        panel)."""
        height = x.shape[1]
        kh, kw, sh, sw, dh, dw, top, left, oh, ow, depth = (geometry[0], geometry[1], geometry[2], geometry[3],
                                                           geometry[4], geometry[5], geometry[6], geometry[7],
                                                           geometry[8], geometry[9], geometry[10])
        width = x.shape[2] // depth
        panels, pairs = packed.shape[0], packed.shape[1]
        summed = kh * kw * depth
        run = kw * depth  # one kernel row's taps: contiguous in the input where dilation is 1
        channels = out.shape[1]
        rows_at, row_bytes = rows.ctypes.data, rows.strides[0]
        sums_at, sums_bytes = sums.ctypes.data, sums.strides[0]
        panel_bytes = packed.strides[0]
        packed_at = packed.ctypes.data
        for first in range(start, stop, TILE_ROWS):
            count = min(TILE_ROWS, stop - first)
            for r in range(count):  # the tile's im2col rows, zero point subtracted
                pixel = first + r
                batch = pixel // (oh * ow)
                y = (pixel // ow) % oh
                x0 = (pixel % ow) * sw - left
                for i in range(kh):
                    iy = y * sh - top + i * dh
                    at = i * run
                    if iy < 0 or iy >= height:
                        for k in range(run):
                            rows[r, at + k] = 0
                    elif dw == 1 and x0 >= 0 and x0 + kw <= width:
                        base = x0 * depth
                        for k in range(run):
                            rows[r, at + k] = np.int16(np.int32(x[batch, iy, base + k] ^ flip) - offset)
                    else:
                        for j in range(kw):
                            ix = x0 + j * dw
                            if 0 <= ix < width:
                                for ch in range(depth):
                                    value = np.int32(x[batch, iy, ix * depth + ch] ^ flip) - offset
                                    rows[r, at + j * depth + ch] = np.int16(value)
                            else:
                                for ch in range(depth):
                                    rows[r, at + j * depth + ch] = 0
                for k in range(summed, 2 * pairs):
                    rows[r, k] = 0
            for p in range(panels):
                a, w, c = rows_at, packed_at + p * panel_bytes, sums_at + p * 8 * lanes  # 2 * lanes int32
                if count == 6:
                    _tile(lanes, 6, a, row_bytes, w, pairs, c, sums_bytes)
                elif count == 5:
                    _tile(lanes, 5, a, row_bytes, w, pairs, c, sums_bytes)
                elif count == 4:
                    _tile(lanes, 4, a, row_bytes, w, pairs, c, sums_bytes)
                elif count == 3:
                    _tile(lanes, 3, a, row_bytes, w, pairs, c, sums_bytes)
                elif count == 2:
                    _tile(lanes, 2, a, row_bytes, w, pairs, c, sums_bytes)
                else:
                    _tile(lanes, 1, a, row_bytes, w, pairs, c, sums_bytes)
            for r in range(count):
                _finish(sums[r, :channels], params, out[first + r])

    return conv_quantized


class Form:
    """One vector width's kernel: what ``_jit.integer_products`` offers."""

    def __init__(self, name: str, lanes: int) -> None:
        self.name = name
        #: output channels of one panel: two registers of int32 sums
        self.panel = 2 * lanes
        self.tile_rows = TILE_ROWS
        self.conv_quantized = _conv_form(lanes)

    def pack_filter(self, columns: np.ndarray) -> np.ndarray:
        """``pack_filter`` for this form's panels."""
        return pack_filter(columns, self.panel)

    def __repr__(self) -> str:
        return f"<integer products {self.name}>"


#: 512-bit registers: vpmaddwd (vpdpwssd with AVX-512 VNNI), panels of 32 channels
AVX512 = Form("avx512", 16)
#: 256-bit registers: vpmaddwd (vpdpwssd with AVX-VNNI), panels of 16 channels
AVX2 = Form("avx2", 8)
