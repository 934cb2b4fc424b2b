#!/usr/bin/env bash
# Ulysses' forward with and without the head-chunk pipeline (dist --ulysses-chunks 1 | auto) on N GPUs of one
# host, beside the local kernel on one GPU at the shard's size: B = 1, H = 32, D = 128, bf16, causal, fwd.
#
#   bash benchmarks/cp_ulysses_pipeline.sh 2 fa3                 # on 2 GPUs (kind nvidia-h100-x2)
#   LENGTHS="128k 256k 512k" bash benchmarks/cp_ulysses_pipeline.sh 4 fa3
#
# First every method's per-rank check at 16k (the no-grad forward included: the timed path), then per length
# the two settings with a per-step timeline (wait / kernel / a2a), then the local kernel at S/N on GPU 0.
# Logs and a results DB under ${OUT:-cp-pipeline}; the last lines of each log are the tables.
set -uo pipefail
N=${1:-2}
KERNEL=${2:-fa3}
OUT=${OUT:-cp-pipeline}
LENGTHS=${LENGTHS:-128k 256k}
REPEAT=${REPEAT:-10}
mkdir -p "$OUT"
export PYTHONPATH=src:${PYTHONPATH:-}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
DB="$OUT/cp.db"
SHAPE=(--batch-size 1 --q-heads 32 --kv-heads 32 --head-size 128 --dtype bf16 --causal)
RUN=(python3 -m torch.distributed.run --nproc_per_node "$N" -m attnbench dist --kernel "$KERNEL" "${SHAPE[@]}")

[ "${CHECK:-1}" = 0 ] || timeout 300 "${RUN[@]}" --method ulysses,zigzag --seq-lens 16k --pass fwd fwd_bwd \
  --warmup 1 --repeat 3 --db "$DB" > "$OUT/check.log" 2>&1 || echo "check failed: see $OUT/check.log"
for S in $LENGTHS; do
  for CHUNKS in 1 auto; do
    timeout 240 "${RUN[@]}" --method ulysses --seq-lens "$S" --pass fwd --warmup 3 --repeat "$REPEAT" --no-check \
      --timeline 3 --ulysses-chunks "$CHUNKS" --db "$DB" > "$OUT/ulysses_S${S}_chunks${CHUNKS}.log" 2>&1 \
      || echo "ulysses at $S, chunks $CHUNKS failed: see its log"
  done
done
LOCAL=()
for S in $LENGTHS; do
  n=$(python3 -c "import sys; s='$S'.lower(); v=int(s[:-1])*{'k':1024,'m':1048576}[s[-1]] if s[-1] in 'km' else int(s); print(v // $N)")
  LOCAL+=("$n")
done
timeout 240 python3 -m attnbench run --backends "$KERNEL" --batch-size 1 --q-heads 32 --head-size 128 --dtype bf16 \
  --causal --pass fwd --seq-lens "${LOCAL[@]}" --db "$DB" > "$OUT/local.log" 2>&1 || echo "local run failed"
grep -h "ulysses\|TFLOP\|wait\|a2a\|kernel" "$OUT"/ulysses_*.log | head -60
tail -15 "$OUT/local.log"
