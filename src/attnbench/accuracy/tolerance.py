"""The verdict: is a backend's error acceptable for its dtype? (docs/fidelity.md, "The accuracy verdict")

**Exact backends** (``Capabilities.exact``) are judged against the *math baseline*: the error that
plain PyTorch math in the same dtype (``baseline.math_baseline``, what the ``naive`` backend
computes) makes against the same exact reference. Per tensor (out, dq, dk, dv) a backend passes when

    max_abs                                 <= k_max · baseline + floor_ulps · u_eff · max|ref|
    mean_abs                                <= k · baseline     + floor_ulps · u_eff · mean|ref|
    rel_l2                                  <= k · baseline     + floor_ulps · u_eff
    |scale|, |bias|, |block_scale|, |block_bias|,
    |head_scale|, |head_bias|               <= k · |baseline| + sys_floor_ulps · u_eff + z · rel_l2_limit / sqrt(n_eff)

with ``k = 2``, ``k_max = 3``, ``floor_ulps = 2``, ``sys_floor_ulps = 1``, ``z = 3`` and
``u_eff = max(u, u_acc · sqrt(n))``: ``u`` the unit round-off (eps/2) of the tensor's dtype —
2^-8 bf16, 2^-11 fp16, 2^-24 fp32, 2^-53 fp64 — and ``u_acc · sqrt(n)`` the summation-order error
of fp32 accumulators over ``n`` terms (``u_acc`` = 2^-24, or the dtype's own round-off when smaller, i.e.
fp64), which only matters for fp32 inputs. ``n`` is the longest sum behind an element of that tensor, which
its operator states per tensor (``reduction``): for attention the longer sequence or the head size; for a
recurrence the tokens of a sequence, or a head's tokens times its state for a per-head parameter's gradient
(Mamba2's dA sums every token, row and column of a head's state); for sparse MLA the slots or the row width.

- ``k = 2`` is flash-attn's own test criterion (its kernel's error at most twice PyTorch's in the
  same dtype, plus a small atol): a correct kernel rounds differently from naive math but by the
  same order, while real bugs (a missed mask, an unwritten row, a GQA group not summed) are off by
  orders of magnitude. Whole-tensor measures (mean abs, rel-L2) of two correct implementations vary
  by a few percent from seed to seed; the largest single element does not: SDPA's CPU flash kernel
  (bf16, causal, S=4097, Hq 4 / Hkv 2, d 64) has a dV max-abs error 1.08–2.02 × the baseline's over
  seeds 0–5. Hence ``k_max = 3`` for max abs, so that the verdict of a correct kernel does not
  depend on the seed.
- The floors keep a correct kernel passing when the baseline happens to be near exact (fp32): a
  kernel whose only error is rounding its result to the output dtype is off by up to ``u · |ref|``.
- The **systematic** measures (``compare.tensor_metrics``: the least-squares scale of the reference in
  the error, the mean error in units of the reference's RMS, and the same per block of 128 tokens of
  one head) catch what element-wise limits dilute: a dK 1% too small has a rel-L2 of 0.01, which a
  bf16 baseline (rel-L2 ~0.005) lets through at k = 2, but a scale of -0.01, against a limit of
  about one round-off (0.0039 in bf16). Rounding has no preferred direction, so correct kernels sit
  far below one round-off (on CPU in bf16, naive math included: |scale| ≤ 2e-4, per block ≤ 1e-3);
  rounding toward zero instead of to nearest would cost about 0.75 u, still under the limit.
- The **noise allowance** ``z · rel_l2_limit / sqrt(n_eff)``: a measure over ``n_eff`` effective elements
  (``compare``: a block of a heavy-tailed gradient, dβ or dg of a recurrence, is carried by a few elements) of
  errors as large as the element-wise limit allows is rounding noise of about ``rel_l2_limit / sqrt(n_eff)``; ``z = 3``
  such deviations are noise, not a systematic error. A chunk kernel rounds its intermediates (U, the state it
  reads) where the token-by-token yardstick does not, so its dβ of one 128-token block can be 1% off by chance at
  150 tokens; the allowance is 0.0004 for a block of 128 tokens × 64 values (n_eff ≈ 2700), so a 1% error of a
  tile still fails.
- The **per-head** measures (``head_scale``, ``head_bias``) hold every head to the same limit as the whole
  tensor: an error confined to one head of 128 is diluted 128 times in the whole tensor's scale and hidden by
  the largest of thousands of blocks' noise, but it is the full error of its head.
- A **small tensor** (at most ``SMALL_TENSOR`` = 256 elements: the gradient of a per-head input such as a sink
  logit, Mamba2's dA and dD, sparse MLA's dattn_sink, one element per head of at most 128 heads) has each element
  a sum over every row of terms that largely cancel: with so few elements there is no "systematic" part to tell
  from rounding (the scale of four numbers is just their relative error), so it is judged on the element-wise
  measures alone. Per-token inputs (shaped like the output) are judged like dQ.
- A **per-head parameter's gradient** (Mamba2's dA, dD) sums a per-token gradient over every token, with heavy
  cancellation: its relative error is the per-token errors' times the cancellation. A chunk kernel's per-token
  errors are correlated over a chunk (its C tokens read one rounded state), the token-by-token yardstick's are not,
  so the sum's error grows like C/√C = √C times faster: such a tensor (the operator names it and its chunk,
  ``correlated``) is allowed ``k · √C`` times the yardstick's error (8 at fla's 64). In bf16 its error is then a few
  percent whatever the kernel (Mamba2's dA at 600 tokens: 1.6% for the yardstick, 8% for the chunk form): a 1%
  mistake there is below what bf16 can resolve, and the per-token gradients it sums (ddt) are judged as any other.
- **LSE**: it is judged in fp32, whatever dtype a kernel returns it in (fp64 in an fp64 case): not held to the
  half-precision baseline's logsumexp but to the exact reference alone at fp32's round-off (the floors above
  with no baseline term). A softmax scale 1% off shifts the LSE by about 0.01, thousands of fp32 round-offs;
  an LSE rounded to bf16 is off by up to 0.03 at a logsumexp of 8, and a backward pass that reads it would be
  off by as much, so it fails.

Any NaN or Inf (other than matching -inf/+inf LSE of rows that attend no key), a missing tensor or a
shape mismatch fails outright. A tensor (other than the LSE) the baseline does not have is reported,
not judged.

**Approximate backends** (quantized or sparse: ``exact=False``) are not held to the baseline;
their error is by design. They get thresholds on similarity instead, per tensor: cosine similarity
``>= 0.98`` and relative L1 ``<= 0.07`` — SpargeAttn's tuning defaults for acceptable quality —
and the verdict is ``approx-pass`` / ``approx-fail``: reported as approximate, never as a failure
of exactness (a record's status stays ``ok``). NaN/Inf still fails them (``fail``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from attnbench.spec import DTYPES

PASS, FAIL, APPROX_PASS, APPROX_FAIL = "pass", "fail", "approx-pass", "approx-fail"
SMALL_TENSOR = 256
"""Tensors of at most this many elements are judged without the systematic measures (module docstring)."""
VERDICTS = (PASS, FAIL, APPROX_PASS, APPROX_FAIL)


@dataclass(frozen=True, kw_only=True)
class Tolerance:
    """Thresholds of the verdict (see the module docstring for why these values)."""

    k: float = 2.0
    """Allowed multiple of the math baseline's error (whole-tensor and systematic measures)."""
    k_max: float = 3.0
    """Allowed multiple of the math baseline's largest element error (max abs)."""
    floor_ulps: float = 2.0
    """Absolute floor of max abs, mean abs and rel-L2, in round-offs times the reference's size."""
    sys_floor_ulps: float = 1.0
    """Floor of the systematic measures (scale, bias and their per-block maxima), in round-offs."""
    z: float = 3.0
    """Noise allowance of the systematic measures, in deviations of rounding noise over their n_eff elements."""
    metrics: tuple[str, ...] = ("max_abs", "mean_abs", "rel_l2")
    """Element-wise metrics an exact backend is judged on."""
    systematic: tuple[str, ...] = ("scale", "bias", "block_scale", "block_bias", "head_scale", "head_bias")
    """Systematic measures an exact backend is judged on (compared in magnitude)."""
    approx_min_cosine: float = 0.98
    """Approximate backends: lowest cosine similarity per tensor."""
    approx_max_rel_l1: float = 0.07
    """Approximate backends: highest relative L1 error per tensor."""

    def __post_init__(self) -> None:
        if not (self.k >= 1 and self.k_max >= 1) or not (self.floor_ulps >= 0 and self.sys_floor_ulps >= 0):
            raise ValueError(f"tolerance needs k, k_max >= 1 and floors >= 0, got k={self.k}, k_max={self.k_max}, "
                             f"floor_ulps={self.floor_ulps}, sys_floor_ulps={self.sys_floor_ulps}")


