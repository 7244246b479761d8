"""Differential fuzzer of the checked schedule primitives.

Random programs (te elementwise chains, reductions, stencils with offsets, ir.Builder programs
with in-place updates) get random primitive sequences with the checks ON. Every accepted
schedule must compute what the unscheduled program computes (reference interpreter, random
data, two sizes, outputs NaN-poisoned); every refusal must carry a witness that
`verify_witness` confirms. The same refused steps applied with the checks OFF must, at least
once, really change the result (the checker is load-bearing).

`LOOPIR_FUZZ_CASES=N` runs N cases (default 200, deterministic seeds).
"""

from __future__ import annotations

import os
import random
import time
from typing import Any

import numpy as np
import pytest

from loopir import interp, ir, te
from loopir.nodes import Load, Program
from loopir.visit import statements, walk
from schedules import Schedule, ScheduleError
from schedules.primitives import REGISTRY, loop_vars
from schedules.errors import InexactCheckError
from schedules.primitives.compute import compute_at as compute_at_fn
from witness_check import eval_int, verify_witness

CASES = int(os.environ.get("LOOPIR_FUZZ_CASES", "200"))
SIZES = (3, 5)

# ----------------------------------------------------------------------------- random programs


def _unary(r: random.Random, x: Any) -> Any:
    return r.choice([lambda v: v * 2.0, lambda v: v + 1.0, lambda v: te.exp(v * 0.1), lambda v: v * v - 0.5])(x)


def gen_elementwise(r: random.Random) -> Program:
    n = te.var("n")
    two_d = r.random() < 0.6
    shape = (n, n) if two_d else (n,)
    A = te.placeholder(shape, name="A")
    cur, prev = A, None
    for k in range(r.randint(2, 3)):
        c, p = cur, prev
        if two_d:
            tr = r.random() < 0.3
            if p is not None and r.random() < 0.5:
                f = (lambda i, j, c=c, p=p, tr=tr: _unary(r, c[j, i] if tr else c[i, j]) + p[i, j])  # noqa: E731
            else:
                f = (lambda i, j, c=c, tr=tr: _unary(r, c[j, i] if tr else c[i, j]))  # noqa: E731
        else:
            rev = r.random() < 0.3
            f = (lambda i, c=c, rev=rev: _unary(r, c[n - 1 - i] if rev else c[i]))  # noqa: E731
        prev, cur = cur, te.compute(shape, f, name=f"T{k}")
    return _lower(cur, A)


def gen_reduction(r: random.Random) -> Program:
    n = te.var("n")
    A = te.placeholder((n, n), name="A")
    k = te.reduce_axis(n, "k")
    if r.random() < 0.5:
        Bm = te.placeholder((n, n), name="Bm")
        R = te.compute((n, n), lambda i, j: te.sum(A[i, k] * Bm[k, j], axis=k), name="R")
        out = te.compute((n, n), lambda i, j: R[i, j] + 1.0, name="out") if r.random() < 0.5 else R
        return _lower(out, A, Bm)
    red = r.choice([te.sum, te.max])
    R = te.compute((n,), lambda i: red(A[i, k] * 2.0, axis=k), name="R")
    out = te.compute((n, n), lambda i, j: A[i, j] - R[i], name="out")
    return _lower(out, A)


def gen_stencil(r: random.Random) -> Program:
    m = te.var("m")
    if r.random() < 0.5:
        X = te.placeholder((m,), name="X")
        B = te.compute((m,), lambda i: X[i] * 3.0, name="B")
        out = te.compute((m - 2,), lambda j: B[j] + B[j + 1] * 2.0 + B[j + 2], name="out")
    else:
        X = te.placeholder((m, m), name="X")
        B = te.compute((m, m), lambda i, j: X[i, j] + 1.0, name="B")
        out = te.compute((m - 1, m - 1), lambda i, j: B[i, j + 1] * B[i + 1, j], name="out")
    return _lower(out, X)


