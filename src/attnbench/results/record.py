"""The Record: one row per (spec, backend, pass, timing mode), the unit every mode produces."""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass, field

from attnbench import operators
from attnbench.spec import AttnSpec

SCHEMA_VERSION = 5
STATUSES = ("ok", "unsupported", "oom", "error", "nan", "mismatch", "implausible")
ABANDONED = "abandoned: "
"""How the reason of an "error" record begins when its case was in flight as the run was stopped (SIGTERM, SIGHUP,
a second Ctrl-C: ``cli/inflight.py``): it says nothing of the kernel, so a resumed run drops it and runs the case
again."""


@dataclass(kw_only=True)
class Record:
    """Result of one case. Times in ms, rates in TFLOP/s and GB/s, memory in bytes."""

    run_id: str
    """Run this record belongs to."""
    backend: str
    """Backend registry name."""
    spec: AttnSpec
    """The case (shape, dtype, mask, pass); a spec of another operator (``attnbench.operators``) alike."""
    status: str = "ok"
    """ok | unsupported | oom | error | nan | mismatch."""
    reason: str | None = None
    """Why the status is not ok (human readable)."""
    timing_mode: str = "events"
    """How samples were taken (events, graph, profiler, cpu...)."""
    device: str = ""
    """Device the case ran on, e.g. cuda:0 or cpu."""
    median_ms: float | None = None
    p10_ms: float | None = None
    p90_ms: float | None = None
    mean_ms: float | None = None
    std_ms: float | None = None
    min_ms: float | None = None
    max_ms: float | None = None
    n: int = 0
    """Number of timed samples."""
    iters_per_s: float | None = None
    """1000 / median_ms."""
    flops: float | None = None
    """FLOPs of one call under ``flops_convention`` (see metrics.py)."""
    flops_convention: str = "exact"
    bytes: float | None = None
    """Minimal bytes moved by one call."""
    tflops: float | None = None
    """flops / median time, TFLOP/s."""
    gbps: float | None = None
    """bytes / median time, GB/s."""
    peak_mem_bytes: int | None = None
    """Peak allocated device memory above the pre-case baseline; None when not measured (CPU)."""
    accuracy: dict | None = None
    """Per-tensor error metrics against the exact reference, plus the verdict."""
    info: dict = field(default_factory=dict)
    """What ran: kernel, package version, GQA handling, preprocessing timed or not, ..."""
    samples_ms: list[float] = field(default_factory=list)
    """Raw per-call times, for confidence intervals and run comparison."""
    env_id: str | None = None
    """Environment fingerprint id (see env.py)."""
    seed: int = 0
    """Seed of the inputs."""
    created_at: float = field(default_factory=time.time)
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"unknown status {self.status!r}; allowed: {', '.join(STATUSES)}")

    @property
    def case_id(self) -> str:
        return case_id(self.spec, self.backend, self.timing_mode)

    def to_row(self) -> dict:
        """Flat dict of the store's columns (JSON for nested values)."""
        spec = self.spec
        row = {k: v for k, v in asdict(self).items() if k not in ("spec", "accuracy", "info", "samples_ms")}
        row.update(operators.of(spec).columns(spec))
        row.update(case_id=self.case_id, label=spec.label(), pass_=spec.pass_, spec=json.dumps(spec.to_dict()),
                   accuracy=json.dumps(self.accuracy), info=json.dumps(self.info),
                   samples_ms=json.dumps(self.samples_ms))
        row["pass"] = row.pop("pass_")
        return row

    @classmethod
    def from_row(cls, row: dict) -> Record:
        """Inverse of ``to_row`` (extra columns are ignored)."""
        names = set(cls.__dataclass_fields__)
        data = {k: row[k] for k in names if k in row and k not in ("spec", "accuracy", "info", "samples_ms")}
        return cls(spec=operators.spec_from_dict(json.loads(row["spec"])), accuracy=json.loads(row["accuracy"] or "null"),
                   info=json.loads(row["info"] or "{}"), samples_ms=json.loads(row["samples_ms"] or "[]"), **data)


FAILED_VERDICTS = ("fail", "approx-fail", "nan")
"""Verdicts of a result that is wrong: an exact or approximate check failed, or the output is not finite."""


