"""Backends of recurrence cases (``Backend.operator = "recurrence"``): PyTorch's two forms and fla's kernels.

- ``torch-recurrent``: the token loop of the definition on the case's dtype, computed in fp32 as fla's recurrent
  kernels do (``torch_forms.naive_recurrent``), the yardstick of the check; any device.
- ``torch-chunked``: the chunk form in PyTorch, its products in the case's dtype and its gates and state in fp32,
  as the chunk kernels keep them (``torch_forms.chunked``); any device.
- ``fla-chunk`` / ``fla-recurrent``: fla-core's ``chunk_*`` and ``fused_recurrent_*`` kernels (``linear.fla``;
  Triton, CUDA only). fla's own refusals (a chunk size, a backward it lacks) are the backend's.
- ``flashinfer-gdn`` / ``flashinfer-gdn-decode``: FlashInfer 0.7.2.post1's GDN chunked prefill and decode
  (``linear.flashinfer``; CuTe DSL, forward only; written against its source, run on an H200);
  ``--backend-opt flashinfer-gdn.use_cp=never|always`` pins its routing (default auto: FlashInfer's context-parallel
  kernel when N x value heads is below half the SM count), ``flashinfer-gdn-decode.reset_state=false`` times the
  in-place decode without the copy of the case's state that each call otherwise starts with.
- ``cudnn-kda``: cuDNN frontend 1.32's KDA (``linear.cudnn_kda``; its Hopper engines, forward and a narrower
  backward; written against the wheel's source, run on an H200); ``--backend-opt cudnn-kda.plan=kda_hopper_cuda|
  kda_hopper`` pins one engine.
- ``flashqla``: FlashQLA 0.1.3's GDN chunked prefill, forward and backward (``linear.flashqla``; TileLang; written
  against its source, run on an H200); ``--backend-opt flashqla.auto_cp=false`` keeps it from splitting a
  long sequence over the GPU (its default, True, may).

Each call of a closure returns ``Outputs`` in the reference's layout; with ``fwd_bwd`` the gradients come from
autograd inside the call, as attention's ``autograd_closure`` does.

``functional(spec)`` is the same computation on a caller's own tensors (a model's layer: ``models/swap.py``):
``fn(tensors, cu_seqlens=None) -> (out, final_state)``, the inputs by name (``spec.input_names``) in the input
layout, differentiable. Every form takes the gates and the state in fp32 and the rest in the case's dtype, as the
kernels do.
"""

from __future__ import annotations

import torch

from attnbench.backends.base import Backend, Capabilities, Prepared
from attnbench.linear import cudnn_kda, fla
from attnbench.linear import flashinfer as fi
from attnbench.linear import flashqla as qla
from attnbench.linear.inputs import FP32_INPUTS
from attnbench.linear.spec import RecurrenceSpec
from attnbench.linear.torch_forms import (
    careful_recurrent_form,
    chunk_workspace_bytes,
    chunked,
    chunked_form,
    naive_recurrent,
)

DTYPES = ("fp16", "bf16", "fp32", "fp64")


class _RecurrenceBackend(Backend):
    operator = "recurrence"
    capabilities = Capabilities(dtypes=DTYPES, varlen=True, backward=True)

    def functional(self, spec: RecurrenceSpec):
        """``fn(tensors, cu_seqlens=None) -> (out, final_state)`` on a caller's tensors (module doc)."""
        raise NotImplementedError


def _gates_in_fp32(call, spec: RecurrenceSpec):
    """A differentiable call on a caller's tensors: the gates in fp32, the rest in the case's dtype, each made
    contiguous (a model's q, k, v are often views of one projection)."""
    def fn(tensors: dict, cu_seqlens=None):
        return call({name: (x.float() if name in FP32_INPUTS else x.to(spec.torch_dtype)).contiguous()
                     for name, x in tensors.items()}, cu_seqlens)
    return fn


def _torch_form(form, spec: RecurrenceSpec):
    """A torch form on a caller's tensors, gates in fp32 (dense: a varlen call's offsets are the spec's)."""
    return _gates_in_fp32(lambda tensors, cu_seqlens: form(spec, tensors), spec)


