"""The hybrid e2e model (Qwen3-Next's three Gated DeltaNet layers to one attention layer): its layer mix, its
recurrence routed through the swap and timed apart from the attention, and what `attnbench e2e` says about it."""

import json
import sqlite3

import pytest
import torch
from test_cli import attnbench

from attnbench.backends import registry
from attnbench.linear.backends import TorchChunked
from attnbench.models import llama, swap
from attnbench.models.bench import E2EConfig, Steps, run_e2e
from attnbench.models.config import LLAMA_CONFIGS
from attnbench.models.swap import AttnSwap

TINY = "qwen3-next-tiny"


def _kinds(model) -> str:
    return "".join("A" if layer.attention is not None else "G" for layer in model.layers)


def test_three_gdn_layers_to_each_attention_layer():
    assert _kinds(llama.build_llama(TINY, layers=8, dtype=torch.float32)) == "GGGAGGGA"
    full = LLAMA_CONFIGS["qwen3-next"]  # Qwen3-Next-80B-A3B's shapes, without building 48 layers
    assert (full.attention_layers, full.gdn_layers) == (12, 36)
    assert (full.gdn.heads_qk, full.gdn.heads_v, full.gdn.d_k, full.gdn.d_v, full.gdn.conv) == (16, 32, 128, 128, 4)
    assert (full.n_heads, full.n_kv_heads, full.head_dim) == (16, 2, 256)
    assert _kinds(llama.build_llama("llama-tiny", dtype=torch.float32)) == "AA"  # the plain Llama is unchanged


@pytest.mark.parametrize("mode", ["prefill", "train"])
def test_a_step_has_an_attention_share_and_a_recurrence_share(mode):
    cfg = E2EConfig(model=TINY, backends=("naive",), mode=mode, steps=2, dtype="fp32", seq_len=40)
    (rec,) = run_e2e(cfg, run_id="t")
    e2e = rec.info["e2e"]
    assert rec.status == "ok", rec.reason
    assert e2e["recurrence"] == "torch-chunked"  # the default, on any device
    assert (e2e["calls"], e2e["expected_calls"], e2e["unrouted"]) == (1, 1, 0)
    assert (e2e["recurrence_calls"], e2e["expected_recurrence_calls"]) == (3, 3)
    assert 0 < e2e["attn_share"] < 1 and 0 < e2e["recurrence_share"] < 1
    assert e2e["attn_share"] + e2e["recurrence_share"] < 1  # each its own calls: the MLPs and projections remain
    assert e2e["recurrence_ms"] == pytest.approx(e2e["recurrence_fwd_ms"] + e2e["recurrence_bwd_ms"])
    assert (e2e["recurrence_bwd_ms"] > 0) == (e2e["attn_bwd_ms"] > 0) == (mode == "train")
    assert e2e["recurrence_call"].startswith("gdn b2 s40 h2/4 k16 v16 fp32")
    assert e2e["recurrence_tflops"] > 0
    assert rec.spec.heads_q == 4 and rec.spec.seqlens_q == (40,)  # the record's spec stays the attention call


def test_every_recurrence_call_goes_through_the_swap():
    model = llama.build_llama(TINY, layers=8, dtype=torch.float32)
    tokens = llama.random_tokens(1, 21, model.cfg.vocab_size, "cpu")
    with torch.no_grad():
        plain = model(tokens)  # outside any swap: the default recurrence, untimed
        with AttnSwap("naive", recurrence="torch-chunked") as sw:
            for _ in range(5):
                routed = model(tokens)
    assert (sw.calls, sw.recurrence_calls) == (2 * 5, 6 * 5)
    torch.testing.assert_close(routed, plain, rtol=1e-6, atol=1e-6)

    class Silent(TorchChunked):  # a recurrence that returns zeros: the output must change if the swap serves it
        def functional(self, spec):
            chunked = super().functional(spec)
            return lambda tensors, cu_seqlens=None: tuple(x * 0 for x in chunked(tensors))
    registry.register("silent-recurrence", Silent)
    try:
        with torch.no_grad(), AttnSwap("naive", recurrence="silent-recurrence") as sw:
            silenced = model(tokens)
    finally:
        registry.unregister("silent-recurrence")
    assert sw.recurrence_calls == 6 and not torch.allclose(silenced, plain, atol=1e-3)


