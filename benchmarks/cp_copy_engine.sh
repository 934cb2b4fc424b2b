#!/usr/bin/env bash
# Ulysses' forward with its all-to-alls on NCCL (ulysses) and on the copy engines (ulysses-ce), one exchange and
# pipelined over head chunks, beside the local kernel alone at the shard's size; B = 1, 32 heads of 128, bf16,
# causal, the forward only (what ulysses-ce changes), each case with its per-step timeline.
#
#   bash benchmarks/cp_copy_engine.sh 2 fa3                      # on 2 H200s (kind nvidia-h200-x2)
#   LENGTHS="128k 512k" CHUNKS="1 4" bash benchmarks/cp_copy_engine.sh 4 fa3
#
# First the GPU tests of the copy-engine path (every rank against one GPU; repeated calls into the same buffers).
# Each method runs in a torchrun of its own, so that neither is timed second in a process.
# Logs and the results DB go under ${OUT:-cp-results}.
set -uo pipefail
N=${1:-2}
KERNEL=${2:-fa3}
OUT=${OUT:-cp-results}
LENGTHS=${LENGTHS:-128k 256k 512k}
CHUNKS=${CHUNKS:-1 4}
WARMUP=${WARMUP:-2}
REPEAT=${REPEAT:-5}
mkdir -p "$OUT"
export PYTHONPATH=src:${PYTHONPATH:-}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
DB="$OUT/cp.db"
SHAPE=(--batch-size 1 --q-heads 32 --kv-heads 32 --head-size 128 --dtype bf16 --causal)
RUN=(python3 -m torch.distributed.run --nproc_per_node "$N" -m attnbench dist)

[ "${TESTS:-1}" = 0 ] || timeout 200 python3 -m pytest -q -m gpu tests/gpu/test_dist_kernels.py -k "copy_engine or copy_rows" \
  -p no:cacheprovider -o addopts="" -rfEs > "$OUT/ce_tests.log" 2>&1; tail -3 "$OUT/ce_tests.log"
for S in $LENGTHS; do
  for C in $CHUNKS; do
    # each method in a process of its own: the method timed second in a process ran 2-4% slower kernels
    # (docs/distributed.md, "Run order matters")
    : > "$OUT/ce_${N}gpu_${KERNEL}_S${S}_c${C}.log"
    for M in ulysses ulysses-ce; do
      timeout 240 "${RUN[@]}" --method "$M" --ulysses-chunks "$C" --kernel "$KERNEL" "${SHAPE[@]}" \
        --seq-lens "$S" --pass fwd --warmup "$WARMUP" --repeat "$REPEAT" --no-check --timeline 3 --db "$DB" \
        >> "$OUT/ce_${N}gpu_${KERNEL}_S${S}_c${C}.log" 2>&1 || echo "$M at $S, $C chunks failed: see its log"
    done
  done
  LOCAL=$(python3 -c "from attnbench.sweep import parse_int_list as p; print(p('$S', 'S')[0] // $N)")
  timeout 200 python3 -m attnbench dist --method ring --kernel "$KERNEL" "${SHAPE[@]}" --seq-lens "$LOCAL" \
    --pass fwd --warmup "$WARMUP" --repeat "$REPEAT" --no-check --db "$DB" \
    > "$OUT/local_1gpu_S${LOCAL}_${KERNEL}.log" 2>&1 || echo "one-GPU harness at $LOCAL failed: see its log"
done
python3 -m attnbench export --db "$DB" --all-runs -o "$OUT/ce.csv" > /dev/null
grep -h -A6 "^### " "$OUT"/ce_*.log "$OUT"/local_1gpu_*.log | tee "$OUT/ce_summary.md"
