"""The attention layers of today's open models, as sweep settings: ``attnbench run --preset NAME``.

A preset fills in the options that describe a model's attention — heads, head size, softmax scale, causal,
the features it uses (``attnbench.features``) and the windows of its layer kinds — and leaves the rest
(sequence lengths, batch, passes, backends) to the command line. Options given on the command line or in a
config file win over the preset's. The presets are data, in ``presets.yaml`` beside this file: option values as
typed on the command line, with where each model's shapes come from (its published configuration).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from attnbench import features


@dataclass(frozen=True, kw_only=True)
class Preset:
    """A model's attention layers as option values (strings, as typed on the command line)."""

    model: str
    """The model, for listings."""
    options: dict
    """Option name (as in ``run``'s parameters) -> value."""


def _load() -> dict[str, Preset]:
    data = yaml.safe_load((Path(__file__).with_name("presets.yaml")).read_text(encoding="utf-8"))
    return {name: Preset(model=item["model"], options=item["options"]) for name, item in data.items()}


PRESETS: dict[str, Preset] = _load()


def apply(opts: dict, name: str | None) -> dict:
    """``opts`` with the preset's options filled in where ``opts`` has none; ValueError for an unknown name."""
    if name is None:
        return opts
    preset = PRESETS.get(str(name).lower())
    if preset is None:
        raise ValueError(f"unknown --preset {name!r}; known: {', '.join(PRESETS)}")
    return {**opts, **{k: v for k, v in preset.options.items() if opts.get(k) is None}}


def beyond_name(name: str, model: str) -> str:
    """What ``model`` says beyond the preset's ``name``: its leading words that spell the name (case, spaces and
    hyphens aside) dropped, so a listing names the model once ("gpt-oss-20b" says all of "gpt-oss-20b";
    "DeepSeek-V3 MLA decode" says "MLA decode" beyond "deepseek-v3"); the whole model where no prefix does."""
    def key(text: str) -> str:
        return re.sub(r"[^a-z0-9]", "", text.lower())
    ends = [m.start() for m in re.finditer(r"[\s-]", model)] + [len(model)]
    spelled = [end for end in ends if key(model[:end]) == key(name)]
    return model[spelled[-1]:].lstrip(" -") if spelled else model


def describe(name: str) -> str:
    """One line: what the preset's model name does not say already (``beyond_name``) and what it sets."""
    preset = PRESETS[name]
    opts = preset.options
    model = beyond_name(name, preset.model)
    lead = f"{model}: " if model else ""
    if opts.get("op") in ("gdn", "kda", "mamba2", "linear"):
        v = opts.get("v_heads", opts["q_heads"])[0]
        return f"{lead}--op {opts['op']}, {opts['q_heads'][0]} q/k and {v} value heads, " \
               f"d{opts['head_size'][0]}" + (f"/{opts['head_size_v']}" if "head_size_v" in opts else "")
    if opts.get("op") == "sparse-mla":
        rows = ("FP8 " if opts.get("decode") else "") + "rows" + (f" of {opts['head_size'][0]}" if "head_size" in opts
                                                                 else "")
        parts = [f"{opts.get('batch_size', ['1'])[0]} x {opts['seq_lens'][0]} q over {opts['kv_seq_lens'][0]} {rows}",
                 f"h{opts['q_heads'][0]}", f"top-k {opts['topk'][0]}"]
        if "extra_cache" in opts:
            parts.append(f"extra cache {opts['extra_cache']}")
        if opts.get("sink"):
            parts.append("sink")
        return lead + ", ".join(parts)
    if opts.get("op") == "indexer":
        return f"{lead}{opts['seq_lens'][0]} q over {opts['kv_seq_lens'][0]} keys, h{opts['q_heads'][0]} " \
               f"d{opts['head_size'][0]} FP8, top-k {opts['topk'][0]}"
    if opts.get("mla"):
        return f"{lead}{opts['q_heads'][0]}/1 heads, d576/512 (latent + rope), " \
               f"scale {float(opts['softmax_scale']):.3g}"
    heads = int(opts["q_heads"][0])
    parts = [f"{heads}/{opts.get('kv_heads', opts['q_heads'])[0]} heads",
             f"d{opts['head_size'][0]}" + (f"/{opts['head_size_v']}" if "head_size_v" in opts else "")]
    if "softmax_scale" in opts:
        parts.append(f"scale {float(opts['softmax_scale']):.3g}")
    for feature in features.FEATURES:
        for setting in feature.settings(opts) or ():
            value = feature.resolve(setting, heads)
            if feature.on(value):
                parts.append(feature.axis(value))
    windows = [w for w in opts.get("window", []) if w != "none"]
    if windows:
        parts.append("window " + " ".join(windows) + " + full")
    return lead + ", ".join(parts)
