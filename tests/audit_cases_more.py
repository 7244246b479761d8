"""More cases of the bad-input audit (see audit_cases.py): schedules, builds and calls beyond the issue's list."""

from __future__ import annotations

import numpy as np

from audit_cases import case, chain, cpu_mod, nan, rnd, sched


# ----------------------------------------------------------------------------- more entry points


@case("'k'")
def te_reduce_axis_reused():
    from loopir import te

    x = te.placeholder((4, 4), name="x")
    k = te.reduce_axis(4, "k")
    te.compute((4,), lambda i: te.sum(x[i, k], axis=k), name="r1")
    te.compute((4,), lambda i: te.sum(x[k, i], axis=k), name="r2")


@case("1n")
def te_var_bad_name():
    from loopir import te

    te.var("1n")


@case("'i'")
def te_foreign_loop_variable():
    from loopir import te

    x = te.placeholder((4,), name="x")
    keep = {}
    te.compute((4,), lambda i: keep.setdefault("i", i) * 0 + x[i], name="y1")
    te.compute((4,), lambda j: x[j] + te.cast("float32", keep["i"]), name="y2")


@case("'i'")
def ir_loop_variable_outside_its_loop():
    from loopir import ir

    A = ir.buffer((4,), name="A")
    b = ir.Builder("p")
    with b.loop("i", 0, 4) as i:
        pass
    b.store(A, (i,), 1.0, name="S")


@case("'S'")
def ir_duplicate_statement_name():
    from loopir import ir

    A = ir.buffer((4,), name="A")
    b = ir.Builder("p")
    b.store(A, (0,), 1.0, name="S")
    b.store(A, (1,), 1.0, name="S")


@case("'B'")
def ir_finish_missing_buffer():
    from loopir import ir

    A, B = ir.buffer((4,), name="A"), ir.buffer((4,), name="B")
    b = ir.Builder("p")
    b.store(A, (0,), B[0], name="S")
    b.finish([A])


@case("'texture'")
def ir_bad_scope():
    from loopir import ir

    ir.buffer((4,), name="A", scope="texture")


@case("store()")
def ir_store_into_non_buffer():
    from loopir import ir

    b = ir.Builder("p")
    b.store("A", (0,), 1.0, name="S")


@case("factor")
def sched_split_float_factor():
    s, x, a, y = sched()
    s.split(s.loops(y)[0], 2.5)


@case("factor")
def sched_split_bool_factor():
    s, x, a, y = sched()
    s.split(s.loops(y)[0], True)


@case("'global'")
def sched_cache_read_bad_scope():
    s, x, a, y = sched()
    s.cache_read(x, "global", s.loops(y)[0])


@case(("vectorize", "i"))
def sched_vectorize_carried():
    from loopir import workloads
    from schedules import Schedule

    s = Schedule(workloads.prefix_sum().program())
    s.vectorize(s.loops("S")[0])


@case("'nope'")
def sched_loops_unknown_stage():
    s, x, a, y = sched()
    s.loops("nope")


@case("Schedule")
def sched_of_a_schedule():
    from schedules import Schedule

    s, *_ = sched()
    Schedule(s)


@case("'q'")
def replay_unknown_loop():
    from schedules import Schedule

    Schedule.replay('{"steps": [{"primitive": "split", "args": [{"loop": "q"}, 4]}]}', chain()[2])


