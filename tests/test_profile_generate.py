"""CPU smoke test of benchmarks/profile_generate.py: the kernel classes, the point parser and one traced generate
run of the tiny model (host-side XLA ops stand in for the GPU's kernels)."""

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))

import profile_generate  # noqa: E402


@pytest.mark.parametrize("name, cls", [("kvjax_mosaic_kivi2", "attention"), ("decode_fp8_kernel", "attention"),
                                       ("write_rows", "append"), ("kvjax_append_rows", "append"),
                                       ("input_scatter_fusion_3", "append"),
                                       ("sm90_xmma_gemm_bf16bf16_bf16f32", "matmul"), ("nvjet_tst_128x64", "matmul"),
                                       ("loop_add_fusion", "other")])
def test_classify(name, cls):
  assert profile_generate.classify(name) == cls


def test_group_kernels_sums_per_class():
  got = profile_generate.group_kernels({"kvjax_mosaic_kivi2": {"us": 10.0, "calls": 1},
                                        "write_rows": {"us": 2.5, "calls": 2},
                                        "cutlass_gemm": {"us": 1.25, "calls": 1}, "fusion": {"us": 0.5, "calls": 1}})
  assert got == {"attention": 10.0, "append": 2.5, "matmul": 1.25, "other": 0.5}


@pytest.mark.parametrize("text", ["bf16:8", "bf16:x:4096", "bf16:8:4096:1"])
def test_points_reject_bad_text(text):
  with pytest.raises(ValueError, match=f"--points: '{text}' must be format:batch:context"):
    profile_generate.parse_points(text)


def test_bad_batch_and_model_rejected():
  assert profile_generate.parse_points("bf16:0:4096,kivi2:8:32768") == [("bf16", 0, 4096), ("kivi2", 8, 32768)]
  with pytest.raises(ValueError, match=r"model must be one of .* got 'llama'"):
    profile_generate.profile_point("llama", "bf16", 2, 256)
  with pytest.raises(ValueError, match="context > steps, got batch 2, steps 8, context 8"):
    profile_generate.profile_point("tiny", "bf16", 2, 8, steps=8)


def test_cpu_smoke(tmp_path):
  out = tmp_path / "p.json"
  rows = profile_generate.main(["--model", "tiny", "--points", "kivi2:0:256", "--steps", "2", "--process", "CPU",
                                "--thread", "", "--budget-gib", "0.0005", "--out", str(out)])
  r, = rows
  assert r["batch"] >= 1 and r["busy_us"] > 0 and r["span_us"] > 0 and r["kernels"]
  assert set(r["classes"]) == {"attention", "append", "matmul", "other"}
  assert sum(r["classes"].values()) == pytest.approx(sum(k["us"] for k in r["kernels"].values()), abs=0.01)
  assert json.loads(out.read_text())["rows"][0]["format"] == "kivi2"
