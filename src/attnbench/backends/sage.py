"""SageAttention (package ``sageattention``): INT8 Q/K quantization, forward only, approximate.

- ``sage``            sageattn(q, k, v, tensor_layout="HND"|"NHD", is_causal=, sm_scale=, smooth_k=True)
- ``sage-varlen``     sageattn_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                      is_causal=, sm_scale=, smooth_k=True)
- ``sage2-fp8``       sageattn_qk_int8_pv_fp8_cuda       (SageAttention2, FP8 PV; sm89+)
- ``sage2-fp8-sm90``  sageattn_qk_int8_pv_fp8_cuda_sm90  (SageAttention2 Hopper kernel)
- ``sage2-fp16``      sageattn_qk_int8_pv_fp16_cuda      (SageAttention2, FP16 PV; sm80+)

``sage`` is whatever ``sageattn`` runs: with sageattention 1.x the Triton kernels, with 2.x the
SageAttention2 CUDA kernel that ``sageattn`` picks for the GPU's architecture (on Hopper
``sageattn_qk_int8_pv_fp8_cuda_sm90`` with ``pv_accum_dtype="fp32+fp32"``). ``prepare`` makes one
untimed call while watching which of the package's kernel functions ``sageattn`` hands the call to,
and the record's ``info["kernel"]`` names it (``dispatched_kernel``); ``attnbench backends`` does the
same on a tiny input.

Version 1 (the Triton kernels) smooths K by subtracting its mean *in place* (``k -= km``): the
adapter hands those entry points their own copy of K, made in ``prepare`` outside the timed region,
so the caller's inputs never change. Version 2 leaves K alone and gets no copy. Quantization of Q/K (and V for v2) happens inside the kernel
call and is therefore timed (``info["includes_preprocess"] = True``). Dense inputs go in the layout
they are stored in (NHD for bshd, HND for bhsd) so no transpose is added. Causal needs Sq == Sk.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from attnbench.backends.base import Capabilities, Prepared, autograd_closure
from attnbench.backends.kernel import KernelBackend, device_capability, layout_call, packed
from attnbench.inputs import AttnInputs
from attnbench.spec import AttnSpec

_V1 = Capabilities(devices=("cuda",), dtypes=("fp16", "bf16"), head_dims=(64, 96, 128), backward=False,
                   different_v_dim=False, exact=False, min_compute_capability=(8, 0))


SAGE2_KERNELS = ("sageattn_qk_int8_pv_fp8_cuda_sm90", "sageattn_qk_int8_pv_fp8_cuda", "sageattn_qk_int8_pv_fp16_cuda",
                 "sageattn_qk_int8_pv_fp16_triton")
"""The SageAttention2 kernel functions that ``sageattn`` dispatches to."""
DISPATCH_ARGS = ("pv_accum_dtype", "qk_quant_gran")
"""Keyword arguments of the dispatched call worth recording (they pick the kernel variant)."""


def dispatched_kernel(entry, call) -> str | None:
    """Run ``call()`` once and return which SageAttention2 kernel function ``entry`` (``sageattn``) handed it
    to, with the arguments that select its variant, e.g.
    ``sageattn_qk_int8_pv_fp8_cuda_sm90(pv_accum_dtype=fp32+fp32)``. The functions are watched where
    ``entry`` looks them up (its module's globals) and restored afterwards. None when none of them ran
    (SageAttention 1: its Triton kernels are called directly)."""
    names = getattr(entry, "__globals__", {})
    seen: list[str] = []
    originals = {name: names[name] for name in SAGE2_KERNELS if name in names}

    def spy(name, original):
        def wrapper(*args, **kwargs):
            picked = ", ".join(f"{k}={kwargs[k]}" for k in DISPATCH_ARGS if k in kwargs)
            seen.append(f"{name}({picked})")
            return original(*args, **kwargs)
        return wrapper
    try:
        for name, original in originals.items():
            names[name] = spy(name, original)
        call()
    finally:
        names.update(originals)
    return seen[0] if seen else None


def major_version(version: str | None) -> int | None:
    try:
        return int(str(version).split(".")[0])
    except ValueError:
        return None


class _Sage(KernelBackend):
    package = "sageattention"
    distribution = "sageattention"
    install = "pip install sageattention (1.x, Triton); SageAttention 2 builds from source: see docs/backends.md"
    capabilities = _V1
    smooths_k_in_place = False
    """True for entry points that may subtract the K mean from the caller's K (version 1 ``sageattn``)."""

    @property
    def version1(self) -> bool:
        """The installed sageattention is 1.x (an unknown version counts as 1: the cautious reading)."""
        return (major_version(self.version()) or 1) < 2

    @property
    def copies_k(self) -> bool:
        """Give the kernel its own K: only version 1 modifies K in place."""
        return self.smooths_k_in_place and self.version1

    option_types = {"smooth_k": bool, "smooth_v": bool, "pv_accum_dtype": str, "qk_quant_gran": str}
    """The kernel arguments attnbench knows (others go to the kernel unchecked: they differ between versions)."""
    option_choices = {"pv_accum_dtype": ("fp32", "fp16", "fp16+fp32", "fp32+fp16", "fp32+fp32"),
                      "qk_quant_gran": ("per_warp", "per_thread")}
    """What SageAttention 2's kernels take (each kernel a subset: a value its kernel does not take is its error)."""

    def __init__(self, **options):
        self.options = options
        """Extra keyword arguments for the kernel (e.g. pv_accum_dtype=, qk_quant_gran=, smooth_k=)."""

    def extra_reason(self, spec: AttnSpec, device) -> str | None:
        if spec.causal and any(sq != sk for sq, sk in spec.sequences):
            return "causal needs equal query and key lengths in SageAttention"
        return None

    def _info(self, fn, **extra) -> dict:
        api = "v1 (smooth_k in place)" if self.copies_k else "v2"
        return self.base_info() | {"includes_preprocess": True, "k_copied": self.copies_k, "api": api,
                                   "options": dict(self.options)} | extra

    def _k(self, k: torch.Tensor) -> torch.Tensor:
        return k.clone() if self.copies_k else k


class _SageDense(_Sage):
    def functional(self, spec: AttnSpec):
        """fn(q_bshd, k_bshd, v_bshd) -> out_bshd for models: the kernel called on the model's own tensors in
        the layout they are stored in (no transpose copies; K copied only for version 1)."""
        fn = self.kernel()
        kwargs = {"is_causal": spec.causal, "sm_scale": spec.softmax_scale, **self.options}
        return lambda q, k, v: layout_call(fn, q, self._k(k), v, **kwargs)

    def prepare(self, spec: AttnSpec, inputs: AttnInputs) -> Prepared:
        fn = self.kernel()
        hnd = spec.layout == "bhsd"
        kwargs = {"tensor_layout": "HND" if hnd else "NHD", "is_causal": spec.causal, "sm_scale": spec.softmax_scale,
                  **self.options}

        def pre(q, k, v):
            k = self._k(k)
            return tuple(t.transpose(1, 2) for t in (q, k, v)) if hnd else (q, k, v)

        def forward(q, k, v):
            out = fn(q, k, v, **kwargs)
            out = out[0] if isinstance(out, tuple) else out
            return out.transpose(1, 2) if hnd else out
        closure = autograd_closure(spec, inputs, forward, pre)
        return Prepared(fn=closure, info=self._info(fn, tensor_layout=kwargs["tensor_layout"],
                                                    **self._dispatch_info(fn, closure)))

    def _dispatch_info(self, fn, closure) -> dict:
        return {}


class Sage(_SageDense):
    name = "sage"
    function = "sageattn"
    smooths_k_in_place = True

    @property
    def description(self) -> str:
        if self.version1:
            return "SageAttention 1 sageattn (Triton: INT8 QK, FP16 PV)"
        return "SageAttention 2 sageattn (picks the SageAttention2 kernel for the GPU)"

    def dispatch_on(self, device: str) -> str:
        """The kernel ``sageattn`` (version 2) picks on ``device``, from one call on a tiny input."""
        try:
            q = torch.randn(1, 128, 1, 64, dtype=torch.float16, device=device)
            fn = self.kernel()
            return dispatched_kernel(fn, lambda: fn(q, q, q, tensor_layout="NHD")) or "no SageAttention2 kernel"
        except Exception as exc:  # a broken install is shown, not fatal
            return f"dispatch check failed: {type(exc).__name__}"

    def describe(self, device) -> str:
        """The description plus, on a CUDA device with version 2, the kernel ``sageattn`` picks there."""
        if self.version1 or device_capability(str(device)) is None:
            return self.description
        return f"{self.description}: here {_dispatch_cached(self, str(torch.device(device)))}"

    def base_info(self) -> dict:
        """Records made without ``prepare`` (models calling ``functional``) name the kernel too."""
        info = super().base_info()
        if not self.version1 and torch.cuda.is_available() and torch.version.hip is None:
            device = f"cuda:{torch.cuda.current_device()}"
            info["kernel"] = f"sageattention.sageattn -> {_dispatch_cached(self, device)}"
        return info

    def _dispatch_info(self, fn, closure) -> dict:
        """Version 2: one untimed call, watching which kernel ``sageattn`` hands it to."""
        picked = None if self.version1 else dispatched_kernel(fn, closure)
        if picked is None:
            return {"kernel": "sageattention.sageattn (v1 Triton kernels)"}
        return {"kernel": f"sageattention.sageattn -> {picked}", "dispatched_to": picked.split("(")[0]}


_DISPATCH: dict[tuple[str, str | None], str] = {}


def _dispatch_cached(sage: Sage, device: str) -> str:
    """``Sage.dispatch_on`` once per (device, sageattention version) in a process."""
    key = (device, sage.version())
    if key not in _DISPATCH:
        _DISPATCH[key] = sage.dispatch_on(device)
    return _DISPATCH[key]


class SageVarlen(_Sage):
    name = "sage-varlen"
    smooths_k_in_place = True
    description = "SageAttention sageattn_varlen (packed + cu_seqlens)"
    function = "sageattn_varlen"
    capabilities = replace(_V1, head_dims=(64, 128), varlen=True)

    def prepare(self, spec: AttnSpec, inputs: AttnInputs) -> Prepared:
        fn, p = self.kernel(), packed(spec, inputs)
        kwargs = {"is_causal": spec.causal, "sm_scale": spec.softmax_scale, **self.options}

        def pre(q, k, v):
            return p.flatten(q), self._k(p.flatten(k)), p.flatten(v)

        def forward(q, k, v):
            out = fn(q, k, v, p.cu_seqlens_q, p.cu_seqlens_k, p.max_seqlen_q, p.max_seqlen_k, **kwargs)
            return p.unflatten(out[0] if isinstance(out, tuple) else out)
        return Prepared(fn=autograd_closure(spec, inputs, forward, pre),
                        info=self._info(fn, flattened_dense=p.batch is not None))


_V2 = replace(_V1, head_dims=None, max_head_dim=128)


class Sage2Fp8(_SageDense):
    name = "sage2-fp8"
    description = "SageAttention2 sageattn_qk_int8_pv_fp8_cuda (INT8 QK, FP8 PV)"
    function = "sageattn_qk_int8_pv_fp8_cuda"
    capabilities = replace(_V2, min_compute_capability=(8, 9))


class Sage2Fp8Sm90(_SageDense):
    name = "sage2-fp8-sm90"
    description = "SageAttention2 sageattn_qk_int8_pv_fp8_cuda_sm90 (Hopper kernel)"
    function = "sageattn_qk_int8_pv_fp8_cuda_sm90"
    capabilities = replace(_V2, min_compute_capability=(9, 0))

    def extra_reason(self, spec: AttnSpec, device) -> str | None:
        cc = device_capability(str(device))
        if cc is not None and cc[0] != 9:
            return f"Hopper-only kernel (compute capability 9.x), device has {cc[0]}.{cc[1]}"
        return super().extra_reason(spec, device)


class Sage2Fp16(_SageDense):
    name = "sage2-fp16"
    description = "SageAttention2 sageattn_qk_int8_pv_fp16_cuda (INT8 QK, FP16 PV)"
    function = "sageattn_qk_int8_pv_fp16_cuda"
    capabilities = _V2
