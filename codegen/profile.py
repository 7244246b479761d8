"""Predicted against measured, per kernel: the fusion plan's report with each kernel's time on the device.

    s = auto_schedule([y], "cuda")
    mod = build(s, [x, y], target="cuda")
    print(profile(s, mod, x_gpu, y_gpu))   # explain(), with "measured: 85.1 us (predicted 47.8 us; 1.78x ...)"

The kernels are timed one at a time (`kernel_times`: each replayed alone between CUDA events, medians); a plan
kernel's time is that of the compiled kernels that run its stages (`FusionPlan.measured_by_group`). A module built
with symbolic sizes times the variant the call dispatches to, whose kernels run the same stages.
"""

from __future__ import annotations

from typing import Any

from loopir.errors import ArgumentError, ArgumentTypeError

__all__ = ["profile", "kernel_stages"]


def profile(schedule: Any, module: Any, *arrays: Any, warmup: int = 3, repeat: int = 20) -> str:
    """`schedule.plan.explain()` with each kernel's measured time on `arrays` (a CUDA module's call arguments)."""
    plan = getattr(schedule, "plan", None)
    if plan is None or not hasattr(plan, "measured_by_group"):
        raise ArgumentError("profile: the schedule has no fusion plan to report against (schedules made by "
                            "auto_schedule have one; a hand schedule has none)")
    if not hasattr(module, "kernel_times"):
        raise ArgumentTypeError(f"profile: times kernels on a GPU; {type(module).__name__} (target "
                                f"{getattr(module, 'target', '?')!r}) has no kernel_times: build with target='cuda'")
    times = module.kernel_times(*arrays, warmup=warmup, repeat=repeat)
    return plan.explain(plan.measured_by_group(kernel_stages(module), {k: ms * 1e-3 for k, ms in times.items()}))


def kernel_stages(module: Any) -> dict[str, tuple[str, ...]]:
    """The statements each compiled kernel runs, by kernel name, in the module the last call ran (a symbolic
    module's variant for that call's sizes, codegen.specialize)."""
    return {k.name: tuple(k.stmt_names) for k in getattr(module.last_ran, "gen", module.gen).kernels}
