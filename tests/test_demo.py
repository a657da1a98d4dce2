"""The README's main job runs and reports sane numbers."""

import json

from kvjax import demo


def test_demo_writes_table(tmp_path, capsys):
  out = tmp_path / "table.json"
  demo.main(["--out", str(out), "--context", "256"])
  rows = {r["format"]: r for r in json.loads(out.read_text())["rows"]}
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
