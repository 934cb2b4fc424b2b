#!/usr/bin/env bash
# On the GPU, once benchmarks/linear_gpu_stage.sh's parts are staged (wheels in /tmp/site): fla-core 0.6.0's chunk
# backward on Hopper with the image's Triton 3.6, its gated chunk_bwd_dqkwg taken by fla's TileLang kernel, checked
# against the fp64 recurrence. Logs and the store go to $OUT (default ./linear-gpu-out).
#   bash benchmarks/linear_gpu_backward.sh run    # env.txt (versions, fla's routing), probe.log (fla's dispatch
#                                                 # log: "chunk_bwd_dqkwg -> tilelang"), Qwen3.5 GDN fwd_bwd at 4096
#                                                 # tokens, torch-chunked and fla-chunk (run.log, linear.db); ~3 min
#   bash benchmarks/linear_gpu_backward.sh test   # pytest -m gpu, the recurrence tests (pytest.log); ~3 min
#   bash benchmarks/linear_gpu_backward.sh more   # KDA fwd_bwd (never refused by fla; TileLang when heads match),
#                                                 # Mamba2 fwd_bwd fp32 (TileLang) and bf16 (still refused)
#   bash benchmarks/linear_gpu_backward.sh qla-table  # after qla: FlashQLA's published TP1 and TP8 rows (32k, fwd),
#                                                 # q/k normalised in the op and before it, FlashQLA beside fla
#   bash benchmarks/linear_gpu_backward.sh qla    # FlashQLA 0.1.3: import, one Qwen3.5-shaped fwd+bwd beside fla's,
#                                                 # relative differences and times (qla.log), then the
#                                                 # flashqla backend through attnbench run
# Each stage fits one 10-minute call; the stages of one lease share /tmp (the staged wheels, Triton's and TileLang's
# kernel caches), so a later stage skips the compiles an earlier one did.
set -uo pipefail
OUT=${OUT:-linear-gpu-out}; mkdir -p "$OUT"
SITE=${SITE:-/tmp/site}
FILES=/tmp/dstage-kwT/files
if [ ! -d "$SITE/tilelang" ] || [ ! -d "$SITE/fla" ]; then
  echo "no tilelang/fla in $SITE: run .kwT.1/stage.sh and .kwT.2/stage.sh first (benchmarks/linear_gpu_stage.sh)"
  exit 2
fi
# tilelang imports cloudpickle, ml_dtypes and psutil: install a carried one only where the image lacks it, so the
# image's own (ml_dtypes is built against its numpy) are not shadowed.
for mod in cloudpickle ml_dtypes psutil; do
  if ! python3 -c "import $mod" 2>/dev/null; then
    spare=$(ls "$FILES/$mod"-*.whl-spare 2>/dev/null | head -1)
    [ -n "$spare" ] || { echo "$mod missing and not carried"; continue; }
    mkdir -p /tmp/spare && cp "$spare" "/tmp/spare/$(basename "${spare%-spare}")"
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site-extra \
      "/tmp/spare/$(basename "${spare%-spare}")" && echo "installed $mod from the carried wheel"
  fi
done
export PYTHONPATH=$SITE:/tmp/site-extra:src:${PYTHONPATH:-}
export PYTHONUNBUFFERED=1
# fla hands chunk_gated_delta_rule to FlashQLA whenever flash_qla imports; fla-chunk must time fla's own kernels
export FLA_FLASH_QLA=0
ab() {
  local t=$1; shift
  echo "\$ attnbench $*" | tee -a "$OUT/run.log"
  COLUMNS=110 timeout "$t" python3 -m attnbench "$@" --db "$OUT/linear.db" 2>&1 | tee -a "$OUT/run.log"
}

case "${1:?stage: run, test, more, qla or qla-table}" in
run)
  nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv > "$OUT/env.txt" 2>&1
  timeout 120 python3 - >> "$OUT/env.txt" 2>&1 <<'EOF'
import shutil, sys, time
import torch, triton
print("python", sys.version.split()[0], "| torch", torch.__version__, "| triton", triton.__version__,
      "| device", torch.cuda.get_device_name(0), torch.cuda.get_device_capability(0))
print("nvcc", shutil.which("nvcc"), "| torch has __dlpack_c_exchange_api__:",
      hasattr(torch.Tensor, "__dlpack_c_exchange_api__"))
