"""`attnbench cp-model`: the context-parallel scaling model, calibrated and checked on measurements,
and its predictions for more GPUs (runs on the CPU)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from attnbench.cli import common
from attnbench.cli.common import UserError
from attnbench.distributed.names import canonical

RESULTS = Path("docs/results/raw")
MAX_HEADS, MAX_GPUS, MAX_TOKENS = 4096, 65536, 2**31 - 1
"""Bounds of the predictions asked for (--q-heads, --gpus, --seq-lens): past them nothing is a real job."""
DEFAULT_KERNELS = RESULTS / "h200-2026-11-24/cp-model/local_kernels_h200.csv"
DEFAULT_FIT = RESULTS / "h200x2-2026-11-22/seed001_tables.csv"
DEFAULT_CHECK = RESULTS / "h200x2-2026-11-24/cp_p4_fa3_128k.csv"
DEFAULT_LINKS = RESULTS / "h200x2-2026-11-24/links.json"
QUOTED = [
    ("the FA2 write-up's table, 8 x H100, FA2 (quoted)", "ring/zigzag/ulysses/usp, B 2-128, S 4k-64k, non-causal: 234-345 TF/s per "
     "device fwd, 220-307 fwd+bwd"),
    ("ring-flash-attn README, 8 x H800 (quoted)", "zigzag ring at 8k tokens per GPU, Llama-3.1-8B heads: 85.2% of "
     "FA2 on one GPU fwd, 90.2% fwd+bwd; plain ring 52.1% / 53.9%"),
    ("MagiAttention (not quoted)", "publishes its scaling as figures only; no numbers to set beside these"),
]


def _ints(text: str, what: str) -> list[int]:
    from attnbench.sweep import parse_int_list
    try:
        return parse_int_list(text, what)
    except ValueError as exc:
        raise UserError(str(exc)) from None


def cp_model(
    kernels_csv: Annotated[Path, typer.Option("--kernels", help="One-GPU local-kernel times (CSV: kernel, batch, "
                                              "seq_len, heads, head_dim, causal, pass, median_ms).")] = DEFAULT_KERNELS,
    fit_csv: Annotated[Path, typer.Option("--fit", help="Multi-GPU records (attnbench CSV export) the free "
                                          "parameters are fitted on.")] = DEFAULT_FIT,
    check_csv: Annotated[Path, typer.Option("--check", help="Multi-GPU records the fitted model is checked "
                                            "against (not used for fitting).")] = DEFAULT_CHECK,
    kernel: Annotated[str, typer.Option("--kernel", help="Local kernel of the predictions (as dist names it: fa3, "
                                        "sdpa-cudnn, ...).")] = "fa3",
    gpus: Annotated[str, typer.Option("--gpus", help="GPU counts to predict.")] = "2,4,8,16,64",
    seq_lens: Annotated[str, typer.Option("--seq-lens", help="Total sequence lengths to predict.")] = "128k,256k,512k,1M",
    heads: Annotated[int, typer.Option("--q-heads", help="Query heads.")] = 32,
    kv_heads: Annotated[int | None, typer.Option("--kv-heads", help="K/V heads (default: --q-heads).")] = None,
    causal: Annotated[bool, typer.Option("--causal/--full", help="Causal mask (default) or none.")] = True,
    links: Annotated[Path, typer.Option("--links", help="Peer transfer times measured by `attnbench links` "
                                        "(JSON), used for the links inside a node.")] = DEFAULT_LINKS,
    fit_links: Annotated[bool, typer.Option("--fit-links", help="Fit the two link bandwidths on the --fit records "
                                            "instead of using --links.")] = False,
) -> None:
    """Fit the scaling model of ring, zigzag, Ulysses and USP on measurements, check it, predict more GPUs."""
    from attnbench.distributed import model as cpm
    if fit_links:
        links = None
    for path in (kernels_csv, fit_csv, check_csv, *([links] if links else [])):
        if not path.is_file():
            raise UserError(f"{path}: no such file (run from the repository root, or pass --kernels/--fit/--check)")
    counts, lengths = _ints(gpus, "--gpus"), _ints(seq_lens, "--seq-lens")
    kv_heads = kv_heads or heads
    if not (1 <= heads <= MAX_HEADS and 1 <= kv_heads <= heads) or heads % kv_heads:
        raise UserError(f"bad --q-heads {heads} / --kv-heads {kv_heads}: in 1..{MAX_HEADS}, query heads a multiple "
                        "of K/V heads")
    for flag, values, high in (("--gpus", counts, MAX_GPUS), ("--seq-lens", lengths, MAX_TOKENS)):
        if max(values) > high:
            raise UserError(f"bad {flag} {max(values)}: at most {high:,}")
    try:
        curves = cpm.KernelCurves.from_csv(kernels_csv)
        kernel = canonical(kernel)
        if kernel not in curves.kernels:
            raise UserError(f"no one-GPU measurements of kernel {kernel!r} in {kernels_csv}; it has "
                            f"{', '.join(curves.kernels) or 'none'}")
        fit_rows, check_rows = cpm.read_measured(fit_csv), cpm.read_measured(check_csv)
        if not fit_rows:
            raise UserError(f"{fit_csv}: no multi-GPU cp-<method>:<kernel> records to fit on")
        base, free = cpm.Params(), tuple(cpm.GRID)
        if links is not None:
            base = _measured_links(links)
            free = tuple(k for k in cpm.GRID if k not in cpm.LINK_PARAMS)
        for rows, path in ((fit_rows, fit_csv), (check_rows, check_csv)):
            _needs_curves(cpm.Model(curves, base), rows, path, kernels_csv)
        wanted = [cpm.Measured("ring", kernel, n, cpm.Problem(1, 4096, heads, kv_heads, 128, causal, pass_), 1.0)
                  for pass_ in cpm.MODEL_PASSES for n in (1, 2)]  # what every prediction reads
        _needs_curves(cpm.Model(curves, base), wanted, Path(f"--kernel {kernel}"), kernels_csv)
        params = cpm.fit(curves, fit_rows, base, free)
    except UserError:
        raise
    except ValueError as exc:  # a row that is not a measurement, a fit with nothing to fit (FitFailed)
        raise UserError(str(exc)) from None
    model = cpm.Model(curves, params)
    console = common.console
    if links is None:
        comm = f"all-to-all {params.a2a_gbs:g} GB/s, ring p2p {params.p2p_gbs:g} GB/s (fitted)"
    else:
        p2p, a2a = params.p2p_link, params.a2a_link
        comm = (f"measured ({links}): ring p2p {p2p.gbs:.0f} GB/s, {p2p.latency_us:.0f} us; all-to-all "
                f"{a2a.gbs:.0f} GB/s, {a2a.latency_us:.0f} us (at the largest and smallest messages; each transfer's "
                f"time is read off the measured sizes)")
    console.print(f"links inside a node: {comm}; fitted on {len(fit_rows)} records of {fit_csv}: merge "
                  f"{params.merge_bytes:g} B/element, {params.step_us:g} us per step; between nodes: "
                  f"{params.inter.name}, {params.inter.gbs:g} GB/s, {params.inter.latency_us:g} us", highlight=False)
    edge = cpm.at_grid_edge(params, free)
    if edge:
        console.print(f"note: {', '.join(f'{k} = {getattr(params, k):g}' for k in edge)} at the edge of the values "
                      "tried: the records may want a value beyond it", highlight=False, markup=False)
    for title, rows in (("fit", fit_rows), ("check", check_rows)):
        _errors_table(title, model, rows)
    _predictions(model, kernel, counts, lengths, heads, kv_heads, causal)
    table = Table(title="published numbers, for comparison", header_style="bold")
    table.add_column("source")
    table.add_column("numbers")
    for source, text in QUOTED:
        table.add_row(source, text)
    console.print(table)


def _measured_links(path: Path):
    import json

    from attnbench.distributed import model as cpm
    from attnbench.results import files
    text = files.read_text(path, files.MAX_LINKS_BYTES, "--links")
    try:
        doc = json.loads(text)
        source = f"{doc.get('device', '?')} x {doc.get('world_size', '?')}, {doc.get('date', '?')}"
        return cpm.with_links(cpm.Params(), doc, source)
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        raise UserError(f"{path}: not a file written by `attnbench links --output`, or not a usable one ({exc})") from None


def _needs_curves(model, rows, path: Path, kernels_csv: Path) -> None:
    """UserError naming the one-GPU curve a record needs that --kernels lacks (before any fitting)."""
    from attnbench.distributed.model import MissingCurve
    for m in rows:
        try:
            model.predict_ms(m.method, m.kernel, m.problem, m.n)
        except MissingCurve as exc:
            raise UserError(f"{path}: {m.method}:{m.kernel} needs {exc}, which {kernels_csv} lacks") from None
        except ValueError:  # a layout the model cannot place: errors() shows it as a failed prediction
            pass


def _errors_table(title: str, model, rows) -> None:
    from attnbench.distributed.model import errors, twins
    if not rows:
        return
    errs = errors(model, rows)
    within = sum(abs(e) <= 0.05 for e in errs)
    spread = sorted(abs(a.tflops / b.tflops - 1) for a, b in twins(rows))
    table = Table(title=f"{title}: predicted vs measured TF/s per device ({within} of {len(rows)} within 5%)",
                  header_style="bold")
    for col in ("method:kernel", "GPUs", "B", "S", "causal", "pass", "measured", "predicted", "error"):
        table.add_column(col, justify="left" if col == "method:kernel" else "right")
    for m, e in zip(rows, errs):
        p = m.problem
        table.add_row(f"{m.method}:{m.kernel}", str(m.n), str(p.batch), str(p.seq_len), "yes" if p.causal else "no",
                      p.pass_, f"{m.tflops:.1f}", f"{m.tflops * (1 + e):.1f}", f"{100 * e:+.1f}%")
    common.console.print(table)
    if spread:
        common.console.print(
            f"{title}: repeatability of these records: {len(spread)} pairs doing the same work (ring and zigzag "
            f"without a mask, Ulysses and USP with no ring) differ by {100 * spread[len(spread) // 2]:.1f}% "
            f"(median), {100 * spread[-1]:.1f}% at most", highlight=False)


def _predictions(model, kernel: str, counts, lengths, heads: int, kv_heads: int, causal: bool) -> None:
    from attnbench.distributed.model import Problem
    table = Table(title=f"predicted TF/s per device (and % of {kernel} on one GPU at the same total work), B=1, "
                  f"H={heads}/{kv_heads}, D=128, bf16, {'causal' if causal else 'no mask'}; "
                  f"> {model.params.node_size} GPUs cross nodes", header_style="bold")
    for col in ("GPUs", "S", *(f"{m} {pa}" for pa in ("fwd", "fwd_bwd") for m in model.METHODS)):
        table.add_column(col, justify="right")
    for n in counts:
        for s in lengths:
            cells = []
            for pass_ in ("fwd", "fwd_bwd"):
                p = Problem(1, s, heads, kv_heads, 128, causal, pass_)
                one = model.tflops("ring", kernel, p, 1)
                for method in model.METHODS:
                    if s % (2 * n):
                        cells.append("-")
                        continue
                    try:
                        tf = model.tflops(method, kernel, p, n)
                    except ValueError:
                        cells.append("n/a")
                        continue
                    cells.append(f"{tf:.0f} ({100 * tf / one:.0f}%)")
            table.add_row(str(n), f"{s // 1024}k", *cells)
    common.console.print(table)