@case(("parallel", "k"))
def sched_parallel_reduction_loop():
    from loopir import te
    from schedules import Schedule

    a = te.placeholder((8, 8), name="A")
    b = te.placeholder((8, 8), name="B")
    k = te.reduce_axis(8, "k")
    c = te.compute((8, 8), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    s = Schedule(c)
    s.parallel(s.loops("C")[2])


@case("None")
def build_target_none():
    from codegen import build

    s, x, a, y = sched()
    build(s, [x, y], target=None)


@case("Schedule")
def build_of_an_int():
    from codegen import build

    build(3)


@case("sm_xx")
def build_cuda_bad_arch():
    from codegen import build

    s, x, a, y = sched()
    io, ii = s.split(s.loops(y)[0], 64)
    s.bind(io, "blockIdx.x").bind(ii, "threadIdx.x")
    build(s, [x, y], target="cuda", arch="sm_xx")


@case("options")
def build_cuda_options_not_str():
    from codegen import build

    s, x, a, y = sched()
    io, ii = s.split(s.loops(y)[0], 64)
    s.bind(io, "blockIdx.x").bind(ii, "threadIdx.x")
    build(s, [x, y], target="cuda", options=("-lineinfo", 3))


@case()
def build_cuda_options_tuple_ok():
    from codegen import build
    from schedules import Schedule

    x, a, y = chain()
    s = Schedule(y)
    s.compute_inline(a)
    io, ii = s.split(s.loops(y)[0], 64)
    s.bind(io, "blockIdx.x").bind(ii, "threadIdx.x")
    return bool(build(s, [x, y], target="cuda", options=("-lineinfo",)).kernels)


@case("'x'")
def call_zero_d_array():
    cpu_mod()(np.float32(3.0) * np.ones((), np.float32), nan(4))


@case("'x'")
def call_wrong_ndim():
    cpu_mod()(rnd(2, 2), nan(4))


@case(("'x'", "int64"))
def call_int_array_for_float():
    cpu_mod()(np.arange(4), nan(4))


@case("'x'")
def call_none_argument():
    cpu_mod()(None, nan(4))


@case("'x'")
def call_fortran_order():
    from codegen import build
    from loopir import te

    n, m = te.var("n"), te.var("m")
    x = te.placeholder((n, m), name="x")
    y = te.compute((n, m), lambda i, j: x[i, j] + 1.0, name="y")
    build(y, [x, y])(np.asfortranarray(rnd(3, 4)), nan(3, 4))


@case("'n'")
def call_negative_derived_size():
    from codegen import build
    from loopir import te

    n = te.var("n")
    x = te.placeholder((n,), name="x")
    y = te.compute((n - 2,), lambda i: x[i] + x[i + 1] + x[i + 2], name="y")
    build(y, [x, y])(rnd(1), nan(0))


@case()
def call_smallest_sizes_stencil():
    from codegen import build
    from loopir import te

    n = te.var("n")
    x = te.placeholder((n,), name="x")
    y = te.compute((n - 2,), lambda i: x[i] + x[i + 1] + x[i + 2], name="y")
    mod = build(y, [x, y])
    xa, ya = rnd(2), nan(0)
    mod(xa, ya)
    xb, yb = rnd(3), nan(1)
    mod(xb, yb)
    return bool(np.allclose(yb, xb.sum(), rtol=1e-6))


@case("'m'")
def interp_unknown_size_name():
    from loopir import interp

    s, *_ = sched()
    interp.run(s.program, rnd(4), nan(4), sizes={"m": 3})


@case(("'x'", "float64"))
def interp_wrong_dtype():
    from loopir import interp

    s, *_ = sched()
    interp.run(s.program, rnd(4, dtype="float64"), nan(4))


@case()
def workloads_all_seeds_build_and_match():
    from codegen import build
    from loopir import workloads

    ok = True
    for f in workloads.SEEDS.values():
        w = f()
        sizes = {v.name: 5 for v in w.sizes}
        ins, outs = w.random_inputs(sizes, 1), w.empty_outputs(sizes)
        wants = w.reference(*[a.copy() for a in ins])
        build(w.program())(*w.call_args(ins, outs))
        for got, want in zip(ins if w.in_place else outs, wants):
            ok &= bool(np.allclose(got, want, rtol=1e-3, atol=1e-5))
    return ok


# ----------------------------------------------------------------------------- numerics and corner cases


@case()
def te_zero_size_stage():
    from codegen import build
    from loopir import te

    x = te.placeholder((0,), name="x")
    y = te.compute((0,), lambda i: x[i] + 1.0, name="y")
    ya = nan(0)
    build(y, [x, y])(rnd(0), ya)
    return ya.shape == (0,)


@case()
def te_sum_over_empty_axis():
    from codegen import build
    from loopir import te

    n, m = te.var("n"), te.var("m")
    x = te.placeholder((n, m), name="x")
    k = te.reduce_axis(m, "k")
    y = te.compute((n,), lambda i: te.sum(x[i, k], axis=k), name="y")
    ya = nan(3)
    build(y, [x, y])(rnd(3, 0), ya)
    return bool(np.array_equal(ya, np.zeros(3, np.float32)))


@case()
def te_max_with_nan_and_inf():
    from codegen import build
    from loopir import te

    n = te.var("n")
    x = te.placeholder((n, 4), name="x")
    k = te.reduce_axis(4, "k")
    y = te.compute((n,), lambda i: te.max(x[i, k], axis=k), name="y")
    xa = rnd(2, 4)
    xa[0, 1], xa[1, 2] = np.inf, -np.inf
    ya = nan(2)
    build(y, [x, y])(xa, ya)
    return bool(ya[0] == np.inf and ya[1] == xa[1].max())


@case()
def te_integer_floor_division_and_mod_of_negatives():
    from codegen import build
    from loopir import te

    n = te.var("n")
    x = te.placeholder((n,), dtype="int64", name="x")
    y = te.compute((n,), lambda i: x[i] // 3 + x[i] % 3 * 100, name="y")
    xa = np.array([-7, -1, 0, 5, 7], np.int64)
    ya = np.full(5, 99, np.int64)
    build(y, [x, y])(xa, ya)
    return bool(np.array_equal(ya, xa // 3 + xa % 3 * 100))


@case()
def te_float16_output():
    from codegen import build
    from loopir import te

    n = te.var("n")
    x = te.placeholder((n,), name="x")
    y = te.compute((n,), lambda i: te.cast("float16", x[i] * 2.0), name="y")
    xa, ya = rnd(6), np.full(6, np.nan, np.float16)
    build(y, [x, y])(xa, ya)
    return bool(np.array_equal(ya, (xa * 2).astype(np.float16)))


@case("'float8'")
def te_cast_bad_dtype():
    from loopir import te

    x = te.placeholder((4,), name="x")
    te.compute((4,), lambda i: te.cast("float8", x[i]), name="y")


@case("condition")
def te_where_non_bool():
    from loopir import te

    x = te.placeholder((4,), name="x")
    te.compute((4,), lambda i: te.where(x[i], 1.0, 0.0), name="y")


@case()
def build_two_outputs():
    from codegen import build
    from loopir import te

    n = te.var("n")
    x = te.placeholder((n,), name="x")
    y1 = te.compute((n,), lambda i: x[i] + 1.0, name="y1")
    y2 = te.compute((n,), lambda i: x[i] * 3.0, name="y2")
    xa, a, b = rnd(5), nan(5), nan(5)
    build([y1, y2], [x, y1, y2])(xa, a, b)
    return bool(np.array_equal(a, xa + 1) and np.array_equal(b, xa * 3))


@case()
def build_dump_passes_callable():
    from codegen import build

    s, x, a, y = sched()
    seen = []
    build(s, [x, y], dump_passes=seen.append)
    from codegen.passes import pipeline

    names = [p.name for p in pipeline("cpu")]
    return len(seen) == len(names) and all(f"after pass {n}" in t for n, t in zip(names, seen))


@case()
def build_parallel_threads_one():
    from codegen import build

    s, x, a, y = sched()
    s.parallel(s.loops(y)[0])
    xa, ya = rnd(100), nan(100)
    build(s, [x, y], threads=1)(xa, ya)
    return bool(np.array_equal(ya, xa * 2 + 1))


@case()
def sched_unroll_symbolic_loop():
    from codegen import build

    s, x, a, y = sched()
    s.unroll(s.loops(y)[0])
    xa, ya = rnd(9), nan(9)
    build(s, [x, y])(xa, ya)
    return bool(np.array_equal(ya, xa * 2 + 1))


@case("no longer exists")
def sched_stale_handle():
    s, x, a, y = sched()
    (i,) = s.loops(y)
    s.split(i, 4)
    s.split(i, 2)


@case("'x'")
def sched_compute_inline_of_an_input():
    s, x, a, y = sched()
    s.compute_inline(x)


@case(("compute_at", "'y'"))
def sched_compute_at_of_an_output():
    s, x, a, y = sched()
    s.compute_at(y, s.loops("a")[0])


@case()
def sched_compute_at_then_build():
    from codegen import build

    s, x, a, y = sched()
    io, ii = s.split(s.loops(y)[0], 4)
    s.compute_at(a, io)
    xa, ya = rnd(10), nan(10)
    build(s, [x, y])(xa, ya)
    return bool(np.array_equal(ya, xa * 2 + 1))


@case(("reorder", "twice", "i"))
def sched_reorder_duplicate():
    from loopir import te
    from schedules import Schedule

    x = te.placeholder((4, 4), name="x")
    y = te.compute((4, 4), lambda i, j: x[i, j] + 1.0, name="y")
    s = Schedule(y)
    i, j = s.loops(y)
    s.reorder(i, i)


@case()
def sched_replay_roundtrip():
    from schedules import Schedule

    s, x, a, y = sched()
    io, ii = s.split(s.loops(y)[0], 4)
    s.parallel(io)
    return str(Schedule.replay(s.trace_json(), y)) == str(s)


@case("'x'")
def call_size_mismatch_two_inputs():
    from codegen import build
    from loopir import te

    n = te.var("n")
    x = te.placeholder((n,), name="x")
    z = te.placeholder((n,), name="z")
    y = te.compute((n,), lambda i: x[i] + z[i], name="y")
    build(y, [x, z, y])(rnd(4), rnd(5), nan(4))


@case()
def call_int32_arrays():
    from codegen import build
    from loopir import te

    n = te.var("n")
    x = te.placeholder((n,), dtype="int32", name="x")
    y = te.compute((n,), lambda i: x[i] * 3 + 1, name="y")
    xa = np.array([1, -2, 2**30, 7], np.int32)
    ya = np.zeros(4, np.int32)
    build(y, [x, y])(xa, ya)
    return bool(np.array_equal(ya, xa * 3 + 1))


@case()
def call_bool_arrays():
    from codegen import build
    from loopir import te

    n = te.var("n")
    x = te.placeholder((n,), name="x")
    y = te.compute((n,), lambda i: x[i] > 3.0, name="y")
    xa, ya = rnd(6), np.zeros(6, bool)
    build(y, [x, y])(xa, ya)
    return bool(np.array_equal(ya, xa > 3))


@case()
def call_prefix_sum_in_place():
    from codegen import build
    from loopir import workloads

    w = workloads.prefix_sum()
    a = rnd(10)
    want = np.cumsum(a.astype(np.float64)).astype(np.float32)
    build(w.program())(a)
    return bool(np.allclose(a, want, rtol=1e-5))


@case()
def call_same_module_many_sizes():
    mod = cpu_mod()
    ok = True
    for n in (1, 2, 7, 64, 1000):
        xa, ya = rnd(n), nan(n)
        mod(xa, ya)
        ok &= bool(np.array_equal(ya, xa * 2 + 1))
    return ok


@case("'x'")
def call_scalar_argument():
    cpu_mod()(3.0, nan(4))
