"""te.scan (TVM) and te.update (Halide's update definitions): the printed nest, refusals, schedules (parallel over
the non-scan axis accepted, over the scan axis refused with a witness), compute_at of a recurrence, auto_schedule
on both targets (NVRTC build and the adversarial GPU interpreter here; GPU numerics in `gpu` tests)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from codegen import build
from codegen.passes import lower as lower_for
from loopir import interp, te, workloads
from loopir.errors import ArgumentError, ArgumentTypeError
from loopir.lower import lower
from loopir.nodes import For
from loopir.visit import walk
from schedules import Schedule, ScheduleError, auto_schedule
from schedules.auto import map_statements
from schedules.primitives.compute import compute_at
from witness_check import verify_witness

ALPHA = 0.25


@dataclass
class Case:
    name: str
    outs: list[Any]
    args: list[Any]
    inputs: Callable[[np.random.Generator], list[np.ndarray]]
    ref: Callable[..., np.ndarray]  # float64 reference of the (single) output from the inputs
    out_shape: Callable[..., tuple[int, ...]]
    out_dtype: str = "float32"


def _scan2d() -> tuple[Any, ...]:
    """TVM's scan tutorial: cumulative sum down the rows of X, read by a later stage."""
    m, n = te.var("m"), te.var("n")
    X = te.placeholder((m, n), name="X")
    state = te.placeholder((m, n), name="state")
    init = te.compute((1, n), lambda _, i: X[0, i], name="init")
    upd = te.compute((m, n), lambda t, i: state[t - 1, i] + X[t, i], name="upd")
    S = te.scan(init, upd, state, inputs=[X], name="S")
    Y = te.compute((m, n), lambda t, i: S[t, i] * 2.0 - X[t, i], name="Y")
    return X, S, Y


def scan2d(m: int = 9, n: int = 37) -> Case:
    X, _, Y = _scan2d()
    return Case("scan2d", [Y], [X, Y], lambda r: [r.standard_normal((m, n)).astype(np.float32)],
                lambda x: 2 * np.cumsum(x.astype(np.float64), 0) - x, lambda x: x.shape)


def cumsum(n: int = 45) -> Case:
    """A 1-D te.scan (the prefix sum): no axis besides the scan axis."""
    N = te.var("n")
    X = te.placeholder((N,), name="X")
    state = te.placeholder((N,), name="state")
    init = te.compute((1,), lambda _: X[0], name="init")
    upd = te.compute((N,), lambda t: state[t - 1] + X[t], name="upd")
    S = te.scan(init, upd, state, name="C")
    Y = te.compute((N,), lambda i: S[i] * 0.5, name="Y")
    return Case("cumsum", [Y], [X, Y], lambda r: [r.standard_normal(n).astype(np.float32)],
                lambda x: 0.5 * np.cumsum(x.astype(np.float64)), lambda x: x.shape)


def cumsum_update(n: int = 45) -> Case:
    """The prefix sum as an update definition (Halide: f(r) = f(r - 1) + f(r) over RDom(1, n - 1))."""
    N = te.var("n")
    X = te.placeholder((N,), name="X")
    c0 = te.compute((N,), lambda i: X[i], name="c0")
    c = te.update(c0, (1, N), lambda r: ((r,), c0[r - 1] + c0[r]), name="c")
    Y = te.compute((N,), lambda i: c[i] + 1.0, name="Y")
    return Case("cumsum_update", [Y], [X, Y], lambda r: [r.standard_normal(n).astype(np.float32)],
                lambda x: np.cumsum(x.astype(np.float64)) + 1.0, lambda x: x.shape)


def _histogram() -> tuple[Any, ...]:
    n, bins = te.var("n"), te.var("bins")
    img = te.placeholder((n,), dtype="int32", name="img")
    edges = te.placeholder((bins,), dtype="int32", name="edges")  # gives `bins` a shape to be read from
    h0 = te.compute((bins,), lambda b: edges[b] * 0, name="h0")
    h = te.update(h0, n, lambda r: ((img[r],), h0[img[r]] + 1), name="h")
    out = te.compute((bins,), lambda b: h[b] * 3 + edges[b], name="out")
    return img, edges, h, out


