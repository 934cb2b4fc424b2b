"""The attention variants of today's models, each one field of the case (``AttnSpec``) and one term here.

With ``s_ij = scale · q_i · k_j`` the scaled score of query ``i`` and key ``j`` of one head ``h``, and
``i' = i + Sk − Sq`` the query's position aligned to the lower right (as causal masks are):

- **logit softcap** (Gemma 2, Grok): ``s_ij ← c · tanh(s_ij / c)`` (``spec.softcap = c``);
- **ALiBi** (BLOOM, MPT, Baichuan): ``s_ij ← s_ij − slope_h · (i' − j)`` (``spec.alibi``: one slope per query
  head; ``alibi_slopes(H)`` are the standard ones, the geometric series of the ALiBi paper). The bias is
  signed: a key after the query (only without a causal mask) gets a positive bias, as in BLOOM and MPT,
  whose models add ``slope_h · j`` (the same softmax: the two differ by a constant per row);
- **sinks** (gpt-oss): one logit ``sink_h`` per query head joins every row's softmax denominator and takes no
  value: ``o_i = Σ_j p_ij v_j`` with ``p_ij = exp(s_ij) / (Σ_k exp(s_ik) + exp(sink_h))``. The row's
  log-sum-exp includes it (``lse_i = log(Σ_k exp(s_ik) + exp(sink_h))``), so a row with no key has
  ``lse = sink_h`` and ``o = 0``. Sinks are trained: the backward pass gives
  ``d sink_h = −Σ_rows exp(sink_h − lse_i) · Σ_d dO_id · O_id``.

Order, when several apply: scale, softcap, ALiBi, mask, then the softmax with its sink. The functions below
are the definitions the exact reference, the naive backend and FlexAttention's ``score_mod`` share; the
tests check them against the formulas written out element by element.

**Sink values** are an input of the case, seeded like q, k and v (``draw_sinks``): ``ln(mean Sk) + 0.5 +
N(0, 1)`` per head. With N(0, 1) inputs a row's log-sum-exp is about ``ln(Sk) + 0.5``, so each sink takes
roughly a quarter to three quarters of its row's weight — a kernel that ignored the sinks would be off by
tens of percent, not by rounding, and the check cannot miss it.
"""

from __future__ import annotations

import hashlib
import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

SINK_SHIFT = 0.5
"""Added to ln(Sk) in ``draw_sinks``: the log-sum-exp of N(0, 1) scores over Sk keys is about ln(Sk) + 1/2."""


def alibi_slopes(heads: int) -> tuple[float, ...]:
    """The standard ALiBi slopes of ``heads`` heads: ``2^(-8k/n)`` for k = 1..n with n the largest power of two
    <= heads, then, for the heads beyond n, every other slope of the series for 2n heads (``2^(-4k/n)``, k odd)."""
    n = 2 ** int(math.floor(math.log2(heads)))
    slopes = [2.0 ** (-8.0 * k / n) for k in range(1, n + 1)]
    slopes += [2.0 ** (-4.0 * k / n) for k in range(1, 2 * (heads - n), 2)]
    return tuple(slopes)


def alibi_label(slopes: tuple[float, ...]) -> str:
    """``alibi`` for the standard slopes of that head count, ``alibi:<digest>`` for others (labels stay short)."""
    if all(math.isclose(a, b, rel_tol=1e-6) for a, b in zip(slopes, alibi_slopes(len(slopes)), strict=True)):
        return "alibi"
    return "alibi:" + hashlib.sha1(repr(tuple(float(s) for s in slopes)).encode()).hexdigest()[:6]


def softcap(score: torch.Tensor, cap: float) -> torch.Tensor:
    """``cap · tanh(score / cap)``."""
    return cap * (score / cap).tanh()


def alibi_bias(slope: torch.Tensor, rel: torch.Tensor) -> torch.Tensor:
    """The ALiBi term ``slope · rel`` with ``rel = j − i'`` (key position minus aligned query position)."""
    return slope * rel


def modify_scores(score: torch.Tensor, *, cap: float | None, slope: torch.Tensor | None,
                  rel: torch.Tensor | None) -> torch.Tensor:
    """The scaled scores with softcap, then ALiBi, applied (broadcasting ``slope`` and ``rel`` to ``score``).
    The bias is formed in the precision of ``slope`` and ``rel`` and added in the scores' dtype, as a model
    that keeps an fp32 ALiBi buffer does."""
    if cap is not None:
        score = softcap(score, cap)
    if slope is not None:
        score = score + alibi_bias(slope, rel).to(score.dtype)
    return score


def relative_positions(sq: int, sk: int, device, dtype=None, *, rows: tuple[int, int] | None = None,
                       keys: tuple[int, int] | None = None) -> torch.Tensor:
    """Matrix of ``j − i'`` (key position minus the query's lower-right aligned position ``i + sk − sq``) of a
    sequence of ``sq`` queries and ``sk`` keys: (sq, sk), or only query rows ``rows = (a, b)`` and keys
    ``keys = (c, d)``; float32 unless ``dtype`` says otherwise."""
    import torch

    dtype = torch.float32 if dtype is None else dtype
    a, b = rows or (0, sq)
    c, d = keys or (0, sk)
    i = torch.arange(a, b, device=device, dtype=dtype).unsqueeze(1) + (sk - sq)
    j = torch.arange(c, d, device=device, dtype=dtype).unsqueeze(0)
    return j - i


def with_sinks(scores: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
    """(..., H, Sq, Sk) scores with one more column per row holding ``sinks[h]``: a softmax over the result gives
    the sink its share of each row, and its last column is dropped afterwards (how gpt-oss writes it)."""
    import torch

    column = sinks.to(scores.dtype).view(-1, 1, 1).expand(*scores.shape[:-1], 1)
    return torch.cat([scores, column], dim=-1)


def draw_sinks(heads: int, seqlens_k: tuple[int, ...], generator: torch.Generator,
               device: torch.device) -> torch.Tensor:
    """float32 (heads,) sink logits: ``ln(mean Sk) + SINK_SHIFT + N(0, 1)`` (module doc)."""
    import torch

    mean_sk = sum(seqlens_k) / len(seqlens_k)
    noise = torch.randn(heads, generator=generator, device=device, dtype=torch.float32)
    return noise + (math.log(mean_sk) + SINK_SHIFT)
