"""Result files of `decode_kernels.py`: save, merge runs, plot step time vs context, summarize
speed-ups against the best bf16 peer."""

from __future__ import annotations

import dataclasses
import json
import os

from kernel_variants import SHAPES

KV_FORMATS = ("bf16", "fp8_e4m3", "fp8_e5m2", "int8", "int4", "kivi4", "kivi2", "kivi2_g128")
BF16_PEERS = ("cudnn", "xla_dpa", "jax_pallas_mqa", "xla_einsum", "torch_sdpa")


def save(out, meta, rows):
  os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
  with open(out, "w") as fh:
    json.dump({"meta": meta, "rows": rows}, fh, indent=1)


def merge_and_plot(paths, out):
  """Merges runs (later files win per impl/format/batch/context) and plots."""
  rows, metas = {}, []
  for pth in paths:
    d = json.load(open(pth))
    metas.append(d["meta"])
    for r in d["rows"]:
      rows[(r["impl"], r["format"], r["batch"], r["context"])] = r
  rows = sorted(rows.values(), key=lambda r: (r["batch"], r["context"], r["impl"], r["format"]))
  with open(out, "w") as fh:
    json.dump({"meta": metas, "rows": rows}, fh, indent=1)
  summary(rows, metas[-1]["stream_tbps"], print)
  plot(rows, os.path.splitext(out)[0] + ".png", metas[-1].get("head_shape"), metas[-1].get("device_kind"))


def plot(rows, path, head_shape=None, device=None):
  """Step time vs context, one panel per batch: the bf16 peers dashed, kvjax's default kernels solid;
  `device` (a device_kind) heads each panel."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  batches = sorted({r["batch"] for r in rows})
  if not batches:  # a --check run with no timed cells
    return
  fig, axes = plt.subplots(1, len(batches), figsize=(6 * len(batches), 5), squeeze=False)
  for ax, b in zip(axes[0], batches):
    series = {}
    for r in rows:
      if r["batch"] == b and r["impl"] in BF16_PEERS + ("kvjax", "xla_dequant"):
        name = r["impl"] if r["impl"] in BF16_PEERS else f"{r['impl']}:{r['format']}"
        series.setdefault(name, []).append((r["context"], r["us"]))
    for name, pts in sorted(series.items()):
      pts.sort()
      style = "-o" if name.startswith("kvjax:") else "--x"
      ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=name, ms=4)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("context (tokens)")
    ax.set_ylabel("us per decode step (one layer)")
    hs = head_shape or dataclasses.asdict(SHAPES["llama3_8b"])
    ax.set_title(f"{device or 'GPU'}, B={b}, {hs['n_heads']}q/{hs['k_heads']}kv heads, d={hs['head_dim']}"
                 + (f", soft-cap {hs['softcap']:g}" if hs.get("softcap") else ""))
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=6, loc="upper left")
  fig.tight_layout()
  fig.savefig(path, dpi=110)


def summary(rows, tb, log):
  """Speed-ups vs the best bf16 peer of the same (batch, context)."""
  by = {}
  for r in rows:
    by.setdefault((r["batch"], r["context"]), []).append(r)
  log(f"{'B':>3} {'ctx':>7} {'best bf16 peer':>22} " + " ".join(f"{f[:10]:>10}" for f in KV_FORMATS))
  for (b, ctx), rs in sorted(by.items()):
    peers = [r for r in rs if r["impl"] in BF16_PEERS]
    if not peers:
      continue
    best = min(peers, key=lambda r: r["us"])
    cells = []
    for f in KV_FORMATS:
      k = [r for r in rs if r["impl"] == "kvjax" and r["format"] == f]
      cells.append(f"{best['us'] / k[0]['us']:5.2f}x/{k[0]['frac_roofline'] or 0:.2f}" if k else "-")
    log(f"{b:3d} {ctx:7d} {best['impl'][:12]:>12} {best['us']:8.1f}us " + " ".join(f"{c:>10}" for c in cells))
