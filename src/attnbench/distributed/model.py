"""A scaling model of context-parallel attention, calibrated on measurements (``attnbench cp-model``).

Per rank and per ring step it adds up what the methods in ``ring.py``, ``ulysses.py`` and ``usp.py``
do, with times taken from measurements wherever there are some:

- **compute**: the local kernel's time for the step's block, from its one-GPU TF/s at the same amount
  of work (FLOPs of the block; log-linear between measured sizes, flat beyond the largest), per pass
  and mask. A causal diagonal block uses the causal curve, every other block the full one.
- **ring communication**: each step's K/V shard goes to the next rank while the step computes, so a
  step costs the longer of the two; in the backward the fp32 dK/dV accumulators leave only once the
  step has updated them and the next step waits for them, so that transfer is exposed.
- **merge**: the fp32 merge of each step's output into the running one (forward) and the fp32 dQ,
  dK, dV accumulation (backward) read and write ``merge_bytes`` per element at the device's copy
  bandwidth; plus a fixed ``step_us`` per step (launches, stream waits).
- **Ulysses all-to-all**: q, k, v in and the output back (forward), dout in and dq, dk, dv back
  (backward), not overlapped: (N-1)/N of each tensor crosses the link, and each is copied twice on the
  device (to put heads in front for the swap, and back after it).
- **load balance**: the slowest rank sets the time (plain ring with a causal mask: rank N-1 computes
  N-1 full blocks and the diagonal while rank 0 computes only the diagonal).

The free parameters (all-to-all bandwidth, merge bytes, per-step overhead) are fitted on one set of
multi-GPU measurements and checked on another; the link between nodes is an input (quoted, not
measured here).
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import math
from dataclasses import dataclass, replace
from pathlib import Path

from attnbench.distributed.names import canonical
from attnbench.metrics import PASS_FLOP_FACTOR


@dataclass(frozen=True)
class Link:
    """A link's bandwidth per direction per GPU (GB/s) and its latency per message (us), or its measured
    times: ``curve`` of (bytes, ms) points, read log-log between points, at ``gbs`` past the largest and
    at the smallest's time below it."""

    name: str
    gbs: float
    latency_us: float
    curve: tuple[tuple[float, float], ...] = ()


@dataclass(frozen=True)
class Params:
    """What the model does not take from kernel measurements."""

    a2a_gbs: float = 300.0
    """All-to-all inside a node, GB/s per GPU per direction (fitted)."""
    p2p_gbs: float = 300.0
    """Ring transfers to the next GPU inside a node, GB/s per direction (fitted)."""
    merge_bytes: float = 12.0
    """Bytes read and written per output element per ring step by the merge / dQ accumulation (fitted)."""
    step_us: float = 50.0
    """Fixed cost per ring step or all-to-all (fitted)."""
    p2p_link: Link | None = None
    """Ring transfers inside a node as measured (``attnbench links``): replaces ``p2p_gbs`` when given."""
    a2a_link: Link | None = None
    """All-to-alls inside a node as measured: replaces ``a2a_gbs`` when given."""
    copy_gbs: float = 4270.0
    """Device copy bandwidth (read + write), GB/s: an H200 measures 4.27 TB/s."""
    node_size: int = 8
    """GPUs per node: rings and all-to-alls beyond it cross ``inter``."""
    inter: Link = Link("InfiniBand NDR 400 Gb/s per GPU (quoted)", 50.0, 10.0)
    """The link between nodes."""


@dataclass(frozen=True)
class Problem:
    """One attention call: B, total S, query and K/V heads, head size, bf16 by default."""

    batch: int
    seq_len: int
    heads: int
    kv_heads: int
    head_dim: int = 128
    causal: bool = False
    pass_: str = "fwd"
    elem_bytes: int = 2

    def flops(self) -> float:
        """FLOPs of the whole call, attnbench's exact convention (causal: attended pairs)."""
        s = self.seq_len
        pairs = s * (s + 1) / 2 if self.causal else s * s
        return 4.0 * self.batch * self.heads * self.head_dim * pairs * PASS_FLOP_FACTOR[self.pass_]


class MissingCurve(KeyError):
    """The kernel measurements lack the curve a prediction needs (a kernel, pass and mask)."""

    def __str__(self) -> str:
        return str(self.args[0])


MODEL_PASSES = ("fwd", "fwd_bwd")
"""Passes the model predicts (the backward alone is the fwd_bwd curve less the fwd one)."""


