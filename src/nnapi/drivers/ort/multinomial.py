"""RANDOM_MULTINOMIAL on nnapi-ort-cpu: declined, with the reason.

NNAPI's samples are a function of the seeds given at run time (Android's Philox stream,
the reference's PCG64 one: equal seeds, equal samples; both 0, fresh ones). ONNX's
Multinomial takes its seed as an attribute, fixed when the graph is built, and ONNX
Runtime advances its generator from run to run, so the same seeds would not give the same
samples again: it cannot express the operation. (A generator written out in ONNX integer
arithmetic, as lsh.py writes FarmHash, could; none is.)

The device module imports this one, which registers the lowering with ``lowering``.
"""

from __future__ import annotations

from nnapi.codes import OperationCode
from nnapi.drivers.ort.builder import Declined, GraphBuilder, lowers
from nnapi.hal import Operation


@lowers(OperationCode.RANDOM_MULTINOMIAL)
def lower_random_multinomial(g: GraphBuilder, operation: Operation) -> None:
    """Declines: see the module's docstring."""
    raise Declined("RANDOM_MULTINOMIAL's samples follow the seeds given at run time (equal seeds, equal "
                   "samples); ONNX's Multinomial takes a seed attribute fixed in the graph and advances its "
                   "generator from run to run")
