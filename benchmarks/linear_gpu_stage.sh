#!/usr/bin/env bash
# Packs the wheels that fla-core 0.6.0's gated chunk backward needs on a Hopper GPU of the image (torch 2.11, Triton
# 3.6, no registry) into device-stage parts, and says how the next GPU session carries them.
#
# fla 0.6.0 refuses that backward on Hopper with Triton >= 3.4, < 3.7.1 (fla#640) unless its TileLang kernel takes
# the call (docs/linear.md, "fla's gated backward on Hopper"); TileLang is a 79.6 MiB set, two device calls:
#   tilelang 0.1.15, apache-tvm-ffi 0.1.12 (libtvm_ffi.so), z3-solver 4.15.4.0 (libz3.so.4.15, which tilelang's
#   libtvm_compiler.so links), fla-core 0.6.0 and einops 0.8.1 (as in .kwB), and as "-spare" files (not installed by
#   the stage; linear_gpu_backward.sh installs each only where the image lacks it): cloudpickle 3.1.3, ml_dtypes
#   0.6.0, psutil 7.2.2 (tilelang imports all three), flash_qla 0.1.3 (kept off fla's path: with it importable fla
#   hands chunk_gated_delta_rule to FlashQLA).
# The other route, Triton >= 3.7.1 (triton-3.7.1 cp312 manylinux_2_28 x86_64 is 188.6 MiB: five calls), is not packed:
# torch 2.11.0 requires triton==3.6.0 (torch 2.12.0: 3.7.0, 2.13.0: 3.7.1, PyPI metadata), so it would run beside a
# torch it was not built for.
#
#   here:   bash benchmarks/linear_gpu_stage.sh fetch   # only if .kwT/ is missing: pip download the set into .kwT/
#           bash benchmarks/linear_gpu_stage.sh         # .kwT/ -> .kwT.1/ (44 MiB), .kwT.2/ (35.6 MiB)
#   GPU, one lease, each call within 30 s of the last (the parts live in the machine's /tmp):
#     call 1  run(command="bash .kwT.1/stage.sh", carry=[".kwT.1"], timeout_s=120)
#     call 2  run(command="bash .kwT.2/stage.sh && bash benchmarks/linear_gpu_backward.sh run", carry=[".kwT.2"])
#     call 3  run(command="bash benchmarks/linear_gpu_backward.sh test")
#     then, if time is left: "... linear_gpu_backward.sh more" (KDA, Mamba2 fp32), "... qla" (FlashQLA smoke call)
# Calls 1 and 2 stage (a few seconds; call 2 also pip-installs into /tmp/site); the checkout (~16 MiB) and one part
# stay under a call's 64 MiB.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
STAGE=${STAGE:-../shared/tools/device-stage.sh}
DIR=.kwT
WHEELS=(
  tilelang-0.1.15-cp39-abi3-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl
  apache_tvm_ffi-0.1.12-cp312-abi3-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl
  z3_solver-4.15.4.0-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl
  fla_core-0.6.0-py3-none-any.whl
  einops-0.8.1-py3-none-any.whl
)
SPARES=(
  cloudpickle-3.1.3-py3-none-any.whl
  ml_dtypes-0.6.0-cp312-cp312-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl
  psutil-7.2.2-cp36-abi3-manylinux2010_x86_64.manylinux_2_12_x86_64.manylinux_2_28_x86_64.whl
  flash_qla-0.1.3-py3-none-any.whl
)
PINS=(tilelang==0.1.15 apache-tvm-ffi==0.1.12 z3-solver==4.15.4.0 fla-core==0.6.0 einops==0.8.1
      cloudpickle==3.1.3 ml-dtypes==0.6.0 psutil==7.2.2 flash-qla==0.1.3)

if [ "${1:-}" = fetch ]; then
  mkdir -p "$DIR"
  pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform any -d "$DIR" "${PINS[@]}"
  for w in "${SPARES[@]}"; do [ -f "$DIR/$w" ] && mv "$DIR/$w" "$DIR/$w-spare"; done
fi
for pat in '/.kwT/' '/.kwT.*/'; do grep -qxF "$pat" .git/info/exclude 2>/dev/null || echo "$pat" >> .git/info/exclude; done

files=()
for w in "${WHEELS[@]}"; do files+=("$DIR/$w"); done
for w in "${SPARES[@]}"; do files+=("$DIR/$w-spare"); done
missing=0
for f in "${files[@]}"; do [ -f "$f" ] || { echo "missing $f"; missing=1; }; done
[ "$missing" = 0 ] || { echo "run: bash benchmarks/linear_gpu_stage.sh fetch"; exit 1; }
du -ch "${files[@]}" | tail -1
"$STAGE" kwT "${files[@]}"
n=$(ls -d .kwT.[0-9]* | wc -l)
echo "$n parts: $n staging calls; the last one (with its stage.sh) prints \"kwT ready\""
for i in $(seq 1 "$n"); do
  extra=""; [ "$i" = "$n" ] && extra=" && bash benchmarks/linear_gpu_backward.sh run"
  echo "  call $i: run(command=\"bash .kwT.$i/stage.sh$extra\", carry=[\".kwT.$i\"])"
done
echo "  call $((n + 1)): run(command=\"bash benchmarks/linear_gpu_backward.sh test\")"
