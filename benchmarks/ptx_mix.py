"""Instruction mix of a kernel's main loop from its PTX (Mosaic GPU writes it with MOSAIC_GPU_DUMP_PTX=1
and MOSAIC_GPU_DUMP_TO=dir): the static PTX instructions of the loop body (the widest backward branch,
i.e. one pipeline step), by class. One step of `pallas_kernels.gpu.mosaic_kivi` is one 128-token tile,
so the total is the per-thread instruction count per tile (PTX, before ptxas; SASS differs a little).

    python3 benchmarks/ptx_mix.py dump/*.ptx --out benchmarks/results/decode_parts/ptx_mix.json
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import sys

# first matching prefix wins
CLASSES = (
    ("mma", ("wgmma.mma_async",)),
    ("sync", ("bar.", "barrier.", "mbarrier.", "fence.", "wgmma.fence", "wgmma.commit", "wgmma.wait",
              "elect.")),
    ("shuffle", ("shfl.",)),
    ("memory", ("ld.", "st.", "ldmatrix", "stmatrix", "cp.async", "red.", "atom.")),
    ("convert", ("cvt.",)),
    ("int_shift", ("shr.", "shl.", "bfe.", "prmt.")),
    ("int_logic", ("and.", "or.", "xor.", "lop3.", "not.")),
    ("move", ("mov.",)),
    ("fp", ("add.f", "sub.f", "mul.f", "fma.", "max.", "min.", "neg.f", "ex2.", "rcp.", "div.", "selp.f",
            "abs.f", "add.rn.f", "mul.rn.f", "fma.rn.", "sub.rn.f")),
    ("control", ("bra", "setp.", "selp.", "@")),
)
_INSTR = re.compile(r"^\s+(@!?%?\w+\s+)?([a-z][\w.:]*)")
_LABEL = re.compile(r"^(\$?[\w$]+):")
_BRANCH = re.compile(r"\bbra(\.uni)?\s+(\$?[\w$]+);")


def classify(op: str) -> str:
  for name, prefixes in CLASSES:
    if op.startswith(prefixes):
      return name
  return "other"


def loop_body(lines: list[str]) -> tuple[int, int]:
  """(first, last) line indices of the widest backward branch's span; the whole text when none."""
  labels = {}
  best = (0, len(lines) - 1)
  width = -1
  for i, line in enumerate(lines):
    if (m := _LABEL.match(line)):
      labels[m.group(1)] = i
    elif (m := _BRANCH.search(line)) and m.group(2) in labels and i - labels[m.group(2)] > width:
      width = i - labels[m.group(2)]
      best = (labels[m.group(2)], i)
  return best


def mix(text: str) -> dict:
  """{"lines": loop span, "total": instructions, "classes": {class: count}, "ops": {opcode: count}}."""
  lines = text.splitlines()
  lo, hi = loop_body(lines)
  ops = collections.Counter()
  for line in lines[lo:hi + 1]:
    if "wgmma.mma_async" in line:  # inline asm in braces, one per line
      ops["wgmma.mma_async"] += 1
    elif not line.strip().startswith(("//", ".")) and (m := _INSTR.match(line)):
      ops[m.group(2)] += 1
  classes = collections.Counter()
  for op, n in ops.items():
    classes[classify(op)] += n
  return {"lines": [lo + 1, hi + 1], "total": sum(ops.values()), "classes": dict(classes.most_common()),
          "ops": dict(ops.most_common())}


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("ptx", nargs="+")
  ap.add_argument("--out", default="")
  args = ap.parse_args(argv)
  res = {}
  for path in args.ptx:
    with open(path) as fh:
      res[path] = mix(fh.read())
    r = res[path]
    print(f"{path}: {r['total']} instructions in the loop (lines {r['lines'][0]}-{r['lines'][1]}): " +
          ", ".join(f"{k} {v}" for k, v in r["classes"].items()))
  if args.out:
    with open(args.out, "w") as fh:
      json.dump(res, fh, indent=1)
  return res


if __name__ == "__main__":
  sys.exit(0 if main() else 1)
