"""Issue 20 items 4 and 7: reassociable reductions (reorder / split / tile of reduce axes among themselves),
argmax / argmin, user reducers (`te.comm_reducer`, tuple reducers) and multi-output stages.

Numerics: fresh random data, outputs poisoned with NaN (or a sentinel for integers), against numpy in float64;
CPU through LLVM, CUDA built through NVRTC and run in the adversarial GPU interpreter here, on a GPU in the
gpu-marked tests."""

from __future__ import annotations

import numpy as np
import pytest

from codegen import build
from codegen.passes import lower as lower_for
from loopir import interp, te
from loopir.errors import ArgumentError, ArgumentTypeError
from loopir.lower import lower
from loopir.visit import walk_stmts
from loopir.nodes import Store
from schedules import Schedule, auto_schedule
from schedules.errors import ScheduleError

from loopir import ir
from loopir.affine import eval_index
from witness_check import refused_step as _refused


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def _ties(shape: tuple[int, ...], seed: int) -> np.ndarray:
    # few distinct values: many ties, so "first index" matters
    return _rng(seed).integers(-2, 3, shape).astype(np.float32)


def _argmax_stage(m, n, kind="argmax", one_pass=False):
    x = te.placeholder((m, n), name="x")
    k = te.reduce_axis(n, name="k")
    fn = te.argmax if kind == "argmax" else te.argmin
    am = te.compute((m,), lambda i: fn(x[i, k], axis=k, one_pass=one_pass), name="am")
    return x, am


def _run_cpu(s, args, *arrays):
    mod = build(s, args, target="cpu")
    mod(*arrays)
    return arrays


def _interp_cuda(s, *arrays):
    prog = lower_for(s.program, "cuda")
    interp.run(prog, *arrays, gpu_order="reversed")
    return arrays


# ----------------------------------------------------------------------------- argmax / argmin


@pytest.mark.parametrize("kind", ["argmax", "argmin"])
def test_argmax_printed_nest_and_cpu_numerics_with_ties(kind):
    m, n = 9, 13
    x, am = _argmax_stage(m, n, kind)
    ext = "max" if kind == "argmax" else "min"
    text = str(lower(am))
    # two plain reductions: the extreme (lifted into am.max0), then the first index reaching it
    assert f"am.{ext}0[i] = {ext}(am.{ext}0[i], x[i, k])  # am.{ext}0" in text
    assert f"am[i] = min(am[i], where(x[i, k] == am.{ext}0[i], k, 9223372036854775807))  # am" in text
    x1, am1 = _argmax_stage(m, n, kind, one_pass=True)
    text = str(lower(am1)) + "\n"
    # one (value, index) tuple reduction: the index update reads the old value, so it is stored first
    assert f"am.{kind}0: float32[9]  # temporary" in text
    assert "am[i] = 9223372036854775807  # am_init" in text
    assert "k < am[i], k, am[i])  # am\n" in text
    assert text.index("# am\n") < text.index(f"# am.{kind}0\n")
    for seed in range(3):
        X = _ties((m, n), seed)
        want = X.argmax(1) if kind == "argmax" else X.argmin(1)
        for xx, a in ((x, am), (x1, am1)):
            out = np.full((m,), -7, np.int64)
            _run_cpu(Schedule(a), [xx, a], X, out)
            np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("one_pass", [False, True])
def test_argmax_over_two_axes_is_numpys_flat_index(one_pass):
    m, a, b = 5, 4, 6
    x = te.placeholder((m, a, b), name="x")
    k1, k2 = te.reduce_axis(a, name="k1"), te.reduce_axis(b, name="k2")
    am = te.compute((m,), lambda i: te.argmax(x[i, k1, k2], axis=[k1, k2], one_pass=one_pass), name="am")
    X = _ties((m, a, b), 4)
    out = np.full((m,), -7, np.int64)
    _run_cpu(Schedule(am), [x, am], X, out)
    np.testing.assert_array_equal(out, X.reshape(m, -1).argmax(1))


