"""P1: attnbench's event times against ncu, under sustained load and with the GPU idle between calls.

For bf16 fwd cases (H=16, D=128) of the given backends, time each case with the runner under several
timing variants, then run the same cases under ncu (``gpu__time_duration.sum``, ``--clock-control
none``) and print each variant's median with its difference from ncu's and the SM clock at the start
and end of the case. Variants:
- ``events``: the default (calls back to back, L2 flushed by overwriting a buffer);
- ``events_read``: the L2 flushed by only reading the buffer (no dirty lines left to write back);
- ``events_idle1``: ``--idle-ratio 1`` (the device idles one call's time before each call);
- ``profiler``: kernel time from torch.profiler.

    PYTHONPATH=src python3 benchmarks/clock_fidelity.py sdpa-cudnn,fa2,fa3,sage2-fp8-sm90 out.json \\
        --variants events,events_idle1,profiler --shapes 2x4096,1x8192,2x16384
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch

from attnbench.runner import Runner, RunOptions
from attnbench.spec import AttnSpec
from attnbench.timing import TimingConfig
from attnbench.timing import events as ev
from attnbench.timing.external import ExternalCase, run_external

VARIANTS = {"events": ("events", 0.0, False), "events_read": ("events", 0.0, True),
            "events_idle1": ("events", 1.0, False), "profiler": ("profiler", 0.0, False)}


def _read_flush(self) -> None:
    self.buffer.sum(dtype=torch.int64)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("backends")
    ap.add_argument("out", help="JSON file for the results")
    ap.add_argument("--variants", default="events,events_idle1,profiler")
    ap.add_argument("--shapes", default="2x4096,1x8192,2x16384", help="BATCHxSEQ, comma separated")
    args = ap.parse_args(argv)
    backends = tuple(args.backends.split(","))
    specs = [AttnSpec(batch=int(b), seqlens_q=(int(s),), heads_q=16, head_dim=128, dtype="bf16", pass_="fwd")
             for b, s in (x.split("x") for x in args.shapes.split(","))]
    results: dict = {}
    overwrite = ev.L2Flusher.__call__
    for variant in args.variants.split(","):
        mode, idle, read = VARIANTS[variant]
        ev.L2Flusher.__call__ = _read_flush if read else overwrite
        cfg = TimingConfig(warmup=5, repeat=30, mode=mode, idle_ratio=idle)
        runner = Runner(RunOptions(device="cuda", backends=backends, timing=cfg), run_id=variant, env_id=None,
                        sink=lambda r: None)
        for rec in runner.run(specs):
            row = results.setdefault(f"{rec.backend}|{rec.spec.label()}", {})
            state = rec.info.get("gpu_state", {})
            row[variant] = rec.median_ms if rec.status == "ok" else rec.status
            row[variant + "_clock_mhz"] = [state.get("start", {}).get("sm_clock_mhz"),
                                           state.get("end", {}).get("sm_clock_mhz")]
    ev.L2Flusher.__call__ = overwrite
    todo = [ExternalCase(spec=s, backend=b, iterations=5) for s in specs for b in backends]
    for case, (samples, info) in zip(todo, run_external("ncu", todo, device="cuda", warmup=3, timeout_s=500)):
        row = results[f"{case.backend}|{case.spec.label()}"]
        row["ncu"], row["ncu_kernels"] = statistics.median(samples), info["kernels"]
    for key, row in results.items():
        ncu = row.get("ncu")
        cells = [f"{v} {row[v]:.4f} ({100 * (row[v] - ncu) / ncu:+.1f}%, clock {row[v + '_clock_mhz']})"
                 if isinstance(row.get(v), float) and ncu else f"{v} {row.get(v)}" for v in args.variants.split(",")]
        print(f"{key:45s} ncu {ncu:.4f} | " + " | ".join(cells))
    with open(args.out, "w") as fh:
        json.dump(results, fh, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
