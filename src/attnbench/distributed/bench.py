"""One context-parallel case on every rank: shard, check against one device, time, aggregate on rank 0.

Check. Every rank draws the same seeded full inputs, runs the method on its shard, and compares its
out, dq, dk, dv with (a) the same local kernel on the full inputs on one device (the non-distributed
result, sharded the same way: the printed diffs; a peer's own kernel where it gives one, else the exact
result rounded to the dtype) and (b) the exact result (fp64 on CPU, fp32 with
TF32 off on GPUs). Verdict per tensor: pass if

    max|distributed - exact| <= K * max|single device - exact| + 2 * eps(dtype) * max|exact|,  K = 2.5

The distributed result rounds each block's partial output and gradients to the input dtype before
the fp32 merge (the kernels return bf16 blocks), so it carries up to world-size extra roundings;
independent roundings grow like sqrt(N), which K = 2.5 covers up to about 4-6 blocks per rank and a
merge bug (errors of the order of the values themselves) never passes. The floor, two roundings at
the tensor's largest value, keeps a single-device kernel that happens to be nearly exact (fp32/fp64
math) from making the bound smaller than the rounding of the merge itself.

Timing. ``timing.measure_detailed`` on each rank (CUDA events or perf_counter), then an element-wise all_reduce
MAX over ranks: the latency of an iteration is that of its slowest rank. Peak memory is the largest
``max_memory_allocated`` over ranks while only the shards are resident (full inputs freed first). On CPU a
case is busy (``info["cpu"]["busy"]``) when any rank was timed on a busy CPU, as ``run`` judges its cases.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import socket
import time
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

from attnbench import metrics
from attnbench.distributed import copy_engine, documents, peers, timeline, torch_cp_flex
from attnbench.distributed import layout as lay
from attnbench.distributed.comm import all_reduce
from attnbench.distributed.kernels import KernelUnavailable, LocalKernel, get_kernel
from attnbench.distributed.names import canonical
from attnbench.distributed.reference import TENSORS, exact_attention, max_mean, single_device
from attnbench.distributed.ring import ring_attention
from attnbench.distributed.ulysses import check_heads, pipeline_chunks, ulysses_attention
from attnbench.distributed.usp import make_mesh, usp_attention
from attnbench.inputs import make_inputs
from attnbench.spec import AttnSpec
from attnbench.timing import TimingConfig, measure_detailed, summarize
from attnbench.timing.clocks import ClockMonitor, clock_dropped

log = logging.getLogger(__name__)

METHODS = ("ring", "zigzag", "ulysses", "ulysses-ce", "usp", "torch-cp", "torch-cp-flex", "rfa-ring", "rfa-zigzag", "yunchang")
OWN_KERNEL = ("torch-cp-flex", "rfa-ring", "rfa-zigzag", "yunchang")
"""Other implementations that bring their own local kernel (``--kernel`` does not apply)."""
OWN_COLLECTIVES = ("torch-cp", "ulysses-ce", *OWN_KERNEL)
"""Other implementations, which move tensors with collectives of their own (NCCL on CUDA)."""
VERDICT_K = 2.5
FLOOR_ULPS = 2
REFERENCE_ULPS = 16
"""A peer's own kernel on one device (``Method.reference``) is the yardstick only up to this many ulps of the
largest exact value: a kernel or block mask that ignored the documents is off by the values themselves on one
device too, and must not widen its own bound (a bf16 kernel's rounding is a few ulps)."""
FAIL_RANK_ENV = "ATTNBENCH_DIST_FAIL_RANK"  # fault injection for testing the failure path
SHARED_NOT_TIMED = ("not timed: {n} ranks share each GPU (gloo through host memory), so a time would be "
                    "neither per device nor of the real transfers")


@dataclass(frozen=True, kw_only=True)
class DistContext:
    """This process's place in the job."""

    rank: int
    world: int
    local_rank: int
    device: torch.device
    backend: str
    ranks_per_device: int = 1
    """Ranks of this node on each GPU: above 1 the job runs on gloo and checks results without timing them."""


@dataclass(frozen=True, kw_only=True)
class Method:
    """A ready-to-call context-parallel attention and the layout its shards are in."""

    name: str
    fn: object
    """(q, k, v) local bshd shards -> local output shard (differentiable)."""
    layout: str
    ulysses_degree: int = 1
    context: object = None
    """Factory of a context manager the calls must run inside (torch-cp, torch-cp-flex), or None."""
    positions: torch.Tensor | None = None
    """int64 global positions this rank holds, in local order, when the method lays the sequence out itself
    (torch-cp-flex's per-document balancer); None: ``layout``'s (``layout.positions``)."""
    reference: object = None
    """(q, k, v, dout) full inputs -> out, dq, dk, dv of the method's own kernel on one device, for a peer that
    brings its kernel (torch-cp-flex); None: the exact result rounded to the dtype stands in for it."""
    info: dict = field(default_factory=dict)


class MethodUnavailable(RuntimeError):
    """The method cannot run in this job; the message says why (recorded as unsupported)."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_distributed(device: str | None = None, timeout_s: float = 600.0) -> DistContext:
    """Join the torchrun job (or make a one-process one); NCCL on GPUs, gloo on CPU.

    A node with more ranks than GPUs (``torchrun --nproc_per_node 4`` on one GPU) shares the GPUs
    round-robin and runs on gloo through host memory, since NCCL refuses two ranks on one device:
    such a job checks every method with the real kernels, and its times are not recorded."""
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    if "RANK" not in os.environ:  # plain `attnbench dist`: a world of one
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(_free_port()))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = torch.cuda.is_available() if device is None else device.startswith("cuda")
    per_device = 1
    dev = torch.device("cpu")
    if use_cuda:
        gpus = torch.cuda.device_count()
        per_device = -(-int(os.environ.get("LOCAL_WORLD_SIZE", "1")) // max(gpus, 1))
        dev = torch.device("cuda", local_rank % max(gpus, 1))
        torch.cuda.set_device(dev)
    backend = "nccl" if use_cuda and per_device == 1 else "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
    ctx = DistContext(rank=dist.get_rank(), world=dist.get_world_size(), local_rank=local_rank, device=dev,
                      backend=dist.get_backend(), ranks_per_device=per_device)
    if os.environ.get(FAIL_RANK_ENV) == str(ctx.rank):
        raise RuntimeError(f"injected failure ({FAIL_RANK_ENV}={ctx.rank})")
    return ctx


def build_method(name: str, kernel_name: str, spec: AttnSpec, ctx: DistContext, *, ulysses_degree: int | None,
                 comm: str = "p2p", ulysses_chunks: int | str = 1) -> Method:
    """The method ``name`` for this case; ValueError for a bad case, MethodUnavailable for a missing peer."""
    causal, scale, seq = spec.causal, spec.softmax_scale, sum(spec.seqlens_q)
    docs = packed_documents(spec)
    if docs is not None and name not in documents.METHODS:
        raise ValueError(f"packed documents (a group of lengths) run on {', '.join(documents.METHODS)}; "
                         f"{name} does not take them")
    if name in OWN_COLLECTIVES and ctx.ranks_per_device > 1:
        raise MethodUnavailable(f"{name} moves CUDA tensors with its own collectives, which need one GPU per rank "
                                f"(NCCL); here {ctx.ranks_per_device} ranks share each GPU")
    if name in ("ring", "zigzag", "rfa-ring", "rfa-zigzag"):
        layout = "zigzag" if name.endswith("zigzag") else "contiguous"
        lay.check_seq_len(seq, layout, ctx.world, what=f"{name}: {'2 x ' if layout == 'zigzag' else ''}world size")
        if name.startswith("rfa"):
            return _peer(name, peers.ring_flash_attn, layout, zigzag=layout == "zigzag", causal=causal, scale=scale,
                         device=ctx.device)
        kernel = get_kernel(kernel_name, ctx.device)
        fn = _wrap(ring_attention, kernel=kernel, causal=causal, scale=scale, layout=layout, comm=comm, docs=docs)
        return Method(name=name, fn=fn, layout=layout, info={"ring_comm": comm})
    if name in ("ulysses", "ulysses-ce"):
        check_heads(spec.heads_q, spec.heads_kv, ctx.world)
        lay.check_seq_len(seq, "contiguous", ctx.world, what=f"{name}: world size")
        chunks = pipeline_chunks(spec.heads_q, spec.heads_kv, ctx.world, ulysses_chunks)
        a2a = "nccl"
        if name == "ulysses-ce":
            if ctx.device.type != "cuda":
                raise MethodUnavailable("ulysses-ce copies between GPUs: it needs CUDA and one GPU per rank")
            if why := copy_engine.missing():
                raise MethodUnavailable(why)
            if spec.pass_ != "fwd":
                raise MethodUnavailable("ulysses-ce moves the forward's all-to-alls on the copy engines; its backward "
                                        "would be ulysses' own: time it with --pass fwd")
            a2a = "copy-engine"
        kernel = get_kernel(kernel_name, ctx.device)
        fn = _wrap(ulysses_attention, kernel=kernel if docs is None else documents.whole(kernel, docs), causal=causal,
                   scale=scale, chunks=chunks, a2a=a2a)
        return Method(name=name, fn=fn, layout="contiguous", ulysses_degree=1,
                      info={"ulysses_chunks": chunks, "ulysses_a2a": a2a})
    if name in ("usp", "yunchang"):
        u = ulysses_degree or _default_ulysses(ctx.world, spec)
        check_heads(spec.heads_q, spec.heads_kv, u)
        layout = "zigzag" if causal else "contiguous"
        lay.check_seq_len(seq, layout, ctx.world, u, what=f"{name} {u}x{ctx.world // u}")
        if name == "yunchang":
            return _peer(name, peers.yunchang_usp, layout, u, ulysses_degree=u, causal=causal, scale=scale,
                         device=ctx.device)
        mesh = make_mesh(u)
        fn = _wrap(usp_attention, kernel=get_kernel(kernel_name, ctx.device), causal=causal, scale=scale, mesh=mesh,
                   comm=comm)
        return Method(name=name, fn=fn, layout=layout, ulysses_degree=u,
                      info={"ulysses_degree": u, "ring_degree": mesh.ring_degree, "ring_comm": comm})
    if name == "torch-cp":
        layout = "zigzag" if causal else "contiguous"
        lay.check_seq_len(seq, layout, ctx.world, what="torch-cp")
        fn, context, info = _call_peer(peers.torch_cp, kernel_name=kernel_name, causal=causal, scale=scale,
                                       seq_len=seq, device=ctx.device, world=ctx.world)
        return Method(name=name, fn=fn, layout=layout, context=context, info=info)
    if name == "torch-cp-flex":
        torch_cp_flex.check_seq_len(seq, ctx.world)
        p = _call_peer(torch_cp_flex.torch_cp_flex, spec=spec, device=ctx.device, rank=ctx.rank, world=ctx.world)
        return Method(name=name, fn=p.fn, layout=p.layout, context=p.context, positions=p.positions,
                      reference=p.reference, info=p.info)
    raise ValueError(f"unknown method {name!r}; allowed: {', '.join(METHODS)}")


def packed_documents(spec: AttnSpec) -> documents.Documents | None:
    """A grouped spec's sequences as packed documents (documents.py); None for one dense sequence."""
    return documents.Documents(tuple(spec.seqlens_q)) if spec.is_varlen else None


def dense_inputs_spec(spec: AttnSpec) -> AttnSpec:
    """The one dense sequence a case's inputs are drawn for: the packed documents end to end."""
    total = sum(spec.seqlens_q)
    return spec.replace(seqlens_q=(total,), seqlens_k=(total,)) if spec.is_varlen else spec


def _wrap(attn, **kwargs):
    def fn(q, k, v):
        return attn(q, k, v, **kwargs)
    return fn


def _call_peer(factory, **kwargs):
    try:
        return factory(**kwargs)
    except peers.PeerUnavailable as exc:
        raise MethodUnavailable(str(exc)) from None


def _peer(name, factory, layout, ulysses_degree=1, **kwargs) -> Method:
    fn, context, info = _call_peer(factory, **kwargs)
    return Method(name=name, fn=fn, layout=layout, ulysses_degree=ulysses_degree, context=context, info=info)


def _default_ulysses(world: int, spec: AttnSpec) -> int:
    """Largest divisor of the world size that divides both head counts, at most 8 (one node)."""
    return max(u for u in range(1, min(world, 8) + 1)
               if world % u == 0 and spec.heads_q % u == 0 and spec.heads_kv % u == 0)


def kernel_for(name: str, spec: AttnSpec, device: torch.device) -> LocalKernel:
    """The local kernel, refused (KernelUnavailable) if it cannot run this dtype on this device."""
    kernel = get_kernel(name, device)
    reason = kernel.reason(device, spec.dtype)
    if reason:
        raise KernelUnavailable(reason)
    return kernel


# ---- check -------------------------------------------------------------------------------------
def shard_inputs(inputs, idx: torch.Tensor) -> list[torch.Tensor]:
    return [lay.shard(t, idx) for t in (inputs.q, inputs.k, inputs.v, inputs.dout)]


def distributed_result(method: Method, q, k, v, dout) -> dict:
    """out, dq, dk, dv of the method on local shards."""
    ql, kl, vl = (t.detach().requires_grad_(True) for t in (q, k, v))
    out = method.fn(ql, kl, vl)
    dq, dk, dv = torch.autograd.grad(out, (ql, kl, vl), dout)
    return {"out": out.detach(), "dq": dq, "dk": dk, "dv": dv}


def check_rank(method: Method, kernel: LocalKernel | None, spec: AttnSpec, inputs, idx) -> dict:
    """Per-tensor errors of this rank's shard: vs the single-device result and vs the exact one."""
    q, k, v, dout = shard_inputs(inputs, idx)
    got = distributed_result(method, q, k, v, dout)
    with torch.no_grad():  # the timed forward runs without gradients, on a path of its own (pipelined Ulysses)
        forward_only = method.fn(q, k, v)
    full = (inputs.q, inputs.k, inputs.v, inputs.dout)
    docs = packed_documents(spec)
    if docs is None:
        exact = exact_attention(*full, causal=spec.causal, scale=spec.softmax_scale)
    else:
        exact = documents.exact(*full, docs, causal=spec.causal, scale=spec.softmax_scale)
    if kernel is not None:
        ref = single_device(*full, kernel=kernel if docs is None else documents.whole(kernel, docs),
                            causal=spec.causal, scale=spec.softmax_scale)
    elif method.reference is not None:  # a peer's own kernel on one device (torch-cp-flex's FlexAttention)
        ref = method.reference(*full)
    else:  # a peer with its own kernel: compare with the exact result rounded to the dtype
        ref = {n: t.to(spec.torch_dtype) for n, t in exact.items()}
    eps = torch.finfo(spec.torch_dtype).eps
    result = {}
    for name in TENSORS:
        ref_s, exact_s = lay.shard(ref[name], idx), lay.shard(exact[name], idx)
        mx, mean = max_mean(got[name], ref_s)
        dist_err, ref_err = max_mean(got[name], exact_s)[0], max_mean(ref_s, exact_s)[0]
        top = float(exact_s.abs().max())
        yardstick = ref_err if method.reference is None else min(ref_err, REFERENCE_ULPS * eps * top)
        bound = VERDICT_K * yardstick + FLOOR_ULPS * eps * top
        result[name] = {"max": mx, "mean": mean, "err_vs_exact": dist_err, "single_err_vs_exact": ref_err,
                        "bound": bound, "pass": dist_err <= bound}
        if name == "out":  # the forward without gradients is held to the same bound, and reported beside
            fwd_max = max_mean(forward_only, ref_s)[0]
            fwd_err = max_mean(forward_only, exact_s)[0]
            result[name].update(max=max(mx, fwd_max), forward_only_err_vs_exact=fwd_err,
                                **{"pass": dist_err <= bound and fwd_err <= bound})
    return result


# ---- timing ------------------------------------------------------------------------------------
def timed_closure(method: Method, shards: list[torch.Tensor], pass_: str):
    q, k, v, dout = shards
    if pass_ == "fwd":
        def fwd():
            with torch.no_grad():
                return method.fn(q, k, v)
        return fwd
    leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]

    def fwd_bwd():
        for t in leaves:
            t.grad = None
        method.fn(*leaves).backward(dout)
    return fwd_bwd


