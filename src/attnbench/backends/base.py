"""The backend contract: declare capabilities, answer ``supports``, ``prepare`` a zero-argument closure.

Everything that is not the kernel call (layout changes, packing, masks, compilation, planning) happens
in ``prepare``; the closure it returns is what gets timed. ``supports`` answers from declared
capabilities and cheap checks, without running anything, and gives a human reason when it says no.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from attnbench import features
from attnbench.inputs import AttnInputs
from attnbench.outputs import Outputs, grad_name
from attnbench.spec import AttnSpec

__all__ = ["Backend", "BackendUnavailable", "Capabilities", "Outputs", "Prepared", "SideCall", "autograd_closure"]


class _NoCudaRuntimeNote(logging.Filter):
    """Drops torch's "No CUDA runtime is found, using CUDA_HOME=..." warning. A CUDA build of torch on a host
    without a GPU logs it when a kernel's compile (inductor on CPU, a kernel package) first imports
    ``torch.utils.cpp_extension``, in torch's own format, among a CPU run's progress lines; it says nothing
    about the run (torch warns only where no CUDA device is available, so every run there is a CPU run)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("No CUDA runtime is found")


# here, in the module every process that compiles or runs a kernel imports (the CLI, isolated and compile workers)
logging.getLogger("torch.utils.cpp_extension").addFilter(_NoCudaRuntimeNote())


class BackendUnavailable(RuntimeError):
    """Raised by ``prepare`` when a backend cannot run a case it could not rule out in ``supports``."""


@dataclass(frozen=True, kw_only=True)
class Capabilities:
    """What a backend can run; ``check_capabilities`` turns a mismatch into a reason string."""

    dtypes: tuple[str, ...] = ("fp16", "bf16", "fp32", "fp64")
    """Element types accepted."""
    head_dims: tuple[int, ...] | None = None
    """Allowed head sizes; None = any up to ``max_head_dim``."""
    max_head_dim: int = 512
    """Largest head size (the plain-PyTorch backends take MLA's 576, ``spec.MAX_HEAD_DIM``)."""
    head_dim_multiple: int = 1
    """Head size must be a multiple of this."""
    gqa: bool = True
    """Fewer kv-heads than q-heads."""
    dense: bool = True
    """Fixed-length (batch, seq) inputs."""
    varlen: bool = False
    """Packed sequences of different lengths (cu_seqlens)."""
    causal: bool = True
    """Causal masking (lower-right aligned)."""
    window: bool = False
    """Sliding-window (local) attention."""
    backward: bool = True
    """Gradients (bwd and fwd_bwd passes)."""
    cross_lengths: bool = True
    """Query and key lengths may differ."""
    different_v_dim: bool = True
    """Value head size may differ from the q/k head size."""
    devices: tuple[str, ...] = ("cpu", "cuda")
    """Device types (ROCm reports as cuda)."""
    min_compute_capability: tuple[int, int] | None = None
    """Lowest CUDA compute capability (major, minor); ignored on ROCm and CPU."""
    exact: bool = True
    """False for quantized or sparse kernels: judged by approximate thresholds, not exactness."""
    tile_mask: bool = False
    """Takes a sliding tile attention mask (``spec.sta``)."""
    sinks: bool = False
    """Attention sinks (``features.sinks``), with their gradient when the backend has a backward."""
    softcap: bool = False
    """Logit softcap (``features.softcap``)."""
    alibi: bool = False
    """ALiBi with any slopes (``features.alibi``); a backend limited to some slopes says so in ``extra_reason``."""
    gate: bool = False
    """An output gate (``features.gate``): applied after the call by ``autograd_closure`` unless the backend's
    forward takes ``gate=`` itself (``fused_outputs``)."""
    paged: bool = False
    """Reads a paged KV cache: runs the cases that set a page size (``spec.page_size``); others skip them."""
    shared_prefix: bool = False
    """Takes a shared prefix stored once (``inputs.prefix_k``); the others get each request's keys written out
    (``inputs.expanded``), which is the same attention."""
    tree: bool = False
    """A tree mask of speculative tokens (``spec.tree``)."""
    kv_fp8: bool = False
    """An fp8 KV cache under fp16/bf16 queries (``spec.kv_dtype``)."""


@dataclass(frozen=True)
class SideCall:
    """Work a server does beside the attention every step (writing the step's new tokens into the KV cache),
    timed apart from the attention and recorded in its own info entry: never inside the attention's time."""

    fn: Callable[[], object]
    """Zero-argument call of the work."""
    info: dict = field(default_factory=dict)
    """What it does (how, tokens, bytes)."""


