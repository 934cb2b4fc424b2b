import pytest

from attnbench.spec import AttnSpec


def test_defaults_fill_in():
    spec = AttnSpec(seqlens_q=(77,), heads_q=8)
    assert spec.seqlens_k == (77,)
    assert spec.heads_kv == 8
    assert spec.head_dim_v == spec.head_dim
    assert not spec.is_varlen and not spec.gqa


def test_varlen_sequences_repeat_over_batch():
    spec = AttnSpec(batch=2, seqlens_q=(17, 5), seqlens_k=(20, 5))
    assert spec.is_varlen
    assert spec.sequences == [(17, 20), (5, 5), (17, 20), (5, 5)]


@pytest.mark.parametrize("kwargs, message", [
    (dict(heads_q=12, heads_kv=5), "multiple of kv-heads"),
    (dict(batch=0), "batch must be a positive integer"),
    (dict(heads_q=-1), "heads-q must be a positive integer"),
    (dict(dtype="int8"), "unknown dtype 'int8'"),
    (dict(seqlens_q=()), "seqlens-q is empty"),
    (dict(seqlens_q=(128, 0)), "sequence lengths must be positive"),
    (dict(head_dim=1024), "head size must be an integer in 1..576"),
    (dict(pass_="sideways"), "unknown pass 'sideways'"),
    (dict(seqlens_q=(4, 4), seqlens_k=(4,)), "give one key length per sequence"),
    (dict(window=(-3, 0)), "window must be two integers"),
])
def test_validation_messages_are_actionable(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(".", r"\.")):
        AttnSpec(**kwargs)


def test_dtype_aliases_and_round_trip():
    spec = AttnSpec(dtype="bfloat16", seqlens_q=(3, 9), causal=True, window=(4, 0))
    assert spec.dtype == "bf16"
    assert AttnSpec.from_dict(spec.to_dict()) == spec


def test_label_names_the_case():
    assert AttnSpec(batch=2, seqlens_q=(4096,), heads_q=16, causal=True).label() == "b2 s4096 h16 d128 bf16 causal"
    assert "varlen[128,64]" in AttnSpec(seqlens_q=(128, 64)).label()
    assert "h32/8" in AttnSpec(heads_q=32, heads_kv=8).label()
