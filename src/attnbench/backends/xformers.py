"""``xformers``: xformers.ops.memory_efficient_attention (operator chosen by xformers' dispatcher).

memory_efficient_attention(query, key, value, attn_bias=None, p=0.0, scale=None, *, op=None) takes
(B, M, H, K) tensors, or (B, M, G, H, K) for grouped heads: GQA passes q as (B, Sq, Hkv, g, D) and K/V
expanded (stride 0, no copy) to (B, Sk, Hkv, g, D). Masks are ``xformers.ops.fmha.attn_bias`` objects
built in ``prepare``:
- causal: LowerTriangularFromBottomRightMask (lower-right aligned like the spec);
- window: LocalAttentionFromBottomRightMask(window_left, window_right);
- varlen: BlockDiagonalMask.from_seqlens(q_seqlen, kv_seqlen) over a (1, T, ...) batch, made causal with
  make_causal_from_bottomright() or causal-local with make_local_attention_from_bottomright(left + 1).
Causal queries with no key (Sq > Sk) are undefined in xformers, so such cases are unsupported.
On Hopper xformers hands the cases FA3 takes to an installed ``flash_attn_3`` package, and a template that
build left out (``FLASHATTENTION_DISABLE_*``: fp16, windows, head sizes) crashes the process: such cases are
unsupported, naming the build's switches.
"""

from __future__ import annotations

import importlib
from dataclasses import replace

import torch

from attnbench.backends.base import Capabilities, Prepared, autograd_closure, expand_kv_heads
from attnbench.backends.kernel import KernelBackend, accepts, device_capability, effective_window, packed
from attnbench.inputs import AttnInputs
from attnbench.spec import AttnSpec


def attn_bias_for(spec: AttnSpec, inputs: AttnInputs):
    """The attn_bias object of the case (None = full attention)."""
    bias_mod = importlib.import_module("xformers.ops.fmha.attn_bias")
    left, right = effective_window(spec)
    if inputs.varlen:
        p = packed(spec, inputs)
        kw = {"device": inputs.q.device} if accepts(bias_mod.BlockDiagonalMask.from_seqlens, "device") else {}
        bias = bias_mod.BlockDiagonalMask.from_seqlens(list(p.seqlens_q), list(p.seqlens_k), **kw)
        if right == 0:
            if left >= 0:  # keys i-left..i: a causal local window of left + 1 keys
                return bias.make_local_attention_from_bottomright(left + 1)
            return bias.make_causal_from_bottomright()
        return bias
    if left < 0 and right < 0:
        return None
    if left < 0 and right == 0:
        return bias_mod.LowerTriangularFromBottomRightMask()
    unbounded = spec.seqlens_q[0] + spec.seqlens_k[0]  # wider than any sequence: "no limit" on that side
    return bias_mod.LocalAttentionFromBottomRightMask(window_left=unbounded if left < 0 else left,
                                                      window_right=unbounded if right < 0 else right)


def _hopper(device) -> bool:
    return (device_capability(str(device)) or (0, 0)) >= (9, 0)


def _fa3_build_lacks(spec: AttnSpec, device) -> str | None:
    """What the installed flash_attn_3 build leaves out of a case that a full FA3 build would take.

    On Hopper xformers sends the cases FA3 takes to the installed ``flash_attn_3`` package, whatever that build
    was compiled with, and a missing template raises or crashes the process (seen on an H100 with xformers 0.0.35:
    windows under the trimmed wheel, fp16 under the bf16-only serving build, a segmentation fault)."""
    if not _hopper(device):
        return None
    from attnbench.backends import fa3
    lacks = fa3.build_lacks(replace(fa3.Fa3Build.declared, varlen=True), spec, device)
    return lacks and f"xformers sends this case on Hopper to the installed flash_attn_3: {lacks}"


class Xformers(KernelBackend):
    name = "xformers"
    description = "xformers memory_efficient_attention (dispatcher picks the operator)"
    package = "xformers.ops"
    distribution = "xformers"
    function = "memory_efficient_attention"
    capabilities = Capabilities(devices=("cuda",), dtypes=("fp16", "bf16", "fp32"), max_head_dim=256,
                                varlen=True, window=True)

    def extra_reason(self, spec: AttnSpec, device) -> str | None:
        if spec.causal and any(sq > sk for sq, sk in spec.sequences):
            return "causal with more queries than keys leaves queries without keys (undefined in xformers)"
        if spec.is_varlen and spec.has_window and effective_window(spec)[1] != 0:
            return "varlen windows must be causal (xformers has only causal local block-diagonal masks)"
        return _fa3_build_lacks(spec, device)

    def prepare(self, spec: AttnSpec, inputs: AttnInputs) -> Prepared:
        fn, bias = self.kernel(), attn_bias_for(spec, inputs)
        groups = spec.heads_q // spec.heads_kv
        # xformers 0.0.35 has no backward operator for the 5-D (BMGHK) GQA form (seen on an H200:
        # "No operator found for memory_efficient_attention_backward"), so with gradients the K/V
        # heads are expanded here instead, outside the timed region.
        five_d = groups > 1 and spec.pass_ == "fwd"

        def pre(q, k, v):
            if inputs.varlen:
                q, k, v = (t.unsqueeze(0) for t in (q, k, v))
            if groups > 1 and not five_d:
                k, v = expand_kv_heads(k, groups), expand_kv_heads(v, groups)
            elif five_d:
                b, sq, sk, hkv = q.shape[0], q.shape[1], k.shape[1], spec.heads_kv
                q = q.reshape(b, sq, hkv, groups, q.shape[-1])
                k = k.unsqueeze(3).expand(b, sk, hkv, groups, k.shape[-1])
                v = v.unsqueeze(3).expand(b, sk, hkv, groups, v.shape[-1])
            return q, k, v

        def forward(q, k, v):
            out = fn(q, k, v, attn_bias=bias, scale=spec.softmax_scale)
            if five_d:
                out = out.flatten(2, 3)
            return out[0] if inputs.varlen else out
        info = self.base_info() | {"attn_bias": type(bias).__name__ if bias is not None else "none",
                                   "gqa": "none" if groups == 1 else ("5-D BMGHK" if five_d else "expanded"),
                                   "operator": _dispatched_op(fn, spec, inputs, pre, bias)}
        return Prepared(fn=autograd_closure(spec, inputs, forward, pre), info=info)


def _dispatched_op(fn, spec: AttnSpec, inputs: AttnInputs, pre, bias) -> str:
    """Name of the forward operator xformers' dispatcher picks (private API: 'auto' when it moves)."""
    try:
        fmha = importlib.import_module("xformers.ops.fmha")
        dispatch = importlib.import_module("xformers.ops.fmha.dispatch")
        with torch.no_grad():
            q, k, v = pre(inputs.q, inputs.k, inputs.v)
        inp = fmha.Inputs(query=q, key=k, value=v, attn_bias=bias, scale=spec.softmax_scale)
        return getattr(dispatch._dispatch_fw(inp, spec.pass_ != "fwd"), "NAME", "auto")
    except Exception:  # private API; the operator name is informative only
        return "auto"
