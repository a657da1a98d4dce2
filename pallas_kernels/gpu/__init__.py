"""Pallas GPU (Triton lowering) fused dequantize+attend decode kernels for kvjax.

Importing registers the "pallas_gpu" implementation with `kvjax.dispatch`.
Files: `decode.py` (per-token kernels, the shared skeleton, split merge), `kivi.py`
(the KIVI kernel), `ops.py` (cache -> kernel plan,
the `backend_call` seam a Mosaic GPU version can replace), `write.py` (the
append's row stores in one kernel, registered as the "pallas_gpu" cache writer).
"""

from kvjax import dispatch
from pallas_kernels.gpu.ops import decode_attention
from pallas_kernels.gpu.write import append, append_inplace, decode_step

dispatch.register("pallas_gpu", decode_attention)
dispatch.register_append("pallas_gpu", append)

__all__ = ["decode_attention", "append", "append_inplace", "decode_step"]