def _rows(path: str | Path, what: str) -> list[dict]:
    """The rows of a CSV file, read whole once it is known to be no bigger than such a file needs to be."""
    from attnbench.results.files import MAX_TABLE_BYTES, read_text
    return list(csv.DictReader(io.StringIO(read_text(Path(path), MAX_TABLE_BYTES, what))))


def _number(row: dict, key: str, where: str, *, integer: bool = False, low: float = 0.0, high: float = math.inf):
    """``row[key]`` as a finite number in (``low``, ``high``]; ValueError naming the row and the value."""
    raw = row.get(key)
    try:
        value = int(raw) if integer else float(raw)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: {key} {raw!r} is not {'an integer' if integer else 'a number'}") from None
    if not (math.isfinite(value) and low < value <= high):
        raise ValueError(f"{where}: {key} {raw!r} is not in ({low:g}, {high:g}]")
    return value


def _rate_bound(tflops: float, where: str) -> None:
    """A kernel or a run faster than any GPU can be is a wrong measurement, not a point to fit on."""
    from attnbench.plausibility import MARGIN, QUANTIZED_FACTOR, UNKNOWN_GPU_TFLOPS
    ceiling = MARGIN * QUANTIZED_FACTOR * UNKNOWN_GPU_TFLOPS
    if tflops > ceiling:
        raise ValueError(f"{where}: {tflops:,.0f} TF/s is above what any GPU does ({ceiling:,.0f}): not a measurement")


class KernelCurves:
    """TF/s of each local kernel against a block's work, from one-GPU measurements (a CSV with columns
    kernel, batch, seq_len, heads, head_dim, causal, pass, median_ms). ValueError, naming the row, for a row
    that is not a measurement (a column missing, a time that is not a positive finite number, a rate no GPU
    reaches)."""

    def __init__(self, rows: list[dict], source: str = "kernel measurements"):
        self.points: dict[tuple, list[tuple[float, float]]] = {}
        for i, r in enumerate(rows, start=2):  # CSV line numbers (line 1 is the header)
            where = f"{source} line {i}"
            dims = [_number(r, k, where, integer=True, high=2**31 - 1) for k in ("batch", "seq_len", "heads", "head_dim")]
            causal, pass_ = str(r.get("causal")), r.get("pass")
            if causal not in ("0", "1") or pass_ not in MODEL_PASSES:
                raise ValueError(f"{where}: causal {causal!r} / pass {pass_!r}: expected 0 or 1 / one of "
                                 f"{', '.join(MODEL_PASSES)}")
            p = Problem(dims[0], dims[1], dims[2], dims[2], dims[3], causal == "1", pass_)
            flops = p.flops()
            rate = flops / (_number(r, "median_ms", where) * 1e-3)
            _rate_bound(rate / 1e12, where)
            self.points.setdefault((canonical(str(r.get("kernel"))), pass_, p.causal), []).append((flops, rate))
        for pts in self.points.values():
            pts.sort()

    @classmethod
    def from_csv(cls, path: str | Path) -> KernelCurves:
        return cls(_rows(path, "kernel measurements"), str(path))

    @property
    def kernels(self) -> list[str]:
        return sorted({k for k, _, _ in self.points})

    def rate(self, kernel: str, pass_: str, causal: bool, flops: float) -> float:
        """FLOP/s at this much work: log-linear between measured points, flat outside them."""
        pts = self.points.get((kernel, pass_, causal))
        if not pts:
            raise MissingCurve(f"no one-GPU measurements of kernel {kernel} {pass_} {'causal' if causal else 'full'}")
        if flops <= pts[0][0]:
            return pts[0][1]
        for (f0, r0), (f1, r1) in zip(pts, pts[1:]):
            if flops <= f1:
                t = math.log(flops / f0) / math.log(f1 / f0)
                return r0 + t * (r1 - r0)
        return pts[-1][1]

    def ms(self, kernel: str, pass_: str, causal: bool, flops: float) -> float:
        return flops / self.rate(kernel, pass_, causal, flops) * 1e3

    def bwd_ms(self, kernel: str, causal: bool, fwd_flops: float) -> float:
        """Backward alone: the fwd_bwd time of the block less its forward."""
        total = self.ms(kernel, "fwd_bwd", causal, fwd_flops * PASS_FLOP_FACTOR["fwd_bwd"])
        return max(total - self.ms(kernel, "fwd", causal, fwd_flops), 0.0)


