"""Picklable reference functions for tests/test_tuning.py (spawned tuning workers import them by name)."""

from __future__ import annotations

import numpy as np


def softmax_off_by_one(x: np.ndarray) -> tuple[np.ndarray]:
    """A deliberately wrong reference: softmax + 1 (every candidate must then be refused as wrong)."""
    x64 = x.astype(np.float64)
    e = np.exp(x64 - x64.max(axis=1, keepdims=True))
    return (e / e.sum(axis=1, keepdims=True) + 1.0,)


def softmax_reference(x: np.ndarray) -> tuple[np.ndarray]:
    x64 = x.astype(np.float64)
    e = np.exp(x64 - x64.max(axis=1, keepdims=True))
    return (e / e.sum(axis=1, keepdims=True),)
