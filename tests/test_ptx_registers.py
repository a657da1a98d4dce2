"""`benchmarks/ptx_registers.py` (register life ranges from nvdisasm -plr) and `benchmarks/mosaic_sass.py`'s
CPU side (its build list and the reading of Mosaic GPU's dumps), on synthetic text: the conditional
backward branch is the loop, the unconditional one (an out-of-line barrier-wait retry) is not, and a
register defined before the loop and used after it without being touched inside is live-through."""

import importlib.util
import os
import shutil
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))

import mosaic_sass  # noqa: E402
from pallas_kernels.gpu import mosaic_fp8 as mf  # noqa: E402
from pallas_kernels.gpu import mosaic_decode  # noqa: E402
import ptx_registers  # noqa: E402

HEADER = " " * 40 + "// |   # 0 1 2 3 |"
POS = {r: HEADER.index("#") + 2 + 2 * r for r in range(4)}


def row(text, count, states):
  line = list(text.ljust(40) + "// |" + f"{count:>4}" + " " * 12 + "|")
  for r, ch in states.items():
    line[POS[r]] = ch
  return "".join(line)


PLR = "\n".join([
    HEADER,
    row("        /*0000*/  MOV R0, 0x1 ;", 1, {0: "^"}),
    row("        /*0010*/  MOV R3, 0x2 ;", 2, {0: ":", 3: "^"}),
    row(".L_x_1:", 2, {0: ":", 3: ":"}),
    row("        /*0020*/  IADD R1, R0, 0x1 ;", 3, {0: "v", 1: "^", 3: ":"}),
    row("        /*0030*/  @P0 BRA `(.L_x_1) ;", 3, {0: ":", 1: ":", 3: ":"}),
    row("        /*0040*/  STS [R1], R3 ;", 2, {1: "v", 3: "v"}),
    row("        /*0050*/  EXIT ;", 0, {}),
    row(".L_x_2:", 0, {}),
    row("        /*0060*/  BRA `(.L_x_1) ;", 0, {}),
])


def test_loop_and_live_through_registers():
  out = ptx_registers.analyze(PLR)
  assert out["instructions"] == 7 and out["peak_live"] == 3
  assert out["loop_instructions"] == 2 and out["loop_peak_live"] == 3
  assert out["loop_head_live"] == 2  # R0 and R3
  assert out["live_through"] == [3]  # R0 is read inside the loop; R3 only after it


def _fetch_loop(guarded):
  """A tile loop whose refetch (2 copies) is skipped when none is due and, if guarded, on the wrong warp."""
  text = ["        /*0000*/  MOV R0, 0x1 ;", ".L_x_1:", "        /*0010*/  FADD R1, R1, R0 ;",
          "        /*0020*/  @P1 BRA `(.L_x_2) ;"]
  if guarded:
    text += ["        /*0030*/  SHFL.IDX PT, R2, R0, RZ, 0x1f ;", "        /*0040*/  @P0 BRA `(.L_x_2) ;"]
  text += ["        /*0050*/  R2UR UR4, R3 ;", "        /*0060*/  UTMALDG.3D [UR8], [UR4] ;",
           "        /*0070*/  UTMALDG.3D [UR10], [UR4] ;", ".L_x_2:", "        /*0080*/  FMUL R1, R1, R0 ;",
           "        /*0090*/  @P2 BRA `(.L_x_1) ;", "        /*00a0*/  EXIT ;"]
  return "\n".join([HEADER] + [row(t, 1, {}) for t in text])


def test_fetch_block_and_whether_one_warp_runs_it():
  every, one = ptx_registers.analyze(_fetch_loop(False)), ptx_registers.analyze(_fetch_loop(True))
  assert (every["loop_fetch_block"], every["loop_fetch_one_warp"]) == (3, False)
  assert (one["loop_fetch_block"], one["loop_fetch_one_warp"]) == (3, True)
  assert ptx_registers.analyze(PLR)["loop_fetch_block"] == 0  # no copies in the loop


