"""`attnbench dist`: context-parallel attention over the ranks of one job, checked per rank and timed per device.

    attnbench dist --nproc 4 --method zigzag --kernel sdpa-flash --seq-lens 128k --causal
    torchrun --nproc_per_node 4 -m attnbench dist --method zigzag --kernel sdpa-flash --seq-lens 128k --causal

gloo on CPU, NCCL on GPUs (cuda:LOCAL_RANK). Rank 0 prints and writes the store; an error on any rank
ends that rank with one line naming it (the others are then stopped; a rank blocked in a collective gives
up after --timeout seconds). Bad options are one line from rank 0 (``--nproc`` checks them before any rank
starts); the other ranks say nothing.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from attnbench.cli import common, dist_launch
from attnbench.cli.common import UserError
from attnbench.distributed.names import KERNELS, canonical
from attnbench.results import env as envmod
from attnbench.results import export, files
from attnbench.results.record import Record, busy_of
from attnbench.results.store import DEFAULT_DB, ResultStore, new_run_id
from attnbench.timing import TimingConfig
from attnbench.version import __version__

if TYPE_CHECKING:  # the context-parallel code imports torch: the functions that run it import it
    from attnbench.distributed import bench

SEP = "#" * 30
MAX_TIMELINE_CALLS = 1000
"""Most calls ``--timeline`` records: each keeps every rank's phases per step in memory, and a median over
more calls says nothing new."""
TABLE_COLUMNS = ("batch", "seq_len", "heads", "head_size", "fwd_only", "iters/s", "ms/iter", "MB/device")
"""The columns of a method's table (the write-up's, named short enough for 100 columns), then the rate's."""
BUSY = "?"
BUSY_NOTE = f"{BUSY} other processes used the CPU while these were timed: not the speed of an idle machine"


def _names(values, allowed, what) -> list[str]:
    out = [n.strip() for v in values or [] for n in str(v).split(",") if n.strip()]
    bad = [n for n in out if n not in allowed]
    if bad or not out:
        raise UserError(f"bad {what} {', '.join(bad) or '(none)'}; allowed: {', '.join(allowed)}")
    return list(dict.fromkeys(out))


def validate(specs, methods, world: int, ulysses_degree: int | None, ulysses_chunks: int | str = "auto") -> None:
    """Reject what cannot run before any process group exists: the same answer on every rank."""
    for spec in specs:
        if spec.is_varlen:  # packed documents
            from attnbench.distributed.documents import MAX_DOCUMENTS as DOC_LIMIT
            from attnbench.distributed.documents import METHODS as DOC_METHODS
            other = [m for m in methods if m not in DOC_METHODS]
            if other:
                hint = ("; torch-cp's SDPA takes no document mask, torch-cp-flex is torch's context parallel with it"
                        if "torch-cp" in other else "")
                raise UserError(f"packed documents (a group of --seq-lens, or --documents) run on "
                                f"{', '.join(DOC_METHODS)}, not {', '.join(other)}{hint}")
            if spec.batch != 1 or spec.seqlens_q != spec.seqlens_k:
                raise UserError("packed documents are one sequence: give --batch-size 1 and no --kv-seq-lens")
            if len(spec.seqlens_q) > DOC_LIMIT:
                raise UserError(f"{len(spec.seqlens_q)} documents in {sum(spec.seqlens_q)} tokens: at most "
                                f"{DOC_LIMIT} (each is a kernel call per block); give longer documents")
        if spec.has_window:
            raise UserError("dist does not support sliding windows")
        if spec.pass_ == "bwd":
            raise UserError("dist times --pass fwd or fwd_bwd (the backward alone is not timed)")
        for method in methods:
            _validate_case(spec, method, world, ulysses_degree, ulysses_chunks)