def unit_roundoff(dtype: str) -> float:
    """eps/2 of a dtype name (fp16, bf16, fp32, fp64, or torch's: bfloat16, float32, ...)."""
    return torch.finfo(DTYPES.get(dtype) or getattr(torch, dtype)).eps / 2


def effective_roundoff(dtype: str, reduction: int = 1) -> float:
    """u_eff = max(u, u_acc · sqrt(n)) of the module docstring."""
    u = unit_roundoff(dtype)
    return max(u, min(u, unit_roundoff("fp32")) * max(1, reduction) ** 0.5)


def floor(metric: str, ref_stats: dict, dtype: str, tol: Tolerance, reduction: int = 1) -> float:
    """Absolute floor of ``metric`` for a reference with ``ref_max_abs`` / ``ref_mean_abs`` whose
    entries are sums of about ``reduction`` terms (see the module docstring)."""
    if metric in tol.systematic:
        return tol.sys_floor_ulps * effective_roundoff(dtype, reduction)
    size = {"max_abs": ref_stats.get("ref_max_abs", 1.0), "mean_abs": ref_stats.get("ref_mean_abs", 1.0)}.get(metric, 1.0)
    return tol.floor_ulps * effective_roundoff(dtype, reduction) * size


def _broken(name: str, m: dict) -> str | None:
    """Why a tensor fails regardless of thresholds (NaN/Inf, shape, LSE infinities), or None."""
    if "error" in m:
        return f"{name}: {m['error']}"
    if m.get("nonfinite"):
        return f"{name}: {m['nonfinite']} NaN/Inf values"
    if m.get("inf_mismatch"):
        return f"{name}: finite where the reference row attends no key ({m['inf_mismatch']} values)"
    return None