def histogram(n: int = 300, bins: int = 11) -> Case:
    img, edges, _, out = _histogram()
    return Case("histogram", [out], [img, edges, out],
                lambda r: [r.integers(0, bins, n).astype(np.int32), r.integers(-5, 5, bins).astype(np.int32)],
                lambda i, e: 3 * np.bincount(i, minlength=bins) + e, lambda i, e: e.shape, "int32")


def _iir() -> tuple[Any, ...]:
    h, w = te.var("h"), te.var("w")
    inp = te.placeholder((h, w), name="inp")
    b0 = te.compute((h, w), lambda y, x: inp[y, x], name="b0")
    blur = te.update(b0, [(1, h), w], lambda y, x: ((y, x), b0[y - 1, x] * (1 - ALPHA) + inp[y, x] * ALPHA),
                     name="blur")
    out = te.compute((h, w), lambda y, x: blur[y, x] * 2.0, name="out")
    return inp, blur, out


def _iir_ref(a: np.ndarray) -> np.ndarray:
    b = a.astype(np.float64).copy()
    for y in range(1, b.shape[0]):
        b[y] = b[y - 1] * (1 - ALPHA) + a[y] * ALPHA
    return 2 * b


def iir(h: int = 13, w: int = 40) -> Case:
    """Halide's IIR blur, one direction (down the columns)."""
    inp, _, out = _iir()
    return Case("iir", [out], [inp, out], lambda r: [r.standard_normal((h, w)).astype(np.float32)],
                _iir_ref, lambda a: a.shape)


def scan3d(m: int = 5, n: int = 3, k: int = 33) -> Case:
    """A 3-D state, scanning over a computed stage: S[t] = S[t - 1] * 0.5 + 2 X[t]."""
    M, N, K = te.var("m"), te.var("n"), te.var("k")
    X = te.placeholder((M, N, K), name="X")
    X2 = te.compute((M, N, K), lambda t, i, j: X[t, i, j] * 2.0, name="X2")
    state = te.placeholder((M, N, K), name="state")
    init = te.compute((1, N, K), lambda _, i, j: X2[0, i, j], name="init")
    upd = te.compute((M, N, K), lambda t, i, j: state[t - 1, i, j] * 0.5 + X2[t, i, j], name="upd")
    S = te.scan(init, upd, state, inputs=[X2], name="S3")
    Y = te.compute((M, N, K), lambda t, i, j: S[t, i, j] - S[0, i, j], name="Y")  # also reads the first row

    def ref(x: np.ndarray) -> np.ndarray:
        acc = 2 * x.astype(np.float64)
        for t in range(1, acc.shape[0]):
            acc[t] += acc[t - 1] * 0.5
        return acc - acc[0]

    return Case("scan3d", [Y], [X, Y], lambda r: [r.standard_normal((m, n, k)).astype(np.float32)], ref,
                lambda x: x.shape)


def fib2(m: int = 12, n: int = 7) -> Case:
    """Two init rows, the update reading two rows back: S[t] = S[t - 1] + S[t - 2] * 0.5 + X[t]."""
    M, N = te.var("m"), te.var("n")
    X = te.placeholder((M, N), name="X")
    state = te.placeholder((M, N), name="state")
    init = te.compute((2, N), lambda r, i: X[r, i], name="init")
    upd = te.compute((M, N), lambda t, i: state[t - 1, i] + state[t - 2, i] * 0.5 + X[t, i], name="upd")
    S = te.scan(init, upd, state, name="F")
    Y = te.compute((M, N), lambda t, i: S[t, i] - 1.0, name="Y")

    def ref(x: np.ndarray) -> np.ndarray:
        s = x.astype(np.float64).copy()
        for t in range(2, s.shape[0]):
            s[t] = s[t - 1] + s[t - 2] * 0.5 + x[t]
        return s - 1

    return Case("fib2", [Y], [X, Y], lambda r: [r.uniform(-1, 1, (m, n)).astype(np.float32)], ref,
                lambda x: x.shape)


CASES = [scan2d, cumsum, cumsum_update, histogram, iir, scan3d, fib2]


def _arrays(case: Case, seed: int) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
    ins = case.inputs(np.random.default_rng(seed))
    out = np.full(case.out_shape(*ins), np.nan if case.out_dtype == "float32" else -77, case.out_dtype)
    return ins, out, case.ref(*ins)


