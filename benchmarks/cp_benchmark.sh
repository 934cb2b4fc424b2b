#!/usr/bin/env bash
# P4 context-parallel benchmark: B = 1, H = 32, D = 128, bf16, causal and not, fwd and fwd+bwd, every
# method with one local kernel on N GPUs of one host; torch's native CP beside it (it runs the SDPA
# kernels only: cuDNN unless the local kernel is one of them); the same local kernel on one GPU at the
# shard's size for the per-device efficiency; a per-step timeline of every P4 case.
#
#   bash benchmarks/cp_benchmark.sh 2 fa3          # on 2 H200s (kind nvidia-h200-x2)
#   bash benchmarks/cp_benchmark.sh 4 cudnn        # on 4 H200s
#   LENGTHS=512k REPEAT=3 CAUSAL=causal CHECK=0 bash benchmarks/cp_benchmark.sh 2 fa3   # one long length per call
#
# Writes logs and a results DB under ${OUT:-cp-results}. Correctness is checked first at S = 16k
# (every rank against one GPU and the exact fp32 result); the long cases run with --no-check (the
# exact reference at 128k costs more than the timing itself). A length that runs out of memory is
# recorded as such and the next one still runs.
set -uo pipefail
N=${1:-2}
KERNEL=${2:-fa3}
OUT=${OUT:-cp-results}
LENGTHS=${LENGTHS:-128k 256k}
WARMUP=${WARMUP:-2}
REPEAT=${REPEAT:-5}
TIMELINE=${TIMELINE:-3}
CAUSAL=${CAUSAL:-both}            # both | causal | no-causal
case "$CAUSAL" in both) CAUSAL_OPT=(--causal both) ;; causal) CAUSAL_OPT=(--causal) ;; no-causal) CAUSAL_OPT=(--no-causal) ;;
                  *) echo "CAUSAL=$CAUSAL: give both, causal or no-causal" >&2; exit 2 ;; esac
METHODS=${METHODS:-zigzag,ring,ulysses,usp}
mkdir -p "$OUT"
export PYTHONPATH=src:${PYTHONPATH:-}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
DB="$OUT/cp.db"
SHAPE=(--batch-size 1 --q-heads 32 --kv-heads 32 --head-size 128 --dtype bf16)
RUN=(python3 -m torch.distributed.run --nproc_per_node "$N" -m attnbench dist)
case "$KERNEL" in sdpa-flash|sdpa-efficient|sdpa-cudnn) PEER_KERNEL=$KERNEL ;;
                  *) PEER_KERNEL=sdpa-cudnn ;; esac
RUN_BACKEND=$KERNEL

python3 -c "import torch; print(torch.__version__, torch.cuda.device_count(), torch.cuda.get_device_name())" \
  | tee "$OUT/device.txt"

# 1. correctness on N GPUs (every method, causal and not, fwd+bwd gradients checked)
[ "${CHECK:-1}" = 0 ] || timeout 300 "${RUN[@]}" --method ring,zigzag,ulysses,usp --kernel "$KERNEL" "${SHAPE[@]}" --seq-lens 16k \
  --causal both --pass fwd_bwd --warmup 2 --repeat 5 --db "$DB" > "$OUT/check_${N}gpu_${KERNEL}.log" 2>&1 \
  || echo "check run failed or timed out: see $OUT/check_${N}gpu_${KERNEL}.log"

for S in $LENGTHS; do
  # 2. every method in one job, then torch's CP (the peer to beat), each case with its timeline
  timeout 420 "${RUN[@]}" --method "$METHODS" --kernel "$KERNEL" "${SHAPE[@]}" --seq-lens "$S" \
    "${CAUSAL_OPT[@]}" --pass fwd fwd_bwd --warmup "$WARMUP" --repeat "$REPEAT" --no-check --timeline "$TIMELINE" --db "$DB" \
    > "$OUT/p4_${N}gpu_${KERNEL}_S${S}.log" 2>&1 || echo "P4 run at $S failed or timed out: see its log"
  timeout 300 "${RUN[@]}" --method torch-cp --kernel "$PEER_KERNEL" "${SHAPE[@]}" --seq-lens "$S" \
    "${CAUSAL_OPT[@]}" --pass fwd fwd_bwd --warmup "$WARMUP" --repeat "$REPEAT" --no-check --db "$DB" \
    > "$OUT/p4_${N}gpu_torch-cp_${PEER_KERNEL}_S${S}.log" 2>&1 || echo "torch-cp at $S failed: see its log"
  # 3. the local kernel alone on one GPU at the shard's size (S / N): the dist harness as a world of
  #    one, and the bare kernel through `attnbench run`
  LOCAL=$(python3 -c "from attnbench.sweep import parse_int_list as p; print(p('$S', 'S')[0] // $N)")
  timeout 300 python3 -m attnbench dist --method ring --kernel "$KERNEL" "${SHAPE[@]}" --seq-lens "$LOCAL" \
    "${CAUSAL_OPT[@]}" --pass fwd fwd_bwd --warmup "$WARMUP" --repeat "$REPEAT" --no-check --db "$DB" \
    > "$OUT/local_1gpu_S${LOCAL}_${KERNEL}.log" 2>&1 || echo "one-GPU harness at $LOCAL failed: see its log"
  timeout 300 python3 -m attnbench run --backends "$RUN_BACKEND" "${SHAPE[@]}" --seq-lens "$LOCAL" "${CAUSAL_OPT[@]}" \
    --pass fwd fwd_bwd --warmup "$WARMUP" --repeat "$REPEAT" --no-check --db "$DB" > "$OUT/local_run_S${LOCAL}_${RUN_BACKEND}.log" 2>&1 \
    || echo "one-GPU run at $LOCAL failed: see its log"
done

python3 -m attnbench export --db "$DB" --all-runs -o "$OUT/cp.csv" > /dev/null
grep -h -A8 "^### " "$OUT"/p4_*.log "$OUT"/local_1gpu_*.log | tee "$OUT/summary.md"
[ "${CHECK:-1}" = 0 ] || grep -c "verdict: pass" "$OUT/check_${N}gpu_${KERNEL}.log" | sed 's/^/checks passed: /' \
  | tee -a "$OUT/summary.md"