def _block_flops(p: Problem, sq: float, sk: float, heads: float, diagonal: bool) -> float:
    pairs = sq * (sq + 1) / 2 if diagonal else sq * sk
    return 4.0 * p.batch * heads * p.head_dim * pairs


def _transfer_ms(nbytes: float, link: Link) -> float:
    pts = link.curve
    if not pts:
        return link.latency_us * 1e-3 + nbytes / (link.gbs * 1e9) * 1e3
    if nbytes <= pts[0][0]:
        return pts[0][1]
    for (b0, t0), (b1, t1) in zip(pts, pts[1:]):
        if nbytes <= b1:
            w = math.log(nbytes / b0) / math.log(b1 / b0)
            return math.exp(math.log(t0) + w * (math.log(t1) - math.log(t0)))
    return pts[-1][1] + (nbytes - pts[-1][0]) / (link.gbs * 1e9) * 1e3


class Model:
    """Predicted time per call and TF/s per device of each method on N GPUs."""

    METHODS = ("ring", "zigzag", "ulysses", "usp")

    def __init__(self, curves: KernelCurves, params: Params = Params()):
        self.curves, self.params = curves, params

    def _links(self, n: int, p2p: bool) -> Link:
        """The slowest link a ring (``p2p``) or an all-to-all over ``n`` GPUs uses."""
        p = self.params
        if n > p.node_size:
            return p.inter
        if p2p:
            return p.p2p_link or Link("NVLink p2p (fitted)", p.p2p_gbs, 0.0)
        return p.a2a_link or Link("NVLink all-to-all (fitted)", p.a2a_gbs, 0.0)

    def _ring(self, p: Problem, kernel: str, n: int, s: float, heads: float, kv_heads: float, zigzag: bool,
              link: Link) -> float:
        """ms of a ring over ``n`` ranks holding ``s`` tokens each (the slowest rank)."""
        if n == 1:
            flops = _block_flops(p, s, s, heads, p.causal)
            return self.curves.ms(kernel, p.pass_, p.causal, flops * PASS_FLOP_FACTOR[p.pass_])
        par = self.params
        out_elems = p.batch * s * heads * p.head_dim
        kv_elems = p.batch * s * kv_heads * p.head_dim
        per_step = par.step_us * 1e-3
        merge = out_elems * par.merge_bytes / (par.copy_gbs * 1e9) * 1e3 + per_step
        accumulate = (out_elems + 2 * kv_elems) * par.merge_bytes / (par.copy_gbs * 1e9) * 1e3 + per_step
        kv_comm = _transfer_ms(2 * kv_elems * p.elem_bytes, link)
        dkv_comm = _transfer_ms(2 * kv_elems * 4, link)
        # the blocks the slowest rank computes, as (fwd flops, causal diagonal?)
        if not p.causal:
            blocks = [(_block_flops(p, s, s, heads, False), False)] * n
        elif zigzag:
            blocks = [(_block_flops(p, s, s, heads, True), True)] + [(_block_flops(p, s, s / 2, heads, False), False)] * (n - 1)
        else:  # contiguous: rank n-1 sees every shard, the last one its own diagonal
            blocks = [(_block_flops(p, s, s, heads, False), False)] * (n - 1) + [(_block_flops(p, s, s, heads, True), True)]
        total = 0.0
        for i, (flops, diag) in enumerate(blocks):
            ahead = 0.0 if i == len(blocks) - 1 else kv_comm  # the next K/V arrives during this block
            total += max(self.curves.ms(kernel, "fwd", diag, flops), ahead) + merge
            if p.pass_ == "fwd_bwd":
                # backward: K/V for the next step arrive during this one, but the fp32 dK/dV leave only
                # after it. Fitted on runs where ring_backward waited for them before each block (exposed,
                # once more at the end); it now waits only to add them, which 2 GPUs have yet to measure.
                total += max(self.curves.bwd_ms(kernel, diag, flops), ahead) + dkv_comm + accumulate
        return total

    def _a2a(self, p: Problem, n: int, tokens: float, link: Link) -> float:
        """ms of Ulysses' all-to-alls over ``n`` ranks, each holding ``tokens`` of every head before the swap."""
        if n == 1:
            return 0.0
        q = p.batch * tokens * p.heads * p.head_dim * p.elem_bytes
        kv = p.batch * tokens * p.kv_heads * p.head_dim * p.elem_bytes
        tensors = [q, kv, kv, q] + ([q, q, kv, kv] if p.pass_ == "fwd_bwd" else [])
        # each tensor is also re-laid out twice on the device (heads to the front before the swap, back
        # after it): two copies, each reading and writing it
        relayout_ms = 4 / (self.params.copy_gbs * 1e9) * 1e3
        return sum(_transfer_ms(t * (n - 1) / n, link) + t * relayout_ms + self.params.step_us * 1e-3 for t in tensors)

    def predict_ms(self, method: str, kernel: str, p: Problem, n: int, ulysses: int | None = None) -> float:
        """Predicted ms per call on ``n`` GPUs (the slowest rank); ValueError for a layout that does not fit."""
        s = p.seq_len / n
        if method in ("ring", "zigzag"):
            return self._ring(p, kernel, n, s, p.heads, p.kv_heads, method == "zigzag", self._links(n, True))
        if method == "ulysses":
            if p.heads % n or p.kv_heads % n:
                raise ValueError(f"ulysses needs the head counts ({p.heads}/{p.kv_heads}) to be multiples of {n}")
            flops = _block_flops(p, p.seq_len, p.seq_len, p.heads / n, p.causal)
            flops *= PASS_FLOP_FACTOR[p.pass_]
            return self.curves.ms(kernel, p.pass_, p.causal, flops) + self._a2a(p, n, s, self._links(n, False))
        if method == "usp":
            u = ulysses or math.gcd(n, self.params.node_size, p.heads, p.kv_heads)
            r = n // u
            ring = self._ring(p, kernel, r, p.seq_len / r, p.heads / u, p.kv_heads / u, p.causal, self._links(n, True))
            return ring + self._a2a(p, u, s, self._links(u, False))
        raise ValueError(f"unknown method {method!r}; modelled: {', '.join(self.METHODS)}")

    def tflops(self, method: str, kernel: str, p: Problem, n: int) -> float:
        """Predicted TF/s per device."""
        return p.flops() / n / (self.predict_ms(method, kernel, p, n) * 1e-3) / 1e12