def _close(got: np.ndarray, want: np.ndarray) -> None:
    assert not np.isnan(got.astype(np.float64)).any()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


# ----------------------------------------------------------------------------- the printed nest


def test_scan_printed_nest() -> None:
    _, _, Y = _scan2d()
    assert str(lower([Y])) == """\
def Y(X: float32[m, n], Y: float32[m, n]):  # sizes: m, n
    S: float32[m, n]  # temporary
    for _ in range(0, min(1, m)):
        for i in range(0, n):
            S[_, i] = X[0, i]  # S_init
    for t in range(1, m):
        for i in range(0, n):
            S[t, i] = S[t - 1, i] + X[t, i]  # S
    for t in range(0, m):
        for i in range(0, n):
            Y[t, i] = S[t, i] * 2.0 - X[t, i]  # Y"""


def test_update_printed_nest_scatter() -> None:
    *_, out = _histogram()
    text = str(lower([out]))
    assert """\
    for b in range(0, bins):
        h[b] = 0  # h_init
    for r in range(0, n):
        h[int64(img[r])] = h[img[r]] + 1  # h
    for b in range(0, bins):
        out[b] = h[b] * 3 + edges[b]  # out""" in text


def test_update_chain_names_each_definition() -> None:
    n = te.var("n")
    x = te.placeholder((n,), name="x")
    f0 = te.compute((n,), lambda i: x[i], name="f0")
    f1 = te.update(f0, (1, n), lambda r: ((r,), f0[r - 1] + f0[r]), name="f1")
    f2 = te.update(f1, n, lambda r: ((r,), f1[r] * 2.0), name="f")
    names = [st.name for st in walk(lower([f2]).body) if type(st).__name__ == "Store"]
    assert names == ["f_init", "f_u1", "f"]
    xa = np.random.default_rng(3).standard_normal(17).astype(np.float32)
    out = np.full(17, np.nan, np.float32)
    build([f2], [x, f2], target="cpu")(xa, out)
    _close(out, 2 * np.cumsum(xa.astype(np.float64)))


# ----------------------------------------------------------------------------- numerics: cpu, unscheduled and auto


@pytest.mark.parametrize("make", CASES, ids=lambda f: f.__name__)
def test_numerics_cpu(make: Callable[[], Case]) -> None:
    case = make()
    for seed, sched in ((0, False), (1, True)):
        ins, out, want = _arrays(case, seed)
        obj = case.outs if sched else Schedule(case.outs)
        build(obj, case.args, target="cpu")(*ins, out)
        _close(out, want)


@pytest.mark.parametrize("make", CASES, ids=lambda f: f.__name__)
def test_interpreter_matches_numpy(make: Callable[[], Case]) -> None:
    case = make()
    ins, out, want = _arrays(case, 4)
    interp.run(lower(case.outs, case.args), *ins, out)
    _close(out, want)


def _one_scan(op: str) -> tuple[Any, Any]:
    n = te.var("n")
    X = te.placeholder((n,), name="X")
    state = te.placeholder((n,), name="state")
    init = te.compute((1,), lambda _: X[0], name="init")
    upd = te.compute((n,), lambda t: state[t - 1] + X[t] if op == "add" else state[t - 1] * X[t], name="upd")
    return te.scan(init, upd, state, name="S"), X


def test_structurally_different_scans_do_not_share_a_build() -> None:
    """The build caches key a recurrence by its definitions: same names and shapes, another update."""
    results = []
    for op in ("add", "mul"):
        S, X = _one_scan(op)
        x = np.random.default_rng(1).uniform(0.5, 1.5, 9).astype(np.float32)
        out = np.full(9, np.nan, np.float32)
        build([S], [X, S], target="cpu")(x, out)
        results.append(out)
        x64 = x.astype(np.float64)
        _close(out, np.cumsum(x64) if op == "add" else np.cumprod(x64))
    assert not np.allclose(results[0], results[1])


