"""The accuracy checker the runner calls on the first (untimed) call of every case.

``AccuracyChecker()(spec, inputs, outputs, backend)`` returns the ``Record.accuracy`` dict::

    {"verdict": "pass" | "fail" | "approx-pass" | "approx-fail", "exact": bool,
     "reason": "...",                      # when the verdict is not a pass
     "reference": "fp64 cpu, blocked",     # how the reference was computed
     "tensors":  {"out": {max_abs, mean_abs, rel_l2, cosine, rel_l1, rmse, nonfinite, ...}, "dq": ...},
     "baseline": {"out": {...}, ...},      # the math baseline's metrics (exact backends)
     "limits":   {"out": {"max_abs": limit, ...}, ...},
     "worst":    {"tensor": "dk", "metric": "rel_l2", "ratio": 0.45},  # closest to its limit
     "unquantized": {"reference": "...", "tensors": {...}}}   # fp8 cases only (below)

**FP8 inputs** (``spec.is_fp8``): the kernel is judged against the exact attention of the dequantized
inputs (stored x descale, ``inputs.dequantized``), with the approximate thresholds whatever the backend
(an fp8 kernel also rounds its probabilities to e4m3 by design), and no math baseline (PyTorch has no
fp8 matmul). ``unquantized`` gives its error against the exact attention of the bf16 inputs before
quantization: what choosing fp8 over bf16 costs, reported, not judged.

The exact reference and the math baseline depend on the case but not on the pass or the backend,
so they are computed once per (spec without its pass, seed, device, inputs) and cached; the cache
holds ``cache_size`` entries (references of long sequences are large). Backends must return ``lse``
as the natural-log log-sum-exp, (B, Hq, Sq) dense or (Hq, Tq) varlen; another shape is reported as
a shape error for ``lse`` only if the backend returns one at all.

**Poisoning** (``poison``): a kernel that forgets to write some output elements returns whatever
its memory held before. Nearly every kernel allocates its outputs through torch's CUDA caching
allocator, which reuses freed blocks without clearing them. So right before the checked call the
runner calls ``poison``: it releases the unused cached memory (``empty_cache``), allocates one large
block, fills it with 0xFF bytes — a NaN in fp32, fp16, bf16, fp64 and fp8 alike — and frees it
again. The kernel's output allocations are then carved out of that NaN block, and any element it
never writes stays NaN, which the runner reports as status ``nan``. Limits: allocations under 1 MiB
come from the allocator's separate small-block pool and are not poisoned; a free block that fits
better inside a partly used segment is preferred over the poisoned one; cached blocks belong to the
stream that freed them, so a kernel allocating on another stream does not get the poisoned block;
kernels that allocate with their own allocator (or under ``expandable_segments``) may not see it. On the CPU there is no poisoning:
the comparison with the reference catches unwritten elements unless the garbage happens to match.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass

import torch

from attnbench import features, operators
from attnbench.accuracy.baseline import math_baseline
from attnbench.accuracy.compare import compare
from attnbench.accuracy.reference import BlockSizes, Reference, compute_dtype_for, reference_attention
from attnbench.accuracy.tolerance import Tolerance, judge
from attnbench.backends.base import Backend, Outputs
from attnbench.inputs import AttnInputs, dequantized
from attnbench.outputs import grad_name
from attnbench.spec import AttnSpec

log = logging.getLogger(__name__)

POISON_MIN_BYTES = 256 * 2 ** 20


@dataclass
class Expected:
    """Cached per case: the exact reference and the math baseline's metrics against it."""

    reference: Reference
    baseline: dict[str, dict]
    label: str
    grads: bool
    unquantized: Reference | None = None
    """FP8 cases: the exact reference of the bf16 inputs before quantization."""


def worst_request(spec: AttnSpec, inputs: AttnInputs, out: torch.Tensor, ref: torch.Tensor) -> dict:
    """The sequence (a serving batch's request) whose output is furthest from the reference: its index, new
    tokens, keys and largest absolute error."""
    if inputs.varlen:
        bounds = inputs.cu_seqlens_q.tolist()
        errors = [float((out[a:b].double() - ref[a:b].double()).abs().max()) if b > a else 0.0
                  for a, b in zip(bounds[:-1], bounds[1:])]
    else:
        errors = (out.double() - ref.double()).abs().flatten(1).amax(dim=1).tolist()
    i = max(range(len(errors)), key=lambda j: (errors[j] != errors[j], errors[j]))  # NaN counts as worst
    sq, sk = spec.sequences[i]
    return {"index": i, "new": sq, "keys": sk, "max_abs": errors[i]}


