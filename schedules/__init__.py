"""Schedules: checked loop transformations of a loopir program.

`Schedule(tensor | [tensors] | program, check=True)` holds the current program; primitives are
methods (`split`, `tile`, `reorder`, `collapse`, `skew`, `unroll`, `vectorize`, `parallel`,
`bind`, and those other modules register). An illegal step raises `ScheduleError` with a
witness. `check=False` skips every dependence check and is UNSAFE.
"""

from __future__ import annotations

from .errors import ScheduleError
from .primitives import primitive
from .schedule import LoopHandle, Schedule

__all__ = ["Schedule", "ScheduleError", "LoopHandle", "primitive"]


def __getattr__(name: str):  # auto_schedule lives in schedules/auto.py (helper F), loaded on demand
    if name == "auto_schedule":
        from .auto import auto_schedule

        return auto_schedule
    raise AttributeError(f"module 'schedules' has no attribute {name!r}")
