"""The attention layers of today's open models, as sweep settings: ``attnbench run --preset NAME``.

A preset fills in the options that describe a model's attention — heads, head size, softmax scale, causal,
the variants it uses and the windows of its layer kinds — and leaves the rest (sequence lengths, batch,
passes, backends) to the command line. Options given on the command line or in a config file win over the
preset's. Shapes are those of the models' published configurations (``config.json`` on the Hugging Face hub):

- gpt-oss-20b / gpt-oss-120b: 64 query heads, 8 KV heads, head size 64, attention sinks, layers alternating
  between full causal attention and a 128-token sliding window (``sliding_window: 128``: a query sees itself
  and the 127 keys before it, window ``127,0``).
- Gemma 2 9B: 16 / 8 heads, head size 256, softmax scale 1/sqrt(256) (``query_pre_attn_scalar``), logit
  softcap 50, layers alternating between full attention and a 4096-token window.
- Gemma 2 27B: 32 / 16 heads, head size 128, softmax scale 1/sqrt(144) (``query_pre_attn_scalar: 144``, not the
  head size), softcap 50, full and 4096-token window layers.
- BLOOM-176B: 112 heads, head size 128, ALiBi (112 is no power of two: the standard slopes interleave a
  second series). MPT-7B: 32 heads, head size 128, ALiBi.
- DeepSeek-V3 (128 heads) and Kimi K2 (64 heads), MLA decode with absorbed weights (``--mla``: one cached row of
  576 per token, the value its latent 512), softmax scale 1/sqrt(192); ``deepseek-v3-prefill``: its
  prefill, 128 heads of q/k 192 and v 128.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class Preset:
    """A model's attention layers as option values (strings, as typed on the command line)."""

    model: str
    """The model, for listings."""
    options: dict
    """Option name (as in ``run``'s parameters) -> value."""


def _gpt_oss(model: str) -> Preset:
    return Preset(model=model, options={"q_heads": ["64"], "kv_heads": ["8"], "head_size": ["64"],
                                        "causal_mode": "true", "sinks": "true", "window": ["none", "127,0"]})


def _gemma2(model: str, heads: int, kv_heads: int, head_size: int, query_scalar: int) -> Preset:
    return Preset(model=model, options={"q_heads": [str(heads)], "kv_heads": [str(kv_heads)],
                                        "head_size": [str(head_size)], "softmax_scale": repr(query_scalar ** -0.5),
                                        "causal_mode": "true", "softcap": ["50"], "window": ["none", "4095,0"]})


def _alibi(model: str, heads: int, head_size: int) -> Preset:
    return Preset(model=model, options={"q_heads": [str(heads)], "head_size": [str(head_size)], "causal_mode": "true",
                                        "alibi": "true"})


def _mla(model: str, heads: int) -> Preset:
    """DeepSeek-V3's MLA decode with absorbed weights (``--mla``): rows of 576, the value the latent 512, one KV head;
    softmax scale 1/sqrt(192) (q/k head size 128 + 64 before absorption). The MLA kernels read pages of 64 tokens
    unless ``--page-size`` says otherwise; naive and the others read the rows as they are."""
    return Preset(model=model, options={"q_heads": [str(heads)], "mla": True, "softmax_scale": repr(192 ** -0.5),
                                        "causal_mode": "true"})


def _mla_prefill(model: str, heads: int) -> Preset:
    """The same models' prefill: ordinary attention with q/k head size 192 (128 + 64 rope) and values of 128."""
    return Preset(model=model, options={"q_heads": [str(heads)], "head_size": ["192"], "head_size_v": "128",
                                        "softmax_scale": repr(192 ** -0.5), "causal_mode": "true"})


PRESETS: dict[str, Preset] = {
    "gpt-oss-20b": _gpt_oss("gpt-oss-20b"),
    "gpt-oss-120b": _gpt_oss("gpt-oss-120b"),
    "gemma2-9b": _gemma2("Gemma 2 9B", 16, 8, 256, 256),
    "gemma2-27b": _gemma2("Gemma 2 27B", 32, 16, 128, 144),
    "bloom-176b": _alibi("BLOOM-176B", 112, 128),
    "mpt-7b": _alibi("MPT-7B", 32, 128),
    "deepseek-v3": _mla("DeepSeek-V3 MLA decode", 128),
    "deepseek-v3-prefill": _mla_prefill("DeepSeek-V3 prefill", 128),
    "kimi-k2": _mla("Kimi K2 MLA decode", 64),
}


def apply(opts: dict, name: str | None) -> dict:
    """``opts`` with the preset's options filled in where ``opts`` has none; ValueError for an unknown name."""
    if name is None:
        return opts
    preset = PRESETS.get(str(name).lower())
    if preset is None:
        raise ValueError(f"unknown --preset {name!r}; known: {', '.join(PRESETS)}")
    return {**opts, **{k: v for k, v in preset.options.items() if opts.get(k) is None}}


def describe(name: str) -> str:
    """One line: the preset's model and what it sets."""
    preset = PRESETS[name]
    opts = preset.options
    if opts.get("mla"):
        return f"{preset.model}: {opts['q_heads'][0]}/1 heads, d576/512 (latent + rope), " \
               f"scale {float(opts['softmax_scale']):.3g}"
    parts = [f"{opts['q_heads'][0]}/{opts.get('kv_heads', opts['q_heads'])[0]} heads",
             f"d{opts['head_size'][0]}" + (f"/{opts['head_size_v']}" if "head_size_v" in opts else "")]
    if "softmax_scale" in opts:
        parts.append(f"scale {float(opts['softmax_scale']):.3g}")
    parts += [name for name in ("sinks", "alibi") if opts.get(name) == "true"]
    if opts.get("softcap"):
        parts.append(f"softcap {opts['softcap'][0]}")
    windows = [w for w in opts.get("window", []) if w != "none"]
    if windows:
        parts.append("window " + " ".join(windows) + " + full")
    return f"{preset.model}: " + ", ".join(parts)