def test_symbolic_sizes_two_calls() -> None:
    """Symbolic sizes: one module over several shapes (32 x 64: the call-time specialization's multiples of 16),
    and a build with a size pinned (`sizes=`: the te graph, recurrence included, re-made with it)."""
    case = scan2d()
    mod = build(case.outs, case.args, target="cpu")
    pinned = build(case.outs, case.args, target="cpu", sizes={"m": 17})
    for shape in ((3, 5), (17, 2), (32, 64), (1, 7)):
        x = np.random.default_rng(sum(shape)).standard_normal(shape).astype(np.float32)
        out = np.full(shape, np.nan, np.float32)
        mod(x, out)
        _close(out, case.ref(x))
        if shape[0] == 17:
            out[:] = np.nan
            pinned(x, out)
            _close(out, case.ref(x))


# ----------------------------------------------------------------------------- schedules: parallel, refusals


def _loop(s: Schedule, stmt: str, name: str) -> Any:
    return next(h for h in s.loops(stmt) if h.var.name == name)


def test_parallel_over_the_other_axis_accepted_over_the_scan_axis_refused() -> None:
    case = scan2d()
    p = lower(case.outs, case.args)
    s = Schedule(p)
    s.parallel(_loop(s, "S", "i"))  # the scan axis is outside: i carries nothing
    ins, out, want = _arrays(case, 2)
    build(s, case.args, target="cpu")(*ins, out)
    _close(out, want)

    s2 = Schedule(p)
    with pytest.raises(ScheduleError) as e:
        s2.parallel(_loop(s2, "S", "t"))
    err = e.value
    assert err.kind == "flow" and err.buffer == "S" and err.source[0] == "S" and err.sink[0] == "S"
    assert err.sink[1]["t"] == err.source[1]["t"] + 1 and err.sink[1]["i"] == err.source[1]["i"]
    bad = Schedule(p, check=False)
    bad.parallel(_loop(bad, "S", "t"))
    verify_witness(p, bad.program, err)


def test_reorder_then_parallel_the_non_scan_axis_iir() -> None:
    case = iir()
    p = lower(case.outs, case.args)
    s = Schedule(p)
    y, x = _loop(s, "blur", "y"), _loop(s, "blur", "x")
    s.reorder(x, y)
    s.parallel(x)
    ins, out, want = _arrays(case, 5)
    build(s, case.args, target="cpu")(*ins, out)
    _close(out, want)
    with pytest.raises(ScheduleError) as e:
        s.parallel(y)
    verify_witness(p, _unchecked(p, lambda u: u.reorder(_loop(u, "blur", "x"), _loop(u, "blur", "y"))
                                 .parallel(_loop(u, "blur", "y"))), e.value)


def _unchecked(p: Any, steps: Callable[[Schedule], Any]) -> Any:
    u = Schedule(p, check=False)
    steps(u)
    return u.program


def test_scatter_reorder_and_parallel_refused() -> None:
    """A scatter's accesses are over-approximated: every two iterations may touch one bin."""
    case = histogram()
    p = lower(case.outs, case.args)
    s = Schedule(p)
    with pytest.raises(ScheduleError) as e:
        s.parallel(_loop(s, "h", "r"))
    assert e.value.buffer == "h" and e.value.source[0] == "h" and e.value.sink[0] == "h"
    ro, ri = s.split(_loop(s, "h", "r"), 4)  # a split keeps the order: accepted
    with pytest.raises(ScheduleError) as e2:
        s.reorder(ri, ro)
    assert e2.value.source[0] == "h" and e2.value.sink[0] == "h"
    # the two instances of the witness read and write one bin for some image: run it with both equal
    src, snk = e2.value.source[1]["r"], e2.value.sink[1]["r"]
    assert src != snk