@dataclass(kw_only=True)
class Prepared:
    """A ready-to-time closure and what the backend says about it."""

    fn: Callable[[], Outputs]
    """Zero-argument call of the kernel (the timed region)."""
    info: dict = field(default_factory=dict)
    """What actually runs: kernel, package version, whether preprocessing is timed, etc."""
    finish: Callable[[Outputs], Outputs] | None = None
    """Untimed: a call's outputs in the case's layout, in memory of their own, for kernels that return pieces
    (a mixed batch's prefill and decode parts) or write into buffers reused by every call."""
    side: dict[str, SideCall] = field(default_factory=dict)
    """Work timed apart, by the name its record's info gives it (``append``: the cache write of a serving step)."""
    rewind: Callable[[], None] | None = None
    """Untimed: put back the case's state before a checked call, for a kernel whose timed calls run a state on from
    call to call (a recurrence's decode updating its state in place); every checked call then starts from the
    case's inputs, as the reference does."""

    def checked_call(self) -> Outputs:
        """One call, its outputs as the check reads them (``rewind`` first, ``finish`` applied)."""
        if self.rewind is not None:
            self.rewind()
        out = self.fn()
        return out if self.finish is None else self.finish(out)


def device_type(device: str | torch.device) -> str:
    return torch.device(device).type


def sync(device: str | torch.device) -> None:
    """Wait for the device (before a time is read or a result used); nothing on a CPU."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def check_operator_capabilities(caps: Capabilities, spec, device: str | torch.device) -> str | None:
    """The capabilities that apply to a case of another operator than attention (``attnbench.operators``): the
    device type, the dtype and a backward; the rest of its limits are the backend's ``extra_reason``."""
    dev = device_type(device)
    if dev not in caps.devices:
        return f"runs on {'/'.join(caps.devices)}, not {dev}"
    if spec.dtype not in caps.dtypes:
        return f"{spec.dtype} not supported (takes {', '.join(caps.dtypes)})"
    if spec.pass_ != "fwd" and not caps.backward:
        return "forward only (no backward kernel)"
    return None


def check_capabilities(caps: Capabilities, spec: AttnSpec, device: str | torch.device) -> str | None:
    """The first capability the spec needs that the backend lacks, as a reason; None if all are there."""
    dev = device_type(device)
    checks = [
        (dev not in caps.devices, f"runs on {'/'.join(caps.devices)}, not {dev}"),
        (spec.dtype not in caps.dtypes, f"dtype {spec.dtype} not supported ({'/'.join(caps.dtypes)})"),
        (spec.head_dim > caps.max_head_dim or spec.head_dim_v > caps.max_head_dim,
         f"head size > {caps.max_head_dim}"),
        (caps.head_dims is not None and spec.head_dim not in caps.head_dims,
         f"head size {spec.head_dim} not in {caps.head_dims}"),
        (spec.head_dim % caps.head_dim_multiple != 0, f"head size must be a multiple of {caps.head_dim_multiple}"),
        (spec.gqa and not caps.gqa, "GQA/MQA (kv-heads < q-heads) not supported"),
        (spec.is_varlen and not caps.varlen, "varlen (grouped sequences) not supported"),
        (not spec.is_varlen and not caps.dense, "dense inputs not supported (varlen only)"),
        (spec.causal and not caps.causal, "causal not supported"),
        (spec.has_window and not caps.window, "sliding window not supported"),
        (spec.sta is not None and not caps.tile_mask, "no sliding tile (STA) mask"),
        *((not getattr(caps, f.name), f.refusal) for f in features.active(spec)),
        (spec.page_size is not None and not caps.paged, "no paged KV cache (the case sets a page size)"),
        (spec.tree is not None and not caps.tree, "no tree mask"),
        (spec.kv_dtype is not None and not caps.kv_fp8, "no fp8 KV cache"),
        (spec.pass_ != "fwd" and not caps.backward, "forward only (no backward)"),
        (spec.seqlens_q != spec.seqlens_k and not caps.cross_lengths, "query and key lengths must match"),
        (spec.head_dim_v != spec.head_dim and not caps.different_v_dim, "value head size must equal q/k head size"),
    ]
    for failed, reason in checks:
        if failed:
            return reason
    if dev == "cuda" and caps.min_compute_capability and torch.cuda.is_available() and torch.version.hip is None:
        cc = torch.cuda.get_device_capability(torch.device(device))
        if cc < caps.min_compute_capability:
            need = ".".join(map(str, caps.min_compute_capability))
            return f"needs compute capability >= {need}, device has {cc[0]}.{cc[1]}"
    return None


