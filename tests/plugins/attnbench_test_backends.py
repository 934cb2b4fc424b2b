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


class Sleep(Backend):
    """A well-behaved backend whose call takes $ATTNBENCH_TEST_SLEEP_S seconds (deterministic pacing)."""

    name = "test-sleep"
    description = "test: sleeps, then computes naive attention (so it passes accuracy checks)"
    capabilities = Capabilities()

    def prepare(self, spec, inputs):
        from attnbench.backends.naive import NaiveBackend
        inner = NaiveBackend().prepare(spec, inputs).fn

        def call():
            time.sleep(SLEEP_S)
            return inner()
        return Prepared(fn=call)


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


WRONG = [_scaled(t, 0.99) for t in ("out", "dq", "dk", "dv")] + [_scaled("dk", 1.01), LseShift, SoftmaxScale, SoftmaxScaleNoLse,
                                                                        BlockBias]

for cls in (Segfault, NullRead, Abort, Hang, Sleep, ContextLoss, Fp32Kernel, *WRONG):
    registry.register(cls.name, cls)