def test_scatter_refusal_is_real_for_an_order_dependent_update() -> None:
    """The witness of a refused reorder, made concrete: with both instances sending their value to one bin,
    the unchecked reordered program computes another result (a per-bin moving average depends on the order)."""
    n, bins = te.var("n"), te.var("bins")
    idx = te.placeholder((n,), dtype="int32", name="idx")
    x = te.placeholder((n,), name="x")
    z = te.placeholder((bins,), name="z")
    a0 = te.compute((bins,), lambda b: z[b], name="a0")
    avg = te.update(a0, n, lambda r: ((idx[r],), a0[idx[r]] * 0.5 + x[r]), name="avg")
    p = lower([avg], [idx, x, z, avg])
    s = Schedule(p)
    ro, ri = s.split(_loop(s, "avg", "r"), 4)
    with pytest.raises(ScheduleError) as e:
        s.reorder(ri, ro)
    err = e.value
    assert err.buffer == "avg" and err.source[0] == "avg" and err.sink[0] == "avg"
    src, snk = err.source[1], err.sink[1]
    bad = _unchecked(p, lambda u: u.reorder(*reversed(u.split(_loop(u, "avg", "r"), 4))))
    size = int(err.params["n"])  # the witness's sizes
    assert src["r"] < snk["r"] < size  # the source runs first in the original program
    rng = np.random.default_rng(14)
    iv = np.arange(size, dtype=np.int32) % 3 + 1  # every other instance in bins 1..3
    iv[src["r"]] = iv[snk["r"]] = 0  # the witness pair: one bin
    xv = rng.standard_normal(size).astype(np.float32)
    zv = rng.standard_normal(4).astype(np.float32)
    outs = []
    for prog in (p, bad):
        out = np.full(4, np.nan, np.float32)
        interp.run(prog, iv, xv, zv, out)
        outs.append(out)
    assert not np.allclose(outs[0][0], outs[1][0])  # the bin of the witness differs
    want = zv.astype(np.float64).copy()
    for r in range(size):
        want[iv[r]] = want[iv[r]] * 0.5 + xv[r]
    _close(outs[0], want)


def test_scatter_indices_out_of_range_are_skipped() -> None:
    """A scatter index outside the buffer is not written (the bounds pass guards the store): memory-safe."""
    case = histogram()
    img = np.array([0, 3, 50, -4, 3, 10**6, 10], np.int32)
    edges = np.random.default_rng(15).integers(-5, 5, 11).astype(np.int32)
    want = 3 * np.bincount(img[(img >= 0) & (img < 11)], minlength=11) + edges
    for target in ("cpu",):
        out = np.full(11, -77, np.int32)
        build(case.outs, case.args, target=target)(img, edges, out)
        np.testing.assert_array_equal(out, want)
    low = lower_for(auto_schedule(case.outs, target="cuda").program, "cuda")
    out = np.full(11, -77, np.int32)
    interp.run(low, img, edges, out, gpu_order="reversed")
    np.testing.assert_array_equal(out, want)


# ----------------------------------------------------------------------------- compute_at of a recurrence


def test_compute_at_scan_at_the_consumer_row_loop() -> None:
    case = scan2d()
    p = lower(case.outs, case.args)
    s = Schedule(p)
    s.compute_at("S", s.loops("Y")[0])
    text = str(s.program)
    assert text.index("# S_init") < text.index("# S\n") < text.index("# Y")
    outer = next(f for f in walk(s.program.body) if isinstance(f, For))
    assert outer.var.name == "t" and {"S_init", "S", "Y"} <= {n.name for n in walk(outer) if hasattr(n, "iters")}
    ins, out, want = _arrays(case, 6)
    build(s, case.args, target="cpu")(*ins, out)
    _close(out, want)


def test_compute_at_scan_at_a_consumer_column_loop() -> None:
    case = _transposed(6, 10)
    s = Schedule(lower(case.outs, case.args))
    s.compute_at("S", s.loops("Z")[0])  # one column of S per i: the whole scan of that column
    s.parallel(s.loops("Z")[0])  # the columns are independent
    ins, out, want = _arrays(case, 8)
    build(s, case.args, target="cpu")(*ins, out)
    _close(out, want)
    rows = scan2d()
    s2 = Schedule(lower(rows.outs, rows.args))
    s2.compute_at("S", s2.loops("Y")[0])  # at the row loop: legal, but the rows stay in order
    with pytest.raises(ScheduleError) as e:
        s2.parallel(s2.loops("Y")[0])
    assert e.value.source[0] in ("S_init", "S") and e.value.sink[0] == "S" and e.value.kind == "flow"