def gen_builder(r: random.Random) -> Program:
    n = te.var("n")
    kind = r.randrange(4)
    if kind == 0:  # in-place prefix sum
        A = ir.buffer((n,), name="A")
        b = ir.Builder("scan")
        with b.loop("i", 1, n) as i:
            b.store(A, (i,), A[i - 1] + A[i], name="S")
        return b.finish([A])
    if kind == 1:  # A[i,j] = A[i-1,j+1] + A[i,j]: interchange / tiling illegal until skewed
        A = ir.buffer((n, n + 1), name="A")
        b = ir.Builder("wave")
        with b.loop("i", 1, n) as i:
            with b.loop("j", 0, n) as j:
                b.store(A, (i, j), A[i - 1, j + 1] + A[i, j], name="S")
        return b.finish([A])
    if kind == 2:  # producer, in-place update of its input, consumer
        A = ir.buffer((n,), name="A")
        C = ir.buffer((n,), name="C")
        b = ir.Builder("pwc")
        T = b.temp((n,), name="T")
        with b.loop("i", 0, n) as i:
            b.store(T, (i,), A[i] * 2.0, name="P")
        with b.loop("k", 0, n) as k:
            b.store(A, (k,), A[k] + 1.0, name="W")
        with b.loop("j", 0, n) as j:
            b.store(C, (j,), T[j] + A[j], name="X")
        return b.finish([A, C])
    # two sibling nests, the second reading the first reversed or shifted
    A = ir.buffer((n + 1,), name="A")
    B = ir.buffer((n + 1,), name="B")
    C = ir.buffer((n,), name="C")
    b = ir.Builder("sib")
    off = r.choice([0, 1])
    with b.loop("i", 0, n) as i:
        b.store(B, (i,), A[i] + A[i + 1], name="S1")
    with b.loop("j", 0, n) as j:
        b.store(C, (j,), B[j + off] * 2.0 if r.random() < 0.5 else B[n - 1 - j] * 2.0, name="S2")
    return b.finish([A, B, C])


def _lower(out: Any, *inputs: Any) -> Program:
    from loopir.lower import lower

    return lower(out, list(inputs) + [out])


GENERATORS = (gen_elementwise, gen_reduction, gen_stencil, gen_builder)

# ----------------------------------------------------------------------------- running


def _outputs_only(p: Program) -> set[str]:
    read = {n.buffer.name for n in walk(p.body) if isinstance(n, Load)}
    written = {c.store.buffer.name for c in statements(p)}
    return written - read


def run_program(p: Program, size: int, seed: int) -> list[np.ndarray]:
    sizes = {v.name: size for v in p.params}
    rng = np.random.default_rng(seed)
    poison = _outputs_only(p)
    arrays = []
    for b in p.args:
        shape = tuple(eval_int(e, sizes) for e in b.shape)
        a = rng.standard_normal(shape).astype(b.dtype)
        if b.name in poison:
            a[...] = np.nan
        arrays.append(a)
    interp.run(p, *arrays)
    return arrays


def same_result(p0: Program, p1: Program, seed: int) -> bool:
    for size in SIZES:
        for x, y in zip(run_program(p0, size, seed), run_program(p1, size, seed)):
            if not np.array_equal(x, y, equal_nan=True):
                return False
    return True


# ----------------------------------------------------------------------------- random steps


def _random_step(r: random.Random, s: Schedule) -> tuple[str, tuple[Any, ...]] | None:
    p = s.program
    ctxs = statements(p)
    if not ctxs:
        return None
    names = [n for n in REGISTRY if n not in ("bind_reduction", "cache_read", "cache_write")]
    name = r.choice(names)
    st = r.choice(ctxs)
    loops = s.loops(st.store.name)
    temps = [t.name for t in p.temps]
    if name == "split" and loops:
        return name, (r.choice(loops), r.choice([2, 3]))
    if name in ("tile", "collapse", "skew") and len(loops) >= 2:
        k = r.randrange(len(loops) - 1)
        if name == "tile":
            return name, (loops[k], loops[k + 1], r.choice([2, 3]), r.choice([2, 3]))
        if name == "skew":
            return name, (loops[k], loops[k + 1], r.choice([1, 1, 2]))
        return name, (loops[k], loops[k + 1])
    if name == "reorder" and len(loops) >= 2:
        sub = list(loops[r.randrange(len(loops) - 1):])[:3]
        r.shuffle(sub)
        return name, tuple(sub)
    if name in ("unroll", "vectorize", "parallel") and loops:
        return name, (r.choice(loops),)
    if name == "bind" and loops:
        return name, (r.choice(loops), r.choice(["blockIdx.x", "threadIdx.x"]))
    if name == "fuse":
        top = [v for v in loop_vars(p) if any(c.loops and c.loops[0].var is v for c in ctxs)]
        top = list(dict.fromkeys(top))
        if len(top) >= 2:
            k = r.randrange(len(top) - 1)
            return name, (s._wrap_result(top[k]), s._wrap_result(top[k + 1]))
    if name == "compute_inline" and temps:
        return name, (r.choice(temps),)
    if name == "compute_at" and temps:
        t = r.choice(temps)
        readers = [c for c in ctxs if any(isinstance(n, Load) and n.buffer.name == t for n in walk(c.store.value))
                   and c.store.buffer.name != t]
        if readers:
            rl = s.loops(r.choice(readers).store.name)
            if rl:
                return name, (t, r.choice(rl))
    return None


