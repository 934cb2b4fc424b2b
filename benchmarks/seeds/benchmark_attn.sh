#!/usr/bin/env bash
# The benchmark_attn.py workload (FlashAttention's benchmark_attn.py): duration, TFLOP/s and bandwidth against
# sequence length for a single sequence (128 ... 64k) and for groups of 128-token sequences (1 ... 256 per call), at
# benchmark_attn.py's defaults (32 q-heads, 32 kv-heads, head size 128, fp16, batch 1, warm-up 10, repeat 100), with
# every backend that runs here; then the profiler series: the same kernels but the exact references, single and
# grouped, under Nsight Compute and Nsight Systems where they are installed (ncu: a process per kernel; nsys: a
# process per 32 cases of any kernel; --profiler-batch).
#
#   bash benchmarks/seeds/benchmark_attn.sh OUT [BACKENDS]       # BACKENDS: comma list; default every runnable one
#
# Writes OUT/benchmark_attn.db, OUT/*.png (duration/performance/bandwidth, single and grouped, and the profiler
# series of FA2, FA3 and cuDNN; grouped: of their variable-length kernels), OUT/profilers.md (every kernel's
# series side by side), OUT/times.txt (each series' wall time), OUT/*.txt (each run's progress and summary) and
# OUT/report.html. PROFILED=comma,list narrows the profiler series. On an H100 with the four kernel wheels
# (flash-attn 2, FA3, SageAttention 2, SpargeAttn; 21 kernels profiled) the whole script took 20 minutes
# (2026-11-26).
# Needs a CUDA GPU for the profiler series (skipped on CPU).
# SEED_QUICK=1 shrinks every axis (for a smoke test of the script itself, e.g. on CPU).
set -uo pipefail
export COLUMNS=${COLUMNS:-220}  # wide tables in the logs (rich folds to 80 columns without a terminal)
out=${1:?output directory}; backends=${2:-}
mkdir -p "$out"; db="$out/benchmark_attn.db"
ab() { python3 -m attnbench "$@"; }
quick=${SEED_QUICK:-0}
if [ "$quick" = 1 ]; then
  shape=(--q-heads 2 --kv-heads 2 --head-size 16 --batch-size 1 --dtype fp32 --warmup 1 --repeat 3)
  single=(128 256); groups=(1 2 4); profiled=(128 256)
else
  shape=(--q-heads 32 --kv-heads 32 --head-size 128 --batch-size 1 --dtype fp16 --warmup 10 --repeat 100)
  single=(128 256 512 1k 2k 4k 8k 16k 32k 64k); groups=(1 2 4 8 16 32 64 128 256); profiled=(128 256 512 1k 2k 4k 8k 16k)
fi
pick=(); [ -n "$backends" ] && pick=(--backends "$backends")
common=(--db "$db" --no-causal --pass fwd "${shape[@]}" "${pick[@]}")
isolate=(--isolate)  # a kernel that crashes the process costs one case, not the sweep

timed() {  # timed NAME COMMAND...: run it, and append its wall seconds to times.txt
  local name=$1 t0=$SECONDS; shift; "$@"; local rc=$?
  echo "$name: $((SECONDS - t0)) s" >> "$out/times.txt"; return $rc
}
: > "$out/times.txt"
timed events-single ab run "${common[@]}" "${isolate[@]}" --seq-lens "${single[@]}" --run-id benchmark-attn-single \
  > "$out/single.txt" 2>&1 || echo "single-sequence run ended with status $? (see single.txt)"
group_lens=(); for n in "${groups[@]}"; do group_lens+=("$(yes 128 | head -n "$n" | paste -sd,)"); done
timed events-grouped ab run "${common[@]}" "${isolate[@]}" --seq-lens "${group_lens[@]}" --run-id benchmark-attn-grouped \
  > "$out/grouped.txt" 2>&1 || echo "grouped run ended with status $? (see grouped.txt)"
