"""End-to-end models with the attention swap: every call routed, backends agree, records written."""

import sys

import pytest
import torch

from attnbench.backends.base import BackendUnavailable
from attnbench.models import llama
from attnbench.models.bench import E2EConfig, run_e2e
from attnbench.models.swap import AttnSwap, attention
from attnbench.results.store import ResultStore


def _records(cfg):
    return {r.backend: r for r in run_e2e(cfg, run_id="t")}


@pytest.mark.parametrize("mode", ["prefill", "train"])
def test_tiny_llama_two_backends_agree_and_every_call_routed(mode):
    steps, layers = 3, 2
    cfg = E2EConfig(model="llama-tiny", backends=("naive", "sdpa-math"), mode=mode, layers=layers, steps=steps,
                    dtype="fp32", seq_len=37)
    recs = _records(cfg)
    for r in recs.values():
        e2e = r.info["e2e"]
        assert r.status == "ok", r.reason
        assert e2e["calls"] == layers and e2e["expected_calls"] == layers and e2e["unrouted"] == 0
        assert r.n == steps and 0 < e2e["attn_ms"] and 0 < e2e["total_ms"]
        assert 0 < e2e["attn_share"] <= 1  # the attention of each step within that step, whatever the CPU does
        assert r.info["cpu"]["samples"] == steps and "busy" in r.info["cpu"]
        assert r.spec.seqlens_q == (37,) and r.spec.heads_kv == 2 and r.spec.causal
        assert r.spec.pass_ == ("fwd_bwd" if mode == "train" else "fwd")
        assert (e2e["attn_bwd_ms"] > 0) == (mode == "train")
    other = recs["sdpa-math"].info["e2e"]
    assert other["cosine"] > 1 - 1e-9 and other["rel_l1"] < 1e-5
    assert recs["naive"].info["e2e"]["rel_l1"] == 0.0


def test_swap_counts_calls_across_steps_and_restores():
    model = llama.build_llama("llama-tiny", layers=4, dtype=torch.float32)
    tokens = llama.random_tokens(1, 19, model.cfg.vocab_size, "cpu")
    with torch.no_grad():
        plain = model(tokens)
        with AttnSwap("naive") as swap:
            for _ in range(5):
                routed = model(tokens)
    assert swap.calls == 4 * 5 and swap.unrouted == 0
    torch.testing.assert_close(routed, plain, rtol=1e-5, atol=1e-5)
    q = torch.randn(1, 2, 5, 8)
    assert torch.equal(attention(q, q, q), torch.nn.functional.scaled_dot_product_attention(q, q, q))


def test_patch_torch_routes_sdpa_and_counts_unrouted_masks():
    q = torch.randn(1, 2, 9, 8)
    original = torch.nn.functional.scaled_dot_product_attention
    with AttnSwap("naive", patch_torch=True) as swap:
        torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
        torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=torch.ones(9, 9, dtype=torch.bool))
    assert (swap.calls, swap.unrouted) == (1, 1)
    assert torch.nn.functional.scaled_dot_product_attention is original


def test_unsupported_backend_is_a_record_not_a_crash():
    cfg = E2EConfig(model="llama-tiny", backends=("naive", "sdpa-cudnn"), layers=1, steps=1, dtype="fp32")
    recs = _records(cfg)
    assert recs["naive"].status == "ok"
    assert recs["sdpa-cudnn"].status == "unsupported" and "cpu" in recs["sdpa-cudnn"].reason
    assert recs["sdpa-cudnn"].spec.heads_q == 4  # the call's real shape, even though it never ran


def test_swap_raises_backend_reason():
    q = torch.randn(1, 2, 9, 8)
    with AttnSwap("sdpa-cudnn"), pytest.raises(BackendUnavailable, match="sdpa-cudnn"):
        attention(q, q, q)


def test_records_go_to_the_store(tmp_path):
    cfg = E2EConfig(model="llama-tiny", backends=("sdpa-math",), layers=1, steps=2, dtype="fp32")
    with ResultStore(tmp_path / "r.db") as store:
        run_e2e(cfg, run_id="run1", sink=store.write)
        (rec,) = store.records("run1")
    assert rec.timing_mode == "e2e" and rec.info["e2e"]["model"] == "llama-tiny" and rec.samples_ms


# ---- diffusers models (skipped where diffusers is not installed) ------------------------------------
@pytest.mark.parametrize("model,per_block", [("cogvideox-tiny", 1), ("wan-tiny", 2)])
def test_tiny_dit_two_backends_every_call_routed(model, per_block):
    pytest.importorskip("diffusers")
    steps, layers = 2, 1  # one of the model's two blocks: --layers truncates
    cfg = E2EConfig(model=model, backends=("naive", "sdpa-math"), layers=layers, steps=steps)
    recs = _records(cfg)
    for r in recs.values():
        assert r.status == "ok", r.reason
        assert r.info["e2e"]["calls"] == layers * per_block and r.info["e2e"]["unrouted"] == 0
        assert not r.spec.causal
    assert recs["sdpa-math"].info["e2e"]["rel_l1"] < 1e-5


def test_dit_patches_are_undone():
    pytest.importorskip("diffusers")
    from attnbench.models import dit
    dit.build_dit("wan-tiny", layers=1)
    processor = sys.modules["diffusers.models.attention_processor"]
    registry = sys.modules["diffusers.models.attention_dispatch"]._AttentionBackendRegistry
    before = dict(registry._backends)
    with AttnSwap("naive"):
        assert processor.F is not torch.nn.functional
        assert registry._backends != before
    assert processor.F is torch.nn.functional and registry._backends == before


