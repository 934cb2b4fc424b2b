#!/usr/bin/env bash
# Decode over a KV cache on one GPU: one new query per request against caches of 4k-128k keys, GQA,
# bf16, D=128, with every backend that takes the shape (contiguous and paged caches), accuracy checked.
# The shapes are the ones DEVICE-style decode tables use: B32 x 32k, B128 x 8k, B64 x 4k, B8 x 128k
# (64 query heads), and one step of 8 requests with mixed cache lengths (1k ... 128k).
#   bash benchmarks/decode.sh OUT_DIR
set -euo pipefail
out=${1:?usage: decode.sh OUT_DIR}
mkdir -p "$out"
db="$out/decode.db"
backends=sdpa-cudnn,sdpa-flash,sdpa-efficient,flex,fa2,fa2-varlen,fa2-kvcache,fa2-paged,fa3,fa3-varlen,fa3-kvcache,fa3-paged
run() { python3 -m attnbench run --db "$db" --skip-missing --backends "$backends" --pass fwd --no-causal --dtype bf16 \
          --head-size 128 --kv-heads 8 "$@"; }
python3 -m attnbench calibrate --db "$db" > "$out/calibrate.txt"
run --run-id decode-b32-32k  --batch-size 32  --q-heads 32 --seq-lens 1 --kv-seq-lens 32768  > "$out/b32.txt"
run --run-id decode-b128-8k  --batch-size 128 --q-heads 32 --seq-lens 1 --kv-seq-lens 8192   > "$out/b128.txt"
run --run-id decode-b64-4k   --batch-size 64  --q-heads 32 --seq-lens 1 --kv-seq-lens 4096   > "$out/b64.txt"
run --run-id decode-b8-128k  --batch-size 8   --q-heads 64 --seq-lens 1 --kv-seq-lens 131072 > "$out/b8.txt"
run --run-id decode-mixed    --batch-size 1   --q-heads 32 --seq-lens 1,1,1,1,1,1,1,1 \
    --kv-seq-lens 1024,2048,4096,8192,16384,32768,65536,131072 > "$out/mixed.txt"
python3 -m attnbench export --db "$db" --all-runs -o "$out/decode.csv"
