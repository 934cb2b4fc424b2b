"""ALiBi (BLOOM, MPT, Baichuan): a linear bias on the scores, ``s_ij ← s_ij − slope_h · (i' − j)``.

With ``i' = i + Sk − Sq`` the query's position aligned to the lower right (as causal masks are), one slope per
query head (``spec.alibi``; ``alibi_slopes(H)`` are the standard ones, the geometric series of the ALiBi paper).
The bias is signed: a key after the query (only without a causal mask) gets a positive bias, as in BLOOM and MPT,
whose models add ``slope_h · j`` (the same softmax: the two differ by a constant per row). Applied after the
score features listed before it in ``FEATURES``, before the mask. The bias is formed in float32, as a model that keeps an fp32 ALiBi buffer does, and
added in the scores' dtype. It adds no gradient to q and k beyond the shifted probabilities.

**Inputs that make it matter.** The standard slopes (``2^-8k/n``) against N(0, 1) inputs need no help: the bias
moves the highest-weighted key of most rows. On verify's CPU shapes (4 heads, 100–577 tokens) it changes the
arg-max key of 88–98% of the rows of the steepest head and 16–63% of the gentlest; at 1000–4096 tokens and 16
heads, 78–100% on every head (``tests/unit/test_variants.py``). A kernel with the slopes reversed, halved, per
KV head, symmetric, or missing from its backward fails in bf16.
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path
from typing import TYPE_CHECKING

from attnbench.features.base import Feature, FeatureError, Option, finite_number, fits, shown, tristate

MAX_SLOPES_FILE = 1 << 20
"""Largest --alibi-slopes file (bytes): a slope per head is a few kilobytes at most."""


def alibi_slopes(heads: int) -> tuple[float, ...]:
    """The standard ALiBi slopes of ``heads`` heads: ``2^(-8k/n)`` for k = 1..n with n the largest power of two
    <= heads, then, for the heads beyond n, every other slope of the series for 2n heads (``2^(-4k/n)``, k odd)."""
    n = 2 ** int(math.floor(math.log2(heads)))
    slopes = [2.0 ** (-8.0 * k / n) for k in range(1, n + 1)]
    slopes += [2.0 ** (-4.0 * k / n) for k in range(1, 2 * (heads - n), 2)]
    return tuple(slopes)


def is_standard(slopes) -> bool:
    return all(math.isclose(a, b, rel_tol=1e-6) for a, b in zip(slopes, alibi_slopes(len(slopes)), strict=True))


def alibi_label(slopes: tuple[float, ...]) -> str:
    """``alibi`` for the standard slopes of that head count, ``alibi:<digest>`` for others (labels stay short)."""
    if is_standard(slopes):
        return "alibi"
    return "alibi:" + hashlib.sha1(repr(tuple(float(s) for s in slopes)).encode()).hexdigest()[:6]


def alibi_bias(slope: torch.Tensor, rel: torch.Tensor) -> torch.Tensor:
    """The ALiBi term ``slope · rel`` with ``rel = j − i'`` (key position minus aligned query position)."""
    return slope * rel


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


def read_slopes(value) -> tuple[float, ...] | None:
    """``--alibi-slopes``: a file of numbers (whitespace, commas or a YAML/JSON list), or in YAML a list; None
    if unset. The head count is checked per case (a mismatch names both counts)."""
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        items, where = list(value), "--alibi-slopes"
    else:
        from attnbench.results import files
        path = Path(str(value))
        where = f"--alibi-slopes {path}"
        if not path.is_file():
            raise FeatureError(f"{where}: no such file; give a file with one ALiBi slope per query head")
        try:
            text = files.read_text(path, MAX_SLOPES_FILE, "--alibi-slopes")
        except files.FileRefused as exc:
            raise FeatureError(str(exc)) from None
        except (UnicodeDecodeError, OSError) as exc:
            raise FeatureError(f"{where}: cannot read it as text ({type(exc).__name__})") from None
        items = text.replace(",", " ").replace("[", " ").replace("]", " ").split()
    slopes = []
    for item in items:
        slope = finite_number(item)
        if not math.isfinite(slope):
            raise FeatureError(f"{where}: {shown(item)} is not a finite number; give one slope per query head")
        slopes.append(slope)
    if not slopes:
        raise FeatureError(f"{where}: no slopes in it; give one number per query head")
    return tuple(slopes)


