"""Session 8, device call 3: which writer differs in test_append_inplace_matches_append[kivi2] on the
H200 (it failed in call 1): the XLA append eager vs jitted vs the one-kernel append (in-kernel flush),
each leaf compared bit for bit against the eager XLA append."""
import jax
import jax.numpy as jnp
import numpy as np

from kvjax import cache as cache_lib, dispatch
from pallas_kernels import test_base
from pallas_kernels.gpu import write

_, c = test_base.make_case("kivi2", [0, 127, 200])
k = jax.random.normal(jax.random.PRNGKey(1), (3, 2, 2, 128))
want = cache_lib.append(c, k, -k)
names = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(want)[0]]
runs = {
    "xla_jit": jax.jit(cache_lib.append)(c, k, -k),
    "pallas_eager": write.append(c, k, -k),
    "pallas_no_flush_in_kernel": write.append(c, k, -k, flush_in_kernel=False),
    "append_inplace": write.append_inplace(jax.tree_util.tree_map(jnp.copy, c), k, -k),
    "dispatch_xla_jit": write.append_inplace(jax.tree_util.tree_map(jnp.copy, c), k, -k, implementation="xla"),
}
for name, got in runs.items():
  bad = []
  for n, a, b in zip(names, jax.tree_util.tree_leaves(want), jax.tree_util.tree_leaves(got)):
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    if not np.array_equal(a, b):
      idx = np.argwhere(a != b)
      bad.append(f"{n}: {len(idx)} differ, first {idx[0].tolist()} {a[tuple(idx[0])]} vs {b[tuple(idx[0])]}")
  print(name, "bit-identical" if not bad else "DIFFERS", *bad, sep="\n  ")
