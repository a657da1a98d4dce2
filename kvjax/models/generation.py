"""Jitted generation: ragged prompts, prefill then decode in ONE compiled function.

``generate(model, prompts, prompt_lengths, max_new_tokens=...)`` compiles
prefill (optionally in chunks, each chunk extending the quantized cache) and
a ``lax.while_loop`` of decode steps into one XLA program, keyed only by
static choices (shapes, format, sampling, stop tokens): step counters,
lengths and positions are arrays, so nothing recompiles between steps or
calls. The caches are donated. Finished sequences (stop token or
`max_lengths`) emit `pad_id`; the loop exits when every sequence is done.
"""

from __future__ import annotations

import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, struct
from jaxtyping import Array, Int

from kvjax import cache as cache_lib
from kvjax.formats import KVFormat
from kvjax.models.decoder import Decoder
from kvjax.models.sampling import SamplingConfig, sample

__all__ = ["GenerateOutput", "generate", "forward_uncached", "greedy_uncached", "TRACE_COUNT"]

TRACE_COUNT = {"generate": 0}  # times the generate program was traced (tests count recompiles)


@struct.dataclass
class GenerateOutput:
  """tokens ``[B, max_new]`` (pad after a sequence ends), lengths ``[B]`` generated tokens
  (a stop token included), caches (the final per-layer caches), logits ``[B, max_new, V]`` of
  each generated position when requested (else None)."""

  tokens: Array
  lengths: Array
  caches: tuple
  logits: Array | None = None


def _gather_last(logits, idx):
  return jnp.take_along_axis(logits, idx[:, None, None], axis=1)[:, 0]


def _generate_impl(state, prompts, prompt_lengths, max_lengths, caches, rng, *, graphdef,
                   max_new: int, sampling: SamplingConfig, stop_tokens: tuple[int, ...],
                   pad_id: int, implementation, return_logits: bool, prefill_chunk: int | None):
  TRACE_COUNT["generate"] += 1
  model = nnx.merge(graphdef, state)
  b, p = prompts.shape
  chunk = prefill_chunk or p
  last = None
  for start in range(0, p, chunk):  # static loop over prefill chunks
    toks = prompts[:, start:start + chunk]
    count = jnp.clip(prompt_lengths - start, 0, toks.shape[1])
    logits, caches = model(toks, caches, num_new=count, implementation=implementation)
    idx = jnp.clip(prompt_lengths - 1 - start, 0, toks.shape[1] - 1)
    here = (prompt_lengths - 1 >= start) & (prompt_lengths - 1 < start + toks.shape[1])
    cur = _gather_last(logits, idx)
    last = cur if last is None else jnp.where(here[:, None], cur, last)
  stops = jnp.asarray(stop_tokens if stop_tokens else (-1,), jnp.int32)

  def pick(logits, i, done):
    tok = sample(logits, jax.random.fold_in(rng, i), sampling)
    return jnp.where(done, pad_id, tok)

  done0 = jnp.zeros((b,), bool)
  tok = pick(last, 0, done0)
  out = jnp.full((b, max_new), pad_id, jnp.int32).at[:, 0].set(tok)
  n_out = jnp.ones((b,), jnp.int32)
  done = jnp.isin(tok, stops) | (n_out >= max_lengths)
  lbuf = (jnp.zeros((b, max_new, last.shape[-1]), jnp.float32).at[:, 0].set(last)
          if return_logits else None)

  def cond(carry):
    i, _, _, done, _, _, _ = carry
    return (i < max_new) & ~jnp.all(done)

  def body(carry):
    i, tok, caches, done, out, n_out, lbuf = carry
    logits, caches = model(tok[:, None], caches, implementation=implementation)
    logits = logits[:, 0]
    tok = pick(logits, i, done)
    out = out.at[:, i].set(tok)
    n_out = n_out + (~done).astype(jnp.int32)
    if lbuf is not None:
      lbuf = lbuf.at[:, i].set(logits)
    done = done | jnp.isin(tok, stops) | (n_out >= max_lengths)
    return i + 1, tok, caches, done, out, n_out, lbuf

  carry = (jnp.int32(1), tok, caches, done, out, n_out, lbuf)
  _, _, caches, _, out, n_out, lbuf = jax.lax.while_loop(cond, body, carry)
  return GenerateOutput(tokens=out, lengths=n_out, caches=caches, logits=lbuf)


@functools.lru_cache(maxsize=32)
def _compiled(graphdef, max_new, sampling, stop_tokens, pad_id, implementation, return_logits,
              prefill_chunk):
  fn = functools.partial(_generate_impl, graphdef=graphdef, max_new=max_new, sampling=sampling,
                         stop_tokens=stop_tokens, pad_id=pad_id, implementation=implementation,
                         return_logits=return_logits, prefill_chunk=prefill_chunk)
  return jax.jit(fn, donate_argnums=(4,))