class _Block:
    def __init__(self, slopes: torch.Tensor, groups: int):
        self.slopes, self.groups = slopes, groups

    def apply_(self, s, box):
        a, b, c, d, sq, sk = box
        rel = relative_positions(sq, sk, s.device, s.dtype, rows=(a, b), keys=(c, d))
        hkv = self.slopes.shape[1]
        s.view(-1, hkv, self.groups, b - a, d - c).addcmul_(self.slopes, rel)
        return None


class Alibi(Feature):
    name = "alibi"
    title = "ALiBi"
    refusal = "ALiBi not supported"
    off = None
    json_column = True
    options = (Option("alibi", ("--alibi", "--no-alibi"), "[both]",
                      "ALiBi with the standard slopes of the head count; --alibi both runs both."),
               Option("alibi_slopes", ("--alibi-slopes",), "FILE",
                      "ALiBi with these slopes: one number per query head (implies --alibi).", path=True))

    def normalize(self, value):
        if value is None:
            return None
        return tuple(float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else x for x in value)

    def check(self, value, spec) -> None:
        if len(value) != spec.heads_q:
            raise ValueError(f"ALiBi needs one slope per query head: {len(value)} slopes for {spec.heads_q} q-heads")
        bad = [x for x in value if not isinstance(x, float) or not math.isfinite(x)]
        if bad:
            raise ValueError(f"ALiBi slopes must be finite numbers, got {bad[0]!r}")
        reach = max(max(spec.seqlens_q), max(spec.seqlens_k))  # the farthest a key sits from its query
        fits(max(abs(x) for x in value) * reach, spec.dtype, f"an ALiBi bias (slope x {reach} tokens) of")

    def label(self, value) -> str:
        return alibi_label(tuple(value))

    def export(self, value):
        return None if value is None else list(value)

    def settings(self, opts: dict):
        slopes = read_slopes(opts.get("alibi_slopes"))
        axis = tristate(opts.get("alibi"), "--alibi")
        if slopes is None:
            return axis
        if axis is not None and True not in axis:
            raise FeatureError("--alibi-slopes gives ALiBi slopes but --no-alibi turns ALiBi off: drop one")
        return tuple(slopes if on else False for on in (axis or (True,)))

    def resolve(self, setting, heads_q):
        if setting is False or setting is None:
            return None
        return alibi_slopes(heads_q) if setting is True else tuple(setting)

    def rebase(self, value, heads_q):
        return alibi_slopes(heads_q) if value is not None and is_standard(value) else value

    def model_value(self, opts: dict):
        if opts.get("alibi_slopes") is not None:
            raise FeatureError("a model's layers take the standard ALiBi slopes: --alibi-slopes is for run and verify")
        return bool(super().model_value(opts))

    def score_mod(self, value, sq, sk, device):
        import torch
        slopes = torch.tensor(value, dtype=torch.float32, device=device).view(-1, 1, 1)
        rel = relative_positions(sq, sk, device)

        def add_bias(scores, rows=None):
            return scores + alibi_bias(slopes, rel if rows is None else rel[rows]).to(scores.dtype)
        return add_bias

    def block_term(self, value, heads_q, heads_kv, dtype, device):
        import torch
        groups = heads_q // heads_kv
        return _Block(torch.as_tensor(value, dtype=dtype, device=device).view(1, heads_kv, groups, 1, 1), groups)


FEATURE = Alibi()

if TYPE_CHECKING:
    import torch
