"""The README's and the results page's H100 default-sweep figures, drawn again from the stored records.

    python3 benchmarks/readme_figures.py [--csv docs/results/raw/h100-2026-11-26/default-sweep.csv.xz] [--out docs/img]
    python3 benchmarks/readme_figures.py --db /tmp/h100.db      # also: the records as a store, for `report`

The CSV is the export of the H100 default sweep whose summary the README prints (2026-11-26, 736 records, no
raw samples: the figures carry no CI band, which at the GPU's ~0.3% CI would not show anyway). Each record is
rebuilt from its row (the case from its label) and drawn by ``attnbench.report.plots`` as the report draws it:
exact kernels (ms and TF/s), approximate kernels and the API forms of one kernel.
"""

from __future__ import annotations

import argparse
import csv
import lzma
import re
from pathlib import Path

from attnbench.report import plots
from attnbench.results.record import Record
from attnbench.spec import AttnSpec

ROOT = Path(__file__).resolve().parents[1]
CSV = ROOT / "docs/results/raw/h100-2026-11-26/default-sweep.csv.xz"
RUN_ID = "20261126-004709-55b1e8"
CONTEXT = "b2 h16 d128 bf16 · NVIDIA H100 80GB HBM3 · 2026-11-26"
LABEL = re.compile(r"b(\d+) s(\d+) h(\d+)(?:/(\d+))? d(\d+) (\w+)( causal)?$")
APPROXIMATE = ("sage", "sparge")
"""Families of the approximate backends in that run (the CSV keeps the verdict, not info.exact)."""
FIGURES = {"h100-default-sweep-tflops.png": ("tflops", "exact kernels"),
           "h100-default-sweep-ms.png": ("ms", "exact kernels"),
           "h100-default-sweep-tflops-approx.png": ("tflops", "approximate kernels (dense-equivalent rates)"),
           "h100-default-sweep-tflops-api-forms.png": ("tflops", "API forms of one kernel")}


def record(row: dict) -> Record:
    """One CSV row as the Record it was exported from (without raw samples, CI and accuracy details)."""
    batch, seq, heads, kv, dim, dtype, causal = LABEL.match(row["label"]).groups()
    spec = AttnSpec(batch=int(batch), seqlens_q=(int(seq),), heads_q=int(heads), heads_kv=int(kv or heads),
                    head_dim=int(dim), dtype=dtype, causal=bool(causal), pass_=row["pass"])

    def num(key: str) -> float | None:
        return float(row[key]) if row[key] else None
    info = {"exact": not row["backend"].startswith(APPROXIMATE)}
    if row["sm_clock_mhz"]:
        info["gpu_state"] = {"end": {"sm_clock_mhz": int(float(row["sm_clock_mhz"]))}}
    if row["clock_dropped"] == "True":
        info["clock_dropped"] = True
    median = num("median_ms")
    return Record(run_id=RUN_ID, backend=row["backend"], spec=spec, status=row["status"], reason=row["reason"] or None,
                  timing_mode="events", device="cuda:0", median_ms=median, p10_ms=num("p10_ms"), p90_ms=num("p90_ms"),
                  n=int(row["n"] or 0), iters_per_s=1e3 / median if median else None, tflops=num("tflops"),
                  gbps=num("gbps"), peak_mem_bytes=int(num("peak_mem_bytes")) if row["peak_mem_bytes"] else None,
                  accuracy={"verdict": row["verdict"]} if row["verdict"] not in ("", "-") else None, info=info)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--csv", type=Path, default=CSV)
    parser.add_argument("--out", type=Path, default=ROOT / "docs/img")
    parser.add_argument("--db", type=Path, help="Also write the records into this store (for attnbench report).")
    args = parser.parse_args()
    opener = lzma.open if args.csv.suffix == ".xz" else open  # the stored export is xz-compressed
    with opener(args.csv, "rt", newline="") as fh:
        records = [record(row) for row in csv.DictReader(fh)]
    rows = [r.to_row() for r in records]
    sets = dict(plots.backend_sets(rows))
    for name, (y, which) in FIGURES.items():
        title = f"{plots.Y_AXES[y][1]} vs {plots.X_AXES['seq_len'][1]}: {which}\n{CONTEXT}"
        path = args.out / name
        path.write_bytes(plots.render(sets[which], "seq_len", y, "png", title=title))
        print(f"wrote {path}")
    if args.db:
        from attnbench.results.store import ResultStore
        with ResultStore(args.db) as store:
            store.add_env("h100", {"device_name": "NVIDIA H100 80GB HBM3", "torch": "2.11.0+cu130"})
            store.start_run(RUN_ID, command="attnbench run --db /tmp/main4.db", config={}, env_id="h100",
                            version="0.1.0")
            for r in records:
                r.env_id = "h100"
                store.write(r)
            store.finish_run(RUN_ID, "done")
        print(f"wrote {args.db}")


if __name__ == "__main__":
    main()