@pytest.mark.parametrize("one_pass", [False, True])
def test_argmax_reordered_reduce_axes_keeps_first_index(one_pass):
    # both forms reassociate exactly: min / max, and the lexicographic (value, index) combine of the tuple form
    m, a, b = 5, 4, 6
    x = te.placeholder((m, a, b), name="x")
    k1, k2 = te.reduce_axis(a, name="k1"), te.reduce_axis(b, name="k2")
    am = te.compute((m,), lambda i: te.argmax(x[i, k1, k2], axis=[k1, k2], one_pass=one_pass), name="am")
    s = Schedule(am)
    _, l1, l2 = s.loops(am)
    s.reorder(l2, l1)
    assert "for k2 in range(0, 6):\n            for k1 in range(0, 4):" in str(s)
    assert "reassociated" not in s.explain()  # exact: no floating-point note
    X = _ties((m, a, b), 5)
    out = np.full((m,), -7, np.int64)
    _run_cpu(s, [x, am], X, out)
    np.testing.assert_array_equal(out, X.reshape(m, -1).argmax(1))


@pytest.mark.parametrize("m, n", [(5, 7), (3, 1000)])
def test_argmax_over_a_row_bound_across_threads_cuda(m, n):
    # both reductions of the default form run across the threads of a block (bind_reduction)
    x, am = _argmax_stage(m, n)
    s = Schedule(am)
    i, k = s.loops(te.lifted(am)[0])
    s.bind(i, "blockIdx.x")
    s.bind_reduction(k, threads=64)
    i2, k2 = s.loops(am)
    s.bind(i2, "blockIdx.x")
    s.bind_reduction(k2, threads=64)
    assert "for kt2 in range(0, 64):  # threadIdx.x" in str(s)
    mod = build(s, [x, am], target="cuda")
    assert mod.cubin[:4] == b"\x7fELF" and "loopir_block_allreduce(" in mod.source
    for schedule in (s, auto_schedule([am], "cuda")):
        X = _ties((m, n), m + n)
        out = np.full((m,), -7, np.int64)
        _interp_cuda(schedule, X, out)
        np.testing.assert_array_equal(out, X.argmax(1))


def test_argmax_read_by_a_later_stage_on_both_targets():
    m, n = 7, 11
    x, am = _argmax_stage(m, n)
    y = te.compute((m,), lambda i: te.cast("float32", am[i]) + x[i, 0], name="y")
    X = _ties((m, n), 6)
    want = X.argmax(1).astype(np.float32) + X[:, 0]
    out = np.full((m,), np.nan, np.float32)
    _run_cpu(auto_schedule([y], "cpu"), [x, y], X, out)
    np.testing.assert_allclose(out, want)
    s = auto_schedule([y], "cuda")
    mod = build(s, [x, y], target="cuda")
    assert mod.cubin[:4] == b"\x7fELF"
    out = np.full((m,), np.nan, np.float32)
    _interp_cuda(s, X, out)
    np.testing.assert_allclose(out, want)


def test_argmax_refusals():
    x = te.placeholder((4, 5), name="x")
    k = te.reduce_axis(5, name="k")
    with pytest.raises(ArgumentError, match="whole body of its stage"):
        te.compute((4,), lambda i: te.argmax(x[i, k], axis=k, one_pass=True) + 1, name="bad")
    with pytest.raises(ArgumentTypeError, match="reduction axis"):
        te.argmax(x[0, 0])
    with pytest.raises(ArgumentTypeError, match="tensor"):
        te.compute((4,), lambda i: te.argmax(x, axis=k), name="bad2")
    with pytest.raises(ArgumentTypeError, match="one_pass must be True or False"):
        te.argmax(x[0, k], axis=k, one_pass=1)