t = time.time()
import tilelang
print("tilelang", tilelang.__version__, f"imported in {time.time() - t:.1f} s")
import fla
from fla.ops.common.backends.tilelang import CommonTileLangBackend
from fla.utils import IS_NVIDIA_HOPPER, TRITON_ABOVE_3_4_0, TRITON_ABOVE_3_7_1, find_spec_cached, has_usable_nvcc
print("fla", fla.__version__, "| IS_NVIDIA_HOPPER", IS_NVIDIA_HOPPER, "| Triton >= 3.4.0", TRITON_ABOVE_3_4_0,
      "| >= 3.7.1", TRITON_ABOVE_3_7_1, "| has_usable_nvcc", has_usable_nvcc(),
      "| TileLang backend available", CommonTileLangBackend.is_available(), "enabled", CommonTileLangBackend().is_enabled(),
      "| flash_qla importable", find_spec_cached("flash_qla") is not None)
from attnbench.linear import fla as ab
from attnbench.linear.spec import RecurrenceSpec as S
for spec in (S(kind="gdn", heads_qk=16, heads_v=64, pass_="fwd_bwd"), S(kind="kda", heads_qk=32, pass_="fwd_bwd"),
             S(kind="mamba2", heads_v=80, d_v=64, pass_="fwd_bwd"),
             S(kind="mamba2", heads_v=80, d_v=64, pass_="fwd_bwd", dtype="fp32"),
             S(kind="linear", heads_qk=4, heads_v=8, pass_="fwd_bwd")):
    print(f"attnbench fla-chunk {spec.label()} {spec.pass_}: {ab.supports(spec, 'chunk') or 'runs'}")
EOF
  cat "$OUT/env.txt"
  # fla's own dispatch log: which backend took chunk_bwd_dqkwg, and the first call's TileLang compile
  timeout 180 python3 - > "$OUT/probe.log" 2>&1 <<'EOF'
import logging, time
import torch
import torch.nn.functional as F
logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
logging.getLogger("fla").setLevel(logging.INFO)
from fla.ops.gated_delta_rule import chunk_gated_delta_rule
torch.manual_seed(0)
B, T, H, HV, K = 1, 4096, 16, 64, 128
kw = dict(device="cuda", dtype=torch.bfloat16)
q, k = torch.randn(B, T, H, K, **kw), torch.randn(B, T, H, K, **kw)
v = torch.randn(B, T, HV, K, **kw)
g = F.logsigmoid(torch.randn(B, T, HV, device="cuda"))
beta = torch.rand(B, T, HV, **kw).sigmoid()
h0 = 0.1 * torch.randn(B, HV, K, K, device="cuda")
leaves = [x.requires_grad_() for x in (q, k, v, g, beta, h0)]
do, dht = torch.randn_like(v), torch.randn_like(h0)
for i in range(3):
    t = time.time()
    o, ht = chunk_gated_delta_rule(q, k, v, g=g, beta=beta, initial_state=h0, output_final_state=True,
                                   use_qk_l2norm_in_kernel=True)
    grads = torch.autograd.grad((o, ht), leaves, (do, dht))
    torch.cuda.synchronize()
    print(f"fwd+bwd call {i}: {time.time() - t:.2f} s; finite: {all(bool(x.isfinite().all()) for x in grads)}")
EOF
  cat "$OUT/probe.log"
  ab 270 run --op gdn --preset qwen3.5-gdn --pass fwd_bwd --backends torch-chunked,fla-chunk --seq-lens 4096 \
    --skip-missing --table
  ;;
test)
  timeout 540 python3 -m pytest -q -m gpu -n 4 -rs tests/gpu -k "(fla or recurrence or linear) and not flash" \
    -p no:cacheprovider > "$OUT/pytest.log" 2>&1
  grep -E "passed|failed|SKIPPED|FAILED|Error" "$OUT/pytest.log" | tail -30
  ;;
more)
  ab 240 run --preset kimi-linear-kda --pass fwd_bwd --backends torch-chunked,fla-chunk --seq-lens 4096 --skip-missing
  ab 200 run --preset mamba2-2.7b --dtype fp32 bf16 --pass fwd_bwd --backends fla-chunk,torch-chunked --seq-lens 2048 \
    --skip-missing
  ;;
