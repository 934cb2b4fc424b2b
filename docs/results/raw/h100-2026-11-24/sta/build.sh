#!/usr/bin/env bash
# Build fastvideo-kernel 0.3.5's ThunderKittens sliding tile attention (sta_fwd, sm_90a) against the torch at
# hand, on a Hopper GPU machine: bash build.sh OUTDIR. Leaves OUTDIR/site/fastvideo_kernel (the package's
# Python files from its sdist plus _C/fastvideo_kernel_ops*.so holding sta_fwd) and einops in OUTDIR/site.
# Inputs beside this script: fastvideo_kernel/ (python/fastvideo_kernel of the sdist), csrc/st_attn_h100.cu
# (csrc/attention of the sdist), tk.tgz (ThunderKittens at 6c27e28c, the commit FastVideo pins as
# fastvideo-kernel/include/tk; the sdist ships without it), sta_binding.cpp, einops wheel.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd); out=$1
work=/tmp/sta-build; rm -rf $work $out/site; mkdir -p $work/tk $out/site
tar xzf $here/tk.tgz -C $work/tk
cp $here/csrc/st_attn_h100.cu $here/sta_binding.cpp $work/
cp -r $here/fastvideo_kernel $out/site/
python3 -m pip install -q --no-index --no-deps --no-compile --target $out/site $here/einops-*.whl
export TORCH_CUDA_ARCH_LIST=9.0a MAX_JOBS=16
t0=$(date +%s)
python3 - "$work" "$out/site/fastvideo_kernel/_C" <<'PY'
import sys, shutil, pathlib
from torch.utils.cpp_extension import load
work, dest = map(pathlib.Path, sys.argv[1:])
mod = load(name="fastvideo_kernel_ops", sources=[str(work / "sta_binding.cpp"), str(work / "st_attn_h100.cu")],
           extra_include_paths=[str(work / "tk/include"), str(work / "tk/prototype")],
           extra_cflags=["-O3", "-std=c++20"],
           extra_cuda_cflags=["-O3", "-std=c++20", "-DNDEBUG", "--use_fast_math", "--expt-extended-lambda",
                              "--expt-relaxed-constexpr", "-Xcompiler=-fno-strict-aliasing", "-DKITTENS_HOPPER",
                              "-DTK_COMPILE_ST_ATTN", "-DTORCH_COMPILE"],
           extra_ldflags=["-lcuda"], build_directory=str(work), verbose=False)
dest.mkdir(parents=True, exist_ok=True)
so = pathlib.Path(mod.__file__)
shutil.copy(so, dest / so.name)
print("built", so.name, so.stat().st_size, "bytes; has sta_fwd:", hasattr(mod, "sta_fwd"))
PY
echo "build took $(( $(date +%s) - t0 )) s"
