"""Targets: `build(schedule | program | tensors, args, target="cpu" | "cuda") -> Module`."""

from __future__ import annotations

from .build import build, cache_clear, structural_key
from .module import CpuModule, Module

__all__ = ["build", "Module", "CpuModule", "structural_key", "cache_clear"]
