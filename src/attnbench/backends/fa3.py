"""FlashAttention-3 (Hopper build of flash-attn, module ``flash_attn_interface``).

- ``fa3``        flash_attn_func(q, k, v, softmax_scale=, causal=, window_size=(left, right), ...)
- ``fa3-varlen`` flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, ...)

Same conventions as flash-attn 2 (bshd / thd, lower-right causal, -1 = unbounded window side). Older
builds always return (out, lse); newer ones return out unless ``return_attn_probs=True``, which is
passed where the signature has it. Needs compute capability 9.0.

Trimmed builds. FA3's ``setup.py`` can leave features out (``FLASHATTENTION_DISABLE_*``); a call that
needs a missing template does not raise, it crashes the process. Builds record their switches in the
module ``flash_attn_config`` (``CONFIG["build_flags"]``), so the capabilities are narrowed to what the
installed build has (``build_capabilities``) and a case it lacks is an ``unsupported`` record whose
reason names the switch, never a crash of the sweep.

Logit softcap: ``softcap=c`` (applied to the scaled scores, forward and backward) in builds that have it
(not the trimmed one: ``FLASHATTENTION_DISABLE_SOFTCAP``). FA3 has no sinks and no ALiBi.

FP8 (``fp8`` / ``fp8-head`` cases, forward only): the e4m3 q, k, v go in as they are with
``q_descale``, ``k_descale``, ``v_descale`` of shape (sequences, KV heads) in float32 — the case's
per-tensor or per-KV-head descales repeated for every sequence — and the output comes back in bf16.
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import replace

from attnbench.backends.base import Capabilities, Prepared, check_capabilities
from attnbench.backends.kernel import (
    KernelBackend,
    dense_closure,
    dense_functional,
    effective_window,
    has_param,
    varlen_closure,
)
from attnbench.inputs import AttnInputs
from attnbench.spec import FP8_DTYPES, AttnSpec

_CAPS = Capabilities(devices=("cuda",), dtypes=("fp16", "bf16", *FP8_DTYPES), max_head_dim=256, head_dim_multiple=8,
                     window=True, softcap=True, gate=True, min_compute_capability=(9, 0))
NO_FP8_BACKWARD = "FlashAttention-3 has no FP8 backward (fp8 cases are forward only)"
HEAD_DIM_KERNELS = (64, 96, 128, 192, 256)
"""FA3's head-size templates: a head size runs the smallest template at least as large."""


@functools.cache
def build_flags() -> dict[str, bool]:
    """The installed build's ``FLASHATTENTION_DISABLE_*`` switches ({} when the build does not record them)."""
    try:
        config = importlib.import_module("flash_attn_config").CONFIG
    except Exception:  # full builds before the config module existed: assume everything is there
        return {}
    return {k: bool(v) for k, v in dict(config.get("build_flags", {})).items()}


def build_capabilities(caps: Capabilities, flags: dict[str, bool]) -> Capabilities:
    """``caps`` narrowed to what a build with ``flags`` contains."""
    def off(feature: str) -> bool:
        return flags.get(f"FLASHATTENTION_DISABLE_{feature}", False)
    kept = [d for d in HEAD_DIM_KERNELS if not off(f"HDIM{d}")]
    return replace(
        caps,
        max_head_dim=min(caps.max_head_dim, max(kept, default=0)),
        dtypes=tuple(d for d in caps.dtypes if not (d == "fp16" and off("FP16")) and not (d in FP8_DTYPES and off("FP8"))),
        window=caps.window and not off("LOCAL"),
        softcap=caps.softcap and not off("SOFTCAP"),
        backward=caps.backward and not off("BACKWARD"),
        varlen=caps.varlen and not off("VARLEN"),
        different_v_dim=caps.different_v_dim and not (flags.get("FLASH_ATTENTION_DISABLE_HDIMDIFF64", False)
                                                       and flags.get("FLASH_ATTENTION_DISABLE_HDIMDIFF192", False)),
    )


def disabled_features(flags: dict[str, bool]) -> list[str]:
    """Short names of what the build left out, e.g. ['LOCAL', 'FP8', 'HDIM256']."""
    return sorted(k.split("DISABLE_", 1)[1] for k, v in flags.items() if v and "DISABLE_" in k)


