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
from dataclasses import dataclass, field

import torch

from attnbench.models import swap


@dataclass(frozen=True, kw_only=True)
class DitPreset:
    """One model: diffusers class, its config, the latent input and how many attention calls a block makes."""

    cls: str
    """Class name in ``diffusers``."""
    config: dict
    """Constructor arguments (the model's config.json)."""
    latent: tuple[int, int, int, int]
    """Latent video (frames, channels, height, width) as the model's forward takes it."""
    text_tokens: int
    """Text-encoder tokens (encoder_hidden_states length)."""
    text_dim: int
    """Text-encoder width."""
    batch: int = 2
    """Batch (2 = classifier-free guidance)."""
    dtype: str = "fp16"
    """Default compute dtype."""
    calls_per_block: int = 1
    """Attention calls made by one transformer block."""
    channels_first: bool = False
    """Latent as (B, C, F, H, W) (Wan) instead of (B, F, C, H, W) (CogVideoX)."""
    joint_text: bool = False
    """The self-attention runs over the text and video tokens together (CogVideoX) instead of the video alone."""
    extra: dict = field(default_factory=dict)
    """Other forward keyword arguments."""


PRESETS: dict[str, DitPreset] = {
    "cogvideox-2b": DitPreset(
        cls="CogVideoXTransformer3DModel",
        config=dict(num_attention_heads=30, attention_head_dim=64, in_channels=16, out_channels=16,
                    time_embed_dim=512, text_embed_dim=4096, num_layers=30, sample_width=90, sample_height=60,
                    sample_frames=49, patch_size=2, temporal_compression_ratio=4, max_text_seq_length=226,
                    use_rotary_positional_embeddings=False),
        latent=(13, 16, 60, 90), text_tokens=226, text_dim=4096, joint_text=True),
    "cogvideox-tiny": DitPreset(
        cls="CogVideoXTransformer3DModel",
        config=dict(num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=4, time_embed_dim=8,
                    text_embed_dim=12, num_layers=2, sample_width=8, sample_height=6, sample_frames=5, patch_size=2,
                    temporal_compression_ratio=4, max_text_seq_length=7),
        latent=(2, 4, 6, 8), text_tokens=7, text_dim=12, dtype="fp32", joint_text=True),
    "wan-1.3b": DitPreset(
        cls="WanTransformer3DModel",
        config=dict(patch_size=(1, 2, 2), num_attention_heads=12, attention_head_dim=128, in_channels=16,
                    out_channels=16, text_dim=4096, freq_dim=256, ffn_dim=8960, num_layers=30, cross_attn_norm=True,
                    qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=1024),
        latent=(21, 16, 60, 104), text_tokens=512, text_dim=4096, dtype="bf16", calls_per_block=2,
        channels_first=True),
    "wan-tiny": DitPreset(
        cls="WanTransformer3DModel",
        config=dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=8, in_channels=4,
                    out_channels=4, text_dim=12, freq_dim=16, ffn_dim=24, num_layers=2, rope_max_seq_len=64),
        latent=(2, 4, 6, 8), text_tokens=7, text_dim=12, dtype="fp32", calls_per_block=2, channels_first=True),
}


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