def time_method(fn, timing: TimingConfig, ctx: DistContext) -> tuple[list[float], int | None, list[list[float]], dict | None]:
    """Per-iteration max-over-ranks samples (ms), the max-over-ranks peak allocated bytes, every rank's own
    samples (a rank that waits on a slower one shows it there) and, on CPU, rank 0's ``info["cpu"]`` (threads,
    preempted samples, ...: ``timing.cpu.time_cpu``) with ``busy`` when any rank was timed on a busy CPU (the
    call waits for the slowest rank)."""
    cuda = ctx.device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(ctx.device)
        torch.cuda.reset_peak_memory_stats(ctx.device)
    dist.barrier()
    # Every rank must make the same number of calls (each call meets the others in collectives), so
    # no time-based warm-up or sample count: exactly warmup + repeat calls; and every device starts each
    # timed call together with the others (``align``), so that no rank's time holds a wait for a late peer.
    align = _device_barrier(ctx.device) if cuda else None
    measured = measure_detailed(fn, timing.fixed(), ctx.device, align=align)
    samples, cpu = measured.samples_ms, measured.info.get("cpu")
    peak = torch.cuda.max_memory_allocated(ctx.device) if cuda else 0
    values = max_over_ranks([*samples, float(peak), float(bool(cpu and cpu.get("busy")))])
    per_rank = [None] * ctx.world
    dist.all_gather_object(per_rank, [round(x, 4) for x in samples])
    if cpu is not None:
        cpu = {**cpu, "busy": bool(values[-1])}
    return values[:-2], (int(values[-2]) if cuda else None), per_rank, cpu


