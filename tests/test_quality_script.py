"""benchmarks/quality.py on the CPU: a tiny real run, the merge of partial runs and its verdicts."""

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
import quality  # noqa: E402


def test_tiny_run_writes_rows_and_plots(tmp_path):
  out = tmp_path / "q.json"
  quality.main(["--contexts", "256", "--samples", "2", "--batch", "2", "--tail", "64", "--chunk", "256",
                "--formats", "bf16,kivi2,kivi2_mixed", "--mixed-layers", "5", "--out", str(out)])
  d = json.loads(out.read_text())
  assert {(r["format"], r["task"]) for r in d["rows"]} == {
      (f, t) for f in ("bf16", "kivi2", "kivi2_mixed") for t in ("ppl", "recall", "passkey")}
  for r in d["rows"]:
    assert r["context"] == 256 and r["bf16_value"] is not None
    if r["format"] == "bf16":
      assert r["value"] == r["bf16_value"]
  by = {(r["format"], r["task"]): r for r in d["rows"]}
  # one KIVI-4 layer of six costs bytes between plain KIVI-2 and bf16
  assert by["kivi2", "ppl"]["bytes_per_token"] < by["kivi2_mixed", "ppl"]["bytes_per_token"] < \
      by["bf16", "ppl"]["bytes_per_token"]
  assert d["calibration"]["kivi2_mixed"] == {"layers_kivi4": [5], "from": "--mixed-layers"}
  assert (tmp_path / "q_vs_context.png").exists() and (tmp_path / "q_frontier.png").exists()
  # bf16 listed last still runs first (later rows carry its value); a RoPE-base override changes it
  out2 = tmp_path / "q2.json"
  quality.main(["--contexts", "256", "--samples", "2", "--batch", "2", "--tail", "64", "--chunk", "256",
                "--formats", "int8,bf16", "--rope-base", "50", "--out", str(out2)])
  rows2 = json.loads(out2.read_text())["rows"]
  assert [r["format"] for r in rows2[:2]] == ["bf16", "int8"]
  assert all(r["bf16_value"] is not None for r in rows2)
  ppl2 = next(r["value"] for r in rows2 if (r["format"], r["task"]) == ("bf16", "ppl"))
  assert ppl2 != pytest.approx(by["bf16", "ppl"]["value"], rel=1e-3)
  with pytest.raises(ValueError, match="--mixed-layers"):
    quality.main(["--contexts", "256", "--formats", "kivi2_mixed", "--mixed-layers", "9",
                  "--out", str(tmp_path / "bad.json")])


def _run(path, context, values, command):
  rows = [{"format": f, "task": "ppl", "context": context, "value": v, "bf16_value": values["bf16"],
           "bytes_per_token": 1.0} for f, v in values.items()]
  path.write_text(json.dumps({"command": command, "samples": 2, "tail": 64, "calibration": {},
                              "device": "cpu", "seconds": 1.0, "rows": rows}))
  return str(path)


def test_merge_joins_runs_and_judges_targets(tmp_path, capsys):
  a = _run(tmp_path / "a.json", 1024, {"bf16": 10.0, "kivi4": 10.04, "kivi2": 10.2}, "a")
  b = _run(tmp_path / "b.json", 8192, {"bf16": 8.0, "kivi4": 8.08, "kivi2": 8.2}, "b")
  stale = _run(tmp_path / "c.json", 1024, {"bf16": 10.0, "kivi4": 99.0}, "stale")
  out = tmp_path / "m.json"
  quality.merge([stale, a, b], str(out))  # later files win per (format, task, context)
  d = json.loads(out.read_text())
  assert [r["command"] for r in d["runs"]] == ["stale", "a", "b"]
  assert len(d["rows"]) == 6
  assert d["verdicts"]["1024"]["kivi4"]["ppl_pct"] == pytest.approx(0.4)
  assert d["verdicts"]["8192"]["kivi4"]["ppl_pct"] == pytest.approx(1.0)
  printed = capsys.readouterr().out
  assert "target kivi4: ppl within 0.5% of bf16 at every context: MISSED (worst +1.00%)" in printed
  assert "target kivi2: ppl within 3.0% of bf16 at every context: MET (worst +2.50%)" in printed
  assert (tmp_path / "m_vs_context.png").exists()


def test_merge_prefers_the_rope_override_at_its_context(tmp_path, capsys):
  a = _run(tmp_path / "a.json", 1024, {"bf16": 10.0, "kivi4": 10.04, "kivi2_mixed": 10.1}, "a")
  broken = _run(tmp_path / "b.json", 16384, {"bf16": 20.0, "kivi4": 30.0, "kivi2_mixed": 40.0}, "trained base")
  d = json.loads(open(_run(tmp_path / "c.json", 16384, {"bf16": 8.0, "kivi4": 8.02, "kivi2_mixed": 8.4},
                           "ntk")).read())
  for r in d["rows"]:
    r["rope_base"] = 2e6
  d["rows"] += [{"format": f, "task": "recall", "context": 16384, "value": v, "bf16_value": 0.8,
                 "bytes_per_token": 1.0, "rope_base": 2e6} for f, v in (("bf16", 0.8), ("kivi2_mixed", 0.76))]
  ntk = tmp_path / "c.json"
  ntk.write_text(json.dumps(d))
  out = tmp_path / "m.json"
  quality.merge([a, str(ntk), broken], str(out))  # the override wins whatever the file order
  m = json.loads(out.read_text())
  assert len(m["rows"]) == 3 + 3 + 5  # the checkpoint-base 16k rows are kept
  assert m["primary_rope_base"] == {"1024": None, "16384": 2e6}
  assert m["verdicts"]["16384"]["kivi4"]["ppl_pct"] == pytest.approx(0.25)
  assert m["verdicts"]["16384 (rope_base checkpoint)"]["kivi4"]["ppl_pct"] == pytest.approx(50.0)
  printed = capsys.readouterr().out
  assert "target kivi4: ppl within 0.5% of bf16 at every context: MET (worst +0.40%)" in printed
  assert "target kivi2_mixed: ppl within 3.0% of bf16 at every context: MISSED (worst +5.00%)" in printed
  assert "target kivi2_mixed: recall and passkey at 16384 >= 0.97 of bf16: MISSED (recall 0.95" in printed
  assert "context 16384: RoPE base 2e+06" in printed
