"""Shared fixtures. The suite runs against the installed package, or a build
named by ORION_LIBRARY (the sanitizer run of .ci/run uses that)."""

from __future__ import annotations

import gc

import pytest


@pytest.fixture
def no_leaks():
    """Fails a test that leaves surfaces or programs alive in the C core."""
    from orion.runtime import live_programs, live_surfaces

    gc.collect()
    surfaces, programs = live_surfaces(), live_programs()
    yield
    gc.collect()
    assert live_surfaces() == surfaces, "surfaces leaked"
    assert live_programs() == programs, "programs leaked"
