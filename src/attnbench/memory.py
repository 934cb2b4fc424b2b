"""Memory guard: skip a case that cannot fit in free device memory instead of running it into an OOM.

The estimate is deliberately simple and errs low (a case the guard lets through may still run out of
memory; that real OOM is caught by the runner as before). For one call of a case, in bytes:

- inputs: q, k, v and dout in the case's dtype;
- copies: the keys and values a backend writes out when it prepares (a shared prefix put in front of every
  request's keys for a kernel that takes none; a paged cache). They are the backend's own, so the guard counts
  them with what a case needs beyond the shared inputs;
- outputs: out, plus the fp32 log-sum-exp (4 bytes per query row and head);
- grads (bwd and fwd_bwd): dq, dk, dv, the size of q, k, v;
- workspace: what the backend allocates beyond that. Backends that materialise the score matrix
  (``naive``, ``sdpa-math``) need Hq·Sq·Sk·bytes per sequence (B·Hq·Sq·Sk for a dense batch: one
  batched matmul), times the score-sized tensors alive at once (``SCORE_COPIES``, measured): ``naive``
  2 in a forward (scores and probabilities; 2.1 seen) and 3 in a backward (3.2 seen); ``sdpa-math``
  computes fp16/bf16 inputs in fp32 (ATen's math path upcasts them) and holds 3 fp32 copies in a forward
  (2.5 seen) and 4 in a backward (3.1 seen) — peak RSS on a CPU, bf16, H = 8, S = 4096, causal. On a CPU
  an out-of-memory is no exception but the kernel's OOM killer ending the process, so these are not
  rounded down.
  A varlen forward needs only the largest sequence's scores (they are freed one by one); a varlen
  backward keeps every sequence's. Fused kernels need O(inputs) and get no workspace. A backend can
  declare its own by defining ``workspace_bytes(spec) -> int``.

Free memory = ``torch.cuda.mem_get_info`` free bytes + memory PyTorch's caching allocator holds but
does not use; on the CPU, the host's available memory (``MemAvailable`` of /proc/meminfo, else the
free physical pages); where neither can be read the guard does not act.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from attnbench.metrics import kv_tokens
from attnbench.spec import AttnSpec

SCORE_MATERIALIZING = ("naive", "sdpa-math")
"""Backends whose default workspace is the full score matrix (unless they define workspace_bytes)."""
SCORE_COPIES = {"naive": (2, 3), "sdpa-math": (3, 4)}
"""Score-sized tensors alive at once (forward, backward), per backend: see the module doc."""
FP32_SCORES = ("sdpa-math",)
"""Backends that compute 16-bit inputs' scores in fp32."""
BACKWARD_SCORE_COPIES = 3
"""Score-sized tensors alive at once in a backward of another materialising backend: scores, probabilities,
their gradient."""
LSE_BYTES = 4


@dataclass(frozen=True, kw_only=True)
class MemoryEstimate:
    """Bytes one call of a case needs on the device, by kind."""

    inputs: int
    """q, k, v and dout."""
    outputs: int
    """out and the fp32 LSE."""
    grads: int
    """dq, dk, dv (0 for fwd)."""
    workspace: int
    """Backend-specific temporaries (e.g. the score matrix)."""
    copies: int = 0
    """Keys and values the backend writes out beside the inputs when it prepares: a shared prefix put in front
    of every request's keys for a kernel that takes none, a paged cache."""

    @property
    def total(self) -> int:
        return self.inputs + self.outputs + self.grads + self.workspace + self.copies

    @property
    def beyond_inputs(self) -> int:
        """What the case needs once its inputs exist (inputs are shared by the backends of a shape; the copies a
        backend makes of them are its own)."""
        return self.total - self.inputs


def _tokens(spec: AttnSpec) -> tuple[int, int]:
    seqs = spec.sequences
    return sum(s for s, _ in seqs), sum(s for _, s in seqs)


def score_bytes(spec: AttnSpec, elem: int | None = None, copies: tuple[int, int] = (1, BACKWARD_SCORE_COPIES)) -> int:
    """Bytes of the score matrices one call materialises (see module doc); ``copies``: score-sized tensors
    alive at once in a forward and in a backward."""
    elem = elem or spec.torch_dtype.itemsize
    per_seq = [spec.heads_q * sq * sk * elem for sq, sk in spec.sequences]
    backward = spec.pass_ != "fwd"
    if not spec.is_varlen:
        scores = sum(per_seq)  # one batched matmul holds every sequence's scores
    else:
        scores = sum(per_seq) if backward else max(per_seq)
    return scores * copies[1 if backward else 0]


