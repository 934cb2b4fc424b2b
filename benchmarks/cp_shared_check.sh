#!/usr/bin/env bash
# Context-parallel correctness on one GPU: 2 and 4 ranks share it (gloo through host memory), so every
# method runs its real multi-rank path (ring steps, zigzag half blocks, all-to-alls, the USP 2 x 2 mesh,
# the all-gather ring) with the real local kernel, checked rank by rank against one device and the
# exact result. Nothing is timed in such a job.
#
#   bash benchmarks/cp_shared_check.sh OUT fa3,fa2        # SEQ=16k by default
set -uo pipefail
OUT=${1:-cp-shared}
KERNELS=${2:-fa3,fa2}
SEQ=${SEQ:-16k}
mkdir -p "$OUT"
export PYTHONPATH=src:${PYTHONPATH:-}
SHAPE=(--batch-size 1 --q-heads 32 --kv-heads 8 --head-size 128 --dtype bf16 --seq-lens "$SEQ" --causal both
       --pass fwd_bwd --db "$OUT/shared.db")
run() {  # name, ranks, dist options...
  local name=$1 n=$2
  shift 2
  python3 -m torch.distributed.run --nproc_per_node "$n" -m attnbench dist "$@" "${SHAPE[@]}" \
    > "$OUT/$name.log" 2>&1 || echo "$name: exit $?"
  echo "$name: $(grep -c 'verdict: pass' "$OUT/$name.log") pass, $(grep -c 'verdict: fail' "$OUT/$name.log") fail"
}
for k in ${KERNELS//,/ }; do
  run "shared_${k}_2ranks" 2 --method ring,zigzag,ulysses,usp --kernel "$k"
  run "shared_${k}_4ranks" 4 --method ring,zigzag,ulysses,usp --ulysses-degree 2 --kernel "$k"
  run "shared_${k}_4ranks_allgather" 4 --method ring,zigzag --ring-comm allgather --kernel "$k"
done
