#!/usr/bin/env bash
# Recurrence and sparse-MLA cases on one GPU through `attnbench run`, at the models' presets; the logs and the
# store go to $OUT (default ./operators-out). Needs fla-core (recurrences) and FlashMLA (sparse MLA) installed.
#   bash benchmarks/operators_gpu.sh sparse|recurrence
set -uo pipefail
OUT=${OUT:-operators-out}
mkdir -p "$OUT"
DB="$OUT/operators.db"
ab() { echo "\$ attnbench $*" | tee -a "$OUT/$PART.log"; COLUMNS=100 python3 -m attnbench "$@" --db "$DB" 2>&1 | tee -a "$OUT/$PART.log"; }
PART=${1:-sparse}
case "$PART" in
sparse)
  ab run --preset deepseek-v3.2-sparse-prefill --backends flashmla-sparse,sparse-torch
  ab run --preset deepseek-v3.2-sparse-prefill --q-heads 64 --backends flashmla-sparse,sparse-torch
  ab run --preset deepseek-v3.2-sparse-prefill --indices random --backends flashmla-sparse
  ab run --preset deepseek-v3.2-sparse-prefill --backends flex-sparse-mla
  ab run --preset deepseek-v3.2-sparse-decode --backends flashmla-sparse-fp8,sparse-torch
  ab run --preset deepseek-v3.2-sparse-decode --seq-lens 1 --kv-seq-lens 8192 --backends flashmla-sparse-fp8
  # the dense MLA decode at the same cache length (bf16 cache): what the selection saves
  # (timed unchecked, as on 2026-11-28, when the yardstick still copied the one KV head per query head: 77 GB here;
  #  it no longer does, so dropping --no-check should now fit, not yet tried on a GPU)
  ab run --preset deepseek-v3 --batch-size 128 --seq-lens 2 --kv-seq-lens 32768 --backends flashmla --no-check
  # the step as a server runs it: the indexer, then the sparse attention over what it selected
  ab run --preset deepseek-v3.2-indexer --backends indexer-torch
  ab run --preset deepseek-v3.2-indexer --seq-lens 4096 --kv-seq-lens 4096 --backends indexer-torch,indexer-fla
  ab run --preset deepseek-v4-sparse-decode --batch-size 8 --backends sparse-torch,flashmla-sparse-fp8 --skip-missing
  ;;
recurrence)
  ab run --preset qwen3.5-gdn --seq-lens 4096 32768 --backends fla-chunk,fla-recurrent,torch-chunked
  ab run --preset qwen3.5-gdn --q-heads 2 --v-heads 8 --seq-lens 32768 --backends fla-chunk,fla-recurrent
  ab run --preset qwen3-next-80b-gdn --seq-lens 8192 --pass fwd fwd_bwd --backends fla-chunk,torch-chunked --skip-missing
  ab run --preset qwen3.5-gdn --decode --batch-size 1 64 256 --backends fla-recurrent,torch-recurrent
  ab run --preset kimi-linear-kda --seq-lens 8192 --backends fla-chunk,fla-recurrent,torch-chunked
  ab run --preset mamba2-2.7b --seq-lens 8192 --backends fla-chunk,fla-recurrent,torch-chunked
  ;;
esac
