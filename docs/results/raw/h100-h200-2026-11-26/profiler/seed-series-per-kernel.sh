#!/usr/bin/env bash
# benchmark_attn.py's profiler series for two kernels (seed000.sh's shape and lengths): the wall time of each
cd "$(git rev-parse --show-toplevel)"  # the seed wheels in /tmp/site; nsys set up as the guide says
mkdir -p /tmp/ds && for f in .gpu/debs/*.deb; do dpkg -x $f /tmp/ds; done
mkdir -p /tmp/nsbin && ln -sf /opt/nvidia/nsight-compute/2025.3.1/host/target-linux-x64/nsys /tmp/nsbin/nsys
export PYTHONPATH=$PWD/src:/tmp/site PATH=/tmp/nsbin:$PATH LD_LIBRARY_PATH=/tmp/ds/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-} COLUMNS=100
shape=(--q-heads 32 --kv-heads 32 --head-size 128 --batch-size 1 --dtype fp16 --warmup 10 --repeat 100 --no-causal --pass fwd --no-check --quiet)
lens=(128 256 512 1k 2k 4k 8k 16k)
rm -f /tmp/s0p.db*
for b in fa2 sage; do
  for prof in events nsys ncu; do
    extra=(); [ $prof = ncu ] && extra=(--repeat 5); [ $prof != events ] && extra+=(--profiler $prof)
    t0=$(date +%s.%N)
    timeout 200 python3 -m attnbench run --db /tmp/s0p.db --backends $b "${shape[@]}" --seq-lens "${lens[@]}" "${extra[@]}" \
      --run-id s0p-$b-$prof > /tmp/s0p-$b-$prof.log 2>&1; rc=$?
    echo "$b $prof: $(python3 -c "import time; print(round(time.time() - $t0, 1))") s (rc $rc) $(grep -o '[0-9]*/[0-9]* cases ok' /tmp/s0p-$b-$prof.log)" | tee -a $OUT/s0p.txt
  done
done
cp /tmp/s0p.db $OUT/
