"""torch.nn.functional.scaled_dot_product_attention with one kernel forced via ``sdpa_kernel``.

Four backends: sdpa-math, sdpa-flash, sdpa-efficient, sdpa-cudnn. Inputs are bshd and handed to SDPA
as (B, H, S, D) views (no copy). Causal with Sq != Sk uses ``causal_lower_right``. GQA uses
``enable_gqa`` where torch and the kernel accept it, otherwise K/V heads are expanded in ``prepare``
(recorded as ``gqa: expanded``). A forced kernel that refuses the case is recorded as unsupported
with torch's own explanation.

``sdpa-math`` takes ALiBi and sinks the way a model hands them to SDPA: a float mask (Hq, Sq, Sk) in the
case's dtype with the ALiBi bias and -inf where the causal mask or window drops a pair, and, for sinks, one
more key and value of zeros whose column of the mask holds each head's sink (rebuilt each call from the
sinks, so their gradient flows). A softcap cannot be expressed as a mask.

``sdpa-math`` also runs grouped cases (serving batches) the way a server without a varlen kernel would: one
SDPA call per request, its boolean mask (lower-right causal, window or speculative tree) built in ``prepare``,
an fp8 KV cache dequantized inside the call.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F

from attnbench.backends.base import (
    Backend,
    BackendUnavailable,
    Capabilities,
    Prepared,
    autograd_closure,
    expand_kv_heads,
)
from attnbench.features.alibi import alibi_bias, relative_positions
from attnbench.inputs import AttnInputs, kv_dequantizer
from attnbench.masks import keep_mask
from attnbench.spec import MAX_HEAD_DIM, AttnSpec


def _sdpa_supports_gqa() -> bool:
    """torch >= 2.5 has ``enable_gqa``."""
    major, minor = (int(x) for x in torch.__version__.split(".")[:2])
    return (major, minor) >= (2, 5)


class SdpaBackend(Backend):
    """One forced SDPA kernel."""

    sdpa_backend_name: str = "MATH"

    def _sdpa_backend(self):
        from torch.nn.attention import SDPBackend
        return getattr(SDPBackend, self.sdpa_backend_name)

    def prepare(self, spec: AttnSpec, inputs: AttnInputs) -> Prepared:
        from torch.nn.attention import sdpa_kernel
        backend = self._sdpa_backend()
        sq, sk = spec.seqlens_q[0], spec.seqlens_k[0]
        mask, is_causal = None, False
        if spec.sinks or spec.alibi is not None:
            mask = variant_bias(spec, inputs.q.device)
        elif spec.has_window:
            mask = keep_mask(sq, sk, spec.causal, spec.window, device=inputs.q.device)
        elif spec.causal and sq == sk:
            is_causal = True
        elif spec.causal:
            from torch.nn.attention.bias import causal_lower_right
            mask = causal_lower_right(sq, sk)
        groups = spec.heads_q // spec.heads_kv
        sink_key = spec.sinks  # one more key: zero, so its score is the bias column's sink

        def attempt(native_gqa: bool) -> Prepared:
            gqa_kw = {"enable_gqa": True} if (native_gqa and groups > 1) else {}

            def pre(q, k, v):
                q, k, v = (t.transpose(1, 2) for t in (q, k, v))
                if groups > 1 and not native_gqa:
                    k, v = expand_kv_heads(k, groups, 1), expand_kv_heads(v, groups, 1)
                if sink_key:
                    k, v = sink_keys(k, v)
                return q, k, v

            def forward(q, k, v, sinks=None):
                attn_mask = mask if sinks is None else with_sink_column(mask, sinks)
                with sdpa_kernel([backend]):
                    out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal,
                                                         scale=spec.softmax_scale, **gqa_kw)
                return out.transpose(1, 2)

            _probe(forward, pre, inputs, self.name, sinks=inputs.sinks if spec.sinks else None)
            gqa = "none" if groups == 1 else ("native" if native_gqa else "expanded")
            info = self.base_info() | {"kernel": f"sdpa:{self.sdpa_backend_name}", "gqa": gqa}
            return Prepared(fn=autograd_closure(spec, inputs, forward, pre), info=info)

        if groups > 1 and _sdpa_supports_gqa():
            try:
                return attempt(native_gqa=True)
            except BackendUnavailable:
                pass  # this kernel has no native GQA in this torch: expand K/V heads instead
        return attempt(native_gqa=False)


def variant_bias(spec: AttnSpec, device, sq: int | None = None, sk: int | None = None) -> torch.Tensor:
    """The float mask of a case with ALiBi or sinks, in the case's dtype: (Hq or 1, Sq, Sk), -inf where the mask
    drops a pair, the ALiBi bias (formed in fp32) elsewhere. Sinks add a column per call (``with_sink_column``).
    ``sq``, ``sk``: one sequence's lengths (default: the first)."""
    sq, sk = sq or spec.seqlens_q[0], sk or spec.seqlens_k[0]
    bias = torch.zeros(1, sq, sk, dtype=torch.float32, device=device)
    if spec.alibi is not None:
        slopes = torch.tensor(spec.alibi, dtype=torch.float32, device=device).view(-1, 1, 1)
        bias = alibi_bias(slopes, relative_positions(sq, sk, device))
    keep = keep_mask(sq, sk, spec.causal, spec.window, device=device)
    if keep is not None:
        bias = bias.masked_fill(~keep, float("-inf"))
    return bias.to(spec.torch_dtype)