def clock_info(states: list[dict]) -> dict:
    """What a record says of its ranks' GPU clocks (``{"start": {...}, "end": {...}}`` per rank, {} each where
    none can be read): every rank's (``gpu_state_per_rank``), the slowest rank's at the end as the record's own
    ``gpu_state`` (what the views show: the call waits for that rank), and ``clock_dropped`` when any rank's
    clock fell during its timed calls; nothing when no rank could read one (a CPU)."""
    read = [st for st in states if (st.get("end") or {}).get("sm_clock_mhz") is not None]
    if not read:
        return {}
    slowest = min(read, key=lambda st: st["end"]["sm_clock_mhz"])
    info = {"gpu_state": slowest, "gpu_state_per_rank": states}
    if any(clock_dropped(st.get("start") or {}, st.get("end") or {}) for st in states):
        info["clock_dropped"] = True
    return info


def _device_barrier(device: torch.device):
    """A callable that queues, on the current stream, a wait for every rank's device to reach it (a
    one-element all-reduce: the compute stream waits for NCCL's, which starts once every rank is there)."""
    token = torch.zeros(1, device=device)

    def align() -> None:
        dist.all_reduce(token)
    return align


def max_over_ranks(values: list[float]) -> list[float]:
    """Element-wise maximum over the ranks of the default group."""
    buf = torch.tensor(values, dtype=torch.float64, device="cuda" if dist.get_backend() == "nccl" else "cpu")
    all_reduce(buf, op=dist.ReduceOp.MAX)
    return buf.tolist()


