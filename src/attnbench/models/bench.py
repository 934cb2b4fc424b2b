"""End-to-end model benchmark: one model, its attention swapped per backend, timed as a whole.

For each backend: warm-up steps, then ``steps`` timed steps (a step = one prefill forward or one
denoising step; ``train`` adds the loss and backward). Total step time: CUDA events around each step
(perf_counter on CPU). Attention time: the swap's events around every attention call (forward and,
in training, backward). A hybrid model's recurrent layers (Gated DeltaNet) run the one recurrence backend of the
run (``E2EConfig.recurrence``) for every attention backend, timed apart: ``recurrence_share`` beside
``attn_share``, each the share of its own calls, so the two add up to less than the step. Output deviation: cosine
and rel-L1 of the step's output against the first (default) backend's, in fp32 with fp64 sums. One Record per
backend, in the same store as kernel runs: ``spec`` is the model's (most frequent) attention call, ``median_ms`` the
step, and ``info["e2e"]`` the rest.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from attnbench import memory, metrics
from attnbench.backends.base import BackendUnavailable
from attnbench.linear import metrics as linear_metrics
from attnbench.models import dit, llama
from attnbench.models.config import E2EConfig
from attnbench.models.footprint import attention_spec, estimate
from attnbench.models.swap import AttnSwap, nvtx_range
from attnbench.results.record import Record
from attnbench.spec import DTYPES, AttnSpec
from attnbench.timing import cpu_load, summarize

log = logging.getLogger(__name__)

@dataclass
class Workload:
    """A built model and its step."""

    step: Callable[[], torch.Tensor]
    """One step; returns the forward output (detached)."""
    expected_calls: int
    """Attention calls per step if every call is routed."""
    dtype: torch.dtype
    expected_recurrence_calls: int = 0
    """Recurrence calls (a hybrid model's GDN layers) per step."""


def build_workload(cfg: E2EConfig) -> Workload:
    """Build the model with random weights and its seeded inputs on ``cfg.device``."""
    dtype = DTYPES[cfg.dtype] if cfg.dtype else None
    train = cfg.mode == "train"
    if cfg.model in llama.CONFIGS:
        batch, seq = cfg.llama_shape()
        model = llama.build_llama(cfg.model, layers=cfg.layers, device=cfg.device, dtype=dtype or torch.bfloat16,
                                  seed=cfg.seed, max_seq_len=max(seq, 2), variants=cfg.variants)
        tokens = llama.random_tokens(batch, seq + int(train), model.cfg.vocab_size, cfg.device, cfg.seed + 1)

        def forward():
            return model(tokens[:, :-1] if train else tokens)

        def loss_of(out):
            return torch.nn.functional.cross_entropy(out.float().flatten(0, 1), tokens[:, 1:].flatten())
        calls, recurrences = model.cfg.attention_layers, model.cfg.gdn_layers
        dtype = dtype or torch.bfloat16
    else:
        model, inputs = dit.build_dit(cfg.model, layers=cfg.layers, device=cfg.device, dtype=dtype, seed=cfg.seed)
        dtype = inputs["hidden_states"].dtype

        def forward():
            return dit.forward(model, inputs)

        def loss_of(out):
            return out.float().square().mean()
        calls, recurrences = dit.expected_calls(cfg.model, cfg.layers), 0
    model.requires_grad_(train)

    def step() -> torch.Tensor:
        if not train:
            with torch.no_grad():
                return forward()
        model.zero_grad(set_to_none=True)
        out = forward()
        loss_of(out).backward()
        return out.detach()
    return Workload(step=step, expected_calls=calls, dtype=dtype, expected_recurrence_calls=recurrences)


DEVIATION_CHUNK = 1 << 22
"""Elements per slice of ``deviation``: a Llama's logits (8192 tokens x 128k vocabulary) upcast whole, with
their products, had taken 20 GB of a 24 GB host."""


def deviation(out: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    """(cosine similarity, rel-L1 = sum|out - ref| / sum|ref|) in fp32 with fp64 sums, a slice at a time."""
    f64 = torch.float64
    sums = torch.zeros(5, dtype=f64, device=ref.device)  # a·b, a·a, b·b, |a - b|, |b|
    flat_a, flat_b = out.reshape(-1), ref.reshape(-1)
    for start in range(0, flat_b.numel(), DEVIATION_CHUNK):
        a = flat_a[start:start + DEVIATION_CHUNK].float()
        b = flat_b[start:start + DEVIATION_CHUNK].float()
        sums += torch.stack([(a * b).sum(dtype=f64), a.square().sum(dtype=f64), b.square().sum(dtype=f64),
                             (a - b).abs().sum(dtype=f64), b.abs().sum(dtype=f64)])
    dot, na, nb, diff, ref_l1 = sums
    cos = (dot / (na.sqrt() * nb.sqrt()).clamp_min(1e-300)).item()
    rel_l1 = (diff / ref_l1.clamp_min(1e-300)).item()
    return cos, rel_l1


KERNEL_TALLIES = {"copy": "direct_copy_kernel_cuda", "add": "CUDAFunctor_add"}
"""The CogVideoX-2b table's rows: kernels whose names contain these (data copies and elementwise adds)."""


def tally_kernels(kernels: list[tuple[str, float]]) -> dict:
    """Counts and milliseconds of one step's device kernels: all of them and each of KERNEL_TALLIES.
    Memsets and memcpys are device activities the torch profiler lists beside kernels, not kernels (nsys
    keeps them apart; on an H100 CogVideoX-2b step they were 181-271 of the torch profiler's entries)."""
    kernels = [(name, ms) for name, ms in kernels if not name.startswith(("Memset", "Memcpy"))]
    out = {"kernels": len(kernels), "kernels_ms": sum(ms for _, ms in kernels)}
    for key, pattern in KERNEL_TALLIES.items():
        hits = [ms for name, ms in kernels if pattern in name]
        out[f"{key}_kernels"], out[f"{key}_ms"] = len(hits), sum(hits)
    return out


def profile_step(step, device: torch.device) -> dict:
    """``tally_kernels`` of one step under torch.profiler (the step runs untimed)."""
    from torch.profiler import ProfilerActivity, profile

    from attnbench.timing.profiler import device_kernels
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize(device)
    return tally_kernels(device_kernels(prof.events()))


@dataclass
class Steps:
    """The timed steps of one backend: per step, its time and the attention and recurrences inside it (ms)."""

    total_ms: list[float]
    attn_fwd_ms: list[float]
    attn_bwd_ms: list[float]
    first: torch.Tensor | None
    """The first timed step's output."""
    cpu: dict | None = None
    """CPU runs: ``cpu_load.Preemptions.info`` of the steps (threads, preempted steps, waits, busy)."""
    rec_fwd_ms: list[float] | None = None
    """A hybrid model's recurrence calls per step, forward and backward; None for a model without them."""
    rec_bwd_ms: list[float] | None = None

    def median_step(self) -> dict:
        """Medians over the steps: the step, its attention (forward, backward, both) and the attention's share
        of its own step, which cannot exceed 1 (a mean attention over a median step reached 133% on a busy CPU);
        the same for the recurrences of a hybrid model (``recurrence_*``)."""
        med = statistics.median
        out = {"total_ms": med(self.total_ms)}
        parts = [("attn", self.attn_fwd_ms, self.attn_bwd_ms)]
        if self.rec_fwd_ms is not None:
            parts.append(("recurrence", self.rec_fwd_ms, self.rec_bwd_ms))
        for name, fwd, bwd in parts:
            both = [f + b for f, b in zip(fwd, bwd)]
            shares = [a / t for a, t in zip(both, self.total_ms) if t > 0]
            out.update({f"{name}_ms": med(both), f"{name}_fwd_ms": med(fwd), f"{name}_bwd_ms": med(bwd),
                        f"{name}_share": med(shares) if shares else None})
        return out


def _time_steps(step, steps: int, device: torch.device, swap: AttnSwap, recurrences: bool = False) -> Steps:
    cuda = device.type == "cuda"
    out = Steps(total_ms=[], attn_fwd_ms=[], attn_bwd_ms=[], first=None, rec_fwd_ms=[] if recurrences else None,
                rec_bwd_ms=[] if recurrences else None)
    watch = None if cuda else cpu_load.Preemptions()
    swap.reset()
    seen = (0.0, 0.0)
    seen_rec = (0.0, 0.0)
    for i in range(steps):
        with nvtx_range(f"step{i}", cuda and swap.nvtx_wanted):
            if cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                result = step()
                end.record()
                torch.cuda.synchronize(device)
                out.total_ms.append(start.elapsed_time(end))
            else:
                before = watch.before()
                t0 = time.perf_counter()
                result = step()
                out.total_ms.append((time.perf_counter() - t0) * 1e3)
                watch.after(before)
        fwd, bwd = swap.attention_ms()  # since the reset: this step's share is the difference
        out.attn_fwd_ms.append(fwd - seen[0])
        out.attn_bwd_ms.append(bwd - seen[1])
        seen = (fwd, bwd)
        if recurrences:
            fwd, bwd = swap.recurrence_ms()
            out.rec_fwd_ms.append(fwd - seen_rec[0])
            out.rec_bwd_ms.append(bwd - seen_rec[1])
            seen_rec = (fwd, bwd)
        if out.first is None:
            out.first = result
        del result
    if watch is not None:
        out.cpu = watch.info(sum(out.total_ms))
    return out


def run_e2e(cfg: E2EConfig, *, run_id: str, env_id: str | None = None,
            sink: Callable[[Record], None] = lambda r: None, workload: Workload | None = None) -> list[Record]:
    """Run every backend of ``cfg`` on one model; each Record goes to ``sink`` as soon as it exists."""
    device = torch.device(cfg.device)
    work = workload or build_workload(cfg)
    records, ref_out, ref_ms = [], None, None
    for name in cfg.backends:
        record, out = _run_backend(cfg, name, work, device, run_id, env_id)
        if out is not None:
            e2e = record.info["e2e"]
            if ref_out is None:
                ref_out, ref_ms = out, record.median_ms
            e2e["cosine"], e2e["rel_l1"] = deviation(out, ref_out)
            e2e["speedup"] = ref_ms / record.median_ms if record.median_ms else None
            e2e["reference_backend"] = cfg.backends[0]
        del out
        sink(record)
        records.append(record)
    return records


def _run_backend(cfg: E2EConfig, name: str, work: Workload, device: torch.device, run_id: str,
                 env_id: str | None) -> tuple[Record, torch.Tensor | None]:
    pass_ = "fwd_bwd" if cfg.mode == "train" else "fwd"
    base = dict(run_id=run_id, backend=name, timing_mode="e2e", device=str(device), env_id=env_id, seed=cfg.seed)
    e2e: dict = {"model": cfg.model, "mode": cfg.mode, "layers": cfg.layers, "steps": cfg.steps}
    hybrid = cfg.recurrence is not None
    recurrence = {"recurrence": cfg.recurrence} if hybrid else {}
    e2e.update(recurrence)
    swap = None
    try:
        swap = AttnSwap(name, timed=True, options=cfg.backend_options.get(name), **recurrence)
        spec = attention_spec(cfg)
        # what this backend's step adds to what is allocated now (the model, the first backend's output)
        need = memory.workspace_bytes(spec, swap.backend) + estimate(cfg).activations
        if need > (memory.available_bytes(device) or float("inf")):
            free = memory.format_bytes(memory.available_bytes(device))
            return Record(spec=spec, status="oom", info={"e2e": e2e}, **base, reason=(
                f"a step needs about {memory.format_bytes(need)} beyond the model (its attention's score "
                f"matrices {memory.format_bytes(memory.workspace_bytes(spec, swap.backend))}, activations), "
                f"{free} free (estimated; not run)")), None
        with swap:
            for _ in range(cfg.warmup):
                work.step()
            timed = _time_steps(work.step, cfg.steps, device, swap, recurrences=hybrid)
        if cfg.kernel_counts:  # its own swap: the profiled step must not add to the counted calls
            with AttnSwap(name, timed=False, options=cfg.backend_options.get(name), **recurrence):
                e2e["kernel_counts"] = profile_step(work.step, device)
    except BackendUnavailable as exc:
        return Record(spec=_spec(swap, pass_, cfg), status="unsupported", reason=str(exc), info={"e2e": e2e}, **base), None
    except torch.OutOfMemoryError as exc:
        return Record(spec=_spec(swap, pass_, cfg), status="oom", reason=str(exc).splitlines()[0][:400],
                      info={"e2e": e2e}, **base), None
    except Exception as exc:  # a failing backend is a result, not the end of the comparison
        log.debug("e2e backend %s failed", name, exc_info=True)
        reason = f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:400]}"
        return Record(spec=_spec(swap, pass_, cfg), status="error", reason=reason, info={"e2e": e2e}, **base), None
    samples, out = timed.total_ms, timed.first
    stats = summarize(samples)
    total = stats["median_ms"]
    calls = swap.calls / cfg.steps
    spec = _spec(swap, pass_, cfg)
    attn_flop = sum(metrics.flops(s, pass_) * n for s, n in swap.shapes.items()) / cfg.steps
    e2e.update(timed.median_step(), calls=calls, expected_calls=work.expected_calls,
               unrouted=swap.unrouted / cfg.steps, functional=swap.how, shapes=len(swap.shapes))
    e2e["attn_tflops"] = metrics.tflops_per_s(attn_flop, e2e["attn_ms"]) if e2e["attn_ms"] else None
    status, reason = "ok", None
    if swap.unrouted or calls != work.expected_calls:
        status, reason = "error", (f"{swap.unrouted / cfg.steps:g} attention calls per step bypassed the swap; "
                                   f"{calls:g} routed of {work.expected_calls} expected")
    if hybrid:
        rec_calls = swap.recurrence_calls / cfg.steps
        rec_flop = sum(linear_metrics.flops(s) * n for s, n in swap.recurrence_shapes.items()) / cfg.steps
        common = swap.recurrence_shapes.most_common(1)
        e2e.update(recurrence_calls=rec_calls, expected_recurrence_calls=work.expected_recurrence_calls,
                   recurrence_call=common[0][0].label() if common else None,
                   recurrence_version=swap.recurrence_backend.version(),
                   recurrence_tflops=metrics.tflops_per_s(rec_flop, e2e["recurrence_ms"])
                   if e2e["recurrence_ms"] else None)
        if rec_calls != work.expected_recurrence_calls and status == "ok":
            status, reason = "error", (f"{rec_calls:g} recurrence calls per step routed of "
                                       f"{work.expected_recurrence_calls} expected")
    info = swap.backend.base_info() | {"e2e": e2e} | ({"cpu": timed.cpu} if timed.cpu else {})
    nan = not bool(torch.isfinite(out).all())
    if nan:
        status, reason = "nan", "non-finite values in the model output"
    return Record(spec=spec, status=status, reason=reason, info=info, samples_ms=samples, **stats,
                  iters_per_s=1e3 / total if total else None, **base), (None if nan else out)


def _spec(swap: AttnSwap | None, pass_: str, cfg: E2EConfig) -> AttnSpec:
    """The most frequent attention call of the run; when nothing was called (a hybrid model cut to its first GDN
    layers, a failure before the first call), the call the model would make."""
    if swap is not None and swap.shapes:
        return swap.shapes.most_common(1)[0][0].replace(pass_=pass_)
    if swap is not None and swap.last_spec is not None:
        return swap.last_spec.replace(pass_=pass_)
    try:
        return attention_spec(cfg).replace(pass_=pass_)
    except ValueError:  # a shape no attention call can take
        return AttnSpec(batch=1, seqlens_q=(1,), heads_q=1, head_dim=1, dtype="fp32", pass_=pass_)
