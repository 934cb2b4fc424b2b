"""Error metrics of one tensor against its reference, computed in chunks in fp64.

Metrics (``x`` = tested, ``y`` = reference, ``d = x − y``, sums over all elements):

- ``max_abs``  max |d|                  - ``mean_abs`` mean |d|
- ``rel_l2``   ‖d‖₂ / ‖y‖₂              - ``cosine``   Σxy / (‖x‖₂ ‖y‖₂)
- ``rel_l1``   Σ|d| / Σ|y|              - ``rmse``     sqrt(mean d²)

and the **systematic** part of the error, which the element-wise metrics dilute:

- ``scale``  Σdy / Σy²: the least-squares factor of the reference in the error (−0.01 for an output
  1% too small), ``bias``  Σd / sqrt(n·Σy²): the mean error in units of the reference's RMS;
- ``block_scale``, ``block_bias``: the same per block of ``BLOCK_TOKENS`` consecutive tokens of one
  (batch, head) slice, the largest in magnitude (signed) — an error confined to one tile of a kernel.

Rounding errors of a correct kernel have no preferred direction, so these stay near zero however
large its element-wise error; a wrong scale or an offset moves them by its full size.

plus ``nonfinite`` (NaN/Inf count in ``x``), ``numel``, ``dtype`` (of ``x``) and the reference's own size, ``ref_max_abs``
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
SYSTEMATIC = ("scale", "bias", "block_scale", "block_bias")
CHUNK_ELEMS = 1 << 22
SUM_KEYS = ("abs", "sq", "xy", "xx", "yy", "yabs", "dy", "d")
BLOCK_TOKENS = 128
"""Tokens per block of the block metrics (a typical kernel tile of query or key rows)."""


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


def _token_slices(x: torch.Tensor, y: torch.Tensor, token_dim: int, chunk: int):
    """Matching slices along ``token_dim`` of about ``chunk`` elements, whole blocks of BLOCK_TOKENS each."""
    tokens = x.shape[token_dim]
    per_token = max(1, x.numel() // max(1, tokens))
    step = max(BLOCK_TOKENS, (chunk // per_token) // BLOCK_TOKENS * BLOCK_TOKENS)
    for start in range(0, tokens, step):
        n = min(step, tokens - start)
        yield x.narrow(token_dim, start, n), y.narrow(token_dim, start, n)


def _block_sums(parts: torch.Tensor, token_dim: int, feature: bool) -> torch.Tensor:
    """(k, *slice shape) per-element terms -> (k, blocks): summed over a row's features and BLOCK_TOKENS tokens."""
    if feature:
        parts = parts.sum(-1)
    parts = parts.movedim(1 + token_dim, -1)  # tokens last
    pad = (-parts.shape[-1]) % BLOCK_TOKENS
    if pad:
        parts = torch.nn.functional.pad(parts, (0, pad))
    return parts.reshape(*parts.shape[:-1], -1, BLOCK_TOKENS).sum(-1).reshape(parts.shape[0], -1)


