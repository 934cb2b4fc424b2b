"""`attnbench e2e`: a whole model with its attention swapped per backend (the CogVideoX-2b write-up's table)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated

import typer
from rich import box
from rich.markup import escape
from rich.table import Table

from attnbench import features, metrics
from attnbench.backends import options as backend_options
from attnbench.cli import common
from attnbench.cli.common import UserError
from attnbench.cli.run import resolve_backends
from attnbench.models.config import HYBRID_MODELS, MODES, E2EConfig, ModelVariants, model_names
from attnbench.results import env as envmod
from attnbench.results import export, files
from attnbench.results.record import Record, busy_of
from attnbench.results.store import DEFAULT_DB, ResultStore, new_run_id
from attnbench.spec import FP8_DTYPES, normalize_dtype
from attnbench.version import __version__

DEFAULT_BACKENDS = {"cpu": ("naive", "sdpa-math"), "cuda": ("sdpa-flash", "sdpa-cudnn", "sdpa-efficient")}


def _one(values, name: str):
    values = common._as_list(values)
    if not values:
        return None
    if len(values) > 1:
        raise UserError(f"{name} takes one value, got {', '.join(map(str, values))}")
    return values[0]


def model_variants(opts: dict, sliding_window) -> ModelVariants:
    """The features' options (``attnbench.features``) and --sliding-window -> ModelVariants (a model has a feature
    or not: no 'both')."""
    window = None if sliding_window is None else common.positive_int(sliding_window, "--sliding-window")
    try:
        return ModelVariants(**{f.name: f.model_value(opts) for f in features.FEATURES}, sliding_window=window)
    except ValueError as exc:  # FeatureError included
        raise UserError(str(exc)) from None


def build_config(model: str, backends, device: str | None, mode: str, layers, steps, warmup, dtype,
                 batch_size, seq_len, seed: int, backend_opt, kernel_counts: bool = False,
                 skip_missing: bool = False, variants: ModelVariants | None = None,
                 recurrence: str | None = None) -> E2EConfig:
    """Validate the options into an E2EConfig; raises UserError."""
    dev = common.resolve_device(device)
    if model not in model_names():
        raise UserError(f"unknown --model {model!r}; known: {', '.join(model_names())}")
    if mode not in MODES:
        raise UserError(f"bad --mode {mode!r}; allowed: {', '.join(MODES)}")
    if recurrence is not None and model not in HYBRID_MODELS:
        raise UserError(f"--recurrence picks the backend of a hybrid model's Gated DeltaNet layers "
                        f"({', '.join(HYBRID_MODELS)}); --model {model} has none")
    try:
        configured = backend_options.resolve(backend_opt)
        dtype = _one(dtype, "--dtype")
        if dtype and normalize_dtype(dtype) in FP8_DTYPES:
            raise UserError(f"--dtype {dtype}: fp8 inputs are for kernel runs (run, verify); models run in fp16, bf16 or fp32")
        names = resolve_backends(common._as_list(backends), None, dev, skip_missing, configured) if backends else \
            DEFAULT_BACKENDS["cpu" if dev == "cpu" else "cuda"]
        _attention_only(names)
        batch, seq = _one(batch_size, "--batch-size"), _one(seq_len, "--seq-len")
        cfg = E2EConfig(model=model, backends=tuple(names), device=dev, mode=mode, layers=layers, steps=steps,
                        warmup=warmup, dtype=normalize_dtype(dtype) if dtype else None,
                        batch=common.positive_int(batch, "--batch-size") if batch is not None else None,
                        seq_len=common.positive_int(seq, "--seq-len") if seq is not None else None, seed=seed,
                        kernel_counts=kernel_counts, variants=variants or ModelVariants(), backend_options=configured,
                        recurrence=recurrence)
    except UserError:
        raise
    except ValueError as exc:
        raise UserError(str(exc)) from None
    check_recurrence(cfg)
    return cfg


def _attention_only(names) -> None:
    """--backends swaps the attention: a recurrence (or other operator's) backend named there is a mistake."""
    from attnbench.backends import registry
    for name in names:
        operator = registry.get(name).operator
        if operator != "attention":
            hint = " (a hybrid model's GDN layers take it through --recurrence)" if operator == "recurrence" else ""
            raise UserError(f"--backends {name}: a backend of {operator} calls, not of attention{hint}")


def check_recurrence(cfg: E2EConfig) -> None:
    """The recurrence backend of a hybrid model can run its GDN calls here (else every record would be only
    'unsupported', whatever the attention backend); raises UserError."""
    if cfg.recurrence is None:
        return
    from attnbench.backends import registry
    from attnbench.cli.run import cannot_run
    from attnbench.models.footprint import recurrence_spec
    known = registry.of_operator("recurrence")
    if cfg.recurrence not in known:
        what = (f"--recurrence {cfg.recurrence}: a backend of {registry.get(cfg.recurrence).operator} calls, not a "
                "recurrence" if cfg.recurrence in registry.names() else f"unknown --recurrence {cfg.recurrence!r}")
        raise UserError(f"{what}; recurrence backends: {', '.join(known)}")
    if why := cannot_run(cfg.recurrence, cfg.device):
        raise UserError(f"--recurrence: {why}")
    if why := registry.get(cfg.recurrence).supports(recurrence_spec(cfg), cfg.device):
        raise UserError(f"--recurrence {cfg.recurrence} cannot run {cfg.model}'s GDN layers ({cfg.mode}): {why}")


def _build(cfg: E2EConfig):
    """The model and its inputs; UserError when memory runs out while building it (the estimate errs low)."""
    import torch

    from attnbench.models.bench import build_workload
    try:
        return build_workload(cfg)
    except (torch.OutOfMemoryError, MemoryError, RuntimeError) as exc:
        text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        if not isinstance(exc, (torch.OutOfMemoryError, MemoryError)) and "alloc" not in text.lower():
            raise
        raise UserError(f"--model {cfg.model}: out of memory while building it on {cfg.device} ({text[:200]}); "
                        "use --layers or a smaller --batch-size / --seq-len") from None


KERNEL_ROWS = (("direct_copy_kernel_cuda (times)", "copy_kernels", ",d"), ("direct_copy_kernel_cuda (ms)", "copy_ms", ".1f"),
               ("CUDAFunctor_add (times)", "add_kernels", ",d"), ("CUDAFunctor_add (ms)", "add_ms", ".1f"),
               ("Kernels (times)", "kernels", ",d"))
"""The CogVideoX-2b table's kernel rows, per profiled step (``--kernel-counts``)."""


def e2e_table(records: list[Record], title: str) -> Table:
    """The CogVideoX-2b table's layout: one column per backend, one row per metric (times per step). A step
    timed while other processes kept the CPU busy is marked ``?``; an attention share outside 0-100% (its
    clocks disagree with the step's) is marked ``!``, never printed as if it were a share."""
    table = Table(title=title, title_justify="left", header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False,
                  min_width=min(len(title), 100))  # the title on one line, not folded to a narrow table's width
    table.add_column("Metrics")
    for r in records:
        table.add_column(r.backend + (" (baseline)" if r is records[0] else ""), justify="right", overflow="fold")

    def cell(r: Record, key: str, fmt: str, scale: float = 1.0) -> str:
        value = r.info.get("e2e", {}).get(key)
        if r.status != "ok" and key != "total_ms":
            return "-"
        if value is None:
            return "-"
        text = _sig(value * scale) if fmt == "sig" else format(value * scale, fmt)
        if key in SHARES and not 0 <= value <= 1:
            text += IMPOSSIBLE
        return text + (BUSY if key in TIMED and busy_of(r.info) else "")

    def counted(r: Record, key: str, fmt: str) -> str:
        value = r.info.get("e2e", {}).get("kernel_counts", {}).get(key)
        return "-" if value is None or r.status != "ok" else format(value, fmt)
    rate = metrics.rate_unit(r.info.get("e2e", {}).get("attn_tflops") for r in records if r.status == "ok")
    hybrid = any(r.info.get("e2e", {}).get("recurrence") for r in records)
    recurrence = [("GDN (%)", "recurrence_share", ".1%", 1.0), ("GDN (s)", "recurrence_ms", "sig", 1e-3)] \
        if hybrid else []
    rows = [("Attn (%)", "attn_share", ".1%", 1.0), ("Attn (s)", "attn_ms", "sig", 1e-3), *recurrence,
            ("Total (s)", "total_ms", "sig", 1e-3), ("Speedup", "speedup", ".2f", 1.0),
            (f"Attn {rate.name}", "attn_tflops", "sig", rate.factor), ("Cosine", "cosine", ".6f", 1.0),
            ("rel-L1", "rel_l1", ".2e", 1.0), ("Attn calls", "calls", ".0f", 1.0)]
    if hybrid:
        rows.append(("GDN calls", "recurrence_calls", ".0f", 1.0))
    for label, key, fmt, scale in rows:
        table.add_row(label, *[cell(r, key, fmt, scale) for r in records])
    if any("kernel_counts" in r.info.get("e2e", {}) for r in records):  # one profiled step, as the CogVideoX-2b write-up's rows
        for label, key, fmt in KERNEL_ROWS:
            table.add_row(label, *[counted(r, key, fmt) for r in records])
    table.add_row("Status", *[r.status if r.status == "ok" else f"{r.status}: {escape(r.reason or '')}" for r in records])
    return table


BUSY, IMPOSSIBLE = "?", "!"
SHARES = ("attn_share", "recurrence_share")
TIMED = (*SHARES, "attn_ms", "recurrence_ms", "total_ms", "speedup", "attn_tflops")
"""The rows a busy CPU makes unreliable."""


def _sig(value: float) -> str:
    """Three significant digits: a CPU step's 0.00214 s is not 0.000."""
    return f"{value:#.3g}".rstrip(".") if abs(value) < 1000 else f"{value:.0f}"


def table_notes(records: list[Record]) -> list[str]:
    """What the marks of ``e2e_table`` mean, when it shows them; the CPU threads of a CPU run."""
    from attnbench.report.footnotes import cpu_notes
    notes = []
    if any(busy_of(r.info) for r in records):
        notes.append(f"{BUSY} other processes used the CPU during these steps: not the speed of an idle machine")
    if any(not 0 <= r.info["e2e"][key] <= 1 for r in records for key in SHARES
           if r.status == "ok" and r.info.get("e2e", {}).get(key) is not None):
        notes.append(f"{IMPOSSIBLE} not a share: the attention (or GDN) calls timed longer than their step (clocks "
                     "disagree)")
    return notes + cpu_notes(records)


@common.feature_options
def e2e(
    model: Annotated[str, typer.Option("--model", help=f"One of: {', '.join(model_names())}.")] = "llama-tiny",
    backends: common.Backends = None,
    skip_missing: common.SkipMissing = False,
    device: common.Device = None,
    mode: Annotated[str, typer.Option("--mode", help="prefill (one forward / denoising step) or train.")] = "prefill",
    layers: Annotated[int | None, typer.Option("--layers", help="Truncate to N blocks.")] = None,
    steps: Annotated[int, typer.Option("--steps", help="Timed steps per backend.")] = 3,
    warmup: Annotated[int, typer.Option("--warmup", help="Untimed steps per backend first.")] = 1,
    dtype: common.Dtype = None,
    batch_size: common.BatchSize = None,
    seq_len: Annotated[list[str] | None, typer.Option("--seq-len", metavar="N", help="Llama sequence length.")] = None,
    backend_opt: Annotated[list[str] | None, typer.Option(
        "--backend-opt", metavar="NAME.KEY=VALUE", help="Backend option NAME.KEY=VALUE, e.g. flex-sparse.sparsity=0.5 (repeatable).")] = None,
    db: common.Db = None,
    output: Annotated[Path | None, typer.Option("--output", help="Also write the records to FILE.json or FILE.csv.")] = None,
    seed: common.Seed = 0,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No table.")] = False,
    kernel_counts: Annotated[bool, typer.Option(
        "--kernel-counts", help="Profile one more step per backend and count its kernels (copies, adds; CUDA).")] = False,
    feature_opts: dict | None = None,
    sliding_window: Annotated[str | None, typer.Option(
        "--sliding-window", metavar="N", rich_help_panel="Model variants",
        help="Llama models: every other layer, the first included, sees only the last N tokens (gpt-oss: 128).")] = None,
    recurrence: Annotated[str | None, typer.Option(
        "--recurrence", metavar="BACKEND", rich_help_panel="Backends",
        help=f"Hybrid models ({', '.join(HYBRID_MODELS)}): the backend of the Gated DeltaNet layers, the same for "
             "every attention backend: torch-chunked (default), torch-recurrent, fla-chunk (CUDA).")] = None,
) -> None:
    """Run a model end to end with its attention swapped to each backend (first = baseline)."""
    cfg = build_config(model, backends, device, mode, layers, steps, warmup, dtype, batch_size, seq_len, seed,
                       backend_opt, kernel_counts, skip_missing, model_variants(feature_opts or {}, sliding_window),
                       recurrence)
    path = common.check_db_path(Path(db or DEFAULT_DB))
    if output is not None:
        try:
            export.format_for(output)
        except ValueError as exc:
            raise UserError(str(exc)) from None
        files.check_output(output, "--output", stores=(path,))
    from attnbench.models import dit, footprint
    from attnbench.models.bench import run_e2e
    if cfg.model in dit.PRESETS and (reason := dit.unavailable_reason(cfg.model)):
        raise UserError(f"--model {cfg.model}: {reason}")
    try:
        too_big = footprint.refusal(cfg)  # before anything is allocated
    except ValueError as exc:  # a shape no attention call can take (more tokens than int32 offsets)
        raise UserError(f"--model {cfg.model}: {exc}") from None
    if too_big:
        raise UserError(too_big)
    ResultStore.check_writable(path)
    if cfg.device == "cpu":  # one thread per core other processes leave free, as `run` does
        import torch

        from attnbench.timing import cpu_load
        torch.set_num_threads(cpu_load.plan().threads)
    env = envmod.collect(cfg.device)
    env_id = envmod.env_id(env)
    run_id = new_run_id()
    work = _build(cfg)  # before the run is recorded: a model that cannot be built leaves the store as it was
    with ResultStore(path) as store:
        store.add_env(env_id, env)
        store.start_run(run_id, command=common.stored_command("e2e"),
                        config=dataclasses.asdict(cfg), env_id=env_id, version=__version__)
        status = "interrupted"
        try:
            records = run_e2e(cfg, run_id=run_id, env_id=env_id, sink=store.write, workload=work)
            status = "done"
        finally:
            store.finish_run(run_id, status)
    if output is not None:
        common.write_output(records, output, path, run_id)
    if not quiet:
        layers_txt = f", {cfg.layers} layers" if cfg.layers else ""
        gdn_txt = f", GDN by {cfg.recurrence}" if cfg.recurrence else ""
        common.console.print(e2e_table(records, f"{cfg.model} {cfg.mode}{layers_txt}{gdn_txt} on {cfg.device}: "
                                                f"median of {cfg.steps} steps, seconds per step"))
        for note in table_notes(records):
            common.console.print(note, highlight=False, markup=False)
        common.console.print(f"results in {path}" + (f" and {output}" if output else ""), highlight=False)