def sink_keys(k_bhsd: torch.Tensor, v_bhsd: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V (B, H, S, D) with one more key and value of zeros: its score is whatever its mask column holds."""
    return F.pad(k_bhsd, (0, 0, 0, 1)), F.pad(v_bhsd, (0, 0, 0, 1))


def with_sink_column(bias: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
    """``variant_bias``'s (Hq or 1, Sq, Sk) mask with a last column holding each head's sink, (Hq, Sq, Sk + 1):
    built from the sinks at each call, so their gradient flows through the mask."""
    column = sinks.to(bias.dtype).view(-1, 1, 1).expand(-1, bias.shape[1], 1)
    return torch.cat([bias.expand(column.shape[0], -1, -1), column], dim=-1)


def _probe(forward, pre, inputs: AttnInputs, name: str, sinks=None) -> None:
    """Call the forced kernel once (untimed); turn "no available kernel" into BackendUnavailable."""
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            forward(*pre(inputs.q[:1], inputs.k[:1], inputs.v[:1]), **({} if sinks is None else {"sinks": sinks}))
        except torch.OutOfMemoryError:  # the kernel exists but the case does not fit: an oom, not unsupported
            raise
        except RuntimeError as exc:
            why = "; ".join(dict.fromkeys(str(w.message).strip() for w in caught if "kernel" in str(w.message)
                                          or "requires" in str(w.message) or "support" in str(w.message)))
            msg = str(exc).splitlines()[0]
            raise BackendUnavailable(f"{name}: {why or msg}"[:400]) from None


class SdpaMath(SdpaBackend):
    name = "sdpa-math"
    description = "SDPA math kernel (reference composite implementation); ALiBi and sinks as a float mask"
    sdpa_backend_name = "MATH"
    capabilities = Capabilities(max_head_dim=MAX_HEAD_DIM, window=True, sinks=True, alibi=True, gate=True, varlen=True,
                                tree=True,
                                kv_fp8=True)

    def prepare(self, spec: AttnSpec, inputs: AttnInputs) -> Prepared:
        if not inputs.varlen and inputs.descale is None:
            return super().prepare(spec, inputs)
        return self._per_request(spec, inputs)

    def _per_request(self, spec: AttnSpec, inputs: AttnInputs) -> Prepared:
        """One SDPA call per sequence (a grouped case, or an fp8 KV cache), masks built here."""
        from torch.nn.attention import sdpa_kernel
        backend, dev, groups = self._sdpa_backend(), inputs.q.device, spec.heads_q // spec.heads_kv
        kv = kv_dequantizer(inputs, spec.torch_dtype)
        if inputs.varlen:
            bounds = inputs.bounds()
        else:  # dense: each batch row is a sequence
            bounds = [((b, b + 1), (b, b + 1)) for b in range(spec.batch)]
        masks = []
        for (qs, qe), (ks, ke) in bounds:
            sq, sk = (qe - qs, ke - ks) if inputs.varlen else (spec.seqlens_q[0], spec.seqlens_k[0])
            if spec.sinks or spec.alibi is not None:
                masks.append(variant_bias(spec, dev, sq, sk))
            else:
                masks.append(keep_mask(sq, sk, spec.causal, spec.window, device=dev, tree=spec.tree))

        def one(q, k, v, mask, sinks):  # (1, S, H, D) each
            q, k, v = (t.transpose(1, 2) for t in (q, k, v))
            if groups > 1:
                k, v = expand_kv_heads(k, groups, 1), expand_kv_heads(v, groups, 1)
            if sinks is not None:
                k, v = sink_keys(k, v)
                mask = with_sink_column(mask, sinks)
            with sdpa_kernel([backend]):
                out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=spec.softmax_scale)
            return out.transpose(1, 2)

        def forward(q, k, v, sinks=None):
            k, v = kv(k, v)
            if not inputs.varlen:
                return torch.cat([one(q[b:b + 1], k[b:b + 1], v[b:b + 1], m, sinks)
                                  for b, m in zip(range(spec.batch), masks, strict=True)])
            outs = [one(q[None, qs:qe], k[None, ks:ke], v[None, ks:ke], m, sinks)[0]
                    for ((qs, qe), (ks, ke)), m in zip(bounds, masks, strict=True)]
            return torch.cat(outs, dim=0)
        info = self.base_info() | {"kernel": "sdpa:MATH per sequence", "gqa": "expanded" if groups > 1 else "none"}
        return Prepared(fn=autograd_closure(spec, inputs, forward), info=info)


class SdpaFlash(SdpaBackend):
    name = "sdpa-flash"
    description = "SDPA FlashAttention-2 kernel (CUDA; CPU flash kernel on CPU)"
    sdpa_backend_name = "FLASH_ATTENTION"
    capabilities = Capabilities(dtypes=("fp16", "bf16", "fp32", "fp64"), max_head_dim=256, different_v_dim=False,
                                gate=True)

    def extra_reason(self, spec, device):
        if torch.device(device).type == "cuda" and spec.dtype not in ("fp16", "bf16"):
            return f"dtype {spec.dtype} not supported on CUDA (fp16/bf16)"
        return None


class SdpaEfficient(SdpaBackend):
    name = "sdpa-efficient"
    description = "SDPA memory-efficient (xformers-derived) kernel"
    sdpa_backend_name = "EFFICIENT_ATTENTION"
    capabilities = Capabilities(devices=("cuda",), dtypes=("fp16", "bf16", "fp32"), window=True, gate=True)


class SdpaCudnn(SdpaBackend):
    name = "sdpa-cudnn"
    description = "SDPA cuDNN fused attention kernel"
    sdpa_backend_name = "CUDNN_ATTENTION"
    capabilities = Capabilities(devices=("cuda",), dtypes=("fp16", "bf16"), max_head_dim=256,
                                min_compute_capability=(8, 0), gate=True)

    def extra_reason(self, spec, device):
        if torch.version.hip is not None:
            return "cuDNN is not available on ROCm"
        return None