# ---- calibration against multi-GPU records ------------------------------------------------------
@dataclass(frozen=True)
class Measured:
    """One multi-GPU record: method, kernel, world size, problem, measured TF/s per device."""

    method: str
    kernel: str
    n: int
    problem: Problem
    tflops: float


def read_measured(path: str | Path) -> list[Measured]:
    """cp-<method>:<kernel> records of an attnbench CSV export (ok rows with a world size > 1); ValueError,
    naming the line, for such a row that does not hold a measurement."""
    out = []
    for i, r in enumerate(_rows(path, "multi-GPU records"), start=2):
        backend = r.get("backend") or ""
        if r.get("status") != "ok" or not backend.startswith("cp-") or ":" not in backend:
            continue
        where = f"{path} line {i}"
        method, kernel = backend[3:].split(":", 1)
        kernel = canonical(kernel)  # stored measurements may name kernels as dist did before (cudnn)
        try:
            n = int(json.loads(r.get("info") or "{}").get("world_size", 1))
        except (ValueError, TypeError, AttributeError):
            raise ValueError(f"{where}: its info is not an attnbench record's (no world_size)") from None
        if n < 2 or method not in Model.METHODS:
            continue
        dims = [_number(r, k, where, integer=True, high=2**31 - 1)
                for k in ("batch", "seq_len", "heads_q", "heads_kv", "head_dim")]
        if r.get("pass") not in MODEL_PASSES:
            raise ValueError(f"{where}: pass {r.get('pass')!r}: expected one of {', '.join(MODEL_PASSES)}")
        p = Problem(*dims, r.get("causal") in ("1", "True", "true"), r["pass"])
        tflops = _number(r, "tflops", where)
        _rate_bound(tflops, where)
        out.append(Measured(method, kernel, n, p, tflops))
    return out


def twins(rows: list[Measured], node_size: int = Params.node_size) -> list[tuple[Measured, Measured]]:
    """Pairs of records of one problem whose methods do the same work, so that their difference is the
    measurement's own repeatability: ring and zigzag without a mask (the same full blocks), Ulysses and
    USP where USP's Ulysses degree is the whole world (no ring)."""
    by = {(m.method, m.kernel, m.n, m.problem): m for m in rows}
    pairs = []
    for (method, kernel, n, p), m in by.items():
        if method == "ring" and not p.causal and ("zigzag", kernel, n, p) in by:
            pairs.append((m, by[("zigzag", kernel, n, p)]))
        if method == "ulysses" and math.gcd(n, node_size, p.heads, p.kv_heads) == n and ("usp", kernel, n, p) in by:
            pairs.append((m, by[("usp", kernel, n, p)]))
    return pairs


