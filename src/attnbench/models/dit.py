"""Video diffusion transformers from diffusers, built from their configs with seeded random weights.

No downloads: the model class is instantiated from a config dict, so only ``diffusers`` itself is
needed (imported lazily: attnbench imports without it). One forward = one denoising step.

``cogvideox-2b``: CogVideoXTransformer3DModel, 30 layers, 30 heads x 64, 49 frames 480x720 ->
latent 13x60x90, patch 2 -> 17,550 video tokens + 226 text tokens, batch 2 (classifier-free
guidance), fp16. Every block makes one joint text+video self-attention call (17,776 tokens) through
``F.scaled_dot_product_attention``.
``wan-1.3b``: WanTransformer3DModel (Wan2.1 T2V 1.3B shape), 30 layers, 12 heads x 128, 81 frames
480x832 -> latent 21x60x104, patch (1,2,2) -> 32,760 video tokens, 512 text tokens, batch 2, bf16.
Each block makes two dispatcher calls: self-attention and cross-attention to the text.
``*-tiny``: the same classes with tiny widths for CPU tests.
"""

from __future__ import annotations

import importlib

import torch

from attnbench.models import swap
from attnbench.models.config import DIT_PRESETS as PRESETS
from attnbench.models.config import DitPreset


def unavailable_reason(name: str) -> str | None:
    """Why preset ``name`` cannot be built here (diffusers missing, class absent); None if it can."""
    try:
        diffusers = importlib.import_module("diffusers")
    except Exception as exc:
        return f"needs diffusers (pip install 'attnbench[diffusers]'): {type(exc).__name__}: {exc}"
    if not hasattr(diffusers, PRESETS[name].cls):
        return f"diffusers {diffusers.__version__} has no {PRESETS[name].cls}"
    return None


def build_dit(name: str, *, layers: int | None = None, device: str | torch.device = "cpu",
              dtype: torch.dtype | None = None, seed: int = 0):
    """``(model, inputs)``: preset ``name`` with seeded random weights in eval mode and its forward kwargs."""
    if name not in PRESETS:
        raise ValueError(f"unknown DiT preset {name!r}; known: {', '.join(PRESETS)}")
    reason = unavailable_reason(name)
    if reason:
        raise RuntimeError(reason)
    preset = PRESETS[name]
    from attnbench.spec import DTYPES
    dtype = dtype or DTYPES[preset.dtype]
    config = dict(preset.config)
    if layers is not None:
        config["num_layers"] = layers
    cls = getattr(importlib.import_module("diffusers"), preset.cls)
    torch.manual_seed(seed)  # diffusers draws its initial weights from the global generator
    with torch.device(device):
        model = cls(**config)
    model = _cast(model, dtype).eval()
    _add_block_nvtx(model, torch.device(device).type == "cuda")
    return model, _inputs(preset, device, dtype, seed)


def _cast(model, dtype: torch.dtype):
    """Cast to ``dtype`` but keep the modules the class marks fp32-only in fp32, as ``from_pretrained`` does."""
    keep = set(getattr(model, "_keep_in_fp32_modules", None) or ())
    for name, module in model.named_modules():
        target = torch.float32 if any(part in keep for part in name.split(".")) else dtype
        for param in module.parameters(recurse=False):
            param.data = param.data.to(target)
        for key, buf in module._buffers.items():
            if buf is not None and buf.is_floating_point():
                module._buffers[key] = buf.to(target)
    return model


def self_attention_tokens(name: str) -> int:
    """Tokens of one self-attention call of preset ``name``: the latent's patches (and the text, joint)."""
    preset = PRESETS[name]
    frames, _channels, height, width = preset.latent
    patch = preset.config["patch_size"]
    pt, ph, pw = patch if isinstance(patch, (tuple, list)) else (1, patch, patch)
    return (frames // pt) * (height // ph) * (width // pw) + (preset.text_tokens if preset.joint_text else 0)


def expected_calls(name: str, layers: int | None = None) -> int:
    """Attention calls of one forward of preset ``name`` (truncated to ``layers`` blocks)."""
    preset = PRESETS[name]
    return (layers or preset.config["num_layers"]) * preset.calls_per_block


def _inputs(preset: DitPreset, device, dtype: torch.dtype, seed: int) -> dict:
    gen = torch.Generator(device=device).manual_seed(seed + 1)
    frames, channels, height, width = preset.latent
    shape = (preset.batch, channels, frames, height, width) if preset.channels_first else \
        (preset.batch, frames, channels, height, width)

    def randn(*s):
        return torch.randn(*s, generator=gen, device=device, dtype=dtype)
    return {"hidden_states": randn(*shape),
            "encoder_hidden_states": randn(preset.batch, preset.text_tokens, preset.text_dim),
            "timestep": torch.full((preset.batch,), 500, device=device, dtype=torch.long),
            "return_dict": False, **preset.extra}


def _add_block_nvtx(model, enabled: bool) -> None:
    """An NVTX range per transformer block (forward), for nsys timelines."""
    if not enabled:
        return
    for i, block in enumerate(getattr(model, "transformer_blocks", None) or getattr(model, "blocks", [])):
        # Hooks must return None: a value returned by a hook replaces the block's inputs or output,
        # and range_push/range_pop return the nesting depth.
        block.register_forward_pre_hook(lambda *_a, i=i: None if torch.cuda.nvtx.range_push(f"block{i}") else None)
        block.register_forward_hook(lambda *_a: None if torch.cuda.nvtx.range_pop() else None)


def forward(model, inputs: dict) -> torch.Tensor:
    """One denoising step: the model's output latent."""
    return model(**inputs)[0]


__all__ = ["PRESETS", "DitPreset", "build_dit", "expected_calls", "forward", "swap", "unavailable_reason"]
