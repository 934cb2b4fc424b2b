"""FlashAttention-4's ALiBi, written in the CuTe DSL as FA4 takes score mods (imported only by the fa4 adapter:
this module needs the CUTLASS DSL).

``alibi_score_mod`` adds ``slope_h · (j − i)`` to the scaled score of query ``i`` and key ``j`` (positions within
the sequence; the adapter runs it only where queries and keys have equal lengths, so ``i`` is already aligned
to the lower right), reading the (Hq,) float32 slopes from ``aux_tensors[0]``. The bias does not depend on the
score, so the backward passes the score's gradient through unchanged.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute


@cute.jit
def alibi_score_mod(tSrS_ssa, b_idx, h_idx, q_idx, kv_idx, seqlen_info, aux_tensors):
    slopes = aux_tensors[0]
    head = cute.make_rmem_tensor(1, cutlass.Int32)
    head.store(h_idx)
    slope = cute.make_rmem_tensor(1, cutlass.Float32)
    slope[0] = slopes[head[0]]
    rel = (kv_idx - q_idx).to(cutlass.Float32)
    return tSrS_ssa + rel * slope.load()


@cute.jit
def alibi_score_mod_bwd(grad_out_ssa, score_ssa, b_idx, h_idx, q_idx, kv_idx, seqlen_info, aux_tensors):
    return grad_out_ssa