def workspace_bytes(spec: AttnSpec, backend) -> int:
    """The backend's declared workspace, or the default rule of the module doc."""
    declared = getattr(backend, "workspace_bytes", None)
    if callable(declared):
        return int(declared(spec))
    name = getattr(backend, "name", "")
    if name not in SCORE_MATERIALIZING:
        return 0
    extra = 0
    if spec.gqa:  # K and V are expanded to the query heads first: a varlen case's one request at a time (each
        # request's copy freed with it in a forward, kept for the backward), as its scores are
        per_seq = [sk * spec.heads_q * (spec.head_dim + spec.head_dim_v) * spec.torch_dtype.itemsize
                   for _, sk in spec.sequences]
        extra = max(per_seq) if spec.is_varlen and spec.pass_ == "fwd" else sum(per_seq)
    elem = 4 if name in FP32_SCORES and spec.torch_dtype.itemsize < 4 else spec.torch_dtype.itemsize
    return score_bytes(spec, elem, SCORE_COPIES[name]) + extra


def estimate(spec: AttnSpec, backend=None) -> MemoryEstimate:
    """Device bytes of one call of ``spec`` on ``backend`` (None = a fused kernel, no workspace)."""
    elem, kv_elem = spec.torch_dtype.itemsize, spec.kv_torch_dtype.itemsize
    tq, tk = _tokens(spec)
    caps = getattr(backend, "capabilities", None)
    copied = 0  # key/value tokens the backend writes out in prepare, beside the inputs
    if spec.shared_prefix:  # the inputs store it once; a backend that takes no prefix gets every request's keys
        copied = tk if backend is not None and not caps.shared_prefix else 0  # written out (inputs.expanded)
        tk = kv_tokens(spec)
    if caps is not None and caps.paged:  # the cache a paged kernel builds beside the inputs
        copied += kv_tokens(spec)
    q = tq * spec.heads_q * spec.head_dim * elem
    k = tk * spec.heads_kv * spec.head_dim * kv_elem
    v = tk * spec.heads_kv * spec.head_dim_v * kv_elem
    out = tq * spec.heads_q * spec.head_dim_v * spec.out_dtype.itemsize
    kept = 2 * (q + k + v) if spec.is_fp8 else 0  # fp8 inputs keep their bf16 originals (inputs.unquantized)
    if spec.kv_dtype is not None:  # an fp8 cache keeps its bf16 keys and values (inputs.unquantized)
        kept = 2 * kv_tokens(spec) * spec.heads_kv * (spec.head_dim + spec.head_dim_v)
    return MemoryEstimate(inputs=q + k + v + out + kept, outputs=out + tq * spec.heads_q * LSE_BYTES,
                          grads=(q + k + v) if spec.pass_ != "fwd" else 0,
                          workspace=workspace_bytes(spec, backend) if backend is not None else 0,
                          copies=copied * spec.heads_kv * (spec.head_dim + spec.head_dim_v) * kv_elem)


def host_available_bytes() -> int | None:
    """Host memory available to a new allocation without swapping; None where it cannot be read."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def available_bytes(device: str | torch.device) -> int | None:
    """Bytes a new allocation can get on ``device``; None where unknown."""
    device = torch.device(device)
    if device.type == "cpu":
        return host_available_bytes()
    if device.type != "cuda" or not torch.cuda.is_available():  # a plan made for a GPU this process cannot see
        return None
    free, _total = torch.cuda.mem_get_info(device)
    cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return int(free) + max(int(cached), 0)


def format_bytes(n: float) -> str:
    """1.5 GiB, 12.0 MiB, 512 B (binary units)."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def guard(spec: AttnSpec, backend, device: str | torch.device, *, inputs_allocated: bool = True) -> str | None:
    """Why the case cannot fit (a reason for status "oom"), or None to run it.

    With ``inputs_allocated`` the inputs already sit on the device, so only the rest must fit.
    """
    est = estimate(spec, backend)
    return too_big(est.beyond_inputs if inputs_allocated else est.total, device)


def too_big(need: float, device: str | torch.device, *, rough: bool = False) -> str | None:
    """The "oom" reason of a case estimated to need ``need`` bytes when ``device`` has less free (None when it
    fits or the free memory is unknown); ``rough``: an estimate by a rule of thumb ("needs about")."""
    free = available_bytes(device)
    if free is None or need <= free:
        return None
    return f"needs {'about ' * rough}{format_bytes(need)}, {format_bytes(free)} free (estimated; not run)"


