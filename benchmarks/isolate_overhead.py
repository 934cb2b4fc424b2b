"""What --isolate costs: wall time of the same tiny sweep in-process and in a worker process.

    PYTHONPATH=src python3 benchmarks/isolate_overhead.py [--device cpu|cuda] [--cases 200]

Prints the worker start-up (paid once, and again after each crashed or failed case) and the extra
time per case (JSON round trip of the case and its record). Tiny cases make the overhead visible.
"""

from __future__ import annotations

import argparse
import time

from attnbench.runner import IsolatedRunner, Runner, RunOptions
from attnbench.spec import AttnSpec
from attnbench.timing import TimingConfig


def sweep_seconds(runner_cls, options, specs, **kwargs) -> float:
    runner = runner_cls(options, run_id="overhead", env_id=None, sink=lambda record: None, **kwargs)
    t0 = time.perf_counter()
    records = runner.run(specs)
    assert all(r.status == "ok" for r in records), {r.status: r.reason for r in records}
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--cases", type=int, default=200)
    args = ap.parse_args()
    specs = [AttnSpec(seqlens_q=(16 + i % 7,), heads_q=1, head_dim=8, dtype="fp32") for i in range(args.cases)]
    options = RunOptions(device=args.device, backends=("naive",), timing=TimingConfig(warmup=0, repeat=1))
    sweep_seconds(Runner, options, specs[:5])  # warm up the in-process path
    inproc = sweep_seconds(Runner, options, specs)
    one = sweep_seconds(IsolatedRunner, options, specs[:1])
    isolated = sweep_seconds(IsolatedRunner, options, specs)
    per_case = (isolated - one) / (len(specs) - 1) - inproc / len(specs)
    print(f"device {args.device}, {len(specs)} tiny cases")
    print(f"in-process: {inproc:.2f} s ({1e3 * inproc / len(specs):.1f} ms/case)")
    print(f"isolated:   {isolated:.2f} s; worker start-up {one:.2f} s; extra per case {1e3 * per_case:.1f} ms")


if __name__ == "__main__":
    main()
