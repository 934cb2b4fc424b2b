#!/usr/bin/env bash
# The FA2 write-up (flash-attn 2 accuracy and performance):
#  1. flash_attn_func, flash_attn_qkvpacked_func and flash_attn_varlen_qkvpacked_func (fa2, fa2-qkvpacked,
#     fa2-varlen-qkvpacked) against the exact reference, printed in the write-up's format
#     (Output/dQ/dK/dV max and mean diff) -> OUT/check.txt
#  2. the distributed check with FA2 as the local kernel (ring and zigzag over all GPUs of this host,
#     per rank, forward and backward, in the write-up's format) -> OUT/dist_check.txt; needs >= 2 GPUs
#  3. the write-up's performance table (batch 2..128 at 4k, 8k..64k at batch 2; 16 heads, head size 128,
#     bf16, fwd_only True/False, causal and not) for FA2 qkvpacked on 1 GPU, with fa3 and sdpa-cudnn beside it
#     -> OUT/table_1gpu.md; and for FA2 as the local kernel of ring/zigzag on all GPUs -> OUT/table_Ngpu.md
#
#   bash benchmarks/seeds/fa2_writeup.sh OUT [BACKENDS]   # BACKENDS for the table; default fa2-qkvpacked,fa3,sdpa-cudnn
# SEED_QUICK=1 shrinks every axis (a smoke test of the script, e.g. on CPU with BACKENDS=naive).
# SEED_PARTS picks parts: "check table dist" (default, all), e.g. SEED_PARTS=dist on a multi-GPU machine
# when the one-GPU parts have been run already.
set -uo pipefail
export COLUMNS=${COLUMNS:-220}  # wide tables in the logs (rich folds to 80 columns without a terminal)
out=${1:?output directory}; backends=${2:-fa2-qkvpacked,fa3,sdpa-cudnn}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"; db="$out/fa2_writeup.db"
ab() { python3 -m attnbench "$@"; }
quick=${SEED_QUICK:-0}
if [ "$quick" = 1 ]; then
  check_shape=(--batch-size 2 --q-heads 2 --head-size 16 --dtype fp32 --seq-lens 128 100,28 --skip-missing --backends "$backends")
  table=(--q-heads 2 --head-size 16 --dtype fp32 --warmup 1 --repeat 3); batches=(2 4); seqs=(256 512); base=128
  dist=(--device cpu --kernel sdpa-math --q-heads 2 --head-size 16 --dtype fp32 --seq-lens 256)
else
  check_shape=(--batch-size 2 --q-heads 16 --head-size 128 --dtype fp16 --seq-lens 4096 1000,2000,1096
               --skip-missing --backends fa2,fa2-qkvpacked,fa2-varlen-qkvpacked)
  table=(--q-heads 16 --head-size 128 --dtype bf16 --warmup 5); batches=(2 8 16 64 128); seqs=(8k 16k 32k 64k); base=4096
  dist=(--kernel fa2 --q-heads 16 --head-size 128 --dtype fp16 --seq-lens 16k)
fi

parts=" ${SEED_PARTS:-check table dist} "
part() { [[ "$parts" == *" $1 "* ]]; }

if part check; then
  ab verify "${check_shape[@]}" --causal both --details --db "$db" > "$out/check.txt" 2>&1
  echo "check: exit $? (0 = every exact backend passed; see check.txt)"
fi

# The write-up's TFLOPS are 2*B*H*S^2*D / latency, the FLOPs of a causal call (its benchmark ran causal):
# both settings are measured (attnbench counts causal FLOPs exactly, non-causal ones in full).
run=(run --db "$db" --quiet --causal both --pass fwd fwd_bwd "${table[@]}" --skip-missing --backends "$backends")
if part table; then
  ab "${run[@]}" --batch-size "${batches[@]}" --seq-lens "$base" --run-id fa2-writeup-batch > "$out/table_batch.txt" 2>&1 \
    || echo "batch sweep ended with status $? (see table_batch.txt)"
  ab "${run[@]}" --batch-size 2 --seq-lens "${seqs[@]}" --run-id fa2-writeup-seq > "$out/table_seq.txt" 2>&1 \
    || echo "sequence sweep ended with status $? (see table_seq.txt)"
  python3 "$here/tables.py" fa2-writeup --db "$db" --run fa2-writeup-batch fa2-writeup-seq -o "$out/table_1gpu.md" && cat "$out/table_1gpu.md"
fi

gpus=$(python3 -c "import torch; print(torch.cuda.device_count())")
[ "$quick" = 1 ] && gpus=2
if ! part dist; then
  :
elif [ "$gpus" -ge 2 ]; then
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
  tr=(python3 -m torch.distributed.run --nproc_per_node "$gpus" -m attnbench dist --db "$db")
  "${tr[@]}" "${dist[@]}" --method ring,zigzag --batch-size 2 --causal --pass fwd_bwd --details > "$out/dist_check.txt" 2>&1
  echo "distributed check: exit $? (see dist_check.txt)"
  if [ "$quick" != 1 ]; then
    d=(--kernel fa2 --method ring,zigzag --q-heads 16 --head-size 128 --dtype bf16 --causal --pass fwd fwd_bwd
       --warmup 3 --repeat 10 --no-check)
    { "${tr[@]}" "${d[@]}" --batch-size "${batches[@]}" --seq-lens "$base"
      "${tr[@]}" "${d[@]}" --batch-size 2 --seq-lens "${seqs[@]}"; } > "$out/dist_tables.txt" 2>&1
    grep -h -A16 "^### " "$out/dist_tables.txt" > "$out/table_${gpus}gpu.md"
  fi
else
  echo "distributed check and table: not run ($gpus GPU here; they need 2 or more)" | tee "$out/dist_check.txt"
fi
ls "$out"
