"""Figures and markdown tables of benchmarks/inference.sh's export (inference.csv):

    python3 benchmarks/inference_figures.py OUT/inference.csv COPY_GBPS FIG_DIR

decode.png   decode bandwidth as % of the measured copy bandwidth, per backend and cache (bf16 and fp8)
prefix.png   prefill with a prefix cache: TFLOP/s per backend and (new queries, cached keys)
fp8.png      FlashAttention-3 prefill, fp8 against bf16: TFLOP/s and the output's rel-L1 error
and prints the tables the results page quotes.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

DECODE_SHAPES = [("decode-b64-4k", "B64 × 4k"), ("decode-b128-8k", "B128 × 8k"), ("decode-b32-32k", "B32 × 32k"),
                 ("decode-b8-128k", "B8 × 128k\n64/8 heads"), ("decode-mixed", "8 requests\n1k … 128k")]


def load(csv: Path) -> pd.DataFrame:
    df = pd.read_csv(csv)
    df = df[df["status"] == "ok"].copy()
    info = df["info"].map(json.loads)
    acc = df["accuracy"].map(lambda a: json.loads(a) if isinstance(a, str) else {})
    pages = info.map(lambda i: i.get("cache", ""))
    df["variant"] = df["backend"] + pages.map(lambda c: f" ({c.split(',')[1].split()[0]}-token pages)" if "paged" in c else "")
    df["shape"] = df["run_id"].str.replace("decode-p64-", "decode-", regex=False)
    df["rel_l1"] = acc.map(lambda a: a.get("tensors", {}).get("out", {}).get("rel_l1"))
    df["rel_l1_bf16"] = acc.map(lambda a: a.get("unquantized", {}).get("tensors", {}).get("out", {}).get("rel_l1"))
    return df


def decode_table(df: pd.DataFrame, copy: float) -> tuple[pd.DataFrame, str]:
    dec = df[df["run_id"].str.startswith("decode")]
    cell = dec.assign(pct=100 * dec["gbps"] / copy)
    pivot = cell.pivot_table(index=["variant", "dtype"], columns="shape", values="pct")
    gbps = cell.pivot_table(index=["variant", "dtype"], columns="shape", values="gbps")
    cols = [s for s, _ in DECODE_SHAPES if s in pivot.columns]
    lines = ["| backend | dtype | " + " | ".join(dict(DECODE_SHAPES)[c].replace("\n", ", ") for c in cols) + " |",
             "|---|---|" + "---:|" * len(cols)]
    for (variant, dtype), row in pivot[cols].iterrows():
        vals = [f"{gbps.loc[(variant, dtype), c]:.0f} ({row[c]:.0f}%)" if row[c] == row[c] else "—" for c in cols]
        lines.append(f"| {variant} | {dtype} | " + " | ".join(vals) + " |")
    return pivot[cols], "\n".join(lines)


def decode_figure(pivot: pd.DataFrame, out: Path) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8), sharey=True)
    labels = [dict(DECODE_SHAPES)[c] for c in pivot.columns]
    for ax, fp8 in zip(axes, (False, True)):
        for (variant, dtype), row in pivot.iterrows():
            if (dtype != "bf16") != fp8 or (fp8 and dtype != "fp8"):
                continue
            ax.plot(range(len(labels)), row.values, marker="o", label=variant)
        ax.axhline(85, color="grey", lw=0.8, ls="--")
        ax.set_xticks(range(len(labels)), labels, fontsize=8)
        ax.set_title("bf16 cache" if not fp8 else "fp8 cache (per-tensor descales; bytes at 1 per element)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("% of measured copy bandwidth")
    axes[0].legend(fontsize=8)
    axes[1].legend(fontsize=8)
    fig.suptitle("Decode, 1 new query per request, D 128, 32/8 heads: bandwidth vs cache (dashed: 85%)")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def prefix_table(df: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    pre = df[df["run_id"] == "prefix"].copy()
    pre["shape"] = pre["seq_len"].map(lambda s: f"{s // 1024}k") + " new / " + pre["seq_len_k"].map(lambda s: f"{s // 1024}k")
    order = sorted(pre["shape"].unique(), key=lambda s: (int(s.split("k")[0]), int(s.split("/ ")[1][:-1])))
    pivot = pre.pivot_table(index="variant", columns="shape", values="tflops")[order]
    pivot = pivot.sort_values(order[-1], ascending=False)
    lines = ["| backend | " + " | ".join(order) + " |", "|---|" + "---:|" * len(order)]
    lines += [f"| {v} | " + " | ".join(f"{x:.0f}" for x in row.values) + " |" for v, row in pivot.iterrows()]
    return pivot, "\n".join(lines)


def prefix_figure(pivot: pd.DataFrame, out: Path) -> None:
    fig, ax = plt.subplots(figsize=(10, 4.5))
    width = 0.8 / len(pivot.index)
    for i, (variant, row) in enumerate(pivot.iterrows()):
        ax.bar([j + i * width for j in range(len(row))], row.values, width, label=variant)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(pivot.columns))], pivot.columns)
    ax.set_ylabel("TFLOP/s (exact causal FLOPs)")
    ax.set_title("Prefill with a prefix cache: B 4, 32/8 heads, D 128, bf16, causal (lower right)")
    ax.legend(fontsize=8, ncol=3)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def fp8_table(df: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    f = df[df["run_id"] == "fp8-prefill"]
    keep = ["seq_len", "causal", "dtype", "tflops", "rel_l1", "rel_l1_bf16"]
    t = f[keep].sort_values(["causal", "seq_len", "dtype"])
    lines = ["| S | causal | dtype | TFLOP/s | out rel-L1 vs exact (dequantized inputs) | out rel-L1 vs exact (bf16 inputs) |",
             "|---:|---|---|---:|---:|---:|"]
    for _, r in t.iterrows():
        unq = "—" if r["rel_l1_bf16"] != r["rel_l1_bf16"] or r["rel_l1_bf16"] is None else f"{r['rel_l1_bf16']:.4f}"
        lines.append(f"| {r['seq_len'] // 1024}k | {'yes' if r['causal'] else 'no'} | {r['dtype']} | {r['tflops']:.0f} | "
                     f"{r['rel_l1']:.4f} | {unq if r['dtype'] != 'bf16' else '(same)'} |")
    return t, "\n".join(lines)


def fp8_figure(t: pd.DataFrame, out: Path) -> None:
    fig, ax = plt.subplots(1, 2, figsize=(11, 4))
    for (dtype, causal), g in t.groupby(["dtype", "causal"]):
        style = dict(marker="o", ls="-" if causal else "--", label=f"{dtype} {'causal' if causal else 'full'}")
        ax[0].plot(g["seq_len"], g["tflops"], **style)
        ax[1].plot(g["seq_len"], g["rel_l1"] if dtype == "bf16" else g["rel_l1_bf16"], **style)
    for a in ax:
        a.set_xscale("log", base=2)
        a.set_xticks(sorted(t["seq_len"].unique()), [f"{s // 1024}k" for s in sorted(t["seq_len"].unique())])
        a.set_xlabel("sequence length")
        a.grid(alpha=0.3)
    ax[0].set_ylabel("TFLOP/s")
    ax[1].set_ylabel("out rel-L1 vs exact attention of the bf16 inputs")
    ax[0].legend(fontsize=8)
    fig.suptitle("FlashAttention-3 prefill, B 2, 16 heads, D 128: fp8 (e4m3) against bf16")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main(csv: str, copy_gbps: str, fig_dir: str) -> None:
    df, copy, figs = load(Path(csv)), float(copy_gbps), Path(fig_dir)
    figs.mkdir(parents=True, exist_ok=True)
    if df["run_id"].str.startswith("decode").any():
        pivot, text = decode_table(df, copy)
        decode_figure(pivot, figs / "decode.png")
        print(f"## decode (GB/s, % of {copy:.0f} GB/s)\n\n{text}\n")
    if (df["run_id"] == "prefix").any():
        pivot, text = prefix_table(df)
        prefix_figure(pivot, figs / "prefix.png")
        print(f"## prefix (TFLOP/s)\n\n{text}\n")
    if (df["run_id"] == "fp8-prefill").any():
        t, text = fp8_table(df)
        fp8_figure(t, figs / "fp8.png")
        print(f"## fp8 prefill\n\n{text}\n")


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit("usage: inference_figures.py INFERENCE.csv COPY_GBPS FIG_DIR")
    main(*sys.argv[1:])
