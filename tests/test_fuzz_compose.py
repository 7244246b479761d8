"""Soundness fuzzer that COMPOSES schedule steps (issue 17).

Random programs (stencils with and without padding, padded convolutions, reductions with halos, time
loops, in-place scans, sibling nests of different extents) get random sequences of 2-6 steps drawn
from every primitive (parallel, bind, vectorize, compute_at, compute_inline, cache_read of padded
inputs, cache_write, bind_reduction, split, tile, reorder, fuse, collapse, skew, unroll), checks ON:

* every accepted sequence runs in the bounds-checking interpreter (`loopir.interp.run`) and must
  compute what the unscheduled program computes, on random data with outputs NaN-poisoned, at two
  sizes, in every order its concurrent loops allow that `witness_check.concurrent_orders` tries
  (all forward, all reversed, each one alone reversed);
* every refusal's witness is verified (`verify_witness`; for cache_read / cache_write, whose
  refusal is a lost value rather than a reordering, the accesses and the original order);
* zero mismatches, zero out-of-bounds accesses, zero internal errors (anything but a ScheduleError,
  an InexactCheckError or a ValueError / TypeError naming a misuse).

`LOOPIR_FUZZ_CASES=N` runs N sequences (default 300, < 60 s); the table of cases per primitive is printed.
"""

from __future__ import annotations

import os
import random
import time
from typing import Any

import islpy as isl
import numpy as np

from loopir import interp, ir, te
from loopir.nodes import Binary, For, Load, Program
from loopir.visit import statements, walk
from schedules import Schedule, ScheduleError
from schedules.errors import InexactCheckError
from schedules.primitives import REGISTRY, loop_vars
from schedules.primitives.compute import compute_at as compute_at_fn
from witness_check import _accesses, _run_trace, _store, concurrent_orders, eval_int, verify_witness

CASES = int(os.environ.get("LOOPIR_FUZZ_CASES", "300"))
SIZES = (5, 9)

# ----------------------------------------------------------------------------- random programs


def _lower(out: Any, *inputs: Any) -> Program:
    from loopir.lower import lower

    return lower(out, list(inputs) + [out])


def gen_padded_stencil(r: random.Random) -> Program:
    n = te.var("n")
    A = te.placeholder((n,), name="A")
    lo, hi = r.choice([(1, 1), (2, 0), (0, 2), (2, 2)])
    Ap = te.compute((n + lo + hi,), lambda i: te.where((i >= lo) & (i < n + lo), A[i - lo], 0.0), name="Ap")
    w = lo + hi
    B = te.compute((n,), lambda i: Ap[i] * 0.5 + Ap[i + w] * 2.0 + (Ap[i + 1] if w >= 1 else 0.0), name="B")
    if r.random() < 0.4:
        C = te.compute((n,), lambda i: B[i] * B[i] - 1.0, name="C")
        return _lower(C, A)
    return _lower(B, A)


def gen_padded_conv(r: random.Random) -> Program:
    c, h = r.choice([1, 2]), te.var("h")
    X = te.placeholder((c, h, 6), name="X")
    Wt = te.placeholder((c, 3, 3), name="Wt")
    Xp = te.compute((c, h + 2, 8), lambda a, y, x: te.where(
        (y >= 1) & (y < h + 1) & (x >= 1) & (x < 7), X[a, y - 1, x - 1], 0.0), name="Xp")
    ry, rx = te.reduce_axis(3, "ry"), te.reduce_axis(3, "rx")
    if r.random() < 0.5:
        rc = te.reduce_axis(c, "rc")
        out = te.compute((2, h, 6), lambda k, y, x: te.sum(Xp[rc, y + ry, x + rx] * Wt[rc, ry, rx] * (k + 1.0),
                                                           axis=[rc, ry, rx]), name="O")
    else:
        out = te.compute((c, h, 6), lambda a, y, x: te.sum(Xp[a, y + ry, x + rx] * Wt[a, ry, rx], axis=[ry, rx]),
                         name="O")
    return _lower(out, X, Wt)


