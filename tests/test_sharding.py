"""Sharded decode (cache + batch over an 8-device CPU mesh) equals unsharded.

The 8 virtual devices need XLA_FLAGS before jax starts, so the check runs in
a subprocess (tests/sharding_check.py) and the rest of the suite keeps one device.
"""

import os
import subprocess
import sys

import jax
import pytest
from jax.sharding import PartitionSpec as P

from kvjax import formats, sharding
from kvjax.cache import init_cache


def test_sharded_decode_matches_unsharded_on_8_cpu_devices():
  here = os.path.dirname(__file__)
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             PYTHONPATH=os.path.dirname(here) + os.pathsep + os.environ.get("PYTHONPATH", ""))
  r = subprocess.run([sys.executable, os.path.join(here, "sharding_check.py")], env=env,
                     capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
  assert "OK" in r.stdout


def test_cache_shardings_specs_and_errors():
  mesh = jax.make_mesh((1, 1), ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
  c = init_cache(formats.fp8("e4m3", "channel", "head"), 2, 4, 8, 16)
  sh = sharding.cache_shardings(c, mesh)
  assert sh.k.codes.spec == P("data", "model", None, None)
  assert sh.k.scale.spec == P(None, "model", None, None)  # static [1, K, 1, H]
  assert sh.lengths.spec == P("data")
  stacked = init_cache(formats.int8(), 2, 4, 8, 16, num_layers=3)
  assert sharding.cache_shardings(stacked, mesh).k.codes.spec == P(None, "data", "model", None, None)
  # Divisibility is checked with a clear message (a 1x1 mesh divides everything, so fake one).
  class FakeMesh:
    shape = {"data": 2, "model": 3}
  with pytest.raises(ValueError, match=r"num_kv_heads \(4\) must be divisible .* 'model' \(3\)"):
    sharding.cache_shardings(c, FakeMesh())
