"""Targets: `build(schedule | program | tensors, args, target="cpu" | "cuda") -> Module`, and `autotune`
(codegen.tune: a checked search over schedules whose best `build` then uses)."""

from __future__ import annotations

from .build import build, cache_clear, structural_key
from .cuda.runtime import gpu_available as _probe
from .module import CpuModule, Module
from .profile import profile
from .tune.tuner import TuneResult, autotune

__all__ = ["build", "Module", "CpuModule", "structural_key", "cache_clear", "gpu_available", "autotune",
           "TuneResult", "profile"]


def gpu_available() -> bool:
    """True when the CUDA driver loads and reports a device; never raises (no driver, no device,
    no cuda-python: all mean False). The examples and the test suite's `gpu` marker use it."""
    return _probe()
