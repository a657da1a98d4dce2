"""The query reaches the GPU decode kernels unscaled and unpadded (`decode.load_q` scales it and pads
its rows inside the kernel, session 10): no XLA pad or multiply before the Pallas call; an array
`sm_scale` (not a Python number) and static FP8 keys fall back to XLA's scaling, with equal results."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels import test_base
from pallas_kernels.gpu import decode, lowering_check, ops

INTERPRET = jax.default_backend() != "gpu"


def _hlo(q, c, **kw):
  fn = jax.jit(lambda q, c: ops.decode_attention(q, c, interpret=False, pallas_merge=True, **kw))
  with lowering_check.triton_modules():  # lowers for an H200 without a GPU
    return fn.trace(q, c).lower(lowering_platforms=("cuda",)).as_text()


@pytest.mark.parametrize("fmt_name,rep", [("fp8_e4m3", 4), ("kivi2_g128", 3)])
def test_no_xla_query_prep_before_the_kernel(fmt_name, rep):
  q, c = test_base.make_case(fmt_name, [40, 7], rep=rep)
  text = _hlo(q, c)
  before = text[:text.index("custom_call")]  # everything up to the decode kernel's call
  assert "stablehlo.pad" not in before and "stablehlo.multiply" not in before


def test_static_fp8_keys_scale_the_query_in_xla():
  """The check above can fail: static FP8 keys' per-channel scale multiplies q in XLA."""
  q, c = test_base.make_case("fp8_e4m3_static", [40, 7])
  text = _hlo(q, c)
  assert "stablehlo.multiply" in text[:text.index("custom_call")]


@pytest.mark.parametrize("fmt_name,kw", [("fp8_e4m3", {}), ("int8", {"logit_softcap": 30.0}),
                                         ("kivi2_g128", {})])
def test_array_sm_scale_equals_python_scale(fmt_name, kw):
  q, c = test_base.make_case(fmt_name, [40, 0, 7], rep=3, num_queries=1)
  a = ops.decode_attention(q, c, sm_scale=0.1, interpret=INTERPRET, **kw)
  b = jax.jit(lambda s: ops.decode_attention(q, c, sm_scale=s, interpret=INTERPRET, **kw))(jnp.float32(0.1))
  np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), rtol=1e-5, atol=1e-6)


def test_padded_rows():
  assert [decode.padded_rows(r) for r in (1, 2, 4, 12, 16, 17, 32)] == [16, 16, 16, 16, 16, 32, 32]
