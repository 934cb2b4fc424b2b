#!/usr/bin/env bash
# The start of a run, step by step; then sage-varlen, sparge and flex over a few lengths with the code before
# and after the shared Triton cache (each from cold compile caches), to see whether sage-varlen's time moved.
cd "$(git rev-parse --show-toplevel)"  # .old/src: `git archive ee61967 src` (before the change)
export PYTHONUNBUFFERED=1 COLUMNS=100
python3 -c "import sys, torch, os; print('dont_write_bytecode', sys.dont_write_bytecode, os.access(os.path.dirname(torch.__file__), os.W_OK), os.path.isdir(os.path.dirname(torch.__file__) + '/__pycache__'))"
PYTHONPATH=$PWD/src:/tmp/site python3 docs/results/h100-h200-2026-11-26/main-job/startup.py
PYTHONPATH=$PWD/src:/tmp/site python3 docs/results/h100-h200-2026-11-26/main-job/startup.py | tail -1
for code in .old/src src src .old/src; do
  rm -rf /tmp/torchinductor_$(whoami) ~/.triton /tmp/ab.db*
  PYTHONPATH=$PWD/$code:/tmp/site python3 -m attnbench run --db /tmp/ab.db --backends sage-varlen,sage,sparge,flex,fa2 \
    --seq-lens 128 256 1k 2k --pass fwd --quiet --no-check > /tmp/ab.log 2>&1
  echo "== $code"; PYTHONPATH=$PWD/src python3 -c "
from attnbench.results.store import ResultStore as S
with S('/tmp/ab.db', create=False) as s:
    rs = s.records(s.latest_run_id())
for r in rs:
    if r.status == 'ok' and r.backend in ('sage-varlen', 'sage', 'fa2'):
        print(f'{r.backend:12s} s{r.spec.seqlens_q[0]:<5d} causal={int(r.spec.causal)} {r.median_ms:.4f} ms busy={r.info.get(\"compile_workers_busy\", False)}')
" | paste - - - -
done
