#!/usr/bin/env bash
# The README's main job with every kernel that shares one environment installed (FlashInfer, FA2, serving FA3,
# FlashMLA, SageAttention 2, SpargeAttn, xformers; FA4 cannot share flash_attn with FA2). Needs the "ek" parts
# staged (WHEELS: the wheels listed in packages.txt).
# INSTALL=1: build the environment and list the backends; FIRST..LAST: runs, cold inductor/Triton caches each,
# FlashInfer's JIT cache removed before run 1 only (CLEAN_FI=1 removes it every run).
cd "$(git rev-parse --show-toplevel)"
GS=/tmp/gs
if [ "${INSTALL:-0}" = 1 ] && [ ! -f $GS/main/.installed ]; then
  rm -rf /tmp/ekw && mkdir -p /tmp/ekw
  cp WHEELS/*.whl /tmp/ekw/
  python3 -c "import sys; sys.path.insert(0, 'benchmarks'); import gpu_suite as g; from pathlib import Path; g.install(Path('/tmp/ekw'), Path('$GS'), ('main',))"
fi
export PYTHONPATH=$PWD/src:$GS/main PYTHONUNBUFFERED=1 COLUMNS=100
export LD_LIBRARY_PATH=$GS/main/nvidia/cuda_runtime/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
if [ "${INSTALL:-0}" = 1 ]; then
  { nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm,serial --format=csv; hostname; date -u; nproc; } > $OUT/device.txt
  ls $GS/main | grep -i "dist-info" > $OUT/packages.txt
  python3 -m attnbench backends 2>&1 | tee $OUT/backends.txt | tail -45
  exit 0
fi
clean() { rm -rf /tmp/torchinductor_$(whoami) ~/.triton /tmp/main*.db*; }
for i in $(seq ${FIRST:-1} ${LAST:-1}); do
  clean; { [ $i = 1 ] || [ "${CLEAN_FI:-0}" = 1 ]; } && rm -rf ~/.cache/flashinfer
  t0=$(date +%s.%N)
  python3 -m attnbench run --db /tmp/main$i.db 2>&1 | python3 docs/results/h100-h200-2026-11-26/main-job/stamp.py $t0 $OUT/ek$i.log | tail -5
  echo "run $i wall: $(python3 -c "import time; print(round(time.time() - $t0, 1))") s" | tee -a $OUT/ek$i.log
  python3 benchmarks/sweep_cost.py /tmp/main$i.db > $OUT/ekcost$i.md 2>&1; head -60 $OUT/ekcost$i.md | tail -40
  cp /tmp/main$i.db $OUT/ek$i.db
done
