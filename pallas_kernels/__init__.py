"""Fused dequantize+attend decode kernels for kvjax (Pallas: GPU Triton and TPU Mosaic).

Importing this package registers the available backends with
`kvjax.dispatch`, so `kvjax.decode_attention(..., implementation=...)` can
select them. Each backend sits beside the shared test base in `test_base.py`.
"""

import importlib

for _name in ("pallas_kernels.gpu", "pallas_kernels.tpu"):
  try:
    importlib.import_module(_name)
  except ImportError:  # a backend not written yet or missing its deps
    pass
