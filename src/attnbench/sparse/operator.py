"""Index-selected MLA as an operator of the shared pipeline (``attnbench.operators``).

- **FLOPs and bytes** count the selected tokens (``counts.sparse_counts``: valid slots, distinct rows read once)
  from the case's inputs, so they are exact for the index lists the kernels got; the dense attention over every
  visible key is recorded beside them (``info["dense_tflops"]``: what the selection saves). Before the inputs exist
  (a compile-worker estimate) every slot of every query counts.
- **The check**: the exact reference over exactly the selected tokens (``reference.reference_sparse``: fp64 on the
  CPU, fp32 with TF32 off on a GPU) and, as the verdict's yardstick, the same gather in PyTorch in the case's dtype
  (``baseline.baseline_sparse``). In decode both read the dequantized FP8 rows: the values the kernel computes
  with. A kernel returns ``out`` and ``lse`` (and prefill's ``max_logits``, compared where given); fwd_bwd adds
  dq, dkv and the extra cache's and sink's gradients.
- **verify's cases** (``bug_prone``): the shapes where a sparse kernel's bugs hide.
"""

from __future__ import annotations

import itertools
import json

from attnbench.sparse.reference import LATENT, ROPE
from attnbench.sparse.spec import INVALID_RATE, SparseSpec, grads_of, make_inputs


