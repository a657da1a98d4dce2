#!/bin/bash
# Session 33's first call: on an H200 (the card issues 3 and 7 name, rarely lent), issue 7's Llama-3-8B 32k rows
# (session32_b.sh); on an H100, session33_a.sh (INT8 through the Mosaic FP8 kernel).
card=$(nvidia-smi --query-gpu=name --format=csv,noheader)
if [[ "$card" == *H200* ]]; then exec bash "$(dirname "$0")/session32_b.sh"; fi
exec bash "$(dirname "$0")/session33_a.sh"
