"""The README's main job runs and reports sane numbers."""

import json

from kvjax import demo


def test_demo_writes_table(tmp_path, capsys):
  out = tmp_path / "table.json"
  demo.main(["--out", str(out), "--context", "256", "--gen-formats", "bf16,fp8_e4m3,kivi4",
             "--max-new-tokens", "16"])
  result = json.loads(out.read_text())
  rows = {r["format"]: r for r in result["rows"]}
  assert set(rows) == set(demo.DEMO_FORMATS)
  assert rows["bf16"]["compression_vs_bf16"] == 1.0
  assert 0.50 <= rows["fp8_e4m3"]["compression_vs_bf16"] <= 0.51
  assert 0.14 <= rows["kivi2_g128"]["compression_vs_bf16"] <= 0.15
  assert 0.18 <= rows["kivi2"]["compression_vs_bf16"] <= 0.20
  assert rows["kivi2_g128"]["seqs_in_budget"] > 6 * rows["bf16"]["seqs_in_budget"]
  # more bits, less error
  assert rows["int8"]["key_rel_err"] < rows["int4"]["key_rel_err"]
  assert rows["kivi4"]["attn_rel_err_vs_bf16"] < rows["kivi2"]["attn_rel_err_vs_bf16"]
  assert rows["fp8_e4m3"]["key_rel_err"] < 0.05
  assert "| kivi2 |" in capsys.readouterr().out
  gen = {r["format"]: r for r in result["generate"]["rows"]}
  assert set(gen) == {"bf16", "fp8_e4m3", "kivi4"}
  assert gen["bf16"]["token_agreement_vs_bf16"] == 1.0
  assert gen["fp8_e4m3"]["cache_bytes"] < 0.55 * gen["bf16"]["cache_bytes"]
  # the trained reference LM mostly agrees with itself through a 4-bit cache
  assert gen["kivi4"]["token_agreement_vs_bf16"] > 0.5
