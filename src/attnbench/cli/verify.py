"""`attnbench verify`: every backend against the exact reference, forward and backward.

Takes the same case options as ``run``, ``--op`` included: without lengths given, each operator's bug-prone
shapes (attention's ``bug_prone_specs``, another operator's ``bug_prone``). The default pass is ``fwd_bwd``
(output and gradients in one call); a forward-only backend is checked on ``fwd`` instead. Timing is minimal (no warm-up, one
call) unless ``--warmup`` / ``--repeat`` say otherwise. Records go to the store like ``run``'s.
Exit status 1 when any exact backend fails (accuracy mismatch, NaN/Inf, or an error).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Annotated

import typer
from rich import box
from rich.markup import escape
from rich.table import Table

from attnbench import features
from attnbench.cli import common
from attnbench.cli import run as run_cmd
from attnbench.results import env as envmod
from attnbench.results.record import Record
from attnbench.results.store import ResultStore, new_run_id
from attnbench.spec import AttnSpec
from attnbench.timing import TimingConfig
from attnbench.version import __version__

# Tensor names as the FA2 accuracy write-up prints them.
LABELS = {"out": "Output", "lse": "LSE", "dq": "dQ", "dk": "dK", "dv": "dV"}
FAILED_STATUSES = ("mismatch", "nan", "error", "implausible")
VERDICT_STYLE = {"pass": "green", "approx-pass": "green", "fail": "red", "approx-fail": "yellow"}


SHAPE_OPTIONS = ("seq_lens", "kv_seq_lens", "q_heads", "kv_heads", "batch_size", "head_size", "emb_dim", "window")


def bug_prone_specs(device: str, dtypes, causal) -> list[AttnSpec]:
    """verify's default cases: the shapes where kernel bugs hide, which aligned power-of-two shapes cannot
    show — lengths that are no multiple of 64 or 128 (dropped tail keys, unmasked tail rows), GQA (wrong
    head mapping, a group not summed), queries shorter than keys (wrongly aligned causal masks), a varlen
    group with a length-1 sequence (leakage across packed sequences), and one aligned multi-block length."""
    if device.startswith("cuda"):
        b, h, d, long = 2, 16, 128, 4096
        shapes = [dict(seqlens_q=(1000,)), dict(seqlens_q=(577,), heads_kv=4, head_dim=64),
                  dict(seqlens_q=(300,), seqlens_k=(1000,), heads_kv=4), dict(seqlens_q=(long,)),
                  dict(seqlens_q=(77, 300, 1, 1000), heads_kv=4)]
    else:
        b, h, d = 1, 4, 64
        shapes = [dict(seqlens_q=(100,)), dict(seqlens_q=(577,), heads_kv=2, head_dim=32),
                  dict(seqlens_q=(77,), seqlens_k=(300,), heads_kv=2), dict(seqlens_q=(256,)),
                  dict(seqlens_q=(77, 30, 1, 130), heads_kv=2)]
    specs = []
    for shape in shapes:
        shape = {"batch": b, "heads_q": h, "head_dim": d, **shape}
        if len(shape["seqlens_q"]) > 1:
            shape["batch"] = 1
        specs += [AttnSpec(dtype=dtype, causal=c, pass_="fwd_bwd", **shape) for dtype in dtypes for c in causal]
    return specs


def with_variants(defaults: list[AttnSpec], asked: list[AttnSpec]) -> list[AttnSpec]:
    """The default shapes with each feature setting (``attnbench.features``) and scale of the asked-for cases,
    each carried to the shape's head count (``Feature.rebase``: the standard ALiBi slopes follow it; given
    slopes must match it)."""
    settings = dict.fromkeys((tuple((f.name, getattr(s, f.name)) for f in features.FEATURES), s.scale) for s in asked)
    out = []
    for values, scale in settings:
        for spec in defaults:
            fields = {name: features.BY_NAME[name].rebase(value, spec.heads_q) if value is not None else None
                      for name, value in values}
            try:
                out.append(spec.replace(**fields, scale=scale))
            except ValueError as exc:
                raise common.UserError(f"{exc}: verify's default shapes have {spec.heads_q} q-heads; give --q-heads "
                                       "and --seq-lens to check other shapes") from None
    return list(dict.fromkeys(out))


def build_verify_plan(ctx: typer.Context) -> run_cmd.RunPlan:
    """``run``'s plan with verify's defaults: the bug-prone shapes unless shapes are given, pass fwd_bwd,
    warm-up 0, one timed call."""
    return verify_plan(run_cmd.options_of(ctx))


OPERATOR_SHAPES = ("seq_lens", "kv_seq_lens", "batch_size", "topk")
"""Options that give another operator's cases their lengths: with one, verify checks the cases as asked."""
OPERATOR_SETTINGS = ("q_heads", "v_heads", "head_size", "head_size_v", "chunk", "decode", "sink", "topk_lengths",
                     "extra_cache", "indices", "empty_slots", "repeated_slots", "initial_state")