for kind in single grouped; do
  x=seq_len; suffix=""; [ $kind = grouped ] && { x=num_seqs; suffix=_grouped; }
  for fig in duration:ms performance:tflops bandwidth:gbps; do
    ab plot --db "$db" --run "benchmark-attn-$kind" --x $x --y "${fig#*:}" --logy -o "$out/${fig%%:*}$suffix.png" > /dev/null
  done
done

# Profiler series (benchmark_attn.py's "cuda" / "ncu" / "nsys"): every kernel the events series timed, re-run under
# each profiler, single and grouped; cases share profiler processes (ncu: one per kernel; nsys: one per 32
# cases). The exact references (naive PyTorch, SDPA's math kernel) are timed by the events series only: a grouped
# call of theirs is a few kernels per sequence, up to 256 sequences, and ncu replays every one (on an H100 they
# took 7.5 of the ncu grouped series' 12 minutes). The figures show FA2, FA3 and cuDNN (grouped: FA2's, FA3's
# and SDPA's variable-length kernels) where they ran; profilers.md has every kernel.
if python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  profiled_backends=${PROFILED:-$(python3 -c "from attnbench.results.store import ResultStore as S
with S('$db', create=False) as s: print(','.join(sorted({r.backend for r in s.records('benchmark-attn-single')
                                                    if r.status == 'ok' and r.backend not in ('naive', 'sdpa-math')})))")}
  pick_of() {  # pick_of WANTED: those of the comma list WANTED that were profiled, else the first profiled
    python3 -c "import sys; a, w = sys.argv[1].split(','), sys.argv[2].split(',')
print(','.join(b for b in w if b in a) or a[0])" "$profiled_backends" "$1"
  }
  plotted=$(pick_of fa2,fa3,sdpa-cudnn)
  plotted_grouped=$(pick_of fa2-varlen,fa3-varlen,sdpa-varlen)  # groups of sequences take variable-length kernels
  series=(benchmark-attn-single); grouped_series=(benchmark-attn-grouped)
  for prof in ncu nsys; do
    if ! command -v $prof > /dev/null; then echo "$prof not installed: no $prof series" | tee -a "$out/profilers.txt"; continue; fi
    extra=(); [ $prof = ncu ] && extra=(--repeat 5)  # ncu replays every timed kernel: fewer calls
    timed $prof-single ab run "${common[@]}" --backends "$profiled_backends" --seq-lens "${profiled[@]}" --profiler $prof \
      "${extra[@]}" --run-id benchmark-attn-$prof --no-check > "$out/$prof.txt" 2>&1 && series+=(benchmark-attn-$prof)
    timed $prof-grouped ab run "${common[@]}" --backends "$profiled_backends" --seq-lens "${group_lens[@]}" \
      --profiler $prof "${extra[@]}" --run-id benchmark-attn-$prof-grouped --no-check > "$out/$prof-grouped.txt" 2>&1 \
      && grouped_series+=(benchmark-attn-$prof-grouped)
  done
  for fig in duration:ms performance:tflops; do
    ab plot --db "$db" --run "${series[@]}" --backend "$plotted" --x seq_len --y "${fig#*:}" --logy \
      -o "$out/profilers_${fig%%:*}.png" > /dev/null
    ab plot --db "$db" --run "${grouped_series[@]}" --backend "$plotted_grouped" --x num_seqs --y "${fig#*:}" --logy \
      -o "$out/profilers_${fig%%:*}_grouped.png" > /dev/null
  done
  python3 "$(dirname "$0")/tables.py" benchmark-attn --db "$db" --run "${series[@]}" "${grouped_series[@]}" -o "$out/profilers.md"
fi
ab report --db "$db" --run benchmark-attn-single benchmark-attn-grouped -o "$out/report.html" > /dev/null
ab export --db "$db" --all-runs --format csv -o "$out/benchmark_attn.csv"
ls "$out"
