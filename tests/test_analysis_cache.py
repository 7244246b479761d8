"""The cheaper checks (issue 14) decide exactly as a fresh analysis does.

`loopir.poly_model.ANALYSIS_CACHE = False` turns off every shortcut of the legality checks (parsed texts
and schedules kept per program, the schedule tree given to isl's dataflow analysis, dependences derived
for cache_write's intermediate programs, the memory-based pre-test of concurrent loops, remembered
accepts). These tests run the same schedules both ways and compare every decision, every witness and
every resulting program: the composed fuzz sequences (tests/test_fuzz_compose.py's programs and steps,
refusals included), the GEMM recipes and auto_schedule on the seed workloads; and they compare the
shortcuts' relations with the fresh ones directly. The checks of a step on the nests it changes alone
(schedules/nest_scope.py) are compared with the whole-program checks in tests/test_nest_scope.py.
"""

from __future__ import annotations

import dataclasses
import os
import random
from typing import Any
from unittest import mock

import pytest
import test_fuzz as f1
import test_fuzz_compose as fc

from loopir import deps_shortcuts, poly, poly_model, te
from loopir.nodes import Program
from schedules import Schedule, auto_schedule
from loopir.visit import statements
from schedules.primitives import REGISTRY
from schedules.primitives.cache_write import _rebase, _replace_stmts
from schedules.recipes.gemm_cpu import schedule_gemm_cpu
from schedules.recipes.gemm_cuda import schedule_gemm_cuda
from schedules.schedule import LoopHandle

CASES = int(os.environ.get("LOOPIR_DIFF_CASES", "60"))


def with_flag(module: Any, name: str, value: Any) -> Any:
    """A caller `(fn, *args, **kw) -> fn(*args, **kw)` that runs fn with `module.name` set to `value` (restored
    after, also on an exception)."""
    def call(fn: Any, *args: Any, **kw: Any) -> Any:
        with mock.patch.object(module, name, value):
            return fn(*args, **kw)
    return call


_fresh = with_flag(poly_model, "ANALYSIS_CACHE", False)  # every shortcut off (and nothing remembered from a cached run)


def _outcome(s: Schedule, name: str, args: tuple[Any, ...]) -> tuple[Any, ...]:
    try:
        s.apply(name, *args)
    except Exception as e:  # noqa: BLE001 - the outcome compared is the exception itself
        fields = tuple(getattr(e, k, None) for k in ("kind", "buffer", "source", "sink", "params", "element"))
        return ("refused", type(e).__name__, str(e), fields)
    return ("accepted", str(s.program), s.trace[-1])


def _translate(x: Any, src: Schedule, dst: Schedule) -> Any:
    if isinstance(x, LoopHandle):
        return dst.loop(src._ref(x.var))
    if isinstance(x, (list, tuple)):
        return type(x)(_translate(y, src, dst) for y in x)
    return x


def replay_both(mod: Any, other: Any, compare: Any) -> tuple[int, int]:
    """The fuzz sequences of `mod` (its GENERATORS' programs, its random steps) applied twice, as usual and inside
    `other` (e.g. `_fresh`); `compare(a, b, where)` gets each step's two outcomes and returns False to end that
    sequence. Returns (steps tried, steps refused)."""
    tried = refused = 0
    for case in range(CASES):
        gen = mod.GENERATORS[case % len(mod.GENERATORS)]
        # two equal programs from one seed, distinct objects: nothing is shared between the two runs
        p_one, p_two = gen(random.Random(1000 + case)), gen(random.Random(1000 + case))
        assert str(p_one) == str(p_two)
        one, two, r = Schedule(p_one), other(Schedule, p_two), random.Random(7 * case + 1)
        for _ in range(24):
            if len(one.trace) >= 6:
                break
            step = mod._random_step(r, one)
            if step is None:
                continue
            name, args = step
            tried += 1
            twin = _translate(args, one, two)  # before the step: loop references (i#2) are of this program
            a = _outcome(one, name, args)
            b = other(_outcome, two, name, twin)
            if not compare(a, b, f"case {case}: steps {one.trace} then {name}{args}"):
                break
            refused += a[0] == "refused"
    return tried, refused


