"""TensorFlow Lite import: a .tflite flatbuffer -> a finished nnapi.Model.

The flatbuffer is read with the ``tflite`` package (``pip install nnapi[tflite]``), the
generated schema bindings; nothing here parses bytes by hand. Each subgraph becomes one
Model (WHILE / IF branches become referenced models). Each builtin operator maps to the
NNAPI operation with the same meaning; where TFLite allows more than that operation (a
requantizing MEAN, per-channel FULLY_CONNECTED, a rank-0 GATHER index, ...) the operator
is lowered to an exact sequence of NNAPI operations and the rewrite is recorded in
``ImportedModel.lowerings``. Weights stored as float16 behind DEQUANTIZE, or sparse
behind DENSIFY, are folded into float32 / dense constants once, here. Anything without
an NNAPI meaning raises BadDataError naming the operator's index, its name and why.

Tensor conventions: a rank-0 TFLite tensor becomes a [1] NNAPI tensor (NNAPI has no
rank-0 tensors); a dimension TFLite marks -1 becomes 0 (unknown until execution).

The package, by concern: ``reader`` (the flatbuffer, tensors, the schema's constants),
``converter`` (one subgraph's converter, the operator loop, the converters' registry),
``load`` (``load_tflite``); one module per operator family, each registering its
converters with ``converter._converter``: ``convolutions``, ``padding``, ``elementwise``,
``normalization``, ``shapes``, ``data_movement``, ``reductions``, ``quantization``,
``spatial``, ``spectral``, ``recurrent``, ``control_flow``, ``detection``; with
``float_moves`` (int32 / bool moved through float32), ``high_rank`` (tensors above rank 4),
``moves`` (their element-move plans), ``fold`` (constant folding), ``variables`` (resource
variables) and ``while_lstm`` (Keras' LSTM loop).
"""

from nnapi.importers.tflite import (  # noqa: F401  (each registers its converters)
    control_flow,
    convolutions,
    data_movement,
    detection,
    elementwise,
    normalization,
    padding,
    quantization,
    recurrent,
    reductions,
    shapes,
    spatial,
    spectral,
)
from nnapi.importers.tflite.load import load_tflite
from nnapi.importers.tflite.reader import UnsupportedOperator  # noqa: F401

__all__ = ["load_tflite"]
