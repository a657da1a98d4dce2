"""TPU (Pallas Mosaic) decode kernel, proven on CPU (DESIGN.md section 5).

* Interpret mode (`pltpu.InterpretParams`, race detection on, uninitialized
  memory poisoned with NaN) against the XLA reference, every format. The
  "ragged" batch holds lengths 0, 1, partial/full KIVI windows and full
  capacity in one call; the slow race-detected interpreter therefore runs it
  once per format, plus all-zero / all-one / all-full batches for bf16.
* Lowering for the TPU platform on this CPU machine: the text holds the
  Mosaic `tpu_custom_call` (plain, and under a TPU v5e / v6e abstract mesh).
* Fallback: shapes/formats outside the kernel's rules decline with
  NotImplementedError and `kvjax.dispatch` answers with the reference.
"""

from __future__ import annotations

import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu
from jax._src.pallas.mosaic.interpret import interpret_pallas_call as _ipc

from kvjax import attention, cache as cache_lib, dispatch, formats
from pallas_kernels import test_base
from pallas_kernels.test_base import ALL_FORMATS, LENGTHS, DecodeAttentionTestBase
import pallas_kernels.tpu as tpu_kernels

INTERPRET = pltpu.InterpretParams(detect_races=True, uninitialized_memory="nan")
FAST_INTERPRET = pltpu.InterpretParams(uninitialized_memory="nan")


def _run(q, cache, interpret=INTERPRET, **options):
  out = tpu_kernels.decode_attention(q, cache, interpret=interpret, **options)
  out = jax.block_until_ready(out)
  if interpret.detect_races:
    assert _ipc.races is not None and not _ipc.races.races_found, "data race in the TPU kernel"
  return out


@functools.lru_cache(maxsize=None)
def _case(fmt_name, lengths, value_tile=0):
  return test_base.make_case(fmt_name, list(lengths), value_tile=value_tile)


class TestTPUKernelInterpret(DecodeAttentionTestBase):
  """The shared test base, run through the TPU kernel in interpret mode."""

  NUM_QUERIES = (3,)
  VALUE_TILES = (0,)  # the GPU's tiled value layout is declined (test_tiled_values_declined)

  def attention(self, q, cache, **options):
    return _run(q, cache, **options)

  def _check(self, fmt_name, lengths, num_queries=1, rep=4, num_kv_heads=2, value_tile=0, **options):
    # The base's checks, with caches built once per (format, lengths) and shared across tests:
    # building KIVI caches token by token is the slow part on CPU. GQA shapes and several
    # query tokens only change q, so they reuse the cache with a fresh q.
    q0, cache = _case(fmt_name, tuple(lengths), value_tile)
    assert num_kv_heads == cache.num_kv_heads
    if (num_queries, rep) != (1, 4):
      shape = (len(lengths), num_kv_heads * rep, num_queries, cache.head_dim)
      q0 = jax.random.normal(jax.random.PRNGKey(7), shape).astype(jnp.bfloat16)
    q = q0
    ref = np.asarray(attention.decode_attention(q.astype(jnp.float32), cache, **options), np.float32)
    out = np.asarray(self.attention(q, cache, **options), np.float32)
    assert out.shape == q.shape and np.isfinite(out).all()
    for b, length in enumerate(lengths):
      if length == 0:
        np.testing.assert_allclose(out[b], 0.0, atol=1e-6)
      else:
        visible = [i for i in range(num_queries) if length - num_queries + i >= 0]
        err = test_base.relative_error(out[b][:, visible], ref[b][:, visible])
        assert err < self.RTOL, f"{fmt_name} seq {b} (length {length}): rel err {err:.2e}"

  # Race-detected interpretation is slow: one ragged batch per format (it holds 0, 1, ragged
  # and full lengths), plus the uniform batches for bf16.
  @pytest.mark.parametrize("fmt_name,lengths",
                           [(f, "ragged") for f in ALL_FORMATS]
                           + [("bf16", "zero"), ("bf16", "one"), ("bf16", "full")])
  def test_matches_reference(self, fmt_name, lengths):
    self._check(fmt_name, LENGTHS[lengths])

  @pytest.mark.parametrize("fmt_name", ["int4", "kivi2"])
  def test_several_queries(self, fmt_name):
    self._check(fmt_name, LENGTHS["ragged"], num_queries=3)

  @pytest.mark.parametrize("rep", [1, 8])
  def test_gqa_shapes(self, rep):
    self._check("kivi4", LENGTHS["ragged"], rep=rep)

  def test_options(self):
    self._check("fp8_e4m3", LENGTHS["ragged"], sm_scale=0.05, logit_softcap=5.0, window=100)


def _filled(fmt_name, lengths, capacity, seed=1):
  """A cache filled by one jitted prefill (cheaper than the token-by-token base case)."""
  fmt = formats.preset(fmt_name)
  b, kh, h = len(lengths), 2, 128
  k1, k2, k3 = jax.random.split(jax.random.PRNGKey(seed), 3)
  cache = cache_lib.init_cache(fmt, b, kh, capacity, h)
  k = test_base.outlier_kv(k1, (b, kh, capacity, h))
  v = jax.random.normal(k2, (b, kh, capacity, h))
  cache = jax.jit(cache_lib.append)(cache, k, v, jnp.asarray(lengths, jnp.int32))
  q = jax.random.normal(k3, (b, kh * 4, 1, h)).astype(jnp.bfloat16)
  return q, cache


