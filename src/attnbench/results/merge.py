"""Join result databases (e.g. the per-rank files of a sharded sweep) into one.

Every record row is copied as it is (its run id included), environments are copied, and the run rows
of one run id found in several files become one run: earliest start, latest finish, status ``done``
only when every part is done. Copying the same file twice adds nothing: a record already present
(same run, case and creation time) is not copied again.

Parts of one run hold different cases (shards split a sweep). When a file's run holds a case that the
output already holds under that run id with another record, it is a different run that happens to share
the id (two `--run-id R` on two machines): it is kept apart under ``R-2`` (``R-3``, ...), and the summary
says so.
"""

from __future__ import annotations

import contextlib
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

from attnbench.results.record import COLUMNS
from attnbench.results.store import ADD_ENV, BadRunId, ResultStore, check_run_id

log = logging.getLogger(__name__)


@dataclass(kw_only=True)
class MergeSummary:
    """What a merge copied."""

    records: int = 0
    """Record rows copied."""
    duplicates: int = 0
    """Rows already present in the output (not copied again)."""
    runs: dict[str, int] = field(default_factory=dict)
    """Run id -> number of input files holding it."""
    renamed: list[tuple[str, str, str]] = field(default_factory=list)
    """(file, run id in it, run id given in the output) for runs kept apart from a run of the same id."""


def _combine_runs(old: dict | None, new: dict, new_part: bool = True) -> dict:
    """One run of two rows of its id. ``new_part``: ``new`` holds cases the output did not (another shard), so
    the cases each set out to run add up; a copy of a part already merged adds none."""
    if old is None:
        return dict(new)
    out = dict(old)
    planned = old.get("cases"), new.get("cases")
    if new_part:
        out["cases"] = None if None in planned else sum(planned)
    out["created_at"] = min(x for x in (old["created_at"], new["created_at"]) if x is not None)
    finished = [x for x in (old["finished_at"], new["finished_at"]) if x is not None]
    both_done = old["status"] == "done" and new["status"] == "done"
    out["finished_at"] = max(finished) if both_done and finished else None
    if not both_done:
        out["status"] = next(s for s in (old["status"], new["status"]) if s != "done")
    return out


def _clashing_runs(rows: list[dict], existing: set, cases: set, taken: set) -> dict[str, str]:
    """Run id -> new id for the runs of ``rows`` that hold a case the output already holds under their id
    with a different record (so they are other runs, not parts of that one)."""
    clash = sorted({r["run_id"] for r in rows if (r["run_id"], r["case_id"]) in cases
                    and (r["run_id"], r["case_id"], r["created_at"]) not in existing})
    rename = {}
    for run_id in clash:
        n = 2
        while f"{run_id}-{n}" in taken:
            n += 1
        rename[run_id] = f"{run_id}-{n}"
        taken.add(rename[run_id])
    return rename


def merge(out_path: Path, inputs: list[Path]) -> MergeSummary:
    """Copy every run, environment and record of ``inputs`` into ``out_path`` (created if needed).

    All or nothing: every input is opened (and refused, if it is not a usable store) before the output is
    touched, and everything is written in one transaction; an output created here is removed again when
    the merge fails."""
    out_path = Path(out_path)
    out_resolved = out_path.resolve()
    for path in inputs:
        if Path(path).resolve() == out_resolved:
            raise ValueError(f"{path} is both an input and the output; write the merge to a new file")
    created = not out_path.exists() or not out_path.stat().st_size
    try:
        with contextlib.ExitStack() as stack:
            sources = [(path, stack.enter_context(ResultStore(path, readonly=True))) for path in inputs]
            for path, src in sources:
                _check_ids(path, src)
            out = stack.enter_context(ResultStore(out_path))  # opened once every input is known to be good
            out.conn.execute("BEGIN IMMEDIATE")
            try:
                summary = _copy_into(out, sources)
                out.conn.commit()
            except BaseException:
                out.conn.rollback()
                raise
    except BaseException:
        if created and out_path.exists():
            for p in (out_path, *(out_path.with_name(out_path.name + s) for s in ("-wal", "-shm", "-journal"))):
                p.unlink(missing_ok=True)
        raise
    return summary


def _check_ids(path: Path, src: ResultStore) -> None:
    """BadRunId for a run id of ``src`` that ``check_run_id`` refuses: views name files after run ids, so one
    written into a store by other means (``../x``) is not carried into another store."""
    ids = src.conn.execute("SELECT run_id FROM runs UNION SELECT DISTINCT run_id FROM records").fetchall()
    for (run_id,) in ids:
        try:
            check_run_id(run_id, "run id")
        except BadRunId as exc:
            raise BadRunId(f"{exc}; {path} holds it, so nothing was merged: leave that file out") from None


def _copy_into(out: ResultStore, sources: list[tuple[Path, ResultStore]]) -> MergeSummary:
    """The merge itself, inside the caller's transaction on ``out``."""
    summary = MergeSummary()
    runs: dict[str, dict] = {}
    names = list(COLUMNS)
    cols = ", ".join(f'"{n}"' for n in names)
    for row in out.runs():
        runs[row["run_id"]] = row
    existing = {(r[0], r[1], r[2]) for r in out.conn.execute("SELECT run_id, case_id, created_at FROM records")}
    cases = {(run_id, case) for run_id, case, _ in existing}
    for path, src in sources:
        rows, src_runs = src.rows(), src.runs()
        out.conn.executemany(ADD_ENV, [(env_id, json.dumps(json.loads(data), sort_keys=True))
                                       for env_id, data in src.conn.execute("SELECT env_id, data FROM envs")])
        rename = _clashing_runs(rows, existing, cases, set(runs) | {r["run_id"] for r in src_runs})
        summary.renamed += [(str(path), old, new) for old, new in rename.items()]
        fresh, copied = [], set()
        for row in rows:
            row = dict(row, run_id=rename.get(row["run_id"], row["run_id"]))
            cases.add((row["run_id"], row["case_id"]))
            key = (row["run_id"], row["case_id"], row["created_at"])
            if key in existing:
                summary.duplicates += 1
                continue
            existing.add(key)
            copied.add(row["run_id"])
            fresh.append([row[n] for n in names])
        held = {r["run_id"] for r in rows}
        for run in src_runs:
            run = dict(run, run_id=rename.get(run["run_id"], run["run_id"]))
            summary.runs[run["run_id"]] = summary.runs.get(run["run_id"], 0) + 1
            new_part = run["run_id"] in copied or run["run_id"] not in held
            runs[run["run_id"]] = _combine_runs(runs.get(run["run_id"]), run, new_part)
        out.conn.executemany(f"INSERT INTO records ({cols}) VALUES ({', '.join('?' * len(names))})", fresh)
        summary.records += len(fresh)
        log.info("merged %d records from %s", len(fresh), path)
    run_cols = ("run_id", "created_at", "finished_at", "status", "command", "config", "env_id",
                "attnbench_version", "cases")
    out.conn.executemany(
        f"INSERT OR REPLACE INTO runs ({', '.join(run_cols)}) VALUES ({', '.join('?' * len(run_cols))})",
        [[run.get(c) for c in run_cols] for run in runs.values()])
    return summary
