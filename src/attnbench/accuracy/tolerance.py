"""The verdict: is a backend's error acceptable for its dtype?

**Exact backends** (``Capabilities.exact``) are judged against the *math baseline*: the error that
plain PyTorch math in the same dtype (``baseline.math_baseline``, what the ``naive`` backend
computes) makes against the same exact reference. Per tensor (out, lse, dq, dk, dv) and per metric
in ``Tolerance.metrics`` (max abs, mean abs, relative L2) the backend passes when

    err <= k * baseline_err + floor

- ``k = 2``: flash-attn's own test-suite uses this factor (``test_flash_attn.py`` asserts its
  kernel's max error is at most twice PyTorch's error in the same dtype, plus a small atol). A
  correct kernel makes rounding errors of the same order as the baseline, sometimes larger on a
  given element (different summation order, P rounded to 16 bits before P·V, ...); a factor of 2
  absorbs that, while real bugs (a missed mask, a row left unwritten, a wrong scale, a GQA group
  not summed) are off by orders of magnitude.
- ``floor = floor_ulps · max(u, u_acc·sqrt(n)) · size`` with ``u`` the dtype's unit round-off
  (eps/2: 2^-9 bf16, 2^-12 fp16, 2^-24 fp32, 2^-53 fp64), ``floor_ulps = 2`` and ``size`` =
  max|ref| for max abs, mean|ref| for mean abs, 1 for relative L2. A kernel whose only error is
  rounding its result to the output dtype is off by up to ``u·|ref|``. The second term is the
  summation-order error of the fp32 accumulators every kernel uses (``u_acc`` = 2^-24, or the
  dtype's own round-off when that is smaller, i.e. fp64), which grows like sqrt(n) for sums of n
  terms (n = the longer sequence): a blocked kernel sums in a different order from the math path.
  It only matters for fp32 inputs (measured on an H200: sdpa-efficient fp32 dq max error 2.9e-6
  at S=577 against 2 x math 9.2e-7 + 3.5e-7 without it). The floor keeps correct kernels passing
  when the baseline happens to be tiny, and is far below any real bug. It is the analogue of
  flash-attn's ``atol`` at the reference's scale.

Any NaN or Inf (other than matching -inf/+inf LSE of rows that attend no key), a missing tensor or a
shape mismatch fails outright. A tensor the baseline does not have is reported, not judged.

**Approximate backends** (quantized or sparse: ``exact=False``) are not held to the baseline;
their error is by design. They get thresholds on similarity instead, per tensor: cosine similarity
``>= 0.98`` and relative L1 ``<= 0.07`` — SpargeAttn's tuning defaults for acceptable quality —
and the verdict is ``approx-pass`` / ``approx-fail``: reported as approximate, never as a failure
of exactness (a record's status stays ``ok``). NaN/Inf still fails them (``fail``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attnbench.spec import DTYPES

PASS, FAIL, APPROX_PASS, APPROX_FAIL = "pass", "fail", "approx-pass", "approx-fail"
VERDICTS = (PASS, FAIL, APPROX_PASS, APPROX_FAIL)


@dataclass(frozen=True, kw_only=True)
class Tolerance:
    """Thresholds of the verdict (see the module docstring for why these values)."""

    k: float = 2.0
    """Allowed multiple of the math baseline's error."""
    floor_ulps: float = 2.0
    """Absolute floor, in units of the dtype's round-off times the reference's size."""
    metrics: tuple[str, ...] = ("max_abs", "mean_abs", "rel_l2")
    """Metrics an exact backend is judged on."""
    approx_min_cosine: float = 0.98
    """Approximate backends: lowest cosine similarity per tensor."""
    approx_max_rel_l1: float = 0.07
    """Approximate backends: highest relative L1 error per tensor."""

    def __post_init__(self) -> None:
        if not self.k >= 1 or not self.floor_ulps >= 0:
            raise ValueError(f"tolerance needs k >= 1 and floor_ulps >= 0, got k={self.k}, floor_ulps={self.floor_ulps}")


def unit_roundoff(dtype: str) -> float:
    """eps/2 of a dtype name (fp16, bf16, fp32, fp64)."""
    return torch.finfo(DTYPES[dtype]).eps / 2


def floor(metric: str, ref_stats: dict, dtype: str, tol: Tolerance, reduction: int = 1) -> float:
    """Absolute floor of ``metric`` for a reference with ``ref_max_abs`` / ``ref_mean_abs`` whose
    entries are sums of about ``reduction`` terms (see the module docstring)."""
    size = {"max_abs": ref_stats.get("ref_max_abs", 1.0), "mean_abs": ref_stats.get("ref_mean_abs", 1.0)}.get(metric, 1.0)
    u = unit_roundoff(dtype)
    accumulate = min(u, unit_roundoff("fp32")) * max(1, reduction) ** 0.5
    return tol.floor_ulps * max(u, accumulate) * size


def _broken(name: str, m: dict) -> str | None:
    """Why a tensor fails regardless of thresholds (NaN/Inf, shape, LSE infinities), or None."""
    if "error" in m:
        return f"{name}: {m['error']}"
    if m.get("nonfinite"):
        return f"{name}: {m['nonfinite']} NaN/Inf values"
    if m.get("inf_mismatch"):
        return f"{name}: finite where the reference row attends no key ({m['inf_mismatch']} values)"
    return None


def judge(metrics: dict[str, dict], baseline: dict[str, dict] | None, dtype: str, *, exact: bool,
          missing: tuple[str, ...] = (), tol: Tolerance | None = None, reduction: int = 1) -> dict:
    """Verdict of per-tensor ``metrics`` (from compare.compare) -> {verdict, reason?, limits}."""
    tol = tol or Tolerance()
    problems = [f"{name}: not returned" for name in missing]
    problems += [why for name, m in metrics.items() if (why := _broken(name, m))]
    if problems:
        return {"verdict": FAIL, "reason": "; ".join(problems)}
    if not exact:
        return _judge_approx(metrics, tol)
    limits: dict[str, dict[str, float]] = {}
    failures = []
    for name, m in metrics.items():
        base = (baseline or {}).get(name)
        if base is None or "error" in base or base.get("nonfinite"):
            continue  # nothing to hold it to: reported, not judged
        limits[name] = {}
        for metric in tol.metrics:
            fl = floor(metric, m, dtype, tol, reduction)
            limit = tol.k * base[metric] + fl
            limits[name][metric] = limit
            if not m[metric] <= limit:
                failures.append(f"{name} {metric} {m[metric]:.3g} > {limit:.3g} "
                                f"(= {tol.k:g} x math {base[metric]:.3g} + floor {fl:.3g})")
    result = {"verdict": FAIL if failures else PASS, "limits": limits}
    if failures:
        result["reason"] = "; ".join(failures)
    return result


def _judge_approx(metrics: dict[str, dict], tol: Tolerance) -> dict:
    failures = []
    for name, m in metrics.items():
        if not m["cosine"] >= tol.approx_min_cosine:
            failures.append(f"{name} cosine {m['cosine']:.4f} < {tol.approx_min_cosine}")
        if not m["rel_l1"] <= tol.approx_max_rel_l1:
            failures.append(f"{name} rel_l1 {m['rel_l1']:.4f} > {tol.approx_max_rel_l1}")
    limits = {name: {"cosine": tol.approx_min_cosine, "rel_l1": tol.approx_max_rel_l1} for name in metrics}
    result = {"verdict": APPROX_FAIL if failures else APPROX_PASS, "limits": limits}
    if failures:
        result["reason"] = "; ".join(failures)
    return result