class SparseMla:
    name = "sparse-mla"
    flop_note = "sparse MLA's count the selected (query, key) slots"
    cpu_share = 0.1
    """Of plain attention math's FLOP rate (``operators.Attention.cpu_share``), what the CPU kernels reach of the
    count above: sparse-torch's gathered rows 0.03-0.1, flex-sparse-mla 0.25 (2-core EPYC, one thread, bf16, the
    CPU default shape, 2026-12-08)."""

    def spec_from_dict(self, data: dict) -> SparseSpec:
        return SparseSpec.from_dict(data)

    def make_inputs(self, spec: SparseSpec, device, seed: int, dist=None):
        if dist is not None and not dist.is_default:
            raise ValueError("--input-scale and --outliers shape attention's q, k, v; sparse MLA draws its own")
        return make_inputs(spec, device, seed)

    def counts(self, spec: SparseSpec, inputs):
        from attnbench.sparse.counts import sparse_counts
        from attnbench.sparse.fp8 import ROW_BYTES
        extra_rows = 0 if spec.extra is None else spec.batch * spec.extra[0]
        return sparse_counts(inputs.selection, spec.cache_rows, heads=spec.heads, d_qk=spec.d_qk, d_v=spec.d_v,
                             pass_=spec.pass_, row_bytes=ROW_BYTES if spec.decode else None,
                             elem_bytes=inputs.q.element_size(), extra=inputs.extra, extra_rows=extra_rows,
                             attn_sink=spec.sink)

    def flops(self, spec: SparseSpec, convention: str = "exact", inputs=None) -> float:
        if inputs is not None:
            return self.counts(spec, inputs).flops
        from attnbench.metrics import PASS_FLOP_FACTOR
        slots = spec.queries * (spec.topk + (spec.extra[1] if spec.extra else 0))
        return 2.0 * spec.heads * (spec.d_qk + spec.d_v) * slots * PASS_FLOP_FACTOR[spec.pass_]

    def bytes_moved(self, spec: SparseSpec, inputs=None) -> float:
        if inputs is not None:
            return self.counts(spec, inputs).bytes
        elem = 2 if spec.dtype != "fp32" else 4
        return float(spec.queries * spec.heads * (spec.d_qk + spec.d_v) * elem + spec.cache_rows * spec.d_qk * elem)

    def info(self, spec: SparseSpec, inputs) -> dict:
        """The selection's size and the dense attention beside it."""
        c = self.counts(spec, inputs)
        return {"valid_slots": c.slots, "distinct_rows": c.rows, "dense_flops": c.dense_flops,
                "dense_bytes": c.dense_bytes}

    def memory_guard(self, spec: SparseSpec, backend, device, *, inputs_allocated: bool = True) -> str | None:
        """About four times the bytes a call moves, plus what ``backend`` declares it allocates beyond them on
        ``device`` (``workspace_bytes(spec, device)``: an unfused kernel's expanded rows and scores)."""
        from attnbench.memory import too_big
        declared = getattr(backend, "workspace_bytes", None)
        workspace = int(declared(spec, device)) if callable(declared) else 0
        return too_big(4 * self.bytes_moved(spec) + workspace, device, rough=True)

    def columns(self, spec: SparseSpec) -> dict:
        return dict(batch=spec.batch, seq_len=spec.s_q, seq_len_k=spec.s_kv, num_seqs=spec.batch,
                    total_q=spec.queries, heads_q=spec.heads, heads_kv=1, head_dim=spec.d_qk, head_dim_v=spec.d_v,
                    emb_dim=spec.heads * spec.d_qk, dtype=spec.dtype, causal=1, varlen=0, window=json.dumps(None),
                    layout="bshd")

    def axes(self, spec: SparseSpec) -> dict[str, str]:
        return {"op": "sparse-mla" + (" fp8 decode" if spec.decode else ""), "pass": spec.pass_,
                "dtype": spec.dtype, "batch": f"b{spec.batch}", "seq": str(spec.s_q), "keys": f"keys {spec.s_kv}",
                "topk": f"top-k {spec.topk} {spec.indices}" + (f" {spec.invalid:.1%} empty" if spec.invalid else "")
                + (f" {spec.repeats:.1%} repeated" if spec.repeats else ""),
                "heads": f"h{spec.heads}",
                "head_dim": f"d{spec.d_qk}/{spec.d_v}", "sink": "sink" if spec.sink else "no sink",
                "lengths": "lengths" if spec.topk_length else "no lengths",
                "extra": f"extra {spec.extra[0]}x{spec.extra[1]}" if spec.extra else "no extra"}

    def bug_prone(self, asked: SparseSpec, given: frozenset[str], device: str) -> list[SparseSpec]:
        """verify's cases for the dtype and pass of ``asked``: a causal prefill whose queries are the whole
        sequence (s_q = s_kv, as a fresh sequence's prefill), so the first top-k − 1 queries see fewer keys than
        top-k and have empty (−1) slots (read as row 0, or not masked); top-k lengths (slots past a query's
        length counted); a sink (left out, or at the wrong head); an extra cache (dropped, or its rows read from
        the main cache); decode over FP8 rows (bf16 only: the rows are V3.2's layout); repeated slots (a row
        counted once) — with odd sizes and several requests, whose slots name rows of their own block of the stacked
        cache, and empty slots (−1 and past the cache) drawn anywhere in every list. ``given``: the options the user
        set; ``q_heads``, ``head_size``, ``head_size_v`` keep ``asked``'s values, ``sink``, ``topk_lengths``,
        ``extra_cache`` and ``indices`` are added to every case, and ``decode`` keeps the decode case alone."""
        gpu = device.startswith("cuda")
        shapes = [dict(s_q=4096, s_kv=4096, topk=2048) if gpu else dict(s_q=77, s_kv=77, topk=32),
                  dict(batch=2, s_q=1000, s_kv=4096, topk=2048, indices="random", topk_length=True) if gpu
                  else dict(batch=2, s_q=33, s_kv=130, topk=48, indices="random", topk_length=True),
                  dict(s_q=1000, s_kv=4096, topk=2048, sink=True) if gpu else dict(s_q=40, s_kv=100, topk=24, sink=True),
                  dict(batch=2, s_q=577, s_kv=4096, topk=512, extra=(2048, 512)) if gpu
                  else dict(batch=2, s_q=17, s_kv=90, topk=20, extra=(40, 12), indices="random"),
                  dict(batch=16, s_q=2, s_kv=8192, topk=2048, decode=True) if gpu
                  else dict(batch=3, s_q=2, s_kv=300, topk=64, decode=True, indices="random"),
                  dict(s_q=1000, s_kv=4096, topk=2048, repeats=0.05) if gpu
                  else dict(s_q=33, s_kv=130, topk=48, indices="random", repeats=0.05)]
        if "decode" in given:
            shapes = [s for s in shapes if s.get("decode")]
        elif asked.dtype != "bf16" or asked.d_qk != LATENT + ROPE:  # FP8 rows are V3.2's bf16 rows of 576
            shapes = [s for s in shapes if not s.get("decode")]
        kept = {"q_heads": ("heads",), "head_size": ("d_qk",), "head_size_v": ("d_v",), "sink": ("sink",),
                "topk_lengths": ("topk_length",), "extra_cache": ("extra",), "indices": ("indices",),
                "empty_slots": ("invalid",), "repeated_slots": ("repeats",)}
        out = []
        for shape in shapes:
            fields = {**dict(batch=1, heads=128 if gpu else 4, indices="indexer", decode=False, sink=False,
                             topk_length=False, extra=None, invalid=INVALID_RATE, repeats=0.0), **shape}
            for option, names in kept.items():
                if option in given:
                    fields.update({name: getattr(asked, name) for name in names})
            out.append(asked.replace(**fields))
        return out

    def wanted(self, spec: SparseSpec) -> tuple[str, ...]:
        return ("out", "lse", *(grads_of(spec) if spec.pass_ == "fwd_bwd" else ()))

    def reduction(self, spec: SparseSpec) -> dict[str, int]:
        """A score sums a row's d_qk terms, a query's softmax its slots; a cache row's gradient sums every query's
        heads that picked it, a sink's every query's d_v values."""
        slots = spec.topk + (spec.extra[1] if spec.extra else 0)
        rows = spec.queries * spec.heads
        return {"*": max(slots, spec.d_qk), "dkv": rows, "dextra_kv": rows, "dattn_sink": spec.queries * spec.d_v}

    def layouts(self, spec: SparseSpec) -> dict:
        """out, dq (T, Hq, D) and lse, max_logits (Hq, T) by token and head; the caches have one head."""
        return {"out": (-3, -2), "dq": (-3, -2), "lse": (-1, -2), "max_logits": (-1, -2)}

    def expected(self, spec: SparseSpec, inputs, *, grads: bool, blocks=None):
        from attnbench.accuracy.check import Expected
        from attnbench.accuracy.compare import compare
        from attnbench.sparse.baseline import baseline_sparse
        from attnbench.sparse.reference import reference_sparse
        dout = inputs.dout if grads else None
        ref = reference_sparse(inputs.q, inputs.kv, inputs.selection, **inputs.kwargs(spec), dout=dout, blocks=blocks)
        base = baseline_sparse(inputs.q, inputs.kv, inputs.selection, **inputs.kwargs(spec), dout=dout)
        device = inputs.q.device
        dtype = "float64" if device.type == "cpu" else "float32 (TF32 off)"
        what = "the dequantized FP8 rows" if spec.decode else "the cache"
        return Expected(reference=ref, baseline=compare(base.tensors(), ref.tensors(), self.layouts(spec)), grads=grads,
                        label=f"{dtype} {device.type}, exactly the selected rows of {what}")

    def sweep(self, axes: dict, options: dict) -> list[SparseSpec]:
        """The cases of a run; what is not given is DeepSeek-V3.2's prefill (4096 queries over 8192 rows, 128 heads,
        top-k 2048) or decode (2 queries), or on a CPU (``options["small"]``) a case of seconds: a fresh sequence's
        prefill, 256 queries over their own 256 rows, 16 heads, top-k 128 (its first 127 queries see fewer keys than
        top-k). Every case empties ``INVALID_RATE`` of its slots unless ``options["invalid"]`` says otherwise
        (``spec.py``, "Slot kinds")."""
        decode, small = bool(options.get("decode")), bool(options.get("small"))
        seqs = [s[0] if len(s) == 1 else _one(s) for s in axes.get("seq_lens") or []] or [
            2 if decode else 256 if small else 4096]
        rows = 256 if small else 8192
        specs = []
        for batch, s_q, s_kv, heads, topk, dtype, pass_ in itertools.product(
                axes.get("batch_sizes") or [1], seqs, axes.get("kv_seq_lens") or [None],
                axes.get("q_heads") or [16 if small else 128], axes.get("topks") or [128 if small else 2048],
                axes.get("dtypes") or ["bf16"], axes.get("passes") or ["fwd"]):
            fields = dict(batch=batch, s_q=s_q, s_kv=s_kv or max(rows, s_q), heads=heads, topk=topk, dtype=dtype,
                          pass_=pass_, decode=decode)
            for name, axis in (("d_qk", "head_sizes"), ("d_v", "head_sizes_v")):
                if axes.get(axis):
                    fields[name] = axes[axis][0]
            if options.get("indices") is not None:  # --indices '' is refused by the spec, not read as the default
                fields["indices"] = options["indices"]
            invalid = options.get("invalid")
            fields.update(sink=bool(options.get("sink")), topk_length=bool(options.get("topk_length")),
                          extra=options.get("extra"), invalid=INVALID_RATE if invalid is None else invalid,
                          repeats=options.get("repeats") or 0.0)
            specs.append(SparseSpec(**fields))
        return list(dict.fromkeys(specs))


def _one(group) -> int:
    raise ValueError(f"sparse MLA takes one query count per case, not a group ({','.join(map(str, group))}); "
                     "--batch-size gives the requests")
