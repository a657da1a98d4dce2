"""Where a GPU kernel's registers go, from its PTX, on a machine without a GPU: ptxas's register count,
and from nvdisasm's register life ranges (`-plr`) the live registers at each instruction, the peak, and
for the longest loop the registers live at its head and the ones live *through* it (defined before,
used after, never touched inside: what a branch elsewhere in the kernel keeps occupied while the loop
runs).

    python3 benchmarks/ptx_registers.py --ptxas PTXAS --nvdisasm NVDISASM kernel.ptx [...] --out regs.json

Session 16 used it on the Mosaic KIVI-2 kernel's PTX (`benchmarks/mosaic_sass.py` dumps it on the GPU):
with the residual window as a second `pl.when`, 16 registers were live through the tile loop against 7
without the window, peak 132 against 120: ptxas took 141 registers (3 programs per SM instead of 4).
Tools: ptxas of CUDA >= 13 for Mosaic's PTX ISA 9.0 (`pip download nvidia-cuda-nvcc==13.1.*`, the wheel's
`nvidia/cu13/bin/ptxas`), nvdisasm of the same major version (the `triton` wheel bundles one).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kernel_sass import opcode  # noqa: E402

INSTR = re.compile(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?);")
LABEL = re.compile(r"^(\.L_x_\d+):")


def parse_life_ranges(text: str):
  """nvdisasm -plr output -> (register column of each general register, rows): rows are (address or
  None for a label, instruction or label, the line). A register's column holds ':' (live), '^' (defined),
  'v' (used), 'x' (both) or ' ' at each row."""
  lines = text.splitlines()
  header = next((l for l in lines if re.search(r"\|\s+#\s+0 1 2 3", l)), None)
  if header is None:
    raise ValueError("no register life-range header (nvdisasm -plr output expected)")
  start = header.index("|") + 1
  gpr = header[start:header.index("|", start)]
  cols = {int(m.group()): start + m.end() - 1 for m in re.finditer(r"\d+", gpr)}  # R0, R1, ... ("#": the count)
  rows = []
  for line in lines:
    if m := INSTR.match(line):
      rows.append((int(m.group(1), 16), m.group(2).strip(), line))
    elif m := LABEL.match(line):
      rows.append((None, m.group(1), line))
  return cols, rows


def live_count(line: str) -> int | None:
  m = re.search(r"//\s*\|\s*(\d+)", line)
  return int(m.group(1)) if m else None


def _state(line: str, pos: int) -> str:
  return line[pos] if pos < len(line) else " "


def loops(rows):
  """(label row index, branch row index) of each conditional backward branch (the unconditional ones jump
  back from the out-of-line barrier-wait retries)."""
  where = {t: i for i, (a, t, _) in enumerate(rows) if a is None}
  out = []
  for i, (a, t, _) in enumerate(rows):
    m = re.match(r"@!?P\d\s+BRA\s+`?\(?(\.L_x_\d+)", t) if a is not None else None
    if m and m.group(1) in where and where[m.group(1)] < i:
      out.append((where[m.group(1)], i))
  return out


def fetch_block(rows) -> tuple[int, bool]:
  """In a loop's rows (`parse_life_ranges`' rows), the pipeline's refetch block: the instructions between the
  last forward conditional branch before the loop's first UTMALDG that jumps past its last one and that
  branch's label; and whether a warp-index read (SHFL.IDX) sits between the first such branch and it (the
  block then runs on one warp of 4: `mosaic_pipeline`). (0, False) where the loop copies nothing."""
  at = {t: i for i, (a, t, _) in enumerate(rows) if a is None}
  tma = [i for i, (a, t, _) in enumerate(rows) if a is not None and "UTMALDG" in t]
  if not tma:
    return 0, False
  skips = []
  for i, (a, t, _) in enumerate(rows[:tma[0]]):
    m = re.match(r"@!?U?P\d\s+BRA\s+`?\(?(\.L_x_\d+)", t) if a is not None else None
    if m and at.get(m.group(1), -1) > tma[-1]:
      skips.append((i, at[m.group(1)]))
  if not skips:
    return 0, False
  (first, _), (br, target) = skips[0], skips[-1]
  size = sum(a is not None for a, _, _ in rows[br + 1:target])
  return size, any(a is not None and "SHFL.IDX" in t for a, t, _ in rows[first:br])


def diamonds(rows) -> list[tuple[int, int]]:
  """In a loop's rows, each if / else (a conditional forward branch to label A, an unconditional branch to
  label B just before A, B after A): (instructions of the arm that falls through, of the arm at A), the
  unconditional branch counted with the first (`Options.full_tiles`' masked and unmasked softmax)."""
  at = {t: i for i, (a, t, _) in enumerate(rows) if a is None}
  out = []
  for i, (a, t, _) in enumerate(rows):
    m = re.match(r"@!?U?P\d\s+BRA\s+`?\(?(\.L_x_\d+)", t) if a is not None else None
    j = at.get(m.group(1), -1) if m else -1
    if j <= i or rows[j - 1][0] is None:
      continue
    e = re.match(r"BRA\s+`?\(?(\.L_x_\d+)", rows[j - 1][1])
    k = at.get(e.group(1), -1) if e else -1
    if k > j:
      count = lambda lo, hi: sum(r[0] is not None for r in rows[lo:hi])
      out.append((count(i + 1, j), count(j + 1, k)))
  return out


def analyze(text: str) -> dict:
  cols, rows = parse_life_ranges(text)
  counts = [c for c in (live_count(l) for a, _, l in rows if a is not None) if c is not None]
  out = {"instructions": sum(a is not None for a, _, _ in rows), "peak_live": max(counts, default=0)}
  found = loops(rows)
  if not found:
    return out
  i0, i1 = max(found, key=lambda se: se[1] - se[0])
  head = rows[i0][2]
  live = [r for r, p in cols.items() if _state(head, p) in ":^vx"]
  touched = {r for _, _, l in rows[i0 + 1:i1 + 1] for r, p in cols.items() if _state(l, p) in "^vx"}
  inside = [c for c in (live_count(l) for a, _, l in rows[i0:i1 + 1] if a is not None) if c is not None]
  body = [t for a, t, _ in rows[i0:i1 + 1] if a is not None]
  mix = collections.Counter(opcode(t).split(".")[0] for t in body)
  block, one_warp = fetch_block(rows[i0:i1 + 1])
  arms = diamonds(rows[i0:i1 + 1])
  out.update(loop_instructions=len(body), loop_mix=dict(mix.most_common(16)), loop_fetch_block=block,
             loop_fetch_one_warp=one_warp, loop_if_else=arms,
             loop_shortest_path=len(body) - sum(max(a) for a in arms),  # each if / else by its shorter arm
             loop_peak_live=max(inside, default=0), loop_head_live=len(live),
             live_through=sorted(r for r in live if r not in touched))
  return out


def compile_ptx(ptx: str, ptxas: str, nvdisasm: str, arch: str = "sm_90a") -> dict:
  """ptxas's report and `analyze` of one PTX file."""
  with tempfile.TemporaryDirectory() as d:
    cubin = os.path.join(d, "k.cubin")
    log = subprocess.run([ptxas, f"-arch={arch}", "-v", "-o", cubin, ptx], capture_output=True, text=True,
                         check=True).stderr
    plr = subprocess.run([nvdisasm, "-c", "-plr", cubin], capture_output=True, text=True, check=True).stdout
  regs = re.search(r"Used (\d+) registers", log)
  spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
  return {"ptx": ptx, "registers": int(regs.group(1)) if regs else None,
          "spill_store_bytes": int(spill.group(1)) if spill else None, **analyze(plr)}


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("ptx", nargs="+")
  ap.add_argument("--ptxas", required=True)
  ap.add_argument("--nvdisasm", required=True)
  ap.add_argument("--arch", default="sm_90a")
  ap.add_argument("--out", default="")
  args = ap.parse_args(argv)
  rows = [compile_ptx(p, args.ptxas, args.nvdisasm, args.arch) for p in args.ptx]
  for r in rows:
    print(json.dumps({k: (len(v) if k == "live_through" else v) for k, v in r.items()}))
  if args.out:
    with open(args.out, "w") as fh:
      json.dump(rows, fh, indent=1)
  return rows


if __name__ == "__main__":
  main()