def _validate_case(spec, method, world, ulysses_degree, ulysses_chunks="auto") -> None:
    from attnbench.distributed import bench
    from attnbench.distributed import layout as lay
    from attnbench.distributed.ulysses import check_heads, pipeline_chunks

    seq, causal = sum(spec.seqlens_q), spec.causal
    try:
        if method in ("ulysses", "ulysses-ce"):
            check_heads(spec.heads_q, spec.heads_kv, world)
            pipeline_chunks(spec.heads_q, spec.heads_kv, world, ulysses_chunks)
        if method in ("usp", "yunchang"):
            u = ulysses_degree or bench._default_ulysses(world, spec)
            if world % u:
                raise ValueError(f"--ulysses-degree {u} must divide the world size {world}")
            check_heads(spec.heads_q, spec.heads_kv, u)
            lay.check_seq_len(seq, "zigzag" if causal else "contiguous", world, u, what=f"{method} {u}x{world // u}")
        elif method == "torch-cp-flex":
            from attnbench.distributed.torch_cp_flex import check_seq_len
            check_seq_len(seq, world)
        else:
            zig = method.endswith("zigzag") or (method == "torch-cp" and causal)
            what = f"{method}: {'2 x ' if zig else ''}world size {world}"
            lay.check_seq_len(seq, "zigzag" if zig else "contiguous", world, what=what)
    except ValueError as exc:
        raise UserError(f"{spec.label()}: {exc}") from None


def dist(
    ctx: typer.Context,
    method: Annotated[list[str] | None, typer.Option(
        "--method", metavar="METHOD,...", help="ring, zigzag, ulysses, ulysses-ce (forward: copy-engine all-to-all), usp, torch-cp, torch-cp-flex, rfa-ring, rfa-zigzag, yunchang (comma list).")] = None,
    kernel: Annotated[str, typer.Option(
        "--kernel", help=f"Local kernel (a backend name): {', '.join(KERNELS)}.")] = "sdpa-math",
    nproc: Annotated[int | None, typer.Option(
        "--nproc", metavar="N", help="Start N ranks on this machine (instead of torchrun --nproc_per_node N).")] = None,
    ulysses_degree: Annotated[int | None, typer.Option(
        "--ulysses-degree", help="USP: ranks per Ulysses group (default: largest divisor <= 8 of world and heads).")] = None,
    ring_comm: Annotated[str, typer.Option("--ring-comm", help="p2p (ring) or allgather (gather K/V first).")] = "p2p",
    ulysses_chunks: Annotated[str, typer.Option(
        "--ulysses-chunks", metavar="N|auto", help="Ulysses' forward pipelined over N head chunks per rank, each "
        "chunk's all-to-alls under the previous chunk's kernel (auto: 4, 2 or 1, whichever divides the heads; "
        "default 1 = one all-to-all: on 4 H200s the pipeline hid the all-to-alls but lost as much to the smaller "
        "kernels).")] = "1",
    device: Annotated[str | None, typer.Option("--device", help="cpu or cuda (default: cuda if available).")] = None,
    documents: Annotated[str | None, typer.Option(
        "--documents", metavar="MEAN", help="Pack each --seq-lens total with documents of seeded long-tailed "
        "lengths (log-normal, mean MEAN tokens, e.g. 8k), each attended within itself (ring, zigzag, ulysses, torch-cp-flex).")] = None,
    batch_size: common.BatchSize = None,
    seq_lens: common.SeqLens = None,
    q_heads: common.QHeads = None,
    kv_heads: common.KvHeads = None,
    head_size: common.HeadSize = None,
    dtype: common.Dtype = None,
    causal_mode: common.CausalMode = None,
    pass_: common.Passes = None,
    warmup: common.Warmup = None,
    repeat: common.Repeat = None,
    check: Annotated[bool, typer.Option("--check/--no-check", help="Compare every rank with one device.")] = True,
    details: Annotated[bool, typer.Option(
        "--details", help="Each case's check in the FA2 accuracy write-up's format (max and mean diff per rank and "
        "tensor) instead of one table of max diffs.")] = False,
    timeline_calls: Annotated[int, typer.Option(
        "--timeline", metavar="CALLS",
        help="After the timed calls, record CALLS more step by step: kernel, merge, exposed waits, all-to-alls, "
             "launch gaps per rank (0: off).")] = 0,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds a collective may wait for a peer.")] = 600.0,
    db: common.Db = None,
    output: Annotated[Path | None, typer.Option("--output", help="Also write the records to FILE.json or .csv.")] = None,
    seed: common.Seed = 0,
) -> None:
    """Context-parallel attention over a torchrun job's ranks (or --nproc N): per-rank diffs, per-device speed."""
    rank_env = common.env_int("RANK", 0)
    check_rank_env()  # every rank says it itself: rank 0 may not be there to
    if rank_env and os.environ.get("TORCHELASTIC_RUN_ID"):
        # torchrun stops the other ranks when one fails: rank 0 or the rank that failed says why, the rest end
        # without a word (each printed 'stopped by SIGTERM', or a traceback when stopped while exiting)
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, signal.SIG_DFL)
    if nproc is not None and "RANK" not in os.environ:
        if not 1 <= nproc <= dist_launch.MAX_NPROC:
            raise UserError(f"bad --nproc {nproc}: give the number of ranks, 1..{dist_launch.MAX_NPROC}")
        _plan(ctx, world=nproc)  # checked once, before any rank starts
        raise SystemExit(dist_launch.launch(nproc, dist_launch.without_nproc(common.invocation())))
    try:
        plan = _plan(ctx)
    except UserError as exc:
        if rank_env == 0:
            raise
        _quiet_exit(2, exc)  # every rank rejects; only rank 0 says why
    try:
        _execute(plan)
    except UserError as exc:
        if rank_env == 0:
            raise
        _quiet_exit(2, exc)
    except Exception as exc:
        rank = rank_env
        if os.environ.get("ATTNBENCH_DEBUG"):
            raise
        common.fail(f"rank {rank}: {type(exc).__name__}: {' '.join(str(exc).split())[:500]}", 1)


