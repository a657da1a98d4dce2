"""CPU smoke test of benchmarks/throughput.py: its core runs on a tiny model so it cannot rot."""

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))

import throughput  # noqa: E402

from kvjax import formats, memory  # noqa: E402

BUDGET_GIB = 1 / 1024  # 1 MiB: a handful of 256-token sequences of the tiny model


def _shape(cfg):
  return memory.ModelShape(num_layers=cfg.num_layers, num_kv_heads=cfg.num_kv_heads,
                           head_dim=cfg.head_dim)


@pytest.mark.parametrize("fmt", ["bf16", "fp8_e4m3", "kivi2"])
def test_max_batch_matches_kvjax_memory(fmt):
  for name, ctx in (("llama3_8b", 32768), ("tiny", 256)):
    cfg = throughput.MODELS[name]()
    budget = 40 * throughput.GIB
    want = memory.sequences_that_fit(formats.preset(fmt), budget, ctx, _shape(cfg))
    assert throughput.max_batch_for(cfg, formats.preset(fmt), ctx, budget) == want


def test_plan_ratios_llama_32k():
  rows = {r["format"]: r for r in throughput.plan(["llama3_8b"], ["bf16", "fp8_e4m3", "kivi2"],
                                                 [32768], 40 * throughput.GIB)}
  assert rows["bf16"]["max_batch"] == 9  # 4 GiB + the lengths arrays per sequence
  assert rows["fp8_e4m3"]["max_batch"] == 19 and rows["kivi2"]["max_batch"] == 52
  assert rows["kivi2"]["ideal_tps_ratio"] > 3.5


def test_script_rows_json_and_plot(tmp_path, capsys):
  out = tmp_path / "tp.json"
  rc = throughput.main(["--models", "tiny", "--formats", "bf16,kivi2", "--contexts", "256",
                        "--budget-gib", str(BUDGET_GIB), "--steps", "64", "--warm-steps", "4",
                        "--reps", "1", "--prefill", "32", "--target-s", "0.01", "--in-process",
                        "--out", str(out)])
  assert rc == 0
  data = json.loads(out.read_text())
  rows = data["rows"]
  assert [(r["model"], r["format"], r["context"]) for r in rows] == [("tiny", "bf16", 256),
                                                                       ("tiny", "kivi2", 256)]
  cfg = throughput.tiny()
  for r in rows:
    assert "error" not in r, r.get("error")
    assert set(throughput.ROW_KEYS) <= set(r)
    want = memory.sequences_that_fit(formats.preset(r["format"]), int(BUDGET_GIB * throughput.GIB),
                                     r["context"], _shape(cfg))
    assert r["max_batch"] == want >= 1
    assert r["kv_gib"] <= BUDGET_GIB
    # On a loaded CPU the step-time difference can drown in noise: then None, never negative.
    assert r["tokens_per_s"] is None or r["tokens_per_s"] > 0
    assert r["step_ms"] is None or r["step_ms"] > 0
    assert r["prefill_tokens_per_s"] > 0
    assert r["peak_gib"] is None or r["peak_gib"] >= r["kv_gib"]  # CPU: no memory stats
    assert sum(r["layer_impls"].values()) == cfg.num_layers
  assert rows[1]["max_batch"] > rows[0]["max_batch"]  # kivi2 fits more sequences
  assert (tmp_path / "tp.png").exists()
  printed = capsys.readouterr().out
  assert "| tiny | kivi2 | 256 |" in printed


def test_timing_noise_gives_none_not_an_error(monkeypatch):
  # On a loaded machine t(n) - t(n0) can be <= 0: the row records None and carries on.
  monkeypatch.setattr(throughput, "_pairs", lambda run, n0, n, reps: (float("nan"), 0.01))
  row = throughput.run_row("tiny", "bf16", 256, int(BUDGET_GIB * throughput.GIB), steps=64,
                           warm_steps=4, reps=1, prefill=32, target_s=0.01, skip_b1=True)
  assert "error" not in row
  assert row["tokens_per_s"] is None and row["timing_noise"] is True