def test_if_else_arms_and_the_shortest_path():
  """A loop holding an if / else (the masked arm falls through, 3 instructions with its jump; the unmasked
  arm 1): both arms counted, the shortest path through the loop takes the shorter one."""
  text = ["        /*0000*/  MOV R0, 0x1 ;", ".L_x_1:", "        /*0010*/  FADD R1, R1, R0 ;",
          "        /*0020*/  @!P0 BRA `(.L_x_3) ;", "        /*0030*/  FSEL R1, R1, RZ, P1 ;",
          "        /*0040*/  FSEL R2, R2, RZ, P1 ;", "        /*0050*/  BRA `(.L_x_4) ;", ".L_x_3:",
          "        /*0060*/  FMUL R1, R1, R0 ;", ".L_x_4:", "        /*0070*/  FADD R1, R1, R2 ;",
          "        /*0080*/  @P2 BRA `(.L_x_1) ;", "        /*0090*/  EXIT ;"]
  out = ptx_registers.analyze("\n".join([HEADER] + [row(t, 1, {}) for t in text]))
  assert out["loop_instructions"] == 8 and out["loop_if_else"] == [(3, 1)]
  assert out["loop_shortest_path"] == 5
  plain = ptx_registers.analyze(PLR)
  assert plain["loop_if_else"] == [] and plain["loop_shortest_path"] == plain["loop_instructions"]


def test_no_header_is_an_error():
  with pytest.raises(ValueError, match="life-range header"):
    ptx_registers.analyze("        /*0000*/  EXIT ;")


def test_build_list_and_dump_reading(tmp_path):
  assert mosaic_sass.parse_builds("a:dequant_mask_s16_bal;b:dequant_mask_s16_bal:window;c:dequant_denorm:merged;"
                                  "d:dequant_denorm:merged_cluster") == [
      ("a", "dequant_mask_s16_bal", ""), ("b", "dequant_mask_s16_bal", "window"), ("c", "dequant_denorm", "merged"),
      ("d", "dequant_denorm", "merged_cluster")]
  with pytest.raises(ValueError, match="name:variant"):
    mosaic_sass.parse_builds("a:dequant_mask_s16_bal:twice")
  with pytest.raises(ValueError, match="variant must be one of"):
    mosaic_sass.parse_builds("a:nope")
  # a preset with Options fields changed
  assert mosaic_sass.parse_builds("c:dequant_denorm+lag=2+shift32=True") == [("c", "dequant_denorm+lag=2+shift32=True", "")]
  assert mosaic_sass.pipeline_stages("dequant_denorm+stages=3+lag=2") == ("dequant_denorm+lag=2", 3)  # not a field
  assert mosaic_sass.pipeline_stages("dequant_denorm") == ("dequant_denorm", 2)
  assert mosaic_sass.pipeline_stages("fp8+stages=3") == ("fp8+stages=3", 2)  # Fp8Options.stages is one
  assert mosaic_sass.parse_builds("s:dequant_denorm+stages=3:glue") == [("s", "dequant_denorm+stages=3", "glue")]
  opt = mosaic_sass.variant_options("dequant_denorm+lag=2+shift32=True+lag=None")
  assert opt.lag is None and opt.shift32 and opt.unpack == "denorm"
  with pytest.raises(ValueError, match="'lags' is not an Options field"):
    mosaic_sass.parse_builds("a:dequant_denorm+lags=2")
  with pytest.raises(ValueError, match="shift32 needs unpack"):  # Options' own validation
    mosaic_sass.variant_options("lean+shift32=True")
  # the FP8 kernel's builds: 'fp8' over `Fp8Options`
  fp8 = mosaic_sass.variant_options("fp8+tile=64+key_terms=3")
  assert isinstance(fp8, mf.Fp8Options) and fp8.tile == 64 and fp8.key_terms == 3 and fp8.stages == 2
  fused = mosaic_sass.variant_options("fp8+fused=True+merge=cluster")  # strings stay strings; str() round-trips
  assert fused == mf.Fp8Options(fused=True, merge="cluster") and str(fused) == "fp8+fused=True+merge=cluster"
  assert mf.Fp8Options().merge == "count" and str(mf.Fp8Options(fused=True)) == "fp8+fused=True"
  with pytest.raises(ValueError, match="merge must be one of"):
    mosaic_sass.variant_options("fp8+merge=atomic")
  with pytest.raises(ValueError, match="key_terms must be"):
    mosaic_sass.variant_options("fp8+key_terms=1")
  with pytest.raises(ValueError, match="not a build of --kernel kivi2"):
    mosaic_sass.main(["--builds", "f:fp8", "--out", str(tmp_path / "x.json")])
  with pytest.raises(ValueError, match="not a build of --kernel fp8"):
    mosaic_sass.main(["--kernel", "fp8", "--builds", "d:dequant_denorm", "--out", str(tmp_path / "x.json")])
  (tmp_path / "k.resources.txt").write_text("Resources(smem_scratch_bytes=77824, tmem_scratch_cols=0)")
  (tmp_path / "k.ptxas").write_text("ptxas info    : Used 141 registers, used 2 barriers\n"
                                    "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n")
  (tmp_path / "k.ptx").write_text(".version 9.0\n")
  out = mosaic_sass.read_dumps(str(tmp_path))
  assert out["registers"] == 141 and out["spill_store_bytes"] == 0
  assert out["programs_per_sm_by_registers"] == 3  # 144 x 128 threads: 3 programs in 65536 registers
  assert out["smem_bytes"] == 77824 and out["programs_per_sm_by_smem"] == 2  # (76 + 1) KB in 228
  assert out["files"] == ["k.ptx", "k.ptxas", "k.resources.txt"]


