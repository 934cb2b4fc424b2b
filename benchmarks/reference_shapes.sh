#!/usr/bin/env bash
# The shapes of the reference table in docs/results: B=2, H=16, D=128, bf16, forward, SDPA kernels.
# Usage: bash benchmarks/reference_shapes.sh OUTDIR [extra attnbench run args]
set -euo pipefail
out=${1:?output directory}; shift || true
mkdir -p "$out"
python3 -m attnbench run --backends sdpa-flash,sdpa-cudnn,sdpa-efficient --batch-size 2 --q-heads 16 \
  --head-size 128 --dtype bf16 --no-causal --pass fwd --seq-lens 4096 8192 16384 --warmup 10 --repeat 50 \
  --db "$out/reference.db" --output "$out/reference.json" "$@"