def check_rank_env() -> None:
    """The job torchrun describes, when RANK is set: a rank below WORLD_SIZE, and the address of rank 0
    (MASTER_ADDR, MASTER_PORT) to meet it at. UserError otherwise, before torch.distributed is asked (it would
    raise its own error, or wait for ever for ranks that do not exist)."""
    if "RANK" not in os.environ:  # a plain `attnbench dist`: a world of one (bench.init_distributed)
        return
    rank, world = common.env_int("RANK", 0), common.env_int("WORLD_SIZE", 1, low=1)
    if rank >= world:
        raise UserError(f"bad RANK={rank} in the environment: WORLD_SIZE is {world}, so ranks are 0..{world - 1}; "
                        "unset RANK, or run under torchrun")
    missing = [name for name in ("MASTER_ADDR", "MASTER_PORT") if not os.environ.get(name, "").strip()]
    if missing:
        raise UserError(f"RANK={rank} is set in the environment but {' and '.join(missing)} "
                        f"{'is' if len(missing) == 1 else 'are'} not: torchrun sets them; unset RANK, or run under "
                        "torchrun")
    port = common.env_int("MASTER_PORT", 0, low=1)
    if port > 65535:
        raise UserError(f"bad MASTER_PORT={port} in the environment: a TCP port is 1..65535")


def _quiet_exit(code: int, exc: BaseException) -> None:
    """Exit a rank other than 0 without a word (rank 0 says why). Under torchrun, rank 0 is given time to say
    it: a rank that ended first would have torchrun stop rank 0 mid-sentence (it printed a traceback); torchrun
    ends this rank (silently, see ``dist``) once rank 0 has."""
    if os.environ.get("TORCHELASTIC_RUN_ID"):
        time.sleep(RANK0_FIRST_S)
    raise SystemExit(code) from exc


RANK0_FIRST_S = 5.0
"""How long the other ranks of a torchrun job wait for rank 0 to report bad options and end the job."""


