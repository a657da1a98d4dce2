"""`benchmarks/ptx_mix.py`: the widest backward branch is the loop, instructions are classed by opcode
(the inline-asm WGMMA lines included), and instructions outside the loop are not counted."""

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))

import ptx_mix  # noqa: E402

PTX = """\
.visible .entry k(
)
{
\tmov.b32 \t%r1, 0;
\tshr.u16 \t%rs9, %rs8, 2;
$L__BB0_3:
\tsetp.lt.s32 \t%p1, %r1, 4;
$L__BB0_1:
\tshr.u16 \t%rs1, %rs2, 2;
\tand.b32 \t%r2, %r3, 196611;
\tor.b32 \t%r2, %r2, 1677747200;
\tadd.f16x2 \t%r4, %r2, %r5;
\t// begin inline asm
\t{ .reg .pred p; setp.ne.b32 p, 1, 0; wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 {%r6}, {%r4}, %rd1, p, 1, 1, 1; }
\t// end inline asm
\twgmma.commit_group.sync.aligned;
\tbar.sync %r34, 128;
\tex2.approx.f32 \t%r7, %r8;
\t@%p1 bra \t$L__BB0_1;
\tshfl.sync.bfly.b32 \t%r9, %r7, 1, 31, -1;
\tbra.uni \t$L__BB0_3;
$L__BB0_4:
\tret;
}
"""


def test_loop_mix_of_a_small_kernel(tmp_path):
  r = ptx_mix.mix(PTX)
  assert r["classes"] == {"int_shift": 1, "int_logic": 2, "fp": 2, "mma": 1, "sync": 2, "control": 3,
                          "shuffle": 1}
  assert r["total"] == 12  # the mov and shr before the loop and the ret after it are not counted
  path = tmp_path / "k.ptx"
  path.write_text(PTX)
  out = tmp_path / "mix.json"
  res = ptx_mix.main([str(path), "--out", str(out)])
  assert json.loads(out.read_text()) == res and res[str(path)]["total"] == 12


def test_no_loop_counts_everything():
  assert ptx_mix.mix("\tmov.b32 \t%r1, 0;\n\tret;\n")["total"] == 2
