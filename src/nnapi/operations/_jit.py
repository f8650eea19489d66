"""The optional compiled kernels (``pip install nnapi[fast]``: numba) and when they are used.

Prepared kernels (``_conv_fast``) ask ``kernels()`` at preparation; it returns the module
of compiled kernels (``_numba_kernels``) when numba can be imported and the environment
variable ``NNAPI_NO_NUMBA`` is unset (or "0"), else None, and they keep the numpy path.
The numpy kernels are the reference either way: tests compare the two bit for bit.

Compilation is lazy and cached: numba compiles a kernel at its first call for each
argument type and stores the machine code in its on-disk cache (``cache=True``: a
``__pycache__`` beside the module, or numba's user-wide cache directory when the
package directory is read-only; ``NUMBA_CACHE_DIR`` chooses another). numba itself is
imported when nnapi-reference starts (``ReferenceDevice()``, at device discovery), not by
a preparation, and so are the kernels of quantized convolution models (``load_library``).
The wrappers below make each kernel's first call at preparation on tiny arrays, so
loading any other (or compiling it, once per machine) lands in ``Compilation.finish`` of
the first model that needs it in a process and never in an execution.
"""

from __future__ import annotations

import math
import os
from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np

from nnapi import vlog
from nnapi.operand import dtype_of
from nnapi.operations.quant_math import OutputStage

if TYPE_CHECKING:
    from nnapi.operations._numba_igemm import Form

#: set (to anything but "" or "0") to keep every kernel on its numpy path
DISABLE_VARIABLE = "NNAPI_NO_NUMBA"

_INT32_MAX = 2**31 - 1

_module: ModuleType | None = None
_unavailable = False
_library_loaded = False


def kernels() -> ModuleType | None:
    """The compiled kernels, or None when numba is missing or ``NNAPI_NO_NUMBA`` is set.
    Read at preparation: a prepared model keeps the path it was prepared with."""
    global _module, _unavailable
    if os.environ.get(DISABLE_VARIABLE, "") not in ("", "0") or _unavailable:
        return None
    if _module is None:
        try:
            from nnapi.operations import _numba_kernels
        except ImportError:  # numba not installed, or not working with this numpy
            _unavailable = True
            return None
        _module = _numba_kernels
    return _module


_integer_forms: tuple[Form, ...] | None = None


def integer_forms() -> tuple[Form, ...]:
    """Every form of the compiled 8-bit products (``_numba_igemm.Form``: the processor's
    16-bit multiply-add on registers of one width) this processor runs, widest first:
    AVX-512 (F and BW), then AVX2; none without the compiled kernels or where numba
    compiles for a processor other than this one (``NUMBA_CPU_NAME``: the machine code
    must not need features that processor may lack)."""
    global _integer_forms
    if kernels() is None:
        return ()
    if _integer_forms is None:
        _integer_forms = ()
        try:
            import llvmlite.binding as llvm
            import numba

            if numba.config.CPU_NAME in (None, "host") and not numba.config.CPU_FEATURES:
                features = llvm.get_host_cpu_features()
                from nnapi.operations import _numba_igemm

                forms = []
                if features.get("avx512bw") and features.get("avx512f"):
                    forms.append(_numba_igemm.AVX512)
                if features.get("avx2"):
                    forms.append(_numba_igemm.AVX2)
                _integer_forms = tuple(forms)
        except (ImportError, RuntimeError, AttributeError) as error:
            vlog.logger("cpuexe").debug("nnapi[fast]: no integer products: %s", error)
    return _integer_forms


def integer_products() -> Form | None:
    """The compiled 8-bit products on this processor's widest 16-bit multiply-add
    (``_numba_igemm.Form``: AVX-512 where it has AVX-512 BW, else AVX2), or None
    (``integer_forms`` offers none). Read at preparation."""
    forms = integer_forms()
    return forms[0] if forms else None


