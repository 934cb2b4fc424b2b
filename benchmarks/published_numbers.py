"""Published attention figures re-run on the GPU at hand: the kernel authors' numbers beside attnbench's.

    python3 benchmarks/published_numbers.py run  --db published.db [--run-id published] [--figures K,...]
    python3 benchmarks/published_numbers.py page --db published.db [--run-id published] -o page.md

``run`` times every case of the figures below that this machine can run (attnbench's runner, default
timing and accuracy check, records in the store); series that need another timing mode or backend
option (a kernel timed alone by the profiler, a pinned FlashInfer template) are timed in runs of their
own, named ``RUN_ID+profiler``, ``RUN_ID+flashinfer.backend-fa2`` (a run id has no `=`) and so on. ``page`` writes the
comparison from those stored records: the published number with its source, ours, the ratio, and for
each gap over 5% what was checked, or "unexplained". Nothing here is tuned toward a published number.

FLOP counts. All three sources count 4·B·S²·H·d per forward call (FlashInfer writes it as 2·… for
causal), halved with a causal mask, and the FlashAttention-3 paper 2.5× that for the backward;
attnbench counts the attended (query, key) pairs exactly (causal: S(S+1)/2, 0.1-0.2% more than S²/2 at
these lengths) with the same 2.5 for the backward. The page converts our times with the sources' count,
so the ratio is a ratio of times.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import re
import sys
from pathlib import Path

FA3_PAPER = "FlashAttention-3 paper (Shah et al., 2024, arXiv:2407.08608)"
SAGE = "SageAttention README, kernel speed (thu-ml/SageAttention, assets/H100_hd{d}.png, added with release 2.1.0, 2025-01-30)"
FLASHINFER = ("FlashInfer 0.2 release post (flashinfer.ai, 2024-12-12), figure 'Performance comparison between "
              "dense/vector-sparse attention on FA-2 and FA-3 templates on H100 SXM5'")
NUGIT = "https://subtext.edge.nugit.net/image/"
"""Where the FlashAttention-3 paper's bar labels were read: text transcriptions of its figure images. They
carry each panel's title (pass, head dim, GPU) but not its caption, so with or without a causal mask is
inferred: of two head-dim-128 forward panels, the one whose standard attention runs at 26-35 TF/s
(half the FLOPs counted, the same work done) is the causal one."""


@dataclasses.dataclass(frozen=True)
class Ours:
    """What attnbench runs for a published series: a backend, the options it needs, and how it is timed."""

    backend: str
    opts: tuple[str, ...] = ()
    """``--backend-opt`` items, e.g. ``flashinfer.backend=fa3``."""
    kernel_only: bool = False
    """Timed by the profiler and compared by the call's longest kernel alone (the attention kernel of a call
    that also quantizes its inputs), for figures that leave the preprocessing out."""

    @property
    def group(self) -> str:
        """The run that times this series beside the figures' plain run ('' = the plain run)."""
        return "+".join((["profiler"] if self.kernel_only else []) + list(self.opts))

    @property
    def label(self) -> str:
        extra = [*self.opts, *(["attention kernel alone"] if self.kernel_only else [])]
        return f"`{self.backend}`" + (f" ({', '.join(extra)})" if extra else "")


@dataclasses.dataclass(frozen=True)
class Figure:
    """One published panel: a pass, head size and mask over a list of (batch, sequence length, heads)."""

    key: str
    source: str
    panel: str
    pass_: str
    head_dim: int
    causal: bool
    dtype: str
    shapes: tuple[tuple[int, int, int], ...]
    """(B, S, H) per published column."""
    series: dict[str, tuple[tuple[Ours, ...], tuple[float | None, ...]]]
    """Published series name -> (what attnbench runs for that kernel, TF/s per column; None = OOM/absent)."""
    values: str
    """Where and how the published values were read."""
    note: str = ""

    def columns(self) -> list[str]:
        batches = {b for b, _, _ in self.shapes}
        tokens = {b * s for b, s, _ in self.shapes}
        if len(batches) == 1 or len(tokens) == 1:
            return [f"S={s}" for _, s, _ in self.shapes]
        return [f"B={b} S={s}" for b, s, _ in self.shapes]

    def shape_text(self) -> str:
        (b0, s0, h0), d = self.shapes[0], self.head_dim
        if len({b * s for b, s, _ in self.shapes}) == 1 and len({h for *_, h in self.shapes}) == 1:
            return f"B·S = {b0 * s0} tokens, H = {h0}, d = {d}"
        if len({b for b, _, _ in self.shapes}) == 1:
            return f"B = {b0}, H = {h0}, d = {d}"
        return ", ".join(f"B={b} S={s}" for b, s, _ in self.shapes) + f"; H = {h0}, d = {d}"