def test_argmax_inside_an_expression():
    # the default form is plain reductions: it may sit anywhere in a body
    m, n = 6, 9
    x = te.placeholder((m, n), name="x")
    k = te.reduce_axis(n, name="k")
    y = te.compute((m,), lambda i: te.cast("float32", te.argmin(x[i, k], axis=k)) * 2.0 + 1.0, name="y")
    X = _ties((m, n), 3)
    out = np.full((m,), np.nan, np.float32)
    _run_cpu(Schedule(y), [x, y], X, out)
    np.testing.assert_allclose(out, X.argmin(1) * 2.0 + 1.0)


def test_bind_reduction_of_a_tuple_reduction_is_refused_clearly():
    m, n = 4, 64
    x, am = _argmax_stage(m, n, one_pass=True)
    s = Schedule(am)
    i, k = s.loops(am)
    s.bind(i, "blockIdx.x")
    with pytest.raises(ArgumentError, match="component of the tuple reduction 'am' .argmax.; no cross-thread"):
        s.bind_reduction(k)


# ----------------------------------------------------------------------------- user reducers


def test_product_comm_reducer_cpu_and_cuda_interp():
    m, n = 6, 9
    x = te.placeholder((m, n), name="x")
    k = te.reduce_axis(n, name="k")
    prod = te.comm_reducer(lambda a, b: a * b, lambda t: te.const(1, t), name="prod")
    p = te.compute((m,), lambda i: prod(x[i, k], axis=k), name="p")
    assert "p[i] = p[i] * x[i, k]  # p" in str(lower(p))
    X = (1.0 + 0.2 * _rng(7).standard_normal((m, n))).astype(np.float32)
    want = X.astype(np.float64).prod(1)
    out = np.full((m,), np.nan, np.float32)
    _run_cpu(Schedule(p), [x, p], X, out)
    np.testing.assert_allclose(out, want, rtol=1e-5)
    s = auto_schedule([p], "cuda")
    assert build(s, [x, p], target="cuda").cubin[:4] == b"\x7fELF"
    out = np.full((m,), np.nan, np.float32)
    _interp_cuda(s, X, out)
    np.testing.assert_allclose(out, want, rtol=1e-5)


def _logsumexp_pair(m, n):
    # a tuple reducer (running max, sum of exp relative to it): logsumexp in one pass
    def combine(a, b):
        (m0, s0), (m1, s1) = a, b
        mx = te.maximum(m0, m1)
        return mx, s0 * te.exp(m0 - mx) + s1 * te.exp(m1 - mx)

    lse = te.comm_reducer(combine, lambda t0, t1: (te.const(float("-inf"), t0), te.const(0.0, t1)), name="lse")
    x = te.placeholder((m, n), name="x")
    k = te.reduce_axis(n, name="k")
    mx, sm = te.compute((m,), lambda i: lse((x[i, k], te.const(1.0, "float32")), axis=k), name="r")
    y = te.compute((m,), lambda i: mx[i] + te.log(sm[i]), name="y")
    return x, mx, sm, y


def test_tuple_reducer_logsumexp_pair_orders_its_updates_and_matches_numpy():
    m, n = 5, 17
    x, mx, sm, y = _logsumexp_pair(m, n)
    assert (mx.name, sm.name) == ("r.0", "r.1")
    text = str(lower(y))
    # r.1 reads the old r.0, so it is stored first
    assert text.index("# r.1\n") < text.index("# r.0\n")
    X = (3 * _rng(8).standard_normal((m, n))).astype(np.float32)
    X64 = X.astype(np.float64)
    want = X64.max(1) + np.log(np.exp(X64 - X64.max(1, keepdims=True)).sum(1))
    out = np.full((m,), np.nan, np.float32)
    _run_cpu(Schedule(y), [x, y], X, out)
    np.testing.assert_allclose(out, want, rtol=1e-5)
    out = np.full((m,), np.nan, np.float32)
    _run_cpu(auto_schedule([y], "cpu"), [x, y], X, out)
    np.testing.assert_allclose(out, want, rtol=1e-5)


