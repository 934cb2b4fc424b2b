"""Error metrics of one tensor against its reference, computed in chunks in fp64.

Metrics (``x`` = tested, ``y`` = reference, ``d = x − y``, sums over all elements):

- ``max_abs``  max |d|                  - ``mean_abs`` mean |d|
- ``rel_l2``   ‖d‖₂ / ‖y‖₂              - ``cosine``   Σxy / (‖x‖₂ ‖y‖₂)
- ``rel_l1``   Σ|d| / Σ|y|              - ``rmse``     sqrt(mean d²)

and the **systematic** part of the error, which the element-wise metrics dilute:

- ``scale``  Σdy / Σy²: the least-squares factor of the reference in the error (−0.01 for an output
  1% too small), ``bias``  Σd / sqrt(n·Σy²): the mean error in units of the reference's RMS;
- ``block_scale``, ``block_bias``: the same per block of ``BLOCK_TOKENS`` consecutive tokens of one
  (batch, head) slice, the largest in magnitude (signed) — an error confined to one tile of a kernel;
- ``head_scale``, ``head_bias``: the same per head (every element of one index of the tensor's head dimension,
  all tokens and batches together), the largest in magnitude (signed) — an error confined to one head. A block
  holds 128 tokens, a head all of them: the rounding noise of a head's measure is far smaller than a block's, so
  a 1% error in one head among 128 stands out here where the largest of 2,048 blocks' noise would hide it.

Rounding errors of a correct kernel have no preferred direction, so these stay near zero however
large its element-wise error; a wrong scale or an offset moves them by its full size. How near zero depends on how
many elements carry the measure: errors of relative size e give a scale of about e/√n_eff, n_eff = (Σy²)²/Σy⁴ the
effective number of elements (a few large values of a heavy-tailed gradient carry a block alone), and a bias of
about e/√n. Each measure is reported with that number (``<measure>_neff``), and the block and head taken are the
most significant ones (largest |value|·√n_eff), not the largest: a 1% error in a block of many elements outranks
noise twice as large in a block of three.

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
SYSTEMATIC = ("scale", "bias", "block_scale", "block_bias", "head_scale", "head_bias")
CHUNK_ELEMS = 1 << 22
SUM_KEYS = ("abs", "sq", "xy", "xx", "yy", "yabs", "dy", "d", "y4")
BLOCK_TOKENS = 128
"""Tokens per block of the block metrics (a typical kernel tile of query or key rows)."""


def _slices(x: torch.Tensor, y: torch.Tensor, chunk: int, keep: int | None = None):
    """Matching slices of x and y along their longest leading dim other than ``keep`` (a dim every slice holds
    whole), about ``chunk`` elements each."""
    if x.dim() == 0:
        yield x.reshape(1), y.reshape(1)
        return
    dims = list(x.shape[:-1]) or [x.shape[0]]
    choices = [i for i in range(len(dims)) if i != keep] or [len(x.shape) - 1]
    dim = max(choices, key=lambda i: x.shape[i])
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


def _head_sums(parts: torch.Tensor, head_dim: int) -> torch.Tensor:
    """(k, *slice shape) per-element terms -> (k, heads): summed over everything but ``head_dim``."""
    parts = parts.movedim(1 + head_dim, 1)
    return parts.reshape(parts.shape[0], parts.shape[1], -1).sum(-1)


def tensor_metrics(x: torch.Tensor, y: torch.Tensor, *, chunk: int = CHUNK_ELEMS,
                   token_dim: int | None = None, head_dim: int | None = None) -> dict[str, float | int]:
    """Metrics of ``x`` against reference ``y`` (same shape; any dtypes; same device), in one pass.

    ``token_dim``: the sequence dimension, for the block metrics (-3 for (…, S, H, D) tensors, -1 for
    an LSE (…, H, S)); every dimension after it except a last feature dimension is a head dimension.
    Without it the whole tensor is one block. ``head_dim``: the head dimension, for the per-head measures
    (-2 for both of those); without it the whole tensor is one head."""
    if tuple(x.shape) != tuple(y.shape):
        raise ValueError(f"shape {tuple(x.shape)} does not match the reference {tuple(y.shape)}")
    if x.device != y.device:
        x = x.to(y.device)
    dtype = str(x.dtype).removeprefix("torch.")
    head_dim = head_dim % x.dim() if head_dim is not None and x.dim() > 0 else None
    if head_dim is not None and token_dim is not None and head_dim == token_dim % x.dim():
        raise ValueError("the head and token dimensions of a tensor must differ")
    if token_dim is not None and x.dim() > 0:
        token_dim %= x.dim()
        slices = _token_slices(x, y, token_dim, chunk)
    else:
        token_dim, slices = None, _slices(x, y, chunk, keep=head_dim)
    feature = token_dim is not None and x.dim() - token_dim > 2  # (…, S, H, D): a row's D elements first
    # Everything accumulates on the tensors' device and is read back once at the end: a read per
    # partial result (about 20 per slice) made the check a third of a GPU sweep's non-timing cost.
    f64 = dict(dtype=torch.float64, device=y.device)
    sums_t = torch.zeros(len(SUM_KEYS), **f64)
    counts = torch.zeros(3, dtype=torch.int64, device=y.device)  # counted, nonfinite, inf_mismatch
    maxima = torch.zeros(2, **f64)  # max |d|, max |y|; NaN chunks are skipped (fmax), as before
    # block_scale, block_bias: the most significant (largest |value|·√n_eff), signed; their n_eff; that significance
    worst_t, neff_t, sig_t = (torch.zeros(2, **f64) for _ in range(3))
    heads_t = None if head_dim is None else torch.zeros(5, x.shape[head_dim], **f64)  # per head: dy, yy, d, count, y⁴
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
            # per-element terms of the systematic measures, summed whole here and per block and head below
            yy_elem = ys.square()
            parts = torch.stack((d * ys, yy_elem, d, keep.to(torch.float64), yy_elem.square()))
            dy, yy, dd, _, y4 = parts.flatten(1).sum(1)
            sums_t += torch.stack((ad.sum(), d.square().sum(), (xs * ys).sum(), xs.square().sum(),
                                   yy, ys.abs().sum(), dy, dd, y4))
            if head_dim is not None:
                heads_t += _head_sums(parts, head_dim)
            if token_dim is not None:
                dy, yy, dd, cnt, y4 = _block_sums(parts, token_dim, feature)
                live = yy > 0
                neff = torch.where(y4 > 0, yy.square() / y4, 0.0)
                for k, (values, n) in enumerate(((dy / yy, neff), (dd / torch.sqrt(cnt * yy), cnt))):
                    values, n = torch.where(live, values, 0.0).flatten(), n.flatten()
                    sig = values.abs() * n.sqrt()
                    i = torch.where(torch.isnan(values), math.inf, sig).argmax()  # NaN counts as most significant
                    better = ~(sig[i] <= sig_t[k])
                    worst_t[k] = torch.where(better, values[i], worst_t[k])
                    neff_t[k] = torch.where(better, n[i], neff_t[k])
                    sig_t[k] = torch.where(better, sig[i], sig_t[k])
    sums = dict(zip(SUM_KEYS, sums_t.tolist(), strict=True))
    counted, nonfinite, inf_mismatch = counts.tolist()
    max_abs, ref_max = maxima.tolist()
    worst = dict(zip(("block_scale", "block_bias", "block_scale_neff", "block_bias_neff"),
                     worst_t.tolist() + neff_t.tolist(), strict=True))
    out = _finish(sums, max_abs, counted, nonfinite, inf_mismatch, x.numel())
    out.update(ref_max_abs=ref_max, ref_mean_abs=sums["yabs"] / max(counted, 1), dtype=dtype)
    if not nonfinite:
        yy = sums["yy"]
        scale = sums["dy"] / yy if yy > 0 else 0.0
        bias = sums["d"] / math.sqrt(counted * yy) if yy > 0 and counted else 0.0
        whole = {"scale_neff": yy * yy / sums["y4"] if sums["y4"] > 0 else 0.0, "bias_neff": float(counted)}
        if token_dim is None:  # the whole tensor is the one block
            worst = {"block_scale": scale, "block_bias": bias, "block_scale_neff": whole["scale_neff"],
                     "block_bias_neff": whole["bias_neff"]}
        out.update(scale=scale, bias=bias, **whole, **worst, **_worst_head(heads_t, scale, bias, whole))
    return out


def _worst_head(sums: torch.Tensor | None, scale: float, bias: float, whole: dict) -> dict[str, float]:
    """head_scale and head_bias: the most significant per-head measure (largest |value|·√n_eff, signed), and its
    n_eff; the whole tensor's without heads."""
    if sums is None:
        return {"head_scale": scale, "head_bias": bias, "head_scale_neff": whole["scale_neff"],
                "head_bias_neff": whole["bias_neff"]}
    dy, yy, d, cnt, y4 = sums
    live = yy > 0
    neff = torch.where(y4 > 0, yy.square() / y4, 0.0)
    result = {}
    for name, values, n in (("head_scale", dy / yy, neff), ("head_bias", d / torch.sqrt(cnt * yy), cnt)):
        values = torch.where(live, values, 0.0)
        i = torch.where(torch.isnan(values), math.inf, values.abs() * n.sqrt()).argmax()
        result[name], result[name + "_neff"] = float(values[i]), float(n[i])
    return result


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


LAYOUTS = {"out": (-3, -2), "dq": (-3, -2), "dk": (-3, -2), "dv": (-3, -2), "lse": (-1, -2)}
"""(token dim, head dim) of attention's tensors as the reference returns them: (…, S, H, D) and LSE (…, H, S).
Another operator names its own (``operators``' ``layouts``)."""


def compare(outputs: dict[str, torch.Tensor], reference: dict[str, torch.Tensor],
            layouts: dict[str, tuple[int | None, int | None]] | None = None) -> dict[str, dict]:
    """Metrics per tensor name present in both; ``layouts``: (token dim, head dim) by name (default attention's
    ``LAYOUTS``), None where a tensor has none. A shape mismatch gives an error entry."""
    layouts = LAYOUTS if layouts is None else layouts
    result: dict[str, dict] = {}
    for name, ref in reference.items():
        got = outputs.get(name)
        if got is None:
            continue
        token_dim, head_dim = layouts.get(name, (None, None))
        try:
            result[name] = tensor_metrics(got.detach(), ref, token_dim=token_dim, head_dim=head_dim)
        except ValueError as exc:
            result[name] = {"error": str(exc)}
    return result
