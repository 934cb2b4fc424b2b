#!/usr/bin/env bash
# CogVideoX-2b end to end (the CogVideoX-2b table: SDPA / FA2 / SageAttention2 / SpargeAttn swapped into CogVideoX-2b):
#  1. the end-to-end table: CogVideoX-2b (random weights from its config, 49 frames 480x720, batch 2, fp16,
#     one denoising step) with attention swapped to each backend; Attn (%), Attn (s), Total (s) and the
#     direct_copy_kernel_cuda / CUDAFunctor_add counts of one profiled step -> OUT/e2e.txt
#  2. sequence-length sweeps (1k ... 32k) of the attention call (batch 2, 30 heads, head size 64, fp16),
#     causal and not, with SpargeAttn at sparsity 0% (topk 1.0) and ~30% (topk 0.7) -> OUT/seqlen_*.png
#  3. the sparsity sweep at S = 32k: SpargeAttn top-k from 1.0 down to 0.1, time and dense-equivalent TFLOP/s
#     against the sparsity the kernel reports -> OUT/sparsity_*.png
#
#   bash benchmarks/seeds/cogvideox.sh OUT
#
# Backends: sdpa-flash (baseline), fa2, fa3, sage (sageattn's own choice: on Hopper the SageAttention2
# fp8 sm90 kernel), sage2-fp8-sm90, SpargeAttn FP16-PV (sparge-fp16*) and FP8-PV (sparge*); those not
# installed are recorded as unsupported. Needs a CUDA GPU and diffusers (pip install 'attnbench[diffusers]').
# SEED_QUICK=1 shrinks everything (a smoke test of the script: CPU, tiny model, torch-only backends).
set -uo pipefail
export COLUMNS=${COLUMNS:-220}  # wide tables in the logs (rich folds to 80 columns without a terminal)
out=${1:?output directory}
mkdir -p "$out"; db="$out/cogvideox.db"
ab() { python3 -m attnbench "$@"; }
quick=${SEED_QUICK:-0}
if [ "$quick" = 1 ]; then
  e2e=(--model cogvideox-tiny --device cpu --skip-missing --backends naive,sdpa-math --steps 1 --warmup 0)
  dense=sdpa-math; sparse=naive; opt=(); shape=(--device cpu --batch-size 1 --q-heads 2 --head-size 16 --dtype fp32
  --warmup 1 --repeat 3); seqs=(128 256); long=256; topks=(1.0 0.5)
else
  e2e=(--model cogvideox-2b --skip-missing --backends sdpa-flash,fa2,fa3,sage,sage2-fp8-sm90,sparge-fp16-cdf,sparge-cdf
       --steps 3 --warmup 1 --kernel-counts)
  dense=sdpa-flash,sdpa-cudnn,fa2,fa3,sage,sage2-fp8-sm90; sparse=sparge,sparge-fp16
  shape=(--batch-size 2 --q-heads 30 --head-size 64 --dtype fp16); seqs=(1k 2k 4k 8k 16k 32k); long=32k
  topks=(1.0 0.9 0.8 0.7 0.6 0.5 0.4 0.3 0.2 0.1)
fi
knobs() { [ "$quick" = 1 ] || echo "--backend-opt sparge.topk=$1 --backend-opt sparge-fp16.topk=$1"; }

ab e2e "${e2e[@]}" --db "$db" --output "$out/e2e.json" > "$out/e2e.txt" 2>&1; echo "e2e: exit $?"; cat "$out/e2e.txt"

run=(run --db "$db" --quiet --pass fwd --causal both "${shape[@]}")
ab "${run[@]}" --skip-missing --backends "$dense" --seq-lens "${seqs[@]}" --run-id cogvideox-dense > "$out/seqlen_dense.txt" 2>&1 \
  || echo "dense sweep ended with status $? (see seqlen_dense.txt)"
for pair in 0:1.0 30:0.7; do
  # shellcheck disable=SC2046  # knobs expands to separate words
  ab "${run[@]}" --skip-missing --backends "$sparse" $(knobs "${pair#*:}") --seq-lens "${seqs[@]}" --run-id "cogvideox-sparsity${pair%%:*}" \
    > "$out/seqlen_sparse${pair%%:*}.txt" 2>&1 || echo "sparse sweep ${pair%%:*}% ended with status $?"
  for y in ms tflops; do
    ab plot --db "$db" --run cogvideox-dense "cogvideox-sparsity${pair%%:*}" --x seq_len --y $y --logy \
      -o "$out/seqlen_sparsity${pair%%:*}_$y.png" > /dev/null
  done
done

sweep=()
for t in "${topks[@]}"; do
  # shellcheck disable=SC2046
  ab "${run[@]}" --skip-missing --backends "$sparse" $(knobs "$t") --seq-lens "$long" --no-check --run-id "cogvideox-topk$t" \
    > "$out/sparsity_topk$t.txt" 2>&1 && sweep+=("cogvideox-topk$t")
done
for y in ms tflops; do
  ab plot --db "$db" --run "${sweep[@]}" --x sparsity --y $y -o "$out/sparsity_$y.png" > /dev/null \
    || echo "no sparsity plot (the backends record no sparsity here)"
done
ab report --db "$db" --run cogvideox-dense cogvideox-sparsity0 cogvideox-sparsity30 -o "$out/report.html" > /dev/null
ls "$out"
