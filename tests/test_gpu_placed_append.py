"""The one-kernel writer placing a decode append's rows from the lengths (`write.append`'s default where every
sequence adds all its T tokens, `write_rows(lengths_before=...)`): bit for bit the rows XLA places, at the edge
lengths (empty, a key block's end, capacity), with no XLA op between the cache's lengths and the kernel.
Interpreted on CPU, compiled on a GPU."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend.core import Var

from kvjax import cache as cache_lib, formats
from pallas_kernels import test_base
from pallas_kernels.gpu import write

INTERPRET = jax.default_backend() != "gpu"
CAP = 512
# format, KIVI layout, value tile (FP8 / INT8 value codes in tiles of that many tokens; 0 token-major)
CASES = {"kivi2_g128+words": ("kivi2_g128", "words", 0), "kivi2+words": ("kivi2", "words", 0),
         "kivi4": ("kivi4", "", 0), "kivi2_r256+words": (formats.kivi(2, 128, 256), "words", 0),
         "fp8_e4m3+tile64": ("fp8_e4m3", None, 64), "int8": ("int8", None, 0), "int4": ("int4", None, 0)}
LENGTHS = [0, 1, 127, 128, 254, 255, CAP - 2, CAP - 1, CAP]  # T = 3 at CAP - 2: 2 tokens fit; at CAP: none


def _cache(name):
  fmt, layout, tile = CASES[name]
  fmt = formats.preset(fmt) if isinstance(fmt, str) else fmt
  n = len(LENGTHS)
  kw = {"kivi_layout": layout} if fmt.is_kivi else {"value_tile": tile}
  c = cache_lib.init_cache(fmt, n, 2, CAP, 128, **kw)
  x = jax.random.normal(jax.random.PRNGKey(0), (n, 2, CAP, 128)) * jnp.linspace(0.2, 3, 128)
  return jax.jit(cache_lib.append)(c, x, -x, jnp.asarray(LENGTHS))


@pytest.mark.parametrize("name,t", [(n, 1) for n in CASES] + [("kivi2_g128+words", 3), ("fp8_e4m3+tile64", 3)])
def test_placed_append_equals_xla(name, t):
  """T = 1 and 3 new tokens (num_new None) at every edge length: the placed writer == the writer given XLA's
  positions == XLA's scatters, bit for bit, twice in a row (under jit: past the capacity is dropped)."""
  fmt = CASES[name][0]
  if not INTERPRET and CASES[name][1] == "words" and "kivi4" in str(fmt):
    pytest.skip("4-bit words natively: covered by test_gpu_flush")
  c = _cache(name)
  np.testing.assert_array_equal(np.asarray(c.lengths), LENGTHS)
  ref = jax.jit(cache_lib.append)
  placed = jax.jit(lambda c_, k_, v_: write.append(c_, k_, v_, interpret=INTERPRET))
  given = jax.jit(lambda c_, k_, v_: write.append(c_, k_, v_, interpret=INTERPRET, positions_in_kernel=False))
  want = got = gvn = c
  for i in range(2):
    k = jax.random.normal(jax.random.PRNGKey(1 + i), (len(LENGTHS), 2, t, 128)).astype(jnp.bfloat16)
    want, got, gvn = ref(want, k, 0.5 * k), placed(got, k, 0.5 * k), given(gvn, k, 0.5 * k)
    test_base.assert_same_bits(want, gvn)
    test_base.assert_same_bits(want, got)
  np.testing.assert_array_equal(np.asarray(got.lengths), np.minimum(np.asarray(LENGTHS) + 2 * t, CAP))


def _readers(jaxpr, var):
  return [e for e in jaxpr.eqns if any(isinstance(v, Var) and v is var for v in e.invars)]


@pytest.mark.parametrize("name", ["kivi2_g128+words", "fp8_e4m3+tile64"])
def test_placed_append_reads_the_lengths_alone(name):
  """After dead-code elimination the kernel's call is the only op reading the cache's lengths, and the new
  lengths are its output: a decode append is one launch. With XLA's positions, XLA ops read them first."""
  from jax._src.interpreters import partial_eval as pe  # noqa: PLC0415 (dce_jaxpr: not public)

  c = _cache(name)
  k = jnp.ones((len(LENGTHS), 2, 1, 128), jnp.bfloat16)
  lengths_at = next(i for i, x in enumerate(jax.tree_util.tree_leaves(c)) if x is c.lengths)
  for placed in (True, False):
    f = lambda leaves, k_: jax.tree_util.tree_leaves(write.append(
        jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(c), leaves), k_, k_, interpret=True,
        positions_in_kernel=placed))
    closed = jax.make_jaxpr(f)(jax.tree_util.tree_leaves(c), k)
    jaxpr, _ = pe.dce_jaxpr(closed.jaxpr, [True] * len(closed.jaxpr.outvars))
    readers = _readers(jaxpr, jaxpr.invars[lengths_at])
    calls = [e for e in readers if e.params.get("name") == "_launch"]
    if placed:
      assert len(readers) == 1 and len(calls) == 1, [e.primitive.name for e in readers]
      assert jaxpr.outvars[lengths_at] is calls[0].outvars[-1]
    else:
      assert not calls and readers, [e.primitive.name for e in readers]


def test_placed_append_validation():
  c = _cache("kivi2_g128+words")
  k = jnp.ones((len(LENGTHS), 2, 1, 128), jnp.bfloat16)
  with pytest.raises(ValueError, match="positions_in_kernel=True needs num_new=None"):
    write.append(c, k, k, jnp.ones((len(LENGTHS),), jnp.int32), interpret=True, positions_in_kernel=True)
  sink = cache_lib.init_cache(formats.kivi(2, 32, 128, sink=4), 2, 2, 256, 128)
  with pytest.raises(ValueError, match="sink=4"):
    write.append(sink, k[:2], k[:2], interpret=True, positions_in_kernel=True)
  rows = lambda c_, w: write.write_rows(c_, w, interpret=True, lengths_before=jnp.zeros((3,), jnp.int32))
  with pytest.raises(ValueError, match=r"lengths_before must have shape \[B=9\], got \(3,\)"):
    cache_lib.append(c.replace(lengths=jnp.zeros_like(c.lengths)), k, k, write_rows=rows)
  # the sink format's default: its positions from XLA, the same rows
  x = jnp.ones((2, 2, 1, 128), jnp.bfloat16)
  test_base.assert_same_bits(cache_lib.append(sink, x, x), write.append(sink, x, x, interpret=True))
