"""`implementation=` selection for decode attention and the cache append, tokamax style.

An implementation is a callable ``fn(q, cache, **options) -> out`` that raises
`NotImplementedError` (with the reason) for inputs it cannot handle. Given a
name or a sequence of names, they are tried in order; the XLA reference
accepts everything, so the default order always ends in an answer.

Kernel packages register themselves with `register`; importing
`pallas_kernels` registers "pallas_gpu" and "pallas_tpu" when present.
`append` picks the cache writer the same way (`register_append`): "xla"
(`kvjax.cache.append`, XLA scatters) or a kernel that stores all of an
append's rows in one launch.
"""

from __future__ import annotations

import warnings
from typing import Callable, Sequence

import jax

from kvjax import attention
from kvjax import cache as cache_lib

__all__ = ["register", "register_append", "implementations", "decode_attention", "append",
           "default_order"]

_REGISTRY: dict[str, Callable] = {"xla": attention.decode_attention}
_APPEND: dict[str, Callable] = {"xla": cache_lib.append}
_PLATFORM_DEFAULTS = {"gpu": ("pallas_gpu", "xla"), "tpu": ("pallas_tpu", "xla")}


def register(name: str, fn: Callable) -> None:
  """Registers a decode-attention implementation under `name`."""
  _REGISTRY[name] = fn


def register_append(name: str, fn: Callable) -> None:
  """Registers a cache writer ``fn(cache, k, v, num_new) -> cache`` under `name`."""
  _APPEND[name] = fn


def implementations() -> tuple[str, ...]:
  _load_kernels()
  return tuple(_REGISTRY)


def _load_kernels() -> None:
  try:
    import pallas_kernels  # noqa: F401  (registers its backends)
  except ImportError:  # kernels are optional
    pass


def default_order(platform: str | None = None) -> tuple[str, ...]:
  platform = platform or jax.default_backend()
  return _PLATFORM_DEFAULTS.get(platform, ("xla",))


def _order(implementation, registry) -> tuple[str, ...]:
  order = default_order() if implementation is None else (
      (implementation,) if isinstance(implementation, str) else tuple(implementation))
  if not order:
    raise ValueError("implementation must name at least one backend, got an empty sequence")
  unknown = [n for n in order if n not in registry]
  if unknown and implementation is not None:
    raise ValueError(f"unknown implementation(s) {unknown}; registered: {sorted(registry)}")
  return order


def decode_attention(q, cache, *, implementation: str | Sequence[str] | None = None,
                     warn_on_fallback: bool = False, **options):
  """Decode attention over a quantized cache with the first implementation that accepts it.

  Args:
    q: queries ``[B, N, T, H]``.
    cache: one layer's `KVCache`.
    implementation: None (the platform's default order: its Pallas kernel,
      then XLA), a name ("xla", "pallas_gpu", "pallas_tpu") or a sequence of
      names tried in order.
    warn_on_fallback: warn when an implementation declines and the next is tried.
    **options: passed to the implementation (sm_scale, logit_softcap, ...).
  """
  _load_kernels()
  order = _order(implementation, _REGISTRY)
  return _first_accepting(_REGISTRY, order, warn_on_fallback, lambda fn: fn(q, cache, **options))


def _first_accepting(registry, order, warn_on_fallback, call):
  reasons = []
  for name in order:
    if name not in registry:
      reasons.append(f"{name}: not installed")
      continue
    try:
      return call(registry[name])
    except NotImplementedError as e:
      reasons.append(f"{name}: {e}")
      if warn_on_fallback:
        warnings.warn(f"kvjax: implementation {name!r} declined ({e}); trying the next one")
  raise NotImplementedError("no implementation accepted these inputs: " + "; ".join(reasons))


def append(cache, k, v, num_new=None, *, implementation: str | Sequence[str] | None = None,
           warn_on_fallback: bool = False):
  """`kvjax.cache.append` through the first writer in `implementation`'s order that accepts it.

  Same names and order as `decode_attention`; a name with no writer of its
  own (e.g. "pallas_tpu") is skipped, and "xla" ends every order.
  """
  _load_kernels()
  order = _order(implementation, _REGISTRY)
  return _first_accepting(_APPEND, tuple(n for n in order if n in _APPEND) + ("xla",),
                          warn_on_fallback, lambda fn: fn(cache, k, v, num_new))
