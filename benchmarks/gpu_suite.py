"""Every GPU test, with every optional package, in one command; ends with what ran and why the rest skipped.

    python3 benchmarks/gpu_suite.py [--wheels DIR] [--debs DIR] [--out DIR] [-n 8] [--stages jit,main,fa4]
                                    [--tests tests/gpu/test_x.py,...] [-k EXPRESSION]

Without ``--wheels`` the tests run in the current environment. With it, the wheels in DIR are installed
(no index, no dependency resolution) into two environments under ``--site``, because two of the
optional packages cannot share one Python environment:

- **main**: every wheel but FA4's (flash-attn 2, flash_attn_3, SageAttention, SpargeAttn, xformers with
  the CUDA 12 runtime it needs, FlashInfer, diffusers, ...);
- **fa4**: every wheel but flash-attn 2 and xformers: flash-attn-4 installs the package ``flash_attn``
  that flash-attn 2 also installs, and xformers then fails to import ``flash_attn.flash_attn_interface``.

Stages (each a pytest run with a JUnit file under ``--site``, so stages run in separate calls add up):
``jit`` runs the FlashInfer tests first, in parallel, so its nvcc builds (about 20 s to 2 min a module)
happen once and are reported on their own line; ``main`` runs every GPU test but FA4's in the main
environment; ``fa4`` runs FA4's in its own. The summary merges the stages: a test counts as passed when
it passed in a stage, failed when it failed in one, and skipped (with its reason) otherwise.

``--debs DIR``: Debian packages (libdw1, libelf1) that Nsight Systems' report step needs on images that
lack them; unpacked under ``--site`` and ``nsys`` from the Nsight Compute folder put on PATH.
"""

from __future__ import annotations

import argparse
import collections
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
NOT_IN = {"main": ("flash_attn_4-", "quack_kernels-", "torch_c_dlpack_ext-"),
          "fa4": ("flash_attn-2", "xformers-", "nvidia_cuda_runtime_cu12-")}
"""Wheel name prefixes left out of each environment."""
STAGES = {"jit": ("main", "flashinfer"), "main": ("main", "not fa4"), "fa4": ("fa4", "fa4")}
"""stage -> (environment, pytest -k expression)."""


def install(wheels: Path, site: Path, envs: tuple[str, ...] = tuple(NOT_IN)) -> None:
    """Install the wheels into the environments ``envs`` (once per site)."""
    for env in envs:
        left_out = NOT_IN[env]
        target = site / env
        mark = target / ".installed"
        if mark.exists():
            continue
        files = sorted(str(w) for w in wheels.glob("*.whl") if not w.name.startswith(left_out))
        shutil.rmtree(target, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                        "--target", str(target), *files], check=True)
        # PYTHONPATH does not run .pth files; the CUTLASS DSL's wheels need theirs.
        (target / "sitecustomize.py").write_text(f"import site\nsite.addsitedir({str(target)!r})\n")
        mark.touch()
        print(f"{env}: {len(files)} wheels installed in {target}")


def nsys_on_path(debs: Path, site: Path) -> dict:
    """Environment additions that make the image's nsys work (libdw, libelf from ``debs``)."""
    root = site / "debs"
    for deb in debs.glob("*.deb"):
        subprocess.run(["dpkg", "-x", str(deb), str(root)], check=True)
    found = sorted(glob.glob("/opt/nvidia/nsight-compute/*/host/target-linux-x64/nsys"))
    bindir = site / "bin"
    bindir.mkdir(parents=True, exist_ok=True)
    if found and not shutil.which("nsys"):
        link = bindir / "nsys"
        link.unlink(missing_ok=True)
        link.symlink_to(found[-1])
    return {"LD_LIBRARY_PATH": str(root / "usr/lib/x86_64-linux-gnu"), "PATH": str(bindir)}


