"""Fixtures of the unit tests."""

from __future__ import annotations

import fake_kernels as fk
import pytest


@pytest.fixture
def fake(monkeypatch):
    """``fake(family)`` installs that family's stand-in package (fake_kernels.py) for one test."""
    yield lambda family: fk.install(monkeypatch, family)
    fk.clear_caches()


@pytest.fixture
def plugin():
    """``plugin(name, cls)`` registers a backend class under ``name`` for one test."""
    from attnbench.backends import registry
    names = []

    def register(name, cls):
        registry.register(name, cls)
        names.append(name)
    yield register
    for name in names:
        registry.unregister(name)