def _plan(ctx: typer.Context, world: int | None = None) -> dict:
    """The checked options (a UserError names the first bad one) for a job of ``world`` ranks (default: this
    job's WORLD_SIZE)."""
    from attnbench.distributed import bench
    from attnbench.distributed.kernels import KernelUnavailable, get_kernel

    opts = common.merge_options(ctx, {}, allowed=set(ctx.params))  # unset list options become None
    dev = "cpu" if opts.get("device") == "cpu" else common.resolve_device(opts.get("device"))
    methods = _names(opts.get("method") or ["ring"], bench.METHODS, "--method")
    if opts["ring_comm"] not in ("p2p", "allgather"):
        raise UserError(f"bad --ring-comm {opts['ring_comm']!r}; allowed: p2p, allgather")
    chunks = str(opts.get("ulysses_chunks") or "1").strip().lower()
    if chunks != "auto":
        chunks = common.positive_int(chunks, "--ulysses-chunks")
    opts["ulysses_chunks"] = chunks
    opts["kernel"] = canonical(str(opts["kernel"]))
    if any(m not in bench.OWN_KERNEL for m in methods):
        try:
            get_kernel(opts["kernel"], dev)
        except KernelUnavailable as exc:
            raise UserError(str(exc)) from None
    opts.setdefault("pass_", None)
    opts["pass_"] = opts["pass_"] or ["fwd", "fwd_bwd"]
    specs = common.build_sweep(opts, dev).specs()
    if opts.get("documents") is not None:
        specs = _packed(specs, opts["documents"], opts.get("seed") or 0)
    world = world or common.env_int("WORLD_SIZE", 1, low=1)
    validate(specs, methods, world, opts.get("ulysses_degree"), opts["ulysses_chunks"])
    cpu = dev == "cpu"
    try:
        timing = TimingConfig(warmup=common.option_int(opts, "warmup", 0, common.MAX_REPEAT, default=1 if cpu else 5),
                              repeat=common.option_int(opts, "repeat", 1, common.MAX_REPEAT, default=3 if cpu else 20))
    except ValueError as exc:
        raise UserError(str(exc)) from None
    timeout = opts.get("timeout")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= common.MAX_WAIT_S:
        raise UserError(f"bad --timeout {common.shown(timeout)}: give the seconds a collective may wait, "
                        f"in (0, {common.MAX_WAIT_S:g}], like 600")
    calls = opts.get("timeline_calls") or 0
    if not 0 <= calls <= MAX_TIMELINE_CALLS:
        raise UserError(f"bad --timeline {common.shown(calls)}: give a number of calls in 0..{MAX_TIMELINE_CALLS} "
                        "(0 for none; the timeline is a median over them)")
    db = common.check_db_path(Path(opts.get("db") or DEFAULT_DB))
    if opts.get("output") is not None:
        try:
            export.format_for(Path(opts["output"]))
        except ValueError as exc:
            raise UserError(str(exc)) from None
        files.check_output(Path(opts["output"]), "--output", stores=(db,))
    ResultStore.check_writable(db)  # before any process group exists: every rank gives the same answer
    return {"opts": opts, "device": dev, "methods": methods, "specs": specs, "timing": timing}


def _packed(specs, mean, seed: int) -> list:
    """Each dense spec's total length as seeded long-tailed documents (``documents.long_tailed``)."""
    from attnbench.distributed.documents import long_tailed
    from attnbench.sweep import parse_int_list
    try:
        values = parse_int_list(str(mean), "--documents")
        if len(values) != 1:
            raise ValueError(f"--documents takes one mean length, got {mean!r}")
        out = []
        for spec in specs:
            if spec.is_varlen:
                raise ValueError("--documents packs one total length: give --seq-lens single lengths with it")
            lengths = long_tailed(spec.seqlens_q[0], values[0], seed)
            out.append(spec.replace(seqlens_q=lengths, seqlens_k=lengths))
        return out
    except ValueError as exc:
        raise UserError(str(exc) if "--documents" in str(exc) else f"--documents {mean}: {exc}") from None


