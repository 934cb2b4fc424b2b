"""Sliding tile attention (package ``fastvideo_kernel``, fastvideo-kernel on PyPI), forward only, bf16.

Cases carry the mask as ``spec.sta`` (``attnbench.sta.TileMask``: latent grid, tile, a window per head, text
tokens after the video tokens); the reference applies the same mask, so the check compares each kernel
with exact attention over the same (query, key) pairs.

- ``sta``         the compiled ThunderKittens kernel (``sta_fwd``, sm_90a) through the package's
                  ``sliding_tile_attention(q, k, v, window_size, text_length, has_text, seq_shape)``,
                  (B, H, S, D). It exists for three grids only, each with its own list of windows built in
                  (``st_attn_h100.cu``): 30x48x80 with text, 36x48x48 and 18x48x80 without; tiles of
                  6x8x8, head size 128, the default softmax scale. The package's wrapper copies each head
                  to its own contiguous tensor and back (timed: it is the call a model makes), and pads
                  the text to a whole tile.
- ``sta-triton``  the package's Triton STA kernel (``triton_kernels.st_attn_triton.triton_sta_kernel``),
                  launched here as the package's own fallback launches it — once per (batch, head) for the
                  video queries, once for the text queries — but with the case's grid and tile, since the
                  kernel takes them as arguments (the package's wrapper accepts the three grids above only).
                  Any grid that is a whole number of tiles; text up to one tile; head size 64 or 128.

Neither kernel returns the log-sum-exp; the check judges the output.
"""

from __future__ import annotations

import importlib
import time

import torch

from attnbench.backends.base import Capabilities, Outputs, Prepared
from attnbench.backends.kernel import KernelBackend
from attnbench.inputs import AttnInputs
from attnbench.spec import AttnSpec
from attnbench.sta import TileMask, Triple, parse_triple, triple_text

_TILE = (6, 8, 8)
COMPILED_WINDOWS: dict[Triple, tuple[Triple, ...]] = {
    (30, 48, 80): ((3, 3, 3), (3, 3, 5), (5, 3, 3), (3, 5, 5), (5, 6, 1), (5, 3, 5), (5, 5, 5), (5, 5, 7), (5, 6, 10),
                   (3, 6, 10), (5, 1, 1), (1, 6, 10), (5, 1, 10)),
    (36, 48, 48): ((3, 3, 3), (3, 3, 6), (6, 3, 3), (3, 6, 6), (3, 6, 3), (6, 3, 6), (6, 6, 6), (6, 1, 1), (6, 1, 6),
                   (6, 6, 1), (1, 6, 6), (1, 1, 6), (1, 6, 1)),
    (18, 48, 80): ((3, 3, 3), (3, 3, 5), (3, 5, 5), (3, 6, 1), (3, 5, 7), (3, 5, 9), (3, 6, 10), (3, 6, 3), (3, 1, 1),
                   (1, 6, 10), (1, 5, 10), (1, 6, 7), (1, 5, 7), (1, 5, 9), (3, 1, 10), (3, 3, 10), (1, 3, 10),
                   (1, 6, 5)),
}
"""The windows fastvideo-kernel 0.3.5's sta_fwd is instantiated for, per grid (its launch tables)."""
SEQ_SHAPES = {(30, 48, 80): "30x48x80", (36, 48, 48): "36x48x48", (18, 48, 80): "18x48x80"}
_CAPS = Capabilities(devices=("cuda",), dtypes=("bf16",), head_dims=(128,), gqa=False, backward=False, causal=False,
                     cross_lengths=False, different_v_dim=False, tile_mask=True, min_compute_capability=(9, 0))


class _Sta(KernelBackend):
    package = "fastvideo_kernel"
    distribution = "fastvideo-kernel"
    install = ("pip install fastvideo-kernel (its Triton kernel); the compiled sta_fwd needs a build against "
               "the torch at hand: see docs/backends.md")
    default_sweep = False

    def extra_reason(self, spec: AttnSpec, device) -> str | None:
        return "needs a sliding tile mask (spec.sta)" if spec.sta is None else None

    def _info(self, spec: AttnSpec, **extra) -> dict:
        return self.base_info() | {"sta": spec.sta.to_dict(), "layout": "bhsd"} | extra


def _bhsd(inputs: AttnInputs):
    """q, k, v as contiguous (B, H, S, D): views for bhsd storage, copies for bshd (outside the timed call)."""
    return tuple(t.transpose(1, 2).contiguous() for t in (inputs.q, inputs.k, inputs.v))


