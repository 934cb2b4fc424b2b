"""Sliding tile attention's mask: its definition, the reference and FLOP count that use it, and a check that
fails a kernel whose mask is off by a tile or drops the text band."""

import itertools
import math
import sys

import pytest
import torch
from reliability_helpers import PLUGINS

from attnbench import metrics
from attnbench.accuracy.reference import BlockSizes, reference_attention
from attnbench.backends import registry
from attnbench.backends.base import Backend, Capabilities, Prepared
from attnbench.inputs import make_inputs
from attnbench.runner import Runner, RunOptions
from attnbench.spec import AttnSpec
from attnbench.sta import TileMask
from attnbench.timing import TimingConfig

sys.path.insert(0, PLUGINS)
import attnbench_test_backends  # noqa: E402,F401

SMALL = TileMask(grid=(4, 6, 9), tile=(2, 2, 3), windows=((1, 3, 1), (1, 1, 3)), text=5)
"""2x3x3 tiles of 12 tokens, two heads with different windows, 5 text tokens: 221 tokens."""


def brute_force(tm: TileMask, heads: int) -> torch.Tensor:
    """The mask written out pair by pair from its definition (sta.py's module docstring)."""
    n = tm.tiles
    video = tm.video_tokens
    keep = torch.zeros(heads, tm.tokens, tm.tokens, dtype=torch.bool)
    for h, window in enumerate(tm.head_windows(heads)):
        for qi, ki in itertools.product(range(tm.tokens), repeat=2):
            if qi >= video or ki >= video:
                keep[h, qi, ki] = True
                continue
            qt, kt = qi // tm.tile_tokens, ki // tm.tile_tokens
            q_coord = (qt // (n[1] * n[2]), (qt // n[2]) % n[1], qt % n[2])
            k_coord = (kt // (n[1] * n[2]), (kt // n[2]) % n[1], kt % n[2])
            ok = True
            for qc, kc, size, w in zip(q_coord, k_coord, n, window, strict=True):
                reach = w // 2
                centre = min(max(qc, reach), size - 1 - reach) if 2 * reach <= size - 1 else qc
                ok &= abs(centre - kc) <= reach or 2 * reach > size - 1
            keep[h, qi, ki] = ok
    return keep


def test_the_mask_is_its_definition_pair_by_pair():
    dense = SMALL.dense(2)
    assert torch.equal(dense, brute_force(SMALL, 2))
    assert not torch.equal(dense[0], dense[1])                       # the heads' windows differ
    assert SMALL.pairs_per_head(2) == dense.sum(dim=(1, 2)).tolist()
    edge = brute_force(SMALL, 2)[0, 0, :SMALL.video_tokens].view(-1, SMALL.tile_tokens)[:, 0]
    assert int(edge.sum()) == 3                                       # a corner tile still sees a full 1x3x1 window


def test_blocks_of_the_mask_agree_with_the_whole():
    dense = SMALL.dense(2)
    for a, b, c, d in ((0, 50, 0, 221), (13, 40, 100, 221), (210, 221, 0, 30)):
        assert torch.equal(SMALL.block(a, b, c, d, 2), dense[:, a:b, c:d])


@pytest.mark.parametrize("kwargs, message", [
    (dict(grid=(4, 6, 10), tile=(2, 2, 3)), "not a whole number"),
    (dict(grid=(4, 6, 9), tile=(2, 2, 3), windows=((3, 1, 1),)), "larger than the grid"),
    (dict(grid="4x6", tile=(2, 2, 3)), "three positive integers"),
    (dict(grid=(4, 6, 9), tile=(2, 2, 3), windows=((1, 1, 1),), text=-1), "non-negative"),
])
def test_bad_parameters_are_refused_with_the_reason(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TileMask(**kwargs)


def test_the_spec_carries_the_mask_and_checks_it_fits():
    spec = AttnSpec(seqlens_q=(SMALL.tokens,), heads_q=2, head_dim=16, dtype="fp64", sta=SMALL)
    assert "sta4x6x9/t2x2x3/w1x3x1,1x1x3/2h#" in spec.label() and spec.label().endswith(" text5")
    swapped = spec.replace(sta=TileMask(grid=SMALL.grid, tile=SMALL.tile, windows=SMALL.windows[::-1], text=5))
    assert swapped.label() != spec.label()                            # the same windows on other heads
    assert AttnSpec.from_dict(spec.to_dict()) == spec
    assert "sta" not in AttnSpec(seqlens_q=(64,)).to_dict()          # other cases' records and ids unchanged
    with pytest.raises(ValueError, match="221 tokens"):
        AttnSpec(seqlens_q=(220,), heads_q=2, sta=SMALL)
    with pytest.raises(ValueError, match="2 STA windows for 3 query heads"):
        AttnSpec(seqlens_q=(SMALL.tokens,), heads_q=3, sta=SMALL)
    with pytest.raises(ValueError, match="without causal"):
        AttnSpec(seqlens_q=(SMALL.tokens,), heads_q=2, causal=True, sta=SMALL)


def test_flops_count_the_attended_pairs_of_every_head():
    spec = AttnSpec(seqlens_q=(SMALL.tokens,), heads_q=2, head_dim=16, sta=SMALL, batch=3)
    kept = int(SMALL.dense(2).sum())
    assert metrics.flops(spec) == 2 * (16 + 16) * kept * 3
    assert metrics.flops(spec, convention="dense") == 2 * (16 + 16) * 2 * SMALL.tokens ** 2 * 3
    assert 0 < SMALL.kept_fraction(2) < 1


def masked_attention(q, k, v, keep, scale):
    """softmax over the kept keys, straight from the definition, (B, S, H, D) in and out."""
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    s = s.masked_fill(~keep, -math.inf)
    return torch.einsum("bhqk,bkhd->bqhd", torch.softmax(s, dim=-1), v)


def test_the_reference_applies_the_mask_in_blocks_forward_and_backward():
    spec = AttnSpec(batch=2, seqlens_q=(SMALL.tokens,), heads_q=2, head_dim=16, dtype="fp64", sta=SMALL,
                    pass_="fwd_bwd")
    inputs = make_inputs(spec)
    ref = reference_attention(spec, inputs, blocks=BlockSizes(q=24, k=36))  # many blocks, some skipped
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (inputs.q, inputs.k, inputs.v))
    out = masked_attention(q, k, v, SMALL.dense(2), spec.softmax_scale)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), inputs.dout)
    for name, want in (("out", out), ("dq", dq), ("dk", dk), ("dv", dv)):
        torch.testing.assert_close(getattr(ref, name), want, rtol=1e-10, atol=1e-10, msg=name)


