"""Backends that misbehave on purpose, for the reliability tests.

Loaded through ``ATTNBENCH_PLUGINS=attnbench_test_backends`` (with this folder on PYTHONPATH), so
they exist in every attnbench process, isolated workers included.
"""

from __future__ import annotations

import ctypes
import os
import signal
import time

from attnbench.backends import registry
from attnbench.backends.base import Backend, Capabilities, Prepared

SLEEP_S = float(os.environ.get("ATTNBENCH_TEST_SLEEP_S", "0.01"))


class Segfault(Backend):
    """Kills its own process with SIGSEGV in the timed call (like a kernel writing out of bounds)."""

    name = "test-segv"
    description = "test: segfaults"
    capabilities = Capabilities()

    def prepare(self, spec, inputs):
        def crash():
            os.kill(os.getpid(), signal.SIGSEGV)
            time.sleep(5)  # the signal is delivered before this returns
        return Prepared(fn=crash)


class NullRead(Backend):
    """Reads address 0 (a real segfault, not a sent signal)."""

    name = "test-nullread"
    description = "test: dereferences NULL"
    capabilities = Capabilities()

    def prepare(self, spec, inputs):
        return Prepared(fn=lambda: ctypes.string_at(0))


class Abort(Backend):
    """Aborts the process (what a failed device assertion does)."""

    name = "test-abort"
    description = "test: aborts"
    capabilities = Capabilities()

    def prepare(self, spec, inputs):
        return Prepared(fn=os.abort)


class Hang(Backend):
    """Never returns (a deadlocked kernel)."""

    name = "test-hang"
    description = "test: hangs"
    capabilities = Capabilities()

    def prepare(self, spec, inputs):
        def hang():
            time.sleep(3600)
        return Prepared(fn=hang)


class WrapsNaive(Backend):
    """Naive attention with ``wrap`` around its call: the base of the misbehaving-but-computing backends."""

    capabilities = Capabilities()

    def prepare(self, spec, inputs):
        from attnbench.backends.naive import NaiveBackend
        return Prepared(fn=self.wrap(NaiveBackend().prepare(spec, inputs).fn))

    def wrap(self, inner):
        return inner


class Sleep(WrapsNaive):
    """A well-behaved backend whose call takes $ATTNBENCH_TEST_SLEEP_S seconds (deterministic pacing)."""

    name = "test-sleep"
    description = "test: sleeps, then computes naive attention (so it passes accuracy checks)"

    def wrap(self, inner):
        def call():
            time.sleep(SLEEP_S)
            return inner()
        return call


NATIVE_S = float(os.environ.get("ATTNBENCH_TEST_NATIVE_S", "60"))


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def native_wait(seconds: float) -> None:
    """Spend ``seconds`` in one native call, as a long bf16 matmul on a CPU does: without the interpreter lock,
    and not returning for a signal (a Python handler waits for it). ``pthread_mutex_timedlock`` on a mutex this
    thread holds waits out its deadline (glibc restarts the wait after a signal), using no CPU meanwhile."""
    libc = ctypes.CDLL(None, use_errno=True)
    mutex = ctypes.create_string_buffer(64)  # zeroed: PTHREAD_MUTEX_INITIALIZER (pthread_mutex_t is 40 bytes)
    libc.pthread_mutex_lock(mutex)
    deadline = time.time() + seconds
    libc.pthread_mutex_timedlock(mutex, ctypes.byref(_Timespec(int(deadline), int(deadline % 1 * 1e9))))


class NativeWait(WrapsNaive):
    """Spends $ATTNBENCH_TEST_NATIVE_S seconds (default 60) in one native call (``native_wait``), then computes
    naive attention; creates the file $ATTNBENCH_TEST_NATIVE_MARK, if set, as it enters the call."""

    name = "test-native-wait"
    description = "test: one long native call, then naive attention"

    def wrap(self, inner):
        def call():
            if os.environ.get("ATTNBENCH_TEST_NATIVE_MARK"):
                open(os.environ["ATTNBENCH_TEST_NATIVE_MARK"], "a").close()
            native_wait(NATIVE_S)
            return inner()
        return call