def _execute(plan: dict) -> None:
    from attnbench.distributed import bench

    opts = plan["opts"]
    ctx = bench.init_distributed(plan["device"], opts["timeout"])
    if ctx.ranks_per_device > 1:
        if not opts["check"]:
            import torch.distributed as torch_dist
            torch_dist.destroy_process_group()
            raise UserError(f"{ctx.ranks_per_device} ranks share each GPU, so cases are checked and not timed: "
                            "--no-check would leave nothing to do")
        if ctx.rank == 0:
            common.console.print(f"{ctx.ranks_per_device} ranks share each GPU: gloo through host memory; every case "
                                 "is checked against one device, none is timed", highlight=False)
    store = None
    if ctx.rank == 0:
        env = envmod.collect(ctx.device)
        env_id, run_id = envmod.env_id(env), new_run_id()
        store = ResultStore(Path(opts.get("db") or DEFAULT_DB))
        store.add_env(env_id, env)
        config = {k: (str(v) if isinstance(v, Path) else v) for k, v in opts.items()}
        store.start_run(run_id, command=shlex.join(["attnbench", *sys.argv[1:]]), config=config, env_id=env_id,
                        version=__version__)
    results, records = [], []
    status = "interrupted"
    cases = [(method, spec) for method in plan["methods"] for spec in plan["specs"]]
    try:
        for i, (method, spec) in enumerate(cases):
            what = f"{method} {spec.label()} {spec.pass_}"
            with Heartbeat(f"[{i}/{len(cases)}]", what) if ctx.rank == 0 else contextlib.nullcontext() as beat:
                res = bench.run_case(spec, method, opts["kernel"], ctx, timing=plan["timing"], check=opts["check"],
                                     ulysses_degree=opts.get("ulysses_degree"), comm=opts["ring_comm"],
                                     ulysses_chunks=opts["ulysses_chunks"],
                                     seed=opts.get("seed") or 0, timeline_calls=opts.get("timeline_calls") or 0,
                                     phase=beat.say if beat is not None else None)
            if ctx.rank == 0:
                _print_case(res, ctx.world, details=bool(opts.get("details")))
                _print_timeline(res)
                record = _record(res, run_id, env_id, ctx, opts.get("seed") or 0)
                store.write(record)
                records.append(record)
                results.append(res)
        status = "done"
    finally:
        if store is not None:
            store.finish_run(run_id, status)
            store.close()
    if ctx.rank == 0:
        _print_tables(results, ctx.world)
        if opts.get("output"):
            common.write_output(records, Path(opts["output"]), Path(opts.get("db") or DEFAULT_DB), run_id)
        ok = sum(r.status == "ok" for r in results)
        common.console.print(f"{ok}/{len(results)} cases ok; results in {opts.get('db') or DEFAULT_DB}",
                             highlight=False)
    import torch.distributed as torch_dist
    torch_dist.barrier()
    torch_dist.destroy_process_group()


class Heartbeat:
    """Rank 0's line on standard error every ``EVERY_S`` seconds while one case runs longer than that (a compile, a
    long check): which case, what it is doing, for how long. A quick case prints nothing."""

    EVERY_S = 10.0

    def __init__(self, counter: str, what: str):
        self.counter, self.what, self.now = counter, what, "starting"
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="attnbench-heartbeat", daemon=True)

    def say(self, text: str) -> None:
        self.now = text

    def __enter__(self):
        self._start = time.perf_counter()
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._done.set()
        self._thread.join()
        return False

    def _beat(self) -> None:
        while not self._done.wait(self.EVERY_S):
            common.err_console.print(f"attnbench: {self.counter} still running {self.what}: {self.now} "
                                     f"({time.perf_counter() - self._start:.0f} s)", markup=False, highlight=False,
                                     soft_wrap=True)


def _backend_name(res: bench.CaseResult) -> str:
    from attnbench.distributed import bench

    return f"cp-{res.method}" if res.method in bench.OWN_KERNEL else f"cp-{res.method}:{res.kernel}"


def _record(res: bench.CaseResult, run_id: str, env_id: str, ctx: bench.DistContext, seed: int) -> Record:
    from attnbench import metrics
    from attnbench.distributed import bench

    fields: dict = {}
    if res.stats is not None:
        median = res.stats["median_ms"]
        fields = dict(samples_ms=res.samples, **res.stats, iters_per_s=1e3 / median if median > 0 else None,
                      flops=metrics.flops(res.spec), tflops=res.tflops_per_device, peak_mem_bytes=res.peak_bytes)
    accuracy = None
    if res.per_rank:
        accuracy = {"verdict": res.verdict, "k": bench.VERDICT_K, "floor_ulps": bench.FLOOR_ULPS,
                    "per_rank": res.per_rank}
    info = {**res.info, "tflops_is_per_device": True,
            "per_rank_diffs": [{t: {"max": r[t]["max"], "mean": r[t]["mean"]} for t in r} for r in res.per_rank or []]}
    return Record(run_id=run_id, backend=_backend_name(res), spec=res.spec, status=res.status, reason=res.reason,
                  timing_mode="events" if ctx.device.type == "cuda" else "cpu", device=str(ctx.device),
                  env_id=env_id, seed=seed, accuracy=accuracy, info=info, **fields)


