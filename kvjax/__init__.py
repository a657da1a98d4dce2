"""kvjax: quantized KV caches for JAX decode (FP8, INT8/4, KIVI 2/4-bit).

Data path: formats -> quant -> cache -> attention (reference) / dispatch (kernels) ->
module (NNX attention) -> models (decoders, generate, loaders).
"""

from kvjax import formats as formats
from kvjax.formats import (FP8Spec as FP8Spec, IntSpec as IntSpec, KIVISpec as KIVISpec,
                           KVFormat as KVFormat, Passthrough as Passthrough, preset as preset,
                           PRESETS as PRESETS)
from kvjax.quant import QArray as QArray, quantize as quantize, dequantize as dequantize
from kvjax.cache import (KVCache as KVCache, init_cache as init_cache, append as append,
                         prefill as prefill, materialize as materialize, stack as stack,
                         unstack as unstack)
from kvjax.attention import (decode_attention as reference_decode_attention,
                             prefill_attention as prefill_attention)
from kvjax.dispatch import decode_attention as decode_attention
from kvjax.calibration import (CalibStats as CalibStats, KVScales as KVScales,
                               calibrate as calibrate, compute_scales as compute_scales,
                               save_scales as save_scales, load_scales as load_scales)
from kvjax.memory import (ModelShape as ModelShape, bytes_per_sequence as bytes_per_sequence,
                          bytes_per_token as bytes_per_token, sequences_that_fit as sequences_that_fit)
from kvjax.rope import apply_rope as apply_rope
from kvjax.module import KVAttention as KVAttention
from kvjax import adapters as adapters
from kvjax import sharding as sharding
from kvjax import models as models

__version__ = "0.1.0"