class _WrongSta(Backend):
    """Exact attention under a mask that is not the case's: one window off by a tile, or the text band gone."""

    capabilities = Capabilities(tile_mask=True, backward=False)
    wrong = ""

    def prepare(self, spec, inputs):
        tm = spec.sta
        if self.wrong == "window":
            keep = TileMask(grid=tm.grid, tile=tm.tile, windows=((1, 1, 1), tm.windows[1]), text=tm.text).dense(2)
        else:
            keep = tm.dense(2).clone()
            keep[:, :tm.video_tokens, tm.video_tokens:] = False     # video queries lose the text keys
        from attnbench.backends.base import Outputs
        return Prepared(fn=lambda: Outputs(out=masked_attention(inputs.q, inputs.k, inputs.v, keep,
                                                                 spec.softmax_scale)))


class OffByATile(_WrongSta):
    name, wrong = "test-sta-off-by-a-tile", "window"


class NoTextBand(_WrongSta):
    name, wrong = "test-sta-no-text", "text"


def test_a_mask_bug_fails_the_check_and_the_exact_mask_passes():
    from attnbench.accuracy.check import AccuracyChecker
    for cls in (OffByATile, NoTextBand):
        registry.register(cls.name, cls)
    spec = AttnSpec(seqlens_q=(SMALL.tokens,), heads_q=2, head_dim=16, dtype="fp32", sta=SMALL)
    runner = Runner(RunOptions(device="cpu", backends=("naive", OffByATile.name, NoTextBand.name),
                               timing=TimingConfig(warmup=1, repeat=3)),
                    run_id="t", env_id=None, sink=lambda r: None, checker=AccuracyChecker())
    recs = {r.backend: r for r in runner.run([spec])}
    assert recs["naive"].status == "ok", recs["naive"].reason
    assert recs[OffByATile.name].status == "mismatch"
    assert recs[NoTextBand.name].status == "mismatch"
    assert recs["naive"].info["kept_fraction"] == pytest.approx(SMALL.kept_fraction(2), abs=1e-6)


def test_backends_without_the_mask_refuse_the_case():
    spec = AttnSpec(seqlens_q=(SMALL.tokens,), heads_q=2, head_dim=16, sta=SMALL)
    assert registry.get("sdpa-math").supports(spec, "cpu") == "no sliding tile (STA) mask"
    assert registry.get("sta-triton").supports(AttnSpec(seqlens_q=(64,)), "cuda") is not None


