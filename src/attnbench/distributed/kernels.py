"""Local attention kernels that return the log-sum-exp, the building block of context parallelism.

Interface (every kernel, every device)::

    fwd(q, k, v, causal, scale) -> (out, lse)
    bwd(dout, q, k, v, out, lse, causal, scale) -> (dq, dk, dv)

Layout: q, dout and out are ``(B, Sq, Hq, D)`` (bshd), k and v ``(B, Sk, Hkv, D)``; ``lse`` is
``(B, Hq, Sq)`` in fp32 (fp64 for fp64 inputs), the natural log of the softmax denominator of each
query row (scale applied). ``out`` has the input dtype. ``bwd`` may be handed the *global* ``out``
and ``lse`` of a query block merged over many key blocks: it then returns that key block's share of
the gradients, which is what ring attention sums.

``causal`` means the diagonal block (queries and keys of the same chunk, ``Sq == Sk``); blocks off
the diagonal are computed in full or skipped by the caller, so no kernel needs a mask offset.

Kernels without native GQA get K/V heads repeated before the call and dK/dV summed over the group.
A kernel that cannot return the LSE cannot take part in a ring merge and is refused by name.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from attnbench.distributed import timeline
from attnbench.distributed.names import KERNELS, canonical

Fwd = Callable[..., tuple[torch.Tensor, torch.Tensor]]
Bwd = Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]

# Kernels people may ask for that cannot be merged across blocks (no LSE), with the reason.
NO_LSE = {
    "sdpa": "torch.nn.functional.scaled_dot_product_attention returns only the output, not the log-sum-exp",
    "naive": "the naive backend returns only the output, not the log-sum-exp",
    "naive-scale-scores": "the naive backend returns only the output, not the log-sum-exp",
    "sage": "SageAttention is forward-only and returns no log-sum-exp",
}


class KernelUnavailable(ValueError):
    """The kernel cannot run here (missing package, device, dtype) or cannot return an LSE."""


@dataclass(frozen=True, kw_only=True)
class LocalKernel:
    """One local kernel behind the fwd/bwd interface of this module."""

    name: str
    """Name used on the command line (``KERNELS``: the backends' own names)."""
    fwd: Fwd
    """(q, k, v, causal, scale) -> (out bshd, lse (B, H, S) fp32)."""
    bwd: Bwd
    """(dout, q, k, v, out, lse, causal, scale) -> (dq, dk, dv), bshd."""
    devices: tuple[str, ...] = ("cuda",)
    """Device types the kernel runs on."""
    dtypes: tuple[str, ...] = ("fp16", "bf16")
    """Input dtypes accepted."""
    description: str = ""
    """What runs underneath (recorded)."""

    def reason(self, device: str | torch.device, dtype: str) -> str | None:
        """None if the kernel can run on ``device`` with ``dtype``, else why not."""
        dev = torch.device(device).type
        if dev not in self.devices:
            return f"kernel {self.name} runs on {'/'.join(self.devices)}, not {dev}"
        if dtype not in self.dtypes:
            return f"kernel {self.name} takes {', '.join(self.dtypes)}, not {dtype}"
        return None


# ---- helpers ------------------------------------------------------------------------------------
def _bhsd(*tensors: torch.Tensor) -> list[torch.Tensor]:
    """bshd -> (B, H, S, D) views of contiguous tensors (no copy for contiguous bshd inputs)."""
    return [t.contiguous().transpose(1, 2) for t in tensors]


def _expand(t: torch.Tensor, groups: int) -> torch.Tensor:
    return t if groups == 1 else t.repeat_interleave(groups, dim=2)


def _reduce(t: torch.Tensor, groups: int) -> torch.Tensor:
    if groups == 1:
        return t
    b, s, h, d = t.shape
    return t.view(b, s, h // groups, groups, d).sum(dim=3)


def with_gqa(fwd: Fwd, bwd: Bwd) -> tuple[Fwd, Bwd]:
    """Wrap an equal-heads kernel: repeat K/V heads before the call, sum dK/dV over each group."""

    def gfwd(q, k, v, causal, scale):
        g = q.shape[2] // k.shape[2]
        return fwd(q, _expand(k, g), _expand(v, g), causal, scale)

    def gbwd(dout, q, k, v, out, lse, causal, scale):
        g = q.shape[2] // k.shape[2]
        dq, dk, dv = bwd(dout, q, _expand(k, g), _expand(v, g), out, lse, causal, scale)
        return dq, _reduce(dk, g), _reduce(dv, g)

    return gfwd, gbwd


def _lse_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


# ---- exact math kernel (every device, every dtype) ----------------------------------------------
def _scores(q, k, causal, scale, acc):
    s = torch.matmul(q.transpose(1, 2).to(acc), k.transpose(1, 2).to(acc).transpose(-2, -1)) * scale
    if causal:
        keep = torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).tril()
        s = s.masked_fill(~keep, float("-inf"))
    return s


def math_fwd(q, k, v, causal, scale):
    """Exact attention in fp32 (fp64 for fp64 inputs): scores, logsumexp, softmax, matmul."""
    acc = _lse_dtype(q.dtype)
    g = q.shape[2] // k.shape[2]
    s = _scores(q, _expand(k, g), causal, scale, acc)
    lse = torch.logsumexp(s, dim=-1)
    out = torch.matmul(torch.exp(s - lse.unsqueeze(-1)), _expand(v, g).transpose(1, 2).to(acc))
    return out.transpose(1, 2).to(q.dtype), lse


def math_bwd(dout, q, k, v, out, lse, causal, scale):
    """Gradients of one block given the (possibly global) out and lse of its query rows."""
    acc = _lse_dtype(q.dtype)
    g = q.shape[2] // k.shape[2]
    ke, ve = _expand(k, g).transpose(1, 2).to(acc), _expand(v, g).transpose(1, 2).to(acc)
    qh, doh = q.transpose(1, 2).to(acc), dout.transpose(1, 2).to(acc)
    p = torch.exp(_scores(q, _expand(k, g), causal, scale, acc) - lse.to(acc).unsqueeze(-1))
    delta = (doh * out.transpose(1, 2).to(acc)).sum(-1, keepdim=True)
    dv = torch.matmul(p.transpose(-2, -1), doh)
    ds = p * (torch.matmul(doh, ve.transpose(-2, -1)) - delta)
    dq = torch.matmul(ds, ke) * scale
    dk = torch.matmul(ds.transpose(-2, -1), qh) * scale
    back = [t.transpose(1, 2).to(q.dtype) for t in (dq, dk, dv)]
    return back[0], _reduce(back[1], g), _reduce(back[2], g)


# ---- aten SDPA ops that return the LSE ----------------------------------------------------------
def cpu_flash_fwd(q, k, v, causal, scale):
    qh, kh, vh = _bhsd(q, k, v)
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(qh, kh, vh, 0.0, causal, scale=scale)
    return out.transpose(1, 2), lse


def cpu_flash_bwd(dout, q, k, v, out, lse, causal, scale):
    doh, qh, kh, vh, oh = _bhsd(dout, q, k, v, out)
    dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
        doh, qh, kh, vh, oh, lse.contiguous(), 0.0, causal, scale=scale)
    return dq.transpose(1, 2), dk.transpose(1, 2), dv.transpose(1, 2)


