"""Schedules: checked loop transformations of a loopir program.

`Schedule(tensor | [tensors] | program, check=True)` holds the current program; primitives are
methods (`split`, `tile`, `reorder`, `collapse`, `skew`, `unroll`, `vectorize`, `parallel`,
`bind`, and those other modules register). An illegal step raises `ScheduleError` with a
witness. `check=False` skips every dependence check and is UNSAFE. `auto_schedule` and the
fusion planner (`plan_fusion`) schedule whole programs; `schedules.recipes` holds the GEMM recipes.
"""

from __future__ import annotations

from loopir.errors import (
    ArgumentError,
    ArgumentTypeError,
    LoopirError,
    NotFoundError,
    NotNestedError,
)

from .auto import auto_schedule
from .errors import InexactCheckError, ScheduleError
from .fusion import FusionPlan, plan_fusion
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
    # the error tree (loopir.errors) a schedule's user catches
    "LoopirError",
    "ArgumentError",
    "ArgumentTypeError",
    "NotFoundError",
    "NotNestedError",
]
