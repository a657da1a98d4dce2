"""Session 37: how close `Options.fp8_mma`'s states are to the reference, beside the fp16 build's, in Mosaic
GPU's interpreter (`tests/test_mosaic_kivi.py`'s case: lengths 256 and 200, 2 fixed splits, 4 live query rows):
the largest |m - m_ref| where a split saw tokens, and the relative L2 errors of l and o. Run it at a commit to
measure that commit's build (the three B_K ranges of `benchmarks/NOTES_gpu.md`, session 37).

    python3 benchmarks/runs/session37_precision.py OUT.json [label]
"""

import dataclasses
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests"))

import numpy as np  # noqa: E402

from pallas_kernels import test_base  # noqa: E402
from pallas_kernels.gpu import mosaic_kivi as mk  # noqa: E402

FIXED = mk.Options(dequant_in_a=True, lazy_sums=True, unpack="denorm", scales_once=True, shift32=True,
                   manual_barriers=True)  # the default's step over fixed splits (as the reference's)


def main(out, label=""):
  q_t, ln, kc, ks, kz, vc, vs, vz = test_base.kivi2_unpacked_case((256, 200), rows=mk.ROWS)
  ref = [np.asarray(x)[..., :4] for x in mk.reference_states(q_t, ln, kc, ks, kz, vc, vs, vz, num_splits=2)]
  seen = ref[2] > 0
  commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
  rows = []
  for name, opt in (("fp16 default step", FIXED), ("fp8_mma", dataclasses.replace(FIXED, fp8_mma=True))):
    o, m, l = (np.asarray(x)[..., :4] for x in mk.kivi2_states(q_t, ln, mk.pack_keys(kc), ks, kz, mk.pack_values(vc),
                                                                vs, vz, num_splits=2, interpret=True, variant=opt,
                                                                live_rows=4))
    rows.append({"build": name, "label": label, "commit": commit, "m_abs_err": float(np.abs(m - ref[1])[seen].max()),
                 "l_rel_err": float(test_base.relative_error(l, ref[2])),
                 "o_rel_err": float(test_base.relative_error(o, ref[0]))})
    print(json.dumps(rows[-1]), flush=True)
  with open(out, "w") as fh:
    json.dump(rows, fh, indent=1)


if __name__ == "__main__":
  main(*sys.argv[1:])
