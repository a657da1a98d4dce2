"""The KIVI key flush inside the GPU write kernel (`pallas_kernels/gpu/flush.py`) and the "words" appends
against `kvjax.cache`'s XLA scatters, bit for bit, in interpret mode on CPU (natively on a GPU); `flush.py`'s
lowerable rounding helpers against `kvjax.quant`'s."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kvjax import cache as cache_lib, formats
from pallas_kernels import test_base
from pallas_kernels.gpu import write

INTERPRET = jax.default_backend() != "gpu"


KIVI_FLUSH_FORMATS = {"kivi2": formats.preset("kivi2"), "kivi4": formats.preset("kivi4"),
                      "kivi2_g128": formats.preset("kivi2_g128"), "kivi4_sink3": formats.kivi(4, 32, 128, sink=3),
                      # "words" (`QArray.layout`): key blocks packed per token row, value codes into their bit
                      # planes; R = 256 is two key groups a block; 4-bit: 4 codes a word, two word tiles a row
                      "kivi2_g128+words": formats.preset("kivi2_g128"),
                      "kivi2_g128_sink3+words": formats.kivi(2, 128, 128, sink=3),
                      "kivi2_g128_r256+words": formats.kivi(2, 128, 256),
                      "kivi4+words": formats.preset("kivi4"), "kivi4_g128+words": formats.kivi(4, 128, 128),
                      # head_dim 256 (Gemma 2; session 28): 16 key slabs a row, value tiles of 256 channel rows
                      "kivi2_g128+words+h256": formats.preset("kivi2_g128"), "kivi2+words+h256": formats.preset("kivi2"),
                      "kivi4+words+h256": formats.preset("kivi4"), "kivi4_g128+words+h256": formats.kivi(4, 128, 128)}


def _skip_native_words(fmt, words, head_dim=128):
  if words and not INTERPRET and fmt.key.bits not in write.NATIVE_WORDS_BITS:
    pytest.skip(f"{fmt.key.bits}-bit words: the compiled writer is held back (write.NATIVE_WORDS_BITS)")
  if words and not INTERPRET and head_dim != 128 and fmt.key.group_size not in write.NATIVE_WIDE_WORDS_GROUPS:
    pytest.skip(f"head_dim {head_dim} at G={fmt.key.group_size}: held back (write.NATIVE_WIDE_WORDS_GROUPS)")


def _stale_words(c):
  """A "words" cache over reused buffers: random code bits a writer must replace, not OR into."""
  bits = lambda a: jax.random.bits(jax.random.key(a.size), a.shape, jnp.uint16)
  return c.replace(k=c.k.replace(codes=bits(c.k.codes)), v=c.v.replace(codes=bits(c.v.codes)))


@pytest.mark.parametrize("fmt_name", list(KIVI_FLUSH_FORMATS))
def test_pallas_kivi_key_flush_equals_xla(fmt_name):
  """The in-kernel KIVI key flush (`flush.py`) == `cache.flush_rows` + XLA scatters, bit for bit:
  T = 1 and T = 3 (ragged num_new) across block ends 127 -> 128 and 255 -> 256, a block completed
  by a middle token of T = 3, a sink block, and capacity drops at S = 384 (under jit)."""
  fmt, words = KIVI_FLUSH_FORMATS[fmt_name], "+words" in fmt_name
  h = 256 if fmt_name.endswith("+h256") else 128
  _skip_native_words(fmt, words, h)
  c = cache_lib.init_cache(fmt, 6, 2, 384 + 128 * (fmt.residual > 128), h, kivi_layout="words" if words else "")
  c = _stale_words(c) if words else c
  s_cap = c.capacity
  x = jax.random.normal(jax.random.PRNGKey(0), (6, 2, s_cap, h)) * jnp.linspace(0.1, 4, h)
  c = cache_lib.append(c, x, -x, jnp.asarray([0, 127, 126, 255, 254, s_cap - 1]))
  ref = lambda c_, k_, n_: cache_lib.append(c_, k_, k_ * 0.25, n_)
  # natively, where the in-kernel flush is too slow to compile (write.IN_KERNEL_FLUSH_SLOW), the default writer
  # (XLA quantizes the key block, the kernel stores it) is the one checked
  slow = not INTERPRET and (fmt.key.group_size, h) in write.IN_KERNEL_FLUSH_SLOW
  pal = lambda c_, k_, n_: write.append(c_, k_, k_ * 0.25, n_, interpret=INTERPRET,
                                        flush_in_kernel=None if slow else True)
  want = got = c
  steps = [(1, None), (3, [3, 2, 3, 1, 3, 2]), (1, [1, 0, 1, 1, 1, 1]), (3, [0, 3, 1, 3, 2, 3])]
  for i, (t, n) in enumerate(steps):
    k = jax.random.normal(jax.random.PRNGKey(10 + i), (6, 2, t, h)) * (1 + 3 * (i % 2))
    n = None if n is None else jnp.asarray(n)
    jit = i >= 1  # past capacity: an error eagerly, dropped under jit
    want = (jax.jit(ref) if jit else ref)(want, k, n)
    got = (jax.jit(pal) if jit else pal)(got, k, n)
    test_base.assert_same_bits(want, got)
  np.testing.assert_array_equal(np.asarray(got.lengths), [5, 133, 132, 261, 261, s_cap])
  # every sequence but the first crossed a block end (the last at capacity): the flushed blocks hold codes
  flushed = [False] + [True] * 5 if fmt.residual == 128 else [False, False, False, True, True, True]
  changed = np.asarray(got.k.codes != c.k.codes).reshape(6, -1).any(1)
  np.testing.assert_array_equal(changed, flushed)


@pytest.mark.parametrize("fmt,h", [(formats.preset("kivi2_g128"), 128), (formats.kivi(4, 128, 128), 128),
                                   (formats.preset("kivi2_g128"), 256)], ids=["kivi2", "kivi4", "kivi2_h256"])
def test_pallas_append_words_planes_share_words(fmt, h, monkeypatch):
  """T = 20 tokens in one "words" append: tokens 16 apart share value words (other bit planes), so each store
  keeps the others' bits; == XLA scatters, bit for bit (the kernel: natively `write_rows` refuses T > 16 at 4 bits)."""
  _skip_native_words(fmt, True)
  monkeypatch.setattr(write, "NATIVE_WORDS4_MAX_TOKENS", 64)
  c = _stale_words(cache_lib.init_cache(fmt, 2, 1, 256, h, kivi_layout="words"))
  x = jax.random.normal(jax.random.PRNGKey(0), (2, 1, 128, h))
  c = cache_lib.append(c, x, x, jnp.asarray([3, 110]))  # the second crosses a tile (and key block) end
  y = jax.random.normal(jax.random.PRNGKey(1), (2, 1, 20, h))
  rows = lambda c_, w: write.write_rows(c_, w, interpret=INTERPRET)
  test_base.assert_same_bits(cache_lib.append(c, y, -y, jnp.asarray([20, 19])),
                    cache_lib.append(c, y, -y, jnp.asarray([20, 19]), write_rows=rows))


