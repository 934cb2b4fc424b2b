"""`attnbench run`: the kernel benchmark sweep."""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from attnbench import features, interrupt, metrics, plausibility, presets
from attnbench.backends import registry
from attnbench.cli import common, control, outcome, sharding, timing_opts
from attnbench.cli.common import UserError
from attnbench.cli.inflight import InFlight, describe, heartbeat, record_abandoned, stop_at_once, watchable
from attnbench.report.table import records_table
from attnbench.results import env as envmod
from attnbench.results import export
from attnbench.results.store import DEFAULT_DB, ResultStore, RunFinished, StoreFull, check_run_id, new_run_id
from attnbench.spec import AttnSpec
from attnbench.timing.peaks import measured_peaks
from attnbench.version import __version__

if TYPE_CHECKING:
    from attnbench.runner import RunOptions

# The --impl names of naive PyTorch against flash-attn 2 (its "Pytorch" and "Flash2").
IMPL_ALIASES = {"pytorch": "naive", "flash2": "fa2"}


BOOL_OPTIONS = {"check": True, "quiet": False, "table": False, "isolate": False, "skip_missing": False,
                "fail_on_approx": False, "precise": False, "fresh_inputs": False, "allow_long": False}


@dataclass(frozen=True, kw_only=True)
class RunPlan:
    """A validated run: what to run and how. Built before anything is written."""

    specs: list[AttnSpec]
    options: RunOptions
    db: Path
    output: Path | None
    config: dict
    profiler: str = "none"
    """The --profiler asked for: none, torch, or the external one each case re-runs under (ncu, nsys, rocprof)."""
    isolate: bool = False
    """Run each case in a worker subprocess (implied by case_timeout)."""
    case_timeout: float | None = None
    """Seconds after which an isolated case is killed and recorded as an error."""
    resume: str | None = None
    """Id of the run being resumed (its recorded cases are skipped)."""


def check_summary_options(opts: dict, backends: tuple[str, ...]) -> None:
    from attnbench.report.summary import METRICS
    metric = common.option_text(opts, "metric")
    if metric is not None and metric.lower() not in METRICS:
        raise UserError(f"bad --metric {metric!r}; allowed: {', '.join(METRICS)}")
    baseline = common.option_text(opts, "baseline")
    if baseline is not None and baseline not in backends:
        raise UserError(f"--baseline {baseline} is not among the backends of this run ({', '.join(backends)})")
    if baseline is not None and metric is not None and metric.lower() != "speedup":
        raise UserError(f"--baseline {baseline} gives speedups, which --metric {metric} would not show: drop one "
                        "(--baseline alone means --metric speedup)")


def show_summary(records: list, config: dict, device_name: str = "", planned: int | None = None) -> None:
    """The summary pivot of ``records`` (--metric / --baseline from ``config``), laid out for the terminal;
    ``planned``: the cases the run set out to run (``summary.build``)."""
    from attnbench.report import summary
    metric, baseline = config.get("metric"), config.get("baseline")
    metric = str(metric or ("speedup" if baseline else "tflops")).lower()
    if not records:
        common.console.print("no cases ran", highlight=False)
        return
    built = summary.build(records, metric=metric, baseline=baseline, width=common.summary_width(),
                          device=device_name, planned=planned)
    summary.render(built, common.view_console())


def resolve_backends(names: list[str] | None, impl: str | None, device: str, skip_missing: bool = False,
                     options: dict | None = None, operator: str = "attention") -> tuple[str, ...]:
    """--backends / --impl -> registry names (validated); default = every backend of ``operator``'s cases
    available here. A named
    backend that cannot run here is an error unless ``skip_missing`` (its cases are then recorded as
    unsupported, with the reason)."""
    if impl is not None:
        target = IMPL_ALIASES.get(impl.lower())
        if target is None:
            raise UserError(f"bad --impl {impl!r}; allowed: Pytorch, Flash2")
        if target not in registry.available(device):
            alternatives = ", ".join(registry.available(device))
            raise UserError(f"--impl {impl} needs flash-attn (pip install flash-attn), which is not installed here; "
                            f"use --backends with one of: {alternatives}")
        names = [*(names or []), target]
    if not names:
        return tuple(registry.available(device, default_only=True, options=options, operator=operator))
    out = []
    known = registry.names()
    for item in names:
        for name in str(item).split(","):
            name = name.strip()
            if not name:  # as --seq-lens 64,,64 is refused
                raise UserError(f"bad --backends {common.shown(','.join(map(str, names)))}: an empty name; "
                                "give names separated by single commas")
            if name not in known:
                raise UserError(f"unknown backend {name!r}; known: {', '.join(known)}")
            out.append(name)
    if not out:
        raise UserError("--backends is empty; give at least one backend name")
    out = list(dict.fromkeys(out))
    for name in out:  # a named backend that cannot run would make a run that tests nothing look fine
        why = None if skip_missing else cannot_run(name, device, options)
        if why:
            raise UserError(why + " (--skip-missing records it as unsupported instead)")
    return tuple(out)


