#!/usr/bin/env bash
# nsys over many kernels: one session for any backend's cases (this code) against a session per backend (.old/src,
# the code before), benchmark_attn.py's shape at eight lengths; then the profiled-sweep GPU tests.
cd "$(git rev-parse --show-toplevel)" &&  # .old/src: `git archive ee61967 src`; the seed wheels in /tmp/site
 export PYTHONUNBUFFERED=1 COLUMNS=100
mkdir -p /tmp/ds && for f in .gpu/debs/*.deb; do dpkg -x $f /tmp/ds; done
export LD_LIBRARY_PATH=/tmp/ds/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
mkdir -p /tmp/nsbin && ln -sf /opt/nvidia/nsight-compute/2025.3.1/host/target-linux-x64/nsys /tmp/nsbin/nsys && export PATH=/tmp/nsbin:$PATH
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/device.txt
B=${B:-fa2,fa3,sdpa-cudnn,sdpa-flash,sdpa-efficient,flex,sage,sage2-fp16}
for code in .old/src src; do
  tag=$(echo $code | tr -d ./); rm -rf /tmp/pc4-$tag && mkdir -p /tmp/pc4-$tag
  PYTHONPATH=$PWD/$code:/tmp/site timeout 250 python3 $PWD/benchmarks/profiler_cost.py --out /tmp/pc4-$tag --backends $B \
    --modes events,nsys --seq-lens 128 256 512 1k 2k 4k 8k 16k -- --q-heads 32 --kv-heads 32 --head-size 128 \
    --batch-size 1 --dtype fp16 --pass fwd --no-causal 2>&1 | tee $OUT/nsys-$tag.md | tail -5
done
tar czf $OUT/nsys-sessions-logs.tgz -C /tmp pc4-oldsrc pc4-src
PYTHONPATH=$PWD/src:/tmp/site timeout 150 python3 -m pytest -q -p no:cacheprovider -rs tests/gpu/test_timing_gpu.py \
  -k "${K:-profiled_sweep or backward or nsys_sweep}" 2>&1 | tee $OUT/pytest-timing.log | tail -4