class TorchRecurrent(_RecurrenceBackend):
    name = "torch-recurrent"
    description = "the recurrence token by token in PyTorch, computed in fp32 on the case's dtype (the check's yardstick)"

    def prepare(self, spec, inputs) -> Prepared:
        return Prepared(fn=lambda: naive_recurrent(spec, inputs),
                        info={"kernel": "token loop (torch)", "form": "recurrent"})

    def functional(self, spec):
        return _torch_form(careful_recurrent_form, spec)


class TorchChunked(_RecurrenceBackend):
    name = "torch-chunked"
    description = "the chunk form in PyTorch (WY representation), products in the case's dtype, gates and state in fp32"

    def prepare(self, spec, inputs) -> Prepared:
        return Prepared(fn=lambda: chunked(spec, inputs), info={"kernel": "chunk form (torch)", "form": "chunked",
                                                                "chunk": spec.chunk})

    def functional(self, spec):
        return _torch_form(chunked_form, spec)

    def workspace_bytes(self, spec) -> int:
        """The chunk form's per-chunk matrices (``torch_forms.chunk_workspace_bytes``), for the memory guard."""
        return chunk_workspace_bytes(spec)


class _Fla(_RecurrenceBackend):
    package = "fla"
    distribution = "fla-core"
    install = "pip install fla-core"
    capabilities = Capabilities(dtypes=("fp16", "bf16", "fp32"), varlen=True, backward=True, devices=("cuda",))
    op = "chunk"

    def extra_reason(self, spec, device) -> str | None:
        return fla.supports(spec, self.op)

    def prepare(self, spec, inputs) -> Prepared:
        return Prepared(fn=fla.prepare(spec, inputs, self.op),
                        info={"kernel": fla.kernel_name(spec, self.op), "form": self.op})

    def functional(self, spec):
        return _gates_in_fp32(fla.kernel(spec, self.op), spec)


class FlaChunk(_Fla):
    name = "fla-chunk"
    description = "fla-core's chunk_* Triton kernels (chunk_gated_delta_rule, chunk_kda, chunk_simple_gla)"


class FlaRecurrent(_Fla):
    name = "fla-recurrent"
    description = "fla-core's fused_recurrent_* Triton kernels (one token at a time; forward only for gdn, kda)"
    op = "recurrent"


class _FlashInferGdn(_RecurrenceBackend):
    package = "flashinfer"
    distribution = "flashinfer-python"
    install = "pip install flashinfer-python==0.7.2.post1 (its CuTe DSL: nvidia-cutlass-dsl[cu13]; see docs/linear.md)"
    capabilities = Capabilities(dtypes=("fp16", "bf16"), varlen=True, backward=False, devices=("cuda",))
    op = "prefill"

    def extra_reason(self, spec, device) -> str | None:  # the package and the device: Backend.supports
        capability = torch.cuda.get_device_capability(torch.device(device))
        return fi.case_reason(spec, self.op) or fi.arch_reason(self.op, capability, torch.version.cuda) or \
            fi.kernel_reason(self.op, capability[0])

    def _prepared(self, spec, inputs, info: dict, **options) -> Prepared:
        call = fi.prepare(spec, inputs, self.op, **options)
        return Prepared(fn=call, finish=fi.finish(self.op), rewind=getattr(call, "rewind", None),
                        info={"kernel": fi.kernel_name(self.op)} | info)


class FlashInferGdn(_FlashInferGdn):
    name = "flashinfer-gdn"
    description = "FlashInfer's GDN chunked prefill, chunk_gated_delta_rule (d 128, fp16/bf16, sm90/sm100/sm120)"
    option_choices = {"use_cp": tuple(fi.USE_CP)}

    def __init__(self, use_cp: str = "auto"):
        self.use_cp = use_cp
        """FlashInfer's ``use_cp``: auto (its default: the context-parallel kernel when N x value heads is below
        half the SM count), always or never."""

    def prepare(self, spec, inputs) -> Prepared:
        cp = {"always": True, "never": False}.get(self.use_cp, fi.cp_route(spec, inputs.q.device))
        return self._prepared(spec, inputs, {"form": "chunk", "use_cp": self.use_cp, "context_parallel": cp},
                              use_cp=self.use_cp)