def test_tuple_reducer_whose_components_read_each_other_is_refused():
    r = te.comm_reducer(lambda a, b: (a[1] + b[0], a[0] + b[1]), (0.0, 0.0), name="swap")
    x = te.placeholder((3, 4), name="x")
    k = te.reduce_axis(4, name="k")
    with pytest.raises(ArgumentError, match="each read the old value"):
        te.compute((3,), lambda i: r((x[i, k], x[i, k]), axis=k), name="bad")


def test_comm_reducer_argument_refusals():
    with pytest.raises(ArgumentTypeError, match="combine must be a function"):
        te.comm_reducer(3, 0.0, name="r")
    r = te.comm_reducer(lambda a, b: (a[0] + b[0],), (0.0, 0.0), name="r")
    x = te.placeholder((3, 4), name="x")
    k = te.reduce_axis(4, name="k")
    with pytest.raises(ArgumentError, match="gave 1 value"):
        r((x[0, k], x[1, k]), axis=k)
    with pytest.raises(ArgumentTypeError, match="commutative must be True or False"):
        te.comm_reducer(lambda a, b: a + b, 0.0, name="r2", commutative="yes")


# ----------------------------------------------------------------------------- multi-output: layer norm stats


def _layer_norm(m, n):
    x = te.placeholder((m, n), name="x")
    k = te.reduce_axis(n, name="k")
    s1, s2 = te.compute((m,), lambda i: (te.sum(x[i, k], axis=k), te.sum(x[i, k] * x[i, k], axis=k)),
                        name="st")
    y = te.compute((m, n), lambda i, j: (x[i, j] - s1[i] / n)
                   * te.rsqrt(s2[i] / n - (s1[i] / n) * (s1[i] / n) + 1e-5), name="y")
    return x, s1, s2, y


def _ln_ref(X):
    X = X.astype(np.float64)
    return (X - X.mean(1, keepdims=True)) / np.sqrt(X.var(1, keepdims=True) + 1e-5)


