"""Session 26: bring `benchmarks/results/decode_h200.json`'s `kvjax` rows for KIVI up to the default kernels.

Since sessions 22-23 the GPU default for KIVI-2 G=32 and KIVI-4 is the Mosaic kernel over a "words" cache, but
the merged table's `kvjax` rows for those formats were still Triton's planar kernel (sessions 5-8): its plot
drew KIVI-2 G=32 at 0.68x torch where the default runs at 1.84x. This script, run once on the CPU:
- renames the table's `kvjax` rows of kivi2 and kivi4 to `kvjax_triton` (kept as data, not plotted);
- adds the H200 runs of the Mosaic kernels in session order, each row tagged with its `source` file: session
  22's `sweep:kivi_layout=words` rows (KIVI-2 G=32, `decode_parts/session22/decode_s22{a,c}_kivi2.json`) as
  `kvjax`, then session 25's call d (`decode_parts/session25/d_decode_s25d.json`: KIVI-2 G=128 and KIVI-4 at
  B=1 1k-128k and B=8 1k). Each file's torch SDPA rows come with it (later files win per impl, format, batch
  and context, as `decode_kernels.py --merge` does);
- rewrites the table and its plot. KIVI-4's other points were timed on an H100 only, so they are not here.
Run once: a table with `kvjax_triton` rows is left as it is. Session 25's file also replaces the KIVI-2 G=128
rows it has, and every source's torch rows replace the table's at their points (so the table's FP8 cell at B=8
32k reads 1.69x against session 22's torch, where session 19's same-run ratio was 1.73x).

    python3 benchmarks/runs/session26_promote.py [TABLE]
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
import decode_report  # noqa: E402

RESULTS = os.path.join(HERE, "..", "results")
SOURCES = (("decode_parts/session22/decode_s22a_kivi2.json", {"sweep:kivi_layout=words": "kvjax",
                                                              "torch_sdpa": "torch_sdpa"}),
           ("decode_parts/session22/decode_s22c_kivi2.json", {"sweep:kivi_layout=words": "kvjax",
                                                              "torch_sdpa": "torch_sdpa"}),
           ("decode_parts/session25/d_decode_s25d.json", {"kvjax": "kvjax", "torch_sdpa": "torch_sdpa"}))
RETIRED = ("kivi2", "kivi4")  # formats whose table rows were Triton's kernel, now not the default


def _flat(meta):
  """A merged table's meta: a run's dict, or a list of metas (merges of merges nest them)."""
  return [m for x in meta for m in _flat(x)] if isinstance(meta, list) else [meta]


def promote(table, sources=SOURCES, root=RESULTS):
  """The table's rows with RETIRED formats' `kvjax` rows renamed `kvjax_triton` and `sources`' rows merged in
  (renamed by each source's map; rows of other impls dropped). Refuses a source from another device kind.
  A table that has `kvjax_triton` rows was promoted already and comes back unchanged: a later
  `decode_kernels.py --merge` of new Mosaic runs must not be retired (the rows do not name their kernel)."""
  if any(r["impl"] == "kvjax_triton" for r in table["rows"]):
    return table
  kinds = {m.get("device_kind") for m in _flat(table["meta"])} - {None}  # sessions 1-9 did not record it
  rows = {}
  for r in table["rows"]:
    if r["impl"] == "kvjax" and r["format"] in RETIRED:
      r = dict(r, impl="kvjax_triton")
    rows[(r["impl"], r["format"], r["batch"], r["context"])] = r
  metas = table["meta"] if isinstance(table["meta"], list) else [table["meta"]]
  metas = list(metas)
  for rel, names in sources:
    d = json.load(open(os.path.join(root, rel)))
    if d["meta"].get("device_kind") not in kinds:
      raise ValueError(f"sources: {rel} ran on {d['meta'].get('device_kind')!r}; expected one of {sorted(kinds)}")
    if d["meta"] not in metas:  # a second run of the script adds nothing new
      metas.append(d["meta"])
    for r in d["rows"]:
      if r["impl"] in names and r.get("us"):
        r = dict(r, impl=names[r["impl"]], source=rel)
        rows[(r["impl"], r["format"], r["batch"], r["context"])] = r
  out = sorted(rows.values(), key=lambda r: (r["batch"], r["context"], r["impl"], r["format"]))
  return {"meta": metas, "rows": out}


def main():
  path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(RESULTS, "decode_h200.json")
  table = promote(json.load(open(path)))
  with open(path, "w") as fh:
    json.dump(table, fh, indent=1)
  decode_report.summary(table["rows"], table["meta"][-1]["stream_tbps"], print)
  decode_report.plot(table["rows"], os.path.splitext(path)[0] + ".png", table["meta"][-1].get("head_shape"),
                     table["meta"][-1].get("device_kind"))


if __name__ == "__main__":
  main()