def generate(model: Decoder, prompts: Int[Array, "B P"], prompt_lengths: Int[Array, "B"] | None = None,
             *, max_new_tokens: int, fmt: KVFormat | None = None,
             sampling: SamplingConfig = SamplingConfig(), stop_tokens: Sequence[int] = (),
             max_lengths: Int[Array, "B"] | None = None, rng: Array | None = None,
             capacity: int | None = None, caches=None, scales=None, pad_id: int = 0,
             implementation: str | Sequence[str] | None = None, return_logits: bool = False,
             prefill_chunk: int | None = None) -> GenerateOutput:
  """Generates up to `max_new_tokens` per sequence after right-padded `prompts`.

  Args:
    model: the decoder.
    prompts: ``[B, P]`` token ids, right-padded.
    prompt_lengths: ``[B]`` real prompt tokens (>= 1); default P.
    max_new_tokens: static size of the output buffer.
    fmt: cache format (default: the model's).
    sampling: greedy by default.
    stop_tokens: a sequence ends after emitting one of these.
    max_lengths: ``[B]`` per-sequence cap on generated tokens (<= max_new_tokens).
    rng: PRNG key for sampling.
    capacity: cache capacity (default P + max_new_tokens rounded up to a multiple of
      `kvjax.cache.VALUE_TILE` = 64 tokens, the GPU kernel's block and value tile: off that grid the
      Pallas kernel declines and decoding falls back to XLA; KIVI then rounds up to R).
    caches: caches to fill (donated); default fresh ones from `model.init_cache`.
    scales: static FP8 scales (`KVScales`) for fresh caches.
    pad_id: emitted after a sequence ends.
    implementation: decode backend(s) for `kvjax.dispatch`.
    return_logits: also return each generated position's logits ``[B, max_new, V]``.
    prefill_chunk: prefill the prompt in chunks of this many tokens (chunked prefill).
  """
  prompts = jnp.asarray(prompts, jnp.int32)
  if prompts.ndim != 2:
    raise ValueError(f"prompts must be [B, P], got shape {prompts.shape}")
  b, p = prompts.shape
  if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
    raise ValueError(f"max_new_tokens must be a positive int, got {max_new_tokens!r}")
  plen = jnp.full((b,), p, jnp.int32) if prompt_lengths is None else jnp.asarray(prompt_lengths, jnp.int32)
  if plen.shape != (b,):
    raise ValueError(f"prompt_lengths must have shape [B={b}], got {plen.shape}")
  if not isinstance(plen, jax.core.Tracer):
    pl = np.asarray(plen)
    if (pl < 1).any() or (pl > p).any():
      raise ValueError(f"prompt_lengths must be in [1, P={p}], got {pl}")
  mlen = (jnp.full((b,), max_new_tokens, jnp.int32) if max_lengths is None
          else jnp.minimum(jnp.asarray(max_lengths, jnp.int32), max_new_tokens))
  if prefill_chunk is not None and prefill_chunk < 1:
    raise ValueError(f"prefill_chunk must be a positive int or None, got {prefill_chunk!r}")
  if caches is None:
    grid = cache_lib.VALUE_TILE
    caches = model.init_cache(b, capacity or -(-(p + max_new_tokens) // grid) * grid, fmt, scales=scales)
  else:
    need = p + max_new_tokens
    if any(c.capacity < need for c in caches):
      raise ValueError(f"caches need capacity >= P + max_new_tokens = {need}, got "
                       f"{[c.capacity for c in caches]}")
  rng = jax.random.PRNGKey(0) if rng is None else rng
  impl = tuple(implementation) if isinstance(implementation, (list, tuple)) else implementation
  graphdef, state = nnx.split(model)
  fn = _compiled(graphdef, max_new_tokens, sampling, tuple(int(t) for t in stop_tokens), pad_id,
                 impl, return_logits, prefill_chunk)
  return fn(state, prompts, plen, mlen, tuple(caches), rng)


def forward_uncached(model: Decoder, tokens: Int[Array, "B T"]) -> Array:
  """Logits ``[B, T, V]`` of the plain causal forward pass (no cache)."""
  return model(jnp.asarray(tokens, jnp.int32))[0]


def greedy_uncached(model: Decoder, prompts: Int[Array, "B P"], prompt_lengths: Int[Array, "B"],
                    max_new_tokens: int) -> np.ndarray:
  """Greedy continuations ``[B, max_new_tokens]`` by re-running the plain uncached forward over
  the whole right-padded sequence at every step (the slow oracle; one compile)."""
  b, p = prompts.shape
  graphdef, state = nnx.split(model)
  fwd = jax.jit(lambda st, t: forward_uncached(nnx.merge(graphdef, st), t))
  seq = np.zeros((b, p + max_new_tokens), np.int32)
  seq[:, :p] = np.asarray(prompts)
  lens = np.asarray(prompt_lengths).copy()
  rows = np.arange(b)
  for _ in range(max_new_tokens):
    logits = np.asarray(fwd(state, jnp.asarray(seq)))
    seq[rows, lens] = logits[rows, lens - 1].argmax(-1)
    lens += 1
  return np.stack([seq[i, l - max_new_tokens:l] for i, l in enumerate(lens)])