def test_compute_at_refused_when_a_row_needs_a_later_iteration() -> None:
    X, S, _ = _scan2d()
    Z = te.compute(X.shape, lambda t, i: S[X.shape[0] - 1 - t, i], name="Z")  # reads the rows backwards
    p = lower([Z], [X, Z])
    s = Schedule(p)
    t = s.loops("Z")[0]
    with pytest.raises(ScheduleError) as e:
        s.compute_at("S", t)
    err = e.value
    assert err.primitive == "compute_at" and err.kind == "flow" and err.source[0] == "S" and err.sink[0] == "S"
    assert "<-- compute_at" in str(err) and "computes in a later iteration of loop 't'" in str(err)
    verify_witness(p, compute_at(p, "S", t.var)[0], err)
    assert s.program is p


def test_compute_at_iir_at_the_consumer_row_loop_and_refused_scatter() -> None:
    inp, blur, out_t = _iir()
    s = Schedule([out_t])
    s.compute_at(blur, s.loops("out")[0])
    a = np.random.default_rng(9).standard_normal((7, 5)).astype(np.float32)
    out = np.full((7, 5), np.nan, np.float32)
    build(s, [inp, out_t], target="cpu")(a, out)
    _close(out, _iir_ref(a))
    *_, h, hout = _histogram()
    s2 = Schedule([hout])
    with pytest.raises(ArgumentError, match="not one of its loop variables"):
        s2.compute_at(h, s2.loops("out")[0])


def test_compute_at_update_chain_refused_when_a_later_definition_overwrites_what_an_earlier_reads() -> None:
    """f = x; f[r] = f[r - 1] + f[r] (r >= 1); f[r] = 2 f[r]. Computed element by element at a consumer's loop,
    the doubling of f[i - 1] would run before the prefix step of f[i] reads it: an anti dependence, refused."""
    n = te.var("n")
    x = te.placeholder((n,), name="x")
    f0 = te.compute((n,), lambda i: x[i], name="f0")
    f1 = te.update(f0, (1, n), lambda r: ((r,), f0[r - 1] + f0[r]), name="f1")
    f2 = te.update(f1, n, lambda r: ((r,), f1[r] * 2.0), name="f")
    y = te.compute((n,), lambda i: f2[i] + 1.0, name="y")
    p = lower([y], [x, y])
    s = Schedule(p)
    i = s.loops("y")[0]
    with pytest.raises(ScheduleError) as e:
        s.compute_at("f", i)
    err = e.value
    assert err.kind == "anti" and err.source[0] == "f_u1" and err.sink[0] == "f"
    verify_witness(p, compute_at(p, "f", i.var)[0], err)


# ----------------------------------------------------------------------------- auto_schedule: cpu and cuda


def _path(prog: Any, stmt: str) -> list[For]:
    """The loops around statement `stmt`, outermost first."""
    def go(node: Any, path: list[For]) -> list[For] | None:
        if type(node).__name__ == "Store":
            return path if node.name == stmt else None
        body = getattr(node, "body", None)
        kids = body if isinstance(body, tuple) else (body, getattr(node, "then", None), getattr(node, "orelse", None))
        for k in kids:
            if k is not None:
                r = go(k, path + [node] if isinstance(node, For) else path)
                if r is not None:
                    return r
        return None

    found = go(prog.body, [])
    assert found is not None, f"no statement {stmt!r}"
    return found


def test_auto_schedule_cuda_keeps_the_scan_axis_serial_inside_a_thread() -> None:
    case = scan2d()
    s = auto_schedule(case.outs, target="cuda")
    path = _path(s.program, "S")
    assert path[-1].var.name == "t" and path[-1].kind == "serial"  # the scan axis: innermost, serial
    assert [f.thread for f in path[:-1]] == ["blockIdx.x", "threadIdx.x"]  # i split and bound outside it
    hist = _path(auto_schedule(histogram().outs, target="cuda").program, "h")  # nothing free: one thread
    assert [f.kind for f in hist] == ["thread", "serial"] and hist[0].hi == hist[0].lo + 1
    assert "recurrence" in s.plan.explain()


def test_auto_schedule_cpu_parallel_non_scan_axis() -> None:
    case = iir()
    s = auto_schedule(case.outs, target="cpu")
    # blocks of columns in parallel, the recurrence down the rows inside, the block's columns vectorized
    assert [(f.var.name, f.kind) for f in _path(s.program, "blur")] == [
        ("x_o", "parallel"), ("y", "serial"), ("x_i", "vectorize")]
    assert [f.kind for f in _path(s.program, "blur_init")] == ["parallel", "serial"]
    s2 = auto_schedule(scan2d().outs, target="cpu")
    assert [f.kind for f in _path(s2.program, "S_init")] == ["serial", "parallel"]  # not the single init row


