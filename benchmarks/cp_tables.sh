#!/usr/bin/env bash
# The FA2 write-up's distributed performance tables: throughput, latency, peak memory and TFLOP/s per device
# for batch 2-128 at S=4k and S=8k-64k at batch 2, 16 heads, head size 128, bf16, non-causal,
# forward only and forward+backward, for ring, zigzag, Ulysses and USP on N GPUs of one host.
#
#   bash benchmarks/cp_tables.sh 2 sdpa-cudnn      # on 2 H200s (kind nvidia-h200-x2)
#   bash benchmarks/cp_tables.sh 4 fa2             # on 4 H200s, FA2 as the local kernel (its wheel installed)
#   bash benchmarks/cp_tables.sh 8 sdpa-cudnn      # on 8 H200s (kind nvidia-h200-x8)
#
# Writes logs and a results DB under ${OUT:-cp-tables}; the tables are the "### ..." blocks of the logs.
# TIMEOUT (default 300 s) bounds each of the two sweeps.
set -uo pipefail
N=${1:-8}
KERNEL=${2:-sdpa-cudnn}
OUT=${OUT:-cp-tables}
mkdir -p "$OUT"
export PYTHONPATH=src:${PYTHONPATH:-}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
DB="$OUT/tables.db"
TIMEOUT=${TIMEOUT:-300}
RUN=(python3 -m torch.distributed.run --nproc_per_node "$N" -m attnbench dist --kernel "$KERNEL"
     --method ring,zigzag,ulysses,usp --q-heads 16 --head-size 128 --dtype bf16 --no-causal --pass fwd fwd_bwd
     --warmup 3 --repeat 10 --no-check --db "$DB")
timeout "$TIMEOUT" "${RUN[@]}" --batch-size 2 8 16 64 128 --seq-lens 4096 > "$OUT/tables_${N}gpu_batch.log" 2>&1 \
  || echo "batch sweep failed or timed out: see $OUT/tables_${N}gpu_batch.log"
timeout "$TIMEOUT" "${RUN[@]}" --batch-size 2 --seq-lens 8k 16k 32k 64k > "$OUT/tables_${N}gpu_seq.log" 2>&1 \
  || echo "sequence sweep failed or timed out: see $OUT/tables_${N}gpu_seq.log"
grep -h -A12 "^### " "$OUT"/tables_"${N}"gpu_*.log | tee "$OUT/summary_${N}gpu.md"