"""Options that the bug-prone cases of another operator keep (``bug_prone``'s ``given``)."""
SWITCHES = ("initial_state",)
"""Settings whose "off" is a choice too (``--no-initial-state``), given when not None."""


def operator_cases(asked: list, cfg: dict, device: str) -> list:
    """Another operator's verify cases: its bug-prone shapes (``Operator.bug_prone``) for each asked-for case's
    settings (kind, dtype, heads a preset or the user gave...), unless lengths are given."""
    from attnbench import operators
    if any(cfg.get(name) for name in OPERATOR_SHAPES):
        return asked
    given = frozenset(name for name in OPERATOR_SETTINGS
                      if cfg.get(name) not in (None, False, [], ()) or (name in SWITCHES and cfg.get(name) is False))
    try:
        return list(dict.fromkeys(spec for a in asked for spec in operators.of(a).bug_prone(a, given, device)))
    except ValueError as exc:
        raise common.UserError(f"{exc}: verify's default shapes do not take it; give --seq-lens to check other "
                               "shapes") from None


def _fwd_bwd(spec):
    """``spec`` with both passes, where its operator has a backward (the indexer has none)."""
    try:
        return spec.replace(pass_="fwd_bwd")
    except ValueError:
        return spec


def verify_plan(opts: dict) -> run_cmd.RunPlan:
    """``run``'s plan of merged options, with verify's defaults (``build_verify_plan``)."""
    plan = run_cmd.plan_from_options(opts, timed=False)
    cfg = plan.config
    specs = plan.specs
    if common.OPS[common.operator_choice(cfg)] != "attention":
        specs = operator_cases(specs, cfg, plan.options.device)
    elif not any(cfg.get(name) for name in SHAPE_OPTIONS):
        defaults = bug_prone_specs(plan.options.device, tuple(dict.fromkeys(s.dtype for s in specs)),
                                   tuple(dict.fromkeys(s.causal for s in specs)) if cfg.get("causal_mode") else (False, True))
        specs = with_variants(defaults, specs)
    if not cfg.get("pass_"):
        specs = list(dict.fromkeys(_fwd_bwd(s) for s in specs))
    timing = TimingConfig(warmup=cfg["warmup"] if cfg.get("warmup") is not None else 0,
                          repeat=cfg["repeat"] if cfg.get("repeat") is not None else 1).fixed()
    return dataclasses.replace(plan, specs=specs, options=dataclasses.replace(plan.options, timing=timing))


def execute_checks(plan: run_cmd.RunPlan) -> tuple[str, list[Record]]:
    """Run verify's plan into its store as a run of its own: (run id, records)."""
    from attnbench import interrupt
    interrupt.check()  # a stop signal swallowed during start-up: nothing starts after it
    env = envmod.collect(plan.options.device)
    env_id, run_id = envmod.env_id(env), new_run_id()
    status = "interrupted"
    with ResultStore(plan.db) as store:
        store.add_env(env_id, env)
        store.start_run(run_id, command=common.stored_command("verify"), config=plan.config,
                        env_id=env_id, version=__version__)
        try:
            records = run_checks(plan, run_id, env_id, store.write)
            status = "done"
        finally:
            store.finish_run(run_id, status)
    return run_id, records


def run_checks(plan: run_cmd.RunPlan, run_id: str, env_id: str, sink) -> list[Record]:
    """Every (case, backend) with the checker on; a backend without a backward for the case gets the fwd pass."""
    from attnbench.accuracy.check import AccuracyChecker  # these import torch
    from attnbench.runner import Runner

    runner = Runner(plan.options, run_id=run_id, env_id=env_id, sink=sink, checker=AccuracyChecker())
    records, seen = [], set()
    inputs, inputs_key = None, None
    for spec in plan.specs:
        for backend in runner.backends:
            case = forward_if_only(spec, backend, runner.device)
            if (case, backend.name) in seen:
                continue
            seen.add((case, backend.name))
            if case.shape_key() != inputs_key:
                inputs, inputs_key = None, case.shape_key()  # free the previous shape's tensors first
            if inputs is None and backend.supports(case, runner.device) is None:  # made once a backend takes it
                inputs = runner.make_inputs_guarded(case)  # run's memory guard first: nothing allocated past it
            if isinstance(inputs, tuple):  # the shape's inputs could not be made (too large): every backend says so
                status, reason = inputs
                record = runner.record_of(case, backend, status=status, reason=reason, info=backend.base_info())
            else:
                record = runner.run_case(case, backend, inputs, check=True)
            sink(record)
            records.append(record)
    return records


