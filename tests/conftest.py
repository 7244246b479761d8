"""Shared pytest setup: the repository root on sys.path, no tuning database, and skipping `gpu` tests without a
device."""

from __future__ import annotations

import functools
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # lets the tests run from a plain checkout, without `pip install -e .`
    sys.path.insert(0, ROOT)
# builds in the tests never take a configuration from a developer's tuning database (~/.cache/loopir/tuning);
# the tests of that path name their database explicitly (build(..., tuned=path))
os.environ.setdefault("LOOPIR_TUNING_DB", "off")


@functools.cache
def cuda_device_available() -> bool:
    """True when the CUDA driver loads and reports at least one device (codegen's own probe)."""
    from codegen import gpu_available

    return gpu_available()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not any(item.get_closest_marker("gpu") for item in items) or cuda_device_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (none usable here)")
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)
