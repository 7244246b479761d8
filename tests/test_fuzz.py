"""Differential fuzzer of the checked schedule primitives.

Random programs (te elementwise chains, reductions, stencils with offsets, ir.Builder programs
with in-place updates) get random primitive sequences with the checks ON. Every accepted
schedule must compute what the unscheduled program computes (reference interpreter, random
data, two sizes, outputs NaN-poisoned); every refusal must carry a witness that
`verify_witness` confirms. The same refused steps applied with the checks OFF must, at least
once, really change the result (the checker is load-bearing).

GPU-bound schedules (`fuzz_gpu`): random te programs at constant sizes are mapped to the GPU by one
strategy — `bind` (split / tile, then blockIdx / threadIdx), `auto` (auto_schedule(target="cuda"):
fusion into one kernel per group), `cache_read` (block tiles staged in shared memory, copied
cooperatively, barriers from the primitive), `bind_reduction` (cross-thread reductions). Every
accepted case is lowered (`codegen.passes.lower(p, "cuda")`), must be one the CUDA renderer accepts,
and is run by the interpreter's GPU mode with adversarial thread orders ("reversed", "forward" and a
seed); it must compute what the unscheduled program computes (float tolerance: reductions are
reassociated). A mismatch there is a race the barrier pass must fix.

`LOOPIR_FUZZ_CASES=N` runs N cases (default 200, deterministic seeds), and N // 4 GPU-bound cases.
"""

from __future__ import annotations

import os
import random
import time
from typing import Any

import numpy as np
import pytest

from loopir import interp, ir, te
from loopir.interp_gpu import BarrierDivergenceError
from loopir.nodes import Load, Program
from loopir.visit import statements, walk
from schedules import Schedule, ScheduleError
from schedules.primitives import REGISTRY, loop_vars
from schedules.errors import InexactCheckError
from schedules.primitives.compute import compute_at as compute_at_fn
from witness_check import eval_int, verify_witness