class Sta(_Sta):
    name = "sta"
    description = "Sliding tile attention, fastvideo-kernel's compiled ThunderKittens sta_fwd (Hopper)"
    function = "sliding_tile_attention"
    capabilities = _CAPS

    def unavailable_reason(self) -> str | None:
        reason = super().unavailable_reason()
        if reason is None and getattr(importlib.import_module("fastvideo_kernel.ops"), "sta_fwd", None) is None:
            return ("fastvideo_kernel has no compiled sta_fwd (built without ThunderKittens, or not for this "
                    "torch); sta-triton runs its Triton kernel")
        return reason

    def extra_reason(self, spec: AttnSpec, device) -> str | None:
        if (reason := super().extra_reason(spec, device)) is not None:
            return reason
        if spec.scale is not None and spec.scale != spec.head_dim ** -0.5:
            return "the compiled kernel's softmax scale is 1/sqrt(head size)"
        tm = spec.sta
        if tm.tile != _TILE:
            return f"the compiled kernel has tiles of {triple_text(_TILE)} only"
        if tm.grid not in COMPILED_WINDOWS:
            return (f"the compiled kernel knows the grids {', '.join(SEQ_SHAPES.values())} only "
                    "(sta-triton takes any whole number of tiles)")
        if (tm.grid == (30, 48, 80)) != (tm.text > 0):
            return "the compiled kernel takes text with the 30x48x80 grid only, and that grid only with text"
        if tm.text > tm.tile_tokens:
            return f"the compiled kernel takes up to {tm.tile_tokens} text tokens"
        missing = sorted({w for w in tm.windows if w not in COMPILED_WINDOWS[tm.grid]})
        if missing:
            return (f"window {', '.join(map(triple_text, missing))} is not built into the compiled kernel for "
                    f"{triple_text(tm.grid)}")
        return None

    def prepare(self, spec: AttnSpec, inputs: AttnInputs) -> Prepared:
        fn = self.kernel()
        tm = spec.sta
        windows = [list(w) for w in tm.head_windows(spec.heads_q)]
        q, k, v = _bhsd(inputs)
        has_text, shape = tm.text > 0, SEQ_SHAPES[tm.grid]

        def call() -> Outputs:
            out = fn(q, k, v, windows, tm.text, has_text, shape)
            return Outputs(out=out.transpose(1, 2))
        return Prepared(fn=call, info=self._info(spec, kernel="fastvideo_kernel.sliding_tile_attention -> sta_fwd "
                                                              "(ThunderKittens, sm_90a)"))


