"""Gated attention (Qwen3-Next, Qwen3.5, Kimi): the attention output multiplied element-wise by ``sigmoid(G)``.

``o ← o ⊙ σ(G)`` with ``G`` an input of the output's shape, (B, Sq, Hq, Dv) or packed (Tq, Hq, Dv), with its own
gradient: in those models ``G`` is a projection of the hidden states, computed beside the queries. The backward
gives ``dO_attn = dO ⊙ σ(G)`` to the attention and ``dG = dO ⊙ O_attn ⊙ σ(G) ⊙ (1 − σ(G))``. The log-sum-exp is
attention's own (the gate acts after the softmax). Kernels without a fused gate apply it after the call, as the
models do (``backends.base.autograd_closure``), and that multiply is inside the timed region. It adds no FLOPs
to the convention (``metrics``): elementwise work on the output; its bytes are counted (read G, write dG).

**Inputs that make it matter.** ``G`` is N(0, 1), seeded after the other inputs: ``σ(G)`` spans about 0.27 to
0.73 for one standard deviation, so a kernel that ignores the gate is off by a factor of 1.4 to 3.7 per element,
one that applies ``G`` without the sigmoid is off by far more, and one that drops ``dG`` has a tensor missing.
"""

from __future__ import annotations

from attnbench.features.base import FeatureInput, Option, Switch


class Gate(Switch):
    name = "gate"
    title = "an output gate"
    refusal = "output gate not supported"
    stage = "output"
    options = (Option("gate", ("--gate", "--no-gate"), "[both]",
                      "Gated attention (Qwen3-Next): the output times sigmoid(G), G a seeded input of the output's "
                      "shape with its gradient; --gate both runs both."),)
    inputs = (FeatureInput("gate", per_token=True),)

    def draw(self, spec, gen, device, like_out):
        return {"gate": like_out()}

    def output(self, out, tensor):
        return out * tensor.to(out.dtype).sigmoid()

    def output_dout(self, dout, tensor, dtype):
        return dout.to(dtype) * tensor.to(dtype).sigmoid()

    def output_grad(self, out_attn, dout, tensor, dtype):
        s = tensor.to(dtype).sigmoid()
        return dout.to(dtype) * out_attn.to(dtype) * s * (1 - s)


FEATURE = Gate()