def test_mosaic_fp8_and_int8_flags_reach_the_rows(tmp_path, monkeypatch):
  """--mosaic-fp8 / --mosaic-int8: each row's process routes FP8 / INT8 caches to the Mosaic kernel
  (`ops.MOSAIC_FP8`, `ops.MOSAIC_INT8`) and the row says so (on the CPU the dispatcher's XLA path serves the
  layers either way); each flag sets only its own."""
  from pallas_kernels.gpu import ops
  for flag, fmt, attr, other in (("--mosaic-fp8", "fp8_e4m3", "MOSAIC_FP8", "MOSAIC_INT8"),
                                 ("--mosaic-int8", "int8", "MOSAIC_INT8", "MOSAIC_FP8")):
    monkeypatch.setattr(ops, "MOSAIC_FP8", False)  # restored after the test
    monkeypatch.setattr(ops, "MOSAIC_INT8", False)
    out = tmp_path / f"tp_{fmt}.json"
    rc = throughput.main(["--models", "tiny", "--formats", f"{fmt},bf16", "--contexts", "256", flag,
                          "--budget-gib", str(BUDGET_GIB), "--steps", "64", "--warm-steps", "4", "--skip-b1",
                          "--reps", "1", "--prefill", "32", "--target-s", "0.01", "--in-process", "--out",
                          str(out)])
    assert rc == 0 and getattr(ops, attr) and not getattr(ops, other)
    rows = {r["format"]: r for r in json.loads(out.read_text())["rows"]}
    assert rows[fmt][attr.lower()] is True and "error" not in rows[fmt]
    assert attr.lower() not in rows["bf16"] and other.lower() not in rows[fmt]


def test_kivi_words_g32_flag_reaches_the_rows(tmp_path, monkeypatch):
  """--kivi-words-g32: each row's process gives KIVI-2 G=32 caches the "words" layout on GPU
  (`kvjax.cache.WORDS_DEFAULT_GROUPS`, so the Mosaic kernel) and the row says so; bf16 rows do not."""
  from kvjax import cache as kvcache
  monkeypatch.setattr(kvcache, "WORDS_DEFAULT_GROUPS", (128,))  # restored after the test
  out = tmp_path / "tp.json"
  rc = throughput.main(["--models", "tiny", "--formats", "kivi2,bf16", "--contexts", "256", "--kivi-words-g32",
                        "--budget-gib", str(BUDGET_GIB), "--steps", "64", "--warm-steps", "4", "--skip-b1",
                        "--reps", "1", "--prefill", "32", "--target-s", "0.01", "--in-process", "--out", str(out)])
  assert rc == 0 and kvcache.WORDS_DEFAULT_GROUPS == (128, 32)
  assert kvcache.default_kivi_layout(formats.preset("kivi2"), 1024, 128, backend="gpu") == "words"
  rows = {r["format"]: r for r in json.loads(out.read_text())["rows"]}
  assert rows["kivi2"]["kivi_words_g32"] is True and "error" not in rows["kivi2"]
  assert "kivi_words_g32" not in rows["bf16"]


def test_merge_keeps_the_latest_run(tmp_path):
  """`--merge` keeps each (model, format, context)'s row from the latest session (by the `_sN` in the file
  name, not the glob's order: s22b after s5 and s9), a failed re-run never replacing a measured row."""
  import throughput_report
  row = lambda tps, **kw: {"model": "m", "format": "kivi2", "context": 32768, "tokens_per_s": tps, **kw}
  files = {"tp_m_32k_s22b.json": [row(1542.0)], "tp_m_32k_s5.json": [row(620.0)],
           "tp_m_32k_s9.json": [row(700.0), {**row(900.0), "format": "bf16"}],
           "tp_m_32k_s23.json": [row(None, error="timed out")], "tp_m_32k.json": [row(100.0)]}
  for name, rows in files.items():
    (tmp_path / name).write_text(json.dumps({"meta": {}, "rows": rows}))
  merged = throughput_report.merge(sorted(str(tmp_path / n) for n in files), str(tmp_path / "out.json"))
  got = {r["format"]: r["tokens_per_s"] for r in merged}
  assert got == {"kivi2": 1542.0, "bf16": 900.0}
  assert [throughput_report.run_order(n)[:2] for n in ("a_s16e.json", "a_s16d.json", "a.json")] == [
      (16, "e"), (16, "d"), (0, "")]