def lse_dtype(dtype: str) -> str:
    """The dtype an LSE is judged in: fp32, or fp64 in an fp64 case (module docstring)."""
    return "fp64" if unit_roundoff(dtype) < unit_roundoff("fp32") else "fp32"


def judge(metrics: dict[str, dict], baseline: dict[str, dict] | None, dtype: str, *, exact: bool,
          missing: tuple[str, ...] = (), tol: Tolerance | None = None,
          reduction: int | dict[str, int] = 1, correlated: dict[str, int] | None = None) -> dict:
    """Verdict of per-tensor ``metrics`` (from compare.compare) -> {verdict, reason?, limits}. ``reduction``: the
    longest sum behind an element, one for every tensor or by tensor name (``"*"`` for the others); ``correlated``:
    the per-head parameters' gradients by name, with the chunk over which a kernel's errors of their terms are
    correlated (module docstring)."""
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
        if name == "lse":  # held to the exact reference at fp32's round-off (module docstring)
            base, tensor_dtype = {}, lse_dtype(dtype)
        else:
            base, tensor_dtype = (baseline or {}).get(name), dtype
            if base is None or "error" in base or base.get("nonfinite"):
                continue  # nothing to hold it to: reported, not judged
        n = reduction if isinstance(reduction, int) else reduction.get(name, reduction.get("*", 1))
        limits[name] = {}
        small = m.get("numel", SMALL_TENSOR + 1) <= SMALL_TENSOR
        for metric in (*tol.metrics, *(() if small else tol.systematic)):
            if metric not in m:
                continue
            k = (tol.k_max if metric == "max_abs" else tol.k) * math.sqrt((correlated or {}).get(name, 1))
            fl = floor(metric, m, tensor_dtype, tol, n)
            neff = m.get(metric + "_neff")
            if metric in tol.systematic and neff:  # noise allowance (module docstring)
                fl += tol.z * limits[name].get("rel_l2", 0.0) / math.sqrt(neff)
            ref_err = abs(base.get(metric, 0.0))
            limit = k * ref_err + fl
            limits[name][metric] = limit
            if not abs(m[metric]) <= limit:
                held = f"{k:.3g} x math {ref_err:.3g} + floor {fl:.3g}" if base else f"{tensor_dtype} floor"
                failures.append(f"{name} {metric} {m[metric]:.3g} > {limit:.3g} (= {held})")
    result = {"verdict": FAIL if failures else PASS, "limits": limits}
    worst = worst_ratio(metrics, limits)
    if worst:
        result["worst"] = worst
    if failures:
        result["reason"] = "; ".join(failures)
    return result


def worst_ratio(metrics: dict[str, dict], limits: dict[str, dict]) -> dict | None:
    """The judged measure closest to (or furthest past) its limit: {tensor, metric, ratio = |value| / limit}."""
    best = None
    for name, lim in limits.items():
        for metric, limit in lim.items():
            value = abs(metrics.get(name, {}).get(metric, 0.0))
            ratio = value / limit if limit > 0 else (0.0 if value == 0 else float("inf"))
            if best is None or ratio > best["ratio"]:
                best = {"tensor": name, "metric": metric, "ratio": ratio}
    return best


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
