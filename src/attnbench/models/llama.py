"""A Llama-3-style decoder in one readable file: RMSNorm, RoPE, GQA attention, SwiGLU MLP.

Random (seeded) weights, no downloads. Used for prefill (a forward over a whole prompt) and a
training step (next-token cross-entropy + backward). Attention goes through the one swap point,
``attnbench.models.swap.attention``, so ``AttnSwap`` decides which kernel runs.

The attention of today's models is a switch of the config (``ModelVariants``): learnable attention sinks per
layer (gpt-oss), a logit softcap (Gemma 2), ALiBi instead of RoPE (BLOOM, MPT) and a sliding window on every
other layer, the first included (gpt-oss: 128 tokens, Gemma 2: 4096), the others attending causally to all.

A hybrid config (``LlamaConfig.gdn``: ``qwen3-next``, ``qwen3-next-tiny``) makes three layers in four Gated
DeltaNet (``GatedDeltaNet``), as Qwen3-Next and Qwen3.5 do: their recurrence goes through the second swap point,
``attnbench.models.swap.recurrence``, so the swap also decides which recurrence kernel runs, and times it apart.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from attnbench.features.alibi import alibi_slopes
from attnbench.linear.inputs import decay_parameters
from attnbench.models import swap
from attnbench.models.config import LLAMA_CONFIGS as CONFIGS
from attnbench.models.config import LlamaConfig, ModelVariants


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


def rope_table(head_dim: int, max_seq_len: int, theta: float) -> torch.Tensor:
    """(max_seq_len, head_dim / 2, 2) cos and sin of each position and frequency, fp32."""
    freqs = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(max_seq_len, dtype=torch.float32), freqs)
    return torch.stack([angles.cos(), angles.sin()], dim=-1)


def apply_rope(x_bshd: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Rotate interleaved pairs of x (B, S, H, D) by the angles of positions 0..S-1."""
    x = x_bshd.float().unflatten(-1, (-1, 2))
    cos, sin = table[: x.shape[1], None, :, 0], table[: x.shape[1], None, :, 1]
    out = torch.stack([x[..., 0] * cos - x[..., 1] * sin, x[..., 1] * cos + x[..., 0] * sin], dim=-1)
    return out.flatten(-2).type_as(x_bshd)


class Attention(nn.Module):
    def __init__(self, cfg: LlamaConfig, layer: int = 0):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.wq = nn.Linear(cfg.dim, cfg.n_heads * cfg.head_dim, bias=False)
        self.wk = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.wv = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.wo = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.dim, bias=False)
        v = cfg.variants
        self.rope = not v.alibi  # ALiBi models place tokens by the bias alone
        self.sinks = nn.Parameter(torch.zeros(cfg.n_heads)) if v.sinks else None
        self.wg = nn.Linear(cfg.dim, cfg.n_heads * cfg.head_dim, bias=False) if v.gate else None
        self.kwargs = {"window": v.window(layer), "softcap": v.softcap,
                       "alibi": alibi_slopes(cfg.n_heads) if v.alibi else None}

    def forward(self, x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, self.n_heads, self.head_dim)
        k = self.wk(x).view(b, s, self.n_kv_heads, self.head_dim)
        if self.rope:
            q, k = apply_rope(q, rope), apply_rope(k, rope)
        v = self.wv(x).view(b, s, self.n_kv_heads, self.head_dim)
        sinks = None if self.sinks is None else self.sinks.float()  # kernels take fp32 sinks
        out_bhsd = swap.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=True,
                                  sinks=sinks, **self.kwargs)
        out = out_bhsd.transpose(1, 2).reshape(b, s, -1)
        if self.wg is not None:  # the model's own elementwise op, outside the swapped attention
            out = out * torch.sigmoid(self.wg(x))
        return self.wo(out)


