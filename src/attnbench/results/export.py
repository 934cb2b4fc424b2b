"""Write records as JSON, CSV or Parquet (the flat columns of the store; nested values stay JSON), and
read such files back into the same rows."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from attnbench import features
from attnbench.results import files
from attnbench.results.record import COLUMNS, Record, clock_of, verdict_of

# Columns written to CSV/JSON exports (raw samples and the full spec stay in the store). ``verdict`` is
# derived (``verdict_of``): a reader sees a failed or unchecked row as such next to its speed; so are
# ``sm_clock_mhz`` and ``clock_dropped`` (``clock_of``): the GPU clock the number was measured at.
EXPORT_COLUMNS = (
    "run_id", "backend", "label", "pass", "status", "verdict", "reason", "device", "timing_mode", "batch", "seq_len",
    "seq_len_k", "num_seqs", "heads_q", "heads_kv", "head_dim", "emb_dim", "dtype", "causal", "varlen", "window",
    *features.NAMES, "page_size", "shared_prefix", "tree", "kv_dtype", "mla", "median_ms", "p10_ms", "p90_ms", "mean_ms", "std_ms", "n", "iters_per_s", "flops", "flops_convention",
    "bytes", "tflops", "gbps", "peak_mem_bytes", "sm_clock_mhz", "clock_dropped", "accuracy", "info", "seed",
    "env_id", "case_id", "operator",
)
FORMATS = ("json", "csv", "parquet")
JSON_COLUMNS = ("accuracy", "info", "window", *(f.name for f in features.FEATURES if f.json_column), "tree")
VARIANT_COLUMNS = features.NAMES
"""The case's features (``attnbench.features``, each as ``Feature.export`` writes it), read from its stored spec, as
are its serving features (page size, shared prefix, tree, KV dtype) and whether it is MLA."""


def export_rows(rows: list[dict]) -> list[dict]:
    """Rows with only the export columns; JSON columns decoded (for JSON output)."""
    out = []
    for row in rows:
        item = {c: row.get(c) for c in EXPORT_COLUMNS}
        item["verdict"] = verdict_of(row["status"], row.get("accuracy"))  # pass, fail, unchecked, ...
        item["sm_clock_mhz"], item["clock_dropped"] = clock_of(row.get("info"))
        if row.get("spec"):
            spec = json.loads(row["spec"]) if isinstance(row["spec"], str) else row["spec"]
            item["operator"] = spec.get("operator", "attention")  # attnbench.operators
            if item["operator"] != "attention":  # attention's features and serving columns stay empty
                out.append(_decoded(item))
                continue
            item.update({f.name: f.export(f.normalize(spec.get(f.name, f.off))) for f in features.FEATURES})
            item.update(page_size=spec.get("page_size"), shared_prefix=spec.get("shared_prefix", 0),
                        tree=spec.get("tree"), kv_dtype=spec.get("kv_dtype"), mla=bool(spec.get("mla", False)))
        out.append(_decoded(item))
    return out


def _decoded(item: dict) -> dict:
    for c in JSON_COLUMNS:
        if isinstance(item[c], str):
            item[c] = json.loads(item[c])
    return item


def format_for(path: str | Path) -> str:
    """json or csv from the file suffix; ValueError for anything else."""
    path = Path(path)
    suffix = path.suffix.lower().lstrip(".")
    if suffix not in FORMATS:
        raise ValueError(f"cannot tell the output format of {str(path)!r}: use a .json, .csv or .parquet file name")
    if suffix == "parquet":  # say so before a run starts, not after it
        _require_pyarrow()
    return suffix


def write(records: list[Record] | list[dict], path: str | Path, fmt: str | None = None) -> None:
    """Write records (Record objects or store rows) to ``path`` as JSON, CSV or Parquet: the file is replaced
    whole (``files.write_atomic``); FileRefused for a path that is a database or a store's side file."""
    path = Path(path)
    rows = [r.to_row() if isinstance(r, Record) else r for r in records]
    fmt = fmt or format_for(path)
    items = export_rows(rows)
    if fmt == "parquet":
        _require_pyarrow()
    if fmt not in FORMATS:
        raise ValueError(f"unknown export format {fmt!r}; allowed: {', '.join(FORMATS)}")

    def fill(tmp: Path) -> None:
        if fmt == "parquet":
            _parquet_frame(items).to_parquet(tmp, index=False)
        elif fmt == "json":
            tmp.write_text(json.dumps(items, indent=1, default=str) + "\n")
        else:
            with tmp.open("w", newline="") as fh:
                writer = csv.DictWriter(fh, fieldnames=EXPORT_COLUMNS)
                writer.writeheader()
                for item in items:
                    writer.writerow(_flat(item))
    files.write_atomic(path, fill)  # whole or not at all, never over a database


def dumps(records: list[Record] | list[dict], fmt: str) -> str:
    """JSON or CSV text of ``records`` (for writing to stdout)."""
    rows = [r.to_row() if isinstance(r, Record) else r for r in records]
    items = export_rows(rows)
    if fmt == "json":
        return json.dumps(items, indent=1, default=str) + "\n"
    if fmt == "csv":
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=EXPORT_COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(_flat(item) for item in items)
        return buf.getvalue()
    raise ValueError(f"{fmt} cannot be written as text; give an output file with -o")


def read(path: str | Path, fmt: str | None = None) -> list[dict]:
    """Rows of an exported file, typed as ``export_rows`` returns them (JSON columns decoded)."""
    path = Path(path)
    fmt = fmt or format_for(path)
    if fmt == "json":
        return json.loads(path.read_text())
    if fmt == "parquet":
        import pandas as pd

        _require_pyarrow()
        raw = pd.read_parquet(path).astype(object).where(lambda f: f.notna(), None).to_dict("records")
    else:
        with path.open(newline="") as fh:
            raw = list(csv.DictReader(fh))
    return [_typed(row) for row in raw]


def _flat(item: dict) -> dict:
    """Nested values as JSON text (CSV, Parquet)."""
    return {k: json.dumps(v) if isinstance(v, (dict, list)) else v for k, v in item.items()}


def _typed(row: dict) -> dict:
    out = {}
    for col in EXPORT_COLUMNS:
        value = row.get(col)
        if value == "" or value is None:
            value = None
        elif col in JSON_COLUMNS:
            value = json.loads(value) if isinstance(value, str) else value
        elif col in features.BY_NAME:
            value = features.BY_NAME[col].from_text(value)
        elif col in ("clock_dropped", "mla"):
            value = value if isinstance(value, bool) else str(value).lower() == "true"
        elif col in ("page_size", "shared_prefix"):
            value = int(value)
        elif col == "sm_clock_mhz":
            value = int(float(value))
        elif COLUMNS.get(col, "").startswith("INTEGER"):
            value = int(value)
        elif COLUMNS.get(col, "").startswith("REAL"):
            value = float(value)
        else:
            value = str(value)
        out[col] = value
    return out


def _parquet_frame(items: list[dict]):
    import pandas as pd

    return pd.DataFrame([_flat(item) for item in items], columns=list(EXPORT_COLUMNS))


def _require_pyarrow() -> None:
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        raise ValueError("Parquet export needs pyarrow, which is not installed: pip install pyarrow") from None