class ContextLoss(Backend):
    """Fails the way an illegal memory access does on a GPU; ``LOST`` then says the process's context is gone."""

    name = "test-context-loss"
    description = "test: a sticky device error"
    capabilities = Capabilities()
    LOST = False

    def prepare(self, spec, inputs):
        def fail():
            ContextLoss.LOST = True
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return Prepared(fn=fail)


class Fp32Kernel(Backend):
    """A correct kernel that accumulates in fp32: exact attention computed in fp32 from the rounded inputs,
    outputs rounded to the input dtype, the LSE returned in fp32 (what flash kernels do)."""

    name = "test-fp32"
    description = "test: fp32-accumulating attention (correct)"
    capabilities = Capabilities(dtypes=("fp16", "bf16", "fp32"), max_head_dim=512, varlen=True, window=True)
    softmax_factor = 1.0

    def prepare(self, spec, inputs):
        import torch

        from attnbench.accuracy.reference import reference_attention
        from attnbench.backends.base import Outputs

        run_spec = spec.replace(scale=spec.softmax_scale * self.softmax_factor) if self.softmax_factor != 1 else spec

        def call():
            ref = reference_attention(run_spec, inputs, grads=spec.pass_ != "fwd", dtype=torch.float32)
            got = {k: (v if k == "lse" else v.to(inputs.q.dtype)) for k, v in ref.tensors().items()}
            return Outputs(**self.spoil(got))
        return Prepared(fn=call, info={"kernel": "fp32 reference, rounded"})

    def spoil(self, tensors: dict) -> dict:
        return tensors


def _scaled(tensor_name: str, factor: float):
    """A variant of Fp32Kernel whose ``tensor_name`` is ``factor`` times too large (a wrong scale in one tensor)."""
    class Scaled(Fp32Kernel):
        name = f"test-{tensor_name}-x{factor:g}"
        description = f"test: {tensor_name} {abs(factor - 1):.0%} too {'large' if factor > 1 else 'small'}"

        def spoil(self, tensors):
            if tensor_name in tensors:
                tensors[tensor_name] = tensors[tensor_name] * factor
            return tensors
    return Scaled


class LseShift(Fp32Kernel):
    """The LSE 0.01 too large (what a softmax scale 1% off does to it), everything else right."""

    name = "test-lse-shift"
    description = "test: lse + 0.01"

    def spoil(self, tensors):
        tensors["lse"] = tensors["lse"] + 0.01
        return tensors


class SoftmaxScale(Fp32Kernel):
    """Softmax scale 1% too large, in every tensor."""

    name = "test-softmax-scale"
    description = "test: softmax scale x 1.01"
    softmax_factor = 1.01


class SoftmaxScaleNoLse(SoftmaxScale):
    """The same, from a kernel that returns no LSE (like SDPA): out and the gradients must show it."""

    name = "test-softmax-scale-nolse"

    def spoil(self, tensors):
        tensors.pop("lse", None)
        return tensors


class BlockBias(Fp32Kernel):
    """dV 3% too large in one tile: the first 128 keys of the first head (of the first sequence)."""

    name = "test-dv-block"
    description = "test: dv x 1.03 in one 128-key tile of one head"

    def spoil(self, tensors):
        if "dv" in tensors:
            dv = tensors["dv"].clone()
            tile = dv[0, :128, 0] if dv.dim() == 4 else dv[:128, 0]
            tile.mul_(1.03)
            tensors["dv"] = dv
        return tensors


class Cached(WrapsNaive):
    """Does its work in ``prepare``; the timed call returns the stored result (an impossible speed)."""

    name = "test-cached"
    description = "test: timed call returns tensors computed in prepare"

    def wrap(self, inner):
        result = inner()
        return lambda: result


