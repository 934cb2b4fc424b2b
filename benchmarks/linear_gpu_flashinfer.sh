#!/usr/bin/env bash
# FlashInfer 0.7.2.post1's Gated DeltaNet kernels on a Hopper GPU of the image (torch 2.11 cu130, CUDA 13, no
# registry): attnbench's flashinfer-gdn (chunk_gated_delta_rule) and flashinfer-gdn-decode (gated_delta_rule_decode),
# read from the wheel's source (docs/linear.md, "FlashInfer 0.7.2.post1"), first run on hardware here.
#
# The set is the part of FlashInfer's wheel set that `import flashinfer.gdn_prefill, flashinfer.gdn_decode` needs
# (checked on a CPU machine: the image supplies numpy, requests, tqdm, packaging, filelock, jinja2) plus fla-core
# for the comparison, 175 MiB with cuDNN frontend: flashinfer-python 0.7.2.post1, apache-tvm-ffi 0.1.15.post2, nvidia-cutlass-dsl 4.8.1
# with its libs-base, libs-core and libs-cu13 (the CuTe DSL the GDN kernels are written in; no nvcc needed for
# them), cuda-python / cuda-bindings / cuda-pathfinder, nvidia-ml-py (pynvml: flashinfer.utils imports it),
# einops, fla-core 0.6.0, and nvidia-cudnn-frontend 1.32.0 (its KDA for the cudnn-kda backend: the same CUTLASS DSL
# and tvm-ffi; stage `cudnn` below). Left out of FlashInfer's full set: cuda-tile, nccl4py, nccl-extensions,
# tabulate and click (not imported on this path). Its apache-tvm-ffi (0.1.15) is not the
# one tilelang needs (< 0.1.13, benchmarks/linear_gpu_stage.sh): do not stage both sets into one /tmp/site.
#
#   here:  bash benchmarks/linear_gpu_flashinfer.sh fetch   # only if .kwF/ lacks a pinned wheel: pip download the set
#          bash benchmarks/linear_gpu_flashinfer.sh pack    # .kwF/ -> .kwF.1/ ... .kwF.4/ (44 MiB parts), the calls
#   GPU, one lease, each call within 30 s of the last (the parts live in the machine's /tmp):
#     calls 1-3  run(command="bash .kwF.K/stage.sh", carry=[".kwF.K"], timeout_s=120)     K = 1, 2, 3
#     call 4     run(command="bash .kwF.4/stage.sh && bash benchmarks/linear_gpu_flashinfer.sh run", carry=[".kwF.4"])
#
# run (one 10-minute call; each step under `timeout`, the later ones shortened or skipped to stay within BUDGET
# seconds, default 540): fi.log (versions, import times, whether the CuTe DSL kernels imported, FlashInfer's
# routing, one direct prefill call at Qwen3.5's shape, 1 x 4096 tokens, 16/64 heads, d 128, bf16, and one decode
# call at batch 8: first-call (compile) and later-call times, finite outputs, do_bench medians, the decode's state
# copy timed apart), the GPU tests (tests/gpu/test_linear_flashinfer_gpu.py, pytest.log), then attnbench runs into
# $OUT/linear.db (run.log): prefill 4096, 16384 and 32768 tokens beside fla-chunk, checked; decode at batch
# 1/8/64/256 beside fla-recurrent and torch-recurrent; prefill at 131072 tokens timed only (the fp64 check of one
# case takes about a minute there); and if time is left the decode without its per-call state copy
# (reset_state=false) and the prefill with FlashInfer's context-parallel routing off (use_cp=never).
# Logs and the store go to $OUT (default ./fi-gpu-out).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
DIR=.kwF
PINS=(flashinfer-python==0.7.2.post1 apache-tvm-ffi==0.1.15.post2 nvidia-cutlass-dsl==4.8.1
      nvidia-cutlass-dsl-libs-base==4.8.1 nvidia-cutlass-dsl-libs-core==4.8.1 nvidia-cutlass-dsl-libs-cu13==4.8.1
      cuda-python==13.4.4 cuda-bindings==13.5.0 cuda-pathfinder==1.9.1 nvidia-ml-py==13.615.71 einops==0.8.2
      fla-core==0.6.0 nvidia-cudnn-frontend==1.32.0)

case "${1:?stage: fetch, pack (here), run or cudnn (GPU)}" in
fetch)
  mkdir -p "$DIR"
  pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux2014_x86_64 \
    --platform any -d "$DIR" "${PINS[@]}"
  ;;
