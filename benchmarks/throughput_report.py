"""Reporting for benchmarks/throughput.py: JSON writing, merging, ratios, summary table, plot."""

from __future__ import annotations

import json
import os
import re

from kvjax import formats


def write(rows, meta, out):
  os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
  with open(out + ".tmp", "w") as fh:
    json.dump({"meta": meta, "rows": rows}, fh, indent=1)
  os.replace(out + ".tmp", out)


def run_order(path):
  """Sort key putting result files in the order they were measured: by the session number in the name
  (`tp_llama_32k_s5.json` before `tp_llama_32k_s22b.json`, where a shell glob sorts s22b first; no number:
  session 2's first runs), then by the call's letter (b after a) and the name."""
  name = os.path.basename(path)
  m = re.search(r"_s(\d+)([a-z]?)(?=[._])", name)
  return (int(m.group(1)), m.group(2), name) if m else (0, "", name)


def _flat(meta):
  """A result file's meta as a list of run metas: one run's dict, or a merged table's list (nested when merged
  tables are merged again), None for none."""
  if meta is None:
    return []
  return [m for x in meta for m in _flat(x)] if isinstance(meta, list) else [meta]


def merge(paths, out):
  """Rows of the result files at `paths` joined into `out`, one per (model, format, context): the latest run's
  (`run_order`; a failed re-run never replaces a measured row; rows of a name that is no format are left out).
  Files from different devices (any run meta's or row's `device`; a merged table's metas are a list) are refused:
  their ratios to bf16 would mix cards."""
  rows, metas, devices = {}, [], {}
  for p in sorted(paths, key=run_order):
    d = json.load(open(p))
    metas.append(d.get("meta"))
    for device in [m.get("device") for m in _flat(d.get("meta"))] + [r.get("device") for r in d["rows"]]:
      if device is not None:
        devices.setdefault(device, p)
    if len(devices) > 1:
      raise ValueError(f"paths: files from more than one device, {devices} (device: first file); expected one "
                       f"device per merged table")
    for r in d["rows"]:
      if r["format"] not in formats.PRESETS:  # session 26's typo'd "fp8": a run of no format measured nothing
        print(f"merge: {p}: left out a row of format {r['format']!r}, not a format (kvjax.formats.PRESETS)")
        continue
      key = (r["model"], r["format"], r["context"])
      if r.get("error") and rows.get(key, {}).get("tokens_per_s"):
        continue  # a failed re-run never replaces a measured row
      rows[key] = r
  rows = list(rows.values())
  write(rows, metas, out)
  return rows


def ratios(rows):
  """Per (model, context): tokens/s and max-batch ratios to bf16."""
  base = {(r["model"], r["context"]): r for r in rows if r["format"] == "bf16"}
  out = []
  for r in rows:
    b = base.get((r["model"], r["context"]))
    tps = (r["tokens_per_s"] / b["tokens_per_s"]) if b and r.get("tokens_per_s") and b.get("tokens_per_s") else None
    mb = (r["max_batch"] / b["max_batch"]) if b and r.get("max_batch") and b.get("max_batch") else None
    out.append((r, tps, mb))
  return out


def summary(rows, targets=(("fp8_e4m3", 1.9), ("kivi2", 3.5), ("kivi2_g128", 3.5))) -> str:
  lines = ["| model | format | context | max_batch (x bf16) | tokens/s (x bf16) | step_ms b=1 | "
           "prefill tok/s | peak GiB | compile s |", "|---|---|---|---|---|---|---|---|---|"]
  f = lambda v, p=1: "-" if v is None else f"{v:.{p}f}"
  for r, tps, mb in ratios(rows):
    lines.append(f"| {r['model']} | {r['format']} | {r['context']} | {r['max_batch']} ({f(mb, 2)}x) | "
                 f"{f(r.get('tokens_per_s'), 0)} ({f(tps, 2)}x) | {f(r.get('step_ms'), 2)} | "
                 f"{f(r.get('prefill_tokens_per_s'), 0)} | {f(r.get('peak_gib'), 1)} | "
                 f"{f((r.get('compile_s') or 0) + (r.get('compile_b1_s') or 0), 0)} |"
                 + (f" {r['error']}" if r.get("error") else ""))
  for r, tps, mb in ratios(rows):
    for name, want in targets:
      if r["model"] == "llama3_8b" and r["context"] == 32768 and r["format"] == name:
        verdict = "-" if tps is None else ("MET" if tps >= want else "MISSED")
        lines.append(f"target {name} >= {want}x bf16 tokens/s (llama3_8b, 32k): {f(tps, 2)}x "
                     f"(max batch {f(mb, 2)}x) {verdict}")
  return "\n".join(lines)


def plot(rows, path):
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  groups = sorted({(r["model"], r["context"]) for r in rows})
  fmts = [f for f in dict.fromkeys(r["format"] for r in rows)]
  fig, axes = plt.subplots(1, max(len(groups), 1), figsize=(4.2 * max(len(groups), 1), 4), squeeze=False)
  for ax, (m, c) in zip(axes[0], groups):
    sel = {r["format"]: r for r in rows if r["model"] == m and r["context"] == c}
    xs = [f for f in fmts if sel.get(f, {}).get("tokens_per_s")]  # a failed row has no bar
    ys = [sel[f]["tokens_per_s"] for f in xs]
    bars = ax.bar(range(len(xs)), ys, color="tab:blue")
    for bar, f in zip(bars, xs):
      ax.annotate(f"B={sel[f]['max_batch']}", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                  ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(xs)), xs, rotation=30, fontsize=8)
    ax.set_title(f"{m}, context {c // 1024}k", fontsize=9)
    ax.set_ylabel("decode tokens/s at max batch")
  budget = next((r["budget_gib"] for r in rows if r.get("budget_gib")), None)
  device = next((r["device"] for r in rows if r.get("device")), None)
  fig.suptitle((f"Decode throughput at a fixed KV budget ({budget:g} GiB)" if budget else "Decode throughput")
               + (f"\n{device}" if device else ""), fontsize=10)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