def check_variants(backends: tuple[str, ...], specs: list[AttnSpec], options: dict | None = None) -> None:
    """A backend named on the command line that cannot take a variant the sweep asks for is an error (its
    every such case would only be 'unsupported'), saying which backends can."""
    wanted = dict.fromkeys(v for spec in specs for v in spec.variants)
    for name in backends:
        caps = registry.get(name, (options or {}).get(name)).capabilities
        for variant in wanted:
            if not getattr(caps, variant):
                able = [n for n in registry.names() if _takes(n, variant)]
                raise UserError(f"backend {name} cannot run {features.BY_NAME[variant].title}; backends that can: "
                                f"{', '.join(able) or 'none'} (--skip-missing records its cases as unsupported)")


def check_named_backends(backends: tuple[str, ...], specs: list[AttnSpec], device: str,
                         every_sweep: bool = True, options: dict | None = None) -> None:
    """A backend named on the command line that takes none of the cases (a grouped batch, a page size it cannot
    take, a tree, an fp8 cache, a latent or rope size) is an error naming why, as for the variants: a run of its
    unsupported records would test nothing and look fine. ``every_sweep`` False (verify, which shows a named
    backend's refusals beside the others' checks): only in a sweep of serving or MLA cases."""
    if not every_sweep and not all(spec.serving_features or spec.mla for spec in specs):
        return
    for name in backends:
        backend = registry.get(name, (options or {}).get(name))
        reasons = collections.Counter()
        for spec in specs:
            why = backend.supports(spec, device)
            if why is None:
                break
            reasons[why] += 1
        else:
            if reasons:
                reason = reasons.most_common(1)[0][0]
                others = [n for n in registry.available(device, options=options) if n != name
                          and any(registry.get(n, (options or {}).get(n)).supports(spec, device) is None
                                  for spec in specs)]
                them = "them" if len(specs) > 1 else "it"
                hint = runnable_hint(specs, (name,), device, them, options) or (
                    f"backends that take {them} here: {', '.join(others)}" if others else None)
                what = f"takes none of the {len(specs)} cases" if len(specs) > 1 else "cannot run the case"
                raise UserError(f"backend {name} {what} here: {reason}" + (f"; {hint}" if hint else "")
                                + f" (--skip-missing records {them} as unsupported)")


RELAXATIONS = (("page_size", None, "--page-size none"), ("kv_dtype", None, "--kv-dtype same"),
               ("tree", None, "--tree none"), ("pass_", "fwd", "--pass fwd"), ("causal", False, "--no-causal"),
               ("window", None, "--window none"), ("dtype", "bf16", "--dtype bf16"), ("dtype", "fp16", "--dtype fp16"),
               ("dtype", "fp32", "--dtype fp32"))
"""(spec field, value, the option that asks for it): what a refusal of cases no backend takes suggests, the
change that lets the most of them run."""


def runnable_hint(specs: list[AttnSpec], backends: tuple[str, ...], device: str, them: str = "them",
                  options: dict | None = None) -> str | None:
    """'--page-size none runs them on naive, sdpa-math': the one option of ``RELAXATIONS`` under which the most
    of ``specs`` run on ``backends`` here, or None when none does."""
    best = None
    grouped = [s for s in specs if s.is_varlen and s.seqlens_k in (None, s.seqlens_q)]  # --seq-lens 64,96
    split = ("seqlens_q", None, "--seq-lens " + " ".join(map(str, dict.fromkeys(grouped[0].seqlens_q)))
             + " (one case per length)") if grouped else None
    for field, value, flag in (*RELAXATIONS, *([split] if split else [])):
        changed = []
        for spec in specs:
            if field == "seqlens_q":  # a grouped case, one sequence at a time
                changed += [spec.replace(seqlens_q=(n,), seqlens_k=None) for n in dict.fromkeys(spec.seqlens_q)
                            ] if spec in grouped else []
                continue
            if getattr(spec, field) == value:
                continue
            try:
                changed.append(spec.replace(**{field: value}))
            except ValueError:  # the change makes an invalid case (a tree without its mask's lengths)
                continue
        takers = [name for name in backends
                  if any(registry.get(name, (options or {}).get(name)).supports(spec, device) is None
                         for spec in changed)]
        if takers and (best is None or len(takers) > len(best[1])):
            best = (flag, takers)
    if best is None:
        return None
    return f"{best[0]} runs {them} on {', '.join(best[1])}"