pack)
  for pat in "/$DIR/" "/$DIR.*/"; do grep -qxF "$pat" .git/info/exclude 2>/dev/null || echo "$pat" >> .git/info/exclude; done
  n_whl=$(ls "$DIR"/*.whl 2>/dev/null | wc -l)
  [ "$n_whl" -eq "${#PINS[@]}" ] || { echo "$DIR has $n_whl wheels, not ${#PINS[@]}: bash $0 fetch"; exit 1; }
  du -ch "$DIR"/*.whl | tail -1
  "${STAGE:-../shared/tools/device-stage.sh}" kwF "$DIR"/*.whl
  n=$(ls -d "$DIR".[0-9]* | wc -l)
  echo "$n parts; each call within 30 s of the last; the last one's stage.sh prints \"kwF ready\""
  for i in $(seq 1 "$n"); do
    if [ "$i" = "$n" ]; then
      echo "  call $i: run(command=\"bash $DIR.$i/stage.sh && bash benchmarks/linear_gpu_flashinfer.sh run\", carry=[\"$DIR.$i\"])"
    else
      echo "  call $i: run(command=\"bash $DIR.$i/stage.sh\", carry=[\"$DIR.$i\"], timeout_s=120)"
    fi
  done
  ;;
run)
  export OUT=${OUT:-fi-gpu-out}; mkdir -p "$OUT"
  SITE=${SITE:-/tmp/site}
  if [ ! -d "$SITE/flashinfer" ] || [ ! -d "$SITE/nvidia_cutlass_dsl" ]; then
    echo "no flashinfer/nvidia_cutlass_dsl in $SITE: run .kwF.1/stage.sh ... .kwF.4/stage.sh first" | tee "$OUT/fi.log"
    exit 2
  fi
  # The CUTLASS DSL's wheels put `cutlass` on the path with a .pth file, which PYTHONPATH does not run: its folder
  # goes on the path by hand (what nvidia_cutlass_dsl_packages.pth does).
  export PYTHONPATH=$SITE/nvidia_cutlass_dsl/dsl_packages:$SITE:src:${PYTHONPATH:-}
  export PYTHONUNBUFFERED=1
  export FLA_FLASH_QLA=0  # fla-chunk times fla's own kernels (no flash_qla in this set anyway)
  BUDGET=${BUDGET:-540}
  left() { echo $((BUDGET - SECONDS)); }
  ab() {  # ab SECONDS attnbench-args...: shortened to the time left, skipped under 45 s
    local t=$1; shift
    local l; l=$(left)
    [ "$t" -gt "$l" ] && t=$l
    if [ "$t" -lt 45 ]; then echo "skipped ($l s left): attnbench $*" | tee -a "$OUT/run.log"; return; fi
    echo "\$ attnbench $*   (timeout $t s)" | tee -a "$OUT/run.log"
    COLUMNS=110 timeout "$t" python3 -m attnbench "$@" --db "$OUT/linear.db" >> "$OUT/run.log" 2>&1
    echo "exit $?" >> "$OUT/run.log"
  }
  nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv > "$OUT/fi.log" 2>&1
  timeout 220 python3 - >> "$OUT/fi.log" 2>&1 <<'EOF'
import importlib.metadata as md, os, shutil, sys, time, traceback
import torch
dev = torch.device("cuda")
props = torch.cuda.get_device_properties(dev)
print("python", sys.version.split()[0], "| torch", torch.__version__, "cuda", torch.version.cuda, "|", props.name,
      f"sm{props.major}{props.minor}", props.multi_processor_count, "SMs | nvcc", shutil.which("nvcc"))
for dist in ("flashinfer-python", "nvidia-cutlass-dsl", "nvidia-cutlass-dsl-libs-cu13", "apache-tvm-ffi",
             "cuda-bindings", "fla-core"):
    try:
        print(f"  {dist} {md.version(dist)}")
    except md.PackageNotFoundError:
        print(f"  {dist} missing")
t = time.time()
import cutlass
print(f"import cutlass {time.time() - t:.1f} s ({cutlass.__file__})")
t = time.time()
import flashinfer
import flashinfer.gdn_decode
import flashinfer.gdn_prefill
from flashinfer.gdn_decode import gated_delta_rule_decode
from flashinfer.gdn_prefill import chunk_gated_delta_rule
print(f"import flashinfer {flashinfer.__version__} + gdn_prefill, gdn_decode: {time.time() - t:.1f} s")
from attnbench.linear import flashinfer as fi
from attnbench.linear.spec import RecurrenceSpec
print("kernels: prefill", fi.kernel_reason("prefill", props.major) or "ok", "| decode",
      fi.kernel_reason("decode", props.major) or "ok")
for b, hv in ((1, 64), (2, 64), (1, 32), (4, 32)):
    spec = RecurrenceSpec(kind="gdn", batch=b, heads_qk=16, heads_v=hv, seqlens=(4096,), dtype="bf16")
    print(f"  use_cp=auto takes the context-parallel kernel at B={b}, HV={hv}: {fi.cp_route(spec, dev)}")

from triton.testing import do_bench
torch.manual_seed(0)
bf = dict(device=dev, dtype=torch.bfloat16)
F = torch.nn.functional


def timed(name, fn, calls=2):
    for i in range(calls):
        torch.cuda.synchronize(); t = time.time()
        r = fn()
        torch.cuda.synchronize()
        print(f"{name}: call {i + 1} {time.time() - t:.2f} s" + (" (with its compile)" if i == 0 else ""))
    return r


def finite(**ts):
    return ", ".join(f"{n} {tuple(x.shape)} {str(x.dtype)[6:]} finite={bool(x.isfinite().all())}"
                     for n, x in ts.items())


def retry_without_disk_cache(name, fn):
    """A first call that fails is tried once more with FlashInfer's CuTe DSL disk cache off (the export and reload
    of a compiled kernel are the untried part of that path); the shell reads the marker and exports it too."""
    try:
        return fn()
    except Exception:
        traceback.print_exc()
        print(f"{name} failed; once more with FLASHINFER_CUTE_DSL_DISABLE_CACHE=1")
        os.environ["FLASHINFER_CUTE_DSL_DISABLE_CACHE"] = "1"
        r = fn()
        open(os.path.join(os.environ.get("OUT", "fi-gpu-out"), "fi-nocache"), "w").write("1\n")
        print(f"{name} ran with the disk cache off: the attnbench runs below get it off too")
        return r


# Prefill at Qwen3.5's shape: 1 x 4096 tokens, 16 q/k heads, 64 value heads, d 128, bf16; packed with cu_seqlens;
# g the decay itself (exp of GDN's log-decay), beta the strength, fp32 (T, HV); q, k L2-normalised by FlashInfer.
T, H, HV, D = 4096, 16, 64, 128
q, k, v = torch.randn(T, H, D, **bf), torch.randn(T, H, D, **bf), torch.randn(T, HV, D, **bf)
a_log, dt_bias = torch.rand(HV, device=dev).log(), torch.rand(HV, device=dev)
g = torch.exp(-a_log.exp() * F.softplus(torch.randn(T, HV, device=dev) + dt_bias)).contiguous()
beta = torch.rand(T, HV, device=dev).sigmoid().contiguous()
cu = torch.tensor([0, T], dtype=torch.int64, device=dev)


def prefill(use_cp):
    return chunk_gated_delta_rule(q, k, v, g, beta, None, output_final_state=True, cu_seqlens=cu,
                                  use_qk_l2norm_in_kernel=True, use_cp=use_cp, max_seqlen=T)


def prefill_probe(use_cp):
    name = f"prefill use_cp={use_cp}"
    try:
        o, s = retry_without_disk_cache(name, lambda: timed(name, lambda: prefill(use_cp)))
        print("  ", finite(out=o, final_state=s))
        print(f"   do_bench median {do_bench(lambda: prefill(use_cp), warmup=10, rep=100):.3f} ms (warm L2)")
    except Exception:
        traceback.print_exc()


prefill_probe("auto")  # at B = 1, HV = 64 on an H200: the context-parallel kernel (printed above)

# Decode, batch 8: q, k (B, 1, H, K), v (B, 1, HV, V), the state (B, HV, K, V) fp32 K-major, updated in place;
# the gates from A_log (fp32), a (bf16), dt_bias (fp32), b (bf16) as the model hands them.
B = 8
dq, dk, dv = torch.randn(B, 1, H, D, **bf), torch.randn(B, 1, H, D, **bf), torch.randn(B, 1, HV, D, **bf)
da, db = torch.randn(B, 1, HV, **bf), torch.randn(B, 1, HV, **bf)
h0 = 0.1 * torch.randn(B, HV, D, D, device=dev)
state = h0.clone()


def decode():
    return gated_delta_rule_decode(dq, dk, dv, state, a_log, da, dt_bias, db, scale=None, use_qk_l2norm=True)


try:
    o, s = retry_without_disk_cache("decode B=8", lambda: timed("decode B=8", decode))
    print("  ", finite(out=o, state=s), "| state updated in place:", s.data_ptr() == state.data_ptr())
    kernel = do_bench(decode, warmup=25, rep=200)
    copy = do_bench(lambda: state.copy_(h0), warmup=25, rep=200)
    both = do_bench(lambda: (state.copy_(h0), decode()), warmup=25, rep=200)
    mib = state.numel() * 4 / 2**20
    print(f"   do_bench median: kernel {kernel * 1e3:.1f} us, state copy alone {copy * 1e3:.1f} us, copy + kernel "
          f"{both * 1e3:.1f} us (state {mib:.0f} MiB; attnbench's default reset_state times copy + kernel)")
except Exception:
    traceback.print_exc()

prefill_probe(False)  # the one-CTA-per-head kernel, compiled last (the probe's timeout may cut it)
EOF
  cat "$OUT/fi.log"
  [ -f "$OUT/fi-nocache" ] && export FLASHINFER_CUTE_DSL_DISABLE_CACHE=1
  timeout 150 python3 -m pytest -q -m gpu tests/gpu/test_linear_flashinfer_gpu.py -p no:cacheprovider -o addopts="" \
    -rfEs > "$OUT/pytest.log" 2>&1; tail -3 "$OUT/pytest.log"
  ab 200 run --preset qwen3.5-gdn --seq-lens 4096 16384 32768 --pass fwd --backends flashinfer-gdn,fla-chunk \
    --skip-missing --table
  ab 120 run --preset qwen3.5-gdn --decode --batch-size 1 8 64 256 --pass fwd \
    --backends flashinfer-gdn-decode,fla-recurrent,torch-recurrent --skip-missing --table
  ab 90 run --preset qwen3.5-gdn --seq-lens 131072 --pass fwd --backends flashinfer-gdn,fla-chunk --no-check \
    --skip-missing --table
  ab 60 run --preset qwen3.5-gdn --decode --batch-size 8 256 --pass fwd --backends flashinfer-gdn-decode \
    --backend-opt flashinfer-gdn-decode.reset_state=false --skip-missing
  ab 100 run --preset qwen3.5-gdn --seq-lens 4096 32768 --pass fwd --backends flashinfer-gdn \
    --backend-opt flashinfer-gdn.use_cp=never --skip-missing
  grep -E "^\\$ attnbench|cases ok|^[0-9]+ (unsupported|error|mismatch|nan|oom)|^exit " "$OUT/run.log"
  echo "total $SECONDS s"
  ;;
cudnn)  # after the same staging: cuDNN frontend's KDA (cudnn-kda) on sm90, its GPU tests, then beside fla-chunk
  export OUT=${OUT:-fi-gpu-out}; mkdir -p "$OUT"
  SITE=${SITE:-/tmp/site}
  [ -d "$SITE/cudnn" ] || { echo "no cudnn in $SITE: stage the kwF parts first" | tee "$OUT/cudnn.log"; exit 2; }
  export PYTHONPATH=$SITE/nvidia_cutlass_dsl/dsl_packages:$SITE:src:${PYTHONPATH:-}
  export PYTHONUNBUFFERED=1 FLA_FLASH_QLA=0
  timeout 120 python3 -c "import cudnn, importlib.metadata as m; print('cudnn frontend', m.version('nvidia-cudnn-frontend'),
'| backend', cudnn.backend_version())" > "$OUT/cudnn.log" 2>&1
  timeout 240 python3 -m pytest -q -m gpu tests/gpu/test_linear_cudnn_gpu.py -p no:cacheprovider -o addopts="" \
    -rfEs >> "$OUT/cudnn.log" 2>&1; tail -5 "$OUT/cudnn.log"
  for pass in "--pass fwd" "--pass fwd_bwd --qk-prenormed"; do
    echo "\$ attnbench run --preset kimi-linear-kda --seq-lens 4096 32768 $pass" >> "$OUT/run.log"
    COLUMNS=110 timeout 150 python3 -m attnbench run --preset kimi-linear-kda --seq-lens 4096 32768 $pass \
      --backends cudnn-kda,fla-chunk --skip-missing --table --db "$OUT/linear.db" >> "$OUT/run.log" 2>&1
    echo "exit $?" >> "$OUT/run.log"
  done
  grep -E "^\\$ attnbench|cases ok|^exit " "$OUT/run.log"
  ;;
*) echo "unknown stage $1: fetch, pack, run or cudnn"; exit 2 ;;
esac