class AccuracyChecker:
    """Callable ``runner.Checker``: exact reference, math baseline, metrics and verdict per case."""

    def __init__(self, *, tolerance: Tolerance | None = None, blocks: BlockSizes | None = None,
                 cache_size: int = 2, grads_ahead: bool = False):
        self.tolerance = tolerance or Tolerance()
        self.blocks = blocks
        self.cache_size = max(1, cache_size)
        self.grads_ahead = grads_ahead
        """Compute the gradients of the reference at its first use even for a forward case: a sweep
        with both passes would otherwise compute the forward reference twice per shape."""
        self._cache: OrderedDict[tuple, Expected] = OrderedDict()

    # ---- the Checker call ----------------------------------------------------------------------
    def __call__(self, spec: AttnSpec, inputs: AttnInputs, outputs: Outputs, backend: Backend) -> dict:
        op = operators.of(spec)
        if hasattr(op, "check"):  # an operator judged otherwise (a selection)
            return op.check(spec, inputs, outputs, backend)
        grads = spec.pass_ != "fwd"
        expected = self.expected(spec, inputs, grads=grads)
        got = outputs.tensors()
        if op.name == "attention":
            wanted = ("out", "dq", "dk", "dv", *map(grad_name, features.grad_names(spec))) if grads else ("out",)
        else:  # another operator: the tensors it names for the pass
            wanted = op.wanted(spec)
        missing = tuple(name for name in wanted if name not in got)
        metrics = compare(got, expected.reference.tensors(), op.layouts(spec))
        exact = backend.judged_exactly(spec)
        verdict = judge(metrics, expected.baseline if exact else None, spec.dtype, exact=exact,
                        missing=missing, tol=self.tolerance,
                        reduction=op.reduction(spec), correlated=getattr(op, "correlated", lambda _: {})(spec))
        result = {"verdict": verdict["verdict"], "exact": exact, "reference": expected.label, "tensors": metrics}
        if exact:  # the LSE is held to the reference alone (tolerance.py), so no baseline is shown for it
            result["baseline"] = {k: v for k, v in expected.baseline.items() if k in metrics and k != "lse"}
        result["limits"] = verdict.get("limits", {})
        if "worst" in verdict:
            result["worst"] = verdict["worst"]
        if "reason" in verdict:
            result["reason"] = verdict["reason"]
        if op.name == "attention" and len(spec.sequences) > 1 and "out" in got and got["out"].shape == expected.reference.out.shape:
            result["worst_request"] = worst_request(spec, inputs, got["out"], expected.reference.out)
        if expected.unquantized is not None:
            result["unquantized"] = {"reference": f"{expected.label} of the bf16 inputs before quantization",
                                     "tensors": compare(got, expected.unquantized.tensors(), op.layouts(spec))}
        return result

    # ---- reference and baseline, cached --------------------------------------------------------
    def expected(self, spec: AttnSpec, inputs: AttnInputs, *, grads: bool) -> Expected:
        """Reference and baseline metrics of the case (computed once, reused across passes/backends)."""
        key = (spec.replace(pass_="fwd"), inputs.seed, str(inputs.q.device), inputs.q.data_ptr())
        entry = self._cache.get(key)
        if entry is not None and (entry.grads or not grads):
            self._cache.move_to_end(key)
            return entry
        self._cache.pop(key, None)
        while len(self._cache) >= self.cache_size:
            self._cache.popitem(last=False)  # free the oldest reference before computing a new one
        entry = self._compute(spec, inputs, grads or self.grads_ahead)
        self._cache[key] = entry
        return entry

    def _compute(self, spec: AttnSpec, inputs: AttnInputs, grads: bool) -> Expected:
        op = operators.of(spec)
        if op.name != "attention":
            return op.expected(spec, inputs, grads=grads, blocks=self.blocks)
        device = inputs.q.device
        dtype = compute_dtype_for(device, spec.out_dtype if spec.quantized else inputs.q.dtype)
        label = f"{str(dtype).removeprefix('torch.')} {device.type}, blocked online softmax"
        if spec.quantized:  # judged approximately against the dequantized inputs; no fp8 math to compare with
            ref = reference_attention(spec, dequantized(inputs, dtype), grads=grads, dtype=dtype, blocks=self.blocks)
            unquantized = reference_attention(spec, inputs.unquantized, grads=grads, dtype=dtype, blocks=self.blocks)
            return Expected(reference=ref, baseline={}, label=f"{label}, dequantized inputs", grads=grads,
                            unquantized=unquantized)
        ref = reference_attention(spec, inputs, grads=grads, dtype=dtype, blocks=self.blocks)
        base = math_baseline(spec, inputs, grads=grads)
        baseline = compare(base, ref.tensors())
        del base
        log.debug("reference for %s: %s", spec.label(), label)
        return Expected(reference=ref, baseline=baseline, label=label, grads=grads)

    def clear(self) -> None:
        self._cache.clear()

    # ---- poisoning (see the module docstring) ----------------------------------------------------
    def poison(self, spec: AttnSpec, device: torch.device | str) -> int:
        """Leave a large NaN-filled free block in the CUDA caching allocator; returns its size (0 on CPU)."""
        device = torch.device(device)
        if device.type != "cuda":
            return 0
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()  # only the poisoned block should be free to serve the next allocations
        free, _total = torch.cuda.mem_get_info(device)
        op = operators.of(spec)
        io = io_bytes(spec) if op.name == "attention" else int(op.bytes_moved(spec))
        nbytes = min(max(POISON_MIN_BYTES, 4 * io), free // 2)
        if nbytes <= 0:
            return 0
        block = torch.empty(nbytes, dtype=torch.uint8, device=device)
        block.fill_(0xFF)
        del block  # back to the allocator's cache, still holding 0xFF bytes
        return nbytes


def io_bytes(spec: AttnSpec) -> int:
    """Bytes of q, k, v, out and their gradients of a case in its dtype."""
    tq = sum(s for s, _ in spec.sequences)
    tk = sum(s for _, s in spec.sequences)
    elems = tq * spec.heads_q * (spec.head_dim + spec.head_dim_v) + tk * spec.heads_kv * (spec.head_dim + spec.head_dim_v)
    return 2 * elems * spec.torch_dtype.itemsize