def env_for(name: str | None, site: Path, extra: dict) -> dict:
    env = dict(os.environ)
    paths = {"PYTHONPATH": [str(REPO / "src")], "LD_LIBRARY_PATH": [], "PATH": []}
    if name is not None:
        paths["PYTHONPATH"].append(str(site / name))
        runtime = site / name / "nvidia/cuda_runtime/lib"  # xformers' CUDA 12 runtime
        if runtime.is_dir():
            paths["LD_LIBRARY_PATH"].append(str(runtime))
    for key, value in extra.items():
        paths[key].append(value)
    for key, values in paths.items():
        if values:
            env[key] = os.pathsep.join(values + ([env[key]] if env.get(key) else []))
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_stage(stage: str, env: dict, junit_dir: Path, out: Path, workers: int, tests: list[str] | None = None,
              select: str | None = None) -> float | None:
    """Run one stage (on ``tests``, default every GPU test; ``select`` narrows the stage's -k further); its wall
    seconds, or None when pytest wrote no JUnit file (it did not run tests)."""
    _, expr = STAGES[stage]
    if select:
        expr = f"({expr}) and ({select})"
    junit = junit_dir / f"{stage}.xml"
    junit.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", *(tests or ["tests/gpu"]), "-k", expr, "-rs",
           "-p", "no:cacheprovider", f"--junitxml={junit}"] + (["-n", str(workers)] if workers > 1 else [])
    start = time.perf_counter()
    with open(out / f"pytest-{stage}.log", "w") as log:
        subprocess.run(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    seconds = time.perf_counter() - start
    tail = (out / f"pytest-{stage}.log").read_text().strip().splitlines()[-1:]
    print(f"{stage}: {tail[0] if tail else 'no output'} ({seconds:.0f} s wall)", flush=True)
    return seconds if junit.exists() else None


def outcomes(junit: Path) -> dict[str, tuple[str, str]]:
    """test id -> (passed | failed | skipped, skip reason or failure message) from one JUnit file."""
    out = {}
    for case in ET.parse(junit).iter("testcase"):
        test = f"{case.get('classname')}::{case.get('name')}"
        skipped = case.find("skipped")
        failed = case.find("failure") if case.find("failure") is not None else case.find("error")
        if failed is not None:
            out[test] = ("failed", ((failed.get("message") or "").splitlines() or [""])[0][:160])
        elif skipped is not None:
            out[test] = ("skipped", skipped.get("message") or "")
        else:
            out[test] = ("passed", "")
    return out


def split_reason(message: str) -> tuple[str, str]:
    """(what, why) of a skip message: the tests say "<backend> <case> <pass>: <why>" or "<backend>: <why>";
    ``what`` is the backend ('' when the message names none), ``why`` the cause shared by many tests."""
    message = re.sub(r"^Skipped: ", "", message.strip())
    head, sep, rest = message.partition(": ")
    if sep and 1 <= len(head.split()) <= 3 and not head.startswith(("needs", "no ", "not ")):
        return head.split()[0], rest[:120]
    return "", message[:120]


def summary(junit_dir: Path) -> tuple[str, int]:
    merged: dict[str, tuple[str, str]] = {}
    rank = {"failed": 2, "passed": 1, "skipped": 0}
    for junit in sorted(junit_dir.glob("*.xml")):
        for test, (outcome, message) in outcomes(junit).items():
            if test not in merged or rank[outcome] > rank[merged[test][0]]:
                merged[test] = (outcome, message)
    counts = collections.Counter(outcome for outcome, _ in merged.values())
    lines = [f"GPU suite: {counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped "
             f"({len(merged)} tests, stages: {', '.join(p.stem for p in sorted(junit_dir.glob('*.xml')))})"]
    for outcome in ("failed", "skipped"):
        reasons: dict[str, list[str]] = collections.defaultdict(list)
        for o, message in merged.values():
            if o == outcome:
                what, why = split_reason(message) if outcome == "skipped" else ("", message[:120])
                reasons[why].append(what)
        if reasons:
            lines.append(f"{outcome}, by reason:")
            for why, whats in sorted(reasons.items(), key=lambda kv: -len(kv[1])):
                names = ", ".join(sorted({w for w in whats if w}))
                lines.append(f"  {len(whats):4d}  {why}" + (f"  [{names}]" if names else ""))
    failed = sorted(t for t, (o, _) in merged.items() if o == "failed")
    lines += [f"  FAILED {t}" for t in failed]
    return "\n".join(lines), counts["failed"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheels", type=Path, help="install these wheels into the two environments first")
    parser.add_argument("--debs", type=Path, help="libdw/libelf .deb files that make the image's nsys work")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu-suite-out")))
    parser.add_argument("--site", type=Path, default=Path(tempfile.gettempdir()) / f"attnbench-gpu-suite-{os.getuid()}",
                        help="where the environments and the stages' JUnit files live (kept between calls)")
    parser.add_argument("-n", "--workers", type=int, default=8, help="pytest-xdist workers per stage")
    parser.add_argument("--stages", default="jit,main,fa4", help="comma-separated: jit, main, fa4 (default: all)")
    parser.add_argument("--fresh", action="store_true", help="forget the JUnit files of earlier stages")
    parser.add_argument("--tests", default=None, help="comma-separated test files or folders (default: tests/gpu)")
    parser.add_argument("-k", dest="select", default=None, help="a pytest -k expression that narrows every stage")
    args = parser.parse_args()
    stages = [s for s in args.stages.split(",") if s]
    unknown = [s for s in stages if s not in STAGES]
    if unknown:
        parser.error(f"unknown stage {unknown[0]!r}; stages: {', '.join(STAGES)}")
    args.out.mkdir(parents=True, exist_ok=True)
    junit_dir = args.site / "junit"
    if args.fresh:
        shutil.rmtree(junit_dir, ignore_errors=True)
    junit_dir.mkdir(parents=True, exist_ok=True)
    if args.wheels:
        install(args.wheels, args.site, tuple(dict.fromkeys(STAGES[s][0] for s in stages)))
    extra = nsys_on_path(args.debs, args.site) if args.debs else {}
    broken = []
    for stage in stages:
        env_name = STAGES[stage][0] if args.wheels else None
        seconds = run_stage(stage, env_for(env_name, args.site, extra), junit_dir, args.out, args.workers,
                            args.tests.split(",") if args.tests else None, args.select)
        if seconds is None:
            broken.append(stage)
        elif stage == "jit":
            print(f"FlashInfer tests, first (their JIT builds, {args.workers} workers): {seconds:.0f} s wall", flush=True)
    text, failed = summary(junit_dir)
    (args.out / "summary.txt").write_text(text + "\n")
    print(text)
    if broken:
        print(f"pytest ran no tests in stage {', '.join(broken)}: see pytest-<stage>.log in {args.out}")
    return 1 if failed or broken else 0


if __name__ == "__main__":
    sys.exit(main())