def test_a_models_call_is_reordered_into_tiles_and_back(monkeypatch):
    """sta-triton's model path (text first, video in raster order) with the kernel replaced by exact masked
    attention over the tile-ordered tokens: the result must be exact STA attention in the model's own order."""
    from attnbench.backends import sta as sta_backends
    grid, tile, text = (4, 6, 9), (2, 2, 3), 5
    order = sta_backends.tile_order(TileMask(grid=grid, tile=tile, windows=((1, 1, 1),)))
    assert sorted(order.tolist()) == list(range(4 * 6 * 9))                  # a permutation of the raster
    first_tile = order[:12]
    assert {(int(i) // 54, int(i) // 9 % 6, int(i) % 9) for i in first_tile} == {
        (t, h, w) for t in range(2) for h in range(2) for w in range(3)}     # tile (0, 0, 0) of the raster

    def fake_launcher(tm, heads, scale):
        keep = tm.dense(heads)
        return lambda q, k, v: masked_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), keep,
                                                scale).transpose(1, 2)
    monkeypatch.setattr(sta_backends.StaTriton, "_launcher", staticmethod(fake_launcher))
    backend = sta_backends.StaTriton(grid="4x6x9", tile="2x2x3", window="1x3x1,1x1x3")
    spec = AttnSpec(batch=2, seqlens_q=(text + 216,), heads_q=2, head_dim=16, dtype="fp64")
    inputs = make_inputs(spec)
    got = backend.functional(spec)(inputs.q, inputs.k, inputs.v)
    # the same attention in the model's order: text first, then raster video; the mask mapped through the order
    tm = backend.mask(spec)
    model_pos = torch.cat([order + text, torch.arange(text)])   # tile-ordered token i sits at model_pos[i]
    keep = torch.zeros(2, spec.seqlens_q[0], spec.seqlens_q[0], dtype=torch.bool)
    keep[:, model_pos.view(-1, 1), model_pos.view(1, -1)] = tm.dense(2)
    want = masked_attention(inputs.q, inputs.k, inputs.v, keep, spec.softmax_scale)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    assert tm.text == text and backend.extra_reason(spec.replace(seqlens_q=(200,)), "cuda") is not None
    assert "2 STA windows for 3 query heads" in backend.extra_reason(spec.replace(heads_q=3, heads_kv=3), "cuda")  # a reason


def test_sta_runs_are_drawn_against_the_kept_fraction_not_the_sequence_length():
    from attnbench.report import plots
    from attnbench.results.record import Record
    masks = [TileMask(grid=(4, 6, 9), tile=(2, 2, 3), windows=((1, 1, 1),)),
             TileMask(grid=(4, 6, 9), tile=(2, 2, 3), windows=((1, 3, 3),)),
             TileMask(grid=(2, 6, 9), tile=(2, 2, 3), windows=((1, 1, 3),))]
    rows = [Record(run_id="r", backend=backend, spec=AttnSpec(seqlens_q=(tm.tokens,), heads_q=1, head_dim=16, sta=tm),
                   median_ms=1.0, tflops=1.0, info={"kept_fraction": tm.kept_fraction(1)}).to_row()
            for tm in masks for backend in ("sta", "flex")]
    assert plots.plot_axes(rows) == ["kept"]            # two masks at one sequence length: not a size plot
    assert {p["_x"] for p in plots.points(rows, "kept", "ms")} == {tm.kept_fraction(1) for tm in masks}


def test_the_compiled_kernel_takes_only_what_it_was_built_for_and_says_why():
    from attnbench.backends.sta import Sta, StaTriton

    def case(grid, windows, text=0, **kw):
        tm = TileMask(grid=grid, windows=windows, text=text)
        return AttnSpec(seqlens_q=(tm.tokens,), heads_q=2, head_dim=128, sta=tm, **kw)
    assert Sta().extra_reason(case((18, 48, 80), ((3, 3, 5),)), "cuda") is None
    assert "30x48x80 grid only" in Sta().extra_reason(case((18, 48, 80), ((3, 3, 5),), text=10), "cuda")
    assert "30x48x80 grid only" in Sta().extra_reason(case((30, 48, 80), ((3, 3, 5),)), "cuda")
    assert "3x5x3 is not built" in Sta().extra_reason(case((18, 48, 80), ((3, 5, 3),)), "cuda")
    assert "knows the grids" in Sta().extra_reason(case((12, 16, 24), ((1, 1, 1),)), "cuda")
    assert "1/sqrt" in Sta().extra_reason(case((18, 48, 80), ((3, 3, 5),), scale=0.1), "cuda")
    assert StaTriton().extra_reason(case((12, 16, 24), ((1, 1, 1),), scale=0.1), "cuda") is None  # scale passed on
    assert "one tile of text" in StaTriton().extra_reason(case((12, 16, 24), ((1, 1, 1),), text=385), "cuda")