class FlashInferGdnDecode(_FlashInferGdn):
    name = "flashinfer-gdn-decode"
    description = "FlashInfer's GDN decode, gated_delta_rule_decode (one token, K-major state, bf16, sm90)"
    capabilities = Capabilities(dtypes=("bf16",), varlen=True, backward=False, devices=("cuda",))
    op = "decode"

    def __init__(self, reset_state: bool = True):
        self.reset_state = reset_state
        """Copy the case's state into the kernel's in-place buffer before each call (timed with it: as much
        traffic as the kernel's own); False: the state runs on from call to call in the timed calls, and each checked
        call starts from the case's state (``Prepared.rewind``)."""

    def prepare(self, spec, inputs) -> Prepared:
        return self._prepared(spec, inputs, {"form": "recurrent", "reset_state": self.reset_state,
                                             "state_copy_bytes": 2 * 4 * spec.num_seqs * spec.heads_v * spec.d_k *
                                             spec.d_v if self.reset_state else 0},
                              reset_state=self.reset_state)


class FlashQla(_RecurrenceBackend):
    name = "flashqla"
    package = "flash_qla"
    distribution = "flash-qla"
    install = "pip install flash-qla (needs tilelang and nvcc; see docs/linear.md)"
    description = "FlashQLA's GDN chunked prefill, chunk_gated_delta_rule (TileLang; d 128, fp16/bf16, fwd and bwd)"
    capabilities = Capabilities(dtypes=("fp16", "bf16"), varlen=True, backward=True, devices=("cuda",))

    def __init__(self, auto_cp: bool = True):
        self.auto_cp = auto_cp
        """FlashQLA's intra-card split of long sequences at B = 1 (its default: allowed)."""

    def extra_reason(self, spec, device) -> str | None:  # the package and the device: Backend.supports
        return qla.case_reason(spec) or qla.arch_reason(spec, torch.cuda.get_device_capability(torch.device(device)))

    def prepare(self, spec, inputs) -> Prepared:
        return Prepared(fn=qla.prepare(spec, inputs, self.auto_cp),
                        info={"kernel": "flash_qla.chunk_gated_delta_rule", "form": "chunk", "auto_cp": self.auto_cp})

    def functional(self, spec):
        return _gates_in_fp32(qla.kernel(spec, self.auto_cp), spec)


class CudnnKda(_RecurrenceBackend):
    name = "cudnn-kda"
    package = "cudnn"
    distribution = "nvidia-cudnn-frontend"
    install = "pip install nvidia-cudnn-frontend==1.32.0 (with nvidia-cutlass-dsl[cu13]; see docs/linear.md)"
    description = "cuDNN frontend's KDA, kimi_delta_attention (its sm90 engines; d 128, bf16, fwd and bwd)"
    capabilities = Capabilities(dtypes=("bf16",), varlen=True, backward=True, devices=("cuda",))
    option_choices = {"plan": cudnn_kda.PLANS}

    def __init__(self, plan: str = "auto"):
        self.plan = plan
        """cuDNN's engine: auto (its own order: kda_hopper_cuda, then kda_hopper on sm90) or one pinned by name."""

    def extra_reason(self, spec, device) -> str | None:  # the package and the device: Backend.supports
        capability = torch.cuda.get_device_capability(torch.device(device))
        return cudnn_kda.case_reason(spec) or cudnn_kda.arch_reason(capability)

    def prepare(self, spec, inputs) -> Prepared:
        return Prepared(fn=cudnn_kda.prepare(spec, inputs, self.plan),
                        info={"kernel": "cudnn.linear_attention.kimi_delta_attention", "form": "chunk",
                              "plan": self.plan})

    def functional(self, spec):
        return _gates_in_fp32(cudnn_kda.kernel(spec, self.plan), spec)
