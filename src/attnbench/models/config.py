"""The models ``attnbench e2e`` knows and what one run of them is (``E2EConfig``): their shapes and defaults,
without torch. The models themselves are built in ``llama`` and ``dit``, which take their configs from here.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field


@dataclass(frozen=True, kw_only=True)
class ModelVariants:
    """The attention variants a model's layers use (``attnbench.features``)."""

    sinks: bool = False
    """A learnable sink logit per query head in every layer (gpt-oss)."""
    softcap: float | None = None
    """Logit softcap of every layer (Gemma 2: 50)."""
    alibi: bool = False
    """ALiBi with the standard slopes instead of RoPE (BLOOM, MPT)."""
    gate: bool = False
    """Gated attention (Qwen3-Next): the attention output times sigmoid of a projection of the layer's input,
    applied after the attention call, before the output projection."""
    sliding_window: int | None = None
    """Tokens a query of a local layer sees (itself and the ones before it); every other layer is local, the
    first included (gpt-oss: 128, Gemma 2: 4096); None = every layer attends to all."""

    def __post_init__(self) -> None:
        if self.softcap is not None and not (math.isfinite(self.softcap) and self.softcap > 0):
            raise ValueError(f"softcap must be a finite number > 0, got {self.softcap!r}")
        if self.sliding_window is not None and (isinstance(self.sliding_window, bool) or self.sliding_window < 1):
            raise ValueError(f"sliding window must be at least 1 token, got {self.sliding_window!r}")

    def window(self, layer: int) -> tuple[int, int] | None:
        """The (left, right) window of layer ``layer`` (causal: right 0), or None."""
        return (self.sliding_window - 1, 0) if self.sliding_window and layer % 2 == 0 else None


@dataclass(frozen=True, kw_only=True)
class GdnLayers:
    """The Gated DeltaNet layers of a hybrid model (Qwen3-Next, Qwen3.5): layer i is full attention when
    ``i % every == every - 1`` and GDN otherwise, so ``every = 4`` gives three GDN layers, then one attention
    (Qwen3-Next's ``full_attention_interval: 4``). Shapes as ``attnbench.linear.spec.RecurrenceSpec`` takes them."""

    heads_qk: int
    """Heads of q and k (``linear_num_key_heads``)."""
    heads_v: int
    """Heads of v, the gates, the state and the output, a multiple of ``heads_qk`` (``linear_num_value_heads``)."""
    d_k: int
    """Head size of q and k (``linear_key_head_dim``)."""
    d_v: int
    """Head size of v and the output (``linear_value_head_dim``)."""
    conv: int = 4
    """Kernel of the causal depthwise conv1d on q, k, v (``linear_conv_kernel_dim``)."""
    every: int = 4
    """One full-attention layer in this many (``full_attention_interval``)."""

    def __post_init__(self) -> None:
        for name in ("heads_qk", "heads_v", "d_k", "d_v", "conv", "every"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"GDN {name} must be a positive integer, got {value!r}")
        if self.heads_v % self.heads_qk:
            raise ValueError(f"GDN value heads ({self.heads_v}) must be a multiple of q/k heads ({self.heads_qk})")

    def is_attention(self, layer: int) -> bool:
        return layer % self.every == self.every - 1


@dataclass(frozen=True, kw_only=True)
class LlamaConfig:
    """Shape of the model."""

    n_layers: int
    """Decoder blocks."""
    dim: int
    """Model (residual) width."""
    n_heads: int
    """Query heads."""
    n_kv_heads: int
    """Key/value heads (GQA when fewer than n_heads)."""
    ffn_dim: int
    """Hidden width of the SwiGLU MLP."""
    vocab_size: int
    """Token vocabulary."""
    rope_theta: float = 500000.0
    """RoPE base frequency (Llama 3)."""
    norm_eps: float = 1e-5
    """RMSNorm epsilon."""
    max_seq_len: int = 8192
    """Longest sequence the RoPE table covers."""
    variants: ModelVariants = dataclasses.field(default_factory=lambda: ModelVariants())
    """Sinks, softcap, ALiBi and local layers (none by default)."""
    head_size: int | None = None
    """Attention head size; None = dim / n_heads (Qwen3-Next's 16 heads of 256 are twice its width of 2048)."""
    gdn: GdnLayers | None = None
    """A hybrid model: Gated DeltaNet layers between the attention layers (``GdnLayers``); None = all attention."""

    def __post_init__(self) -> None:
        if (self.head_size is None and self.dim % self.n_heads) or self.n_heads % self.n_kv_heads:
            raise ValueError(f"dim ({self.dim}) must divide by n_heads ({self.n_heads}) and n_heads by "
                             f"n_kv_heads ({self.n_kv_heads})")
        if self.n_layers < 1:
            raise ValueError(f"n_layers must be >= 1, got {self.n_layers}")

    @property
    def head_dim(self) -> int:
        return self.head_size or self.dim // self.n_heads

    def is_attention(self, layer: int) -> bool:
        """Layer ``layer`` is full attention (every layer of a model without GDN layers)."""
        return self.gdn is None or self.gdn.is_attention(layer)

    @property
    def attention_layers(self) -> int:
        return sum(self.is_attention(i) for i in range(self.n_layers))

    @property
    def gdn_layers(self) -> int:
        return self.n_layers - self.attention_layers