class Stale(WrapsNaive):
    """Right on its first call, 10% off on every later one (a stale cache, a race)."""

    name = "test-stale"
    description = "test: wrong after the first call"

    def wrap(self, inner):
        calls = []

        def call():
            calls.append(1)
            res = inner()
            if len(calls) > 1:
                res.out = res.out * 0.9
            return res
        return call


class StaleInPlace(WrapsNaive):
    """Stale as above, and every call writes into the same output buffer (as a preallocated-out API does)."""

    name = "test-stale-inplace"
    description = "test: one output buffer, wrong after the first call"

    def wrap(self, inner):
        calls, buffer = [], []

        def call():
            calls.append(1)
            res = inner()
            out = res.out * 0.9 if len(calls) > 1 else res.out
            if not buffer:
                buffer.append(out.detach().clone())
            buffer[0].copy_(out)
            res.out = buffer[0]
            return res
        return call


class Jitter(WrapsNaive):
    """Correct, but the output's last bit differs from call to call (like atomics in a backward)."""

    name = "test-jitter"
    description = "test: not bit-reproducible"

    def wrap(self, inner):
        import torch

        def call():
            res = inner()
            flip = torch.rand(res.out.shape) < 0.01
            res.out = torch.where(flip, torch.nextafter(res.out, torch.full_like(res.out, float("inf"))), res.out)
            return res
        return call


