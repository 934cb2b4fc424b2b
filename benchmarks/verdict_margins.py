"""The margins of the operators' verdicts on a GPU as a markdown table: one row per (case, kernel), its verdict, the
measure closest to (or furthest past) its limit and the ratio (below 1 passes), from the JSON lines
``tests/gpu/test_operator_verdicts_gpu.py`` appends to ``$ATTNBENCH_MARGINS``.

    python3 benchmarks/verdict_margins.py margins.jsonl
"""

from __future__ import annotations

import json
import sys


def main(path: str) -> int:
    rows = [json.loads(line) for line in open(path) if line.strip()]
    print("| case | kernel | verdict | worst measure | ratio to its limit |")
    print("|---|---|---|---|---|")
    wrong_passed = right_failed = 0
    for r in rows:
        correct = r["kernel"].endswith("(correct)")
        ok = (r["verdict"] == "pass") == correct
        wrong_passed += not correct and r["verdict"] != "fail"
        right_failed += correct and r["verdict"] != "pass"
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.2f}"
        mark = "" if ok else " **(!)**"
        print(f"| {r['case']} | {r['kernel']} | {r['verdict']}{mark} | {r['tensor']} {r['metric']} | {ratio} |")
    print(f"\n{len(rows)} verdicts: {sum(r['kernel'].endswith('(correct)') for r in rows)} correct kernels, "
          f"{right_failed} of them failed; {sum(not r['kernel'].endswith('(correct)') for r in rows)} wrong ones, "
          f"{wrong_passed} of them passed")
    return 1 if wrong_passed or right_failed else 0


if __name__ == "__main__":
    raise SystemExit(main(*sys.argv[1:]))