def gen_halo_reduction(r: random.Random) -> Program:
    m = te.var("m")
    X = te.placeholder((m + 1, 4), name="X")
    k = te.reduce_axis(4, "k")
    red = r.choice([te.sum, te.max])
    R = te.compute((m + 1,), lambda i: red(X[i, k] * 2.0, axis=k), name="R")
    C = te.compute((m,), lambda j: R[j] + R[j + 1] * 0.5, name="C")
    return _lower(C, X)


def gen_matmul(r: random.Random) -> Program:
    n = te.var("n")
    A, B = te.placeholder((n, 4), name="A"), te.placeholder((4, n), name="B")
    k = te.reduce_axis(4, "k")
    M = te.compute((n, n), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="M")
    if r.random() < 0.5:
        return _lower(te.compute((n, n), lambda i, j: M[i, j] * 0.5 + 1.0, name="E"), A, B)
    return _lower(M, A, B)


def gen_time_stencil(r: random.Random) -> Program:
    n = te.var("n")
    A, B = ir.buffer((n,), name="A"), ir.buffer((n,), name="B")
    b = ir.Builder("jacobi1d")
    with b.loop("t", 0, 3):
        if r.random() < 0.5:  # in place (seidel-like): distances (0, 1) and (1, -1)
            with b.loop("i", 1, n - 1) as i:
                b.store(A, (i,), (A[i - 1] + A[i] + A[i + 1]) * 0.3, name="S")
        else:
            with b.loop("i", 1, n - 1) as i:
                b.store(B, (i,), (A[i - 1] + A[i] + A[i + 1]) * 0.3, name="S1")
            with b.loop("i2", 1, n - 1) as i:
                b.store(A, (i,), B[i] * 1.5, name="S2")
    return b.finish([A, B])


def gen_wave(r: random.Random) -> Program:
    n = te.var("n")
    A = ir.buffer((n + 1, n + 1), name="A")
    b = ir.Builder("wave")
    di, dj = r.choice([(1, 1), (1, -1), (1, 0), (0, 1)])
    with b.loop("i", 1, n) as i:
        with b.loop("j", 1, n) as j:
            b.store(A, (i, j), A[i - di, j - dj] * 0.5 + A[i, j], name="S")
    return b.finish([A])


def gen_siblings(r: random.Random) -> Program:
    n = te.var("n")
    A, B, X = ir.buffer((n + 1,), name="A"), ir.buffer((n + 1,), name="B"), ir.buffer((n + 1,), name="X")
    b = ir.Builder("sib")
    lo = r.choice([0, 1])
    with b.loop("i", lo, n) as i:  # extents n - lo and n + 1 - off
        b.store(A, (i,), X[i] * 2.0, name="S1")
    off = r.choice([0, 1])
    read = r.choice([0, -1, 1])
    with b.loop("j", off, n + 1) as j:
        b.store(B, (j,), X[j] + (A[j + read] if read <= 0 and off + read >= lo else A[j] if off >= lo else 1.0),
                name="S2")
    return b.finish([X, A, B])


def gen_triangular(r: random.Random) -> Program:
    n = te.var("n")
    T = ir.buffer((n + 1, n + 1), name="T")
    b = ir.Builder("tri")
    with b.loop("ii", 0, n) as ii:
        i = n - 1 - ii
        with b.loop("j", n - ii, n) as j:
            b.store(T, (i, j), te.maximum(T[i, j - 1], T[i + 1, j]) + T[i + 1, j - 1] * 0.5, name="S")
    return b.finish([T])


GENERATORS = (gen_padded_stencil, gen_padded_conv, gen_halo_reduction, gen_matmul, gen_time_stencil, gen_wave,
              gen_siblings, gen_triangular)

# ----------------------------------------------------------------------------- running


def _sizes(p: Program, size: int) -> dict[str, int]:
    return {v.name: size for v in p.params}


