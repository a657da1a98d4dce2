"""Pallas GPU (Triton lowering) fused dequantize+attend decode kernels for kvjax.

Importing registers the "pallas_gpu" implementation with `kvjax.dispatch`.
Files: `decode.py` (per-token kernels, the shared skeleton, split merge), `kivi.py`
(the KIVI kernel), `ops.py` (cache -> kernel plan,
the `backend_call` seam a Mosaic GPU version can replace), `write.py` (the
in-place, donated append path).
"""

from kvjax import dispatch
from pallas_kernels.gpu.ops import decode_attention
from pallas_kernels.gpu.write import append_inplace, decode_step

dispatch.register("pallas_gpu", decode_attention)

__all__ = ["decode_attention", "append_inplace", "decode_step"]