class Backend:
    """Base class of the adapters. Subclasses set the class attributes and implement ``prepare``."""

    name: str = ""
    """Registry name, e.g. ``sdpa-flash``."""
    operator: str = "attention"
    """The operator whose cases it runs (``attnbench.operators``): attention, recurrence, sparse-mla."""
    description: str = ""
    """One line for ``attnbench backends``."""
    capabilities: Capabilities = Capabilities()
    package: str | None = None
    """Python module the backend imports (None = only torch)."""
    distribution: str | None = None
    """pip distribution name used for the version (default: ``package``)."""
    install: str | None = None
    """How a user installs ``package`` (default: ``pip install <distribution>``)."""
    default_sweep: bool = True
    """Run when no --backends are given (False for study backends such as synthetic sparsity)."""
    compiles_ahead: bool = False
    """``prepare`` compiles code per shape that an on-disk cache keeps (torch.compile's, Triton's), so a worker
    process can compile the case ahead of the main process (``attnbench.precompile``)."""

    option_ranges: dict[str, tuple[float, float]] = {}
    """Accepted range (inclusive) of each numeric constructor option, checked when ``--backend-opt`` is parsed
    (``backends/options.py``); an integer option not listed takes 0..2**31-1."""
    option_types: dict[str, type] = {}
    """Types of options the constructor takes through ``**kwargs`` (its annotations give the others')."""

    device_options: dict[str, str] = {}
    """Devices outside ``capabilities.devices`` that a constructor option named after the device offers the
    backend on (``--backend-opt NAME.cpu=true``), each with why it is off by default."""

    def needs_absent_gpu(self) -> bool:
        """Whether the backend runs on a GPU only and this machine has none (torch sees no CUDA device): what
        would install it cannot help here."""
        return "cpu" not in self.capabilities.devices and not torch.cuda.is_available()

    def device_hint(self, device: str | torch.device) -> str | None:
        """How to have the backend on ``device``'s type where an option offers it (``device_options``), else None."""
        dev = device_type(device)
        if dev in self.capabilities.devices or dev not in self.device_options:
            return None
        return f"on {dev} with --backend-opt {self.name}.{dev}=true ({self.device_options[dev]})"

    build_limits: tuple[str, ...] = ()
    """Start of the errors a trimmed build of the package raises for what it was built without (a head dim,
    FP8): such a case is ``unsupported`` by the installed build, not a kernel ``error``."""

    def build_limit(self, exc: BaseException) -> str | None:
        """The installed build's own words when ``exc`` says the build lacks what the case needs, else None."""
        text = str(exc).strip()
        return text.splitlines()[0] if any(text.startswith(p) for p in self.build_limits) else None

    def unavailable_reason(self) -> str | None:
        """Why the backend cannot run at all here (missing package, too old torch); None if it can."""
        if self.package is None:
            return None
        return _import_reason(self.package)

    def install_hint(self) -> str:
        """One line saying how to get the backend's package."""
        if self.package is None:
            return "comes with PyTorch"
        return self.install or f"pip install {self.distribution or self.package}"

    def version(self) -> str | None:
        """Version of the backend's package (torch's for torch-only backends)."""
        if self.package is None:
            return torch.__version__
        found = _dist_version(self.distribution or self.package)
        if found is None and _import_reason(self.package) is None:  # source builds, renamed wheels
            found = getattr(importlib.import_module(self.package), "__version__", None)
        return found

    def supports(self, spec: AttnSpec, device: str | torch.device) -> str | None:
        """None if the case can run; otherwise the reason it cannot."""
        theirs = getattr(spec, "operator", "attention")
        if theirs != self.operator:
            return f"runs {self.operator} cases, not {theirs}"
        check = check_capabilities if theirs == "attention" else check_operator_capabilities
        return self.unavailable_reason() or check(self.capabilities, spec, device) or self.extra_reason(spec, device)

    def describe(self, device: str | torch.device) -> str:
        """The ``attnbench backends`` line: the description, naming the kernel that runs on ``device``."""
        return self.description

    def extra_reason(self, spec: AttnSpec, device: str | torch.device) -> str | None:
        """Backend-specific limits that the capabilities cannot express."""
        return None

    def prepare_case(self, spec: AttnSpec, inputs: AttnInputs) -> Prepared:
        """``prepare`` on the inputs this backend takes: a shared prefix written out into every request's keys
        for a backend that takes none (``Capabilities.shared_prefix``)."""
        if getattr(inputs, "prefix_k", None) is not None and not self.capabilities.shared_prefix:
            inputs = inputs.expanded()
        return self.prepare(spec, inputs)

    def prepare(self, spec: AttnSpec, inputs: AttnInputs) -> Prepared:  # pragma: no cover - abstract
        raise NotImplementedError

    def judged_exactly(self, spec: AttnSpec) -> bool:
        """Whether ``spec``'s result is held to exactness: not for approximate backends (``exact=False``)
        nor for fp8 inputs, which every kernel rounds by design (the verdict and the plausibility ceiling)."""
        return self.capabilities.exact and not getattr(spec, "quantized", False)  # other operators: no fp8 inputs

    def base_info(self) -> dict:
        return {"backend": self.name, "package": self.package or "torch", "version": self.version(),
                "exact": self.capabilities.exact}


