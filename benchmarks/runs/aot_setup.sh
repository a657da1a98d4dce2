#!/bin/bash
# Compile the Mosaic GPU kernels for an H200 on a machine without a GPU (session 16): a side venv with the
# CUDA plugin, and a CUDA_ROOT holding ptxas (CUDA 13: Mosaic emits PTX ISA 9.0), nvdisasm (same major
# version, for `ptx_registers.py`'s life ranges) and libdevice. Run from the repository root after
# `make setup`; then, for example:
#   CUDA_ROOT=/tmp/cudaroot JAX_PLATFORMS=cpu /tmp/cv/bin/python benchmarks/mosaic_sass.py \
#     --target-config benchmarks/results/h200_target_config.txtpb --ptxas /tmp/cudaroot/bin/ptxas \
#     --nvdisasm /tmp/cudaroot/bin/nvdisasm --out /tmp/sass.json
set -eu
VENV=${VENV:-/tmp/cv} ROOT=${CUDA_ROOT_DIR:-/tmp/cudaroot} WORK=$(mktemp -d)
[ -d "$VENV" ] || cp -r .venv "$VENV"
"$VENV/bin/python" -m pip install -q jax-cuda12-plugin==0.11.2 jax-cuda12-pjrt==0.11.2
dl() { python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_28_x86_64 -d "$WORK" "$@"; }
dl "nvidia-cuda-nvcc==13.1.*" nvidia-cuda-nvcc-cu12 "triton==3.9.*"
mkdir -p "$ROOT/bin" "$ROOT/nvvm/libdevice"
unzip -q -o -j "$WORK"/nvidia_cuda_nvcc-13*.whl 'nvidia/cu13/bin/ptxas' -d "$ROOT/bin"
unzip -q -o -j "$WORK"/nvidia_cuda_nvcc_cu12-*.whl 'nvidia/cuda_nvcc/nvvm/libdevice/libdevice.10.bc' -d "$ROOT/nvvm/libdevice"
unzip -q -o -j "$WORK"/triton-*.whl 'triton/backends/nvidia/bin/nvdisasm' -d "$ROOT/bin"
chmod +x "$ROOT/bin/ptxas" "$ROOT/bin/nvdisasm"
rm -rf "$WORK"
"$ROOT/bin/ptxas" --version | tail -n 1
"$ROOT/bin/nvdisasm" --version | tail -n 1
