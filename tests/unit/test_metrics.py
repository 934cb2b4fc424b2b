import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnbench import metrics
from attnbench.masks import keep_mask
from attnbench.spec import AttnSpec


def brute_force_pairs(sq, sk, causal, window):
    count = 0
    left, right = window if window is not None else (-1, -1)
    for i, j in itertools.product(range(sq), range(sk)):
        d = j - (i + sk - sq)  # key offset from the aligned diagonal
        if causal and d > 0:
            continue
        if left >= 0 and d < -left:
            continue
        if right >= 0 and d > right:
            continue
        count += 1
    return count


@settings(max_examples=150, deadline=None)
@given(sq=st.integers(1, 40), sk=st.integers(1, 40), causal=st.booleans(),
       window=st.one_of(st.none(), st.tuples(st.integers(-1, 12), st.integers(-1, 12))))
def test_attended_pairs_match_brute_force(sq, sk, causal, window):
    assert metrics.attended_pairs(sq, sk, causal, window) == brute_force_pairs(sq, sk, causal, window)


@settings(max_examples=60, deadline=None)
@given(sq=st.integers(1, 30), sk=st.integers(1, 30), causal=st.booleans(),
       window=st.one_of(st.none(), st.tuples(st.integers(-1, 8), st.integers(-1, 8))))
def test_mask_agrees_with_pair_count(sq, sk, causal, window):
    keep = keep_mask(sq, sk, causal, window)
    n = sq * sk if keep is None else int(keep.sum())
    assert n == metrics.attended_pairs(sq, sk, causal, window)


@settings(max_examples=60, deadline=None)
@given(lens=st.lists(st.tuples(st.integers(1, 30), st.integers(1, 30)), min_size=1, max_size=4),
       batch=st.integers(1, 3), hkv=st.sampled_from([1, 2, 4]), groups=st.integers(1, 3),
       d=st.integers(1, 64), dv=st.integers(1, 64), causal=st.booleans())
def test_flops_sum_over_sequences_gqa_and_varlen(lens, batch, hkv, groups, d, dv, causal):
    spec = AttnSpec(batch=batch, seqlens_q=tuple(q for q, _ in lens), seqlens_k=tuple(k for _, k in lens),
                    heads_q=hkv * groups, heads_kv=hkv, head_dim=d, head_dim_v=dv, causal=causal, dtype="fp32")
    pairs = batch * sum(brute_force_pairs(q, k, causal, None) for q, k in lens)
    fwd = 2 * (d + dv) * hkv * groups * pairs
    assert metrics.flops(spec, "fwd") == fwd
    assert metrics.flops(spec, "bwd") == 2.5 * fwd
    assert metrics.flops(spec, "fwd_bwd") == 3.5 * fwd
    dense = 2 * (d + dv) * hkv * groups * batch * sum(q * k for q, k in lens)
    assert metrics.flops(spec, "fwd", convention="dense") == dense


def test_causal_square_is_about_half_of_dense():
    spec = AttnSpec(seqlens_q=(4096,), causal=True)
    assert metrics.pairs(spec) == 4096 * 4097 // 2
    assert metrics.pairs(spec, "dense") == 4096 * 4096


def test_known_reference_value():
    # B=2, H=16, D=128, S=4096, non-causal: 4*B*H*S^2*D
    spec = AttnSpec(batch=2, seqlens_q=(4096,), heads_q=16, head_dim=128)
    assert metrics.flops(spec) == 4 * 2 * 16 * 4096**2 * 128


def test_bytes_count_each_tensor_once():
    spec = AttnSpec(batch=1, seqlens_q=(10,), seqlens_k=(20,), heads_q=4, heads_kv=2, head_dim=8, dtype="fp16")
    q, k, v, o, lse = 10 * 4 * 8 * 2, 20 * 2 * 8 * 2, 20 * 2 * 8 * 2, 10 * 4 * 8 * 2, 10 * 4 * 4
    assert metrics.bytes_moved(spec, "fwd") == q + k + v + o + lse
    assert metrics.bytes_moved(spec, "bwd") == (q + k + v + 2 * o + lse) + (q + k + v)


def test_rates():
    assert metrics.tflops_per_s(2e12, 1000.0) == pytest.approx(2.0)
    assert metrics.gb_per_s(5e9, 500.0) == pytest.approx(10.0)
    assert metrics.tflops_per_s(1.0, None) is None
    assert metrics.percent_of_peak(500.0, 1000.0) == 50.0
    assert np.isclose(metrics.percent_of_peak(1, 3), 33.333333)
    with pytest.raises(ValueError, match="unknown FLOP convention"):
        metrics.pairs(AttnSpec(), "sparse")