@pytest.mark.parametrize("make", CASES, ids=lambda f: f.__name__)
def test_cuda_nvrtc_build_and_adversarial_interpreter(make: Callable[[], Case]) -> None:
    case = make()
    mod = build(case.outs, case.args, target="cuda")
    assert mod.cubin[:4] == b"\x7fELF" and "__global__" in mod.source
    s = auto_schedule(case.outs, target="cuda")
    low = lower_for(s.program, "cuda")
    assert [b.name for b in low.args] == [t.name for t in case.args]
    for order in ("reversed", "forward", 0):
        ins, out, want = _arrays(case, 11)
        interp.run(low, *ins, out, gpu_order=order)
        _close(out, want)


def test_builder_prefix_sum_maps_to_one_thread_on_cuda() -> None:
    """The hand-written prefix sum (workloads.prefix_sum, an ir.Builder program): `map_statements` runs its
    carried loop on one thread; unmapped, the CUDA target refuses it (UnboundLoopError)."""
    w = workloads.prefix_sum()
    s = map_statements(Schedule(w.built), ["S"], "cuda")
    assert [f.kind for f in _path(s.program, "S")] == ["thread", "serial"]
    mod = build(s, target="cuda")
    assert mod.cubin[:4] == b"\x7fELF"
    low = lower_for(s.program, "cuda")
    a = np.random.default_rng(12).standard_normal(23).astype(np.float32)
    got = a.copy()
    interp.run(low, got, gpu_order="reversed")
    _close(got, np.cumsum(a.astype(np.float64)))
    cpu = map_statements(Schedule(w.built), ["S"], "cpu")  # nothing free: left serial
    assert [f.kind for f in _path(cpu.program, "S")] == ["serial"]


@pytest.mark.gpu
@pytest.mark.parametrize("make", CASES, ids=lambda f: f.__name__)
def test_cuda_numerics(make: Callable[[], Case]) -> None:
    case = make()
    mod = build(case.outs, case.args, target="cuda")
    for seed in (0, 1):
        ins, out, want = _arrays(case, seed)
        mod(*ins, out)
        _close(out, want)


def _transposed(m: int, n: int) -> Case:
    X, S, _ = _scan2d()
    Z = te.compute((X.shape[1], X.shape[0]), lambda i, t: S[t, i] + 1.0, name="Z")
    return Case("transposed", [Z], [X, Z], lambda r: [r.standard_normal((m, n)).astype(np.float32)],
                lambda x: np.cumsum(x.astype(np.float64), 0).T + 1, lambda x: x.shape[::-1])


def _compute_at_cuda_schedule(case: Case) -> Schedule:
    """The scan computed at the consumer's column loop, that loop split onto blockIdx.x / threadIdx.x: each
    thread scans its column (the producer's nests and the consumer's row loop serial inside it). Binding the
    consumer's row loop instead is refused: the rows of the scan depend on each other."""
    s = Schedule(lower(case.outs, case.args))
    s.compute_at("S", s.loops("Z")[0])
    i_o, i_i = s.split(s.loops("Z")[0], 128)
    s.bind(i_o, "blockIdx.x")
    s.bind(i_i, "threadIdx.x")
    return s


def test_compute_at_scan_cuda_build_and_adversarial_interpreter() -> None:
    case = _transposed(6, 300)
    s = _compute_at_cuda_schedule(case)
    mod = build(s, case.args, target="cuda")
    assert mod.cubin[:4] == b"\x7fELF"
    low = lower_for(s.program, "cuda")
    for order in ("reversed", 0):
        ins, out, want = _arrays(case, 13)
        interp.run(low, *ins, out, gpu_order=order)
        _close(out, want)


@pytest.mark.gpu
def test_cuda_numerics_compute_at_scan() -> None:
    case = _transposed(33, 300)
    mod = build(_compute_at_cuda_schedule(case), case.args, target="cuda")
    for seed in (3, 4):
        ins, out, want = _arrays(case, seed)
        mod(*ins, out)
        _close(out, want)