def _inputs(p: Program, size: int, seed: int) -> list[np.ndarray]:
    sizes = _sizes(p, size)
    rng = np.random.default_rng(seed)
    read = {n.buffer.name for n in walk(p.body) if isinstance(n, Load)}
    written = {c.store.buffer.name for c in statements(p)}
    arrays = []
    for b in p.args:
        a = (rng.standard_normal(tuple(eval_int(e, sizes) for e in b.shape)) + 0.1).astype(b.dtype)
        if b.name in written - read:
            a[...] = np.nan  # an output: what the program does not write shows
        arrays.append(a)
    return arrays


def _run(p: Program, arrays: list[np.ndarray]) -> list[np.ndarray]:
    out = [a.copy() for a in arrays]
    interp.run(p, *out)  # IndexError on any out-of-bounds load or store
    return out


def _mismatch(p0: Program, p1: Program, seed: int) -> str | None:
    for size in SIZES:
        arrays = _inputs(p0, size, seed)
        want = _run(p0, arrays)
        for k, variant in enumerate(concurrent_orders(p1)):
            got = _run(variant, arrays)
            for b, x, y in zip(p0.args, want, got):
                # concurrent reductions (bind_reduction) reassociate: a tolerance, NaN where NaN
                if not np.allclose(x, y, rtol=1e-4, atol=1e-5, equal_nan=True):
                    return f"buffer {b.name} differs at size {size} in concurrent order #{k}"
    return None


# ----------------------------------------------------------------------------- random steps

_ALL = ("split", "tile", "reorder", "fuse", "collapse", "skew", "unroll", "vectorize", "parallel", "bind",
        "compute_at", "compute_inline", "cache_read", "cache_write", "bind_reduction")
_FAVOURED = ("compute_at", "compute_at", "cache_read", "cache_read", "parallel", "fuse", "split", "tile", "reorder")


def _random_step(r: random.Random, s: Schedule) -> tuple[str, tuple[Any, ...]] | None:
    p = s.program
    ctxs = statements(p)
    if not ctxs:
        return None
    name = r.choice(_ALL + _FAVOURED)
    st = r.choice(ctxs)
    loops = s.loops(st.store.name)
    temps = [t.name for t in p.temps]
    if name == "split" and loops:
        return name, (r.choice(loops), r.choice([2, 3, 4]))
    if name in ("tile", "collapse", "skew") and len(loops) >= 2:
        k = r.randrange(len(loops) - 1)
        if name == "tile":
            return name, (loops[k], loops[k + 1], r.choice([2, 3]), r.choice([2, 4]))
        if name == "skew":
            return name, (loops[k], loops[k + 1], r.choice([1, 1, 2, -1]))
        return name, (loops[k], loops[k + 1])
    if name == "reorder" and len(loops) >= 2:
        sub = list(loops[r.randrange(len(loops) - 1):])[:3]
        r.shuffle(sub)
        return name, tuple(sub)
    if name in ("unroll", "vectorize", "parallel") and loops:
        return name, (r.choice(loops),)
    if name == "bind" and loops:
        return name, (r.choice(loops), r.choice(["blockIdx.x", "threadIdx.x", "threadIdx.y"]))
    if name == "bind_reduction" and loops:
        # mostly the innermost loop of a reduction statement (C = C op e), sometimes any loop (a misuse)
        reds = [c for c in ctxs if c.loops and isinstance(c.store.value, Binary)
                and Load(c.store.buffer, c.store.indices) in (c.store.value.a, c.store.value.b)]
        if reds and r.random() < 0.8:
            loops = s.loops(r.choice(reds).store.name)
            return name, (loops[-1], "threadIdx.x", r.choice([None, 2, 4]))
        return name, (r.choice(loops), "threadIdx.x", r.choice([None, 2, 4]))
    if name == "fuse":
        top = list(dict.fromkeys(v for v in loop_vars(p) if any(c.loops and c.loops[0].var is v for c in ctxs)))
        if len(top) >= 2:
            k = r.randrange(len(top) - 1)
            return name, (s._wrap_result(top[k]), s._wrap_result(top[k + 1]))
        inner = [c.loops[1].var for c in ctxs if len(c.loops) >= 2]  # siblings inside a time loop
        if len(inner) >= 2:
            a, b = sorted(r.sample(list(dict.fromkeys(inner)), 2) if len(set(inner)) >= 2 else inner[:2],
                          key=lambda v: loop_vars(p).index(v))
            return name, (s._wrap_result(a), s._wrap_result(b))
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
    if name == "cache_read" and loops:
        reads = sorted({n.buffer.name for n in walk(st.store.value)
                        if isinstance(n, Load) and n.buffer.scope == "global"})
        if reads:
            return name, (r.choice(reads), r.choice(["shared", "local"]), r.choice(loops))
    if name == "cache_write" and loops and st.store.buffer.scope == "global":
        return name, (st.store.buffer.name, r.choice(["local", "shared"]), r.choice(loops))
    return None


