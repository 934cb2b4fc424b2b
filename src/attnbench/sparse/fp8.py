"""DeepSeek-V3.2's FP8 cache rows: 656 bytes a token, as FlashMLA's sparse FP8 decode reads them.

**Layout** (``flash_mla/flash_mla_interface.py:94-98`` of deepseek-ai/FlashMLA @9241ae3; the kernel checks the row
stride, ``csrc/sm90/decode/sparse_fp8/splitkv_mla.cuh:702``)::

    bytes [0, 512)    the latent (the first 512 of the row's 576 values) as 512 float8_e4m3fn
    bytes [512, 528)  4 float32 scales, one per 128 latent values (little-endian, as the GPU stores them)
    bytes [528, 656)  the rope part (the last 64 values) as 64 bfloat16, not quantized

**Quantizer** — FlashMLA's, ``tests/quant.py:17-53`` (``quantize_k_cache`` with ``V32_FP8Sparse``): per tile of 128
latent values, ``scale = amax(|x|).float() / 448`` rounded *up* to a power of two,
``torch.pow(2, clamp_min(scale, 1e-4).log2().ceil())`` (``_cast_scale_inv_to_ue8m0``: so ``x / scale`` is at most
448, e4m3's largest finite value; the floor is on the scale, so every tile with amax < 448e-4 = 0.0448, an all-zero
one included, gets 2^-13), then ``(x.float() / scale).to(e4m3)`` (round to
nearest even). The scale is stored as a float32 but is always a power of two (a UE8M0 value). ``quantize_rows``
runs those very torch operations, so on one device it writes the same bytes; the power-of-two rounding goes
through ``log2`` in float32, so a scale within one float32 round-off above a power of two may round differently
on another device or in DeepGEMM's bit-exact ``ceil_to_ue8m0`` (``deep_gemm/utils/math.py:13``).

**Dequantizer** — ``tests/quant.py:81-104``: ``e4m3.float() · scale`` into bfloat16, the rope bytes as they are.
The kernel converts the scale to bfloat16 first and multiplies in bfloat16 (``splitkv_mla.cuh:550``); with a
power-of-two scale both are exact (an e4m3 value has 3 mantissa bits, bfloat16 keeps 7), so the dequantized
row is the value the kernel computes with, and the exact reference of an FP8 case is the reference of the
dequantized cache.

``e4m3_blocks`` is the same per-block quantizer for other tensors: the indexer's keys (one float32 scale per
token, DeepGEMM's ``per_custom_dims_cast_to_fp8``, ``deep_gemm/utils/math.py:64-70``) and queries (DeepSeek's
``act_quant``, ``inference/kernel.py:37-111`` of DeepSeek-V3.2-Exp, UE8M0 scales with ``scale_fmt = "ue8m0"``).
"""

from __future__ import annotations

import torch

E4M3_MAX = 448.0
"""Largest finite float8_e4m3fn value: a tile's amax is scaled onto it."""
LATENT, ROPE, TILE = 512, 64, 128
"""Latent values (quantized), rope values (kept in bf16), latent values per scale."""
TILES = LATENT // TILE
ROW_BYTES = LATENT + 4 * TILES + 2 * ROPE
"""656: bytes of one token's cached row."""
MIN_AMAX = 1e-4
"""FlashMLA's floor of a tile's scale (amax / 448) before rounding, DeepGEMM's and DeepSeek's of the amax itself."""


def ue8m0(scale: torch.Tensor) -> torch.Tensor:
    """``scale`` (float32) rounded up to a power of two as FlashMLA's quantizer does (module docstring)."""
    return torch.pow(2, torch.clamp_min(scale, MIN_AMAX).log2().ceil()).to(torch.float32)


def e4m3_blocks(x: torch.Tensor, block: int, *, pow2: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3 values like x, float32 scales (..., D / block)) of x (..., D), as DeepGEMM and DeepSeek quantize the
    indexer's keys and queries: per ``block`` consecutive values of the last dim ``scale = max(amax, 1e-4) / 448``,
    with ``pow2`` rounded up to a power of two bit-exactly (``ceil_to_ue8m0``), values ``x / scale``;
    ``values.float() · scale`` stands for x."""
    if x.shape[-1] % block:
        raise ValueError(f"the last dim ({x.shape[-1]}) must be a multiple of the block ({block})")
    tiles = x.float().unflatten(-1, (-1, block))
    scale = torch.clamp_min(tiles.abs().amax(dim=-1), MIN_AMAX) / E4M3_MAX
    if pow2:
        mantissa, exponent = torch.frexp(scale)  # scale = m · 2^e, m in [0.5, 1)
        scale = torch.ldexp(torch.ones_like(scale), exponent - (mantissa == 0.5).to(exponent.dtype))
    values = (tiles / scale[..., None]).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return values.flatten(-2), scale


def quantize_rows(cache: torch.Tensor) -> torch.Tensor:
    """(..., 656) uint8 rows of a bfloat16 cache (..., 576), byte for byte as FlashMLA's quantizer (module doc)."""
    if cache.dtype != torch.bfloat16 or cache.shape[-1] != LATENT + ROPE:
        raise ValueError(f"a V3.2 cache is bfloat16 (..., {LATENT + ROPE}), got {cache.dtype} {tuple(cache.shape)}")
    flat = cache.reshape(-1, LATENT + ROPE)
    out = torch.empty(flat.shape[0], ROW_BYTES, dtype=torch.uint8, device=cache.device)
    latent, scales, rope = _fields(out)
    rope.copy_(flat[:, LATENT:])
    for i in range(TILES):
        tile = flat[:, i * TILE:(i + 1) * TILE]
        scale = ue8m0(tile.abs().amax(dim=-1).float() / E4M3_MAX)  # the bf16 amax, then float32, as FlashMLA
        scales[:, i] = scale
        latent[:, i * TILE:(i + 1) * TILE] = (tile.float() / scale[:, None]).to(torch.float8_e4m3fn)
    return out.view(*cache.shape[:-1], ROW_BYTES)


def dequantize_rows(rows: torch.Tensor) -> torch.Tensor:
    """(..., 576) bfloat16 values of (..., 656) uint8 rows: each latent value times its tile's scale, the rope
    part as stored."""
    latent, scales, rope = unpack_rows(rows)
    values = latent.float().unflatten(-1, (TILES, TILE)) * scales[..., None]
    return torch.cat([values.flatten(-2).to(torch.bfloat16), rope], dim=-1)


def unpack_rows(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The three fields of (..., 656) uint8 rows, as views: latent (..., 512) e4m3, scales (..., 4) float32, rope
    (..., 64) bfloat16."""
    if rows.dtype not in (torch.uint8, torch.int8, torch.float8_e4m3fn) or rows.shape[-1] != ROW_BYTES:
        raise ValueError(f"V3.2 FP8 rows are (..., {ROW_BYTES}) bytes, got {rows.dtype} {tuple(rows.shape)}")
    flat = rows.reshape(-1, ROW_BYTES).view(torch.uint8)
    lead = rows.shape[:-1]
    latent, scales, rope = _fields(flat)
    return latent.view(*lead, LATENT), scales.view(*lead, TILES), rope.view(*lead, ROPE)


def _fields(flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Views of (M, 656) uint8 rows as (latent e4m3 (M, 512), scales float32 (M, 4), rope bf16 (M, 64))."""
    return (flat[:, :LATENT].view(torch.float8_e4m3fn), flat[:, LATENT:LATENT + 4 * TILES].view(torch.float32),
            flat[:, LATENT + 4 * TILES:].view(torch.bfloat16))