def _print_case(res: bench.CaseResult, world: int, details: bool = False) -> None:
    """A case's heading, then its check: a table of each rank's max diff from one device (ranks as rows, tensors
    as columns) and the verdict; with ``details``, the FA2 accuracy write-up's printout instead. A forward-only
    case shows its output alone (its gradients too where one of them failed the check)."""
    out = common.console
    out.print(f"\n{_backend_name(res)} · {world} ranks · {res.spec.label()} · {res.spec.pass_}",
              highlight=False, markup=False)
    if res.status == "unsupported":
        out.print(f"unsupported: {res.reason}", highlight=False, markup=False)
        return
    if (clock := _clock_line(res)) is not None:
        out.print(clock, highlight=False, markup=False)
    if not res.per_rank:
        return
    names = _shown_tensors(res)
    lines = _writeup_lines(res, names) if details else _diff_table(res, names)
    lines.append(_verdict_line(res, names))
    out.print("\n".join(lines), highlight=False, markup=False, soft_wrap=True)


def _shown_tensors(res: bench.CaseResult) -> list[str]:
    """The tensors a case's check shows: all of them, or for a forward-only case its output and any gradient
    that failed."""
    names = list(res.per_rank[0])
    if res.spec.pass_ != "fwd":
        return names
    return [n for n in names if n == "out" or any(not r[n]["pass"] for r in res.per_rank)]


def _diff_table(res: bench.CaseResult, names: list[str]) -> list[str]:
    """Each rank's max diff from one device per tensor: one row per rank, at most 5 columns whatever the ranks."""
    head = "max diff vs one device"
    width = max(len(head), len(f"rank {len(res.per_rank) - 1}"))
    lines = [head.ljust(width) + "".join(f"  {n:>9}" for n in names)]
    lines += [f"rank {i}".ljust(width) + "".join(f"  {r[n]['max']:>9.3g}" for n in names)
              for i, r in enumerate(res.per_rank)]
    return lines


def _writeup_lines(res: bench.CaseResult, names: list[str]) -> list[str]:
    """The FA2 accuracy write-up's printout of the check (``--details``)."""
    lines = [SEP, "# forward:", SEP]
    lines += [f"rank {i} out (distributed) - out_ref (non-distributed) diff: {r['out']['max']}"
              for i, r in enumerate(res.per_rank)]
    grads = [n for n in names if n != "out"]
    if grads:
        lines += [SEP, "# backward:", SEP]
    for name in grads:
        lines.append(f"{name} diff:")
        lines += [f"Rank[{i}] max {r[name]['max']:.3g}, mean {r[name]['mean']:.3g}" for i, r in enumerate(res.per_rank)]
    return lines


def _verdict_line(res: bench.CaseResult, names: list[str]) -> str:
    from attnbench.distributed import bench

    worst = max((r[t]["err_vs_exact"] / r[t]["bound"] if r[t]["bound"] else 0.0, i, t)
                for i, r in enumerate(res.per_rank) for t in names)
    return (f"verdict: {res.verdict} (error vs exact <= {bench.VERDICT_K} x one device's + {bench.FLOOR_ULPS} ulp; "
            f"worst: rank {worst[1]} {worst[2]}, {worst[0]:.2f} of the bound)")


def _clock_line(res: bench.CaseResult) -> str | None:
    """Every rank's SM clock after its timed calls, where the GPUs report one (a warm GPU's lower clock is a
    slower kernel, not a slower method), and whether any rank's fell during them."""
    states = res.info.get("gpu_state_per_rank")
    if not states:
        return None
    mhz = ", ".join(str((st.get("end") or {}).get("sm_clock_mhz", "?")) for st in states)
    fell = " (fell by over 10% on a rank while timed)" if res.info.get("clock_dropped") else ""
    return f"SM clock after the timed calls, by rank: {mhz} MHz{fell}"