# ----------------------------------------------------------------------------- refusals of te.scan / te.update


def _parts() -> tuple[Any, ...]:
    m, n = te.var("m"), te.var("n")
    X = te.placeholder((m, n), name="X")
    state = te.placeholder((m, n), name="state")
    init = te.compute((1, n), lambda _, i: X[0, i], name="init")
    return m, n, X, state, init


def test_scan_refusals() -> None:
    m, n, X, state, init = _parts()
    same_row = te.compute((m, n), lambda t, i: state[t, i] + X[t, i], name="u1")
    with pytest.raises(ArgumentError, match=r"only earlier rows"):
        te.scan(init, same_row, state)
    too_far = te.compute((m, n), lambda t, i: state[t - 2, i], name="u2")
    with pytest.raises(ArgumentError, match="2 rows back"):
        te.scan(init, too_far, state)
    ok = te.compute((m, n), lambda t, i: state[t - 1, i] + X[t, i], name="u3")
    with pytest.raises(ArgumentTypeError, match="must be a te.placeholder"):
        te.scan(init, ok, init)
    with pytest.raises(ArgumentTypeError, match="init must be a te tensor"):
        te.scan(3, ok, state)
    with pytest.raises(ArgumentError, match="does not list"):
        te.scan(init, ok, state, inputs=[])
    wide = te.compute((1, n + 1), lambda _, i: te.const(0.0, "float32"), name="wide")
    with pytest.raises(ArgumentError, match="has shape"):
        te.scan(wide, ok, state)
    as64 = te.compute((m, n), lambda t, i: te.cast("float64", state[t - 1, i]), name="u4")
    with pytest.raises(ArgumentTypeError, match="float64"):
        te.scan(init, as64, state)
    k = te.reduce_axis(n, "k")
    red = te.compute((m, n), lambda t, i: state[t - 1, i] + te.sum(X[t, k], axis=k), name="u5")
    with pytest.raises(ArgumentError, match="reduction"):
        te.scan(init, red, state)
    reads_state = te.compute((1, n), lambda _, i: state[0, i], name="init2")
    with pytest.raises(ArgumentError, match="holds nothing yet"):
        te.scan(reads_state, ok, state)


def test_update_refusals() -> None:
    n = te.var("n")
    x = te.placeholder((n,), name="x")
    f0 = te.compute((n,), lambda i: x[i], name="f0")
    with pytest.raises(ArgumentTypeError, match="redefines a te.compute"):
        te.update(x, n, lambda r: ((r,), x[r]))
    with pytest.raises(ArgumentTypeError, match=r"return \(index, value\)"):
        te.update(f0, n, lambda r: f0[r] + 1.0)
    with pytest.raises(ArgumentError, match="2 entries"):
        te.update(f0, n, lambda r: ((r, r), f0[r]))
    with pytest.raises(ArgumentTypeError, match="cast it"):
        te.update(f0, n, lambda r: ((r,), te.cast("float64", f0[r])))
    with pytest.raises(ArgumentTypeError, match="must be an integer"):
        te.update(f0, n, lambda r: ((x[r],), f0[r]))
    k = te.reduce_axis(n, "k")
    with pytest.raises(ArgumentError, match="cannot reduce inline"):
        te.update(f0, n, lambda r: ((r,), te.sum(x[k], axis=k)))
    other = te.compute((n,), lambda j: x[j], name="other")
    with pytest.raises(ArgumentError, match="loop variable of stage 'other'"):
        te.update(f0, n, lambda r: ((other.op.axis[0],), f0[r]))
    with pytest.raises(ArgumentTypeError, match="give several domains as a list"):
        te.update(f0, (n, n, n), lambda a, b, c: ((a,), f0[a]))
    with pytest.raises(ArgumentError, match="negative range"):
        te.update(f0, (3, 1), lambda r: ((r,), f0[r]))
    with pytest.raises(ArgumentTypeError, match="takes 2 index argument"):
        te.update(f0, n, lambda r, s: ((r,), f0[r]))
    k2 = te.reduce_axis(n, "k2")
    red = te.compute((), lambda: te.sum(x[k2], axis=k2), name="red")
    with pytest.raises(ArgumentError, match="is a reduction"):
        te.update(red, n, lambda r: ((), red[()] + x[r]))