def test_the_token_loop_and_the_chunk_form_give_the_same_model():
    """Swapping torch-recurrent for torch-chunked changes how the recurrence is computed, not what: the logits and
    every gradient agree, the GDN layers' own parameters included."""
    model = llama.build_llama(TINY, dtype=torch.float32)
    tokens = llama.random_tokens(2, 71, model.cfg.vocab_size, "cpu")  # 70 tokens: a chunk of 64 and a partial one
    got = {}
    for name in ("torch-recurrent", "torch-chunked"):
        model.zero_grad(set_to_none=True)
        with AttnSwap("naive", recurrence=name) as sw:
            loss = llama.train_loss(model, tokens)
            loss.backward()
        assert sw.recurrence_calls == 3
        got[name] = loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}
    (loss_a, grads_a), (loss_b, grads_b) = got.values()
    torch.testing.assert_close(loss_a, loss_b, rtol=1e-6, atol=1e-6)
    for name, grad in grads_a.items():
        torch.testing.assert_close(grad, grads_b[name], rtol=1e-4, atol=1e-6, msg=name)
    gdn = model.layers[0].gdn
    assert all(p.grad.abs().sum() > 0 for p in (gdn.A_log, gdn.dt_bias, gdn.conv.weight, gdn.w_z.weight))


def test_the_decays_span_long_and_short_memory():
    gdn = llama.build_llama(TINY, dtype=torch.float32).layers[0].gdn
    a = torch.exp(gdn.A_log)
    step = torch.nn.functional.softplus(gdn.dt_bias)
    assert gdn.A_log.dtype == torch.float32 and ((1 <= a) & (a <= 16)).all()
    assert ((1e-3 <= step) & (step <= 0.1)).all() and step.max() / step.min() > 3


def test_recurrence_outside_a_swap_is_the_default_backend():
    q, k = torch.randn(1, 9, 2, 8), torch.randn(1, 9, 2, 8)
    v, g, beta = torch.randn(1, 9, 4, 8), -torch.rand(1, 9, 4), torch.rand(1, 9, 4)
    with AttnSwap("naive", recurrence="torch-recurrent"):
        routed = swap.recurrence(q, k, v, g, beta)
    torch.testing.assert_close(swap.recurrence(q, k, v, g, beta), routed, rtol=1e-5, atol=1e-6)
    assert routed.shape == v.shape


def test_a_hybrid_model_cut_before_its_attention_layer_still_names_its_attention_call():
    cfg = E2EConfig(model=TINY, backends=("naive",), layers=2, steps=1, dtype="fp32", seq_len=16)
    (rec,) = run_e2e(cfg, run_id="t")
    e2e = rec.info["e2e"]
    assert rec.status == "ok" and (e2e["calls"], e2e["recurrence_calls"]) == (0, 2) and e2e["attn_share"] == 0
    assert rec.spec.heads_q == 4 and rec.spec.seqlens_q == (16,)  # the call the model would make, not a placeholder


def test_recurrence_on_a_model_without_gdn_layers_is_refused():
    with pytest.raises(ValueError, match="has none"):
        E2EConfig(model="llama-tiny", backends=("naive",), recurrence="torch-chunked")
    assert E2EConfig(model="llama-tiny", backends=("naive",)).recurrence is None
    with pytest.raises(ValueError, match="runs attention calls"):
        AttnSwap("naive", recurrence="sdpa-math")


