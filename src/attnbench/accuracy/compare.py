"""Error metrics of one tensor against its reference, computed in chunks in fp64.

Metrics (``x`` = tested, ``y`` = reference, ``d = x − y``, sums over all elements):

- ``max_abs``  max |d|                  - ``mean_abs`` mean |d|
- ``rel_l2``   ‖d‖₂ / ‖y‖₂              - ``cosine``   Σxy / (‖x‖₂ ‖y‖₂)
- ``rel_l1``   Σ|d| / Σ|y|              - ``rmse``     sqrt(mean d²)

plus ``nonfinite`` (NaN/Inf count in ``x``), ``numel`` and the reference's own size, ``ref_max_abs``
and ``ref_mean_abs`` (the tolerance floors scale with them). The tensors are walked in slices of about
``CHUNK_ELEMS`` elements, each upcast to fp64 on its own device, so a comparison never holds more
than one fp64 slice of each operand at a time. Elements where the reference is infinite (the LSE
of a row that attends no key, -inf) are left out; ``x`` must be infinite there too (flash-attn
writes +inf, others -inf), otherwise they count in ``inf_mismatch``.
"""

from __future__ import annotations

import math

import torch

METRICS = ("max_abs", "mean_abs", "rel_l2", "cosine", "rel_l1", "rmse")
CHUNK_ELEMS = 1 << 22


def _slices(x: torch.Tensor, y: torch.Tensor, chunk: int):
    """Matching slices of x and y along their longest leading dim, about ``chunk`` elements each."""
    if x.dim() == 0:
        yield x.reshape(1), y.reshape(1)
        return
    dims = list(x.shape[:-1]) or [x.shape[0]]
    dim = max(range(len(dims)), key=lambda i: dims[i])
    per = max(1, x.numel() // max(1, x.shape[dim]))
    step = max(1, chunk // per)
    for start in range(0, x.shape[dim], step):
        n = min(step, x.shape[dim] - start)
        yield x.narrow(dim, start, n), y.narrow(dim, start, n)


def tensor_metrics(x: torch.Tensor, y: torch.Tensor, *, chunk: int = CHUNK_ELEMS) -> dict[str, float | int]:
    """Metrics of ``x`` against reference ``y`` (same shape; any dtypes; same device)."""
    if tuple(x.shape) != tuple(y.shape):
        raise ValueError(f"shape {tuple(x.shape)} does not match the reference {tuple(y.shape)}")
    if x.device != y.device:
        x = x.to(y.device)
    sums = dict.fromkeys(("abs", "sq", "xy", "xx", "yy", "yabs"), 0.0)
    max_abs, ref_max, nonfinite, inf_mismatch, counted = 0.0, 0.0, 0, 0, 0
    with torch.no_grad():
        for xs, ys in _slices(x, y, chunk):
            xs, ys = xs.to(torch.float64), ys.to(torch.float64)
            nonfinite += int((~torch.isfinite(xs)).sum())
            ref_inf = torch.isinf(ys)
            if bool(ref_inf.any()):
                inf_mismatch += int((ref_inf & ~torch.isinf(xs)).sum())
                nonfinite -= int((ref_inf & torch.isinf(xs)).sum())  # matching "no key" rows are fine
                keep = ~ref_inf
                xs, ys = xs[keep], ys[keep]
            d = xs - ys
            ad = d.abs()
            if ad.numel():
                max_abs = max(max_abs, float(ad.max()))
                ref_max = max(ref_max, float(ys.abs().max()))
            counted += ad.numel()
            sums["abs"] += float(ad.sum())
            sums["sq"] += float(d.square().sum())
            sums["xy"] += float((xs * ys).sum())
            sums["xx"] += float(xs.square().sum())
            sums["yy"] += float(ys.square().sum())
            sums["yabs"] += float(ys.abs().sum())
    out = _finish(sums, max_abs, counted, nonfinite, inf_mismatch, x.numel())
    out.update(ref_max_abs=ref_max, ref_mean_abs=sums["yabs"] / max(counted, 1))
    return out


def _ratio(num: float, den: float) -> float:
    if den > 0:
        return num / den
    return 0.0 if num == 0 else math.inf


def _finish(s: dict, max_abs: float, counted: int, nonfinite: int, inf_mismatch: int, numel: int) -> dict:
    n = max(counted, 1)
    norm = math.sqrt(s["xx"] * s["yy"])
    cosine = s["xy"] / norm if norm > 0 else (1.0 if s["xx"] == s["yy"] == 0 else 0.0)
    out = {"max_abs": max_abs, "mean_abs": s["abs"] / n, "rel_l2": _ratio(math.sqrt(s["sq"]), math.sqrt(s["yy"])),
           "cosine": cosine, "rel_l1": _ratio(s["abs"], s["yabs"]), "rmse": math.sqrt(s["sq"] / n),
           "nonfinite": nonfinite, "numel": numel}
    if inf_mismatch:
        out["inf_mismatch"] = inf_mismatch
    if nonfinite:  # NaN poisons the sums: say so plainly instead of reporting numbers
        for key in METRICS:
            out[key] = math.nan
    return out


def compare(outputs: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> dict[str, dict]:
    """Metrics per tensor name present in both (out, lse, dq, dk, dv); a shape mismatch gives an error entry."""
    result: dict[str, dict] = {}
    for name, ref in reference.items():
        got = outputs.get(name)
        if got is None:
            continue
        try:
            result[name] = tensor_metrics(got.detach(), ref)
        except ValueError as exc:
            result[name] = {"error": str(exc)}
    return result
