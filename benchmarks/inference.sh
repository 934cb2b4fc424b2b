#!/usr/bin/env bash
# Inference attention on one GPU, accuracy checked on every case:
#   decode   one new query per request against caches of 4k-128k keys (the shapes of decode.sh), contiguous
#            and paged caches (pages of 16 and 64 tokens), bf16 and fp8 (per-tensor and per-KV-head descales);
#   prefix   prefill with a prefix cache: 1k or 4k new queries per request against 16k or 64k keys, causal;
#   fp8      FlashAttention-3 prefill in fp8 against bf16 (same seed, same shapes), 4k-16k, causal both.
# Usage: bash benchmarks/inference.sh OUT_DIR [decode] [prefix] [fp8]   (no part named = all three)
set -euo pipefail
out=${1:?usage: inference.sh OUT_DIR [decode] [prefix] [fp8]}; shift
parts=${*:-decode prefix fp8}
mkdir -p "$out"
db="$out/inference.db"
ab() { python3 -m attnbench "$@"; }
[ -s "$out/calibrate.txt" ] || ab calibrate --db "$db" > "$out/calibrate.txt"

if [[ $parts == *decode* ]]; then
  decode() {  # $1 = run-id prefix; the rest: backends and options
    local tag=$1; shift
    dec() { ab run --db "$db" --pass fwd --no-causal --dtype bf16 fp8 fp8-head --head-size 128 --kv-heads 8 "$@"; }
    dec --run-id "$tag-b32-32k" --batch-size 32 --q-heads 32 --seq-lens 1 --kv-seq-lens 32768 "$@" > "$out/$tag-b32.txt"
    dec --run-id "$tag-b128-8k" --batch-size 128 --q-heads 32 --seq-lens 1 --kv-seq-lens 8192 "$@" > "$out/$tag-b128.txt"
    dec --run-id "$tag-b64-4k" --batch-size 64 --q-heads 32 --seq-lens 1 --kv-seq-lens 4096 "$@" > "$out/$tag-b64.txt"
    dec --run-id "$tag-b8-128k" --batch-size 8 --q-heads 64 --seq-lens 1 --kv-seq-lens 131072 "$@" > "$out/$tag-b8.txt"
    dec --run-id "$tag-mixed" --batch-size 1 --q-heads 32 --seq-lens 1,1,1,1,1,1,1,1 \
        --kv-seq-lens 1024,2048,4096,8192,16384,32768,65536,131072 "$@" > "$out/$tag-mixed.txt"
  }
  # paged backends: 16-token pages
  decode decode --skip-missing --backends sdpa-cudnn,fa3,fa3-varlen,fa3-kvcache,fa3-paged,flashinfer-decode,flashinfer-paged
  decode decode-p64 --skip-missing --backends fa3-paged,flashinfer-decode --backend-opt fa3-paged.page_size=64 \
    --backend-opt flashinfer-decode.page_size=64
fi

if [[ $parts == *prefix* ]]; then
  ab run --db "$db" --run-id prefix --pass fwd --causal --dtype bf16 --batch-size 4 --q-heads 32 --kv-heads 8 \
     --head-size 128 --seq-lens 1024 1024 4096 4096 --kv-seq-lens 16384 65536 16384 65536 \
     --skip-missing --backends sdpa-cudnn,sdpa-flash,flex,fa2,fa2-kvcache,fa3,fa3-varlen,fa3-kvcache,fa3-paged,flashinfer,flashinfer-paged \
     --backend-opt fa3-paged.page_size=64 --backend-opt flashinfer-paged.page_size=64 > "$out/prefix.txt"
fi

if [[ $parts == *fp8* ]]; then
  ab run --db "$db" --run-id fp8-prefill --pass fwd --causal both --dtype bf16 fp8 fp8-head --batch-size 2 \
     --q-heads 16 --head-size 128 --seq-lens 4096 8192 16384 --skip-missing --backends fa3 > "$out/fp8.txt"
fi
ab export --db "$db" --all-runs -o "$out/inference.csv"