def test_the_recurrence_share_is_per_step_and_marked_when_impossible():
    steps = Steps(total_ms=[2.0, 2.0, 20.0], attn_fwd_ms=[0.2, 0.2, 0.2], attn_bwd_ms=[0, 0, 0], first=None,
                  rec_fwd_ms=[1.0, 1.0, 19.0], rec_bwd_ms=[0.0, 0.0, 0.0])
    med = steps.median_step()
    assert med["recurrence_share"] == 0.5 and med["recurrence_ms"] == 1.0 and med["attn_share"] == 0.1
    assert "recurrence_share" not in Steps(total_ms=[1.0], attn_fwd_ms=[0.1], attn_bwd_ms=[0], first=None).median_step()

    from rich.console import Console

    from attnbench.cli.e2e import e2e_table, table_notes
    from attnbench.results.record import Record
    from attnbench.spec import AttnSpec
    spec = AttnSpec(batch=1, seqlens_q=(8,), heads_q=2, head_dim=4, dtype="fp32")
    e2e = {"attn_share": 0.1, "attn_ms": 0.2, "recurrence_share": 1.2, "recurrence_ms": 2.4, "total_ms": 2.0,
           "recurrence": "torch-chunked", "recurrence_calls": 3.0, "calls": 1.0}
    rec = Record(run_id="t", backend="naive", spec=spec, timing_mode="e2e", median_ms=2.0, info={"e2e": e2e})
    console = Console(width=100, record=True)
    with console.capture() as cap:
        console.print(e2e_table([rec], "t"))
    rows = {line.split()[0] + " " + line.split()[1]: line.split()[-1] for line in cap.get().splitlines()
            if line.strip().startswith(("Attn", "GDN"))}
    assert rows == {"Attn (%)": "10.0%", "Attn (s)": "0.000200", "GDN (%)": "120.0%!", "GDN (s)": "0.00240",
                    "Attn TFLOP/s": "-", "Attn calls": "1", "GDN calls": "3"}
    assert table_notes([rec])[0].startswith("! not a share")


def test_e2e_hybrid_from_the_command_line(tmp_path):
    db = tmp_path / "r.db"
    res = attnbench("e2e", "--model", TINY, "--device", "cpu", "--backends", "naive", "--recurrence", "torch-recurrent",
                    "--mode", "train", "--steps", "2", "--dtype", "fp32", "--seq-len", "24", "--db", str(db))
    assert res.returncode == 0, res.stderr
    assert "GDN by torch-recurrent" in res.stdout
    for label in ("Attn (%)", "GDN (%)", "GDN (s)", "GDN calls"):
        assert label in res.stdout
    with sqlite3.connect(db) as conn:
        ((status, info),) = conn.execute("SELECT status, info FROM records").fetchall()
    e2e = json.loads(info)["e2e"]
    assert status == "ok" and e2e["recurrence"] == "torch-recurrent" and e2e["recurrence_calls"] == 3
    assert 0 < e2e["attn_share"] and 0 < e2e["recurrence_share"] and e2e["attn_share"] + e2e["recurrence_share"] < 1
    plain = attnbench("e2e", "--model", "llama-tiny", "--device", "cpu", "--backends", "naive", "--steps", "1",
                      "--layers", "1", "--dtype", "fp32", "--db", str(db))
    assert plain.returncode == 0 and "GDN" not in plain.stdout  # no recurrence rows for a model without one


@pytest.mark.parametrize("args, needle", [
    (["--model", TINY, "--recurrence", "nope"], "unknown --recurrence 'nope'; recurrence backends: torch-recurrent"),
    (["--model", TINY, "--recurrence", "sdpa-math"], "a backend of attention calls, not a recurrence"),
    (["--model", "llama-tiny", "--recurrence", "torch-chunked"], "--model llama-tiny has none"),
    (["--model", TINY, "--backends", "torch-chunked"], "through --recurrence"),
    (["--model", TINY, "--recurrence", "fla-chunk"], "--recurrence: backend fla-chunk"),
])
def test_e2e_hybrid_user_errors_exit_2_in_one_line(tmp_path, args, needle):
    db = tmp_path / "r.db"
    res = attnbench("e2e", "--device", "cpu", "--db", str(db), *args)
    assert res.returncode == 2, (args, res.stderr)
    assert needle in res.stderr and res.stderr.count("\n") == 1 and "Traceback" not in res.stderr
    assert not db.exists()
