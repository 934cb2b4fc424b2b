"""The recurrence as an operator of the shared pipeline (``attnbench.operators``): what the runner, the store and the
checker ask of a ``RecurrenceSpec`` case.

- **FLOPs**: a prefill case counts the chunked form's work (``linear.metrics``, ``form="chunked"``: what the
  chunk kernels that serve prefill compute), a decode case the recurrent form's (one token on the state), whatever
  the backend: every backend of a case is held to the same count, so rates compare like times do.
- **The check**: the exact fp64 recurrence (``reference.reference``) and, as the yardstick of the verdict, the same
  recurrence token by token in PyTorch as a careful kernel computes it on the case's dtype
  (``torch_forms.naive_recurrent``: decays and state in fp32, as every library keeps them, what a kernel hands to a
  matmul rounded to the dtype; a yardstick with a bf16 state is 0.7-1.3% off in dv and would let a kernel 1% wrong
  pass). The per-tensor sums behind the fp32 floors (``reduction``), the tensors' token and head dimensions for the
  block and per-head measures (``layouts``) and the per-head parameters' gradients (``correlated``) are stated
  here. Every tensor the reference returns is judged —
  ``out``, ``final_state`` and, for fwd_bwd, the gradient of every differentiable input — by
  ``accuracy.tolerance.judge``; a tensor a kernel does not return fails.
- **Store columns**: heads_q/heads_kv hold the q/k and value heads, head_dim/head_dim_v d_k and d_v, seq_len the
  longest sequence; the label names the kind (``gdn b1 s4096 h16/32 ...``).
- **verify's cases** (``bug_prone``): the shapes where a recurrence kernel's bugs hide.
"""

from __future__ import annotations

import itertools
import json

from attnbench.linear.spec import DEFAULT_CHUNK, DEFAULT_SEQLEN, DELTA_KINDS, RecurrenceSpec