def check_runnable(specs: list[AttnSpec], backends: tuple[str, ...], device: str, options: dict | None = None) -> None:
    """A sweep none of whose cases any backend takes here is an error (exit 2), before anything is built or
    stored: the reasons counted, and the option that would let them run."""
    reasons: collections.Counter = collections.Counter()
    takers: dict[str, list[str]] = {}
    for spec in specs:
        for name in backends:
            why = registry.get(name, (options or {}).get(name)).supports(spec, device)
            if why is None:
                return
            reasons[why] += 1
            takers.setdefault(why, []).append(name)
    if not reasons:
        return
    counted = "; ".join(f"{n} {why} ({', '.join(dict.fromkeys(takers[why]))})" for why, n in reasons.most_common())
    attention = all(getattr(s, "operator", "attention") == "attention" for s in specs)
    hint = (runnable_hint(specs, backends, device, options=options) if attention else None) or \
        "attnbench backends lists what each backend takes"
    raise UserError(f"nothing to run: no backend here takes any of the {_cases(len(specs) * len(backends))}: "
                    f"{counted}; {hint}")


def _cases(n: int) -> str:
    return f"{n} case{'s' * (n != 1)}"


def _takes(name: str, variant: str) -> bool:
    try:
        return bool(getattr(registry.get(name).capabilities, variant))
    except Exception:  # a broken plug-in takes nothing
        return False


def cannot_run(name: str, device: str, options: dict | None = None) -> str | None:
    """Why backend ``name`` (built with its ``options``) cannot run at all on ``device`` here, with how to fix it;
    None if it can."""
    from attnbench.backends.base import device_type
    backend = registry.get(name, (options or {}).get(name))
    reason = backend.unavailable_reason()
    if backend.needs_absent_gpu() and not backend.device_hint(device):  # first: no install can help here
        return (f"backend {name} runs on {'/'.join(backend.capabilities.devices)}: no GPU here"
                + (f" (on a GPU machine it also needs: {backend.install_hint()})" if reason else ""))
    if reason:
        return f"backend {name} cannot run here: {reason}; install: {backend.install_hint()}"
    if device_type(device) not in backend.capabilities.devices:
        hint = backend.device_hint(device)
        return (f"backend {name} runs on {'/'.join(backend.capabilities.devices)}, not on {device_type(device)} "
                f"(--device){'; ' + hint if hint else ''}")
    return None


def build_plan(ctx: typer.Context) -> RunPlan:
    """Validate every option (config file merged, or a resumed run's stored options) into a RunPlan."""
    return plan_from_options(options_of(ctx))


DIGESTS = "input_digests"
"""The stored option holding a digest of each input file a run's cases come from (``input_digests``)."""