@pytest.mark.parametrize("mod", [fc, f1], ids=["fuzz_compose", "fuzz"])
def test_fuzz_same_decisions_and_witnesses(mod):
    def same(a: Any, b: Any, where: str) -> bool:
        assert a == b, f"{where}:\n cached: {a}\n fresh:  {b}"
        return True

    tried, refused = replay_both(mod, _fresh, same)
    assert tried >= CASES and refused >= CASES // 10, (tried, refused)  # both kinds of decision were compared


def _gemm(n: Any) -> list[Any]:
    A, B = te.placeholder((n, n), name="A"), te.placeholder((n, n), name="B")
    bias = te.placeholder((n,), name="bias")
    k = te.reduce_axis(n, "k")
    C = te.compute((n, n), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    return [te.compute((n, n), lambda i, j: te.maximum(C[i, j] + bias[j], 0.0), name="D")]


def _softmax(m: Any, n: Any) -> list[Any]:
    x = te.placeholder((m, n), name="x")
    k1, k2 = te.reduce_axis(n, "k"), te.reduce_axis(n, "k")
    mx = te.compute((m,), lambda i: te.max(x[i, k1], axis=k1), name="row_max")
    sm = te.compute((m,), lambda i: te.sum(te.exp(x[i, k2] - mx[i]), axis=k2), name="row_sum")
    return [te.compute((m, n), lambda i, j: te.exp(x[i, j] - mx[i]) / sm[i], name="y")]


def _layernorm(m: Any, n: Any) -> list[Any]:
    x, w, b = te.placeholder((m, n), name="x"), te.placeholder((n,), name="w"), te.placeholder((n,), name="b")
    k1, k2 = te.reduce_axis(n, "k"), te.reduce_axis(n, "k")
    fn = te.cast("float32", n)
    mean = te.compute((m,), lambda i: te.sum(x[i, k1] / fn, axis=k1), name="mean")
    var = te.compute((m,), lambda i: te.sum((x[i, k2] - mean[i]) * (x[i, k2] - mean[i]) / fn, axis=k2), name="var")
    return [te.compute((m, n), lambda i, j: (x[i, j] - mean[i]) * te.rsqrt(var[i] + 1e-5) * w[j] + b[j], name="y")]


def _gelu(n: Any) -> list[Any]:
    x = te.placeholder((n,), name="x")
    cube = te.compute((n,), lambda i: x[i] * x[i] * x[i], name="cube")
    inner = te.compute((n,), lambda i: 0.79788456 * (x[i] + 0.044715 * cube[i]), name="inner")
    return [te.compute((n,), lambda i: 0.5 * x[i] * (1.0 + te.tanh(inner[i])), name="y")]


def _result(s: Any) -> tuple[str, Any]:
    prog = s if isinstance(s, Program) else s.program
    return str(prog), getattr(s, "trace", None)


WORKLOADS = [
    ("gemm 200", lambda: _gemm(200)), ("gemm n", lambda: _gemm(te.var("n"))),
    ("softmax", lambda: _softmax(64, 1000)), ("layernorm", lambda: _layernorm(te.var("m"), 768)),
    ("gelu", lambda: _gelu(1 << 20)),
]


@pytest.mark.parametrize("target", ["cuda", "cpu"])
@pytest.mark.parametrize("name,make", WORKLOADS, ids=[w[0] for w in WORKLOADS])
def test_auto_schedule_same_both_ways(name, make, target):
    a = _result(auto_schedule(make(), target=target))
    b = _result(_fresh(auto_schedule, make(), target=target))
    assert a == b


@pytest.mark.parametrize("recipe,kw", [(schedule_gemm_cuda, {}), (schedule_gemm_cuda, {"strided": True}),
                                       (schedule_gemm_cpu, {})])
@pytest.mark.parametrize("n", [96, 1000])
def test_gemm_recipes_same_both_ways(recipe, kw, n):
    def run() -> tuple[Any, ...]:
        s = Schedule(_gemm(n))
        plan = recipe(s, **kw)
        return str(s.program), s.trace, plan.explain()

    assert run() == _fresh(run)


def _equal(a: Any, b: Any) -> bool:
    return a.is_equal(b)


def test_tree_and_map_dependences_equal_on_fuzz_programs():
    for case in range(len(fc.GENERATORS) * 3):
        p = fc.GENERATORS[case % len(fc.GENERATORS)](random.Random(case))
        poly._DEP_CACHE.clear()
        fast = poly.dependences(p)
        poly._DEP_CACHE.clear()
        fresh = _fresh(poly.dependences, p)
        poly._DEP_CACHE.clear()
        for (k, x), (_, y) in zip(fast.by_kind(), fresh.by_kind()):
            assert _equal(x, y), (case, k, str(p))
        assert _equal(fast.domain, fresh.domain) and fast.notes == fresh.notes
        # the memory-based pairs hold every dependence, both ways round
        mem = deps_shortcuts.memory_dependences(p)
        assert fast.all.is_subset(mem) and fast.all.reverse().is_subset(mem)


def test_derived_dependences_equal_fresh_ones():
    # cache_write's intermediate program: the update statement re-based onto its loops after a schedule
    checked = 0
    for n in (37, te.var("n")):
        s = Schedule(_gemm(n))
        i, j, k = s.loops("C")
        io, ii = s.split(i, 8)
        jo, ji = s.split(j, 16)
        s.reorder(io, jo, ii, ji)
        prog = s.program
        new = {id(c.store): _rebase(c.store, c.loops) for c in statements(prog) if c.store.buffer.name == "C"}
        rebased = dataclasses.replace(prog, body=_replace_stmts(prog.body, new))
        derived = deps_shortcuts.derived_dependences(s.deps, prog, rebased)
        assert derived is not None
        fresh = _fresh(poly.dependences, rebased)
        for (kind, x), (_, y) in zip(derived.by_kind(), fresh.by_kind()):
            assert _equal(x, y), kind
        assert _equal(derived.domain, fresh.domain)
        checked += 1
    assert checked == 2


def test_derived_dependences_refused_where_not_exact():
    # an instance run twice (compute_at recomputing a producer) is no renaming: nothing is derived
    n = te.var("n")
    A = te.placeholder((n,), name="A")
    B = te.compute((n,), lambda i: A[i] * 2.0, name="B")
    C = te.compute((n - 1,), lambda i: B[i] + B[i + 1], name="C")
    s = Schedule(C)
    s.compute_at("B", s.loops("C")[0])
    prog = s.program
    assert deps_shortcuts.derived_dependences(poly.dependences(prog), prog, prog) is not None  # identity
    assert deps_shortcuts.derived_dependences(s.deps, s.original, prog) is None or s.original is prog


def test_fresh_switch_restores_and_shortcuts_never_refuse():
    assert poly_model.ANALYSIS_CACHE is True
    s = _fresh(Schedule, _gemm(64))
    assert poly_model.ANALYSIS_CACHE is True
    # concurrent_free only ever accepts: with a carried dependence it answers False, the exact check refuses
    n = te.var("n")
    A = te.placeholder((n,), name="A")
    k = te.reduce_axis(n, "k")
    S = te.compute((1,), lambda i: te.sum(A[k], axis=k), name="S")
    t = Schedule(S)
    loops = t.loops("S")
    with pytest.raises(Exception) as e:
        t.parallel(loops[-1])
    assert "carr" in str(e.value) or "depend" in str(e.value)
    assert not deps_shortcuts.concurrent_free(REGISTRY["parallel"].fn(t.program, loops[-1].var))
    assert s.program is not None
