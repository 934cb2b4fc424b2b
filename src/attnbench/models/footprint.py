"""How much memory an end-to-end model run needs, estimated before anything is allocated (``attnbench e2e``).

The model is built on PyTorch's ``meta`` device (shapes, no storage) to count its parameters and buffers,
and the estimate adds what a step cannot do without. Like the kernel memory guard (``memory.py``) it errs
low: a run it lets through may still run out of memory (that is caught and recorded); a run it refuses
could not have fitted.

- **weights**: parameters and buffers in the compute dtype (Llama is built in it); a diffusers model is
  built in fp32 and cast afterwards, so building it peaks at 4 bytes per element;
- **activations** of one step: the token ids or latents in, the output (Llama's logits: batch x tokens x
  vocabulary), one residual stream and one MLP hidden; in ``train`` mode also one residual stream per
  block (kept for the backward) and the fp32 logits of the loss;
- **gradients** (``train``): one per parameter;
- **attention**: one call of the model's self-attention in a fused kernel (q, k, v, out, LSE; and their
  gradients in ``train``). A backend that materialises the score matrix needs more: ``attention_spec`` is
  the case its own guard (``memory.guard``) checks before it runs, recorded as ``oom`` when it cannot fit.
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass

import torch

from attnbench import memory
from attnbench.linear.spec import RecurrenceSpec
from attnbench.models import dit, llama
from attnbench.spec import DTYPES, AttnSpec


@dataclass(frozen=True)
class Footprint:
    """Bytes of an e2e run, by kind (see the module doc)."""

    weights: int
    build_peak: int
    """Weights while the model is built (a diffusers model: fp32 before its cast)."""
    activations: int
    grads: int
    attention: int

    @property
    def total(self) -> int:
        """The larger of the build and a step."""
        return max(self.build_peak, self.weights + self.activations + self.grads + self.attention)

    def parts(self) -> str:
        parts = [("weights", self.weights), ("activations", self.activations), ("gradients", self.grads),
                 ("attention", self.attention)]
        text = ", ".join(f"{name} {memory.format_bytes(n)}" for name, n in parts if n)
        if self.build_peak > self.weights + self.activations + self.grads + self.attention:
            text += f"; {memory.format_bytes(self.build_peak)} while it is built in fp32"
        return text


def _count(model: torch.nn.Module) -> int:
    return sum(t.numel() for t in (*model.parameters(), *model.buffers()))


def attention_spec(cfg) -> AttnSpec:
    """The model's self-attention call (``cfg`` an E2EConfig), as the swap will see it."""
    pass_ = "fwd_bwd" if cfg.mode == "train" else "fwd"
    if cfg.model in llama.CONFIGS:
        c = llama.CONFIGS[cfg.model]
        batch, seq = cfg.llama_shape()
        return AttnSpec(batch=batch, seqlens_q=(seq,), heads_q=c.n_heads, heads_kv=c.n_kv_heads, head_dim=c.head_dim,
                        dtype=cfg.dtype or "bf16", causal=True, pass_=pass_)
    preset = dit.PRESETS[cfg.model]
    return AttnSpec(batch=preset.batch, seqlens_q=(dit.self_attention_tokens(cfg.model),),
                    heads_q=preset.config["num_attention_heads"], head_dim=preset.config["attention_head_dim"],
                    dtype=cfg.dtype or preset.dtype, pass_=pass_)


def recurrence_spec(cfg) -> RecurrenceSpec | None:
    """A hybrid model's GDN call (``cfg`` an E2EConfig), as the swap will see it; None for a model without one."""
    c = llama.CONFIGS.get(cfg.model)
    if c is None or c.gdn is None:
        return None
    batch, seq = cfg.llama_shape()
    return RecurrenceSpec(kind="gdn", batch=batch, seqlens=(seq,), heads_qk=c.gdn.heads_qk, heads_v=c.gdn.heads_v,
                          d_k=c.gdn.d_k, d_v=c.gdn.d_v, dtype=cfg.dtype or "bf16", l2norm=True,
                          pass_="fwd_bwd" if cfg.mode == "train" else "fwd")


def estimate(cfg) -> Footprint:
    """The footprint of E2EConfig ``cfg`` (no memory is allocated)."""
    train = cfg.mode == "train"
    spec = attention_spec(cfg)
    elem = DTYPES[spec.dtype].itemsize
    attn = memory.estimate(spec)
    attention = attn.total - attn.inputs + (attn.inputs if train else 0)  # q, k, v, out are made by the model
    if cfg.model in llama.CONFIGS:
        c = dataclasses.replace(llama.CONFIGS[cfg.model], n_layers=cfg.layers or llama.CONFIGS[cfg.model].n_layers)
        batch, seq = cfg.llama_shape()
        with torch.device("meta"):
            n = _count(llama.Llama(dataclasses.replace(c, max_seq_len=max(seq, 2))))
        weights = build = n * elem
        tokens = batch * seq
        acts = tokens * 8 + tokens * c.vocab_size * elem + tokens * (c.dim + 2 * c.ffn_dim) * elem
        if train:
            acts += c.n_layers * tokens * c.dim * elem + tokens * c.vocab_size * 4
    else:
        preset = dit.PRESETS[cfg.model]
        config = dict(preset.config, num_layers=cfg.layers or preset.config["num_layers"])
        with torch.device("meta"):
            n = _count(getattr(importlib.import_module("diffusers"), preset.cls)(**config))
        weights, build = n * elem, n * 4
        latent = preset.batch * torch.Size(preset.latent).numel() * elem
        hidden = spec.batch * spec.seqlens_q[0] * spec.heads_q * spec.head_dim * elem
        text = preset.batch * preset.text_tokens * preset.text_dim * elem
        acts = 2 * latent + text + hidden + (config["num_layers"] * hidden if train else 0)
    return Footprint(weights=weights, build_peak=build, activations=acts, grads=n * elem if train else 0,
                     attention=attention)


def refusal(cfg) -> str | None:
    """Why ``cfg`` cannot fit on its device (the estimate and what is available), or None."""
    free = memory.available_bytes(cfg.device)
    if free is None:
        return None
    need = estimate(cfg)
    if need.total <= free:
        return None
    return (f"--model {cfg.model} ({cfg.mode}{f', {cfg.layers} layers' if cfg.layers else ''}) needs about "
            f"{memory.format_bytes(need.total)} ({need.parts()}), {memory.format_bytes(free)} available on "
            f"{cfg.device} (estimated; not run): use --layers, a smaller --batch-size / --seq-len, or a device "
            "with more memory")