LLAMA_CONFIGS: dict[str, LlamaConfig] = {
    "llama3-8b": LlamaConfig(n_layers=32, dim=4096, n_heads=32, n_kv_heads=8, ffn_dim=14336, vocab_size=128256),
    "llama-tiny": LlamaConfig(n_layers=2, dim=64, n_heads=4, n_kv_heads=2, ffn_dim=160, vocab_size=257,
                              max_seq_len=1024),
    # Qwen3-Next-80B-A3B's layers (config.json): 48 of them, one full-attention layer (16 query / 2 KV heads of 256)
    # in four, the others Gated DeltaNet (16 q/k heads, 32 value heads, 128, conv 4); its MoE (10 routed experts and a
    # shared one, 512 wide each) stands here as one dense SwiGLU as wide as the experts a token uses, 11 x 512: the
    # same FLOPs a token, without the routing. Its attention layers are this file's Llama attention (RoPE on the whole
    # head, no q/k norm; Qwen3-Next rotates a quarter of each head and RMS-normalises q and k): the same call shape
    "qwen3-next": LlamaConfig(n_layers=48, dim=2048, n_heads=16, n_kv_heads=2, head_size=256, ffn_dim=5632,
                              vocab_size=151936, rope_theta=10_000_000.0, norm_eps=1e-6,
                              gdn=GdnLayers(heads_qk=16, heads_v=32, d_k=128, d_v=128)),
    "qwen3-next-tiny": LlamaConfig(n_layers=4, dim=64, n_heads=4, n_kv_heads=2, ffn_dim=160, vocab_size=257,
                                   max_seq_len=1024, norm_eps=1e-6, gdn=GdnLayers(heads_qk=2, heads_v=4, d_k=16, d_v=16)),
}
HYBRID_MODELS = tuple(name for name, c in LLAMA_CONFIGS.items() if c.gdn is not None)
"""The models with Gated DeltaNet layers (``--recurrence`` picks their recurrence backend)."""
DEFAULT_RECURRENCE = "torch-chunked"
"""The recurrence backend of a hybrid model's GDN layers when none is named (any device)."""


@dataclass(frozen=True, kw_only=True)
class DitPreset:
    """One model: diffusers class, its config, the latent input and how many attention calls a block makes."""

    cls: str
    """Class name in ``diffusers``."""
    config: dict
    """Constructor arguments (the model's config.json)."""
    latent: tuple[int, int, int, int]
    """Latent video (frames, channels, height, width) as the model's forward takes it."""
    text_tokens: int
    """Text-encoder tokens (encoder_hidden_states length)."""
    text_dim: int
    """Text-encoder width."""
    batch: int = 2
    """Batch (2 = classifier-free guidance)."""
    dtype: str = "fp16"
    """Default compute dtype."""
    calls_per_block: int = 1
    """Attention calls made by one transformer block."""
    channels_first: bool = False
    """Latent as (B, C, F, H, W) (Wan) instead of (B, F, C, H, W) (CogVideoX)."""
    joint_text: bool = False
    """The self-attention runs over the text and video tokens together (CogVideoX) instead of the video alone."""
    extra: dict = field(default_factory=dict)
    """Other forward keyword arguments."""


DIT_PRESETS: dict[str, DitPreset] = {
    "cogvideox-2b": DitPreset(
        cls="CogVideoXTransformer3DModel",
        config=dict(num_attention_heads=30, attention_head_dim=64, in_channels=16, out_channels=16,
                    time_embed_dim=512, text_embed_dim=4096, num_layers=30, sample_width=90, sample_height=60,
                    sample_frames=49, patch_size=2, temporal_compression_ratio=4, max_text_seq_length=226,
                    use_rotary_positional_embeddings=False),
        latent=(13, 16, 60, 90), text_tokens=226, text_dim=4096, joint_text=True),
    "cogvideox-tiny": DitPreset(
        cls="CogVideoXTransformer3DModel",
        config=dict(num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=4, time_embed_dim=8,
                    text_embed_dim=12, num_layers=2, sample_width=8, sample_height=6, sample_frames=5, patch_size=2,
                    temporal_compression_ratio=4, max_text_seq_length=7),
        latent=(2, 4, 6, 8), text_tokens=7, text_dim=12, dtype="fp32", joint_text=True),
    "wan-1.3b": DitPreset(
        cls="WanTransformer3DModel",
        config=dict(patch_size=(1, 2, 2), num_attention_heads=12, attention_head_dim=128, in_channels=16,
                    out_channels=16, text_dim=4096, freq_dim=256, ffn_dim=8960, num_layers=30, cross_attn_norm=True,
                    qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=1024),
        latent=(21, 16, 60, 104), text_tokens=512, text_dim=4096, dtype="bf16", calls_per_block=2,
        channels_first=True),
    "wan-tiny": DitPreset(
        cls="WanTransformer3DModel",
        config=dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=8, in_channels=4,
                    out_channels=4, text_dim=12, freq_dim=16, ffn_dim=24, num_layers=2, rope_max_seq_len=64),
        latent=(2, 4, 6, 8), text_tokens=7, text_dim=12, dtype="fp32", calls_per_block=2, channels_first=True),
}