def verdict_of(status: str, accuracy: dict | str | None) -> str:
    """What the accuracy check says of a record, in every view (tables, exports, plots, report): pass,
    approx-pass, fail, approx-fail, nan (non-finite output), unchecked (timed but never checked), or "-"
    for cases with no result (unsupported, oom, error)."""
    if isinstance(accuracy, str):
        accuracy = json.loads(accuracy or "null")
    if accuracy and accuracy.get("verdict"):
        return accuracy["verdict"]
    return {"nan": "nan", "mismatch": "fail", "ok": "unchecked"}.get(status, "-")


def exact_of(status: str, accuracy: dict | str | None, info: dict | str | None) -> bool:
    """Whether a record is held to exactness: False for an approximate kernel (quantized, sparse: an
    ``approx-*`` verdict or ``info["exact"]`` false), whose rates are dense-equivalent."""
    if verdict_of(status, accuracy).startswith("approx"):
        return False
    if isinstance(info, str):
        info = json.loads(info or "{}")
    return bool((info or {}).get("exact", True))


def clock_of(info: dict | str | None) -> tuple[int | None, bool]:
    """The SM clock (MHz) at the end of a case's timed calls and whether it fell by more than 10% during
    them (``info["gpu_state"]``, ``info["clock_dropped"]``): a throttled number, not a slow kernel."""
    if isinstance(info, str):
        info = json.loads(info or "{}")
    info = info or {}
    end = ((info.get("gpu_state") or {}).get("end") or {}).get("sm_clock_mhz")
    return (int(end) if isinstance(end, (int, float)) else None), bool(info.get("clock_dropped"))


def interval_of(info: dict | str | None) -> tuple[float, float] | None:
    """The 95% confidence interval of a case's median time in ms (``info["median_ci95_ms"]``: a bootstrap over its
    samples, ``timing.stats.bootstrap_median_ci``), or None where the record has none."""
    if isinstance(info, str):
        info = json.loads(info or "{}")
    ci = (info or {}).get("median_ci95_ms")
    if not (isinstance(ci, (list, tuple)) and len(ci) == 2 and all(isinstance(v, (int, float)) for v in ci)):
        return None
    return float(ci[0]), float(ci[1])


def busy_of(info: dict | str | None) -> bool:
    """Whether a CPU case was timed while other processes kept its cores busy (``info["cpu"]["busy"]``, judged
    by ``timing.cpu_load.is_busy`` after a retime): its numbers are not the kernel's."""
    if isinstance(info, str):
        info = json.loads(info or "{}")
    return bool(((info or {}).get("cpu") or {}).get("busy"))


def case_id(spec: AttnSpec, backend: str, timing_mode: str) -> str:
    """Stable id of a case: the same spec, backend and timing mode always give the same id."""
    key = json.dumps({"spec": spec.to_dict(), "backend": backend, "timing": timing_mode}, sort_keys=True)
    return hashlib.sha1(key.encode()).hexdigest()[:16]


# Store columns and their SQLite types, in table order. ``pass`` is the spec's pass.
COLUMNS: dict[str, str] = {
    "run_id": "TEXT NOT NULL", "case_id": "TEXT NOT NULL", "backend": "TEXT NOT NULL", "pass": "TEXT",
    "timing_mode": "TEXT", "status": "TEXT NOT NULL", "reason": "TEXT", "device": "TEXT", "label": "TEXT",
    "batch": "INTEGER", "seq_len": "INTEGER", "seq_len_k": "INTEGER", "num_seqs": "INTEGER", "total_q": "INTEGER",
    "heads_q": "INTEGER", "heads_kv": "INTEGER", "head_dim": "INTEGER", "head_dim_v": "INTEGER",
    "emb_dim": "INTEGER", "dtype": "TEXT", "causal": "INTEGER", "varlen": "INTEGER", "window": "TEXT",
    "layout": "TEXT", "median_ms": "REAL", "p10_ms": "REAL", "p90_ms": "REAL", "mean_ms": "REAL",
    "std_ms": "REAL", "min_ms": "REAL", "max_ms": "REAL", "n": "INTEGER", "iters_per_s": "REAL",
    "flops": "REAL", "flops_convention": "TEXT", "bytes": "REAL", "tflops": "REAL", "gbps": "REAL",
    "peak_mem_bytes": "INTEGER", "accuracy": "TEXT", "info": "TEXT", "samples_ms": "TEXT", "spec": "TEXT",
    "env_id": "TEXT", "seed": "INTEGER", "created_at": "REAL", "schema_version": "INTEGER",
}