def input_digests(opts: dict) -> dict[str, str]:
    """SHA-256 of each file whose contents define cases (a serving trace, a feature's file such as ALiBi slopes),
    by option name. For a resumed run (``opts`` read from its store) every digest must match the one stored: a
    file edited in between would make the resumed cases another sweep's, so it is refused."""
    import hashlib

    from attnbench import features as feature_decls
    names = ["batch_trace", *(o.param for o in feature_decls.options() if o.path)]
    out = {}
    for name in names:
        value = opts.get(name)
        if value is None or isinstance(value, (list, tuple)) or not Path(str(value)).is_file():
            continue  # unset, given inline (YAML), or missing: parsing says what is wrong with it
        digest = hashlib.sha256()
        with open(str(value), "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
        out[name] = digest.hexdigest()
    stored = opts.get(DIGESTS) if opts.get("resume") is not None else None
    if isinstance(stored, dict):
        gone = [common.flag_name(n) + " " + str(opts.get(n)) for n in sorted(stored) if n not in out]
        if gone:  # not there, which is not the same as changed
            raise UserError(f"--resume {opts['resume']}: {', '.join(gone)}: no such file (a relative path is read "
                            f"from the folder the command runs in, {shown_cwd()}); run it from the folder the run "
                            "started in, or restore the file")
        changed = [common.flag_name(n) + " " + str(opts.get(n)) for n in sorted(set(stored) | set(out))
                   if stored.get(n) != out.get(n)]
        if changed:
            raise UserError(f"--resume {opts['resume']}: {', '.join(changed)} changed since the run started, so its "
                            "cases would be another sweep's; restore the file or start a new run")
    return out


def shown_cwd() -> str:
    try:
        return str(Path.cwd())
    except OSError:  # the folder was removed under the process
        return "a folder that is gone"


def options_of(ctx: typer.Context) -> dict:
    """The command's option values: a resumed run's stored ones, or the config file's overridden by the flags."""
    if ctx.params.get("resume") is not None:
        return control.resumed_options(ctx)
    config = common.load_config(ctx.params.get("config"))
    return common.merge_options(ctx, config, allowed=set(ctx.params) - {"config", "resume"})


def plan_from_options(opts: dict, *, timed: bool = True) -> RunPlan:
    """Merged option values -> RunPlan; raises UserError naming the bad value. ``timed`` (``run``, not
    ``verify``): a sweep that nothing here can run, or a named backend that takes none of its cases, is refused
    too (``check_runnable``, ``check_named_backends``)."""
    from attnbench.runner import RunOptions  # imports torch and the measuring code

    if opts.get("run_id") is not None:  # a YAML key or the API's option: checked as --run-id is, before anything
        try:
            check_run_id(common.option_text(opts, "run_id"))
        except ValueError as exc:
            raise UserError(str(exc)) from None
    device = common.resolve_device(common.option_text(opts, "device"))
    opts["device"] = device  # stored resolved, so --resume runs on the same device
    opts[DIGESTS] = input_digests(opts)  # stored too: a resumed run reads the very files it started with
    try:
        opts.update(presets.apply(opts, common.option_text(opts, "preset")))
    except ValueError as exc:
        raise UserError(str(exc)) from None
    op = common.operator_choice(opts)
    operator = common.OPS[op]
    sweep = common.build_sweep(opts, device) if operator == "attention" else None
    text = common.option_text
    # Given values are bounded here (huge ones must fail before anything runs); absent ones stay
    # absent, so the stored options (and `verify`) can tell given from default.
    for name, lo in (("warmup", 0), ("repeat", 1)):
        if opts.get(name) is not None:
            opts[name] = common.option_int(opts, name, lo, common.MAX_REPEAT, default=0)
    opts["warm_l2"] = common.option_bool(opts, "warm_l2")
    for name, default in BOOL_OPTIONS.items():  # a YAML `check: "no"` is refused, not read as true
        common.option_bool(opts, name, default)
    timing, profiler = timing_opts.resolve(opts, device)
    extra = timing_opts.run_options(opts)
    try:
        convention = text(opts, "flops_convention") or "exact"
        if convention not in metrics.CONVENTIONS:
            raise ValueError(f"bad --flops-convention {convention!r}; allowed: {', '.join(metrics.CONVENTIONS)}")
        specs = sweep.specs() if sweep is not None else common.operator_specs(opts, op, device)
        from attnbench.backends import options as backend_options
        configured = backend_options.resolve(common._as_list(opts.get("backend_opt")))
    except ValueError as exc:
        raise UserError(str(exc)) from None
    backends = resolve_backends(common.axis_values(opts, "backends"), text(opts, "impl"), device,
                                common.option_bool(opts, "skip_missing"), configured, operator)
    if common.axis_values(opts, "backends") and not common.option_bool(opts, "skip_missing") and sweep is not None:
        check_variants(backends, specs, configured)
        check_named_backends(backends, specs, device, every_sweep=timed, options=configured)
    if timed and not common.option_bool(opts, "skip_missing") and opts.get("resume") is None:
        check_runnable(specs, backends, device, configured)
    check_summary_options(opts, backends)
    from attnbench import (
        operators,  # the guards import torch: not at the CLI's start (the views run without it)
    )
    if (too_big := operators.inputs_refusal(specs, device)) is not None:  # before anything is allocated or stored
        raise UserError(f"too large for {device}: {too_big}; give smaller sizes "
                        "(--seq-lens, --batch-size, --q-heads)")
    output = text(opts, "output")
    db = common.check_db_path(Path(text(opts, "db") or DEFAULT_DB))
    if output is not None:
        try:
            export.format_for(Path(output))
        except ValueError as exc:
            raise UserError(str(exc)) from None
        common.check_output_path(Path(output), stores=(db,))
    ceilings = plausibility.ceilings(device, measured_peaks(db, device, copy=True))
    options = RunOptions(device=device, backends=backends, timing=timing, flops_convention=convention,
                         seed=common.option_int(opts, "seed", 0, common.MAX_SEED, default=0), ceilings=ceilings,
                         inputs=common.input_dist(opts), cpu=timing_opts.cpu_plan(opts, device),
                         batch_names={(b.seqlens_q, b.seqlens_k): b.name for b in
                                      (sweep.batches if sweep is not None else None) or () if b.traced} or None,
                         backend_options=configured, **extra)
    timeout = control.case_timeout(opts.get("case_timeout"))
    return RunPlan(specs=specs, options=options, db=db, output=Path(output) if output else None, profiler=profiler,
                   config={k: (str(v) if isinstance(v, Path) else v) for k, v in opts.items()},
                   isolate=common.option_bool(opts, "isolate") or timeout is not None, case_timeout=timeout,
                   resume=opts.get("resume"))


def execute(plan: RunPlan, *, run_id: str | None = None, quiet: bool = False, checker=None) -> tuple[str, list]:
    """Run the plan, writing each record to the store as it is measured (checked by ``checker`` if given)."""
    interrupt.check()  # a Ctrl-C during start-up (torch's import can swallow it) stops the run before it starts
    env = envmod.collect(plan.options.device)
    env_id = envmod.env_id(env)
    run_id = plan.resume or run_id or new_run_id()
    records = []
    progress = _progress(quiet)
    inflight = InFlight()

    def sink(record):
        with inflight.lock:  # a stop watcher records the case in flight under it: stored once, one way or the other
            store.write(record)
            inflight.stored(record)
        records.append(record)
        progress.advance(task)

    def on_case(spec, name):
        inflight.start(spec, name)
        progress.update(task, description=describe(spec, name))

    runner = control.make_runner(plan, run_id=run_id, env_id=env_id, sink=sink, checker=checker)
    runner.on_case = on_case
    if runner.device.type == "cpu":  # before the store is touched: a sweep refused here leaves nothing behind
        runner.skip = _recorded(plan.db, run_id) if plan.resume else set()
        inflight.expected_s = announce(runner.cases(plan.specs), plan, runner.device, check=checker is not None,
                                       quiet=quiet)
    store = ResultStore(plan.db)
    try:
        store.add_env(env_id, env)
        store.start_run(run_id, command=common.stored_command("run"), config=plan.config,
                        env_id=env_id, version=__version__, resume=plan.resume is not None)
    except BaseException:
        store.close()
        raise
    before = runner.skip = store.case_ids(run_id)
    cases = runner.cases(plan.specs)
    try:  # the run's whole plan (a resumed run's earlier cases too): an interrupted run shows what it lacks
        store.plan_cases(run_id, len(before) + len(cases))
    except BaseException:
        store.close()
        raise
    task = progress.add_task("measuring", total=len(cases))
    hint = control.resume_hint(run_id, plan.db)
    # An isolated run waits for its worker in select(), which a signal interrupts: it stops the usual way, and
    # kills the worker on the way out.
    watched = watchable() and not plan.isolate
    status = "interrupted"
    started = time.perf_counter()
    full, failing = None, True
    try:
        with progress, control.stop_on_sigint(runner, announced=watched), \
                stop_at_once(inflight, runner, db=plan.db, run_id=run_id, hint=hint, enabled=watched,
                             before_exit=progress.stop), \
                heartbeat(inflight, _still_running(progress, task)):
            runner.run(plan.specs)
        status, failing = "done" if len(records) == len(cases) else "interrupted", False
    except KeyboardInterrupt:
        words = record_abandoned(inflight, runner, interrupt.first(), plan.db, run_id)
        common.err_console.print(f"attnbench: aborted{words}; {hint}", markup=False,
                                 soft_wrap=True)  # one line: the command in it stays whole
        raise
    except StoreFull as exc:  # the disk filled up: stop at once, the records before kept
        full, failing = exc, False
    finally:
        try:
            store.finish_run(run_id, "interrupted" if full else status)
        except StoreFull as exc:  # the run stays 'running', which reads 'interrupted' once this process is gone
            if not failing and full is None:
                full = exc
        finally:
            store.close()
    if full is not None:
        raise stopped_full(full, run_id, plan.db, len(before) + len(records), len(before) + len(cases))
    phases = wall_breakdown(runner.clock.seconds, time.perf_counter() - started)
    compiled = runner.precompiler.summary()
    if compiled and not quiet:
        common.err_console.print(compiled, markup=False, highlight=False, soft_wrap=True)  # one line in a log
    if status == "interrupted":  # first Ctrl-C: the case in flight finished and is stored
        common.err_console.print(f"attnbench: interrupted after {len(records)} of {len(cases)} cases "
                                 f"(wall time {format_breakdown(phases)}); {hint}",
                                 markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(130)
    return run_id, records, phases


def stopped_full(full: StoreFull, run_id: str, db: Path, written: int, total: int) -> StoreFull:
    """The one line for a run whose store's disk filled up: where, how far it got, how to go on."""
    stored = full.stored if full.stored is not None else written
    line = (f"the disk is full: {db} took {stored} of the {total} cases of run {run_id} ({full.detail}{full.free}); "
            f"they stay readable; once there is space, {control.resume_hint(run_id, db)}")
    out = StoreFull(full.path, full.detail, run_id, stored)
    out.args = (line,)
    return out


class _LogLines:
    """Progress for a pipe or a file: a short line on stderr every few seconds, so a log shows where a long
    run is (a live bar would print nothing there). The lines space out as the run goes on (``every_s``): a
    run of hours logs a few hundred lines, not thousands."""

    EVERY_S = 5.0
    """Seconds between the first lines."""
    MAX_EVERY_S = 60.0
    """The longest wait between two lines."""
    LINES_PER_STEP = 10
    """Lines after which the wait doubles."""

    def __init__(self, quiet: bool):
        self.quiet, self.total, self.done, self.what = quiet, 0, 0, ""
        self.start = self.last = time.perf_counter()
        self.lines = 0

    @property
    def every_s(self) -> float:
        """The wait before the next line: EVERY_S for the first LINES_PER_STEP lines, then twice as long after
        each LINES_PER_STEP more, up to MAX_EVERY_S (5 s for the first 50 s of a run, 60 s from its 13th minute)."""
        return min(self.MAX_EVERY_S, self.EVERY_S * 2 ** (self.lines // self.LINES_PER_STEP))

    def _say(self, now: float, what: str, tail: str = "") -> None:
        """One log line: the count, the time, ``what`` (cut to the log's width, ``_fit``) and ``tail``."""
        self.last = now
        self.lines += 1
        common.err_console.print(_fit(f"attnbench: [{self.done}/{self.total}] {now - self.start:.0f}s ", what, tail),
                                 markup=False, highlight=False, soft_wrap=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def add_task(self, description: str, total: int):
        self.total = total
        return 0

    def update(self, task, description: str) -> None:
        self.what = description
        now = time.perf_counter()
        if not self.quiet and (self.done == 0 or now - self.last >= self.every_s):
            self._say(now, self.what)

    def advance(self, task) -> None:
        self.done += 1

    def still_running(self, what: str, elapsed_s: float, expected: str | None) -> None:
        """The heartbeat of a long case: a line when none was printed for ``every_s``."""
        now = time.perf_counter()
        if not self.quiet and now - self.last >= self.every_s:
            self._say(now, f"still running {what}", " " + _so_far(elapsed_s, expected))

    def stop(self) -> None:
        """Nothing to take down (a live bar's ``stop`` clears it)."""


def _fit(head: str, what: str, tail: str = "") -> str:
    """``head + what + tail`` in one line of the log's width: the case's name (``what``) cut short with '…' where
    the whole would be wider (a log line is never wrapped, and a wider one breaks in a 100-column log)."""
    room = common.err_console.width - len(head) - len(tail)
    if len(what) > room:
        what = what[:max(room - 1, 10)].rstrip() + "…"
    return head + what + tail


def _so_far(elapsed_s: float, expected: str | None) -> str:
    """'(35 s, est. 10–40 s)': how long a case has run, and should."""
    return f"({elapsed_s:.0f} s" + (f", est. {expected})" if expected else ")")


def _still_running(progress, task):
    """What the heartbeat calls: a log line, or the live bar's description with the case's time so far."""
    if isinstance(progress, _LogLines):
        return progress.still_running
    return lambda what, elapsed_s, expected: progress.update(task, description=f"{what} {_so_far(elapsed_s, expected)}")


def _recorded(db: Path, run_id: str) -> set[str]:
    """The case ids ``run_id`` has records of in ``db`` (none where the store cannot be read yet)."""
    try:
        with ResultStore(db, readonly=True) as store:
            return store.case_ids(run_id)
    except Exception:  # the claim that follows says what is wrong with the store
        return set()


def announce(cases: list, plan: RunPlan, device, check: bool, quiet: bool = False):
    """A CPU run: refuse a sweep of a GPU's size unless ``--allow-long`` was given (UserError), warn of one that
    may take minutes (``timing.estimate``, from a probe of this CPU's rates), and return the estimate of a case's
    seconds for the progress. The cases estimated are those that will run: a backend takes them and their
    operator's memory guard lets them start (a case refused as too large costs nothing)."""
    from attnbench import operators
    from attnbench.timing import estimate
    specs, too_big = [], []
    for spec, backend in cases:
        if backend.supports(spec, device) is None:
            op = operators.of(spec)
            reason = op.memory_guard(spec, backend, device, inputs_allocated=False)
            specs += [spec] if reason is None else []
            too_big += [(op.bytes_moved(spec), reason)] if reason else []
    if not specs:
        if too_big and not common.option_bool(plan.config, "allow_long"):  # every case would be an "oom" record
            smallest = min(too_big, key=lambda size_reason: size_reason[0])[1].replace(" (estimated; not run)", "")
            raise UserError(f"a GPU-sized command: the smallest of its {_cases(len(cases))} {smallest}")
        return lambda spec: None
    rates = estimate.probe(estimate.probe_dtypes(specs))
    sweep = estimate.sweep(specs, rates, plan.options.timing, check, total=len(cases))
    refusal = estimate.refusal(sweep)
    if refusal and not common.option_bool(plan.config, "allow_long"):
        raise UserError(refusal)
    line = estimate.warning(sweep)
    if line and not quiet:
        common.err_console.print(line, markup=False, highlight=False)
    return lambda spec: estimate.case_seconds(spec, rates, plan.options.timing, check)


def _progress(quiet: bool):
    """A live bar on a terminal, log lines otherwise."""
    if not common.err_console.is_terminal:
        return _LogLines(quiet)
    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=common.err_console, disable=quiet, transient=True)


def wall_breakdown(phases: dict[str, float], total_s: float) -> dict[str, float]:
    """The runner's per-phase seconds plus ``other`` (statistics, progress, records) and ``total``."""
    out = {k: v for k, v in sorted(phases.items(), key=lambda kv: -kv[1]) if v > 0}
    out["other"] = max(0.0, total_s - sum(out.values()))
    out["total"] = total_s
    return out


def format_breakdown(phases: dict[str, float]) -> str:
    """'12.3s: timing 8.0s, check 2.1s, ...' (whole seconds from 10 s on; phases under 0.5 s left out)."""
    def sec(v: float) -> str:
        return f"{v:.0f}s" if v >= 10 else f"{v:.1f}s"
    parts = ", ".join(f"{k} {sec(v)}" for k, v in phases.items() if k != "total" and v >= 0.5)
    return f"{sec(phases.get('total', 0.0))}" + (f": {parts}" if parts else "")


@common.feature_options
def run(
    ctx: typer.Context,
    device: common.Device = None,
    backends: common.Backends = None,
    skip_missing: common.SkipMissing = False,
    batch_size: common.BatchSize = None,
    q_heads: common.QHeads = None,
    kv_heads: common.KvHeads = None,
    head_size: common.HeadSize = None,
    head_size_v: common.HeadSizeV = None,
    mla: common.Mla = None,
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
    layout: Annotated[str | None, typer.Option(
        "--layout", rich_help_panel="Shape", help="Input memory layout: bshd (flash-attn) or bhsd (SDPA); kernels see the same values.")] = None,
    pass_: common.Passes = None,
    seq_lens: common.SeqLens = None,
    kv_seq_lens: common.KvSeqLens = None,
    batch: common.BatchSpec = None,
    batch_trace: common.BatchTrace = None,
    page_size: common.PageSize = None,
    shared_prefix: common.SharedPrefix = None,
    tree: common.Tree = None,
    kv_dtype: common.KvDtype = None,
    warmup: common.Warmup = None,
    repeat: common.Repeat = None,
    warm_l2: Annotated[bool, typer.Option("--warm-l2", rich_help_panel="Timing", help="Do not flush the L2 cache between calls.")] = False,
    flops_convention: Annotated[str | None, typer.Option(
        "--flops-convention", rich_help_panel="Output", help="exact (attended pairs) or dense (no causal discount).")] = None,
    timing: Annotated[str | None, typer.Option(
        "--timing", rich_help_panel="Timing", help="events (per call, cold L2), graph (CUDA graph, rotating inputs), profiler (kernel time).")] = None,
    profiler: Annotated[str | None, typer.Option(
        "--profiler", rich_help_panel="Timing", help="none, torch (= --timing profiler), or kernel times from a re-run of "
        "the cases under ncu, nsys or rocprof (one process for up to --profiler-batch cases).")] = None,
    profiler_batch: Annotated[int | None, typer.Option(
        "--profiler-batch", rich_help_panel="Timing", help="ncu / nsys / rocprof: most cases profiled in one process, "
        "of any backend under nsys, of one under ncu and rocprof (default: 32; 1 = a process per case).")] = None,
    min_time_ms: Annotated[float | None, typer.Option(
        "--min-time-ms", rich_help_panel="Timing", help="Sample until this much time is measured per case (default: 100).")] = None,
    max_time_ms: Annotated[float | None, typer.Option(
        "--max-time-ms", rich_help_panel="Timing", help="Stop sampling a case once this much time is measured or spent, even before "
        "--repeat samples (at least 10) (default: 150 on GPU, 1000 on CPU).")] = None,
    ci_target: Annotated[float | None, typer.Option(
        "--ci-target", rich_help_panel="Timing", help="Stop sampling a case once the 95% CI of its median is within +- this % of it, "
        "after --repeat samples (default: 0.3; 0 = always sample --min-time-ms).")] = None,
    precise: Annotated[bool, typer.Option(
        "--precise", rich_help_panel="Timing", help="The tight setting: --ci-target 0.1 --max-time-ms 350 (about 2x the "
        "timing). The default's within-run CI is already tighter than the run-to-run spread.")] = False,
    idle_ratio: Annotated[float | None, typer.Option(
        "--idle-ratio", rich_help_panel="Timing", help="Leave the GPU idle this many times a call's time before each timed call: the "
        "clocks of isolated calls, as ncu sees them (default: 0, sustained load).")] = None,
    fresh_inputs: Annotated[bool, typer.Option(
        "--fresh-inputs", rich_help_panel="Timing", help="Hand each timed call inputs of values of its own (a few sets "
        "drawn with other seeds, in turn) and check the last call's outputs and a call on new values at a seen "
        "address: catches kernels that cache their output by input address (so not with --no-check).")] = False,
    trace: Annotated[Path | None, typer.Option("--trace", rich_help_panel="Timing", help="Write a Chrome/Perfetto trace per case to DIR.")] = None,
    cooldown: Annotated[float | None, typer.Option("--cooldown", rich_help_panel="Timing", help="Seconds to pause between cases.")] = None,
    threads: Annotated[int | None, typer.Option(
        "--threads", rich_help_panel="Timing", metavar="N", help="CPU runs: torch threads (default: one per core that "
        "other processes leave free).")] = None,
    impl: Annotated[str | None, typer.Option("--impl", rich_help_panel="Backends", help="benchmark_attn.py's --impl: Pytorch (naive) or Flash2 (fa2).")] = None,
    db: common.Db = None,
    output: Annotated[Path | None, typer.Option("--output", rich_help_panel="Output", help="Also write the records to FILE.json or FILE.csv.")] = None,
    backend_opt: Annotated[list[str] | None, typer.Option(
        "--backend-opt", rich_help_panel="Backends", metavar="NAME.KEY=VALUE", help="Backend option NAME.KEY=VALUE, e.g. flex-sparse.sparsity=0.5 (repeatable).")] = None,
    config: common.Config = None,
    seed: common.Seed = 0,
    input_scale: common.InputScale = None,
    outliers: common.Outliers = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", rich_help_panel="Output", help="No progress and no summary.")] = False,
    table: Annotated[bool, typer.Option("--table", rich_help_panel="Output", help="Also print every record (one row per case).")] = False,
    metric: Annotated[str | None, typer.Option(
        "--metric", rich_help_panel="Output", help="In the summary's cells: tflops, ms, gbps or speedup (default: tflops; speedup with "
        "--baseline).")] = None,
    baseline: Annotated[str | None, typer.Option(
        "--baseline", rich_help_panel="Output", metavar="NAME", help="Backend the summary's speedups are against.")] = None,
    check: Annotated[bool, typer.Option(
        "--check/--no-check", rich_help_panel="Inputs and accuracy", help="Compare each case's first call with the exact reference (status mismatch on "
        "failure).")] = True,
    shard: sharding.ShardOpt = None,
    run_id: sharding.RunIdOpt = None,
    resume: Annotated[str | None, typer.Option(
        "--resume", rich_help_panel="Run control", metavar="RUN_ID", help="Run only the cases of run RUN_ID that have no record yet.")] = None,
    isolate: Annotated[bool, typer.Option(
        "--isolate", rich_help_panel="Run control", help="Run each case in a worker process: a crashing kernel costs only its case.")] = False,
    case_timeout: Annotated[float | None, typer.Option(
        "--case-timeout", rich_help_panel="Run control", metavar="SECONDS", help="End a case running longer than this (implies --isolate).")] = None,
    allow_long: Annotated[bool, typer.Option(
        "--allow-long", rich_help_panel="Run control", help="On a CPU, start a sweep estimated to take 10 minutes or "
        "more (a GPU's work: refused otherwise, with its estimate).")] = False,
    fail_on_approx: Annotated[bool, typer.Option(
        "--fail-on-approx", rich_help_panel="Inputs and accuracy", help="Exit 1 also when an approximate backend (quantized, sparse) fails its looser "
        "check; mismatches and NaN always do.")] = False,
) -> None:
    """Benchmark attention backends over a sweep of shapes (default: a small sweep on this device).

    Exit status 1 when a case's numbers are wrong (an exact backend's mismatch, NaN/Inf output)."""
    plan = build_plan(ctx)
    if plan.resume:  # the stored sweep, narrowed to the stored shard, into the file given
        plan, run_id, hint = sharding.resumed(plan)
    else:  # from the flags or the config file
        plan, run_id, hint = sharding.apply(plan, common.option_text(plan.config, "shard"),
                                            common.option_text(plan.config, "run_id"))
    if plan.output is not None:  # a shard writes its own files: the output still may not be its store
        common.check_output_path(plan.output, stores=(plan.db,))
    quiet = common.option_bool(plan.config, "quiet") or sharding.rank() > 0  # one rank prints
    checker = None
    if common.option_bool(plan.config, "check", default=True):
        from attnbench.accuracy.check import AccuracyChecker
        checker = AccuracyChecker(grads_ahead=any(s.pass_ != "fwd" for s in plan.specs))
    try:
        run_id, records, phases = execute(plan, run_id=run_id, quiet=quiet, checker=checker)
    except RunFinished as exc:  # nothing to do, which is what was asked: the line, the export if asked, exit 0
        common.err_console.print(f"attnbench: {exc}", markup=False, highlight=False, soft_wrap=True)
        if plan.output is not None:
            with ResultStore(plan.db, readonly=True) as store:
                common.write_output(store.records(run_id), plan.output, plan.db, run_id)
        return
    if plan.resume:  # show and export the whole run, not only the cases run now
        with ResultStore(plan.db, readonly=True) as store:
            records = store.records(run_id)
    if plan.output is not None:
        common.write_output(records, plan.output, plan.db, run_id)
    if not quiet:
        if common.option_bool(plan.config, "table"):
            peaks = measured_peaks(plan.db, plan.options.device, copy=True)
            common.console.print(records_table(records, title=f"run {run_id} on {plan.options.device}", peaks=peaks,
                                               width=common.console.width))
        show_summary(records, plan.config, envmod.device_name(plan.options.device))
        ok = sum(r.status == "ok" for r in records)
        common.console.print(f"{ok}/{len(records)} cases ok in {format_breakdown(phases)}\nstored in {plan.db} as run "
                             f"{run_id}" + (f" (and in {plan.output})" if plan.output else "")
                             + "\nevery record: attnbench show --table; the HTML report: attnbench report",
                             highlight=False, markup=False)
        if hint:
            common.console.print(hint, highlight=False, markup=False, soft_wrap=True)
    outcome.report_wrong_cases(records, approx_too=common.option_bool(plan.config, "fail_on_approx"))
    outcome.report_nothing_ran(records)  # --skip-missing too: a run that ran nothing answered nothing