def test_flush_helpers_match_quant():
  """`flush.py`'s lowerable nextafter / round_down / step_for / div_round == `kvjax.quant`'s."""
  from kvjax import quant
  from pallas_kernels.gpu import flush
  rng = np.random.default_rng(0)
  x = np.concatenate([rng.standard_normal(4000) * 10.0 ** rng.integers(-8, 5, 4000),
                      [0.0, -0.0, 1e-40, -1e-40, 3e-39, 1.0, -1.0, 2 ** -126, 65504.0]]).astype(np.float32)
  x = jnp.asarray(x)
  for dt in (jnp.bfloat16, jnp.float16, jnp.float32):
    r = x.astype(dt)
    for up in (True, False):
      want = jnp.nextafter(r, jnp.array(jnp.inf if up else -jnp.inf, dt))
      np.testing.assert_array_equal(np.asarray(flush._next(r, up)).view(np.uint8), np.asarray(want).view(np.uint8))
    np.testing.assert_array_equal(np.asarray(flush.round_down(x, dt)).view(np.uint8),
                                  np.asarray(quant.round_down(x, dt)).view(np.uint8))
    span = jnp.abs(x)
    for qmax in (3, 15):
      np.testing.assert_array_equal(np.asarray(flush.step_for(span, qmax, dt)).view(np.uint8),
                                    np.asarray(quant.step_for(span, qmax, dt)).view(np.uint8))
  s = quant.step_for(jnp.abs(x[:1000]) + 1e-3, 3, jnp.bfloat16).astype(jnp.float32)
  t = jnp.abs(x[1000:2000]) % (3.5 * s)
  ties = (jnp.arange(1000) % 8 * 0.5) * s  # exact halves: round half to even
  for tt in (t, ties):
    np.testing.assert_array_equal(np.asarray(flush.div_round(tt, s)), np.asarray(quant.div_round(tt, s)))


def test_writer_traced_once_across_layers():
  """A program appending to several layers' caches of one configuration holds the writer's kernel once
  (`write._launch` under jit: session 29's 32-layer generate program traced it 64 times, 27 s on the H100's
  host): every append is a call of the same jitted function with the same jaxpr; another format adds one more."""
  mk = lambda name: cache_lib.init_cache(formats.preset(name), 2, 2, 256, 128, kivi_layout="words")
  caches = [mk("kivi2_g128") for _ in range(3)] + [mk("kivi2")]
  x = jnp.ones((2, 2, 1, 128), jnp.bfloat16)

  def step(cs):
    return [write.append(c, x, x, interpret=True) for c in cs]
  jaxpr = jax.make_jaxpr(step)(caches).jaxpr
  calls = [e for e in jaxpr.eqns if e.primitive.name in ("pjit", "jit") and e.params["name"] == "_launch"]
  assert len(calls) == 4, [e.primitive.name for e in jaxpr.eqns]
  inner = [c.params["jaxpr"] for c in calls]
  assert inner[0] is inner[1] is inner[2] and inner[3] is not inner[0]
  assert sum(e.primitive.name == "pallas_call" for e in inner[0].jaxpr.eqns) == 1