def load_library() -> None:
    """Load the compiled kernels that quantized convolution models bind (a MobileNet's
    convolutions, depthwise convolutions, additions, average pool, classifier, SOFTMAX,
    QUANTIZE, DEQUANTIZE and float MEAN; int8 and uint8: 14 versions) by preparing one small
    operation of each kind, so that their machine code comes out of numba's cache when
    nnapi-reference starts (the device's library, loaded as a driver service loads its
    libraries) and not in the first ``Compilation.finish`` of a process, where ~1-1.5 ms a
    kernel took a quantized MobileNet's first finish past 50 ms. The first load also runs
    numba's one-time set-up (its extension entry points; numpy.ma, which its typing of
    array arguments imports: ~15 ms), which every process's first compiled kernel pays.
    The operations go through their real ``plan``, so the versions loaded are the ones
    models bind (a test checks that such operations load nothing more after it). Float
    models' kernels still load at their first preparation. Nothing happens when the
    compiled kernels are not in use; a failure only leaves a kernel to load later. Once
    per process."""
    global _library_loaded
    if _library_loaded or kernels() is None:
        return
    _library_loaded = True
    from nnapi.codes import OperandCode as T
    from nnapi.codes import OperationCode as Op
    from nnapi.operand import OperandType

    for code, zero_point in ((T.TENSOR_QUANT8_ASYMM_SIGNED, -1), (T.TENSOR_QUANT8_ASYMM, 128)):
        _load_quantized(code, zero_point)
    _plan_once(Op.MEAN, [_tensor(T.TENSOR_FLOAT32, np.zeros((1, 2, 2, 8), np.float32)),
                         _tensor(T.TENSOR_INT32, np.array([1, 2], np.int32)), *_scalars(0)],
               OperandType(T.TENSOR_FLOAT32, [1, 8]))


def _tensor(code, value, scale: float = 0.0, zero_point: int = 0):
    from nnapi.operations.base import Tensor

    value = np.asarray(value)
    return Tensor(code, tuple(value.shape), scale, zero_point, None, value)


def _scalars(*values) -> list:
    from nnapi.codes import OperandCode as T

    return [_tensor(T.INT32, np.int32(value)) for value in values]


def _plan_once(code, inputs: list, output) -> None:
    """Prepare one operation (``load_library``), which loads the kernels its plan binds."""
    from nnapi.operations import get_operation
    from nnapi.operations.base import ExecutionContext

    try:
        get_operation(code).plan(ExecutionContext(code, inputs, [output]))
    except Exception as error:  # noqa: BLE001 - the kernel then loads at its first preparation
        vlog.logger("cpuexe").debug("nnapi[fast]: %s not loaded at start: %s", code.name, error)