def test_merge_refuses_two_devices_and_summary_takes_a_failed_row(tmp_path):
  """Rows from an H100 and an H200 are not merged into one table (their bf16 ratios would mix cards); the
  summary prints a failed row (no max_batch: session 26's unknown format name) beside the measured ones."""
  import throughput_report
  row = lambda fmt, tps, mb: {"model": "llama3_8b", "format": fmt, "context": 32768, "tokens_per_s": tps,
                              "max_batch": mb}
  for name, device in (("a_s1.json", "NVIDIA H200"), ("b_s2.json", "NVIDIA H100 80GB HBM3")):
    (tmp_path / name).write_text(json.dumps({"meta": {"device": device}, "rows": [row("bf16", 500.0, 9)]}))
  with pytest.raises(ValueError, match="more than one device"):
    throughput_report.merge([str(tmp_path / "a_s1.json"), str(tmp_path / "b_s2.json")], str(tmp_path / "o.json"))
  merged = tmp_path / "merged.json"  # a merged table (its meta a list) merged again with a new run of its card
  throughput_report.merge([str(tmp_path / "a_s1.json")], str(merged))
  (tmp_path / "c_s3.json").write_text(json.dumps({"meta": {"device": "NVIDIA H200"}, "rows": [
      row("fp8_e4m3", 990.0, 19), {**row("fp8", None, None), "error": "unknown format"}]}))
  again = throughput_report.merge([str(merged), str(tmp_path / "c_s3.json")], str(tmp_path / "again.json"))
  assert {r["format"]: r["tokens_per_s"] for r in again} == {"bf16": 500.0, "fp8_e4m3": 990.0}  # "fp8": no format
  (tmp_path / "d_s4.json").write_text(json.dumps({"meta": {}, "rows": [dict(row("int8", 900.0, 19),
                                                                             device="NVIDIA H100 80GB HBM3")]}))
  with pytest.raises(ValueError, match="more than one device"):  # a row's device counts too
    throughput_report.merge([str(merged), str(tmp_path / "d_s4.json")], str(tmp_path / "o.json"))
  text = throughput_report.summary([row("bf16", 480.0, 9), {**row("fp8", None, None), "error": "unknown format"},
                                    row("fp8_e4m3", 952.0, 19)])
  assert "| fp8 | 32768 | None (-x) | - (-x) |" in text and "unknown format" in text
  assert "target fp8_e4m3 >= 1.9x bf16 tokens/s (llama3_8b, 32k): 1.98x (max batch 2.11x) MET" in text
  throughput_report.plot([row("bf16", 480.0, 9), {**row("fp8", None, None), "error": "unknown format"}],
                         str(tmp_path / "p.png"))  # the failed row has no bar, and no crash
  assert (tmp_path / "p.png").stat().st_size > 0


@pytest.mark.parametrize("flag, value, match", [("--formats", "bf16,fp8", "--formats: 'fp8'"),
                                                 ("--models", "llama3", "--models"),
                                                 ("--contexts", "0", "--contexts")])
def test_bad_names_fail_before_any_row(tmp_path, monkeypatch, flag, value, match):
  ran = []
  monkeypatch.setattr(throughput, "_subprocess_row", lambda *a, **k: ran.append(a) or {})
  argv = {"--models": "tiny", "--formats": "bf16", "--contexts": "256", flag: value}
  with pytest.raises(ValueError, match=match):
    throughput.main([x for kv in argv.items() for x in kv] + ["--out", str(tmp_path / "tp.json")])
  assert not ran and not (tmp_path / "tp.json").exists()
