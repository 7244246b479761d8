"""Schedules: checked loop transformations of a loopir program.

`Schedule(tensor | [tensors] | program, check=True)` holds the current program; primitives are
methods (`split`, `tile`, `reorder`, `collapse`, `skew`, `unroll`, `vectorize`, `parallel`,
`bind`, and those other modules register). An illegal step raises `ScheduleError` with a
witness. `check=False` skips every dependence check and is UNSAFE.
"""

from __future__ import annotations

from .errors import InexactCheckError, ScheduleError
from .primitives import primitive
from .schedule import LoopHandle, Schedule

__all__ = [
    "Schedule",
    "ScheduleError",
    "InexactCheckError",
    "LoopHandle",
    "primitive",
    "auto_schedule",
    "plan_fusion",
    "FusionPlan",
]

# The fusion planner and auto_schedule pull in the cost model (and, on a GPU machine, the driver):
# load them on first use so that `import schedules` stays cheap.
_LAZY = {"auto_schedule": ".auto", "plan_fusion": ".fusion", "FusionPlan": ".fusion"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module 'schedules' has no attribute {name!r}")
