#!/usr/bin/env bash
# The write-ups' kernels and workloads on one GPU machine, in stages that each fit a 10-minute slot (what produced
# docs/results/2026-11-23-h200-seed-kernels.md). Wheels are installed from WHEELS (default .kw: the
# flash-attn 2, flash_attn_3, sageattention 2 and spas_sage_attn wheels) into /tmp/kw; diffusers, for
# stage cogvideox, from .dw (`pip download --no-deps diffusers==0.42.1 importlib-metadata`). Everything is written under
# $OUT/work and packed into $OUT/STAGE.tgz at the end (a device call brings back few files).
#   bash benchmarks/seeds/device_run.sh tests           # backends line, GPU tests of the kernels, reference shapes,
#                                                       # the FA2 write-up (1 GPU) and naive PyTorch against FA2
#   bash benchmarks/seeds/device_run.sh benchmark-attn  # the benchmark_attn.py workload
#   bash benchmarks/seeds/device_run.sh cogvideox       # CogVideoX-2b end to end (needs .dw)
#   bash benchmarks/seeds/device_run.sh final           # the e2e table again, FA3 build tests, naive PyTorch against
#                                                       # FA2 resumed from the store in .sd (naive_vs_fa2.db)
set -uo pipefail
stage=${1:?stage}; OUT=${OUT:-device-out}; work="$OUT/work"; mkdir -p "$work"
export PYTHONUNBUFFERED=1 COLUMNS=220
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/kw "${WHEELS:-.kw}"/*.whl 2>&1 | grep -v WARNING
case $stage in cogvideox|002|final) python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/kw .dw/*.whl 2>&1 | grep -v WARNING ;; esac
export PYTHONPATH=/tmp/kw:$PWD/src
t0=$(date +%s); step() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
case $stage in
  tests)
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.limit --format=csv > "$work/device.txt"
    python3 -m attnbench backends --device cuda > "$work/backends.txt" 2>&1
    python3 -m attnbench env --device cuda > "$work/env.txt" 2>&1
    step pytest
    timeout 150 python3 -m pytest -q -m gpu -n 8 -rs -p no:cacheprovider tests/gpu/test_backends_gpu.py \
      tests/gpu/test_dist_kernels.py -k "fa2 or fa3 or sage or sparge" > "$work/pytest_seed_kernels.log" 2>&1
    tail -n 3 "$work/pytest_seed_kernels.log"
    step reference shapes
    timeout 60 python3 -m attnbench run --skip-missing --backends fa2,fa3,sage,sage2-fp8-sm90,sdpa-cudnn,sdpa-flash --batch-size 2 \
      --q-heads 16 --head-size 128 --dtype bf16 --seq-lens 4k 8k 16k --no-causal --pass fwd --db "$work/reference.db" \
      --output "$work/reference.csv" > "$work/reference.txt" 2>&1
    step fa2-writeup; timeout 140 bash benchmarks/seeds/fa2_writeup.sh "$work/fa2_writeup" > "$work/fa2_writeup.log" 2>&1
    step naive-vs-fa2; timeout 190 bash benchmarks/seeds/naive_vs_fa2.sh "$work/naive_vs_fa2" > "$work/naive_vs_fa2.log" 2>&1
    ;;
  benchmark-attn|000) step benchmark-attn; timeout 540 bash benchmarks/seeds/benchmark_attn.sh "$work/benchmark_attn" \
    > "$work/benchmark_attn.log" 2>&1 ;;
  cogvideox|002) step cogvideox; timeout 540 bash benchmarks/seeds/cogvideox.sh "$work/cogvideox" \
    > "$work/cogvideox.log" 2>&1 ;;
  final)  # after the first three: the e2e table again (a bookkeeping fix), FA3 trimmed-build tests, naive vs FA2 finished
    step e2e; timeout 170 python3 -m attnbench e2e --model cogvideox-2b --skip-missing --backends \
      sdpa-flash,fa2,fa3,sage,sage2-fp8-sm90,sparge-fp16-cdf,sparge-cdf --steps 3 --warmup 1 --kernel-counts \
      --db "$work/e2e.db" --output "$work/e2e.json" > "$work/e2e.txt" 2>&1; tail -n 25 "$work/e2e.txt"
    step pytest; timeout 60 python3 -m pytest -q -m gpu -rs -p no:cacheprovider tests/gpu/test_backends_gpu.py \
      -k "fa3_trimmed or sage_is" > "$work/pytest_fa3.log" 2>&1; tail -n 3 "$work/pytest_fa3.log"
    step naive-vs-fa2; mkdir -p "$work/naive_vs_fa2" && cp .sd/naive_vs_fa2.db* "$work/naive_vs_fa2/"
    timeout 220 bash benchmarks/seeds/naive_vs_fa2.sh "$work/naive_vs_fa2" > "$work/naive_vs_fa2.log" 2>&1 ;;
  *) echo "unknown stage $stage"; exit 2 ;;
esac
step done
tar czf "$OUT/$stage.tgz" -C "$work" . && rm -rf "$work"
ls -la "$OUT"
