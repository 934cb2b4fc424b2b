"""FlashAttention-2 (package ``flash_attn``): five entry points, each its own backend.

- ``fa2``                  flash_attn_func(q, k, v) on (B, S, H, D); GQA native.
- ``fa2-qkvpacked``        flash_attn_qkvpacked_func(qkv) with qkv (B, S, 3, H, D); no GQA, Sq == Sk.
- ``fa2-kvpacked``         flash_attn_kvpacked_func(q, kv) with kv (B, Sk, 2, Hkv, D).
- ``fa2-varlen``           flash_attn_varlen_func on packed (T, H, D) + cu_seqlens.
- ``fa2-varlen-qkvpacked`` flash_attn_varlen_qkvpacked_func(qkv (T, 3, H, D), cu_seqlens, max_seqlen).

Logit softcap (``softcap=``) and ALiBi (``alibi_slopes=``, float32 per head) are flash-attn 2 arguments,
forward and backward. Its ALiBi bias is ``−slope·|i′ − j|``, symmetric around the aligned diagonal, so it is
attnbench's signed bias only where no key lies after the query: causal cases (a window's right side 0). It adds
``slope·j`` there, the same softmax as ``−slope·(i′ − j)`` but a log-sum-exp shifted by ``slope·i′``, so the LSE
of an ALiBi case is not taken. A build without them (``FLASHATTENTION_DISABLE_SOFTCAP`` / ``_ALIBI``, as the
trimmed wheel of ``tools/build-fa2-trimmed.sh``) does not refuse them: its switch compiles the feature out and
the kernel runs without it. The check catches that (an output that is not the case's attention).

Packing (torch.stack) happens in ``prepare``; gradients still flow back to the caller's q, k, v.
Dense cases also run through the varlen entry points (flattened, uniform cu_seqlens). Causal is
flash-attn's own lower-right alignment; windows pass as ``window_size=(left, right)``. The kernels
give the log-sum-exp through ``return_attn_probs=True`` (no probabilities are formed without dropout).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from attnbench.backends.base import Capabilities, Prepared, autograd_closure
from attnbench.backends.kernel import (
    KernelBackend,
    dense_closure,
    dense_functional,
    effective_window,
    lse_if_shaped,
    packed,
    split_result,
    varlen_closure,
    varlen_lse,
)
from attnbench.inputs import AttnInputs, pack_kv, pack_qkv
from attnbench.spec import AttnSpec

_DENSE = Capabilities(devices=("cuda",), dtypes=("fp16", "bf16"), max_head_dim=256, window=True,
                      different_v_dim=False, min_compute_capability=(8, 0), softcap=True, alibi=True,
                      gate=True)


PLAIN_ARGS = {"dropout_p": 0.0, "window_size": (-1, -1), "window_size_left": -1, "window_size_right": -1,
              "softcap": 0.0, "alibi_slopes": None, "deterministic": False, "rng_state": None}
"""flash-attn 2's internal forward/backward arguments of plain attention (no dropout, window, softcap or ALiBi),
under every spelling its versions use: the context-parallel kernel passes those its version takes."""


def common_kwargs(spec: AttnSpec, device="cuda") -> dict:
    """The arguments every flash-attn 2 entry point shares (dropout off; softcap and ALiBi slopes when the
    case has them)."""
    window = effective_window(spec) if spec.has_window else (-1, -1)
    kw = {"dropout_p": 0.0, "softmax_scale": spec.softmax_scale, "causal": spec.causal,
          "window_size": window, "return_attn_probs": True}
    if spec.softcap is not None:
        kw["softcap"] = spec.softcap
    if spec.alibi is not None:
        kw["alibi_slopes"] = torch.tensor(spec.alibi, dtype=torch.float32, device=device)
        kw["return_attn_probs"] = False  # its LSE is of its own bias, slope·j: see the module doc
    return kw


class _Fa2(KernelBackend):
    package = "flash_attn"
    distribution = "flash-attn"
    install = "pip install flash-attn --no-build-isolation"
    capabilities = _DENSE
    build_limits = ("this flash-attn build has head dims up to",)  # builds trimmed to fewer head dims

    def extra_reason(self, spec: AttnSpec, device) -> str | None:
        if spec.alibi is not None and effective_window(spec)[1] != 0:
            return "flash-attn's ALiBi is symmetric (−slope·|i′−j|): it matches the signed bias in causal cases only"
        return None

    def _info(self, spec: AttnSpec, **extra) -> dict:
        return self.base_info() | {"gqa": "native" if spec.gqa else "none"} | extra


class Fa2(_Fa2):
    name = "fa2"
    description = "flash-attn 2 flash_attn_func (bshd)"
    function = "flash_attn_func"

    def functional(self, spec: AttnSpec):
        return dense_functional(self.kernel(), common_kwargs(spec) | {"return_attn_probs": False})

    def prepare(self, spec: AttnSpec, inputs: AttnInputs) -> Prepared:
        closure = dense_closure(spec, inputs, self.kernel(), common_kwargs(spec, inputs.q.device))
        return Prepared(fn=closure, info=self._info(spec))


class Fa2QKVPacked(_Fa2):
    name = "fa2-qkvpacked"
    description = "flash-attn 2 flash_attn_qkvpacked_func (qkv stacked in prepare)"
    function = "flash_attn_qkvpacked_func"
    capabilities = replace(_DENSE, gqa=False, cross_lengths=False)

    def prepare(self, spec: AttnSpec, inputs: AttnInputs) -> Prepared:
        fn, kwargs = self.kernel(), common_kwargs(spec, inputs.q.device)
        lse_shape = (spec.batch, spec.heads_q, spec.seqlens_q[0])

        def forward(qkv):
            out, lse = split_result(fn(qkv, **kwargs))
            return out, lse_if_shaped(lse, lse_shape)
        closure = autograd_closure(spec, inputs, forward, pre=lambda q, k, v: (pack_qkv(q, k, v),))
        return Prepared(fn=closure, info=self._info(spec, packing="qkv (B, S, 3, H, D)"))


class Fa2KVPacked(_Fa2):
    name = "fa2-kvpacked"
    description = "flash-attn 2 flash_attn_kvpacked_func (kv stacked in prepare)"
    function = "flash_attn_kvpacked_func"

    def prepare(self, spec: AttnSpec, inputs: AttnInputs) -> Prepared:
        fn, kwargs = self.kernel(), common_kwargs(spec, inputs.q.device)
        lse_shape = (spec.batch, spec.heads_q, spec.seqlens_q[0])

        def forward(q, kv):
            out, lse = split_result(fn(q, kv, **kwargs))
            return out, lse_if_shaped(lse, lse_shape)
        closure = autograd_closure(spec, inputs, forward, pre=lambda q, k, v: (q, pack_kv(k, v)))
        return Prepared(fn=closure, info=self._info(spec, packing="kv (B, Sk, 2, Hkv, D)"))


class Fa2Varlen(_Fa2):
    name = "fa2-varlen"
    description = "flash-attn 2 flash_attn_varlen_func (packed tokens + cu_seqlens)"
    function = "flash_attn_varlen_func"
    capabilities = replace(_DENSE, varlen=True)

    def prepare(self, spec: AttnSpec, inputs: AttnInputs) -> Prepared:
        closure, p = varlen_closure(spec, inputs, self.kernel(), common_kwargs(spec, inputs.q.device))
        return Prepared(fn=closure, info=self._info(spec, packing="thd + cu_seqlens",
                                                    flattened_dense=p.batch is not None))


class Fa2VarlenQKVPacked(_Fa2):
    name = "fa2-varlen-qkvpacked"
    description = "flash-attn 2 flash_attn_varlen_qkvpacked_func (qkv (T, 3, H, D) stacked in prepare)"
    function = "flash_attn_varlen_qkvpacked_func"
    capabilities = replace(_DENSE, varlen=True, gqa=False, cross_lengths=False)

    def prepare(self, spec: AttnSpec, inputs: AttnInputs) -> Prepared:
        fn, kwargs, p = self.kernel(), common_kwargs(spec, inputs.q.device), packed(spec, inputs)

        def forward(qkv):
            out, lse = split_result(fn(qkv, cu_seqlens=p.cu_seqlens_q, max_seqlen=p.max_seqlen_q, **kwargs))
            return p.unflatten(out), varlen_lse(lse, p, spec.heads_q)

        def pre(q, k, v):
            return (pack_qkv(*map(p.flatten, (q, k, v))),)
        return Prepared(fn=autograd_closure(spec, inputs, forward, pre),
                        info=self._info(spec, packing="qkv (T, 3, H, D) + cu_seqlens",
                                        flattened_dense=p.batch is not None))
