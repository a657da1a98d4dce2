"""Run by tests/test_sharding.py in a subprocess with 8 virtual CPU devices.

Decodes with a small GQA decoder twice: unsharded, and with the caches and
the batch sharded over a (data=2, model=4) mesh (4 KV heads over "model"),
and checks logits and caches agree and that the caches stay sharded.
"""

import os

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from kvjax import formats, sharding  # noqa: E402
from kvjax.cache import materialize  # noqa: E402
from kvjax.models import config, decoder  # noqa: E402


def main():
  assert jax.device_count() == 8, jax.devices()
  cfg = config.gemma2_config(vocab_size=64, embed_dim=64, hidden_dim=96, num_layers=2, num_heads=8,
                             num_kv_heads=4, head_dim=16, sliding_window=6, query_pre_attn_scalar=16,
                             tie_embeddings=False)
  model = decoder.Decoder(cfg, rngs=nnx.Rngs(0))
  graphdef, state = nnx.split(model)
  mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
  b, p, steps = 4, 10, 3
  prompts = jax.random.randint(jax.random.PRNGKey(1), (b, p), 0, cfg.vocab_size)
  plen = jnp.array([10, 7, 3, 9], jnp.int32)

  def prefill(state, toks, caches, n):
    return nnx.merge(graphdef, state)(toks, caches, num_new=n)

  def step(state, tok, caches):
    logits, caches = nnx.merge(graphdef, state)(tok[:, None], caches)
    return logits[:, 0], caches

  for fmt in (formats.bf16(), formats.kivi(2, 16, 16, name="kivi2_small")):
    def run(shard):
      caches = model.init_cache(b, 32, fmt)
      pre, stp = jax.jit(prefill), jax.jit(step, donate_argnums=(2,))
      toks, n = prompts, plen
      if shard:
        csh = sharding.cache_shardings(caches, mesh)
        caches = sharding.shard_caches(caches, mesh)
        toks = jax.device_put(prompts, sharding.batch_sharding(mesh, 2))
        n = jax.device_put(plen, sharding.batch_sharding(mesh, 1))
        lsh = sharding.batch_sharding(mesh, 2)
        pre = jax.jit(prefill, out_shardings=(sharding.batch_sharding(mesh, 3), csh))
        stp = jax.jit(step, donate_argnums=(2,), out_shardings=(lsh, csh))
      logits, caches = pre(state, toks, caches, n)
      tok = jnp.argmax(jnp.take_along_axis(logits, (n - 1)[:, None, None], 1)[:, 0], -1)
      outs = []
      for _ in range(steps):
        lg, caches = stp(state, tok, caches)
        outs.append(lg)
        tok = jnp.argmax(lg, -1)
      return jnp.stack(outs, 1), caches

    ref, ref_c = run(False)
    got, got_c = run(True)
    np.testing.assert_allclose(np.asarray(got), np.asarray(ref), rtol=1e-5, atol=1e-5)
    for a, c in zip(ref_c, got_c):
      for x, y in zip(materialize(a), materialize(c)):
        np.testing.assert_allclose(np.asarray(y), np.asarray(x), rtol=1e-5, atol=1e-5)
      np.testing.assert_array_equal(np.asarray(c.lengths), np.asarray(a.lengths))
    spec = got_c[0].k.codes.sharding.spec
    assert tuple(spec)[:2] == ("data", "model"), spec
    assert len(got_c[0].k.codes.sharding.device_set) == 8
    assert got_c[0].lengths.sharding.spec[0] == "data"
    print(f"{fmt.name}: sharded == unsharded, cache spec {spec}")
  print("OK")


if __name__ == "__main__":
  main()
