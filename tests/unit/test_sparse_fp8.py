"""V3.2's 656-byte FP8 cache rows: the bytes against the layout written out with struct, the quantizer's
power-of-two scales, the round trip, and the block quantizer of the indexer."""

from __future__ import annotations

import math
import struct

import pytest
import torch

from attnbench.sparse.fp8 import ROW_BYTES, dequantize_rows, e4m3_blocks, quantize_rows, ue8m0, unpack_rows


def _cache(rows: int, seed: int = 0) -> torch.Tensor:
    """bf16 (rows, 576) with tiles of very different sizes, and one all-zero tile."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, 576, generator=gen) * torch.logspace(-3, 2, 576 // 64).repeat_interleave(64)
    x[0, 128:256] = 0
    return x.bfloat16()


def test_the_bytes_are_the_layout_written_out():
    cache = _cache(7)
    rows = quantize_rows(cache)
    assert rows.shape == (7, ROW_BYTES) == (7, 656) and rows.dtype == torch.uint8
    for r in range(7):
        raw = bytes(rows[r].tolist())
        for tile in range(4):
            x = cache[r, tile * 128:(tile + 1) * 128].float()
            amax = float(x.abs().max())
            scale = 2.0 ** math.ceil(math.log2(max(amax / 448, 1e-4)))  # FlashMLA: amax/448 up to a power of two
            assert struct.unpack("<f", raw[512 + 4 * tile:516 + 4 * tile])[0] == scale
            want = (x / scale).to(torch.float8_e4m3fn).view(torch.uint8).tolist()
            assert list(raw[tile * 128:(tile + 1) * 128]) == want
        assert raw[528:] == cache[r, 512:].view(torch.uint8).numpy().tobytes()  # the rope part as bf16, untouched


def test_scales_are_powers_of_two_that_keep_every_value_within_e4m3():
    cache = _cache(13, seed=1)
    latent, scales, rope = unpack_rows(quantize_rows(cache))
    mantissa, _ = torch.frexp(scales)
    assert (mantissa == 0.5).all()
    amax = cache[:, :512].float().abs().unflatten(-1, (4, 128)).amax(dim=-1)
    floor = 2.0 ** -13  # FlashMLA floors the scale at 1e-4, rounded up: tiles with amax < 0.0448 all get it
    assert (scales * 448 >= amax).all() and ((scales / 2 * 448 < amax) | (scales == floor)).all()
    assert scales[0, 1] == floor and (amax[scales == floor] <= 448 * 1e-4).all()
    assert (scales > floor).any()
    assert latent.dtype == torch.float8_e4m3fn and rope.dtype == torch.bfloat16


def test_the_round_trip_is_within_half_an_e4m3_step_and_keeps_the_rope_exactly():
    cache = _cache(29, seed=2)
    back = dequantize_rows(quantize_rows(cache))
    assert back.dtype == torch.bfloat16 and back.shape == cache.shape
    assert torch.equal(back[:, 512:], cache[:, 512:])
    x, y = cache[:, :512].float(), back[:, :512].float()
    scale = unpack_rows(quantize_rows(cache))[1].repeat_interleave(128, dim=-1)
    step = torch.maximum(x.abs() * 2 ** -3, scale * 2 ** -9)  # e4m3: 3 mantissa bits; subnormal step 2^-9·scale
    assert ((x - y).abs() <= step / 2).all()
    assert (x - y).abs().max() > 0  # it is a quantizer
    again = quantize_rows(back)  # dequantized values are exact in bf16, so they land on the same e4m3 codes
    same_scale = (unpack_rows(again)[1] == unpack_rows(quantize_rows(cache))[1]).repeat_interleave(128, dim=-1)
    assert torch.equal(unpack_rows(again)[0].view(torch.uint8)[same_scale],
                       unpack_rows(quantize_rows(cache))[0].view(torch.uint8)[same_scale])


def test_any_leading_shape_keeps_its_shape_a_paged_cache_included():
    cache = _cache(3 * 5).view(3, 5, 1, 576)
    rows = quantize_rows(cache)
    assert rows.shape == (3, 5, 1, 656)
    assert torch.equal(rows.view(-1, 656), quantize_rows(cache.view(-1, 576)))
    assert dequantize_rows(rows).shape == (3, 5, 1, 576)


def test_the_quantizer_refuses_what_is_not_a_v32_row():
    with pytest.raises(ValueError, match="bfloat16"):
        quantize_rows(torch.zeros(2, 576))
    with pytest.raises(ValueError, match="656"):
        dequantize_rows(torch.zeros(2, 655, dtype=torch.uint8))


def test_ue8m0_rounds_up_to_a_power_of_two_and_floors_at_1e_4():
    got = ue8m0(torch.tensor([0.25, 0.3, 1.0, 3.0, 0.0, 1e-6]))
    assert got.tolist() == [0.25, 0.5, 1.0, 4.0, 2.0 ** -13, 2.0 ** -13]


def test_block_quantizer_with_power_of_two_scales_is_bit_exact_ceil():
    """The indexer's: a scale exactly a power of two stays, one a float32 ulp above goes up (no log2 rounding)."""
    just_above = torch.nextafter(torch.tensor(2.0 ** -3), torch.tensor(1.0)).item()
    x = torch.tensor([[2.0 ** -3 * 448, 0.0], [just_above * 448, 0.0]])
    _, scale = e4m3_blocks(x, 2, pow2=True)
    exact = torch.tensor([[2.0 ** -3], [2.0 ** -2]])
    plain = e4m3_blocks(x, 2, pow2=False)[1]
    assert torch.equal(scale, exact) and plain[1, 0] > 2.0 ** -3 and plain[1, 0] < 2.0 ** -2


def test_block_quantizer_stands_for_its_input_within_e4m3_rounding():
    x = torch.randn(5, 3, 64, generator=torch.Generator().manual_seed(3)) * 7
    for pow2 in (False, True):
        values, scale = e4m3_blocks(x, 32, pow2=pow2)
        assert values.dtype == torch.float8_e4m3fn and scale.shape == (5, 3, 2)
        back = (values.float().unflatten(-1, (2, 32)) * scale[..., None]).flatten(-2)
        assert ((back - x).abs() <= x.abs() * 2 ** -4 + scale.repeat_interleave(32, -1) * 2 ** -10).all()
        assert values.float().abs().amax() <= 448