@pytest.mark.parametrize("fmt_name,block", [("kivi2", 512), ("int4", 512)])
def test_multi_block(fmt_name, block):
  """Packed formats streamed over 2 blocks (capacity 1024), blocks clamped past each length."""
  lengths = [0, 600, 1024]
  q, cache = _filled(fmt_name, lengths, 1024)
  assert tpu_kernels.make_plan(q, cache, block_size=block).num_blocks == 2
  ref = np.asarray(attention.decode_attention(q.astype(jnp.float32), cache), np.float32)
  out = np.asarray(_run(q, cache, block_size=block), np.float32)
  np.testing.assert_allclose(out[0], 0.0, atol=1e-6)
  for b in range(1, len(lengths)):
    assert test_base.relative_error(out[b], ref[b]) < 1e-2, b


def test_no_recompile_per_step():
  """Lengths are scalar-prefetched arrays: a new step reuses the compiled kernel."""
  q, cache = _case("int8", tuple(LENGTHS["ragged"]))
  f = jax.jit(functools.partial(tpu_kernels.decode_attention, interpret=FAST_INTERPRET))
  f(q, cache)
  f(q, cache.replace(lengths=jnp.maximum(cache.lengths - 1, 0)))
  assert f._cache_size() == 1


# ---- lowering for the TPU platform --------------------------------------------------------

def _abstract_case(fmt_name, batch=2, kv_heads=2, rep=4, capacity=1024, head_dim=128):
  fmt = formats.preset(fmt_name)
  cache = jax.eval_shape(lambda: cache_lib.init_cache(fmt, batch, kv_heads, capacity, head_dim))
  q = jax.ShapeDtypeStruct((batch, kv_heads * rep, 1, head_dim), jnp.bfloat16)
  return q, cache


def _lowered_text(fmt_name, **kw) -> str:
  q, cache = _abstract_case(fmt_name, **kw)
  f = jax.jit(lambda q, c: tpu_kernels.decode_attention(q, c))
  return f.trace(q, cache).lower(lowering_platforms=("tpu",)).as_text()


@pytest.mark.parametrize("fmt_name", ALL_FORMATS)
def test_lowers_for_tpu(fmt_name):
  text = _lowered_text(fmt_name)
  assert "tpu_custom_call" in text
  assert f"kvjax_decode_" in text


@pytest.mark.parametrize("device_kind", ["TPU v5 lite", "TPU v6 lite"])
@pytest.mark.parametrize("fmt_name", ["fp8_e4m3", "int4", "kivi2"])
def test_lowers_for_tpu_chip(fmt_name, device_kind):
  """Under an abstract mesh naming the chip, as a chip-dependent lowering rule would need."""
  dev = jax.sharding.AbstractDevice(device_kind=device_kind, num_cores=1, platform="tpu")
  mesh = jax.sharding.AbstractMesh((1,), ("x",), abstract_device=dev)
  with jax.sharding.use_abstract_mesh(mesh):
    assert "tpu_custom_call" in _lowered_text(fmt_name, capacity=32768)


# ---- fallback ---------------------------------------------------------------------------

def _small(fmt, head_dim=128, capacity=256, num_layers=None, value_tile=0):
  cache = cache_lib.init_cache(fmt, 2, 2, capacity, head_dim, num_layers=num_layers,
                               value_tile=value_tile)
  q = jnp.ones((2, 4, 1, head_dim), jnp.bfloat16)
  return q, cache


@pytest.mark.parametrize("what", ["head_dim_64", "float16_residual", "stacked", "capacity_200",
                                  "mixed_families", "tiled_values"])
def test_declines_with_reason(what):
  if what == "head_dim_64":
    q, cache = _small(formats.int8(), head_dim=64)
  elif what == "float16_residual":
    q, cache = _small(formats.KVFormat(
        name="kivi2_f16", key=formats.KIVISpec(bits=2, axis="token"),
        value=formats.KIVISpec(bits=2, axis="channel"), residual=128, residual_dtype="float16"))
  elif what == "stacked":
    q, cache = _small(formats.int8(), num_layers=2)
  elif what == "capacity_200":
    q, cache = _small(formats.int8(), capacity=200)
  elif what == "tiled_values":  # the GPU's default value layout
    q, cache = _small(formats.fp8(), value_tile=64)
  else:
    q, cache = _small(formats.KVFormat(name="mix", key=formats.IntSpec(bits=8),
                                       value=formats.IntSpec(bits=4)))
  with pytest.raises(NotImplementedError):
    tpu_kernels.decode_attention(q, cache, interpret=FAST_INTERPRET)


def test_dispatch_falls_back_with_warning():
  q, cache = _case("kivi2", tuple(LENGTHS["ragged"]))
  ref = attention.decode_attention(q, cache)
  # Off-TPU without interpret=: declines, the reference answers, and says so.
  with pytest.warns(UserWarning, match="pallas_tpu"):
    out = dispatch.decode_attention(q, cache, implementation=("pallas_tpu", "xla"),
                                    warn_on_fallback=True)
  np.testing.assert_array_equal(np.asarray(out, np.float32), np.asarray(ref, np.float32))
  assert "pallas_tpu" in dispatch.implementations()


def test_dispatch_selects_kernel():
  q, cache = _case("int8", tuple(LENGTHS["ragged"]))
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    out = dispatch.decode_attention(q, cache, implementation="pallas_tpu",
                                    interpret=FAST_INTERPRET)
  ref = attention.decode_attention(q.astype(jnp.float32), cache)
  assert test_base.relative_error(out[1:], ref[1:]) < 1e-2
