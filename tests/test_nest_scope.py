"""Checking a step on the nests it changes alone (schedules/nest_scope.py) decides as the whole-program check
does: the same accepted programs, the same refusals with the same witnesses; it may only accept a step that the
whole program's over-approximated analysis could not decide (InexactCheckError because another nest is not
affine). Compared on the composed fuzz sequences and the seed workloads' auto schedules, both ways."""

from __future__ import annotations

from typing import Any

import pytest
import test_analysis_cache as ac
import test_fuzz as f1
import test_fuzz_compose as fc

from loopir.nodes import Program, Seq
from loopir import te
from schedules import Schedule, auto_schedule, nest_scope
from schedules.errors import ScheduleError

CASES = ac.CASES


_whole = ac.with_flag(nest_scope, "ENABLED", False)  # every check on the whole program


@pytest.mark.parametrize("mod", [fc, f1], ids=["fuzz_compose", "fuzz"])
def test_nest_checks_decide_as_the_whole_program(mod):
    local_only = 0

    def allowed(a: Any, b: Any, where: str) -> bool:
        nonlocal local_only
        if a == b:
            return True
        # the only difference allowed: the nest alone is exact where the whole program was not
        assert a[0] == "accepted" and b[0] == "refused" and b[1] == "InexactCheckError", \
            f"{where}:\n nest:  {a}\n whole: {b}"
        local_only += 1
        return False  # the two schedules differ from here on

    tried, refused = ac.replay_both(mod, _whole, allowed)
    assert tried >= CASES and refused >= CASES // 10, (tried, refused, local_only)


@pytest.mark.parametrize("name, make, target", [(n, m, t) for n, m in ac.WORKLOADS for t in ("cpu", "cuda")])
def test_auto_schedule_same_both_ways(name, make, target):
    fast = auto_schedule(make(), target)
    whole = _whole(auto_schedule, make(), target)
    assert str(fast.program) == str(whole.program) and fast.trace == whole.trace


def _two_nests() -> Program:
    n = te.var("n")
    x = te.placeholder((n, 8), name="x")
    a = te.compute((n, 8), lambda i, j: x[i, j] * 2.0, name="a")
    b = te.compute((n, 8), lambda i, j: a[i, j] + a[i, (j + 1) % 8], name="b")
    return Schedule([b]).program


def test_a_refusal_in_one_nest_has_the_whole_programs_witness():
    p = _two_nests()
    assert isinstance(p.body, Seq) and len(p.body.body) == 2
    s, w = Schedule(p), _whole(Schedule, p)
    s.fuse(s.loops("a")[0], s.loops("b")[0])  # b reads row i of a: legal; one nest now
    _whole(w.fuse, w.loops("a")[0], w.loops("b")[0])
    # fusing a's and b's loops j (a step in that one nest) reads a[i, j + 1] before it is written: refused with
    # the same witness both ways
    with pytest.raises(ScheduleError) as e1:
        s.fuse(s.loops("a")[1], s.loops("b")[1])
    with pytest.raises(ScheduleError) as e2:
        _whole(w.fuse, w.loops("a")[1], w.loops("b")[1])
    assert str(e1.value) == str(e2.value) and "a[" in str(e1.value)


def test_a_base_shared_with_a_changed_run_is_dropped():
    p = _two_nests()
    bases = nest_scope.NestBases()
    k = nest_scope.nest_program(p, 1, 2, bases.uses)
    first = bases.base(k)
    assert bases.base(k) is first  # kept while nothing changes the nest
    both = nest_scope.nest_program(p, 0, 2, bases.uses)
    bases.after(both, k, rebase=True)  # e.g. compute_inline of a into b: b keeps its statement names
    again = bases.base(k)
    assert again is not first and again[0] is k
