"""Predicted against measured per kernel (issue 19): `FusionPlan.measured_by_group` maps the compiled kernels'
times onto the plan's kernels, `explain(measured)` prints them beside the predictions, `codegen.profile` times a
CUDA module and reports (on a GPU)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from codegen import build, gpu_available, profile
from codegen.profile import kernel_stages
from loopir import blocks, te
from loopir.errors import ArgumentError, ArgumentTypeError
from schedules import Schedule, auto_schedule


def _mlp():
    w = blocks.BLOCKS["mlp"](C=64, dtype="float32")
    return w, auto_schedule(list(w.outputs), "cuda")


def test_each_plan_kernel_gets_the_time_of_the_compiled_kernels_running_its_stages():
    w, s = _mlp()
    mod = build(s, list(w.args), target="cuda")  # NVRTC: the compiled kernels and their statements
    stages = kernel_stages(mod)
    assert len(stages) >= len(s.plan.groups)
    times = {k: 1e-6 * (j + 1) for j, k in enumerate(stages)}  # distinct, so a wrong sum shows
    got = s.plan.measured_by_group(stages, times)
    assert set(got) == {g.name for g in s.plan.groups}
    for g in s.plan.groups:
        want = sum(t for k, t in times.items() if set(stages[k]) & set(g.stage_names))
        assert got[g.name] == pytest.approx(want) and want > 0
    text = s.plan.explain(got)
    lines = [x for x in text.splitlines() if x.strip().startswith("measured:")]
    assert len(lines) == len(s.plan.groups)
    for g, line in zip(s.plan.groups, lines):
        assert f"{got[g.name] * 1e6:.1f} us" in line and "predicted" in line and "x the prediction" in line
    assert re.search(r"^measured time: [\d.]+ us, each kernel alone", text, re.M)


def test_a_kernel_no_compiled_kernel_ran_says_so():
    _, s = _mlp()
    text = s.plan.explain({})
    assert text.count("measured: no compiled kernel ran its stages") == len(s.plan.groups)
    assert "measured time" not in text  # no total of nothing
    assert "measured" not in s.plan.explain()  # without times: the plan as before


def test_profile_refuses_a_cpu_module_and_a_schedule_without_a_plan():
    x = te.placeholder((16,), name="x")
    y = te.compute((16,), lambda i: x[i] * 2.0, name="y")
    s = auto_schedule([y], "cpu")
    with pytest.raises(ArgumentTypeError, match="profile: times kernels on a GPU.*target='cuda'"):
        profile(s, build(s, [x, y], target="cpu"), np.ones(16, np.float32), np.zeros(16, np.float32))
    with pytest.raises(ArgumentError, match="profile: the schedule has no fusion plan"):
        profile(Schedule([y]), build(Schedule([y]), [x, y], target="cpu"))


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs a GPU")
def test_profile_puts_measured_times_beside_the_predictions_on_the_gpu():
    w, s = _mlp()
    mod = build(s, list(w.args), target="cuda")
    sizes = {"B": 2, "T": 48}
    ins = blocks.inputs(w, sizes, rng=3)
    out = np.full(w.shape_of(w.outputs[0], sizes), np.nan, np.float32)
    text = profile(s, mod, *ins, out, warmup=1, repeat=3)
    lines = [x for x in text.splitlines() if x.strip().startswith("measured:")]
    assert len(lines) == len(s.plan.groups) and not any("no compiled kernel" in x for x in lines), text
    assert all(float(re.search(r"measured: ([\d.]+) (us|ms)", x).group(1)) > 0 for x in lines)
    want = w.reference(*ins)[0]
    assert np.abs(out - want).max() / np.abs(want).max() < 1e-4  # kernel_times ran the whole call too