qla)
  mkdir -p /tmp/spare
  spare=$(ls "$FILES"/flash_qla-*.whl-spare | head -1)
  cp "$spare" "/tmp/spare/$(basename "${spare%-spare}")"
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site-qla "/tmp/spare/$(basename "${spare%-spare}")"
  PYTHONPATH=/tmp/site-qla:$PYTHONPATH timeout 400 python3 - > "$OUT/qla.log" 2>&1 <<'EOF'
import time
import torch
import torch.nn.functional as F
from triton.testing import do_bench
t = time.time()
import flash_qla
print("flash_qla", flash_qla.__version__, f"imported in {time.time() - t:.1f} s")
from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_gdn   # FLA_FLASH_QLA=0: fla's own kernels
torch.manual_seed(0)
B, T, H, HV, K = 1, 4096, 16, 64, 128                                       # Qwen3.5 TP1, one sequence
kw = dict(device="cuda", dtype=torch.bfloat16)
base = dict(q=torch.randn(B, T, H, K, **kw), k=torch.randn(B, T, H, K, **kw), v=torch.randn(B, T, HV, K, **kw),
            g=F.logsigmoid(torch.randn(B, T, HV, device="cuda")), beta=torch.rand(B, T, HV, **kw).sigmoid(),
            initial_state=0.1 * torch.randn(B, HV, K, K, device="cuda"))
do, dht = torch.randn_like(base["v"]), torch.randn_like(base["initial_state"])

def call(fn, t=None):
    t = t or {n: x.detach().clone().requires_grad_() for n, x in base.items()}
    o, ht = fn(**t, output_final_state=True, use_qk_l2norm_in_kernel=True)
    return [o, ht, *torch.autograd.grad((o, ht), list(t.values()), (do, dht))]

for name, fn in (("flash_qla", flash_qla.chunk_gated_delta_rule), ("fla", fla_gdn)):
    t = time.time(); call(fn); torch.cuda.synchronize()
    print(f"{name}: first fwd+bwd (with compiles) {time.time() - t:.1f} s")
a, b = call(flash_qla.chunk_gated_delta_rule), call(fla_gdn)
for n, x, y in zip("o final_state dq dk dv dg dbeta dh0".split(), a, b):
    rel = ((x.float() - y.float()).norm() / y.float().norm()).item()
    print(f"{n:12s} {tuple(x.shape)} {x.dtype} vs fla {y.dtype}: rel. diff {rel:.2e}")
leaves = {n: x.detach().clone().requires_grad_() for n, x in base.items()}
for name, fn in (("flash_qla", flash_qla.chunk_gated_delta_rule), ("fla", fla_gdn)):
    with torch.no_grad():
        f = do_bench(lambda: fn(**base, output_final_state=True, use_qk_l2norm_in_kernel=True), warmup=25, rep=200)
    fb = do_bench(lambda: call(fn, leaves), warmup=25, rep=200)
    print(f"{name}: fwd {f:.3f} ms, fwd+bwd {fb:.3f} ms (do_bench median, warm L2)")
EOF
  cat "$OUT/qla.log"
  # the same kernel as attnbench's flashqla backend, checked against the fp64 reference beside fla's and PyTorch's
  PYTHONPATH=/tmp/site-qla:$PYTHONPATH ab 240 run --preset qwen3.5-gdn --seq-lens 4096 --pass fwd fwd_bwd \
    --backends flashqla,fla-chunk,torch-chunked --skip-missing
  ;;
qla-table)  # after `qla` in the same lease (/tmp/site-qla): FlashQLA's published H200 rows, 1 x 32768 tokens, fwd,
  # TP1 (16/64 heads) and TP8 (2/8), each with q, k normalised in the op (the models' call) and before it
  # (--qk-prenormed, as FlashQLA's benchmark does), FlashQLA beside fla
  for heads in "16 64" "2 8"; do
    set -- $heads
    for norm in "" "--qk-prenormed"; do
      PYTHONPATH=/tmp/site-qla:$PYTHONPATH ab 240 run --preset qwen3.5-gdn --q-heads "$1" --v-heads "$2" \
        --seq-lens 32768 --pass fwd $norm --backends flashqla,fla-chunk --skip-missing --table
    done
  done
  ;;
*) echo "unknown stage $1: run, test, more or qla"; exit 2 ;;
esac
