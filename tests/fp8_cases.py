"""Random FP8 / INT8 caches with per-token scales for the Mosaic FP8 kernel's tests (`test_mosaic_fp8*.py`)."""

import jax.numpy as jnp
import numpy as np

from pallas_kernels.gpu import decode, mosaic_fp8 as mf


def fp8_case(lengths, dtype=jnp.float8_e4m3fn, scale_dtype=jnp.bfloat16, capacity=512, kv_heads=2, seed=0,
             head_dim=128):
  """Random FP8 (or int8) codes with per-token scales as a cache holds them (values stored in 64-token tiles, as the
  kernel reads them): codes spanning the format's range, scales = |x|max / the format's max for |x|max
  around 0.5-4, so p x s_v is as small as in a real cache (e5m2: ~1e-5, fp16's subnormals without a fold)."""
  rng = np.random.default_rng(seed)
  b = len(lengths)
  fmax = 127.0 if dtype == jnp.int8 else float(jnp.finfo(dtype).max)  # INT8: symmetric codes in [-127, 127]
  whole = np.round if dtype == jnp.int8 else (lambda x: x)
  normal = lambda: rng.normal(size=(b, kv_heads, capacity, head_dim))
  codes = lambda: jnp.asarray(whole(np.clip(normal() * fmax / 4, -fmax, fmax)), jnp.float32).astype(dtype)
  scales = lambda: jnp.asarray(rng.uniform(0.5, 4.0, (b, kv_heads, capacity)) / fmax, scale_dtype)
  q_t = jnp.asarray(rng.normal(size=(b, kv_heads, head_dim, mf.ROWS)) * 0.13, jnp.float32)
  return q_t, jnp.asarray(lengths, jnp.int32), codes(), scales(), codes(), scales()


def merged_states(o, m, l):
  return np.asarray(decode.combine(jnp.swapaxes(jnp.asarray(o), -1, -2), m, l, mf.ROWS))