class MaskedMath(Backend):
    """fp32 attention with an explicit keep-mask per (sequence of the pack), gradients by autograd; the
    subclasses below each get one classic bug into the mask or the head mapping. Correct as it stands."""

    name = "test-masked-math"
    description = "test: fp32 masked attention (correct)"
    capabilities = Capabilities(dtypes=("fp16", "bf16", "fp32"), varlen=True)

    def kv_head(self, h: int, groups: int, heads_kv: int) -> int:
        return h // groups

    def keep(self, sq: int, sk: int, causal: bool):
        import torch
        i = torch.arange(sq)[:, None]
        j = torch.arange(sk)[None, :]
        return (j <= i + (sk - sq)) if causal else torch.ones(sq, sk, dtype=torch.bool)

    def softmax(self, scores, dtype):
        import torch
        return torch.softmax(scores, -1)

    def segments(self, spec, inputs):
        """(q rows, key rows) of each attention problem inside the tensors."""
        if inputs.varlen:
            cq, ck = inputs.cu_seqlens_q.tolist(), inputs.cu_seqlens_k.tolist()
            return [((a, b), (c, d)) for a, b, c, d in zip(cq[:-1], cq[1:], ck[:-1], ck[1:], strict=True)]
        return None

    def prepare(self, spec, inputs):
        import torch

        from attnbench.backends.base import Outputs

        def attend(q, k, v):  # (S, H, D) fp32 -> (S, H, Dv); one problem
            hq, hk = q.shape[1], k.shape[1]
            outs = []
            for h in range(hq):
                kh = self.kv_head(h, hq // hk, hk)
                s = (q[:, h] @ k[:, kh].T) * spec.softmax_scale
                s = s.masked_fill(~self.keep(q.shape[0], k.shape[0], spec.causal), float("-inf"))
                outs.append(self.softmax(s, inputs.q.dtype).nan_to_num() @ v[:, kh])
            return torch.stack(outs, 1)

        def call():
            q, k, v = (t.detach().float().requires_grad_() for t in (inputs.q, inputs.k, inputs.v))
            segs = self.segments(spec, inputs)
            if segs is None:
                out = torch.stack([attend(q[b], k[b], v[b]) for b in range(q.shape[0])])
            else:
                out = torch.cat([attend(q[a:b], k[c:d], v[c:d]) for (a, b), (c, d) in segs])
            grads = {}
            if spec.pass_ != "fwd":
                dq, dk, dv = torch.autograd.grad(out, (q, k, v), inputs.dout.float())
                grads = {n: g.to(inputs.q.dtype) for n, g in (("dq", dq), ("dk", dk), ("dv", dv))}
            return Outputs(out=out.detach().to(inputs.q.dtype), **grads)
        return Prepared(fn=call)


class DropsTailKeys(MaskedMath):
    """Ignores the keys after the last full block of 64 (a kernel that skips the partial block)."""

    name = "test-drop-tail"

    def keep(self, sq, sk, causal):
        keep = super().keep(sq, sk, causal)
        keep[:, sk // 64 * 64:] = False if sk >= 64 else keep[:, sk // 64 * 64:]
        return keep


class UpperLeftCausal(MaskedMath):
    """Causal mask aligned to the top-left corner instead of the bottom-right (differs when Sq != Sk)."""

    name = "test-upper-left"

    def keep(self, sq, sk, causal):
        import torch
        if not causal:
            return super().keep(sq, sk, causal)
        return torch.arange(sk)[None, :] <= torch.arange(sq)[:, None]


class GqaModulo(MaskedMath):
    """Maps query head h to key/value head h mod Hkv instead of h // group (interleaved, not grouped)."""

    name = "test-gqa-modulo"

    def kv_head(self, h, groups, heads_kv):
        return h % heads_kv


class VarlenLeak(MaskedMath):
    """Packed sequences see each other's keys (the whole pack treated as one sequence)."""

    name = "test-varlen-leak"

    def segments(self, spec, inputs):
        if inputs.varlen:
            return [((0, inputs.q.shape[0]), (0, inputs.k.shape[0]))]
        return None


class NoMaxSubtraction(MaskedMath):
    """Softmax as exp(s) / sum exp(s) with exp in the input dtype, no running maximum: overflows (fp16 at
    logits above 11) only on inputs of large magnitude."""

    name = "test-no-max"

    def softmax(self, scores, dtype):
        e = scores.to(dtype).exp().float()
        return e / e.sum(-1, keepdim=True)


BUG_CLASSES = [DropsTailKeys, UpperLeftCausal, GqaModulo, VarlenLeak]
"""Bugs the aligned power-of-two shapes of a benchmark sweep cannot show (verify's defaults can)."""

WRONG = [_scaled(t, 0.99) for t in ("out", "dq", "dk", "dv")] + [_scaled("dk", 1.01), LseShift, SoftmaxScale, SoftmaxScaleNoLse,
                                                                        BlockBias]

for cls in (Segfault, NullRead, Abort, Hang, Sleep, NativeWait, ContextLoss, Fp32Kernel, *WRONG, Cached, Stale, StaleInPlace, Jitter, MaskedMath,
            *BUG_CLASSES, NoMaxSubtraction):
    registry.register(cls.name, cls)


class Fp8Kernel(Backend):
    """An fp8 kernel done right: exact attention of the values the e4m3 inputs stand for (stored x descale),
    output rounded to bf16, the LSE in fp32. Declared exact, to show that fp8 cases are judged approximately."""

    name = "test-fp8"
    description = "test: fp8 attention over the dequantized inputs (correct)"
    capabilities = Capabilities(dtypes=("fp8", "fp8-head"), varlen=True, backward=False)
    use_descales = True

    def prepare(self, spec, inputs):
        import dataclasses

        import torch

        from attnbench.accuracy.reference import reference_attention
        from attnbench.backends.base import Outputs
        from attnbench.inputs import dequantized

        values = dequantized(inputs) if self.use_descales else dataclasses.replace(
            inputs, q=inputs.q.float(), k=inputs.k.float(), v=inputs.v.float())

        def call():
            ref = reference_attention(spec, values, grads=False, dtype=torch.float32)
            return Outputs(out=ref.out.to(torch.bfloat16), lse=ref.lse)
        return Prepared(fn=call, info={"kernel": "fp32 reference of the fp8 inputs"})


class Fp8NoDescale(Fp8Kernel):
    """The common fp8 bug: the descales are never applied (the stored e4m3 values taken as the values)."""

    name = "test-fp8-no-descale"
    description = "test: fp8 attention that ignores the descales"
    use_descales = False


for cls in (Fp8Kernel, Fp8NoDescale):
    registry.register(cls.name, cls)