def errors(model: Model, rows: list[Measured]) -> list[float]:
    """Relative error of the prediction for each row (predicted / measured - 1)."""
    return [model.tflops(m.method, m.kernel, m.problem, m.n) / m.tflops - 1 for m in rows]


def with_links(base: Params, doc: dict, source: str) -> Params:
    """``base`` with the inside-a-node links measured by ``attnbench links`` (its JSON document): each
    transfer's time read off the measured sizes. ValueError for a document that does not hold usable
    measurements: a transfer whose bandwidth could not be fitted, a time or a size that is not a positive
    finite number, a bandwidth above the device's memory bandwidth (``links.bandwidth_problem``)."""
    from attnbench.distributed.links import bandwidth_problem, ceiling_for
    from attnbench.distributed.links import fit as fit_links
    limits = ceiling_for(str(doc.get("device") or ""))
    links = {}
    for kind in ("p2p", "a2a"):
        rows = sorted((r for r in doc.get("rows", []) if r["kind"] == kind), key=lambda r: r["counted_bytes"])
        if len(rows) < 2 or kind not in doc.get("fit", {}):
            raise ValueError(f"no {kind} measurements in the links file")
        curve = tuple((_number(r, "counted_bytes", f"{kind} row"), _number(r, "median_ms", f"{kind} row"))
                      for r in rows)
        f = doc["fit"][kind]
        unfitted = f.get("unfitted") if f.get("gbs") is None else fit_links(
            [{"kind": kind, "bytes": b, "counted_bytes": b, "median_ms": ms} for b, ms in curve])[kind].get("unfitted")
        if unfitted:  # the file's own fit, or its rows, leave no bandwidth to read off
            raise ValueError(f"its {kind} bandwidth cannot be fitted ({unfitted}); measure again or use --fit-links")
        gbs = _number(f, "gbs", f"{kind} fit")
        latency = _number(f, "latency_us", f"{kind} fit", low=-1e-12)
        why = bandwidth_problem(gbs, limits) or next(
            (why for b, ms in curve if (why := bandwidth_problem(b / (ms * 1e-3) / 1e9, limits))), None)
        if why:
            raise ValueError(f"{kind}: {why}")
        links[kind] = Link(f"NVLink {kind} (measured, {source})", gbs, latency, curve)
    return replace(base, p2p_link=links["p2p"], a2a_link=links["a2a"], p2p_gbs=links["p2p"].gbs,
                   a2a_gbs=links["a2a"].gbs)


GRID = {"a2a_gbs": [50, 100, 150, 200, 300, 400, 600],
        "p2p_gbs": [50, 100, 150, 200, 300, 400, 600],
        "merge_bytes": [0, 4, 8, 16, 24, 32, 48],
        "step_us": [0, 25, 50, 100, 200, 400]}
LINK_PARAMS = ("a2a_gbs", "p2p_gbs")


class FitFailed(ValueError):
    """No parameter value predicts the records (every prediction infinite, zero or undefined)."""


def fit(curves: KernelCurves, rows: list[Measured], base: Params = Params(), free=tuple(GRID)) -> Params:
    """The ``free`` parameters minimising the mean squared log error over ``rows`` (a grid search); the
    others keep their values in ``base``. FitFailed when no value on the grid gives a finite error (there is
    then nothing to report as fitted)."""
    grid = {k: v for k, v in GRID.items() if k in free}
    best, best_loss = None, math.inf
    for values in itertools.product(*grid.values()):
        params = replace(base, **dict(zip(grid, values)))
        try:
            loss = sum(math.log1p(e) ** 2 for e in errors(Model(curves, params), rows))
        except (ValueError, ZeroDivisionError, OverflowError):  # a prediction of 0 or infinity: log undefined
            continue
        if loss < best_loss:  # NaN never is
            best, best_loss = params, loss
    if best is None:
        raise FitFailed(f"no value of {', '.join(grid)} on the grid predicts these {len(rows)} records (every "
                        "error is infinite or undefined); nothing fitted")
    return best


def at_grid_edge(params: Params, free=tuple(GRID)) -> list[str]:
    """The fitted parameters that sit on the edge of the searched grid (the best value may lie beyond it)."""
    return [k for k in free if k in GRID and getattr(params, k) in (GRID[k][0], GRID[k][-1])]
