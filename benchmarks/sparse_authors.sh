#!/usr/bin/env bash
# FlashMLA's own sparse test scripts and attnbench at the same shapes, on one GPU in one call; logs under $OUT.
#   bash benchmarks/sparse_authors.sh TESTS      TESTS: FlashMLA's tests/ folder (with kernelkit), flash_mla installed
# 1. their.jsonl: benchmarks/flashmla_own.py (their kineto kernel times, 8 GB memset before each call, every slot
#    counted; the SM clock sampled across the calls).
# 2. attnbench at their shapes (random distinct indices, every slot valid: --empty-slots 0, a sink), three ways:
#    events with a cold L2 back to back (the default), events with the GPU idle as long as a call before each
#    (--idle-ratio 1: the clock of isolated calls), and the profiler's kernel time (--timing profiler);
#    then the V3.2 preset as the run draws it (1/64 empty slots: FLOPs over valid slots).
# 3. compare.txt: their time beside each of attnbench's, and the clocks each ran at.
set -uo pipefail
TESTS=${1:?FlashMLA tests folder}
OUT=${OUT:-sparse-authors-out}; mkdir -p "$OUT"
DB="$OUT/sparse.db"
export PYTHONUNBUFFERED=1 COLUMNS=100
python3 benchmarks/flashmla_own.py --tests "$TESTS" > "$OUT/their.jsonl" 2> "$OUT/their.err"
echo "flashmla_own: exit $? ($(wc -l < "$OUT/their.jsonl") cases)"
ab() { echo "\$ attnbench $*" >> "$OUT/runs.log"; python3 -m attnbench "$@" --db "$DB" >> "$OUT/runs.log" 2>&1;
       echo "attnbench $*: exit $?"; }
PRE=(--op sparse-mla --q-heads 128 --seq-lens 4096 --kv-seq-lens 8192 32768 65536 131072 --topk 2048 --sink
     --indices random --empty-slots 0 --backends flashmla-sparse)
DEC=(--op sparse-mla --decode --batch-size 2 64 128 --q-heads 128 --seq-lens 2 --kv-seq-lens 32768 --topk 2048
     --sink --indices random --empty-slots 0 --backends flashmla-sparse-fp8)
ab run "${PRE[@]}" --run-id prefill-events
ab run "${PRE[@]}" --idle-ratio 1 --no-check --run-id prefill-idle
ab run "${PRE[@]}" --timing profiler --no-check --run-id prefill-profiler
ab run "${DEC[@]}" --run-id decode-events
ab run "${DEC[@]}" --idle-ratio 1 --no-check --run-id decode-idle
ab run "${DEC[@]}" --timing profiler --no-check --run-id decode-profiler
ab run --preset deepseek-v3.2-sparse-prefill --sink --backends flashmla-sparse --run-id preset-prefill
python3 benchmarks/sparse_authors_table.py "$OUT/their.jsonl" "$DB" > "$OUT/compare.txt" 2>&1
cat "$OUT/compare.txt"
