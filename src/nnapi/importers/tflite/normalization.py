"""TFLite import: SOFTMAX, LOG_SOFTMAX and LOCAL_RESPONSE_NORMALIZATION.
"""

from __future__ import annotations

from nnapi.codes import OperationCode as Op
from nnapi.importers.tflite.converter import _Converter, _converter
from nnapi.importers.tflite.reader import _Operator


@_converter("SOFTMAX")
def _softmax(c: _Converter, op: _Operator) -> None:
    x = c.input(0)
    beta = op.options("SoftmaxOptions").Beta()
    c.emit(Op.SOFTMAX, [x, c.float_scalar(beta, x)], [c.output()])


@_converter("LOG_SOFTMAX")
def _log_softmax(c: _Converter, op: _Operator) -> None:
    x = c.input(0)
    c.emit(Op.LOG_SOFTMAX, [x, c.float_scalar(1.0, x), c.i32(-1)], [c.output()])


@_converter("LOCAL_RESPONSE_NORMALIZATION")
def _lrn(c: _Converter, op: _Operator) -> None:
    options = op.options("LocalResponseNormalizationOptions")
    x = c.input(0)
    c.emit(Op.LOCAL_RESPONSE_NORMALIZATION,
           [x, c.i32(options.Radius()), c.float_scalar(options.Bias(), x), c.float_scalar(options.Alpha(), x),
            c.float_scalar(options.Beta(), x)], [c.output()])
