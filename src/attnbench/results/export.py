"""Write records as JSON or CSV (the flat columns of the store; nested values stay JSON)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from attnbench.results.record import Record

# Columns written to CSV/JSON exports (raw samples and the full spec stay in the store).
EXPORT_COLUMNS = (
    "run_id", "backend", "label", "pass", "status", "reason", "device", "timing_mode", "batch", "seq_len",
    "seq_len_k", "num_seqs", "heads_q", "heads_kv", "head_dim", "emb_dim", "dtype", "causal", "varlen", "window",
    "median_ms", "p10_ms", "p90_ms", "mean_ms", "std_ms", "n", "iters_per_s", "flops", "flops_convention",
    "bytes", "tflops", "gbps", "peak_mem_bytes", "accuracy", "info", "seed", "env_id", "case_id",
)
FORMATS = ("json", "csv")


def export_rows(rows: list[dict]) -> list[dict]:
    """Rows with only the export columns; JSON columns decoded (for JSON output)."""
    out = []
    for row in rows:
        item = {c: row.get(c) for c in EXPORT_COLUMNS}
        for c in ("accuracy", "info", "window"):
            if isinstance(item[c], str):
                item[c] = json.loads(item[c])
        out.append(item)
    return out


def format_for(path: Path) -> str:
    """json or csv from the file suffix; ValueError for anything else."""
    suffix = path.suffix.lower().lstrip(".")
    if suffix not in FORMATS:
        raise ValueError(f"cannot tell the output format of {str(path)!r}: use a .json or .csv file name")
    return suffix


def write(records: list[Record] | list[dict], path: Path, fmt: str | None = None) -> None:
    """Write records (Record objects or store rows) to ``path`` as JSON or CSV."""
    rows = [r.to_row() if isinstance(r, Record) else r for r in records]
    fmt = fmt or format_for(path)
    items = export_rows(rows)
    path.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "json":
        path.write_text(json.dumps(items, indent=1, default=str) + "\n")
    elif fmt == "csv":
        with path.open("w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=EXPORT_COLUMNS)
            writer.writeheader()
            for item in items:
                writer.writerow({k: json.dumps(v) if isinstance(v, (dict, list)) else v for k, v in item.items()})
    else:
        raise ValueError(f"unknown export format {fmt!r}; allowed: {', '.join(FORMATS)}")