def _print_timeline(res: bench.CaseResult) -> None:
    """Where the time of a recorded call goes: per step (min-max over ranks), then per rank."""
    from attnbench.distributed import timeline

    per_rank = res.info.get("timeline")
    if not per_rank:
        return
    steps, totals = timeline.summarize(per_rank, res.info.get("timeline_call_ms"))
    calls = res.info.get("timeline_calls", "")

    def span(v):
        return "" if v is None else (f"{v[0]:.2f}" if abs(v[1] - v[0]) < 0.005 else f"{v[0]:.2f}-{v[1]:.2f}")
    lines = [f"timeline, ms per call (median of {calls} recorded calls; per step: min-max over ranks)",
             "| pass | step | " + " | ".join(timeline.PHASES) + " |", "|---|---:|" + "---:|" * len(timeline.PHASES)]
    lines += [f"| {r['pass']} | {r['step']} | " + " | ".join(span(r.get(ph)) for ph in timeline.PHASES) + " |"
              for r in steps]
    cols = (*timeline.PHASES, "total", *(("call",) if "call" in totals[0] else ()), "imbalance")
    lines += ["| rank | " + " | ".join(cols) + " |", "|---:|" + "---:|" * len(cols)]
    lines += [f"| {i} | " + " | ".join(f"{t[c]:.2f}" for c in cols) + " |" for i, t in enumerate(totals)]
    common.console.print("\n".join(lines), highlight=False, markup=False, soft_wrap=True)  # markdown: whole lines
    common.console.print("imbalance: the slowest rank's kernel time less this rank's; wait: communication not "
                         "hidden under compute, waits for slower peers included; gap: the GPU idle while the host "
                         "launches; call: the recorded calls' own time (total less than call: time after the last "
                         "phase)", highlight=False, markup=False)  # prose: wrapped at the width


def _print_tables(results: list[bench.CaseResult], world: int) -> None:
    """A markdown table per method in the FA2 write-up's columns (one per mask when the run has causal and
    non-causal cases: the columns do not say it): the rate in ``metrics.rate_unit`` of the results (GFLOP/s on
    CPU), a busy CPU's numbers marked as ``run`` marks them."""
    from attnbench import metrics
    unit = metrics.rate_unit(r.tflops_per_device for r in results if r.stats is not None)
    columns = (*TABLE_COLUMNS, unit.name)
    both = len({r.spec.causal for r in results}) > 1
    groups: dict[str, list[bench.CaseResult]] = {}  # by the table's title
    for res in results:
        mask = (", causal" if res.spec.causal else ", not causal") if both else ""
        groups.setdefault(f"{_backend_name(res)} on {world} ranks{mask}", []).append(res)
    for title, rows in groups.items():
        lines = [f"\n### {title}", "| " + " | ".join(columns) + " |",
                 "| " + " | ".join(":---:" for _ in columns) + " |"]
        for r in rows:
            s = r.spec
            if r.stats is None:
                cells = ["-"] * 4 + [r.status]
            else:
                med = r.stats["median_ms"]
                mem = "n/a" if r.peak_bytes is None else f"{r.peak_bytes / 2**20:.0f}"
                rate = (r.tflops_per_device or 0.0) * unit.factor
                mark = f" {BUSY}" if busy_of(r.info) else ""
                cells = [f"{1e3 / med:.3f}{mark}", f"{med:.3f}{mark}", mem,
                         (f"{rate:.1f}" if rate >= 10 else f"{rate:#.3g}") + mark, ""]
            seq = f"{sum(s.seqlens_q)} ({len(s.seqlens_q)} docs)" if s.is_varlen else str(s.seqlens_q[0])
            lines.append("| " + " | ".join([str(s.batch), seq, str(s.heads_q), str(s.head_dim),
                                             str(s.pass_ == "fwd"), *cells[:4]]) + " |")
        lines += sorted({r.info["not_timed"] for r in rows if r.info.get("not_timed")})
        common.console.print("\n".join(lines), highlight=False, markup=False, soft_wrap=True)  # the write-up's format
    if any(busy_of(r.info) for r in results if r.stats is not None):  # once, under the last table
        common.console.print(BUSY_NOTE, highlight=False, markup=False)
