"""Dense boolean masks for small cases and references (kernels get their own mask forms)."""

from __future__ import annotations

import torch

from attnbench.serving import tree_keep


def keep_mask(sq: int, sk: int, causal: bool, window: tuple[int, int] | None = None,
              device: str | torch.device = "cpu", tree: tuple[int, ...] | None = None) -> torch.Tensor | None:
    """Bool (sq, sk): True where query i may attend key j (lower-right aligned); None = attend all. A ``tree``
    (``serving``: the parents of the sq new tokens) replaces the causal mask among the new tokens."""
    if tree is not None:
        keep = torch.ones(sq, sk, dtype=torch.bool, device=device)
        keep[:, sk - sq:] = tree_keep(tree, device)
        return keep
    left, right = window if window is not None else (-1, -1)
    if causal:
        right = 0 if right < 0 else min(right, 0)
    if left < 0 and right < 0:
        return None
    i = torch.arange(sq, device=device).unsqueeze(1) + (sk - sq)
    j = torch.arange(sk, device=device).unsqueeze(0)
    keep = torch.ones(sq, sk, dtype=torch.bool, device=device)
    if left >= 0:
        keep &= j >= i - left
    if right >= 0:
        keep &= j <= i + right
    return keep
