"""What attnbench refuses of fla-core 0.6.0's chunk backward on Hopper is what fla itself refuses
(``linear/fla.py``): read from fla's own flags and backends, here stood in for by stubs with fla's names."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from attnbench.linear import fla
from attnbench.linear.spec import RecurrenceSpec


def _stub_fla(monkeypatch, *, hopper=True, triton_ok=False, tilelang=True, nvcc=True, dispatch=True, enabled=True):
    """fla 0.6.0's names that the routing reads, with the given answers."""
    class CommonTileLangBackend:
        def is_enabled(self):
            return enabled

    modules = {
        "fla": types.ModuleType("fla"), "fla.ops": types.ModuleType("fla.ops"),
        "fla.ops.common": types.ModuleType("fla.ops.common"),
        "fla.ops.common.backends": types.ModuleType("fla.ops.common.backends"),
        "fla.ops.common.backends.tilelang": types.SimpleNamespace(CommonTileLangBackend=CommonTileLangBackend),
        "fla.backends": types.SimpleNamespace(_DISPATCH_DISABLED=not dispatch),
        "fla.utils": types.SimpleNamespace(
            IS_NVIDIA_HOPPER=hopper, TRITON_ABOVE_3_4_0=True, TRITON_ABOVE_3_7_1=triton_ok,
            IS_NVIDIA_SM100=False, IS_NVIDIA_SM120=False, has_usable_nvcc=lambda: nvcc,
            find_spec_cached=lambda name: object() if tilelang else None),
    }
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setitem(sys.modules, "triton", types.SimpleNamespace(__version__="3.6.0"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)


def spec(kind: str, dtype: str = "bf16", **extra) -> RecurrenceSpec:
    return RecurrenceSpec(kind=kind, batch=1, seqlens=(64,), heads_qk=2, heads_v=4, d_k=64, d_v=64, dtype=dtype,
                          pass_="fwd_bwd", **extra)


@pytest.mark.parametrize("case, tilelang_ok", [
    (spec("gdn"), True),  # TileLang takes gdn at any dtype
    (spec("linear"), False),  # simple GLA keeps its states in fp32: TileLang declines a bf16 case
    (spec("linear", "fp32"), True),
    (spec("mamba2"), False),
    (spec("mamba2", "fp32"), True),
])
def test_fla_routes_the_gated_backward_to_tilelang_as_fla_would(monkeypatch, case, tilelang_ok):
    _stub_fla(monkeypatch)
    why = fla.supports(case)
    assert (why is None) == tilelang_ok, why
    if why is not None:
        assert why.startswith("fla's gated chunk backward refuses Triton 3.6.0 on Hopper") and "fp32" in why


@pytest.mark.parametrize("stub, needle", [
    ({"tilelang": False}, "tilelang is not installed"),
    ({"nvcc": False}, "finds no nvcc"),
    ({"dispatch": False}, "FLA_DISABLE_BACKEND_DISPATCH=1"),
    ({"enabled": False}, "FLA_TILELANG=0"),
])
def test_without_its_tilelang_route_fla_refuses_the_gdn_backward_and_says_why(monkeypatch, stub, needle):
    _stub_fla(monkeypatch, **stub)
    why = fla.supports(spec("gdn"))
    assert why is not None and needle in why


@pytest.mark.parametrize("stub", [{"hopper": False}, {"triton_ok": True}])
def test_off_hopper_or_with_triton_3_7_1_nothing_is_refused(monkeypatch, stub):
    _stub_fla(monkeypatch, tilelang=False, **stub)
    assert fla.supports(spec("gdn")) is None


def test_kda_and_an_ungated_linear_never_reach_the_refused_kernel(monkeypatch):
    _stub_fla(monkeypatch, tilelang=False)
    assert fla.supports(spec("kda")) is None
    assert fla.supports(spec("linear", gated=False)) is None
    assert fla.supports(spec("gdn").replace(pass_="fwd")) is None