MODES = ("prefill", "train")
LLAMA_DEFAULTS = {"llama3-8b": (1, 8192), "llama-tiny": (2, 64), "qwen3-next": (1, 8192),
                  "qwen3-next-tiny": (2, 64)}  # (batch, sequence length)


def model_names() -> list[str]:
    return [*LLAMA_CONFIGS, *DIT_PRESETS]


MAX_STEPS = 100_000
"""Most --steps / --warmup: more would look like a hang."""


def model_layers(name: str) -> int:
    """Blocks of model ``name`` (--layers truncates to at most this many)."""
    if name in LLAMA_CONFIGS:
        return LLAMA_CONFIGS[name].n_layers
    return DIT_PRESETS[name].config["num_layers"]


@dataclass(frozen=True, kw_only=True)
class E2EConfig:
    """What to run end to end."""

    model: str
    """A Llama config (LLAMA_CONFIGS) or a DiT preset (DIT_PRESETS)."""
    backends: tuple[str, ...]
    """Backends to swap in; the first is the reference for speedup and deviation."""
    device: str = "cpu"
    """cpu, cuda or cuda:N."""
    mode: str = "prefill"
    """prefill (forward / one denoising step) or train (forward + loss + backward)."""
    layers: int | None = None
    """Truncate the model to this many blocks; None = all."""
    steps: int = 3
    """Timed steps per backend."""
    warmup: int = 1
    """Untimed steps per backend before timing (compilation, autotuning)."""
    dtype: str | None = None
    """Compute dtype; None = the model's default (Llama bf16, CogVideoX fp16, Wan bf16)."""
    batch: int | None = None
    """Llama batch; None = the config's default."""
    seq_len: int | None = None
    """Llama sequence length; None = the config's default."""
    seed: int = 0
    """Seed of weights and inputs."""
    kernel_counts: bool = False
    """Profile one extra step per backend and count its device kernels (the CogVideoX-2b write-up's copy/add rows)."""
    variants: ModelVariants = field(default_factory=ModelVariants)
    """The features the model's layers use."""
    backend_options: dict = field(default_factory=dict)
    """Backend name -> its constructor options (``--backend-opt``, checked by ``backends.options.resolve``)."""
    recurrence: str | None = None
    """The recurrence backend of a hybrid model's GDN layers (``--recurrence``); None = DEFAULT_RECURRENCE for a
    hybrid model, and nothing for the others (they have no recurrence to run)."""

    def __post_init__(self) -> None:
        if self.recurrence is not None and self.model not in HYBRID_MODELS:
            raise ValueError(f"--recurrence picks the backend of a hybrid model's Gated DeltaNet layers "
                             f"({', '.join(HYBRID_MODELS)}); {self.model} has none")
        if self.recurrence is None and self.model in HYBRID_MODELS:
            object.__setattr__(self, "recurrence", DEFAULT_RECURRENCE)
        if self.variants != ModelVariants() and self.model not in LLAMA_CONFIGS:
            raise ValueError(f"--sinks, --softcap, --alibi and --sliding-window are switches of the Llama models "
                             f"({', '.join(LLAMA_CONFIGS)}), not of {self.model}")
        if self.kernel_counts:
            import torch

            if torch.device(self.device).type != "cuda":
                raise ValueError("kernel counts need a CUDA device (they count device kernels)")
        if self.model not in model_names():
            raise ValueError(f"unknown model {self.model!r}; known: {', '.join(model_names())}")
        if self.mode not in MODES:
            raise ValueError(f"unknown mode {self.mode!r}; allowed: {', '.join(MODES)}")
        if not self.backends:
            raise ValueError("give at least one backend")
        for name, value, low, high in (("steps", self.steps, 1, MAX_STEPS), ("warmup", self.warmup, 0, MAX_STEPS),
                                       ("layers", self.layers, 1, model_layers(self.model)),
                                       ("batch", self.batch, 1, 65536), ("seq_len", self.seq_len, 2, 2**22)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high):
                what = f" ({self.model} has {high} layers; --layers keeps the first N)" if name == "layers" else ""
                flag = {"batch": "--batch-size", "seq_len": "--seq-len"}.get(name, f"--{name}")
                raise ValueError(f"{flag} must be an integer in {low}..{high}{what}, got {str(value)[:40]}")

    def llama_shape(self) -> tuple[int, int]:
        """(batch, sequence length) of a Llama run: the ones given, else the model's defaults."""
        batch, seq = LLAMA_DEFAULTS.get(self.model, (1, 2048))
        return self.batch or batch, self.seq_len or seq
