"""How representative is the reference LM? Per-channel magnitude of its keys (issue 6).

Real LLM keys have a few channels 10-50x larger than the rest (KIVI, KVQuant),
which is why KIVI quantizes keys per channel. This runs the shipped reference
LM over held-out code, captures every layer's post-RoPE keys and values from a
bf16 cache, and reports per-channel RMS: the largest channel over the median,
and how many channels exceed 5x and 10x the median.

  python benchmarks/key_channels.py   # CPU, about a minute
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from kvjax.quality import reference_lm  # noqa: E402


def channel_stats(x: np.ndarray) -> dict:
  """x [tokens, H] -> summary of per-channel RMS."""
  rms = np.sqrt((x.astype(np.float64) ** 2).mean(axis=0))
  med = np.median(rms)
  return {"max_over_median": float(rms.max() / med), "channels_over_5x": int((rms > 5 * med).sum()),
          "channels_over_10x": int((rms > 10 * med).sum()), "rms_sorted_desc": np.sort(rms)[::-1][:8].round(3).tolist()}


def main(out="benchmarks/results/key_channels.json", tokens=2048, windows=2):
  kv = reference_lm.heldout_kv(tokens, windows)
  rows = []
  for layer, (k, v) in enumerate(kv):
    for head in range(k.shape[1]):
      rows.append({"layer": layer, "kv_head": head,
                   "keys": channel_stats(k[:, head].reshape(-1, k.shape[-1])),
                   "values": channel_stats(v[:, head].reshape(-1, v.shape[-1]))})
  summary = {"command": "python benchmarks/key_channels.py", "tokens_per_window": tokens,
             "windows": windows, "rows": rows}
  with open(out, "w") as f:
    json.dump(summary, f, indent=1)
  print("| layer | KV head | keys: max/median channel RMS | keys: channels > 10x | values: max/median |")
  print("|---|---|---|---|---|")
  for r in rows:
    print(f"| {r['layer']} | {r['kv_head']} | {r['keys']['max_over_median']:.1f} | "
          f"{r['keys']['channels_over_10x']} | {r['values']['max_over_median']:.1f} |")
  print(f"wrote {out}")


if __name__ == "__main__":
  main()
