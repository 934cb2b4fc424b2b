#!/usr/bin/env bash
# Naive PyTorch against flash-attn 2 (the write-up's "Pytorch" and "Flash2"): forward, backward and
# forward+backward time, FLOP/s and peak memory against seq_len (8 ... 512, then on to 16k; batch 32, 32 heads,
# emb_dim 2048; causal and not), against emb_dim (32 ... 2048 at seq_len 1024, causal) and against num_heads
# (1 ... 16 at emb_dim 32, seq_len 1024, causal), repeats 30, fp16; the write-up's JSON and its plots.
#
#   bash benchmarks/seeds/naive_vs_fa2.sh OUT [BACKENDS]   # default: --impl Pytorch plus fa2 (falls back to sdpa-flash)
#
# Writes OUT/naive_vs_fa2.db, OUT/benchmark_result.json (the write-up's rows), OUT/{time,flops,memory}_vs_*.png.
# Cases that cannot fit (naive's score matrix at long lengths) are recorded as oom, not run.
# SEED_QUICK=1 shrinks every axis (a smoke test of the script, e.g. on CPU with BACKENDS=sdpa-math).
set -uo pipefail
export COLUMNS=${COLUMNS:-220}  # wide tables in the logs (rich folds to 80 columns without a terminal)
out=${1:?output directory}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"; db="$out/naive_vs_fa2.db"
flash=$(python3 -c "from attnbench.backends import registry
print(next(b for b in ('fa2', 'sdpa-flash', 'sdpa-math') if b in registry.available('cuda')))" 2>/dev/null || echo sdpa-math)
backends=${2:-$flash}
quick=${SEED_QUICK:-0}
if [ "$quick" = 1 ]; then
  base=(--batch_size 2 --dtype fp32 --repeats 3 --warmup 1 --device cpu); seq=(8..64:x2); emb=(32..128:x2); heads=(1..4:x2)
  big=2; seq_emb=32; emb_seq=128
else
  base=(--batch_size 32 --dtype fp16 --repeats 30); seq=(8..512:x2 1k 2k 4k 8k 16k); emb=(32..2048:x2); heads=(1..16:x2)
  big=32; seq_emb=2048; emb_seq=1024
fi
run=(run --db "$db" --quiet --impl Pytorch --backends "$backends" --pass fwd bwd fwd_bwd "${base[@]}")
# Run again on the same OUT, the command finishes what a stopped run left (finished runs are kept).
state() { python3 -c "import sys; from attnbench.results.store import ResultStore as S
r = S(sys.argv[1]).run(sys.argv[2]) if __import__('os').path.exists(sys.argv[1]) else None
print(r['status'] if r else 'none')" "$db" "$1"; }
ab() {
  local id=${*: -1}
  case $1:$(state "$id") in
    run:done) echo "$id: already done" ;;
    run:none) python3 -m attnbench "$@" ;;
    run:*) python3 -m attnbench run --resume "$id" --db "$db" --quiet ;;
    *) python3 -m attnbench "$@" ;;
  esac
}

ab "${run[@]}" --num_heads "$big" --emb_dim "$seq_emb" --seq_len "${seq[@]}" --causal both --run-id naive-vs-fa2-seq \
  >> "$out/seq.txt" 2>&1 || echo "seq_len sweep ended with status $? (see seq.txt)"
ab "${run[@]}" --num_heads "$big" --emb_dim "${emb[@]}" --seq_len "$emb_seq" --causal --run-id naive-vs-fa2-emb \
  >> "$out/emb.txt" 2>&1 || echo "emb_dim sweep ended with status $? (see emb.txt)"
ab "${run[@]}" --num_heads "${heads[@]}" --emb_dim 32 --seq_len "$emb_seq" --causal --run-id naive-vs-fa2-heads \
  >> "$out/heads.txt" 2>&1 || echo "num_heads sweep ended with status $? (see heads.txt)"

python3 "$here/tables.py" naive-vs-fa2 --db "$db" --run naive-vs-fa2-seq naive-vs-fa2-emb naive-vs-fa2-heads -o "$out/benchmark_result.json"
for axis in seq_len:seq emb_dim:emb heads:heads; do
  for fig in time:ms flops:tflops memory:mem; do
    ab plot --db "$db" --run "naive-vs-fa2-${axis#*:}" --x "${axis%%:*}" --y "${fig#*:}" --logy \
      -o "$out/${fig%%:*}_vs_${axis%%:*}.png" > /dev/null 2>&1 || echo "no ${fig%%:*} plot against ${axis%%:*} (see plot)"
  done
done
ab report --db "$db" --run naive-vs-fa2-seq naive-vs-fa2-emb naive-vs-fa2-heads -o "$out/report.html" > /dev/null
ls "$out"
