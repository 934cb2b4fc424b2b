#!/usr/bin/env bash
# The seed write-ups' figures (000: duration / TFLOP/s / GB/s vs seq_len, single and grouped sequences;
# 003: time / TFLOP/s / peak memory vs seq_len, emb_dim and num_heads), one run + one plot each, then one
# HTML report of all the runs. Smaller than the README's commands so that it fits a short GPU session.
# Usage: PYTHONPATH=src bash benchmarks/seed_figures.sh OUTDIR [BACKENDS]   (default: sdpa-flash,sdpa-cudnn)
set -euo pipefail
out=${1:?output directory}; backends=${2:-sdpa-flash,sdpa-cudnn}
mkdir -p "$out"
db="$out/seeds.db"
ab() { python3 -m attnbench "$@"; }
common=(--db "$db" --quiet --warmup 5 --repeat 30)

ab run "${common[@]}" --backends "$backends" --q-heads 32 --head-size 128 --batch-size 1 --dtype fp16 \
  --no-causal --pass fwd --seq-lens 128..16k:x2 --run-id seed000-single
for y in ms tflops gbps; do ab plot --db "$db" --run seed000-single --x seq_len --y $y -o "$out/000-single-$y.png"; done

groups=$(for n in 1 2 4 8 16 32 64; do printf '%s ' "$(yes 128 | head -n $n | paste -sd,)"; done)
# shellcheck disable=SC2086  # one word per group
ab run "${common[@]}" --backends "naive,$backends" --q-heads 32 --head-size 128 --batch-size 1 --dtype fp16 \
  --no-causal --pass fwd --seq-lens $groups --run-id seed000-grouped
for y in ms tflops gbps; do ab plot --db "$db" --run seed000-grouped --x num_seqs --y $y -o "$out/000-grouped-$y.png"; done

ab run "${common[@]}" --impl Pytorch --backends "$backends" --batch_size 8 --num_heads 32 --emb_dim 2048 \
  --seq_len 8..512:x2 --causal both --pass fwd bwd fwd_bwd --run-id seed003-seq
ab run "${common[@]}" --impl Pytorch --backends "$backends" --batch_size 8 --num_heads 32 --emb_dim 256..2048:x2 \
  --seq_len 1024 --causal --pass fwd bwd fwd_bwd --run-id seed003-emb
ab run "${common[@]}" --impl Pytorch --backends "$backends" --batch_size 8 --num_heads 1..16:x2 --emb_dim 256 \
  --seq_len 1024 --causal --pass fwd bwd fwd_bwd --run-id seed003-heads
for x in seq_len:seq emb_dim:emb heads:heads; do
  for y in ms tflops mem; do
    ab plot --db "$db" --run "seed003-${x#*:}" --x "${x%%:*}" --y $y -o "$out/003-${x%%:*}-$y.png"
  done
done

ab report --db "$db" --run seed000-single seed000-grouped seed003-seq seed003-emb seed003-heads -o "$out/report.html"
ab compare seed003-seq seed003-seq --db "$db" --fail-on-regression 5% | tail -n 1
ls -l "$out"
