"""The run scripts' row loop (`session25_merge.py`, `session26_waves.py`, `session28_softcap.py`): measure a
point, keep a failure as a row with its error, print the row and rewrite the JSON after each (a call cut off
by its time limit still returns every finished row)."""
import json


def measured(res, out, row, measure):
  """measure(row) fills row; an exception becomes row["error"]. The row joins res["rows"], is printed, and
  res is written to out."""
  try:
    measure(row)
  except Exception as e:  # noqa: BLE001 (a failed point is a row with its error)
    row["error"] = repr(e)[:300]
  res["rows"].append(row)
  print(row, flush=True)
  with open(out, "w") as fh:
    json.dump(res, fh, indent=1)
  return row
