#!/usr/bin/env bash
# nsys at short lengths: one session (nsys) against a process per case (nsys-1), twice, same code, same host.
# Needs the seed wheels in /tmp/site; DEBS: the folder of libdw1 and libelf1 (nsys on these images). The timing
# tests it ran after are the profiled-sweep ones of tests/gpu/test_timing_gpu.py.
cd "$(git rev-parse --show-toplevel)" && export PYTHONUNBUFFERED=1 COLUMNS=100
mkdir -p /tmp/ds && for f in DEBS/*.deb; do dpkg -x $f /tmp/ds; done
export LD_LIBRARY_PATH=/tmp/ds/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
mkdir -p /tmp/nsbin && ln -sf /opt/nvidia/nsight-compute/2025.3.1/host/target-linux-x64/nsys /tmp/nsbin/nsys && export PATH=/tmp/nsbin:$PATH
B=${B:-fa2,sdpa-cudnn,sage2-fp16}
for rep in 1 2; do
  rm -rf /tmp/nr$rep && mkdir -p /tmp/nr$rep
  PYTHONPATH=$PWD/src:/tmp/site timeout 280 python3 benchmarks/profiler_cost.py --out /tmp/nr$rep --backends $B \
    --modes events,nsys,nsys-1 --seq-lens 128 256 512 -- --q-heads 32 --kv-heads 32 --head-size 128 \
    --batch-size 1 --dtype fp16 --pass fwd --no-causal 2>&1 | tee $OUT/nr$rep.md | tail -4
done
tar czf $OUT/nr.tgz -C /tmp nr1 nr2
PYTHONPATH=$PWD/src:/tmp/site timeout 200 python3 -m pytest -q -p no:cacheprovider -rs tests/gpu/test_timing_gpu.py \
  -k "profiled_sweep or backward or nsys_sweep" 2>&1 | tee $OUT/pytest-timing.log | tail -4
