"""The two forms of naive attention: scale folded into Q (``naive``) or applied to the scores."""

import torch

from attnbench.backends import registry
from attnbench.backends.naive import naive_attention


def test_both_forms_compute_the_same_attention_and_say_which_they_are():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 33, 4, 16, generator=g, dtype=torch.float64) for _ in range(3))
    for causal in (False, True):
        exact = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal, scale=0.3).transpose(1, 2)
        for scale_scores in (False, True):
            got = naive_attention(q, k, v, causal=causal, window=None, scale=0.3, scale_scores=scale_scores)
            torch.testing.assert_close(got, exact, rtol=1e-12, atol=1e-12)
    folded, on_scores = registry.get("naive"), registry.get("naive-scale-scores")
    assert not folded.scale_scores and on_scores.scale_scores
    assert on_scores.name not in registry.available("cpu", default_only=True)  # asked for by name only
    assert "naive" in registry.available("cpu", default_only=True)