class Recurrence:
    name = "recurrence"
    flop_note = ("a recurrence's count the chunked form's work in prefill and the recurrent form's in decode, "
                 "whatever the kernel")
    cpu_share = 0.05
    """Of plain attention math's FLOP rate (``operators.Attention.cpu_share``), what the CPU forms reach of the
    count above: the token loop 0.05, the chunk form 0.2-0.25 for GDN and Mamba2, 0.008 for KDA (2-core EPYC,
    one thread, bf16, the CPU default shape, 2026-12-08); the loop's, which every sweep runs."""

    def spec_from_dict(self, data: dict) -> RecurrenceSpec:
        return RecurrenceSpec.from_dict(data)

    def make_inputs(self, spec: RecurrenceSpec, device, seed: int, dist=None):
        from attnbench.linear.inputs import make_inputs
        if dist is not None and not dist.is_default:
            raise ValueError("--input-scale and --outliers shape attention's q, k, v; a recurrence draws its own")
        return make_inputs(spec, seed=seed, device=device)

    def form(self, spec: RecurrenceSpec) -> str:
        """The form whose work a case's FLOPs count (module doc)."""
        return "recurrent" if spec.decode else "chunked"

    def flops(self, spec: RecurrenceSpec, convention: str = "exact", inputs=None) -> float:
        from attnbench.linear import metrics
        return metrics.flops(spec, self.form(spec))

    def bytes_moved(self, spec: RecurrenceSpec, inputs=None) -> float:
        from attnbench.linear import metrics
        return metrics.bytes_moved(spec)

    def info(self, spec: RecurrenceSpec, inputs) -> dict:
        return {"flops_form": self.form(spec)}

    def memory_guard(self, spec: RecurrenceSpec, backend, device, *, inputs_allocated: bool = True) -> str | None:
        """The inputs and outputs (and gradients) at their sizes, plus the fp64 copies the check makes on the
        device: about four times the bytes a call moves (estimated, as ``memory.guard``); plus what ``backend``
        declares it allocates beyond them (``workspace_bytes``: the chunk form's C x C matrices)."""
        from attnbench.memory import too_big
        declared = getattr(backend, "workspace_bytes", None)
        workspace = int(declared(spec)) if callable(declared) else 0
        return too_big(4 * self.bytes_moved(spec) + workspace, device, rough=True)

    def columns(self, spec: RecurrenceSpec) -> dict:
        return dict(batch=spec.batch, seq_len=max(spec.seqlens), seq_len_k=max(spec.seqlens),
                    num_seqs=spec.num_seqs, total_q=spec.total_tokens, heads_q=spec.heads_qk,
                    heads_kv=spec.heads_v, head_dim=spec.d_k, head_dim_v=spec.d_v,
                    emb_dim=spec.heads_v * spec.d_v, dtype=spec.dtype, causal=1, varlen=int(spec.is_varlen),
                    window=json.dumps(None), layout="bshd")

    def wanted(self, spec: RecurrenceSpec) -> tuple[str, ...]:
        """What a kernel must return for the case's pass."""
        from attnbench.outputs import grad_name
        grads = tuple(map(grad_name, spec.input_names)) if spec.pass_ == "fwd_bwd" else ()
        return ("out", "final_state", *grads)

    def reduction(self, spec: RecurrenceSpec) -> dict[str, int]:
        """The longest sum behind each tensor: a state entry sums every token of its sequence (with the delta rule
        each token's update reads the state through a d_k-long dot product), an output a state column (d_k); a
        per-token decay's gradient sums every entry of the state over the tokens after it, a per-head parameter's
        (Mamba2's A and D) every token of the head."""
        t, k, v = max(spec.seqlens), spec.d_k, spec.d_v
        state = t * k * v
        return {"*": max(t * (k if spec.delta else 1), k, v), "dg": t * v if spec.per_channel else state,
                "dbeta": state, "ddt": state, "dA": state, "dD": t * v}

    def correlated(self, spec: RecurrenceSpec) -> dict[str, int]:
        """Per-head parameters' gradients, each a sum of per-token terms whose errors a chunk kernel correlates over
        its chunk (``accuracy.tolerance``)."""
        return {name: spec.chunk for name in ("dA", "dD") if name in map("d{}".format, spec.input_names)}

    def layouts(self, spec: RecurrenceSpec) -> dict:
        """(token dim, head dim) of each tensor: (B, T, H, D) tokens and heads; states (N, HV, K, V) by head;
        per-token decays and steps (B, T, HV) (kda's (B, T, HV, K))."""
        token = {name: (-3, -2) for name in ("out", "dq", "dk", "dv")}
        decay = (-3, -2) if spec.per_channel else (-2, -1)
        return {**token, "final_state": (None, 1), "dinitial_state": (None, 1), "dg": decay, "dbeta": (-2, -1),
                "ddt": (-2, -1)}

    def expected(self, spec: RecurrenceSpec, inputs, *, grads: bool, blocks=None):
        """The fp64 reference and the dtype baseline's metrics against it (``accuracy.check.Expected``)."""
        from attnbench.accuracy.check import Expected
        from attnbench.accuracy.compare import compare
        from attnbench.linear.reference import reference
        from attnbench.linear.torch_forms import naive_recurrent
        case = spec.replace(pass_="fwd_bwd" if grads else "fwd")
        ref = reference(case, inputs)
        base = naive_recurrent(case, inputs)
        device = inputs.q.device
        return Expected(reference=ref, baseline=compare(base.tensors(), ref.tensors(), self.layouts(spec)), grads=grads,
                        label=f"float64 {device.type}, the recurrence token by token")

    def sweep(self, axes: dict, options: dict) -> list[RecurrenceSpec]:
        """The cases of a run: the product of the axes given (``cli.common.operator_specs`` parses them). A Mamba2
        layer has its D·x skip, as the models' layers do. A prefill starts from a state handed in unless
        ``options["initial_state"]`` is False: a kernel that ignores the state would otherwise pass (the state is
        what a chunked prefill and a cached prefix hand on)."""
        kind = options["kind"]
        decode = bool(options.get("decode"))
        if decode and axes.get("seq_lens"):
            raise ValueError("--decode adds one token to each sequence's state: drop --seq-lens (--batch-size "
                             "gives the sequences)")
        if options.get("qk_prenormed") and kind not in DELTA_KINDS:
            raise ValueError(f"--qk-prenormed is for {' and '.join(DELTA_KINDS)}: {kind} never L2-normalises q and k")
        if options.get("decay_bound") is not None and kind != "kda":
            raise ValueError(f"--decay-bound is kda's bounded decay: {kind} has none")
        lengths = axes.get("seq_lens") or [None]
        chunk = options.get("chunk")
        longest = max((max(group) for group in lengths if group), default=None)
        if chunk and not decode and chunk > max(longest or DEFAULT_SEQLEN, DEFAULT_CHUNK):
            # a chunk past a sequence's end only pads it with zeros, at C x C (x K) a chunk
            raise ValueError(f"--chunk {chunk} is longer than the longest sequence ({longest or DEFAULT_SEQLEN} "
                             f"tokens): a chunk past its end only adds zero tokens; give at most "
                             f"{max(longest or DEFAULT_SEQLEN, DEFAULT_CHUNK)}")
        specs = []
        for batch, seqlens, heads, v_heads, d_k, d_v, dtype, pass_ in itertools.product(
                axes.get("batch_sizes") or [1], lengths, axes.get("q_heads") or [16],
                axes.get("v_heads") or [None], axes.get("head_sizes") or [128], axes.get("head_sizes_v") or [None],
                axes.get("dtypes") or ["bf16"], axes.get("passes") or ["fwd"]):
            specs.append(RecurrenceSpec(kind=kind, batch=batch, seqlens=None if decode else seqlens, heads_qk=heads,
                                        heads_v=v_heads, d_k=d_k, d_v=d_v, dtype=dtype, pass_=pass_, decode=decode,
                                        chunk=chunk or DEFAULT_CHUNK, skip=kind == "mamba2",
                                        initial_state=True if options.get("initial_state") is None and not decode
                                        else options.get("initial_state"),
                                        l2norm=False if options.get("qk_prenormed") else None,
                                        decay_bound=options.get("decay_bound")))
        return list(dict.fromkeys(specs))

    def bug_prone(self, asked: RecurrenceSpec, given: frozenset[str], device: str) -> list[RecurrenceSpec]:
        """verify's cases for the kind, dtype and pass of ``asked``: a varlen group with odd lengths and a length-1
        sequence (state leaking across packed sequences, a dropped tail) starting from a state handed in (an
        initial state ignored or read at the wrong sequence), with twice as many value heads as q/k heads (GVA:
        value head hv must read q/k head hv // 2); a dense batch from a zero state; one decode step; each with a
        chunk that divides no length (a lost partial chunk). ``given``: the options the user set (``q_heads``,
        ``v_heads``, ``head_size``, ``head_size_v``, ``chunk``, ``decode``, ``initial_state``); those keep ``asked``'s
        values (a preset's heads; the state for every prefill case), and ``decode`` keeps the decode case alone."""
        gpu = device.startswith("cuda")
        h, d, dv, chunk = (4, 128, 128, 64) if gpu else (2, 16, 24, 16)
        shapes = [dict(seqlens=(1000, 1, 577, 300) if gpu else (37, 1, 70), initial_state=True, group=2),
                  dict(batch=2, seqlens=(1000,) if gpu else (45,), initial_state=False, group=1),
                  dict(batch=8 if gpu else 3, seqlens=None, decode=True, initial_state=True, group=2)]
        if "decode" in given:
            shapes = [s for s in shapes if s.get("decode")]
        out = []
        for shape in shapes:
            fields = {**dict(batch=1, decode=False, heads_qk=h, d_k=d, d_v=dv, chunk=chunk), **shape}
            fields["heads_v"] = fields.pop("group") * fields["heads_qk"]
            for option, names in (("q_heads", ("heads_qk",)), ("head_size", ("d_k", "d_v")),
                                  ("head_size_v", ("d_v",)), ("chunk", ("chunk",))):
                if option in given:
                    fields.update({name: getattr(asked, name) for name in names})
            if "initial_state" in given and not fields["decode"]:  # --(no-)initial-state: every prefill case
                fields["initial_state"] = asked.initial_state
            if "v_heads" in given:
                fields["heads_v"] = asked.heads_v
            elif "q_heads" in given:  # the shape's ratio of value heads to q/k heads, over the given q/k heads
                fields["heads_v"] = fields["heads_qk"] * (fields["heads_v"] // h)
            out.append(asked.replace(**fields))
        return out

    def axes(self, spec: RecurrenceSpec) -> dict[str, str]:
        """The case's position on the summary's axes (``report.summary.axes``)."""
        from attnbench.serving import group_label
        return {"op": spec.kind + (" decode" if spec.decode else "") + ("" if spec.gated else " ungated")
                + (f" lb{spec.decay_bound:g}" if spec.decay_bound is not None else ""),
                "pass": spec.pass_, "dtype": spec.dtype, "batch": f"b{spec.batch}",
                "seq": str(spec.seqlens[0]) if not spec.is_varlen else group_label(spec.seqlens),
                "heads": f"h{spec.heads_qk}" + (f"/{spec.heads_v}" if spec.heads_v != spec.heads_qk else ""),
                "head_dim": f"d{spec.d_k}" + (f"/{spec.d_v}" if spec.d_v != spec.d_k else ""),
                "state": "" if spec.decode else "h0" if spec.initial_state else "no h0", "chunk": f"c{spec.chunk}"}