class GatedDeltaNet(nn.Module):
    """Qwen3-Next's linear-attention layer (transformers' ``Qwen3NextGatedDeltaNet``), kept simple.

    x -> q, k (heads_qk x d_k) and v (heads_v x d_v) through one projection, a short causal depthwise conv1d
    (kernel 4) and SiLU; per token and value head the log-decay ``g = -exp(A_log) * softplus(a + dt_bias)`` and
    ``beta = sigmoid(b)`` from two small projections (the parameterisation ``attnbench.linear.inputs`` draws its
    cases from); the delta-rule recurrence through the swap point (q and k L2-normalised inside it, as Qwen3-Next's
    ``use_qk_l2norm_in_kernel``); then each head's output RMS-normalised and gated by SiLU of a projection z, and
    the output projection.

    What is simpler than Qwen3-Next: separate projections where it fuses q, k, v, z and a, b into two with the heads
    interleaved (the same matmul FLOPs); the gate applied in the compute dtype (Qwen3-Next applies it in fp32); a
    conv without a cached state (prefill and training start from an empty cache, as every step here does).
    """

    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        c = cfg.gdn
        self.heads_qk, self.heads_v, self.d_k, self.d_v = c.heads_qk, c.heads_v, c.d_k, c.d_v
        self.key_dim, self.value_dim = c.heads_qk * c.d_k, c.heads_v * c.d_v
        channels = 2 * self.key_dim + self.value_dim
        self.w_qkv = nn.Linear(cfg.dim, channels, bias=False)
        self.conv = nn.Conv1d(channels, channels, c.conv, groups=channels, padding=c.conv - 1, bias=False)
        self.w_a = nn.Linear(cfg.dim, c.heads_v, bias=False)  # the decay's pre-activation
        self.w_b = nn.Linear(cfg.dim, c.heads_v, bias=False)  # beta's
        self.A_log = nn.Parameter(torch.zeros(c.heads_v, dtype=torch.float32))  # g is formed in fp32 (init_decay)
        self.dt_bias = nn.Parameter(torch.zeros(c.heads_v, dtype=torch.float32))
        self.w_z = nn.Linear(cfg.dim, self.value_dim, bias=False)  # the output gate
        self.out_norm = RMSNorm(c.d_v, cfg.norm_eps)
        self.wo = nn.Linear(self.value_dim, cfg.dim, bias=False)

    def init_decay(self, gen: torch.Generator) -> None:
        """A_log and dt_bias as the layer initialises them: decays per token from long memory to short over the
        heads (``attnbench.linear.inputs.decay_parameters``), not the N(0, 0.02) of the other weights (every head
        would forget half its state each token)."""
        a_log, dt_bias = decay_parameters(self.heads_v, self.heads_v, gen)
        with torch.no_grad():
            self.A_log.copy_(a_log)
            self.dt_bias.copy_(dt_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        qkv = self.conv(self.w_qkv(x).transpose(1, 2))[..., :s]  # (B, C, S); padded both sides: the first s are causal
        q, k, v = F.silu(qkv).transpose(1, 2).split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        q, k = q.reshape(b, s, self.heads_qk, self.d_k), k.reshape(b, s, self.heads_qk, self.d_k)
        v = v.reshape(b, s, self.heads_v, self.d_v)
        g = -self.A_log.exp() * F.softplus(self.w_a(x).float() + self.dt_bias)  # (B, S, HV) fp32
        beta = torch.sigmoid(self.w_b(x))
        out = swap.recurrence(q, k, v, g, beta, l2norm=True)  # (B, S, HV, d_v)
        out = self.out_norm(out) * F.silu(self.w_z(x).view(b, s, self.heads_v, self.d_v))
        return self.wo(out.reshape(b, s, -1))


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x)."""

    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.w1 = nn.Linear(cfg.dim, cfg.ffn_dim, bias=False)
        self.w3 = nn.Linear(cfg.dim, cfg.ffn_dim, bias=False)
        self.w2 = nn.Linear(cfg.ffn_dim, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    """Pre-norm residual block: attention (or, in a hybrid model's GDN layers, the GDN layer), then the MLP."""

    def __init__(self, cfg: LlamaConfig, layer: int = 0):
        super().__init__()
        self.attention_norm, self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps), RMSNorm(cfg.dim, cfg.norm_eps)
        self.attention = Attention(cfg, layer) if cfg.is_attention(layer) else None
        self.gdn = None if self.attention is not None else GatedDeltaNet(cfg)
        self.feed_forward = FeedForward(cfg)

    def forward(self, x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        h = self.attention_norm(x)
        x = x + (self.attention(h, rope) if self.attention is not None else self.gdn(h))  # GDN: no positions
        return x + self.feed_forward(self.ffn_norm(x))


class Llama(nn.Module):
    """Token ids (B, S) -> logits (B, S, vocab)."""

    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        self.register_buffer("rope", rope_table(cfg.head_dim, cfg.max_seq_len, cfg.rope_theta), persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if tokens.shape[1] > self.cfg.max_seq_len:
            raise ValueError(f"sequence of {tokens.shape[1]} tokens exceeds max_seq_len {self.cfg.max_seq_len}")
        x = self.tok_embeddings(tokens)
        for i, layer in enumerate(self.layers):
            with swap.nvtx_range(f"layer{i}", x.is_cuda):
                x = layer(x, self.rope)
        return self.output(self.norm(x))


def train_loss(model: Llama, tokens: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy (fp32) of a batch of token ids (B, S)."""
    logits = model(tokens[:, :-1])
    return F.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten())


def build_llama(name: str, *, layers: int | None = None, device: str | torch.device = "cpu",
                dtype: torch.dtype = torch.bfloat16, seed: int = 0, max_seq_len: int | None = None,
                variants: ModelVariants | None = None) -> Llama:
    """Model ``name`` from CONFIGS with seeded N(0, 0.02) weights (RMSNorm weights 1), on ``device``; sinks
    are drawn like the other weights (a model's trained sinks are not known here). GDN layers: the conv's taps
    with a standard deviation of 1/kernel, near PyTorch's own initialisation of a conv (taps of 0.02 would shrink q,
    k, v to a few hundredths), and the decays as ``init_decay`` draws them."""
    if name not in CONFIGS:
        raise ValueError(f"unknown Llama config {name!r}; known: {', '.join(CONFIGS)}")
    cfg = CONFIGS[name]
    changes = {k: v for k, v in (("n_layers", layers), ("max_seq_len", max_seq_len), ("variants", variants))
               if v is not None}
    cfg = dataclasses.replace(cfg, **changes)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # build in the compute dtype: no fp32 copy of an 8B model
    try:
        with torch.device(device):
            model = Llama(cfg)
    finally:
        torch.set_default_dtype(previous)
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if not pname.endswith(("norm.weight", "A_log", "dt_bias")):
                std = 1 / p.shape[-1] if pname.endswith("conv.weight") else 0.02
                nn.init.normal_(p, std=std, generator=gen)
    decays = torch.Generator().manual_seed(seed)  # on the CPU: the draws are the same on every device
    for layer in model.layers:
        if layer.gdn is not None:
            layer.gdn.init_decay(decays)
    return model


def random_tokens(batch: int, seq_len: int, vocab_size: int, device, seed: int = 0) -> torch.Tensor:
    """Seeded token ids (B, S)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    return torch.randint(0, vocab_size, (batch, seq_len), generator=gen, device=device)