@functools.cache
def _import_reason(module: str) -> str | None:
    try:
        importlib.import_module(module)
    except Exception as exc:  # ImportError, or a broken install raising anything on import
        return f"{module} not importable: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}".rstrip(": ")
    return None


@functools.cache
def _dist_version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


ForwardFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], "torch.Tensor | tuple[torch.Tensor, torch.Tensor]"]
PreFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


def autograd_closure(spec: AttnSpec, inputs: AttnInputs, forward: ForwardFn,
                     pre: PreFn | None = None, fused_outputs: frozenset[str] = frozenset()) -> Callable[[], Outputs]:
    """Build the timed closure of ``spec.pass_`` from a differentiable ``forward(q, k, v)``.

    ``forward`` returns ``out`` or ``(out, lse)``. ``pre`` (layout changes, GQA expansion, packing)
    runs once here, outside the timed region; gradients are still taken with respect to the
    original (bshd or packed) inputs. fwd runs under no_grad; bwd runs the forward once here
    (untimed) and times only ``autograd.grad``; fwd_bwd times both.

    The inputs of the case's features (``features.inputs_of``) reach ``forward`` as keywords by name
    (``forward(q, k, v, sinks=...)``), except those of output features (a gate), which are applied to the
    returned ``out`` here, inside the timed region, as a model applies them after its attention call — unless
    the backend names the feature in ``fused_outputs`` (its forward takes it). Every input with a gradient gets
    one, named ``d`` + its name.
    """
    pre = pre or (lambda q, k, v: (q, k, v))
    after = [f for f in features.active(spec) if f.stage == "output" and f.name not in fused_outputs]
    applied = {item.name for f in after for item in f.inputs}

    def call(args, named: dict) -> Outputs:
        res = _as_outputs(forward(*args, **{k: v for k, v in named.items() if k not in applied}))
        for feature in after:
            res.out = feature.output(res.out, *(named[item.name] for item in feature.inputs))
        return res

    names = [item.name for item in features.inputs_of(spec)]
    if spec.pass_ == "fwd":
        with torch.no_grad():
            args = pre(inputs.q, inputs.k, inputs.v)
        named = {name: inputs.extra[name] for name in names}

        def run_fwd() -> Outputs:
            with torch.no_grad():
                return call(args, named)
        return run_fwd

    leaves = inputs.leaves(requires_grad=True)
    named = {name: leaves.extra[name] for name in names}
    grad_inputs = {"q": leaves.q, "k": leaves.k, "v": leaves.v,
                   **{name: named[name] for name in features.grad_names(spec)}}
    wrt, dout = tuple(grad_inputs.values()), inputs.dout
    args = pre(leaves.q, leaves.k, leaves.v)

    def backward(res: Outputs) -> Outputs:
        # retain_graph: the nodes built by ``pre`` (and, for bwd, the forward) are shared by every iteration.
        grads = torch.autograd.grad(res.out, wrt, dout, retain_graph=True)
        return Outputs(out=res.out.detach(), lse=res.lse,
                       **{grad_name(name): g for name, g in zip(grad_inputs, grads, strict=True)})

    if spec.pass_ == "bwd":
        first = call(args, named)
        return lambda: backward(first)
    return lambda: backward(call(args, named))


def _as_outputs(result) -> Outputs:
    if isinstance(result, Outputs):
        return result
    if isinstance(result, tuple):
        out, lse = result[0], result[1]
        return Outputs(out=out, lse=None if lse is None else lse.detach())
    return Outputs(out=result)


def expand_kv_heads(t: torch.Tensor, groups: int, head_dim: int = -2) -> torch.Tensor:
    """Repeat each kv head ``groups`` times along ``head_dim`` (for kernels without native GQA)."""
    return t if groups == 1 else t.repeat_interleave(groups, dim=head_dim)