def forward_if_only(spec, backend, device):
    """The case a backend is checked on: ``spec``, or its fwd pass where the backend has no backward or refuses
    the backward of this case alone (FlexAttention's sparse MLA on a CPU)."""
    if spec.pass_ == "fwd":
        return spec
    fwd = spec.replace(pass_="fwd")
    if not backend.capabilities.backward:
        return fwd
    if backend.supports(spec, device) is not None and backend.supports(fwd, device) is None:
        return fwd
    return spec


def _g(value) -> str:
    return "-" if value is None else f"{value:.6g}"


def print_record(record: Record) -> None:
    """The FA2 accuracy write-up's block (max, then mean diffs), the other metrics and the verdict of one record."""
    out = common.console
    head = f"{record.backend} · {record.spec.label()} · {record.spec.pass_}"
    acc = record.accuracy
    if acc is None:
        style = "dim" if record.status in ("unsupported", "oom") else "red"
        out.print(f"[bold]{escape(head)}[/]: [{style}]{record.status}: {escape(record.reason or '')}[/]", soft_wrap=False)
        return
    verdict = acc["verdict"]
    kind = "" if acc.get("exact", True) else \
        " (fp8 inputs, judged approximately)" if record.spec.quantized else " (approximate backend)"
    out.print(f"[bold]{escape(head)}[/]: [{VERDICT_STYLE.get(verdict, 'white')}]{verdict.upper()}[/]{kind}")
    tensors = acc.get("tensors", {})
    # The FA2 write-up's order: Output max, Output mean, dQ/dK/dV max, dQ/dK/dV mean (then LSE).
    order = [("out", "max_abs"), ("out", "mean_abs"), *((n, "max_abs") for n in ("dq", "dk", "dv")),
             *((n, "mean_abs") for n in ("dq", "dk", "dv")), ("lse", "max_abs"), ("lse", "mean_abs")]
    for name, stat in order:
        if stat in tensors.get(name, {}):
            word = "max" if stat == "max_abs" else "mean"
            out.print(f"{LABELS[name]} {word} diff: {_g(tensors[name][stat])}", markup=False, highlight=False)
    for table in _metrics_tables(acc, out.width):
        out.print(table)
    if "unquantized" in acc:
        m = acc["unquantized"]["tensors"].get("out", {})
        if "cosine" in m:
            out.print(f"Against the bf16 inputs before quantization: out cosine {m['cosine']:.6f}, "
                      f"rel L1 {_g(m.get('rel_l1'))}, max abs {_g(m.get('max_abs'))}", markup=False, highlight=False)
    repeat = acc.get("repeat")
    if repeat:
        same = ("bit-identical" if repeat["deterministic"] else
                f"differ (largest difference {repeat['max_diff']:.3g} in {', '.join(repeat.get('differs', []))})")
        after = f"; a call after the timed calls: {repeat['after_timing']}" if "after_timing" in repeat else ""
        out.print(f"Repeated calls: {same}{after}", markup=False, highlight=False)
    if acc.get("reason") or record.status != "ok":
        out.print(f"[red]{escape(record.status)}: {escape(acc.get('reason') or record.reason or '')}[/]")


MEASURES = (("max abs", lambda m, base, limit, worst: _g(m.get("max_abs"))),
            ("mean abs", lambda m, base, limit, worst: _g(m.get("mean_abs"))),
            ("rel L2", lambda m, base, limit, worst: _g(m.get("rel_l2"))),
            ("cosine", lambda m, base, limit, worst: f"{m['cosine']:.6f}" if "cosine" in m else "-"),
            ("rel L1", lambda m, base, limit, worst: _g(m.get("rel_l1"))),
            ("RMSE", lambda m, base, limit, worst: _g(m.get("rmse"))),
            ("scale", lambda m, base, limit, worst: _sci(m.get("scale"))),
            ("block scale", lambda m, base, limit, worst: _sci(m.get("block_scale"))),
            ("math max abs", lambda m, base, limit, worst: _g(base.get("max_abs"))),
            ("limit max abs", lambda m, base, limit, worst: _g(limit.get("max_abs"))),
            ("worst / limit", lambda m, base, limit, worst: f"{worst['ratio']:.2f} ({worst['metric']})" if worst else "-"))
"""The rows of a record's error table: one measure each, a column per tensor (fits 100 columns)."""


COLUMN_WIDTH = 16
"""Characters a tensor's column of the error table takes (``0.39 (mean_abs)`` and its padding)."""


