#!/usr/bin/env bash
# P4 context-parallel benchmark: total S = 128k, B = 1, H = 32, D = 128, bf16, causal and not,
# fwd and fwd+bwd, every method, on N GPUs of one host; plus the single-GPU local kernel at the
# local shard shape (S = 128k / N) for the "90% of one GPU" comparison.
#
#   bash benchmarks/cp_benchmark.sh 4 flash        # on 4 H200s (kind nvidia-h200-x4)
#   bash benchmarks/cp_benchmark.sh 2 cudnn        # on 2 H200s
#
# Writes logs and a results DB under ${OUT:-cp-results}. Correctness is checked first at S = 16k
# (every rank against one GPU and the exact fp32 result); the 128k timings run with --no-check
# (the exact reference at 128k costs more than the timing itself).
set -euo pipefail
N=${1:-4}
KERNEL=${2:-flash}
OUT=${OUT:-cp-results}
mkdir -p "$OUT"
export PYTHONPATH=src:${PYTHONPATH:-}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
DB="$OUT/cp.db"
SHAPE=(--batch-size 1 --q-heads 32 --kv-heads 32 --head-size 128 --dtype bf16)
RUN=(python3 -m torch.distributed.run --nproc_per_node "$N" -m attnbench dist)

python3 -c "import torch; print(torch.__version__, torch.cuda.device_count(), torch.cuda.get_device_name())" \
  | tee "$OUT/device.txt"

# 1. correctness on N GPUs (all methods, causal and not, fwd+bwd gradients checked)
timeout 240 "${RUN[@]}" --method ring,zigzag,ulysses,usp,torch-cp --kernel "$KERNEL" "${SHAPE[@]}" --seq-lens 16k \
  --causal both --pass fwd_bwd --warmup 2 --repeat 5 --db "$DB" > "$OUT/check_${N}gpu_${KERNEL}.log" 2>&1 \
  || echo "check run failed or timed out: see $OUT/check_${N}gpu_${KERNEL}.log"

# 2. P4 timings at 128k total, every method in one job (records are stored case by case; the best
#    method is the P4 number; torch-cp last, as the peer to beat)
timeout 360 "${RUN[@]}" --method zigzag,ring,ulysses,usp,torch-cp --kernel "$KERNEL" "${SHAPE[@]}" --seq-lens 128k \
  --causal both --pass fwd fwd_bwd --warmup 2 --repeat 5 --no-check --db "$DB" \
  > "$OUT/p4_${N}gpu_${KERNEL}.log" 2>&1 || echo "P4 run failed or timed out: see $OUT/p4_${N}gpu_${KERNEL}.log"

# 3. the same local kernel on one GPU at the local shard shape (S = 128k / N), same harness
#    (world of one: `attnbench dist` without torchrun), for the per-device 90% target
LOCAL=$((131072 / N))
timeout 150 python3 -m attnbench dist --method ring --kernel "$KERNEL" "${SHAPE[@]}" --seq-lens "$LOCAL" --causal both \
  --pass fwd fwd_bwd --warmup 2 --repeat 5 --no-check --db "$DB" > "$OUT/local_1gpu_S${LOCAL}_${KERNEL}.log" 2>&1
#    and the bare kernel through `attnbench run` (no fp32 merge buffers), same shape
case "$KERNEL" in flash|efficient|cudnn) RUN_BACKEND=sdpa-$KERNEL ;; *) RUN_BACKEND=$KERNEL ;; esac
timeout 120 python3 -m attnbench run --backends "$RUN_BACKEND" "${SHAPE[@]}" --seq-lens "$LOCAL" --causal both \
  --pass fwd fwd_bwd --warmup 2 --repeat 5 --no-check --db "$DB" > "$OUT/local_run_S${LOCAL}_${RUN_BACKEND}.log" 2>&1 || true

grep -h -A8 "^### " "$OUT"/p4_*.log "$OUT"/local_1gpu_*.log | tee "$OUT/summary.md"
grep -c "verdict: pass" "$OUT/check_${N}gpu_${KERNEL}.log" | sed 's/^/checks passed: /' | tee -a "$OUT/summary.md"