def test_layer_norm_one_pass_stats_nest_and_cpu_numerics():
    m, n = 6, 33
    x, s1, s2, y = _layer_norm(m, n)
    assert s1.op is s2.op and (s1.name, s2.name) == ("st.0", "st.1")
    text = str(lower([s1, s2]))
    assert ("        for k in range(0, 33):\n            st.0[i] = st.0[i] + x[i, k]  # st.0\n"
            "            st.1[i] = st.1[i] + x[i, k] * x[i, k]  # st.1") in text
    X = _rng(9).standard_normal((m, n)).astype(np.float32)
    o1, o2 = np.full((m,), np.nan, np.float32), np.full((m,), np.nan, np.float32)
    _run_cpu(Schedule([s1, s2]), [x, s1, s2], X, o1, o2)
    np.testing.assert_allclose(o1, X.astype(np.float64).sum(1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(o2, (X.astype(np.float64) ** 2).sum(1), rtol=1e-5)
    out = np.full((m, n), np.nan, np.float32)
    _run_cpu(auto_schedule([y], "cpu"), [x, y], X, out)
    np.testing.assert_allclose(out, _ln_ref(X), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("m, n", [(5, 7), (3, 300)])
def test_layer_norm_one_pass_cuda_builds_and_runs_in_adversarial_interpreter(m, n):
    x, s1, s2, y = _layer_norm(m, n)
    s = auto_schedule([y], "cuda")
    mod = build(s, [x, y], target="cuda")
    assert mod.cubin[:4] == b"\x7fELF"
    X = _rng(m + n).standard_normal((m, n)).astype(np.float32)
    out = np.full((m, n), np.nan, np.float32)
    _interp_cuda(s, X, out)
    np.testing.assert_allclose(out, _ln_ref(X), rtol=1e-4, atol=1e-4)


def test_multi_output_refusals():
    x = te.placeholder((3, 4), name="x")
    k, k2 = te.reduce_axis(4, name="k"), te.reduce_axis(4, name="k2")
    with pytest.raises(ArgumentError, match="same reduce axes"):
        te.compute((3,), lambda i: (te.sum(x[i, k], axis=k), te.sum(x[i, k2], axis=k2)), name="bad")
    k3 = te.reduce_axis(4, name="k3")
    with pytest.raises(ArgumentError, match="mix reductions"):
        te.compute((3,), lambda i: (te.sum(x[i, k3], axis=k3), x[i, 0]), name="bad2")
    with pytest.raises(ArgumentError, match="empty tuple"):
        te.compute((3,), lambda i: (), name="bad3")


def test_elementwise_multi_output():
    x = te.placeholder((4, 5), name="x")
    a, b = te.compute((4, 5), lambda i, j: (x[i, j] + 1.0, x[i, j] * 2.0), name="ab")
    X = _rng(10).standard_normal((4, 5)).astype(np.float32)
    oa, ob = np.full((4, 5), np.nan, np.float32), np.full((4, 5), np.nan, np.float32)
    _run_cpu(Schedule([a, b]), [x, a, b], X, oa, ob)
    np.testing.assert_allclose(oa, X + 1)
    np.testing.assert_allclose(ob, X * 2)


# ----------------------------------------------------------------------------- reassociation


def _sum2(m, a, b):
    x = te.placeholder((m, a, b), name="x")
    k1, k2 = te.reduce_axis(a, name="k1"), te.reduce_axis(b, name="k2")
    s_ = te.compute((m,), lambda i: te.sum(x[i, k1, k2], axis=[k1, k2]), name="s")
    return x, s_


def test_reorder_and_tile_of_two_reduce_axes_accepted_with_numerics():
    m, a, b = 6, 10, 12
    x, s_ = _sum2(m, a, b)
    s = Schedule(s_)
    _, l1, l2 = s.loops(s_)
    s.reorder(l2, l1)
    assert "for k2 in range(0, 12):\n            for k1 in range(0, 10):" in str(s)
    assert "reorder(k2, k1) reassociated the float sum s" in s.explain()
    l2o, l1o, l2i, l1i = s.tile(l2, l1, 4, 3)
    text = str(s)
    assert "for k2_o in range(0, 3):" in text and "for k1_i in range(0, 3):" in text
    X = _rng(11).standard_normal((m, a, b)).astype(np.float32)
    out = np.full((m,), np.nan, np.float32)
    _run_cpu(s, [x, s_], X, out)
    np.testing.assert_allclose(out, X.astype(np.float64).sum((1, 2)), rtol=1e-5, atol=1e-5)
    # the reduce loops still carry the accumulation: a parallel one is refused (a race, not a reassociation)
    with pytest.raises(ScheduleError):
        s.parallel(l1o)


def _reassociated_cuda_schedule(m, a, b):
    x, s_ = _sum2(m, a, b)
    s = Schedule(s_)
    i, l1, l2 = s.loops(s_)
    s.reorder(l2, l1)
    s.tile(l2, l1, 4, 3)
    io, ii = s.split(i, 32)
    s.bind(io, "blockIdx.x")
    s.bind(ii, "threadIdx.x")
    return x, s_, s


def test_reassociated_reduction_on_cuda_builds_and_runs_in_adversarial_interpreter():
    m, a, b = 40, 10, 12
    x, s_, s = _reassociated_cuda_schedule(m, a, b)
    assert "note: reorder(k2, k1) reassociated the float sum s" in s.explain()
    assert build(s, [x, s_], target="cuda").cubin[:4] == b"\x7fELF"
    X = _rng(15).standard_normal((m, a, b)).astype(np.float32)
    out = np.full((m,), np.nan, np.float32)
    _interp_cuda(s, X, out)
    np.testing.assert_allclose(out, X.astype(np.float64).sum((1, 2)), rtol=1e-5, atol=1e-5)


def test_reassociated_reduction_stays_ordered_with_its_init_and_readers():
    # the init and the reader of the sum keep their place: moving updates before the init is still refused
    m, a, b = 4, 3, 5
    x, s_ = _sum2(m, a, b)
    y = te.compute((m,), lambda i: s_[i] * 2.0, name="y")
    s = Schedule(y)
    _, l1, l2 = s.loops(s_)
    s.reorder(l2, l1)
    X = _rng(12).standard_normal((m, a, b)).astype(np.float32)
    out = np.full((m,), np.nan, np.float32)
    _run_cpu(s, [x, y], X, out)
    np.testing.assert_allclose(out, 2 * X.astype(np.float64).sum((1, 2)), rtol=1e-5, atol=1e-5)


def test_partial_sums_read_between_updates_keep_their_order():
    # a reader between the updates (a partial sum per k1) pins them: the reorder that would run it after every
    # update is refused, with a real witness
    m, a, bb = 3, 4, 5
    x, c, p = ir.buffer((m, a, bb), name="x"), ir.buffer((m,), name="c"), ir.buffer((m, a), name="p")
    b = ir.Builder("partial")
    with b.loop("i", 0, m) as i:
        b.store(c, (i,), 0.0, name="c_init")
        with b.loop("k1", 0, a) as k1:
            with b.loop("k2", 0, bb) as k2:
                b.store(c, (i,), c[i] + x[i, k1, k2], name="c")
            b.store(p, (i, k1), c[i], name="p")
    s = Schedule(b.finish([x, c, p]))
    _, l1, l2 = s.loops("c")
    _refused(s, "reorder", l2, l1)


def test_rfactor_composes_with_reordered_reduce_axes():
    m, a, b = 5, 6, 8
    x, s_ = _sum2(m, a, b)
    s = Schedule(s_)
    _, l1, l2 = s.loops(s_)
    s.reorder(l2, l1)
    ko, ki = s.split(l2, 4)
    rf = s.rfactor(s_, ko)
    assert f"{rf.name}[" in str(s)
    X = _rng(13).standard_normal((m, a, b)).astype(np.float32)
    out = np.full((m,), np.nan, np.float32)
    _run_cpu(s, [x, s_], X, out)
    np.testing.assert_allclose(out, X.astype(np.float64).sum((1, 2)), rtol=1e-5, atol=1e-5)


def test_non_commutative_reducer_refused_with_witness_and_hint():
    m, a, b = 3, 4, 5
    x = te.placeholder((m, a, b), name="x")
    k1, k2 = te.reduce_axis(a, name="k1"), te.reduce_axis(b, name="k2")
    horner = te.comm_reducer(lambda acc, v: acc * 2.0 + v, 0.0, name="horner", commutative=False)
    h = te.compute((m,), lambda i: horner(x[i, k1, k2], axis=[k1, k2]), name="h")
    s = Schedule(h)
    _, l1, l2 = s.loops(h)
    e = _refused(s, "reorder", l2, l1)
    assert "not an associative and commutative reduction" in e.hint and "s.skew(" not in e.hint
    # the witness against the access functions: both instances are the update h, writing the same element of
    # h, the source first in the original order (k1-major) and last in the reordered one
    (st,) = [n for n in walk_stmts(s.original) if isinstance(n, Store) and n.name == "h"]
    assert e.source[0] == e.sink[0] == "h" and e.buffer == "h"
    src, snk = e.source[1], e.sink[1]
    env = lambda it: {v: it[v.name] for v in st.iters}  # noqa: E731
    el_src = tuple(eval_index(ix, env(src)) for ix in st.indices)
    el_snk = tuple(eval_index(ix, env(snk)) for ix in st.indices)
    assert el_src == el_snk == e.element
    assert (src["k1"], src["k2"]) < (snk["k1"], snk["k2"])  # original order
    assert (src["k2"], src["k1"]) > (snk["k2"], snk["k1"])  # the reorder would run the sink first
    # numerics of the ordered fold (unscheduled) against numpy: binary digits read most significant first
    X = _rng(14).integers(0, 2, (m, a, b)).astype(np.float32)
    out = np.full((m,), np.nan, np.float32)
    _run_cpu(Schedule(h), [x, h], X, out)
    w = 2.0 ** np.arange(a * b - 1, -1, -1)
    np.testing.assert_allclose(out, X.reshape(m, -1).astype(np.float64) @ w)


def test_a_recurrence_stays_refused_with_a_skew_hint():
    # A[i, j] = A[i-1, j+1] + A[i, j] is no reduction (it reads another element of its own output): its
    # interchange stays refused, with the skew hint that fits a recurrence
    from tests.test_prim_loops import stencil

    s = Schedule(stencil())
    li, lj = s.loops("S")
    e = _refused(s, "reorder", lj, li)
    assert "skew" in e.hint and "associative" not in e.hint


# ----------------------------------------------------------------------------- GPU


@pytest.mark.gpu
def test_gpu_argmax_layer_norm_and_product():
    m, n = 37, 300
    for one_pass in (False, True):
        x, am = _argmax_stage(m, n, one_pass=one_pass)
        mod = build([am], [x, am], target="cuda")
        for seed in range(2):
            X = _ties((m, n), 20 + seed)
            out = np.full((m,), -7, np.int64)
            mod(X, out)
            np.testing.assert_array_equal(out, X.argmax(1))
    x2, s1, s2, y = _layer_norm(m, n)
    mod = build([y], [x2, y], target="cuda")
    for seed in range(2):
        X = _rng(30 + seed).standard_normal((m, n)).astype(np.float32)
        out = np.full((m, n), np.nan, np.float32)
        mod(X, out)
        np.testing.assert_allclose(out, _ln_ref(X), rtol=1e-4, atol=1e-4)
    x4, s4, sched = _reassociated_cuda_schedule(m, 10, 12)
    mod = build(sched, [x4, s4], target="cuda")
    for seed in range(2):
        X = _rng(50 + seed).standard_normal((m, 10, 12)).astype(np.float32)
        out = np.full((m,), np.nan, np.float32)
        mod(X, out)
        np.testing.assert_allclose(out, X.astype(np.float64).sum((1, 2)), rtol=1e-5, atol=1e-5)
    x3, mx, sm, y3 = _logsumexp_pair(m, n)
    mod = build([y3], [x3, y3], target="cuda")
    X = (3 * _rng(40).standard_normal((m, n))).astype(np.float32)
    X64 = X.astype(np.float64)
    out = np.full((m,), np.nan, np.float32)
    mod(X, out)
    want = X64.max(1) + np.log(np.exp(X64 - X64.max(1, keepdims=True)).sum(1))
    np.testing.assert_allclose(out, want, rtol=1e-5)


def test_symbolic_sizes_multi_output_and_tuple_reducer_specialize_at_call_time():
    # call-time specialization rebuilds the te graph with the sizes (loopir.subst): one op per multi-output stage
    n_, m_ = te.var("n"), te.var("m")
    x = te.placeholder((m_, n_), name="x")
    k, k2 = te.reduce_axis(n_, name="k"), te.reduce_axis(n_, name="k2")
    s1, s2 = te.compute((m_,), lambda i: (te.sum(x[i, k], axis=k), te.sum(x[i, k] * x[i, k], axis=k)), name="st")
    am = te.compute((m_,), lambda i: te.argmax(x[i, k2], axis=k2, one_pass=True), name="am")
    mod = build([s1, s2, am], [x, s1, s2, am], target="cpu")
    for m, n in ((5, 9), (3, 20)):
        X = _ties((m, n), m * n)
        o1, o2 = np.full((m,), np.nan, np.float32), np.full((m,), np.nan, np.float32)
        oi = np.full((m,), -7, np.int64)
        mod(X, o1, o2, oi)
        np.testing.assert_allclose(o1, X.astype(np.float64).sum(1), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(o2, (X.astype(np.float64) ** 2).sum(1), rtol=1e-5)
        np.testing.assert_array_equal(oi, X.argmax(1))
    fixed = build([s1, s2, am], [x, s1, s2, am], target="cuda", sizes={"m": 5, "n": 9})
    assert fixed.cubin[:4] == b"\x7fELF"