class StaTriton(_Sta):
    """``grid``, ``tile``, ``window`` (``--backend-opt sta-triton.grid=13x30x45`` …): the mask of a model's
    attention calls (``attnbench e2e``), whose tokens come as the model holds them — ``text`` tokens first
    (``text_first``, CogVideoX's joint attention) or last, the video in (t, h, w) raster order; the function
    reorders them into tiles and back around the kernel (inside the timed attention: a model pays it)."""

    name = "sta-triton"
    description = "Sliding tile attention, fastvideo-kernel's Triton kernel (any grid of whole tiles)"
    function = "sliding_tile_attention"
    capabilities = Capabilities(devices=("cuda",), dtypes=("fp16", "bf16"), head_dims=(64, 128), gqa=False,
                                backward=False, causal=False, cross_lengths=False, different_v_dim=False,
                                tile_mask=True, min_compute_capability=(8, 0))

    def __init__(self, grid: str | None = None, tile: str = "6x8x8", window: str | None = None,
                 text_first: bool = True):
        self.model = None
        parse_triple(str(tile), "the STA tile")  # refused now, with or without a grid (it shapes the mask)
        if grid is not None or window is not None:
            if grid is None or window is None:
                raise ValueError("a model's STA mask needs both grid= and window=, e.g. sta-triton.grid=13x30x45 "
                                 "sta-triton.window=1x3x3")
            windows = tuple(w for w in str(window).split(",") if w)
            self.model = (parse_triple(str(grid), "the STA grid"), parse_triple(str(tile), "the STA tile"), windows)
            TileMask(grid=self.model[0], tile=self.model[1], windows=windows)  # refuse a bad mask now
        self.text_first = bool(text_first)

    def mask(self, spec: AttnSpec) -> TileMask | None:
        """The case's mask, or for a model call (no ``spec.sta``) the configured one with the remaining tokens
        as text."""
        if spec.sta is not None or self.model is None:
            return spec.sta
        grid, tile, windows = self.model
        text = spec.seqlens_q[0] - grid[0] * grid[1] * grid[2]
        if text < 0 or spec.is_varlen or spec.seqlens_q != spec.seqlens_k:
            return None
        return TileMask(grid=grid, tile=tile, windows=windows, text=text)

    def extra_reason(self, spec: AttnSpec, device) -> str | None:
        tm = self.mask(spec)
        if tm is None and self.model is not None:
            return (f"the call's {spec.seqlens_q[0]} tokens do not hold the {triple_text(self.model[0])} grid "
                    "(self-attention over video then text)")
        if tm is None:
            return super().extra_reason(spec, device)
        if (why := tm.check(spec.seqlens_q[0], spec.heads_q)) is not None:  # a model call's heads vs the windows
            return why
        if tm.text > tm.tile_tokens:
            return f"the Triton kernel takes up to one tile of text ({tm.tile_tokens} tokens), the call has {tm.text}"
        return None

    def functional(self, spec: AttnSpec):
        """fn(q, k, v) bshd -> out for a model's call: tokens reordered into tiles (text last), the kernel,
        and back."""
        tm = self.mask(spec)
        run = self._launcher(tm, spec.heads_q, spec.softmax_scale)
        text, video = tm.text, tm.video_tokens
        text_pos = torch.arange(text) if self.text_first else torch.arange(video, video + text)
        # the position in the model's sequence of each token in tile order (video tiles, then the text)
        order = torch.cat([tile_order(tm) + (text if self.text_first else 0), text_pos])
        on_device: dict[torch.device, torch.Tensor] = {}

        def fn(q, k, v):
            if (order_d := on_device.get(q.device)) is None:  # once per device, not a copy per call
                order_d = on_device[q.device] = order.to(q.device)
            qt, kt, vt = (t.transpose(1, 2).index_select(2, order_d) for t in (q, k, v))  # (B, H, S, D) copies
            out_t = run(qt, kt, vt)
            out = torch.empty_like(out_t)
            out.index_copy_(2, order_d, out_t)
            return out.transpose(1, 2)
        return fn

    def prepare(self, spec: AttnSpec, inputs: AttnInputs) -> Prepared:
        tm = spec.sta
        q, k, v = _bhsd(inputs)
        run = self._launcher(tm, spec.heads_q, spec.softmax_scale)

        def call() -> Outputs:
            return Outputs(out=run(q, k, v).transpose(1, 2))
        start = time.perf_counter()
        call()  # the autotuner's first call, outside the timed ones
        torch.cuda.synchronize(q.device)
        first_s = round(time.perf_counter() - start, 3)
        return Prepared(fn=call, info=self._info(spec, kernel="fastvideo_kernel triton_sta_kernel (launched by "
                                                              "attnbench for the case's grid)", first_call_s=first_s,
                                                  text_padded_to=tm.video_tokens + tm.tile_tokens if tm.text else None))

    @staticmethod
    def _launcher(tm: TileMask, heads: int, scale: float):
        """run(q, k, v) on (B, H, S, D) contiguous tensors in tile order -> out (B, H, S, D)."""
        kernel = importlib.import_module("fastvideo_kernel.triton_kernels.st_attn_triton").triton_sta_kernel
        video, per_tile = tm.video_tokens, tm.tile_tokens
        n_tiles = video // per_tile
        windows = tm.head_windows(heads)

        def run(q, k, v):
            bsz, _, seq, dim = q.shape
            pad = video + per_tile - seq if tm.text else 0  # text queries and keys are read a whole tile at a time
            common = dict(head_dim=dim, img_seq_len=video, text_length=tm.text, canvas_t=tm.grid[0],
                          canvas_h=tm.grid[1], canvas_w=tm.grid[2], tile_t=tm.tile[0], tile_h=tm.tile[1],
                          tile_w=tm.tile[2], scale=scale, has_text=tm.text > 0, BLOCK_DIM=dim)
            qp, kp, vp = (torch.cat([t, t[:, :, -pad:]], dim=2) for t in (q, k, v)) if pad else (q, k, v)
            out = torch.empty_like(qp)
            n = qp.shape[2]
            for h, (wt, wh, ww) in enumerate(windows):
                for b in range(bsz):
                    kernel[lambda meta: (1, 1, n_tiles * -(-per_tile // meta["BLOCK_Q"]))](
                        qp[b:b + 1, h:h + 1], kp[b:b + 1, h:h + 1], vp[b:b + 1, h:h + 1], out[b:b + 1, h:h + 1],
                        batch_size=1, num_heads=1, seq_len=n, kernel_t=wt, kernel_h=wh, kernel_w=ww, text_q=False,
                        **common)
            if tm.text:
                kernel[lambda meta: (bsz, heads, -(-per_tile // meta["BLOCK_Q"]))](
                    qp, kp, vp, out, batch_size=bsz, num_heads=heads, seq_len=n, kernel_t=3, kernel_h=3, kernel_w=3,
                    text_q=True, **common)
            return out[:, :, :seq]
        return run


def tile_order(tm: TileMask) -> torch.Tensor:
    """Raster (t, h, w) index of each video token in tile order: tiles in (t, h, w) order, the tokens of a tile
    in (t, h, w) order."""
    (nt, nh, nw), (tt, th, tw) = tm.tiles, tm.tile
    t, h, w = torch.meshgrid(torch.arange(nt), torch.arange(nh), torch.arange(nw), indexing="ij")
    i, j, k = torch.meshgrid(torch.arange(tt), torch.arange(th), torch.arange(tw), indexing="ij")
    gt = t.reshape(-1, 1) * tt + i.reshape(1, -1)
    gh = h.reshape(-1, 1) * th + j.reshape(1, -1)
    gw = w.reshape(-1, 1) * tw + k.reshape(1, -1)
    return ((gt * tm.grid[1] + gh) * tm.grid[2] + gw).reshape(-1)
