#!/usr/bin/env bash
# After the seed wheels are staged (/tmp/site): the start of a run profiled (PROFILE=1), then the README's main
# job as written, runs FIRST..LAST, each with cold compile caches; log (timestamped), cost table, store come back.
cd "$(git rev-parse --show-toplevel)"  # the checkout; the four seed wheels installed in /tmp/site
export PYTHONPATH=$PWD/src:/tmp/site PYTHONUNBUFFERED=1 COLUMNS=100
{ nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm,serial --format=csv; hostname; date -u; nproc; } > $OUT/device.txt
clean() { rm -rf /tmp/torchinductor_$(whoami) ~/.triton /tmp/s.db* /tmp/main*.db*; }
if [ "${PROFILE:-0}" = 1 ]; then
  clean
  t0=$(date +%s.%N)
  python3 -m cProfile -o $OUT/start.prof -m attnbench run --db /tmp/s.db --seq-lens 128 2>&1 \
    | python3 docs/results/h100-h200-2026-11-26/main-job/stamp.py $t0 $OUT/start.log > /dev/null
  python3 -c "import pstats; pstats.Stats('$OUT/start.prof').sort_stats('cumulative').print_stats(60)" > $OUT/start.txt; rm $OUT/start.prof
  tail -4 $OUT/start.log
fi
for i in $(seq ${FIRST:-1} ${LAST:-1}); do
  clean
  t0=$(date +%s.%N)
  python3 -m attnbench run --db /tmp/main$i.db 2>&1 | python3 docs/results/h100-h200-2026-11-26/main-job/stamp.py $t0 $OUT/main$i.log | tail -5
  echo "run $i wall: $(python3 -c "import time; print(round(time.time() - $t0, 1))") s" | tee -a $OUT/main$i.log
  python3 benchmarks/sweep_cost.py /tmp/main$i.db > $OUT/cost$i.md 2>&1; head -40 $OUT/cost$i.md | grep -E "sparge|sage-varlen|cudnn|flex|total" | head
  cp /tmp/main$i.db $OUT/
done
