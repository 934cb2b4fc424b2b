"""Summary of benchmarks/verdict_check.sh's stores: per backend, verdicts, worst ratio to a limit, repeats."""

import json
import sqlite3
import sys
from collections import defaultdict
from pathlib import Path


def rows(db: Path) -> list[dict]:
    if not db.exists():
        return []
    conn = sqlite3.connect(db)
    conn.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in conn.execute("SELECT backend, label, pass, status, reason, seed, accuracy FROM records")]
    finally:
        conn.close()


def table(records: list[dict], title: str) -> str:
    per = defaultdict(list)
    for r in records:
        per[r["backend"]].append(r)
    lines = [f"### {title}", "", "| backend | checked | verdicts | worst ratio to a limit (case, tensor.measure) "
             "| repeated calls | other statuses |", "|---|---|---|---|---|---|"]
    for name in sorted(per):
        recs = per[name]
        acc = [(r, a) for r in recs if (a := json.loads(r["accuracy"] or "null"))]
        verdicts = defaultdict(int)
        for _, a in acc:
            verdicts[a["verdict"]] += 1
        worst = max(((a["worst"]["ratio"], r, a["worst"]) for r, a in acc if a.get("worst")), default=None,
                    key=lambda t: t[0])
        repeats = [a["repeat"] for _, a in acc if a.get("repeat")]
        nondet = [x for x in repeats if not x["deterministic"]]
        rep = (f"{len(repeats) - len(nondet)}/{len(repeats)} bit-identical"
               + (f", largest difference {max(x['max_diff'] for x in nondet):.3g}" if nondet else "")) if repeats else "-"
        other = defaultdict(int)
        for r in recs:
            if r["status"] not in ("ok", "mismatch"):
                other[r["status"]] += 1
        w = (f"{worst[0]:.2f} ({worst[1]['label']} {worst[1]['pass']} seed {worst[1]['seed']}, "
             f"{worst[2]['tensor']}.{worst[2]['metric']})") if worst else "-"
        lines.append(f"| {name} | {len(acc)} | {', '.join(f'{k} {v}' for k, v in sorted(verdicts.items())) or '-'} | {w} "
                     f"| {rep} | {', '.join(f'{k} {v}' for k, v in sorted(other.items())) or '-'} |")
    return "\n".join(lines) + "\n"


def main(out: Path) -> None:
    print(table(rows(out / "verify.db"), "verify, default shapes"))
    print(table(rows(out / "wrong.db"), "wrong-on-purpose kernels, S=16k (each must fail but test-fp32)"))
    print(table(rows(out / "run.db"), "run: 8k, fwd and fwd_bwd, causal both (B2 H16 D128 bf16)"))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