def _metrics_tables(acc: dict, width: int) -> list[Table]:
    """The error table, split into tables of as many tensors as fit ``width`` across (a recurrence's gradients
    are eight: at 100 columns, two tables of four whole numbers rather than one of folded ones)."""
    names = list(acc.get("tensors", {}))
    per = max(1, (width - COLUMN_WIDTH) // COLUMN_WIDTH)
    parts = -(-len(names) // per) or 1
    size = -(-len(names) // parts) if names else 0
    return [_metrics_table(acc, names[i:i + size]) for i in range(0, len(names), size)] if names else \
        [_metrics_table(acc, [])]


def _metrics_table(acc: dict, names: list[str]) -> Table:
    from attnbench.accuracy.tolerance import worst_ratio

    tensors = {name: acc["tensors"][name] for name in names}
    table = Table(header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("")
    for name in tensors:
        table.add_column(LABELS.get(name, name), justify="right", overflow="fold")
    columns = []
    for name, m in tensors.items():
        limit = acc.get("limits", {}).get(name, {})
        columns.append((m, acc.get("baseline", {}).get(name, {}), limit, worst_ratio({name: m}, {name: limit})))
    for label, cell in MEASURES:
        table.add_row(label, *(escape(m["error"]) if "error" in m and label == "max abs" else "" if "error" in m
                               else cell(m, base, limit, worst) for m, base, limit, worst in columns))
    return table


def _sci(value) -> str:
    return "-" if value is None else f"{value:+.1e}"


def exact_failures(records: list[Record]) -> list[Record]:
    """Records of exact backends whose accuracy failed, produced NaN/Inf, or crashed."""
    return [r for r in records if r.info.get("exact", True) and r.status in FAILED_STATUSES]


@common.feature_options
def verify(
    ctx: typer.Context,
    device: common.Device = None,
    backends: common.Backends = None,
    skip_missing: common.SkipMissing = False,
    batch_size: common.BatchSize = None,
    q_heads: common.QHeads = None,
    kv_heads: common.KvHeads = None,
    head_size: common.HeadSize = None,
    head_size_v: common.HeadSizeV = None,
    emb_dim: common.EmbDim = None,
    dtype: common.Dtype = None,
    causal_mode: common.CausalMode = None,
    window: common.Window = None,
    softmax_scale: common.SoftmaxScale = None,
    preset: common.Preset = None,
    op: common.Op = None,
    v_heads: common.VHeads = None,
    decode: common.Decode = None,
    chunk: common.Chunk = None,
    qk_prenormed: common.QkPrenormed = None,
    decay_bound: common.DecayBound = None,
    topk: common.TopK = None,
    indices: common.Indices = None,
    sink: common.Sink = None,
    topk_lengths: common.TopkLengths = None,
    extra_cache: common.ExtraCache = None,
    empty_slots: common.EmptySlots = None,
    repeated_slots: common.RepeatedSlots = None,
    initial_state: common.InitialState = None,
    pass_: common.Passes = None,
    seq_lens: common.SeqLens = None,
    kv_seq_lens: common.KvSeqLens = None,
    warmup: common.Warmup = None,
    repeat: common.Repeat = None,
    db: common.Db = None,
    config: common.Config = None,
    seed: common.Seed = 0,
    input_scale: common.InputScale = None,
    outliers: common.Outliers = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the records' accuracy as JSON.")] = False,
    details: Annotated[bool, typer.Option("--details", help="Every case's errors in full (default: failures only).")] = False,
) -> None:
    """Check every backend's output and gradients against the exact reference (exit 1 on a failure)."""
    plan = build_verify_plan(ctx)
    run_id, records = execute_checks(plan)
    failed = exact_failures(records)
    checked = sum(r.accuracy is not None for r in records)
    if as_json:
        rows = [{"backend": r.backend, "case": r.spec.label(), "pass": r.spec.pass_, "status": r.status,
                 "reason": r.reason, "accuracy": r.accuracy} for r in records]
        common.console.print_json(json.dumps(rows))
    else:
        from attnbench.report import grid
        # what did not run is counted under the grid, not given a block each
        shown = [r for r in records if _failed(r) or (details and r.status not in ("unsupported", "oom"))]
        for record in shown:
            print_record(record)
            common.console.print()
        grid.render(records, common.view_console())
        common.console.print(f"{checked} checked, {len(failed)} exact failure(s), {len(records) - checked} not "
                             f"checked{'' if details else ' (every error in full: --details)'}\nrecords: run {run_id} "
                             f"in {plan.db}", highlight=False, markup=False)
    if failed:
        raise typer.Exit(1)
    if not checked:
        common.err_console.print("attnbench: nothing was checked (every case was unsupported or did not run); "
                                 "exit status 1", highlight=False, markup=False, soft_wrap=True)
        raise typer.Exit(1)


def _failed(record: Record) -> bool:
    """A record whose details the default output shows: a failed check or a case that broke."""
    from attnbench.results.record import verdict_of
    return record.status in FAILED_STATUSES or verdict_of(record.status, record.accuracy) in ("fail", "approx-fail")
