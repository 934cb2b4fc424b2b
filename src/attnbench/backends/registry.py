"""Name -> backend. Built-in adapters are listed here explicitly; third-party packages add theirs
through the ``attnbench.backends`` entry point group (the entry point names a Backend subclass or a
zero-argument factory returning a Backend instance).

``ATTNBENCH_PLUGINS=pkg.mod1,pkg.mod2`` names modules imported (once) the first time backends are
listed or looked up; they call ``register()`` at import. It reaches every process attnbench starts,
isolated workers included, without installing a package (handy for private or test backends).
A module that fails to import is logged and skipped, like a broken entry point."""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from attnbench.backends.base import Backend

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "attnbench.backends"
PLUGINS_ENV = "ATTNBENCH_PLUGINS"

# name -> "module:Class"; modules are imported only when the backend is asked for.
BUILTIN: dict[str, str] = {
    "naive": "attnbench.backends.naive:NaiveBackend",
    "naive-scale-scores": "attnbench.backends.naive:NaiveScaleScoresBackend",
    "sdpa-math": "attnbench.backends.sdpa:SdpaMath",
    "sdpa-flash": "attnbench.backends.sdpa:SdpaFlash",
    "sdpa-efficient": "attnbench.backends.sdpa:SdpaEfficient",
    "sdpa-cudnn": "attnbench.backends.sdpa:SdpaCudnn",
    "sdpa-varlen": "attnbench.backends.sdpa_varlen:SdpaVarlen",
    "flex": "attnbench.backends.flex:FlexBackend",
    "flex-sparse": "attnbench.backends.flex_sparse:FlexSparse",
    "fa2": "attnbench.backends.fa2:Fa2",
    "fa2-qkvpacked": "attnbench.backends.fa2:Fa2QKVPacked",
    "fa2-kvpacked": "attnbench.backends.fa2:Fa2KVPacked",
    "fa2-varlen": "attnbench.backends.fa2:Fa2Varlen",
    "fa2-varlen-qkvpacked": "attnbench.backends.fa2:Fa2VarlenQKVPacked",
    "fa3": "attnbench.backends.fa3:Fa3",
    "fa3-varlen": "attnbench.backends.fa3:Fa3Varlen",
    "fa2-kvcache": "attnbench.backends.kvcache:Fa2KVCache",
    "fa2-paged": "attnbench.backends.kvcache:Fa2Paged",
    "fa3-kvcache": "attnbench.backends.kvcache:Fa3KVCache",
    "fa3-paged": "attnbench.backends.kvcache:Fa3Paged",
    "fa4": "attnbench.backends.fa4:Fa4",
    "fa4-varlen": "attnbench.backends.fa4:Fa4Varlen",
    "fa4-paged": "attnbench.backends.fa4:Fa4Paged",
    "xformers": "attnbench.backends.xformers:Xformers",
    "sage": "attnbench.backends.sage:Sage",
    "sage-varlen": "attnbench.backends.sage:SageVarlen",
    "sage2-fp8": "attnbench.backends.sage:Sage2Fp8",
    "sage2-fp8-sm90": "attnbench.backends.sage:Sage2Fp8Sm90",
    "sage2-fp16": "attnbench.backends.sage:Sage2Fp16",
    "sparge": "attnbench.backends.sparge:Sparge",
    "sparge-cdf": "attnbench.backends.sparge:SpargeCdf",
    "sparge-fp16": "attnbench.backends.sparge:SpargeFp16",
    "sparge-fp16-cdf": "attnbench.backends.sparge:SpargeFp16Cdf",
    "flashinfer": "attnbench.backends.flashinfer:FlashInfer",
    "flashinfer-decode": "attnbench.backends.flashinfer:FlashInferDecode",
    "flashinfer-paged": "attnbench.backends.flashinfer:FlashInferPaged",
    "flashinfer-pod": "attnbench.backends.flashinfer:FlashInferPOD",
    "flashinfer-persistent": "attnbench.backends.flashinfer:FlashInferPersistent",
    "flashinfer-cascade": "attnbench.backends.flashinfer:FlashInferCascade",
    "flashmla": "attnbench.backends.mla:FlashMLA",
    "fa3-mla": "attnbench.backends.mla:Fa3MLA",
    "flashinfer-mla": "attnbench.backends.mla:FlashInferMLA",
    "sta": "attnbench.backends.sta:Sta",
    "sta-triton": "attnbench.backends.sta:StaTriton",
    # recurrence cases (attnbench.operators)
    "torch-recurrent": "attnbench.linear.backends:TorchRecurrent",
    "torch-chunked": "attnbench.linear.backends:TorchChunked",
    "fla-chunk": "attnbench.linear.backends:FlaChunk",
    "fla-recurrent": "attnbench.linear.backends:FlaRecurrent",
    "flashinfer-gdn": "attnbench.linear.backends:FlashInferGdn",
    "flashinfer-gdn-decode": "attnbench.linear.backends:FlashInferGdnDecode",
    "flashqla": "attnbench.linear.backends:FlashQla",
    "cudnn-kda": "attnbench.linear.backends:CudnnKda",
    # index-selected MLA cases
    "sparse-torch": "attnbench.sparse.backends:SparseTorch",
    "flashmla-sparse": "attnbench.sparse.backends:FlashMlaSparse",
    "flashmla-sparse-fp8": "attnbench.sparse.backends:FlashMlaSparseFp8",
    "flex-sparse-mla": "attnbench.sparse.backends:FlexSparse",
    "flashinfer-sparse-mla": "attnbench.sparse.backends:FlashInferSparseMla",
    "indexer-torch": "attnbench.sparse.indexer_op:IndexerTorch",
    "indexer-fla": "attnbench.sparse.indexer_op:IndexerFla",
}