def _load_quantized(code, zero_point: int) -> None:
    """``load_library``'s operations of one 8-bit type (``code``, inputs at ``zero_point``)."""
    from nnapi.codes import OperandCode as T
    from nnapi.codes import OperationCode as Op
    from nnapi.operand import OperandType, dtype_of

    dtype = dtype_of(code)
    filter_zero_point = max(zero_point, 0)

    def image(height: int, width: int, depth: int):
        return _tensor(code, np.full((1, height, width, depth), zero_point, dtype), 0.5, zero_point)

    def rows(count: int):
        return _tensor(code, np.full((1, count), zero_point, dtype), 0.5, zero_point)

    def weights(shape: tuple[int, ...], value: int = 1, zero_point: int = filter_zero_point):
        return _tensor(code, np.full(shape, value + zero_point, dtype), 0.25, zero_point)

    def bias(channels: int):
        return _tensor(T.TENSOR_INT32, np.zeros(channels, np.int32), 0.125)

    def output(*dims: int, scale: float = 1.0, at: int = zero_point) -> OperandType:
        return OperandType(code, list(dims), scale, at)

    unpadded = _scalars(0, 0, 0, 0, 1, 1, 0)
    # a padded 3x3 convolution (the output stage on float32 accumulators), a 1x1 one (its
    # input less the zero point in one pass, DEQUANTIZE's kernel), one too large for exact
    # float32 sums (split into exact parts), depthwise convolutions of 64 channels or more
    # (per pixel) and of fewer at stride 1 (whole rows: ``_conv_fast._ROW_CHANNELS``), a
    # classifier (few rows: FULLY_CONNECTED's kernel is a 1x1 convolution's too)
    _plan_once(Op.CONV_2D, [image(4, 4, 8), weights((8, 3, 3, 8)), bias(8), *_scalars(1, 1, 1, 1, 1, 1, 0)],
               output(1, 4, 4, 8))
    _plan_once(Op.CONV_2D, [image(4, 4, 8), weights((8, 1, 1, 8)), bias(8), *unpadded], output(1, 4, 4, 8))
    _plan_once(Op.CONV_2D, [image(3, 3, 2048), weights((8, 1, 1, 2048), 127), bias(8), *unpadded],
               output(1, 3, 3, 8))  # (more pixels than the compiled few-row product takes)
    for channels in (64, 32):
        _plan_once(Op.DEPTHWISE_CONV_2D,
                   [image(4, 4, channels), weights((1, 3, 3, channels)), bias(channels),
                    *_scalars(1, 1, 1, 1, 1, 1, 1, 0)], output(1, 4, 4, channels))
    _plan_once(Op.FULLY_CONNECTED, [rows(8), weights((16, 8)), bias(16), *_scalars(0)], output(1, 16))
    if dtype == np.uint8:  # filter values less their zero point beyond int8's range: int16 filters
        _plan_once(Op.FULLY_CONNECTED, [rows(8), weights((16, 8), 155, 100), bias(16), *_scalars(0)], output(1, 16))
    _plan_once(Op.ADD, [image(16, 16, 1), image(16, 16, 1), *_scalars(0)], output(1, 16, 16, 1))
    _plan_once(Op.SOFTMAX, [rows(16), _tensor(T.FLOAT32, np.float32(1))],
               output(1, 16, scale=1 / 256, at=-128 if dtype == np.int8 else 0))
    _plan_once(Op.QUANTIZE, [_tensor(T.TENSOR_FLOAT32, np.zeros((1, 8), np.float32))], output(1, 8))
    # (a 1x1 convolution's input shift where convolutions take the float32 products)
    _plan_once(Op.DEQUANTIZE, [image(2, 2, 8)], OperandType(T.TENSOR_FLOAT32, [1, 2, 2, 8]))
    # the global average pool before a MobileNet's classifier (VALID, the whole image)
    _plan_once(Op.AVERAGE_POOL_2D, [image(4, 4, 8), *_scalars(2, 1, 1, 4, 4, 0)], output(1, 1, 1, 8, scale=0.5))


def warm_up(run, *args) -> bool:
    """Call a compiled kernel once at preparation on empty arrays of the real dtypes, so
    that numba compiles it (or loads it from its cache) then rather than in an execution.
    False when that fails (a numba that cannot compile here, an unreadable cache): the
    caller keeps its numpy kernel, and so does every later preparation in this process."""
    global _unavailable
    try:
        run(*args)
    except Exception as error:  # noqa: BLE001 - any failure of the optional path falls back to numpy
        _unavailable = True
        vlog.logger("cpuexe").warning("nnapi[fast]: compiled kernels disabled, numpy kernels used: %s: %s",
                                      type(error).__name__, error)
        return False
    return True


def uint8_reading(tensor) -> tuple[np.int32, np.int32]:
    """How the compiled kernels read 8-bit ``tensor``'s stored values, as uint8: (flip,
    offset), 128 added to int8 bits (flip) and the zero point in that reading (offset)."""
    flip = 128 if dtype_of(tensor.type) == np.int8 else 0
    return np.int32(flip), np.int32(tensor.zero_point + flip)


