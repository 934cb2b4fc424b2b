"""Sliding tile attention (STA): the mask, exactly, for the reference, the FLOP count and the kernels.

A video latent of ``grid`` = T×H×W tokens is cut into tiles of ``tile`` = t×h×w tokens (the grid must be
a whole number of tiles). The sequence holds the video tokens in tile order — tile after tile, the tiles
in (t, h, w) row-major order, the tokens inside a tile in any order — followed by ``text`` text tokens.
A video query in tile (qt, qh, qw) attends the video keys of the tiles within its head's window
(wt, wh, ww) of tiles around it, and every text key; the window's centre is the query's tile clamped
``w // 2`` tiles away from the grid's edges, so a query near an edge sees a window shifted inwards, never a
smaller one. A text query attends every key. Each query head has its own window (one window for all heads
when one is given). This is the mask FastVideo's kernels compute (fastvideo-kernel's ThunderKittens
``sta_fwd`` and its Triton STA kernel) and its FlexAttention test builds (``tests/support_flex_sta.py``);
``TileMask`` gives it per block of (query, key) positions, so the reference never builds an S×S matrix.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

Triple = tuple[int, int, int]


def parse_triple(text: str | Triple, what: str) -> Triple:
    """``"30x48x80"`` or (30, 48, 80) -> (30, 48, 80); ValueError naming ``what`` otherwise."""
    parts = text.lower().split("x") if isinstance(text, str) else list(text)
    try:
        values = tuple(int(p) for p in parts)
    except (TypeError, ValueError):
        values = ()
    if len(values) != 3 or min(values) < 1:
        raise ValueError(f"{what} must be three positive integers T x H x W, e.g. 30x48x80; got {text!r}")
    return values  # type: ignore[return-value]


def triple_text(t: Triple) -> str:
    return "x".join(map(str, t))


@dataclass(frozen=True)
class TileMask:
    """Sliding tile attention's parameters; see the module docstring for the mask they make."""

    grid: Triple
    """Latent grid T×H×W in tokens (video tokens = T·H·W)."""
    tile: Triple = (6, 8, 8)
    """Tile t×h×w in tokens (FastVideo's kernels: 6×8×8 = 384)."""
    windows: tuple[Triple, ...] = ((3, 3, 3),)
    """Window in tiles per query head, or one for all heads."""
    text: int = 0
    """Text tokens after the video tokens (attended by every query; text queries attend everything)."""

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "grid", parse_triple(self.grid, "the STA grid"))
        set_(self, "tile", parse_triple(self.tile, "the STA tile"))
        windows = self.windows
        if isinstance(windows, str) or (windows and isinstance(windows[0], int)):
            windows = (windows,)
        set_(self, "windows", tuple(parse_triple(w, "an STA window") for w in windows))
        if not self.windows:
            raise ValueError("STA needs at least one window")
        bad = [g for g, t in zip(self.grid, self.tile, strict=True) if g % t]
        if bad:
            raise ValueError(f"the STA grid {triple_text(self.grid)} is not a whole number of "
                             f"{triple_text(self.tile)} tiles")
        for w in self.windows:
            if any(k > n for k, n in zip(w, self.tiles, strict=True)):
                raise ValueError(f"STA window {triple_text(w)} is larger than the grid's "
                                 f"{triple_text(self.tiles)} tiles")
        if isinstance(self.text, bool) or not isinstance(self.text, int) or self.text < 0:
            raise ValueError(f"STA text tokens must be a non-negative integer, got {self.text!r}")

    # ---- sizes ------------------------------------------------------------------------------------
    @property
    def tiles(self) -> Triple:
        """Tiles along T, H, W."""
        return tuple(g // t for g, t in zip(self.grid, self.tile, strict=True))  # type: ignore[return-value]

    @property
    def tile_tokens(self) -> int:
        return math.prod(self.tile)

    @property
    def video_tokens(self) -> int:
        return math.prod(self.grid)

    @property
    def tokens(self) -> int:
        """Sequence length the mask is for: video then text."""
        return self.video_tokens + self.text

    def head_windows(self, heads: int) -> tuple[Triple, ...]:
        """One window per query head."""
        if len(self.windows) == 1:
            return self.windows * heads
        if len(self.windows) != heads:
            raise ValueError(f"{len(self.windows)} STA windows for {heads} query heads; give one or one per head")
        return self.windows

    def check(self, seq_len: int, heads: int) -> str | None:
        """Why a (sequence length, query heads) case cannot carry this mask; None if it can."""
        if seq_len != self.tokens:
            return (f"the STA mask is for {self.tokens} tokens ({triple_text(self.grid)} video + {self.text} text), "
                    f"the case has {seq_len}")
        if len(self.windows) not in (1, heads):
            return f"{len(self.windows)} STA windows for {heads} query heads; give one or one per head"
        return None

    # ---- the mask -----------------------------------------------------------------------------------
    def tile_keep(self, heads: int, device=None) -> torch.Tensor:
        """Bool (heads, tiles, tiles): query tile may attend key tile (video tokens only)."""
        import torch

        n = self.tiles
        idx = torch.arange(math.prod(n), device=device)
        coords = (idx // (n[1] * n[2]), (idx // n[2]) % n[1], idx % n[2])
        keep = []
        for window in self.head_windows(heads):
            k = torch.ones(len(idx), len(idx), dtype=torch.bool, device=device)
            for c, size, reach in zip(coords, n, (w // 2 for w in window), strict=True):
                centre = c.clamp(reach, size - 1 - reach)  # torch: min > max gives max (the window covers all)
                k &= (centre.unsqueeze(1) - c.unsqueeze(0)).abs() <= reach
            keep.append(k)
        return torch.stack(keep)

    def block(self, a: int, b: int, c: int, d: int, heads: int, device=None,
              tile_keep: torch.Tensor | None = None) -> torch.Tensor:
        """Bool (heads, b-a, d-c): which of queries [a, b) may attend keys [c, d)."""
        import torch

        tk = self.tile_keep(heads, device) if tile_keep is None else tile_keep
        q = torch.arange(a, b, device=device)
        kv = torch.arange(c, d, device=device)
        video = self.video_tokens
        q_tile = (q // self.tile_tokens).clamp(max=tk.shape[1] - 1)
        kv_tile = (kv // self.tile_tokens).clamp(max=tk.shape[2] - 1)
        keep = tk[:, q_tile][:, :, kv_tile]
        q_video, kv_video = (q < video).view(1, -1, 1), (kv < video).view(1, 1, -1)
        return torch.where(q_video & kv_video, keep, torch.ones((), dtype=torch.bool, device=device))

    def dense(self, heads: int, device=None) -> torch.Tensor:
        """Bool (heads, S, S) of the whole sequence (small cases and tests)."""
        return self.block(0, self.tokens, 0, self.tokens, heads, device)

    def pairs_per_head(self, heads: int) -> list[int]:
        """Attended (query, key) pairs of each query head, exactly."""
        video, text = self.video_tokens, self.text
        tiles = self.tile_keep(heads).sum(dim=(1, 2)).tolist()
        return [int(t) * self.tile_tokens ** 2 + video * text + text * (video + text) for t in tiles]

    def kept_fraction(self, heads: int) -> float:
        return sum(self.pairs_per_head(heads)) / (heads * self.tokens ** 2)

    # ---- text forms ---------------------------------------------------------------------------------
    def label(self) -> str:
        """e.g. ``sta18x48x80/t6x8x8/w3x3x5``; per-head windows as the distinct ones, the head count and a
        digest of the whole list (two orders of the same windows are different cases)."""
        distinct = ",".join(triple_text(w) for w in dict.fromkeys(self.windows))
        if len(self.windows) > 1:
            digest = hashlib.sha1(repr(self.windows).encode()).hexdigest()[:4]
            distinct += f"/{len(self.windows)}h#{digest}"
        text = f" text{self.text}" if self.text else ""
        return f"sta{triple_text(self.grid)}/t{triple_text(self.tile)}/w{distinct}{text}"

    def to_dict(self) -> dict:
        return {"grid": list(self.grid), "tile": list(self.tile), "windows": [list(w) for w in self.windows],
                "text": self.text}

    @classmethod
    def from_dict(cls, data: dict) -> TileMask:
        return cls(grid=tuple(data["grid"]), tile=tuple(data.get("tile", (6, 8, 8))),
                   windows=tuple(tuple(w) for w in data["windows"]), text=int(data.get("text", 0)))