_extra: dict[str, object] = {}
_plugins_loaded: set[str] = set()


def load_plugins() -> None:
    """Import the modules named in ``$ATTNBENCH_PLUGINS`` (comma separated) not imported yet."""
    for module in os.environ.get(PLUGINS_ENV, "").split(","):
        module = module.strip()
        if not module or module in _plugins_loaded:
            continue
        _plugins_loaded.add(module)
        try:
            importlib.import_module(module)
        except Exception as exc:  # a broken plug-in must not break the other backends
            log.warning("%s: cannot import %s: %s: %s", PLUGINS_ENV, module, type(exc).__name__, exc)


def register(name: str, factory) -> None:
    """Register a backend class or factory under ``name`` (overrides a built-in of that name)."""
    _extra[name] = factory


def registered(name: str):
    """The class or factory registered under ``name`` (None: none, the built-in or entry point serves it)."""
    return _extra.get(name)


def unregister(name: str) -> None:
    """Forget what was registered under ``name`` (a built-in of that name serves it again)."""
    _extra.pop(name, None)


def _entry_points() -> dict[str, object]:
    try:
        eps = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
    except TypeError:  # Python 3.10 with an old importlib.metadata
        eps = importlib.metadata.entry_points().get(ENTRY_POINT_GROUP, [])
    return {ep.name: ep for ep in eps}


def names() -> list[str]:
    """Every known backend name: built-ins, registered and entry points (in that order)."""
    load_plugins()
    return list(dict.fromkeys([*BUILTIN, *_extra, *_entry_points()]))


def get(name: str, options: dict | None = None) -> Backend:
    """Instantiate backend ``name`` with its constructor ``options`` (``backends.options.resolve`` checks them);
    ValueError naming the known backends if it does not exist."""
    from attnbench.backends.base import Backend  # imports torch, which listing the names does not need

    load_plugins()
    if name in _extra:
        target = _extra[name]
    elif name in BUILTIN:
        module, _, attr = BUILTIN[name].partition(":")
        target = getattr(importlib.import_module(module), attr)
    elif name in (eps := _entry_points()):
        target = eps[name].load()
    else:
        raise ValueError(f"unknown backend {name!r}; known: {', '.join(names())}")
    backend = target(**(options or {}))
    if not isinstance(backend, Backend):
        raise TypeError(f"backend {name!r} is a {type(backend).__name__}, not an attnbench Backend")
    if not backend.name:
        backend.name = name
    return backend


def of_operator(operator: str) -> list[str]:
    """Every known backend that runs ``operator``'s cases (``attnbench.operators``), wherever it can run."""
    out = []
    for name in names():
        try:
            if get(name).operator == operator:
                out.append(name)
        except Exception as exc:  # a broken third-party plug-in must not break the listing
            log.warning("backend %s failed to load: %s", name, exc)
    return out


def available(device, default_only: bool = False, options: dict | None = None,
              operator: str | None = "attention") -> list[str]:
    """Names of the backends that can run on ``device`` here (package importable, device type allowed), each
    built with its ``options`` (name -> constructor options); with ``default_only``, only those that take part in
    a sweep with no --backends given; those of ``operator``'s cases (``attnbench.operators``; None: every one)."""
    out = []
    for name in names():
        try:
            backend = get(name, (options or {}).get(name))
        except Exception as exc:  # a broken third-party plug-in must not break the listing
            log.warning("backend %s failed to load: %s", name, exc)
            continue
        from attnbench.backends.base import device_type
        if operator is not None and backend.operator != operator:
            continue
        if backend.unavailable_reason() is None and device_type(device) in backend.capabilities.devices:
            if backend.default_sweep or not default_only:
                out.append(name)
    return out
