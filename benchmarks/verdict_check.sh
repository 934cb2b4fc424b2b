#!/usr/bin/env bash
# Every installed backend under the accuracy verdict and the plausibility check, on this machine:
#   bash benchmarks/verdict_check.sh OUT [STEP ...]      (default: every step, in this order)
#   verify-bf16   `verify` with its default (bug-prone) shapes, bf16, seeds 0, 1, 2
#   wrong         wrong-on-purpose kernels (tests/plugins) at S=16k, bf16 and fp16, causal both: all must fail
#   run           a `run` sweep (8k, fwd and fwd_bwd, causal both): no implausible time, repeat agreement
#   verify-fp16   `verify` with its default shapes, fp16, seed 0
# Then OUT/verdict.md: per backend the cases, verdicts, worst ratio to a limit, and repeat agreement.
set -uo pipefail
out=${1:?output directory}; shift; mkdir -p "$out"
steps=${*:-verify-bf16 wrong run verify-fp16}
here=$(cd "$(dirname "$0")" && pwd); root=$(dirname "$here")
export COLUMNS=${COLUMNS:-200}
ab() { python3 -m attnbench "$@"; }
for step in $steps; do
  case $step in
    verify-bf16) for seed in 0 1 2; do
        ab verify --dtype bf16 --seed "$seed" --db "$out/verify.db" --json > "$out/verify-bf16-$seed.json" 2> "$out/verify-bf16-$seed.err"
        echo "verify bf16 seed $seed: exit $?"; done ;;
    verify-fp16)
      ab verify --dtype fp16 --db "$out/verify.db" --json > "$out/verify-fp16-0.json" 2> "$out/verify-fp16-0.err"
      echo "verify fp16 seed 0: exit $?" ;;
    wrong)
      PYTHONPATH="$root/tests/plugins:${PYTHONPATH:-}" ATTNBENCH_PLUGINS=attnbench_test_backends ab verify \
        --backends test-fp32,test-out-x0.99,test-dk-x0.99,test-dv-block,test-softmax-scale-nolse,test-lse-shift \
        --seq-lens 16k --batch-size 1 --q-heads 8 --kv-heads 2 --head-size 128 --dtype bf16 fp16 --causal both \
        --db "$out/wrong.db" --json > "$out/wrong.json" 2> "$out/wrong.err"
      echo "wrong-on-purpose at 16k: exit $? (1 expected)" ;;
    run)
      ab run --seq-lens 8k --pass fwd fwd_bwd --causal both --db "$out/run.db" --quiet > "$out/run.txt" 2>&1
      echo "run: exit $?" ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
done
python3 "$here/verdict_summary.py" "$out" > "$out/verdict.md"
cat "$out/verdict.md"