CASES = int(os.environ.get("LOOPIR_FUZZ_CASES", "200"))
GPU_CASES = max(8, CASES // 4)
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


# the registered primitives this fuzz draws from, in a fixed order: a primitive registered later (a new module)
# must not shift the random sequence of the recorded cases; one the fuzz has no arguments for returns no step
FUZZED = ("fuse", "compute_inline", "compute_at", "sink_guard", "online_softmax", "unroll", "vectorize", "parallel",
          "bind", "split", "reorder", "tile", "collapse", "skew", "rfactor", "cache_row", "tensorize")


def _random_step(r: random.Random, s: Schedule) -> tuple[str, tuple[Any, ...]] | None:
    p = s.program
    ctxs = statements(p)
    if not ctxs:
        return None
    # the primitives this fuzz draws arguments for (the choice of a name must not shift when others are registered)
    names = list(FUZZED)
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
    gpu = gpu_fuzz_stats()
    print(gpu_table(gpu))
    assert not failures, f"{len(failures)} failing case(s):\n" + "\n\n".join(failures[:5])
    assert stats["accepted"] > 0 and stats["refused"] > 0
    # the checker is load-bearing: some refused step really changes the result when forced
    assert stats["refused_changes_result"] >= 1, stats
    assert not gpu["failures"], f"{len(gpu['failures'])} failing GPU case(s):\n" + "\n\n".join(gpu["failures"][:5])
    for name, row in gpu["by_strategy"].items():
        assert row["accepted"] > 0, (name, row)
        if name != "auto":  # no cross-thread communication but through collectives and cache_read's own barriers
            assert row["mismatches"] == 0, "\n".join(m for m in gpu["mismatches"] if m.startswith(name))
        if name != "cache_read":
            assert row["divergent"] == 0, "\n".join(m for m in gpu["divergent"] if m.startswith(name))


# ----------------------------------------------------------------------------- GPU-bound schedules

GPU_STRATEGIES = ("bind", "auto", "cache_read", "bind_reduction")
GPU_ORDERS = ("reversed", "forward")  # and one seed per case
GPU_SIZES = (3, 5, 9, 33, 37)


def _gpu_ew(r: random.Random, n: int) -> tuple[list[Any], list[Any]]:
    """An elementwise chain over (n, n): transposed / reversed reads of the previous stage."""
    A = te.placeholder((n, n), name="A")
    cur, prev = A, None
    for k in range(r.randint(2, 3)):
        c, p = cur, prev
        how = r.choice(["same", "transpose", "reverse"])
        at = {"same": lambda c, i, j: c[i, j], "transpose": lambda c, i, j: c[j, i],
              "reverse": lambda c, i, j: c[i, n - 1 - j]}[how]
        if p is not None and r.random() < 0.5:
            f = (lambda i, j, c=c, p=p, at=at: _unary(r, at(c, i, j)) + p[i, j])  # noqa: E731
        else:
            f = (lambda i, j, c=c, at=at: _unary(r, at(c, i, j)))  # noqa: E731
        prev, cur = cur, te.compute((n, n), f, name=f"T{k}")
    return [cur], [A]


def _gpu_row(r: random.Random, n: int) -> tuple[list[Any], list[Any]]:
    """Row reductions and an epilogue reading them (softmax-like)."""
    m = r.choice(GPU_SIZES)
    x = te.placeholder((n, m), name="x")
    k = te.reduce_axis(m, "k")
    red = r.choice([te.sum, te.max])
    R = te.compute((n,), lambda i: red(x[i, k] * 2.0, axis=k), name="R")
    if r.random() < 0.5:
        k2 = te.reduce_axis(m, "k2")
        S = te.compute((n,), lambda i: te.sum(te.exp(x[i, k2] - R[i]) * 0.5, axis=k2), name="S")
        out = te.compute((n, m), lambda i, j: (x[i, j] - R[i]) / (S[i] + 1.0), name="out")
    else:
        out = te.compute((n, m), lambda i, j: x[i, j] - R[i], name="out")
    return [out], [x]


def _gpu_pair(r: random.Random, n: int) -> tuple[list[Any], list[Any]]:
    """A reduction producer t (kept in a buffer) and a consumer reading other columns of its row."""
    m = r.choice(GPU_SIZES)
    x = te.placeholder((n, m, 3), name="x")
    q = te.reduce_axis(3, "q")
    t = te.compute((n, m), lambda i, j: te.max(x[i, j, q] * 2.0, axis=q), name="t")
    how = r.choice(["reverse", "shift", "same"])
    if how == "shift":
        out = te.compute((n, m - 1), lambda i, j: t[i, j + 1] - t[i, j], name="out")
    elif how == "reverse":
        out = te.compute((n, m), lambda i, j: t[i, m - 1 - j] * 2.0 + x[i, j, 0], name="out")
    else:
        out = te.compute((n, m), lambda i, j: t[i, j] * 3.0, name="out")
    return [out], [x]


def _gpu_matmul(r: random.Random, n: int) -> tuple[list[Any], list[Any]]:
    m, p = r.choice(GPU_SIZES), r.choice((3, 8, 13))
    A = te.placeholder((n, p), name="A")
    Bm = te.placeholder((p, m), name="Bm")
    k = te.reduce_axis(p, "k")
    R = te.compute((n, m), lambda i, j: te.sum(A[i, k] * Bm[k, j], axis=k), name="R")
    if r.random() < 0.5:
        return [te.compute((n, m), lambda i, j: te.maximum(R[i, j] + 1.0, 0.0), name="out")], [A, Bm]
    return [R], [A, Bm]


def _gpu_stencil(r: random.Random, n: int) -> tuple[list[Any], list[Any]]:
    n = max(n, 4)
    X = te.placeholder((n, n), name="X")
    B = te.compute((n, n), lambda i, j: X[i, j] * 3.0 + 1.0, name="B")
    out = te.compute((n - 2, n - 2), lambda i, j: B[i + 1, j] + B[i + 1, j + 2] * 2.0 + B[i, j + 1], name="out")
    return [out], [X]


GPU_GENERATORS = (_gpu_ew, _gpu_row, _gpu_pair, _gpu_matmul, _gpu_stencil)
GPU_REDUCTION_GENERATORS = (_gpu_row, _gpu_pair, _gpu_matmul)


def _stage_loops(s: Schedule, t: Any) -> tuple[list[Any], list[Any]]:
    """(spatial loops, the rest) of stage t's deepest statement, outermost first."""
    loops = list(s.loops(t))
    d = len(t.shape)
    return loops[:d], loops[d:]


def _bind_stage(r: random.Random, s: Schedule, t: Any) -> list[Any]:
    """Map stage t's spatial loops to blocks and threads; returns the block loops (outermost first)."""
    sp, _ = _stage_loops(s, t)
    f = r.choice([3, 8, 32, 64])
    if len(sp) == 1:
        o, i = s.split(sp[0], f)
        s.bind(o, "blockIdx.x").bind(i, "threadIdx.x")
        return [o]
    way = r.randrange(4)
    if way == 0:  # a row per block, the row split over the threads
        jo, ji = s.split(sp[1], f)
        s.bind(sp[0], "blockIdx.x").bind(ji, "threadIdx.x")
        return [sp[0]]
    if way == 1:  # rows over blocks and threads, columns serial
        io, ii = s.split(sp[0], f)
        s.bind(io, "blockIdx.x").bind(ii, "threadIdx.x")
        return [io]
    if way == 2:
        jo, ji = s.split(sp[1], f)
        s.bind(sp[0], "blockIdx.y").bind(jo, "blockIdx.x").bind(ji, "threadIdx.x")
        return [sp[0], jo]
    ti, tj = r.choice([2, 4, 8]), r.choice([4, 8, 16])
    io, jo, ii, ji = s.tile(sp[0], sp[1], ti, tj)
    s.bind(io, "blockIdx.y").bind(jo, "blockIdx.x").bind(ii, "threadIdx.y").bind(ji, "threadIdx.x")
    return [io, jo]


def _stages(outs: list[Any]) -> list[Any]:
    """The compute stages of `outs`, producers first."""
    order: list[Any] = []

    def visit(t: Any) -> None:
        if any(t is u for u in order) or not hasattr(t.op, "body"):
            return
        for u in t.op.inputs:
            visit(u)
        order.append(t)

    for o in outs:
        visit(o)
    return order


def _reduction_stages(stages: list[Any]) -> list[Any]:
    return [t for t in stages if t.op.reduce_axis]


def _apply_gpu_strategy(r: random.Random, strategy: str, outs: list[Any]) -> Schedule:
    from schedules import auto_schedule

    if strategy == "auto":
        return auto_schedule(outs, target="cuda", threads=r.choice([32, 64, 128]))
    s = Schedule(outs)
    stages = _stages(outs)
    reds = _reduction_stages(stages)
    done: set[str] = set()
    if strategy == "bind_reduction":
        if not reds:
            raise ValueError("no reduction stage")
        t = r.choice(reds)
        sp, rest = _stage_loops(s, t)
        for h, axis in zip(reversed(sp), ("blockIdx.x", "blockIdx.y")):
            s.bind(h, axis)
        s.bind_reduction(rest[0], threads=r.choice([32, 64]))
        done.add(t.name)
    elif strategy == "cache_read":
        mm = [t for t in reds if len(t.shape) == 2 and len(t.op.inputs) == 2]
        if mm and r.random() < 0.7:  # block tiles of both operands in shared memory, copied cooperatively
            t = mm[0]
            sp, rest = _stage_loops(s, t)
            io, jo, ii, ji = s.tile(sp[0], sp[1], r.choice([2, 4, 8]), r.choice([4, 8]))
            s.bind(io, "blockIdx.y").bind(jo, "blockIdx.x").bind(ii, "threadIdx.y").bind(ji, "threadIdx.x")
            ko, _ = s.split(s.loops(t)[-1], r.choice([2, 4, 8]))
            for src in t.op.inputs:
                if r.random() < 0.8:
                    s.cache_read(src, "shared", ko)
            done.add(t.name)
        else:  # the rows a block reads, staged in shared memory at the block loop
            t = r.choice([u for u in stages if len(u.shape) == 2] or stages)
            blocks = _bind_stage(r, s, t)
            readers = [u for u in t.op.inputs]
            s.cache_read(r.choice(readers), "shared", blocks[-1])
            done.add(t.name)
    for t in stages:
        if t.name not in done:
            _bind_stage(r, s, t)
    return s


def _run_named(p: Program, arrays: dict[str, np.ndarray], gpu_order: Any = None) -> dict[str, np.ndarray]:
    args = [arrays[b.name].copy() for b in p.args]
    interp.run(p, *args, gpu_order=gpu_order)
    return {b.name: a for b, a in zip(p.args, args)}


def _gpu_same(x: np.ndarray, y: np.ndarray) -> bool:
    return bool(np.array_equal(np.isnan(x), np.isnan(y)) and np.allclose(x, y, rtol=1e-4, atol=1e-5, equal_nan=True))


def _gpu_case(case: int, seed0: int, stats: dict[str, Any]) -> None:
    from codegen.cuda import CudaCodegenError, generate_cuda
    from codegen.passes import lower as lower_passes

    r = random.Random(seed0 + case)
    strategy = GPU_STRATEGIES[case % len(GPU_STRATEGIES)]
    gens = GPU_REDUCTION_GENERATORS if strategy == "bind_reduction" else GPU_GENERATORS
    gen = gens[(case // len(GPU_STRATEGIES)) % len(gens)]
    row = stats["by_strategy"][strategy]
    row["cases"] += 1
    outs, _ = gen(r, r.choice(GPU_SIZES))
    try:
        s = _apply_gpu_strategy(r, strategy, outs)
    except (ScheduleError, InexactCheckError, ValueError) as e:
        row["refused"] += 1
        stats["refusals"].append(f"{strategy} case {case} ({gen.__name__}): {type(e).__name__}: {str(e)[:200]}")
        return
    p = lower_passes(s.program, "cuda")
    try:
        generate_cuda(p)
    except CudaCodegenError as e:
        row["unrenderable"] += 1
        stats["refusals"].append(f"{strategy} case {case} ({gen.__name__}) unrenderable: {str(e)[:200]}")
        return
    row["accepted"] += 1
    p0 = s.original
    rng = np.random.default_rng(seed0 + case)
    outputs = _outputs_only(p0)
    arrays = {}
    for b in p0.args:
        shape = tuple(eval_int(e, {}) for e in b.shape)
        arrays[b.name] = np.full(shape, np.nan, b.dtype) if b.name in outputs else \
            rng.standard_normal(shape).astype(b.dtype)
    want = _run_named(p0, arrays)
    where = f"case {case} seed {seed0 + case} ({gen.__name__})"
    got = _run_named(p, arrays)
    if not all(_gpu_same(got[k], want[k]) for k in outputs):
        raise AssertionError(f"{strategy} {where}: the accepted GPU schedule computes something else even run "
                             f"serially:\n{p0}\n---\n{p}")
    for order in (*GPU_ORDERS, seed0 + case):
        try:
            got = _run_named(p, arrays, order)
        except BarrierDivergenceError as e:
            row["divergent"] += 1
            stats["divergent"].append(f"{strategy} {where}: {e}\n{p}")
            break
        bad = [k for k in outputs if not _gpu_same(got[k], want[k])]
        if bad:
            row["mismatches"] += 1
            nan = sum(int(np.isnan(got[k]).sum()) for k in bad)
            stats["mismatches"].append(f"{strategy} {where}: gpu_order={order!r} changes {', '.join(bad)} "
                                       f"({nan} NaN)\n{p}")
            break


def fuzz_gpu(cases: int, seed0: int = 0) -> dict[str, Any]:
    stats: dict[str, Any] = {
        "cases": cases, "failures": [], "mismatches": [], "divergent": [], "refusals": [],
        "by_strategy": {k: {"cases": 0, "accepted": 0, "refused": 0, "unrenderable": 0, "mismatches": 0,
                            "divergent": 0} for k in GPU_STRATEGIES}}
    t0 = time.perf_counter()
    for case in range(cases):
        try:
            _gpu_case(case, seed0, stats)
        except Exception as e:  # noqa: BLE001 - every failure is collected and reported at the end
            stats["failures"].append(f"GPU case {case} (seed {seed0 + case}): {type(e).__name__}: {str(e)[:3000]}")
    stats["seconds"] = round(time.perf_counter() - t0, 2)
    return stats


_GPU_STATS: dict[int, dict[str, Any]] = {}


def gpu_fuzz_stats() -> dict[str, Any]:
    """The GPU-bound fuzz run of this session (computed once, shared by the tests that assert on it)."""
    if GPU_CASES not in _GPU_STATS:
        _GPU_STATS[GPU_CASES] = fuzz_gpu(GPU_CASES)
    return _GPU_STATS[GPU_CASES]


def gpu_table(stats: dict[str, Any]) -> str:
    lines = [f"fuzz GPU-bound ({stats['cases']} cases, {stats['seconds']} s; gpu_order "
             f"{' / '.join(GPU_ORDERS)} / seed):",
             f"  {'strategy':<16}{'cases':>7}{'accepted':>10}{'refused':>9}{'unrenderable':>14}{'mismatches':>12}"
             f"{'divergent':>11}"]
    for name, row in stats["by_strategy"].items():
        lines.append(f"  {name:<16}{row['cases']:>7}{row['accepted']:>10}{row['refused']:>9}"
                     f"{row['unrenderable']:>14}{row['mismatches']:>12}{row['divergent']:>11}")
    for m in stats["mismatches"][:3] + stats["divergent"][:2]:
        lines.append("  " + m.splitlines()[0][:300])
    return "\n".join(lines)


def test_fuzz_gpu_barriers_uniform():
    """Every thread of a block must reach the same barriers. cache_read(..., "shared", ko) inside a tile whose
    sizes do not divide the extents places its barrier pair under the tile's guards (`if i_o*4 + i_i < 33`):
    the lowering makes such guards predicates (every thread reaches the barrier, only the guarded threads
    store), as the CUDA renderer does; a divergent barrier would raise `BarrierDivergenceError` here."""
    gpu = gpu_fuzz_stats()
    assert gpu["by_strategy"]["cache_read"]["divergent"] == 0, "\n\n".join(gpu["divergent"][:2])


def test_fuzz_gpu_fusion_race_free():
    """auto_schedule's fused kernels whose phases communicate through memory: with the barriers the lowering
    places, every accepted case computes the unscheduled program's result in every adversarial order."""
    gpu = gpu_fuzz_stats()
    row = gpu["by_strategy"]["auto"]
    assert row["accepted"] > 0
    assert row["mismatches"] == 0, "\n".join(m for m in gpu["mismatches"] if m.startswith("auto"))


@pytest.mark.parametrize("gen", GENERATORS, ids=lambda g: g.__name__)
def test_generators_run(gen):
    p = gen(random.Random(7))
    assert same_result(p, p, 7)
    out = run_program(p, 4, 7)
    assert all(not np.isnan(a).any() for a in out)


def test_fuzzed_primitives_are_registered():
    assert set(FUZZED) <= set(REGISTRY), set(FUZZED) - set(REGISTRY)