def tensor_metrics(x: torch.Tensor, y: torch.Tensor, *, chunk: int = CHUNK_ELEMS,
                   token_dim: int | None = None) -> dict[str, float | int]:
    """Metrics of ``x`` against reference ``y`` (same shape; any dtypes; same device), in one pass.

    ``token_dim``: the sequence dimension, for the block metrics (-3 for (…, S, H, D) tensors, -1 for
    an LSE (…, H, S)); every dimension after it except a last feature dimension is a head dimension.
    Without it the whole tensor is one block."""
    if tuple(x.shape) != tuple(y.shape):
        raise ValueError(f"shape {tuple(x.shape)} does not match the reference {tuple(y.shape)}")
    if x.device != y.device:
        x = x.to(y.device)
    dtype = str(x.dtype).removeprefix("torch.")
    if token_dim is not None and x.dim() > 0:
        token_dim %= x.dim()
        slices = _token_slices(x, y, token_dim, chunk)
    else:
        token_dim, slices = None, _slices(x, y, chunk)
    feature = token_dim is not None and x.dim() - token_dim > 2  # (…, S, H, D): a row's D elements first
    # Everything accumulates on the tensors' device and is read back once at the end: a read per
    # partial result (about 20 per slice) made the check a third of a GPU sweep's non-timing cost.
    f64 = dict(dtype=torch.float64, device=y.device)
    sums_t = torch.zeros(len(SUM_KEYS), **f64)
    counts = torch.zeros(3, dtype=torch.int64, device=y.device)  # counted, nonfinite, inf_mismatch
    maxima = torch.zeros(2, **f64)  # max |d|, max |y|; NaN chunks are skipped (fmax), as before
    worst_t = torch.zeros(2, **f64)  # block_scale, block_bias: the largest in magnitude, signed
    with torch.no_grad():
        for xs, ys in slices:
            xs, ys = xs.to(torch.float64), ys.to(torch.float64)
            ref_inf, x_inf = torch.isinf(ys), torch.isinf(xs)
            counts += torch.stack(((~ref_inf).sum(),
                                   (~torch.isfinite(xs)).sum() - (ref_inf & x_inf).sum(),  # matching "no key" rows
                                   (ref_inf & ~x_inf).sum()))
            keep = ~ref_inf  # elements where the reference is infinite are left out of every sum
            xs, ys = torch.where(keep, xs, 0.0), torch.where(keep, ys, 0.0)
            d = xs - ys
            ad = d.abs()
            maxima = torch.fmax(maxima, torch.stack((ad.max(), ys.abs().max())))
            sums_t += torch.stack((ad.sum(), d.square().sum(), (xs * ys).sum(), xs.square().sum(),
                                   ys.square().sum(), ys.abs().sum(), (d * ys).sum(), d.sum()))
            if token_dim is not None:
                dy, yy, dd, cnt = _block_sums(torch.stack((d * ys, ys.square(), d, keep.to(torch.float64))),
                                              token_dim, feature)
                live = yy > 0
                for k, values in enumerate((dy / yy, dd / torch.sqrt(cnt * yy))):
                    values = torch.where(live, values, 0.0).flatten()
                    candidate = values[values.abs().argmax()]  # NaN wins argmax, then loses the comparison
                    worst_t[k] = torch.where(candidate.abs() > worst_t[k].abs(), candidate, worst_t[k])
    sums = dict(zip(SUM_KEYS, sums_t.tolist(), strict=True))
    counted, nonfinite, inf_mismatch = counts.tolist()
    max_abs, ref_max = maxima.tolist()
    worst = dict(zip(("block_scale", "block_bias"), worst_t.tolist(), strict=True))
    out = _finish(sums, max_abs, counted, nonfinite, inf_mismatch, x.numel())
    out.update(ref_max_abs=ref_max, ref_mean_abs=sums["yabs"] / max(counted, 1), dtype=dtype)
    if not nonfinite:
        yy = sums["yy"]
        scale = sums["dy"] / yy if yy > 0 else 0.0
        bias = sums["d"] / math.sqrt(counted * yy) if yy > 0 and counted else 0.0
        if token_dim is None:  # the whole tensor is the one block
            worst = {"block_scale": scale, "block_bias": bias}
        out.update(scale=scale, bias=bias, **worst)
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


TOKEN_DIMS = {"out": -3, "dq": -3, "dk": -3, "dv": -3, "lse": -1}
"""Sequence dimension of each tensor as the reference returns it: (…, S, H, D) and LSE (…, H, S)."""


def compare(outputs: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> dict[str, dict]:
    """Metrics per tensor name present in both (out, lse, dq, dk, dv); a shape mismatch gives an error entry."""
    result: dict[str, dict] = {}
    for name, ref in reference.items():
        got = outputs.get(name)
        if got is None:
            continue
        try:
            result[name] = tensor_metrics(got.detach(), ref, token_dim=TOKEN_DIMS.get(name))
        except ValueError as exc:
            result[name] = {"error": str(exc)}
    return result
