#!/usr/bin/env bash
# Everything that needs one GPU, in stages that each fit a 10-minute slot. Logs and DBs go under $OUT.
#   bash benchmarks/gpu_checks.sh tests        # GPU tests (timing tests serially, the rest in parallel)
#   bash benchmarks/gpu_checks.sh kernels      # backends at the reference shapes, varlen, reference scaling
#   bash benchmarks/gpu_checks.sh fa4          # FlashAttention-4 tests and timings (needs the fa4 wheels)
#   bash benchmarks/gpu_checks.sh e2e          # CogVideoX-2b with attention swapped, P5, sparsity sweep
#   bash benchmarks/gpu_checks.sh fidelity     # timing modes against ncu, calibrate, P2 default sweep
set -uo pipefail
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export PYTHONPATH=src:${PYTHONPATH:-} PYTHONUNBUFFERED=1
AB=(python3 -m attnbench)
SHAPE=(--batch-size 2 --q-heads 16 --head-size 128 --dtype bf16)
case "${1:?stage}" in
  tests)
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu,power.limit --format=csv | tee "$OUT/device.txt"
    "${AB[@]}" backends --device cuda > "$OUT/backends.txt" 2>&1
    timeout 300 python3 -m pytest -q -m gpu -n 6 -rs tests/gpu --ignore=tests/gpu/test_timing_gpu.py \
      -p no:cacheprovider > "$OUT/pytest_gpu.log" 2>&1; tail -3 "$OUT/pytest_gpu.log"
    timeout 200 python3 -m pytest -q -m gpu -rs tests/gpu/test_timing_gpu.py -p no:cacheprovider \
      > "$OUT/pytest_timing.log" 2>&1; tail -3 "$OUT/pytest_timing.log"
    ;;
  kernels)
    timeout 300 "${AB[@]}" run --skip-missing --backends sdpa-flash,sdpa-cudnn,sdpa-efficient,flex,sdpa-varlen,xformers,sage "${SHAPE[@]}" \
      --seq-lens 4096 16384 --causal both --pass fwd fwd_bwd --db "$OUT/backends.db" --output "$OUT/backends.json" \
      > "$OUT/backends_run.txt" 2>&1; tail -2 "$OUT/backends_run.txt"
    timeout 120 "${AB[@]}" run --skip-missing --backends flex,sdpa-varlen,xformers,sage-varlen,naive "${SHAPE[@]}" --seq-lens 4096,1024,2048,512 \
      --causal both --pass fwd fwd_bwd --db "$OUT/backends.db" --output "$OUT/backends_varlen.json" \
      > "$OUT/backends_varlen.txt" 2>&1; tail -2 "$OUT/backends_varlen.txt"
    timeout 60 python3 benchmarks/reference_scaling.py --json > "$OUT/reference_scaling.json" 2> "$OUT/reference_scaling.err"
    timeout 60 python3 benchmarks/reference_scaling.py --causal --json > "$OUT/reference_scaling_causal.json" 2>> "$OUT/reference_scaling.err"
    cat "$OUT"/reference_scaling*.json
    ;;
  fa4)
    timeout 240 python3 -m pytest -q -m gpu -n 4 -rs tests/gpu/test_backends_gpu.py -k "fa4" -p no:cacheprovider \
      > "$OUT/pytest_fa4.log" 2>&1; tail -3 "$OUT/pytest_fa4.log"
    timeout 200 "${AB[@]}" run --skip-missing --backends fa4,fa4-varlen,sdpa-cudnn "${SHAPE[@]}" --seq-lens 4096 8192 16384 --causal both \
      --pass fwd fwd_bwd --db "$OUT/fa4.db" --output "$OUT/fa4.json" > "$OUT/fa4_run.txt" 2>&1; tail -2 "$OUT/fa4_run.txt"
    ;;
  e2e)
    timeout 300 "${AB[@]}" e2e --model cogvideox-2b --steps 2 --warmup 1 --skip-missing --backends sdpa-flash,sdpa-cudnn,flex,fa4,sage \
      --db "$OUT/e2e.db" --output "$OUT/cogvideox2b.json" > "$OUT/cogvideox2b.txt" 2>&1; tail -25 "$OUT/cogvideox2b.txt"
    timeout 120 python3 benchmarks/e2e_native.py --model cogvideox-2b --backend sdpa-flash --repeat 3 \
      --output "$OUT/p5.json" > "$OUT/p5.txt" 2>&1; tail -5 "$OUT/p5.txt"
    for s in 0 0.5 0.8 0.95; do
      timeout 60 "${AB[@]}" run --skip-missing --backends flex-sparse --backend-opt flex-sparse.sparsity=$s --seq-lens 32768 --batch-size 1 \
        --q-heads 30 --head-size 64 --dtype fp16 --no-causal --pass fwd --repeat 10 --no-check --db "$OUT/e2e.db" --quiet \
        >> "$OUT/sparsity.txt" 2>&1
    done
    timeout 60 "${AB[@]}" run --skip-missing --backends sdpa-flash,flex --seq-lens 32768 --batch-size 1 --q-heads 30 --head-size 64 --dtype fp16 \
      --no-causal --pass fwd --repeat 10 --no-check --db "$OUT/e2e.db" >> "$OUT/sparsity.txt" 2>&1
    timeout 90 python3 benchmarks/sage_tradeoff.py --out "$OUT/sage_tradeoff" > "$OUT/sage.txt" 2>&1; tail -12 "$OUT/sage.txt"
    ;;
  fidelity)
    timeout 60 "${AB[@]}" calibrate --db "$OUT/fidelity.db" > "$OUT/calibrate.txt" 2>&1; tail -8 "$OUT/calibrate.txt"
    timeout 300 python3 benchmarks/fidelity.py --out "$OUT/fidelity" > "$OUT/fidelity.txt" 2>&1; tail -30 "$OUT/fidelity.txt"
    # P2: the default sweep, then where its time went (docs/results/archive/2026-11-22-h200-sweep-cost.md)
    ( time timeout 300 "${AB[@]}" run --db "$OUT/p2.db" --output "$OUT/p2.json" ) > "$OUT/p2.txt" 2>&1; tail -4 "$OUT/p2.txt"
    python3 benchmarks/sweep_cost.py "$OUT/p2.db" | head -13
    ;;
esac
