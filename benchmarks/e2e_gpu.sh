#!/usr/bin/env bash
# The end-to-end and sparsity runs to do on an H100/H200. Run from the repository root after the
# carried wheels are installed (diffusers, sage; fa4 separately). Outputs go under ${OUT:-e2e-out}.
set -uo pipefail
OUT=${OUT:-e2e-out}; mkdir -p "$OUT"; DB="$OUT/e2e.db"
export PYTHONPATH=src:${PYTHONPATH:-}
python3 -c "import torch; print(torch.cuda.get_device_name(), torch.__version__)" | tee "$OUT/device.txt"
# The CogVideoX-2b table: CogVideoX-2b, all 30 layers, one denoising step (B=2, 17,776 tokens, fp16).
python3 -m attnbench e2e --model cogvideox-2b --steps 3 --warmup 1 \
  --skip-missing --backends sdpa-flash,sdpa-cudnn,flex,fa4,sage --db "$DB" --output "$OUT/cogvideox2b.json" 2>&1 | tee "$OUT/cogvideox2b.txt"
# P5: swap overhead against the native call (target <= 2%).
python3 benchmarks/e2e_native.py --model cogvideox-2b --backend sdpa-flash --repeat 5 --output "$OUT/p5.json" 2>&1 | tee "$OUT/p5.txt"
# Sparsity sweep at S = 32k (the CogVideoX-2b write-up's kernel-level sweep), both causal settings.
for s in 0 0.3 0.5 0.7 0.8 0.9 0.95; do
  python3 -m attnbench run --skip-missing --backends flex-sparse --backend-opt flex-sparse.sparsity=$s \
    --seq-lens 32768 --batch-size 1 --q-heads 30 --head-size 64 --dtype fp16 --causal both --pass fwd \
    --repeat 20 --db "$DB" --quiet 2>&1 | tee -a "$OUT/sparsity.txt"
done
python3 -m attnbench run --skip-missing --backends sdpa-flash,flex --seq-lens 32768 --batch-size 1 --q-heads 30 --head-size 64 \
  --dtype fp16 --causal both --pass fwd --repeat 20 --db "$DB" 2>&1 | tee -a "$OUT/sparsity.txt"
# SageAttention speed vs accuracy (needs the sage wheel).
python3 benchmarks/sage_tradeoff.py --out "$OUT/sage_tradeoff" 2>&1 | tee "$OUT/sage.txt"
# GPU tests of this part.
python3 -m pytest -q -m gpu tests/gpu/test_e2e_gpu.py 2>&1 | tee "$OUT/pytest_gpu.txt"