def _candidate(s: Schedule, name: str, args: tuple[Any, ...]) -> Program:
    """The program the refused step would have produced (in the instance spaces of the witness)."""
    rargs = tuple(s._resolve(a, name) for a in args)
    if name == "compute_at":
        return compute_at_fn(s.program, *rargs)[0]
    out = REGISTRY[name].fn(s.program, *rargs)
    return out if isinstance(out, Program) else out[0]


def _verify_lost_value(original: Program, err: ScheduleError) -> None:
    """A cache_read / cache_write refusal: the source writes the element the sink reads (flow), and the
    original program runs the source first (the copy would hold a stale value)."""
    assert err.kind == "flow", err.kind
    (sn, si), (kn, ki) = err.source, err.sink
    snk = _store(original, kn)
    env_k = {**err.params, **ki}
    if " before loop " in sn:  # a value from before the nest (live-in): the sink reads the buffer
        assert any(b == err.buffer for b, _ in _accesses(snk, "read")), f"{kn} does not read {err.buffer}"
        return
    src = _store(original, sn)
    env_s = {**err.params, **si}
    w = [tuple(eval_int(i, env_s) for i in ix) for b, ix in _accesses(src, "write") if b == err.buffer]
    rd = [tuple(eval_int(i, env_k) for i in ix) for b, ix in _accesses(snk, "read") if b == err.buffer]
    assert set(w) & set(rd), f"{sn}{si} does not write an element {kn}{ki} reads"
    trace = _run_trace(original, {k: int(v) for k, v in err.params.items()})
    ks = (sn, tuple(si[v.name] for v in src.iters))
    kk = (kn, tuple(ki[v.name] for v in snk.iters))
    assert ks in trace and kk in trace and trace.index(ks) < trace.index(kk)


_INTERNAL_WORDS = ("not a max or min of affine pieces", "internal error", "isl_")