@dataclass(kw_only=True)
class CaseResult:
    """Everything rank 0 needs to print and record one (spec, method) case."""

    spec: AttnSpec
    method: str
    kernel: str
    status: str = "ok"
    reason: str | None = None
    per_rank: list[dict] | None = None
    stats: dict | None = None
    samples: list[float] = field(default_factory=list)
    peak_bytes: int | None = None
    tflops_per_device: float | None = None
    info: dict = field(default_factory=dict)

    @property
    def verdict(self) -> str | None:
        if not self.per_rank:
            return None
        return "pass" if all(t["pass"] for r in self.per_rank for t in r.values()) else "fail"


def run_case(spec: AttnSpec, method_name: str, kernel_name: str, ctx: DistContext, *, timing: TimingConfig,
             check: bool = True, ulysses_degree: int | None = None, comm: str = "p2p", seed: int = 0,
             convention: str = "exact", timeline_calls: int = 0, ulysses_chunks: int | str = 1,
             phase=None) -> CaseResult:
    """Check and time one case on every rank; the result is complete on rank 0.

    ``phase(text)``, where given, hears what the case is doing now (building the method, checking, timing,
    recording the timeline): the heartbeat of a long case says it.

    ``timeline_calls`` > 0: after the timed calls, that many more are recorded phase by phase
    (``timeline.py``); every rank's phases go to ``info["timeline"]``, the recorded calls' own median time to
    ``info["timeline_call_ms"]``."""
    kernel_name = canonical(kernel_name)
    result = CaseResult(spec=spec, method=method_name, kernel=kernel_name)
    peer = method_name in OWN_KERNEL
    say = phase or (lambda text: None)
    say("building the method")
    try:
        kernel = None if peer else kernel_for(kernel_name, spec, ctx.device)
        method = build_method(method_name, kernel_name, spec, ctx, ulysses_degree=ulysses_degree, comm=comm,
                              ulysses_chunks=ulysses_chunks)
    except (MethodUnavailable, ValueError) as exc:  # every rank reaches the same decision
        result.status, result.reason = "unsupported", str(exc)
        return result
    result.info = {"method": method_name, "kernel": kernel_name, "world_size": ctx.world, "layout": method.layout,
                   "backend": ctx.backend, **method.info}
    if spec.is_varlen:
        lengths = spec.seqlens_q
        result.info["documents"] = {"count": len(lengths), "longest": max(lengths), "shortest": min(lengths)}
    idx = method.positions if method.positions is not None else \
        lay.positions(sum(spec.seqlens_q), method.layout, ctx.rank, ctx.world, method.ulysses_degree)
    wall = {}  # seconds per phase on this rank, recorded so a slow job shows where its time went
    t0 = time.perf_counter()
    inputs = make_inputs(dense_inputs_spec(spec), ctx.device, seed)
    with method.context() if method.context else contextlib.nullcontext():
        if check:
            say("checking every rank against one device")
            mine = check_rank(method, kernel, spec, inputs, idx)
            gathered = [None] * ctx.world
            dist.all_gather_object(gathered, mine)
            result.per_rank = gathered
        wall["check_s"] = time.perf_counter() - t0
        if ctx.ranks_per_device > 1:
            result.info["not_timed"] = SHARED_NOT_TIMED.format(n=ctx.ranks_per_device)
        else:
            shards = shard_inputs(inputs, idx)
            del inputs
            _free(ctx.device)
            t0 = time.perf_counter()
            say("timing")
            closure = timed_closure(method, shards, spec.pass_)
            clocks = ClockMonitor(ctx.device) if ctx.device.type == "cuda" else None
            start = clocks.sample() if clocks else {}
            samples, result.peak_bytes, result.info["samples_per_rank"], cpu = time_method(closure, timing, ctx)
            states = [None] * ctx.world  # every rank's GPU clock before and after its timed calls
            dist.all_gather_object(states, {"start": start, "end": clocks.sample() if clocks else {}})
            result.info.update(clock_info(states))
            if cpu is not None:  # the record's CPU load, as run's records have it (views mark a busy one)
                result.info["cpu"] = cpu
            wall["timing_s"] = time.perf_counter() - t0
            if timeline_calls:
                say("recording the timeline")
                mine, call_ms = timeline.record(closure, ctx.device, timeline_calls)
                result.info["timeline_calls"] = timeline_calls
                result.info["timeline"] = [None] * ctx.world
                dist.all_gather_object(result.info["timeline"], mine)
                result.info["timeline_call_ms"] = [None] * ctx.world
                dist.all_gather_object(result.info["timeline_call_ms"], call_ms)
            result.samples, result.stats = samples, summarize(samples)
            flop = metrics.flops(spec, convention=convention) / ctx.world
            result.tflops_per_device = metrics.tflops_per_s(flop, result.stats["median_ms"])
    result.info["wall_s"] = wall
    log.info("%s %s: %s", method_name, spec.label(), ", ".join(f"{k} {v:.1f}" for k, v in wall.items()))
    if result.verdict == "fail":
        result.status, result.reason = "mismatch", "distributed result outside the verdict bound on some rank"
    return result


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