CUDA_ROOT = os.environ.get("CUDA_ROOT", "")


@pytest.mark.skipif(importlib.util.find_spec("jax_cuda12_plugin") is None
                    or not os.path.exists(os.path.join(CUDA_ROOT, "bin", "ptxas"))
                    or shutil.which("nvdisasm", path=os.path.join(CUDA_ROOT, "bin")) is None,
                    reason="compiling for the H200 on the CPU needs jax-cuda12-plugin and CUDA_ROOT with "
                           "bin/ptxas (CUDA >= 13), bin/nvdisasm and nvvm/libdevice")
def test_compiles_the_kernel_for_an_h200_without_one(tmp_path):
  """`mosaic_sass.py --target-config`: the default preset's registers and tile loop (session 17: 125
  registers, a loop of 784 SASS instructions; session 16's `opaque_magic` default 128 and 988)."""
  target = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "results", "h200_target_config.txtpb")
  bin_ = os.path.join(CUDA_ROOT, "bin")
  (row,) = mosaic_sass.main(["--builds", f"d:{mosaic_decode.DEFAULT_VARIANT}", "--point", "1:1024", "--splits", "2",
                             "--target-config", target, "--ptxas", os.path.join(bin_, "ptxas"),
                             "--nvdisasm", os.path.join(bin_, "nvdisasm"), "--dump-root", str(tmp_path / "d"),
                             "--out", str(tmp_path / "o.json")])
  assert row["registers"] <= 128 and row["programs_per_sm_by_registers"] == 4
  assert 0 < row["sass_loop_instructions"] < 850
  (fp8,) = mosaic_sass.main(["--kernel", "fp8", "--builds", "f:fp8", "--point", "1:1024", "--splits", "2",
                             "--target-config", target, "--ptxas", os.path.join(bin_, "ptxas"),
                             "--nvdisasm", os.path.join(bin_, "nvdisasm"), "--dump-root", str(tmp_path / "f"),
                             "--out", str(tmp_path / "f.json")])
  # session 19 (the code tiles swizzled, each loaded whole): 163-165 registers (session 18's 16-byte tiles 110),
  # 76 KB of shared memory (2 programs per SM, which the registers allow), 719 instructions a 128-token step
  assert fp8["programs_per_sm_by_smem"] == 2 and fp8["programs_per_sm_by_registers"] >= 2
  assert 0 < fp8["sass_loop_instructions"] < 800
