"""``sdpa-varlen``: torch.nn.attention.varlen.varlen_attn (torch >= 2.10, CUDA flash kernel).

varlen_attn(query (Tq, Hq, D), key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=, scale=,
window_size=(left, right), enable_gqa=) -> out, or (out, lse) with ``return_aux=AuxRequest(lse=True)``.
Causal is ``window_size=(-1, 0)`` (torch 2.10 had ``is_causal=`` instead; both are handled by looking
at the signature). Where ``enable_gqa`` is missing, K/V heads are expanded in ``prepare``. Dense cases
run flattened with uniform offsets.
"""

from __future__ import annotations

import importlib
import importlib.util

import torch

from attnbench.backends.base import Backend, Capabilities, Prepared, autograd_closure, expand_kv_heads
from attnbench.backends.kernel import effective_window, has_param, lse_if_shaped, packed, split_result
from attnbench.inputs import AttnInputs
from attnbench.spec import AttnSpec

MODULE = "torch.nn.attention.varlen"


def _varlen_module():
    return importlib.import_module(MODULE)


class SdpaVarlen(Backend):
    name = "sdpa-varlen"
    description = "torch.nn.attention.varlen.varlen_attn (packed tokens + cu_seqlens, flash kernel)"
    capabilities = Capabilities(devices=("cuda",), dtypes=("fp16", "bf16"), max_head_dim=256, varlen=True,
                                window=True, different_v_dim=False, min_compute_capability=(8, 0))

    def unavailable_reason(self) -> str | None:
        # find_spec, not import: the module pulls in dynamo (seconds) just to list backends
        if importlib.util.find_spec(MODULE) is None:
            return f"torch {torch.__version__} has no {MODULE}.varlen_attn (needs torch >= 2.10)"
        return None

    def extra_reason(self, spec: AttnSpec, device) -> str | None:
        fn = _varlen_module().varlen_attn
        if spec.has_window and not has_param(fn, "window_size"):
            return f"sliding window needs varlen_attn(window_size=...) (torch {torch.__version__} lacks it)"
        return None

    def prepare(self, spec: AttnSpec, inputs: AttnInputs) -> Prepared:
        mod = _varlen_module()
        fn, p = mod.varlen_attn, packed(spec, inputs)
        kwargs = {"scale": spec.softmax_scale}
        if has_param(fn, "window_size"):
            kwargs["window_size"] = tuple(effective_window(spec))  # a tuple: (-1, 0) is how causal is recognised
        else:
            kwargs["is_causal"] = spec.causal
        groups = spec.heads_q // spec.heads_kv
        native_gqa = groups > 1 and has_param(fn, "enable_gqa")
        if native_gqa:
            kwargs["enable_gqa"] = True
        if hasattr(mod, "AuxRequest") and has_param(fn, "return_aux"):
            kwargs["return_aux"] = mod.AuxRequest(lse=True)
        total = sum(p.seqlens_q)

        def pre(q, k, v):
            q, k, v = (p.flatten(t) for t in (q, k, v))
            if groups > 1 and not native_gqa:
                k, v = expand_kv_heads(k, groups, 1), expand_kv_heads(v, groups, 1)
            return q, k, v

        def forward(q, k, v):
            out, lse = split_result(fn(q, k, v, p.cu_seqlens_q, p.cu_seqlens_k, p.max_seqlen_q, p.max_seqlen_k,
                                       **kwargs))
            return p.unflatten(out), p.unflatten_lse(lse_if_shaped(lse, (spec.heads_q, total)))
        gqa = "none" if groups == 1 else ("native" if native_gqa else "expanded")
        info = self.base_info() | {"kernel": f"{MODULE}.varlen_attn", "gqa": gqa,
                                   "window_size": kwargs.get("window_size"),
                                   "flattened_dense": p.batch is not None}
        return Prepared(fn=autograd_closure(spec, inputs, forward, pre), info=info)