def build_lacks(declared: Capabilities, spec: AttnSpec, device) -> str | None:
    """Why the installed build cannot run a case that a full build with ``declared`` takes ("… in this
    FlashAttention-3 build (built without X, Y)"); None when the full build would refuse it too, or this one has it."""
    if check_capabilities(declared, spec, device) is not None:
        return None
    flags = build_flags()
    reason = check_capabilities(build_capabilities(declared, flags), spec, device)
    return reason and f"{reason} in this FlashAttention-3 build (built without {', '.join(disabled_features(flags))})"


class Fa3Build:
    """Mixin of every backend that calls the installed FA3 build: its capabilities are ``declared`` narrowed
    to what the build contains, and a case only the build lacks is refused naming the missing switches."""

    declared: Capabilities = _CAPS
    """What FA3 can do in a full build; ``capabilities`` is this narrowed to the installed build."""

    @property
    def capabilities(self) -> Capabilities:
        return build_capabilities(self.declared, build_flags())

    def supports(self, spec: AttnSpec, device) -> str | None:
        if unavailable := self.unavailable_reason():
            return unavailable
        reason = check_capabilities(self.capabilities, spec, device)
        if reason:
            return build_lacks(self.declared, spec, device) or reason
        if not reason and spec.is_fp8 and spec.pass_ != "fwd":
            reason = NO_FP8_BACKWARD
        return reason or self.extra_reason(spec, device)


def descale_kwargs(inputs: AttnInputs, sequences: int) -> dict:
    """FP8 inputs' ``q_descale``/``k_descale``/``v_descale`` as FA3 takes them, (sequences, KV heads) float32;
    {} for other inputs. Built once in ``prepare``, outside the timed call."""
    if inputs.descale is None:
        return {}
    return {f"{name}_descale": d[None].expand(sequences, -1).contiguous()
            for name, d in zip("qkv", inputs.descale, strict=True)}


class _Fa3(Fa3Build, KernelBackend):
    package = "flash_attn_interface"
    distribution = "flash_attn_3"
    install = "build it from flash-attention's hopper/ folder (cd hopper && pip install . --no-build-isolation)"
    build_limits = ("This flash attention build does not support",)  # the hopper/ build's FLASHATTENTION_DISABLE_*

    def kwargs(self, spec: AttnSpec, fn) -> dict:
        kw = {"softmax_scale": spec.softmax_scale, "causal": spec.causal,
              "window_size": effective_window(spec) if spec.has_window else (-1, -1)}
        if spec.softcap is not None:
            kw["softcap"] = spec.softcap
        if has_param(fn, "return_attn_probs"):
            kw["return_attn_probs"] = True
        return kw

    def info(self, spec: AttnSpec, **extra) -> dict:
        trimmed = disabled_features(build_flags())
        return self.base_info() | {"gqa": "native" if spec.gqa else "none",
                                   "build_disabled": trimmed or None} | extra


class Fa3(_Fa3):
    name = "fa3"
    description = "FlashAttention-3 flash_attn_func (Hopper, bshd)"
    function = "flash_attn_func"

    def functional(self, spec: AttnSpec):
        fn = self.kernel()
        return dense_functional(fn, self.kwargs(spec, fn))

    def prepare(self, spec: AttnSpec, inputs: AttnInputs) -> Prepared:
        fn = self.kernel()
        kwargs = self.kwargs(spec, fn) | descale_kwargs(inputs, spec.batch)
        return Prepared(fn=dense_closure(spec, inputs, fn, kwargs), info=self.info(spec))


class Fa3Varlen(_Fa3):
    name = "fa3-varlen"
    description = "FlashAttention-3 flash_attn_varlen_func (Hopper, packed + cu_seqlens)"
    function = "flash_attn_varlen_func"
    declared = replace(_CAPS, varlen=True)

    def prepare(self, spec: AttnSpec, inputs: AttnInputs) -> Prepared:
        fn = self.kernel()
        sequences = len(spec.sequences)
        closure, p = varlen_closure(spec, inputs, fn, self.kwargs(spec, fn) | descale_kwargs(inputs, sequences))
        return Prepared(fn=closure, info=self.info(spec, flattened_dense=p.batch is not None))