def dequantize_kernel(tensor):
    """The compiled one-pass 8-bit to float32 of ``tensor``'s values (``_numba_kernels.
    dequantized(stored, flip, offset, scale, out)``: the same float32 subtraction and
    product as numpy's two passes) with its flip and offset (``uint8_reading``), or None."""
    module = kernels()
    if module is None:
        return None
    flip, offset = uint8_reading(tensor)
    if not warm_up(module.dequantized, np.zeros(0, np.uint8), flip, offset, np.float32(1), np.empty(0, np.float32)):
        return None
    return module.dequantized, flip, offset


class FusedOutputStage:
    """``quant_math.OutputStage`` in one compiled pass: called with accumulators and the
    output array (C-contiguous, channels last), writes the quantized results into it.
    ``acc_bound``: a bound on |accumulator| known at preparation (None: any int64), which
    lets the kernel fold the bias into a constant when no saturation can occur."""

    def __init__(self, stage: OutputStage, module: ModuleType, acc_dtype, channels: int, parts: bool = False,
                 acc_bound: int | None = None) -> None:
        """``parts``: accumulators also come as exact float32 parts to sum (``sum_parts``)."""
        self.stage = stage
        self.kernel = module.requantize_rows
        self.parts_kernel = module.requantize_parts
        self.channels = channels
        self.params = stage_parameters(stage, channels, acc_bound)
        # 8-bit results are stored through a uint8 view: the kernel's narrowing store keeps
        # the low 8 bits of the clamped value, int8's bits too, so int8 and uint8 models
        # share one machine code (a second model loads no second version)
        self.store = np.dtype(np.uint8) if stage.dtype.itemsize == 1 else stage.dtype
        self.ready = warm_up(self.kernel, np.zeros((0, channels), acc_dtype), self.params,
                             np.empty((0, channels), self.store))
        if parts and self.ready:
            self.ready = warm_up(self.parts_kernel, np.zeros((1, 0, channels), np.float32), self.params,
                                 np.empty((0, channels), self.store), np.empty(channels, np.int64))

    @property
    def folded(self) -> bool:
        return self.params[-1] != SATURATING

    @property
    def mode(self) -> int:
        """The compiled kernels' form of the stage (``_numba_kernels._finish``)."""
        return int(self.params[-1])

    def __call__(self, acc: np.ndarray, out: np.ndarray) -> np.ndarray:
        if not (acc.flags.c_contiguous and out.flags.c_contiguous and out.flags.writeable):
            return self.stage(acc, out)
        self.kernel(acc.reshape(-1, self.channels), self.params, out.reshape(-1, self.channels).view(self.store))
        return out

    def sum_parts(self, parts: np.ndarray, out: np.ndarray) -> np.ndarray:
        """The outputs of accumulators that are the sums of ``parts`` (P, rows, channels),
        float32 partial sums each exact, into ``out`` (rows, channels, C-contiguous)."""
        self.parts_kernel(parts, self.params, out.view(self.store), scratch((self.channels,), np.int64))
        return out


def compilable(stage: OutputStage) -> bool:
    """Whether the compiled kernels' int64 arithmetic holds this stage: Q31 multipliers
    (QuantizeMultiplier's), shifts within [-31, 30], |zero point| < 2**16 (always so for
    the stages of convolutions and matrix products)."""
    multipliers, shifts = stage.multipliers, stage.shifts
    return bool(multipliers.min(initial=0) >= 0 and multipliers.max(initial=0) <= _INT32_MAX
                and shifts.min(initial=0) >= -31 and shifts.max(initial=0) <= 30) and abs(stage.zero_point) < 2**16


#: the forms of ``stage_parameters`` (``_numba_kernels._finish``; the same numbers)
SATURATING, FOLDED, CLAMPED, UNIFORM = 0, 1, 2, 3


