"""The input checks of the Mosaic GPU KIVI kernel (`mosaic_kivi.kivi2_states`) and the geometry they read
from the shapes: the code width (2 or 4 bits, from the words a row) and the group (G=128 or 32, from the
key scales' rows)."""

from __future__ import annotations

import jax.numpy as jnp

from pallas_kernels.gpu import mosaic_epilogue as epilogue, mosaic_groups as groups
from pallas_kernels.gpu.mosaic_kivi_ref import TILE
from pallas_kernels.gpu.mosaic_options import VARIANTS, Options

ROWS = 16  # query rows (N of WGMMA), padded
HEAD_DIMS = (128, 256)  # 256: Gemma 2


def options(variant) -> Options:
  """variant: a name in VARIANTS or an `Options`."""
  if isinstance(variant, Options):
    return variant
  if variant not in VARIANTS:
    raise ValueError(f"variant must be an Options or one of {tuple(VARIANTS)}, got {variant!r}")
  return VARIANTS[variant]


def check(q_t, q_rows, lengths, kc, ks, kz, vc, vs, vz, *, opt: Options, variant, num_splits: int, window, merged,
          merge_by: str, softcap=None, sliding=None):
  """Raises ValueError naming the argument for what `kivi2_states` cannot take; returns (b, kh, h, s,
  bits, group, n_states). lengths: [B], or None with a window. q_t: the transposed query's shape
  [B, K, H, 16] (H in HEAD_DIMS); q_rows: the caller's rows when the kernel scales them (q_scale), else None."""
  if q_rows is not None and (q_rows.ndim != 4 or q_rows.shape[3] not in HEAD_DIMS or not 1 <= q_rows.shape[2] <= ROWS):
    raise ValueError(f"with q_scale, q_t must be the query rows [B, K, rows <= {ROWS}, H in {HEAD_DIMS}], got "
                     f"{q_rows.shape}")
  if len(q_t.shape) != 4 or q_t.shape[2] not in HEAD_DIMS or q_t.shape[3] != ROWS:
    raise ValueError(f"q_t must be [B, K, H in {HEAD_DIMS}, {ROWS}], got {q_t.shape}")
  b, kh, h, _ = q_t.shape
  s = kc.shape[2] if kc.ndim >= 3 else 0
  bits = 4 if kc.ndim == 4 and kc.shape[3] == h // 4 else 2  # 4-bit: 4 words a 16 channels
  whole = num_splits if not opt.balance else 1  # balanced splits share the live steps: any count
  if num_splits < 1 or s % (TILE * whole * opt.tiles_per_step):
    raise ValueError(f"the capacity {s} must be a multiple of {TILE} x tiles_per_step ({opt.tiles_per_step})"
                     + ("" if opt.balance else f" x num_splits ({num_splits})") + ", num_splits >= 1")
  group = groups.GROUP if ks.ndim == 4 and ks.shape[2] == s // groups.GROUP else TILE
  if h != 128 and not (opt.dequant_in_a and opt.scales_once):
    raise ValueError(f"head_dim {h} needs a dequant_in_a variant with scales_once, got {variant!r}")
  if group != TILE and not opt.dequant_in_a:
    raise ValueError(f"G={group} (ks {ks.shape}) needs a dequant_in_a variant, got {variant!r}")
  if bits == 4 and not (opt.dequant_in_a and opt.unpack in ("mask", "denorm")):
    raise ValueError(f"4-bit codes (kc {kc.shape}) need a dequant_in_a variant with unpack 'mask' or 'denorm', "
                     f"got {variant!r}")
  per_token = (b, kh, s) + ((h // group,) if group != TILE or h != TILE else ())  # h = 256: 2 groups a token
  expect = {"kc": (b, kh, s, h * bits // 16), "ks": (b, kh, s // group, h), "kz": (b, kh, s // group, h),
            "vc": (b, kh, s // TILE, h, 8 * bits), "vs": per_token, "vz": per_token}
  for name, arr in zip(expect, (kc, ks, kz, vc, vs, vz)):
    if arr.shape != expect[name]:
      raise ValueError(f"{name} must be {expect[name]}, got {arr.shape}")
  if window is not None:
    _check_window(window, opt, variant, (b, kh, TILE, h))
  if (lengths is None and window is None) or (lengths is not None and getattr(lengths, "shape", None) != (b,)):
    raise ValueError(f"lengths must be [{b}] int32 (or None with a window), got "
                     f"{getattr(lengths, 'shape', lengths)}")
  n_states = num_splits + (window is not None)
  if merged is not None and not (1 <= merged[0] <= ROWS and epilogue.cluster_merge_ok(n_states) and h == 128):
    raise ValueError(f"merged: rows must be in [1, {ROWS}], the states 2..{epilogue.CLUSTER_MAX} and head_dim 128, "
                     f"got rows {merged[0]}, {n_states} states, head_dim {h}")
  if softcap is not None and not (isinstance(softcap, (int, float)) and softcap > 0 and opt.dequant_in_a):
    raise ValueError(f"softcap must be a positive number (with a dequant_in_a variant) or None, got {softcap!r} "
                     f"with {variant!r}")
  if sliding is not None and not (isinstance(sliding, int) and sliding >= 1 and window is not None):
    raise ValueError(f"sliding must be a positive int with a window (the full lengths and query tokens), or "
                     f"None; got {sliding!r}, window {'set' if window is not None else None}")
  if merge_by not in epilogue.MERGES:
    raise ValueError(f"merge_by must be one of {epilogue.MERGES}, got {merge_by!r}")
  return b, kh, h, s, bits, group, n_states


def _check_window(window, opt: Options, variant, ring_shape):
  w_len, k_res, v_res, w_queries = window
  if not opt.dequant_in_a:
    raise ValueError(f"window needs a dequant_in_a variant, got {variant!r}")
  if k_res.shape != ring_shape or v_res.shape != k_res.shape or w_len.shape != (ring_shape[0],):
    raise ValueError(f"window: k_res and v_res must be {ring_shape} and lengths [{ring_shape[0]}], got "
                     f"{k_res.shape}, {v_res.shape}, {w_len.shape}")
  if k_res.dtype not in (jnp.bfloat16, jnp.float16) or v_res.dtype not in (jnp.bfloat16, jnp.float16):
    raise ValueError(f"window: k_res and v_res must be bfloat16 or float16 (WGMMA operands), got "
                     f"{k_res.dtype}, {v_res.dtype}")
  if not 1 <= w_queries <= ROWS:
    raise ValueError(f"window: the query tokens T must be in [1, {ROWS}], got {w_queries}")