class _AtenCuda:
    """Adapters for the CUDA SDPA ops; keeps the last forward's RNG outputs for the backward."""

    def __init__(self):
        self.philox: tuple = (None, None)
        self.lse_4d = False

    def flash_fwd(self, q, k, v, causal, scale):
        qh, kh, vh = _bhsd(q, k, v)
        res = torch.ops.aten._scaled_dot_product_flash_attention(qh, kh, vh, 0.0, causal, False, scale=scale)
        self.philox = (res[6], res[7])
        return res[0].transpose(1, 2), res[1]

    def flash_bwd(self, dout, q, k, v, out, lse, causal, scale):
        doh, qh, kh, vh, oh = _bhsd(dout, q, k, v, out)
        seed, offset = self._philox(q)
        grads = torch.ops.aten._scaled_dot_product_flash_attention_backward(
            doh, qh, kh, vh, oh, lse.contiguous(), None, None, q.shape[1], k.shape[1], 0.0, causal, seed, offset,
            scale=scale)
        return tuple(t.transpose(1, 2) for t in grads[:3])

    def efficient_fwd(self, q, k, v, causal, scale):
        qh, kh, vh = _bhsd(q, k, v)
        out, lse, seed, offset = torch.ops.aten._scaled_dot_product_efficient_attention(
            qh, kh, vh, None, True, 0.0, causal, scale=scale)
        self.philox = (seed, offset)
        return out.transpose(1, 2), lse[..., : q.shape[1]]  # the LSE is padded to a multiple of 32 rows

    def efficient_bwd(self, dout, q, k, v, out, lse, causal, scale):
        doh, qh, kh, vh, oh = _bhsd(dout, q, k, v, out)
        rows = -(-q.shape[1] // 32) * 32
        lse = F.pad(lse.float(), (0, rows - lse.shape[-1])).contiguous()
        seed, offset = self._philox(q)
        grads = torch.ops.aten._scaled_dot_product_efficient_attention_backward(
            doh, qh, kh, vh, None, oh, lse, seed, offset, 0.0, [True, True, True, False], causal, scale=scale)
        return tuple(t.transpose(1, 2) for t in grads[:3])

    def cudnn_fwd(self, q, k, v, causal, scale):
        qh, kh, vh = _bhsd(q, k, v)
        res = torch.ops.aten._scaled_dot_product_cudnn_attention(qh, kh, vh, None, True, 0.0, causal, False,
                                                                 scale=scale)
        out, lse = res[0], res[1]
        self.philox, self.lse_4d = (res[6], res[7]), lse.dim() == 4
        return out.transpose(1, 2), lse.squeeze(-1) if lse.dim() == 4 else lse

    def cudnn_bwd(self, dout, q, k, v, out, lse, causal, scale):
        doh, qh, kh, vh, oh = _bhsd(dout, q, k, v, out)
        lse = lse.float().contiguous()
        seed, offset = self._philox(q)
        grads = torch.ops.aten._scaled_dot_product_cudnn_attention_backward(
            doh, qh, kh, vh, oh, lse.unsqueeze(-1) if self.lse_4d else lse, seed, offset, None, None, None,
            q.shape[1], k.shape[1], 0.0, causal, scale=scale)
        return tuple(t.transpose(1, 2) for t in grads[:3])

    def _philox(self, like: torch.Tensor):
        seed, offset = self.philox
        if seed is None:  # no forward yet in this process: dropout is 0, the values are never read
            seed = offset = torch.zeros((), dtype=torch.int64, device=like.device)
        return seed, offset


# ---- flash-attn 2, 3 and 4 (optional packages) -----------------------------------------------------
def _call_with(fn, values: dict, positional: tuple = ()):
    """Call ``fn`` passing only the keyword arguments its signature names (signatures move across versions).

    A ``torch.library.custom_op`` (flash-attn >= 2.7 registers its low-level ops so) shows only
    ``(*args, **kwargs)``; its wrapped function (``_init_fn``) has the real signature."""
    params = inspect.signature(getattr(fn, "_init_fn", fn)).parameters
    missing = [n for n, p in list(params.items())[len(positional):]
               if p.default is inspect.Parameter.empty and n not in values
               and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if missing:
        raise KernelUnavailable(f"{fn.__module__}.{fn.__name__} needs arguments this adapter does not know: "
                                f"{', '.join(missing)}")
    return fn(*positional, **{k: v for k, v in values.items() if k in params and k not in
                              list(params)[:len(positional)]})


def _fa2_kernel() -> LocalKernel:
    try:
        from flash_attn import flash_attn_interface as fai
    except ImportError as exc:
        raise KernelUnavailable(f"kernel fa2 needs flash-attn 2 (pip install flash-attn): {exc}") from None
    from attnbench.backends.fa2 import PLAIN_ARGS
    common = dict(PLAIN_ARGS)

    def fwd(q, k, v, causal, scale):
        res = _call_with(fai._flash_attn_forward, {**common, "softmax_scale": scale, "causal": causal,
                                                   "return_softmax": False}, (q, k, v))
        out, lse = (res[0], res[1]) if len(res) == 4 else (res[0], res[5])  # 2.6+: 4 outputs; older: 8
        return out, lse

    def bwd(dout, q, k, v, out, lse, causal, scale):
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        _call_with(fai._flash_attn_backward, {**common, "softmax_scale": scale, "causal": causal, "dq": dq,
                                              "dk": dk, "dv": dv}, (dout, q, k, v, out, lse.contiguous()))
        return dq, dk, dv

    return LocalKernel(name="fa2", fwd=fwd, bwd=bwd, description="flash_attn.flash_attn_interface (FA2)")


def _fa3_kernel() -> LocalKernel:
    try:
        import flash_attn_interface as fai
    except ImportError as exc:
        raise KernelUnavailable(f"kernel fa3 needs FlashAttention-3 (module flash_attn_interface): {exc}") from None
    if torch.cuda.is_available() and torch.cuda.get_device_capability() < (9, 0):
        raise KernelUnavailable("kernel fa3 needs compute capability 9.0 (Hopper)")
    from attnbench.backends.fa3 import Fa3Build, build_capabilities, build_flags, disabled_features
    built = build_capabilities(Fa3Build.declared, build_flags())  # what the installed build contains

    def check_head_dim(d: int) -> None:
        # a head size runs the smallest template >= it that the build has; above the largest, the real
        # build crashes the process instead of raising
        largest = built.max_head_dim
        if d > largest:
            raise KernelUnavailable(f"kernel fa3: head size {d} is above {largest}, the largest template of this "
                                    f"FlashAttention-3 build (built without {', '.join(disabled_features(build_flags()))})")

    def fwd(q, k, v, causal, scale):
        check_head_dim(q.shape[-1])
        res = _call_with(fai._flash_attn_forward, {"softmax_scale": scale, "causal": causal}, (q, k, v))
        return res[0], res[1]

    def bwd(dout, q, k, v, out, lse, causal, scale):
        check_head_dim(q.shape[-1])
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        _call_with(fai._flash_attn_backward, {"softmax_scale": scale, "causal": causal, "is_causal": causal,
                                              "dq": dq, "dk": dk, "dv": dv},
                   (dout.contiguous(), q, k, v, out.contiguous(), lse.contiguous()))
        return dq, dk, dv

    # a build without fp16 (FLASHATTENTION_DISABLE_FP16) raises on it: refused up front with the other checks
    return LocalKernel(name="fa3", fwd=fwd, bwd=bwd, description="flash_attn_interface (FA3, Hopper)",
                       dtypes=tuple(d for d in ("fp16", "bf16") if d in built.dtypes))


def _fa4_kernel() -> LocalKernel:
    from attnbench.backends.fa4 import copied_fa4_reason
    if copied := copied_fa4_reason("flash-attn-4"):  # FA2's copy imports, then fails inside the CuTe DSL
        raise KernelUnavailable(f"kernel fa4: {copied}")
    try:
        from flash_attn.cute import interface as cute
    except ImportError as exc:
        raise KernelUnavailable(f"kernel fa4 needs flash-attn 4 (flash_attn.cute): {exc}") from None

    def fwd(q, k, v, causal, scale):
        # (out, lse) in FA4's first releases; 4.0.0b36 returns (out, lse, p, row_max, o_lo)
        out, lse = _call_with(cute._flash_attn_fwd, {"softmax_scale": scale, "causal": causal, "return_lse": True},
                              (q.contiguous(), k.contiguous(), v.contiguous()))[:2]
        if lse is None:
            raise KernelUnavailable("flash_attn.cute returned no log-sum-exp; a newer FA4 is needed")
        return out, lse

    def bwd(dout, q, k, v, out, lse, causal, scale):
        return _call_with(cute._flash_attn_bwd, {"softmax_scale": scale, "causal": causal},
                          (q.contiguous(), k.contiguous(), v.contiguous(), out.contiguous(), dout.contiguous(),
                           lse.contiguous()))[:3]

    return LocalKernel(name="fa4", fwd=fwd, bwd=bwd, description="flash_attn.cute (FA4, CuTe DSL)")


# ---- registry ----------------------------------------------------------------------------------
ALL_DTYPES = ("fp16", "bf16", "fp32", "fp64")


def get_kernel(name: str, device: str | torch.device = "cuda") -> LocalKernel:
    """The kernel called ``name`` for ``device`` (``sdpa-flash`` is aten's CPU flash op on a CPU); KernelUnavailable
    with the reason if it cannot be built or returns no LSE."""
    name = canonical(name)
    if name in NO_LSE:
        raise KernelUnavailable(f"kernel {name} cannot be used for context parallelism: {NO_LSE[name]}, "
                                "which ring merging needs; use one of " + ", ".join(KERNELS))
    if name == "sdpa-math":
        return LocalKernel(name=name, fwd=math_fwd, bwd=math_bwd, devices=("cpu", "cuda"), dtypes=ALL_DTYPES,
                           description="exact matmul/softmax in fp32 (fp64 for fp64), full score matrix")
    if name == "sdpa-flash" and torch.device(device).type == "cpu":
        fwd, bwd = with_gqa(cpu_flash_fwd, cpu_flash_bwd)
        return LocalKernel(name=name, fwd=fwd, bwd=bwd, devices=("cpu",), dtypes=ALL_DTYPES,
                           description="aten._scaled_dot_product_flash_attention_for_cpu")
    if name in ("sdpa-flash", "sdpa-efficient", "sdpa-cudnn"):
        op = name.removeprefix("sdpa-")
        ops = _AtenCuda()
        fwd, bwd = with_gqa(getattr(ops, f"{op}_fwd"), getattr(ops, f"{op}_bwd"))
        dtypes = ("fp16", "bf16", "fp32") if op == "efficient" else ("fp16", "bf16")
        return LocalKernel(name=name, fwd=fwd, bwd=bwd, dtypes=dtypes,
                           description=f"aten._scaled_dot_product_{op}_attention (+ backward)")
    if name == "fa2":
        return _fa2_kernel()
    if name == "fa3":
        return _fa3_kernel()
    if name == "fa4":
        return _fa4_kernel()
    from attnbench.backends import registry
    if name in registry.names():
        raise KernelUnavailable(f"backend {name} is no local kernel for context parallelism: ring merging needs the "
                                f"log-sum-exp, which attnbench does not take from it; use one of {', '.join(KERNELS)}")
    raise KernelUnavailable(f"unknown --kernel {name!r}; the local kernels: {', '.join(KERNELS)}")


class LocalAttention(torch.autograd.Function):
    """Single-device attention through a kernel's fwd/bwd, for references and for Ulysses' middle step."""

    @staticmethod
    def forward(ctx, q, k, v, kernel: LocalKernel, causal: bool, scale: float):
        out, lse = kernel.fwd(q, k, v, causal, scale)
        timeline.mark("kernel")
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.kernel, ctx.causal, ctx.scale = kernel, causal, scale
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        timeline.begin_step("bwd", 0)
        dq, dk, dv = ctx.kernel.bwd(dout.contiguous(), q, k, v, out, lse, ctx.causal, ctx.scale)
        timeline.mark("kernel")
        return dq, dk, dv, None, None, None


def local_attention(q, k, v, kernel: LocalKernel, causal: bool, scale: float) -> torch.Tensor:
    """Differentiable attention of bshd tensors with ``kernel``."""
    return LocalAttention.apply(q, k, v, kernel, causal, scale)