def test_cogvideox_train_step_routes_backward():
    pytest.importorskip("diffusers")
    cfg = E2EConfig(model="cogvideox-tiny", backends=("naive",), mode="train", layers=2, steps=1)
    (rec,) = run_e2e(cfg, run_id="t")
    assert rec.status == "ok" and rec.info["e2e"]["attn_bwd_ms"] > 0


VARIANTS = llama.ModelVariants(sinks=True, softcap=30.0, sliding_window=5)


@pytest.mark.parametrize("variants, backends", [
    (llama.ModelVariants(sinks=True, alibi=True, sliding_window=5), ("naive", "sdpa-math")),
    (VARIANTS, ("naive",)),
])
def test_llama_takes_the_variants_and_its_sinks_learn(variants, backends):
    cfg = E2EConfig(model="llama-tiny", backends=backends, mode="train", layers=2, steps=1, dtype="fp32", seq_len=23,
                    variants=variants)
    recs = _records(cfg)
    assert all(r.status == "ok" for r in recs.values()), {b: r.reason for b, r in recs.items()}
    if "sdpa-math" in recs:  # the float-mask form agrees with naive's
        assert recs["sdpa-math"].info["e2e"]["rel_l1"] < 1e-5
    model = llama.build_llama("llama-tiny", layers=2, dtype=torch.float32, variants=variants)
    tokens = llama.random_tokens(1, 24, model.cfg.vocab_size, "cpu")
    with AttnSwap("naive") as swap:
        llama.train_loss(model, tokens).backward()
    windows = sorted((spec.window or (-1, -1)) for spec in swap.shapes)
    assert windows == [(-1, -1), (4, 0)]  # layer 0 local (5 tokens: itself and 4 before), layer 1 full
    assert all(spec.sinks and spec.softcap == variants.softcap for spec in swap.shapes)
    assert all(layer.attention.sinks.grad.abs().sum() > 0 for layer in model.layers)
    assert all(layer.attention.rope == (not variants.alibi) for layer in model.layers)


def test_llama_variants_are_the_exact_attention():
    """One layer's attention through the swap against the exact reference with the same variants."""
    from attnbench.accuracy.reference import attention_forward
    q, k, v = (torch.randn(1, 19, h, 8, dtype=torch.float64) for h in (4, 2, 2))
    sinks = torch.randn(4, dtype=torch.float64) + 2
    got = attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=True, window=(4, 0),
                    softcap=30.0, alibi=(0.5, 0.25, 0.125, 0.0625), sinks=sinks).transpose(1, 2)
    want, _ = attention_forward(q, k, v, causal=True, window=(4, 0),
                                features={"softcap": 30.0, "alibi": (0.5, 0.25, 0.125, 0.0625), "sinks": sinks})
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


def test_the_attention_share_is_taken_step_by_step_and_cannot_pass_100_percent():
    from attnbench.models.bench import Steps
    # one step slowed 10x (a busy CPU): the mean attention over the median step was 333%
    steps = Steps(total_ms=[1.0, 1.0, 10.0], attn_fwd_ms=[0.5, 0.5, 9.0], attn_bwd_ms=[0.0, 0.0, 0.0], first=None)
    med = steps.median_step()
    assert med["attn_share"] == 0.5 and med["attn_ms"] == 0.5 and med["total_ms"] == 1.0


def test_an_impossible_share_or_a_busy_step_is_marked_in_the_table():
    from rich.console import Console

    from attnbench.cli.e2e import e2e_table, table_notes
    from attnbench.results.record import Record
    from attnbench.spec import AttnSpec
    spec = AttnSpec(batch=1, seqlens_q=(8,), heads_q=2, head_dim=4, dtype="fp32")
    base = Record(run_id="t", backend="naive", spec=spec, timing_mode="e2e", median_ms=2.0,
                  info={"e2e": {"attn_share": 1.33, "attn_ms": 2.66, "total_ms": 2.0}})
    busy = Record(run_id="t", backend="sdpa-math", spec=spec, timing_mode="e2e", median_ms=2.0,
                  info={"e2e": {"attn_share": 0.4, "attn_ms": 0.8, "total_ms": 2.0}, "cpu": {"busy": True, "threads": 1,
                                                                                          "cores": 2}})
    console = Console(width=100, record=True)
    with console.capture() as cap:
        console.print(e2e_table([base, busy], "t"))
    text = cap.get()
    assert "133.0%!" in text and "40.0%?" in text and "0.00200" in text  # seconds with their digits
    notes = table_notes([base, busy])
    assert notes[0].startswith("? other processes used the CPU") and notes[1].startswith("! not a share")
    assert notes[2] == "CPU: 1 thread of 2 cores"


def test_deviation_in_slices_equals_the_whole(monkeypatch):
    from attnbench.models import bench
    out, ref = torch.randn(3, 1001, dtype=torch.bfloat16), torch.randn(3, 1001, dtype=torch.bfloat16)
    a, b = out.double().flatten(), ref.double().flatten()
    want = ((a @ b) / (a.norm() * b.norm())).item(), ((a - b).abs().sum() / b.abs().sum()).item()
    monkeypatch.setattr(bench, "DEVIATION_CHUNK", 97)  # many slices, the last one partial
    got = bench.deviation(out, ref)
    assert got == pytest.approx(want, rel=1e-6)
    assert bench.deviation(ref, ref) == pytest.approx((1.0, 0.0), abs=1e-12)