def stage_parameters(stage: OutputStage, channels: int, acc_bound: int | None = None) -> tuple:
    """The compiled kernels' form of an output stage of ``channels`` channels (see
    ``_numba_kernels._finish``), one int64 value per channel unless said: bias,
    multipliers (int32), left shifts, right shifts r, offsets 2**(r - 1) + zero_point *
    2**r (2**(r - 1) read as 0 for r = 0), -1 where r > 0 else 0, bias * m + 2**30; then
    the clamp range and the form (int64): FOLDED where no left shift and ``acc_bound`` +
    |bias| < 2**31, CLAMPED where also the clamp's low end is at or above the zero
    point, UNIFORM where also every channel has the same multiplier and shift, else
    SATURATING. In the CLAMPED and UNIFORM forms the last per-channel value also holds
    the offsets shifted left by 31 (the kernels' two floors then one shift), where every
    sum stays within int64 (else the form is FOLDED)."""
    if not compilable(stage):
        raise ValueError("the compiled output stage takes Q31 multipliers, shifts in [-31, 30], |zero point| < 2**16")
    # the seven int64 rows in one block (each row a C-contiguous, writable array, as
    # ``constant`` makes them), each filled in place: a stage is made for every quantized
    # convolution of a model, where numpy's per-call cost is most of the work
    rows = np.empty((7, channels), np.int64)
    bias, multipliers, lefts, rights, offsets, negative, folded = rows
    bias[...] = stage.bias  # (per channel, or one value for all)
    multipliers[...] = stage.multipliers
    np.maximum(stage.shifts, 0, out=lefts)
    np.negative(stage.shifts, out=rights)
    np.maximum(rights, 0, out=rights)
    np.left_shift(1, rights, out=offsets)
    offsets >>= 1  # 2**(r - 1), 0 for r = 0
    offsets += np.left_shift(np.int64(stage.zero_point), rights)
    np.multiply(bias, multipliers, out=folded)
    folded += 1 << 30
    np.greater(rights, 0, out=negative)
    np.negative(negative, out=negative)  # -1 where r > 0
    mode = SATURATING
    if acc_bound is not None and not lefts.any() and acc_bound + int(np.abs(bias).max(initial=0)) < 2**31:
        mode = FOLDED
        # |acc * m + bias * m + 2**30 + offset * 2**31| < 2**63 (Python integers: exact)
        largest = (acc_bound + int(np.abs(bias).max(initial=0))) * int(multipliers.max(initial=0)) + (1 << 30) \
            + (int(np.abs(offsets).max(initial=0)) << 31)
        if stage.low >= stage.zero_point and largest < 2**63:
            uniform = bool(channels and multipliers.min() == multipliers.max() and rights.min() == rights.max())
            mode = UNIFORM if uniform else CLAMPED
            folded += offsets << 31
    return (bias, multipliers.astype(np.int32), lefts, rights, offsets, negative, folded,
            np.int64(stage.low), np.int64(stage.high), np.int64(mode))


def scratch(shape: tuple[int, ...], dtype) -> np.ndarray:
    """An uninitialized C array for a kernel's working rows, starting on a 64-byte
    boundary as numba's own allocations do (a kernel allocating it itself would make numba
    import its array implementation when loading the kernel; see _numba_kernels). One per
    call: executions of one compilation may run at once."""
    dtype = np.dtype(dtype)
    count = math.prod(shape)
    raw = np.empty(count * dtype.itemsize + 64, np.uint8)
    start = -raw.ctypes.data % 64
    return raw[start:start + count * dtype.itemsize].view(dtype).reshape(shape)


def kernel_input(x: np.ndarray) -> np.ndarray:
    """An execution's array as a kernel argument: C-contiguous and writable. A model input
    may be a read-only view (``np.frombuffer``, a mapped file); numba types that apart and
    would compile (or load) another version inside the execution, so it is copied."""
    x = np.ascontiguousarray(x)
    return x if x.flags.writeable else x.copy()


def constant(values, dtype) -> np.ndarray:
    """``values`` as a kernel argument: a C-contiguous, writable array of ``dtype`` of its
    own. numba types an array by dtype, rank, layout and whether it is read-only, and
    loads (or compiles) one machine code per combination: a constant that is sometimes a
    read-only view (a model's weights, a broadcast) and sometimes a fresh array would
    cost a process one more load per kernel."""
    return np.array(values, dtype=dtype, order="C", copy=True)