def _one_case(case: int, seed0: int, stats: dict[str, Any]) -> None:
    r = random.Random(seed0 + case)
    p0 = GENERATORS[case % len(GENERATORS)](r)
    s = Schedule(p0)
    target = r.randint(2, 6)
    tried = 0
    for _ in range(4 * target):
        if tried >= target:
            break
        step = _random_step(r, s)
        if step is None:
            continue
        tried += 1
        name, args = step
        row = stats["by_primitive"].setdefault(name, {"tried": 0, "accepted": 0, "refused": 0, "inexact": 0,
                                                      "misuse": 0})
        row["tried"] += 1
        before, original = s.program, s.original
        where = f"case {case} seed {seed0 + case}: steps {s.trace} then {name}{args}"
        try:
            s.apply(name, *args)
        except ScheduleError as err:
            row["refused"] += 1
            assert s.program is before, f"{where}: a refused step changed the schedule"
            try:
                if err.analysed is not None and err.analysed is not original:
                    verify_witness(err.analysed, err.analysed, err)
                elif name in ("cache_read", "cache_write"):
                    _verify_lost_value(original, err)
                elif name == "compute_inline":
                    from test_prim_compute import _verify_inline_witness

                    _verify_inline_witness(before, _candidate(s, name, args), err, s._resolve(args[0], name))
                else:
                    verify_witness(original, _candidate(s, name, args), err)
            except (AssertionError, ValueError, KeyError, IndexError) as e:
                raise AssertionError(f"{where}: refused, witness NOT verified: {e}\n{err}") from e
            continue
        except InexactCheckError as err:
            assert s.program is before and name in str(err), where
            row["inexact"] += 1
            continue
        except (ValueError, TypeError) as err:
            text = str(err)
            if any(w in text for w in _INTERNAL_WORDS) or isinstance(err, isl.Error):
                raise AssertionError(f"{where}: internal error {type(err).__name__}: {text}") from err
            assert s.program is before, f"{where}: a misuse changed the schedule"
            row["misuse"] += 1
            continue
        row["accepted"] += 1
        stats["accepted_steps"] += 1
    stats["sequences"] += 1
    if len(s.trace) >= 1:
        stats["accepted_sequences"] += 1
    try:
        bad = _mismatch(p0, s.program, seed0 + case)
    except IndexError as e:
        raise AssertionError(f"case {case} seed {seed0 + case}: OUT OF BOUNDS after {s.trace}: {e}\n{s}") from e
    assert bad is None, f"case {case} seed {seed0 + case}: MISMATCH after {s.trace}: {bad}\n{p0}\n---\n{s}"


def fuzz(cases: int, seed0: int = 1700) -> dict[str, Any]:
    stats: dict[str, Any] = {"sequences": 0, "accepted_sequences": 0, "accepted_steps": 0, "failures": [],
                             "by_primitive": {}}
    t0 = time.perf_counter()
    for case in range(cases):
        try:
            _one_case(case, seed0, stats)
        except Exception as e:  # noqa: BLE001 - every failure is collected, classified and reported
            stats["failures"].append(f"case {case} seed {seed0 + case}: {type(e).__name__}: {str(e)[:3000]}")
    stats["seconds"] = round(time.perf_counter() - t0, 1)
    return stats


def table(stats: dict[str, Any]) -> str:
    cols = ("tried", "accepted", "refused", "inexact", "misuse")
    lines = [f"{'primitive':<16}" + "".join(f"{c:>10}" for c in cols)]
    tot = dict.fromkeys(cols, 0)
    for name in sorted(stats["by_primitive"]):
        row = stats["by_primitive"][name]
        lines.append(f"{name:<16}" + "".join(f"{row[c]:>10}" for c in cols))
        for c in cols:
            tot[c] += row[c]
    lines.append(f"{'total':<16}" + "".join(f"{tot[c]:>10}" for c in cols))
    lines.append(f"sequences {stats['sequences']} (with an accepted step: {stats['accepted_sequences']}), "
                 f"failures {len(stats['failures'])}, {stats['seconds']} s")
    return "\n".join(lines)


def test_fuzz_composed_steps():
    stats = fuzz(CASES)
    print("\ncomposed-steps fuzzer\n" + table(stats))
    failures = stats["failures"]
    assert not failures, f"{len(failures)} failing sequence(s):\n" + "\n\n".join(failures[:5])
    by = stats["by_primitive"]
    assert sum(r["accepted"] for r in by.values()) > 0 and sum(r["refused"] for r in by.values()) > 0
    # every primitive was exercised
    assert set(_ALL) <= set(by), sorted(set(_ALL) - set(by))


def test_generators_run_in_bounds():
    for k, gen in enumerate(GENERATORS):
        p = gen(random.Random(k))
        for size in SIZES:
            out = _run(p, _inputs(p, size, k))
            written = {c.store.buffer.name for c in statements(p)}
            # in bounds (no IndexError above), and every written buffer gets values (edges may stay poisoned)
            assert all(not np.isnan(a).all() for b, a in zip(p.args, out) if b.name in written), gen.__name__
            assert any(isinstance(n, For) for n in walk(p.body))
