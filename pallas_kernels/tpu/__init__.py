"""TPU backend: fused dequantize+attend decode in Pallas Mosaic.

Importing registers ``"pallas_tpu"`` with `kvjax.dispatch`. On a TPU backend
it is the default; elsewhere it declines unless ``interpret=`` is passed, and
for formats/shapes outside `plan.make_plan`'s rules it raises
`NotImplementedError`, so dispatch falls back to the XLA reference.
"""

from kvjax import dispatch as _dispatch
from pallas_kernels.tpu.api import decode_attention, dispatch_entry
from pallas_kernels.tpu.plan import Plan, make_plan

__all__ = ["decode_attention", "make_plan", "Plan"]

_dispatch.register("pallas_tpu", dispatch_entry)