def _candidate(s: Schedule, name: str, args: tuple[Any, ...]) -> Program:
    """The program the refused step would have produced (in the instance spaces of the witness)."""
    rargs = tuple(s._resolve(a, name) for a in args)
    if name == "compute_at":
        return compute_at_fn(s.program, *rargs)[0]
    out = REGISTRY[name].fn(s.program, *rargs)
    return out if isinstance(out, Program) else out[0]


def fuzz(cases: int, seed0: int = 0) -> dict[str, Any]:

    stats = {"cases": cases, "accepted": 0, "refused": 0, "misuse": 0, "steps": 0, "refused_changes_result": 0,
             "inexact": 0, "failures": [],
             "by_primitive": {}}
    t0 = time.perf_counter()
    for case in range(cases):
        try:
            _one_case(case, seed0, stats)
        except Exception as e:  # noqa: BLE001 - every failure is collected and reported at the end
            stats["failures"].append(f"case {case} (seed {seed0 + case}): {type(e).__name__}: {str(e)[:2000]}")
    stats["seconds"] = round(time.perf_counter() - t0, 2)
    return stats


def _one_case(case: int, seed0: int, stats: dict[str, Any]) -> None:
    from test_prim_compute import _verify_inline_witness

    if True:
        r = random.Random(seed0 + case)
        p0 = GENERATORS[case % len(GENERATORS)](r)
        s = Schedule(p0)
        for _ in range(r.randint(1, 4)):
            step = _random_step(r, s)
            if step is None:
                continue
            name, args = step
            stats["steps"] += 1
            bp = stats["by_primitive"].setdefault(name, [0, 0])
            before, original = s.program, s.original
            try:
                s.apply(name, *args)
            except ScheduleError as err:
                stats["refused"] += 1
                bp[1] += 1
                assert s.program is before, f"case {case}: a refused {name} changed the schedule"
                new = _candidate(s, name, args)
                ctx = f"case {case} seed {seed0 + case}: {name}{args} refused:\n{err}"
                try:
                    if name == "compute_inline":
                        tname = s._resolve(args[0], name)
                        _verify_inline_witness(before, new, err, tname)
                    elif getattr(err, "analysed", None) is not None and err.analysed is not original:
                        # a loop-kind violation found in the rebuilt program (after compute_at & co.)
                        verify_witness(err.analysed, err.analysed, err)
                    else:
                        verify_witness(original, new, err)
                except (AssertionError, ValueError, IndexError) as e:
                    raise AssertionError(f"{ctx}\nwitness not verified: {e}") from e
                unchecked = REGISTRY[name].fn(before, *(s._resolve(a, name) for a in args))
                unchecked = unchecked if isinstance(unchecked, Program) else unchecked[0]
                if not same_result(p0, unchecked, seed0 + case):
                    stats["refused_changes_result"] += 1
                continue
            except InexactCheckError as err:
                # a non-affine nest (e.g. after collapse of a symbolic extent): refused as uncheckable,
                # with no witness claimed; the message must say so and name the step
                assert s.program is before, f"case {case}: an uncheckable {name} changed the schedule"
                assert "cannot be checked exactly" in str(err) and name in str(err), str(err)
                stats["inexact"] += 1
                continue
            except (ValueError, TypeError):
                stats["misuse"] += 1
                continue
            stats["accepted"] += 1
            bp[0] += 1
        assert same_result(p0, s.program, seed0 + case), (
            f"case {case} seed {seed0 + case}: the accepted schedule {s.trace} computes something else:\n"
            f"{p0}\n---\n{s.program}")


def test_fuzz_schedules():
    stats = fuzz(CASES)
    failures = stats.pop("failures")
    print("\nfuzz:", stats)
    assert not failures, f"{len(failures)} failing case(s):\n" + "\n\n".join(failures[:5])
    assert stats["accepted"] > 0 and stats["refused"] > 0
    # the checker is load-bearing: some refused step really changes the result when forced
    assert stats["refused_changes_result"] >= 1, stats


@pytest.mark.parametrize("gen", GENERATORS, ids=lambda g: g.__name__)
def test_generators_run(gen):
    p = gen(random.Random(7))
    assert same_result(p, p, 7)
    out = run_program(p, 4, 7)
    assert all(not np.isnan(a).any() for a in out)