def ours(*names: str) -> tuple[Ours, ...]:
    return tuple(Ours(n) for n in names)


SEQ_LENS = (512, 1024, 2048, 4096, 8192, 16384)
TOKENS, HIDDEN = 16384, 2048


def paper_shapes(d: int) -> tuple[tuple[int, int, int], ...]:
    """The FlashAttention-3 paper's: B·S = 16k tokens, H·d = 2048."""
    return tuple((TOKENS // s, s, HIDDEN // d) for s in SEQ_LENS)


def sage_shapes(d: int) -> tuple[tuple[int, int, int], ...]:
    """SageAttention's bench/ scripts: batch 4, 32 heads, S = 1k … 32k."""
    return tuple((4, s, 32) for s in (1024, 2048, 4096, 8192, 16384, 32768))


FLASHINFER_SHAPES = ((128, 1024, 32), (64, 2048, 32), (32, 4096, 32), (8, 8192, 32), (1, 32768, 32))
"""The figure's settings (its benchmark script, benchmarks/bench_hopper_attention.py at d7ac8e3, runs
B=16 at L=8192 where the figure is labelled B=8; ours follow the figure)."""

STANDARD = ours("naive", "naive-scale-scores")
"""The paper's "standard attention" is flash-attention's benchmark function (Q·Kᵀ by baddbmm with the
scale as alpha, an added causal mask, softmax, a matmul): scale folded like ``naive``'s."""

def transcribed(image: str, note: str) -> str:
    return f"the figure's bar labels as transcribed from its image ({NUGIT}{image}); {note}"


SAGE_VALUES = ("the bar labels of the README's image (https://github.com/thu-ml/SageAttention/blob/"
               "d1a57a546c3d395b1ffcbeecc66d81db76f3b4b5/assets/H100_hd{d}.png), read off the image. The README "
               "says its TOPS count the attention kernel alone, without quantization and smoothing; the "
               "shapes and the timing are those of its bench/ scripts (fp16 inputs, flash_attn's "
               "benchmark_forward: warm L2, mean of 100 calls). Its FlashAttn2 and Xformers series are "
               "PyTorch's SDPA flash and memory-efficient kernels (bench_baseline.py --method fa2 / xformers), "
               "its FlashAttn3 the hopper/ build of flash-attention's 2.7.2 release (b7d29fb)")
SAGE2 = (Ours("sage2-fp8-sm90"), Ours("sage2-fp8-sm90", kernel_only=True))
"""The README's SageAttn2-8b on H100: sageattn_qk_int8_pv_fp8_cuda_sm90 (INT8 Q·Kᵀ per thread, FP8 P·V,
fp32+fp32 accumulation), the kernel ``sageattn`` picks on Hopper."""


def sage_figure(d: int, causal: bool, series: dict) -> Figure:
    mask = "with" if causal else "without"
    names = ("Xformers", "FlashAttn2", "FlashAttn3-fp16", "SageAttn2-8b")
    ran = (ours("sdpa-efficient"), ours("sdpa-flash", "fa2"), ours("fa3"), SAGE2)
    return Figure(f"sage-fwd-d{d}" + ("-causal" if causal else ""), SAGE.format(d=d),
                  f"H100, head dim {d}, causal = {causal} (forward, {mask} causal mask)", "fwd", d, causal, "fp16",
                  sage_shapes(d), {n: (r, series[n]) for n, r in zip(names, ran, strict=True)},
                  values=SAGE_VALUES.format(d=d),
                  note="its SageAttention1 and FlashAttn3-fp8 series are not run (no SageAttention 1 beside 2 "
                       "in one environment; the carried FA3 build has no FP8)")


FIGURES = [
    Figure("fa3-fwd-d64", FA3_PAPER, "Figure 5, forward, without causal mask, head dim 64, H100 80GB SXM5",
           "fwd", 64, False, "bf16", paper_shapes(64), {
               "Standard attention": (STANDARD, (52, 63, 67, 72, 73, None)),
               "FlashAttention-2": (ours("fa2"), (282, 306, 318, 321, 322, 324)),
               "cuDNN": (ours("sdpa-cudnn"), (335, 373, 395, 408, 412, 413)),
               "FlashAttention-3": (ours("fa3"), (333, 392, 460, 476, 496, 497)),
           }, values=transcribed("55f47a106c25f22983b2741a7e8bcdbaec8521b6a583d130c6f92b94e0f65924", "one transcription found")),
    Figure("fa3-fwd-d128", FA3_PAPER, "Figure 5, forward, without causal mask, head dim 128, H100 80GB SXM5",
           "fwd", 128, False, "bf16", paper_shapes(128), {
               "Standard attention": (STANDARD, (74, 100, 119, 133, 139, None)),
               "FlashAttention-2": (ours("fa2"), (309, 350, 362, 368, 370, 370)),
               "cuDNN": (ours("sdpa-cudnn"), (497, 574, 617, 609, 600, 595)),
               "FlashAttention-3": (ours("fa3"), (467, 565, 625, 638, 646, 648)),
           }, values=transcribed("e27582d2db385c9bac87ebc92343d2452b7c01d5d934e596c90172b346d00d42", "two transcriptions; they disagree at S=512 (cuDNN 497 / FA3 467 or the reverse) and on "
                   "FA2 at 16k (370 or 395)")),
    Figure("fa3-fwd-d128-causal", FA3_PAPER, "Figure 5, forward, with causal mask, head dim 128, H100 80GB SXM5",
           "fwd", 128, True, "bf16", paper_shapes(128), {
               "Standard attention": (STANDARD, (26, 31, 34, 35, 35, None)),
               "FlashAttention-2": (ours("fa2"), (191, 260, 298, 319, 333, 335)),
               "cuDNN": (ours("sdpa-cudnn"), (315, 410, 484, 518, 529, 539)),
               "FlashAttention-3": (ours("fa3"), (292, 423, 521, 579, 602, 616)),
           }, values=transcribed("4ec6690918d4df7a49f27715412cc425602eb075dfe3f7821cddc4a74f058ca1", "one transcription found")),
    Figure("fa3-bwd-d128", FA3_PAPER, "Figure 6, backward, without causal mask, head dim 128, H100 80GB SXM5",
           "bwd", 128, False, "bf16", paper_shapes(128), {
               "Standard attention": (STANDARD, (104, 131, 159, 174, 181, None)),
               "FlashAttention-2": (ours("fa2"), (214, 260, 291, 310, 318, 322)),
               "cuDNN": (ours("sdpa-cudnn"), (305, 408, 465, 499, 518, 516)),
               "FlashAttention-3": (ours("fa3"), (316, 424, 501, 542, 559, 561)),
           }, values=transcribed("f60142e2221e7ea9f80b7017987fabedaaa04df4adeb1a9e7b0a3defac28a701", "one transcription found")),
    Figure("fa3-fwd-d256-causal", FA3_PAPER, "Figure 5, forward, with causal mask, head dim 256, H100 80GB SXM5",
           "fwd", 256, True, "bf16", paper_shapes(256), {
               "FlashAttention-2": (ours("fa2"), (208, 251, 278, 293, 297, 298)),
               "cuDNN": (ours("sdpa-cudnn"), (308, 391, 450, 483, 497, 509)),
               "FlashAttention-3": (ours("fa3"), (286, 427, 537, 612, 628, 642)),
           }, values=transcribed("662fef77d03ef90933e0bf349be79e2e8ba39c73aa1f09020aee8016df309aba", "one transcription found; the panel is taken as the causal one because the paper's abstract gives "
                "FA3 up to 740 TF/s in BF16/FP16, above this panel's 642")),
    Figure("fa3-fp8-fwd-d256", FA3_PAPER, "Figure 7, FP8 forward, without causal mask, head dim 256, H100 80GB SXM5",
           "fwd", 256, False, "fp8", paper_shapes(256), {
               "FlashAttention-3": (ours("fa3"), (510, 744, 931, 966, 1151, 1171)),
           }, values=transcribed("32f2f2fec0fa3843531d75854adc12b775b435f234a01edd2e63c4c71c1ed980", "one transcription found; taken as the non-causal panel because it peaks at 1171, the paper's "
                "'close to 1.2 PFLOPs/s'. Its cuDNN and Triton FP8 series have no attnbench backend (PyTorch's "
                "cuDNN attention takes no FP8)")),
    sage_figure(128, False, {"Xformers": (166, 175, 181, 180, 181, 180), "FlashAttn2": (319, 343, 339, 339, 339, 339),
                             "FlashAttn3-fp16": (410, 444, 441, 459, 465, 470),
                             "SageAttn2-8b": (676, 807, 852, 900, 871, 882)}),
    sage_figure(128, True, {"Xformers": (134, 156, 169, 174, 177, 180), "FlashAttn2": (217, 281, 307, 330, 328, 329),
                            "FlashAttn3-fp16": (361, 495, 528, 546, 576, 590),
                            "SageAttn2-8b": (448, 624, 744, 795, 835, 858)}),
    sage_figure(64, False, {"Xformers": (124, 131, 139, 139, 141, 142), "FlashAttn2": (268, 290, 298, 299, 303, 303),
                            "FlashAttn3-fp16": (355, 452, 456, 491, 474, 482),
                            "SageAttn2-8b": (457, 524, 567, 599, 604, 606)}),
    sage_figure(64, True, {"Xformers": (99, 118, 126, 135, 139, 140), "FlashAttn2": (181, 244, 274, 288, 297, 302),
                           "FlashAttn3-fp16": (190, 330, 393, 430, 450, 467),
                           "SageAttn2-8b": (326, 441, 514, 543, 583, 594)}),
    Figure("flashinfer-prefill-causal-d128", FLASHINFER, "dense (contiguous) causal prefill, head dim 128, H100 SXM5",
           "fwd", 128, True, "fp16", FLASHINFER_SHAPES, {
               "FlashInfer FA2 (contiguous)": ((Ours("flashinfer", ("flashinfer.backend=fa2",)),),
                                               (277, 316, 339, 349, 354)),
               "FlashInfer FA3 (contiguous)": ((Ours("flashinfer", ("flashinfer.backend=fa3",)),),
                                               (392, 471, 532, 568, 602)),
           }, values="the bar lengths of the post's image (https://github.com/flashinfer-ai/flashinfer-ai.github.io/"
                     "blob/main/assets/imgs/fa3-template.png; the figure has no bar labels) measured in pixels "
                     "against its 0/200/400/600 grid lines, to about ±1 TF/s; the post's benchmark is "
                     "benchmarks/bench_hopper_attention.py at flashinfer d7ac8e3: BatchPrefillWithRaggedKVCacheWrapper "
                     "with backend='fa2' or 'fa3', fp16, triton.testing.do_bench (L2 cleared per call, mean), CUDA 12.4",
           note="attnbench's `flashinfer` runs B=1 through single_prefill_with_kv_cache (the same template, no ragged "
                "index); its vector-sparse (page_size=1) series are not run here"),
]

NOT_RUN = [
    (FA3_PAPER, "Figure 5, head dim 256 without causal mask, and head dim 64 causal",
     "no transcription of those panels was found"),
    (FA3_PAPER, "Figure 7, FP8 forward at head dims 64 and 128, and causal",
     "the transcriptions found are partial or their panel could not be told apart"),
    (FA3_PAPER, "Triton series (OpenAI's tutorial kernel)", "no attnbench backend runs that kernel"),
    ("SageAttention README", "SageAttention1 and FlashAttn3-fp8 series, other GPUs",
     "no SageAttention 1 beside 2 in one environment; the carried FA3 build has no FP8; the README's other GPUs "
     "(H20, H800, L20, A100, …) are not lent here"),
    ("FlashInfer", "decode figures (introduction post, 2024-01-03: single and batch decode on H100 SXM as "
     "bandwidth utilization)", "line plots without value labels, of FlashInfer 0.0.1, readable only to a few "
     "points of utilization; not transcribed. No H100/H200 decode table from the authors was found "
     "(flashinfer#1313 asks for official numbers)"),
]

CHECKED = {
    "sage": "Checked for every gap: the SM clock at the start and end of each case (1245-1980 MHz: at batch 4 "
            "and 32 heads the long cases run 50-400 ms a call at full power and the H100 lowers its clock under "
            "that load; FA3's S ≥ 8k cases ran at 1245-1710), the FLOP count (the README's bench/ scripts count "
            "4·B·H·d·S², /2 causal, as this page does), the shapes (B = 4, H = 32, fp16, the scripts' "
            "defaults).",
    "flashinfer": "Checked for every gap: the SM clock at the start and end of each case (1440-1980 MHz), the "
                  "FLOP count (the benchmark's 2·B·S²·H·d for causal, as this page's), the shapes (the figure's "
                  "B and L, 32 heads, fp16).",
    "fa3": "Checked for every gap: the SM clock at the start and end of each case (1650-1980 MHz, the low "
           "values at the start of the longest cases only), the FLOP count (ours differs from the paper's by "
           "< 0.2%), the shapes (B·S = 16k, H·d = 2048, bf16, the paper's layout (B, S, H, D)).",
}
"""Figure family (the key's first word) -> what was checked for all its gaps."""
FAMILY_NAMES = {"fa3": FA3_PAPER, "sage": "SageAttention README", "flashinfer": "FlashInfer 0.2 release post"}
EXPLAINED: dict[tuple[str, str], str] = {
    ("fa3", "fa3"): "Ours is faster. What differs: the kernel version — ours is flash_attn_3 built from the hopper/ "
           "folder of flash-attention at commit 0251105a (2025; the record's version says 3.0.0), the paper "
           "timed its July 2024 code. Not checked further (the 2024 code was not built here).",
    ("fa3", "sdpa-cudnn"): "Ours is faster. What differs: the library version — ours is cuDNN 9.19 through PyTorch "
                  "2.11's SDPA; the paper timed an earlier cuDNN 9 release. Not checked further.",
    ("fa3", "fa2"): "Within 8%; ours is flash-attn 2.8.3 (the paper's FA2 version not re-checked).",
    ("fa3", "naive"): "Unexplained. Folded-scale naive is within 5% of the paper's standard attention at S ≤ 1k "
             "(non-causal forward) and falls to 0.65-0.75× at S = 4k-8k, yet runs at 79 (d64) and 155 (d128) "
             "TF/s at S = 16k, B = 1, where the paper reports OOM: per score element, B=2 S=8k takes twice "
             "the time of B=1 S=16k. The backward is faster than the paper's at S ≤ 2k. Not investigated "
             "further here; the paper's standard attention is flash-attention's benchmark function "
             "(baddbmm with alpha = scale, an added causal mask), which attnbench does not run.",
    ("fa3", "naive-scale-scores"): "Expected: the extra pass over the S×S scores costs 10-30% against `naive` here.",
    ("sage", "sdpa-efficient"): "Within 6% (one cell); the README does not state its PyTorch version.",
    ("sage", "fa2"): "Not the README's kernel: its FlashAttn2 series is PyTorch's SDPA flash kernel "
                     "(bench_baseline.py --method fa2 turns on enable_flash_sdp), which `sdpa-flash` runs and matches "
                     "within 4% in every cell. `fa2` is the flash-attn 2.8.3 package, shown beside it: 5-11% faster "
                     "than PyTorch 2.11's copy of the kernel at head dim 128 here.",
    ("sage", "fa3"): "Ours is faster, most at head dim 128 without a mask, where the README's FA3 (410-470 TF/s) "
                     "is also well below the FlashAttention-3 paper's own figure for that head dim and mask "
                     "(565-648 TF/s from S = 1k to 16k, Figure 5, which ours match within 4-14% above). The README's "
                     "FA3 was built from flash-attention at b7d29fb (hopper/ of the 2.7.2 release), ours at "
                     "0251105a (2025); the older build was not made here, so the part the version plays is not "
                     "measured.",
    ("sage", "sage2-fp8-sm90"): "Expected: this row times the whole `sageattn_qk_int8_pv_fp8_cuda_sm90` call, whose "
                                "quantization and smoothing (the call's 7 other kernels: K's mean taken out, Q and K "
                                "to INT8 per thread, V transposed, padded and scaled to FP8) take 69-75% of the "
                                "call at S = 1k and 6-13% at 32k; the README counts the attention kernel alone, "
                                "which the next row times.",
    ("sage", "sage2-fp8-sm90 (attention kernel alone)"): "Within 6%; the long-sequence cells (0.94-0.97 at 32k) ran "
                                "at 1545-1890 MHz (see above), the README does not state its clocks.",
    ("flashinfer", "flashinfer (flashinfer.backend=fa2)"): "Ours is faster, by 1-7%. What differs: FlashInfer 0.7.2 "
                                "and CUDA 13.0 here, 0.2 and CUDA 12.4 in the post; triton's do_bench mean there, "
                                "the median here. Not checked further.",
    ("flashinfer", "flashinfer (flashinfer.backend=fa3)"): "Ours is faster, by 2-8%: as for the FA2 template "
                                "(versions, CUDA, statistic). Not checked further.",
}
"""(figure family, series label) -> what was checked about its gaps over 5% (CHECKED applies to all)."""


def family(figure: Figure) -> str:
    return figure.key.split("-")[0]


def paper_flops(spec) -> float:
    """The paper's count: attnbench's dense count (4·S²·d·H·B forward, the same ×2.5 for the backward),
    halved with a causal mask."""
    from attnbench import metrics
    return metrics.flops(spec, convention="dense") / (2 if spec.causal else 1)


def specs(figure: Figure):
    from attnbench.spec import AttnSpec
    return [AttnSpec(batch=b, seqlens_q=(s,), heads_q=h, head_dim=figure.head_dim, dtype=figure.dtype,
                     causal=figure.causal, pass_=figure.pass_) for b, s, h in figure.shapes]


def group_run_id(run_id: str, group: str) -> str:
    """The run id of a group's run: ``RUN_ID+group``, with the group's ``=`` (not allowed in a run id) as ``-``."""
    return f"{run_id}+{group.replace('=', '-')}" if group else run_id


def cmd_run(args) -> None:
    import torch

    from attnbench import api
    from attnbench.backends import registry
    if not torch.cuda.is_available() and not args.cpu_smoke:
        sys.exit("published_numbers: needs a CUDA GPU (the figures are H100 figures)")
    figures = [f for f in FIGURES if not args.figures or f.key in args.figures.split(",")]
    if not figures:
        sys.exit(f"published_numbers: no figure named {args.figures!r}; known: {', '.join(f.key for f in FIGURES)}")
    device = "cpu" if args.cpu_smoke else "cuda"
    here = set(registry.available(device))
    groups: dict[str, dict] = {}  # the plain run first: a later group's --backend-opt replaces a backend for good
    for fig in sorted(figures, key=lambda f: any(o.group for os, _ in f.series.values() for o in os)):
        for ran, _ in fig.series.values():
            for o in ran:
                g = groups.setdefault(o.group, {"ours": o, "backends": set(), "specs": []})
                g["backends"].add(o.backend)
                g["specs"] += [s for s in specs(fig) if s not in g["specs"]]
    for group, g in sorted(groups.items(), key=lambda kv: kv[0] != ""):
        backends = sorted(b for b in g["backends"] if b in here)
        missing = sorted(g["backends"] - here)
        if missing:
            print(f"not installed here, not run: {', '.join(missing)}")
        if not backends:
            continue
        o: Ours = g["ours"]
        opts = {"backends": backends, "db": args.db, "device": device, "backend_opt": list(o.opts)}
        if o.kernel_only:
            if args.cpu_smoke:
                continue  # the profiler's kernel times need a GPU
            opts |= {"timing": "profiler", "check": False}  # the plain run checks the same calls
        plan = api.plan(**opts)
        group_specs = g["specs"]
        if args.cpu_smoke:  # the script's own check: each figure's smallest shape, scaled down, on the CPU
            group_specs = list(dict.fromkeys(s.replace(batch=1, seqlens_q=(64,), seqlens_k=(64,), heads_q=2, heads_kv=2)
                                             for s in group_specs))
        plan = dataclasses.replace(plan, specs=group_specs)
        run_id = group_run_id(args.run_id, group)
        records = api.run(plan, run_id=run_id, quiet=False)
        ok = sum(r.status == "ok" for r in records)
        print(f"{ok}/{len(records)} cases ok, stored in {args.db} as run {run_id}")


def _fmt(x: float | None, digits: int = 0) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


def ours_tflops(o: Ours, spec, rec) -> tuple[float | None, str | None]:
    """Our TF/s under the source's FLOP count (None with the reason when the record has no number)."""
    if rec is None:
        return None, "not run"
    if rec.status != "ok" or not rec.median_ms:
        return None, rec.status
    ms = rec.median_ms
    if o.kernel_only:
        kernels = rec.info.get("kernel_ms") or {}
        if not kernels:
            return None, "no kernel times"
        ms = max(kernels.values())
    return paper_flops(spec) / (ms * 1e-3) / 1e12, None


def load(store, run_ids: list[str]) -> dict:
    """(group, backend, case label, pass) -> record, from ``run_ids`` and their ``+group`` runs; a later run's
    ok record of a case replaces an earlier one's failure."""
    names = [r["run_id"] for r in store.runs()]
    groups = {group_run_id("", o.group): o.group for f in FIGURES for ran, _ in f.series.values() for o in ran}
    by_case: dict = {}
    for run_id in run_ids:
        for name in [run_id] + [n for n in names if n.startswith(run_id + "+")]:
            group = groups.get(name[len(run_id):], name[len(run_id) + 1:]) if name != run_id else ""
            for r in store.records(name):
                key = (group, r.backend, r.spec.label(), r.spec.pass_)
                if key not in by_case or by_case[key].status != "ok":
                    by_case[key] = r
    return by_case


def kernel_note(figures, by_case) -> str:
    """Which kernel the kernel-alone rows timed (the longest of each call), from the stored names."""
    seen = {}
    for fig in figures:
        for ran, _ in fig.series.values():
            for o in ran:
                for spec in specs(fig):
                    rec = by_case.get((o.group, o.backend, spec.label(), spec.pass_))
                    if o.kernel_only and rec is not None and rec.info.get("kernel_ms"):
                        kernels = rec.info["kernel_ms"]
                        longest = max(kernels, key=kernels.get)
                        name = re.sub(r"^void\s+", "", longest).split("<")[0].split("(")[0]
                        seen.setdefault(o.backend, (name, len(kernels)))
    return " ".join(f"`{b}` attention kernel alone: `{name}` (of {n} kernels a call; the rest quantize and "
                    f"smooth the inputs)." for b, (name, n) in seen.items())


def cmd_page(args) -> None:
    from attnbench.results.store import ResultStore
    store = ResultStore(args.db, create=False, readonly=True)
    run_ids = args.run_id or [store.latest_run_id()]
    by_case = load(store, run_ids)
    if not by_case:
        sys.exit(f"published_numbers: no records of run {', '.join(map(str, run_ids))} in {args.db}")
    records = list(by_case.values())
    env = store.env(records[0].env_id) or {}
    run = store.run(run_ids[-1]) or {}
    run_id = " + ".join(run_ids)
    keys = {(k[0], k[1]) for k in by_case}
    figures = [f for f in FIGURES if any((o.group, o.backend) in keys for ran, _ in f.series.values() for o in ran)]
    lines = [f"# Published attention figures re-run: {env.get('device_name', '?')}", ""]
    packages = env.get("packages") or {}
    versions = ", ".join(f"{k} {v}" for k, v in sorted(packages.items()) if v)
    finished = run.get("finished_at")
    when = datetime.datetime.fromtimestamp(finished, datetime.UTC).strftime("%Y-%m-%d %H:%M UTC") if finished else "?"
    lines += [f"Runs `{run_id}` (and their `+…` runs) of `{args.db}`, finished {when}; torch {env.get('torch', '?')}, "
              f"CUDA {env.get('cuda', '?')}; {versions}.",
              args.how or f"Commands: `python3 benchmarks/published_numbers.py run --db {Path(args.db).name}`, then "
              f"`… page --db {Path(args.db).name}`.",
              "", "Each panel runs the source's shapes and data type. Ours = the source's FLOP count "
              "(4·B·S²·H·d, causal /2, backward ×2.5) over our median time, so the ratio is published time / "
              "our time. Gaps over 5% are in bold. The write-ups' own tables are compared on their page, "
              "[seeds-vs-published.md](seeds-vs-published.md).", ""]
    if note := kernel_note(figures, by_case):
        lines += [note, ""]
    gaps = []
    for fig in figures:
        lines += [f"## {fig.panel}", "", f"Source: {fig.source}, {fig.panel}. Shapes: {fig.shape_text()}, "
                  f"{fig.dtype}. Values: {fig.values}" + (f"; {fig.note}" if fig.note else "") + ".", ""]
        cols = fig.columns()
        lines += ["| series | attnbench | " + " | ".join(cols) + " |", "|---|---|" + "---:|" * len(cols)]
        for series, (ran, published) in fig.series.items():
            for o in ran:
                cells = []
                for col, spec, pub in zip(cols, specs(fig), published, strict=True):
                    rec = by_case.get((o.group, o.backend, spec.label(), spec.pass_))
                    ours, why = ours_tflops(o, spec, rec)
                    if ours is None:
                        cells.append(f"{_fmt(pub)} / {why}")
                    elif pub is None:
                        cells.append(f"OOM / {ours:.0f}")
                    else:
                        ratio = ours / pub
                        cell = f"{pub:.0f} / {ours:.0f} ({ratio:.2f})"
                        if abs(ratio - 1) > 0.05:
                            cell = f"**{cell}**"
                            gaps.append((fig, series, o, col, ratio))
                        cells.append(cell)
                lines.append(f"| {series} | {o.label} | " + " | ".join(cells) + " |")
        lines += ["", "Cells: published / ours (ours ÷ published), TF/s.", ""]
    lines += ["## Gaps over 5%", ""]
    if not gaps:
        lines.append("None.")
    for fam in dict.fromkeys(family(g[0]) for g in gaps):
        lines += [f"### {FAMILY_NAMES.get(fam, fam)}", "", CHECKED.get(fam, ""), ""]
        seen = set()
        for fig, series, o, *_ in (g for g in gaps if family(g[0]) == fam):
            if (fig.key, series, o) in seen:
                continue
            seen.add((fig.key, series, o))
            rows = [g for g in gaps if (g[0].key, g[1], g[2]) == (fig.key, series, o)]
            where = ", ".join(f"{g[3]} {g[4]:.2f}" for g in rows)
            explanation = EXPLAINED.get((fam, o.label.replace("`", "")), "Unexplained.")
            lines.append(f"- **{fig.key} {series} ({o.label})**: {where}. {explanation}")
        lines.append("")
    lines += ["## Not compared", ""]
    lines += [f"- {src}, {what}: {why}." for src, what, why in NOT_RUN]
    text = "\n".join(lines) + "\n"
    if args.output:
        Path(args.output).write_text(text)
        print(f"wrote {args.output}")
    else:
        print(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="time the figures' cases on this GPU into the store")
    run.add_argument("--db", required=True)
    run.add_argument("--run-id", default="published")
    run.add_argument("--figures", default=None, help="comma list of figure keys (default: all): "
                     + ", ".join(f.key for f in FIGURES))
    run.add_argument("--cpu-smoke", action="store_true", help=argparse.SUPPRESS)
    page = sub.add_parser("page", help="write the comparison page from stored records")
    page.add_argument("--db", required=True)
    page.add_argument("--run-id", nargs="+", default=None, help="runs to read, later ones filling cases the "
                      "earlier ones could not run (default: the store's latest run)")
    page.add_argument("-o", "--output", default=None)
    page.add_argument("--how", default=None, help="how the runs were made, for the page (default: the plain commands)")
    args = ap.parse_args()
    cmd_run(args) if args.command == "run" else cmd_page(args)


if __name__ == "__main__":
    main()
