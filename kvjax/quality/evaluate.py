"""Scoring a model through a quantized cache, as decode sees it.

`score_tail` prefills the context (in chunks: each chunk attends to the
earlier context as the cache stores it, quantized) and then runs real decode
steps over the tail: every scored token is predicted from the quantized
cache through `kvjax.dispatch.decode_attention`, as in serving. It returns
per-token negative log-likelihoods and argmax hits, from which perplexity,
exact recall and passkey accuracy follow.
"""

from __future__ import annotations

import functools
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jaxtyping import Array, Int

from kvjax import calibration
from kvjax.cache import materialize
from kvjax.formats import KVFormat
from kvjax.memory import round_capacity

__all__ = ["score_tail", "calibrate_model"]


@functools.lru_cache(maxsize=64)
def _program(graphdef, chunk: int, implementation):
  def run(state, context, tail, caches):
    model = nnx.merge(graphdef, state)
    logits = None
    for start in range(0, context.shape[1], chunk):  # static chunked prefill
      logits, caches = model(context[:, start:start + chunk], caches, implementation=implementation)
    first = logits[:, -1]  # predicts tail[:, 0]

    def body(caches, tok):
      out, caches = model(tok[:, None], caches, implementation=implementation)
      return caches, out[:, 0]

    caches, rest = jax.lax.scan(body, caches, tail[:, :-1].T)  # predicts tail[:, 1:]
    logits = jnp.concatenate([first[:, None], jnp.swapaxes(rest, 0, 1)], axis=1)  # [B, M, V]
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    nll = -jnp.take_along_axis(logp, tail[..., None], axis=-1)[..., 0]
    return nll, jnp.argmax(logits, axis=-1) == tail

  return jax.jit(run)


def score_tail(model, tokens: Int[Array, "B T"], split: int, fmt: KVFormat | tuple, *, scales=None,
               chunk: int = 1024, implementation=None) -> tuple[np.ndarray, np.ndarray]:
  """NLL and argmax hits ``[B, T - split]`` of ``tokens[:, split:]`` given ``tokens[:, :split]``.

  The first `split` tokens are prefilled into a fresh cache of format `fmt`
  (one format, or one per layer); the rest are decoded one at a time
  (teacher forced).
  """
  tokens = jnp.asarray(tokens, jnp.int32)
  b, t = tokens.shape
  if not 0 < split < t:
    raise ValueError(f"split must be in (0, T={t}), got {split}")
  fmts = tuple(fmt) if isinstance(fmt, (list, tuple)) else (fmt,)
  caches = model.init_cache(b, max(round_capacity(f, t) for f in fmts), fmt, scales=scales)
  graphdef, state = nnx.split(model)
  impl = tuple(implementation) if isinstance(implementation, list) else implementation
  nll, hit = _program(graphdef, min(chunk, split), impl)(state, tokens[:, :split], tokens[:, split:],
                                                         caches)
  return np.asarray(nll), np.asarray(hit)


def calibrate_model(model, tokens: Int[Array, "B T"], fmt: KVFormat, *, method="absmax",
                    margin: float = 1.0, chunk: int = 1024):
  """Static FP8 scales for `fmt` from the K/V the model produces on `tokens`.

  Returns ``(KVScales, info)`` with the calibration cost: seconds (K/V
  capture and reduction, after compilation) and tokens seen.
  """
  from kvjax import formats
  tokens = jnp.asarray(tokens, jnp.int32)
  b, t = tokens.shape
  graphdef, state = nnx.split(model)

  @jax.jit
  def capture(state, toks):
    m = nnx.merge(graphdef, state)
    caches = m.init_cache(b, t, formats.bf16())
    for start in range(0, t, chunk):
      _, caches = m(toks[:, start:start + chunk], caches)
    kv = [materialize(c) for c in caches]
    return jnp.stack([k for k, _ in kv])[:, :, :, :t], jnp.stack([v for _, v in kv])[:, :, :, :t]

  capture(state, tokens)[0].block_until_ready()  # compile outside the timing
  t0 = time.perf_counter()
  k, v = capture(state, tokens)
  stats = calibration.calibrate([(k, v)], k.shape[0], k.shape[2], k.shape[4])
  scales = calibration.compute_scales(stats, fmt, method=method, margin=margin)
  jax.block_until_ready(scales.k if scales.k is not None else scales.v)
  return scales, {"seconds": time.perf_counter() - t0, "tokens": b * t, "method": method,
                  "margin": margin}
