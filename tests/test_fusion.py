"""The fusion planner: groups, refusals, and the explained log with bytes before/after."""

from __future__ import annotations

import re

import numpy as np
import pytest

from loopir import te, workloads
from schedules import cost as C
from schedules.fusion import plan_fusion

# ----------------------------------------------------------------------------- the five workloads as stage chains

def sincos_chain(n=None):
    """sin(x)^2 + cos(x)^2 as five stages (the unfused baseline runs five kernels)."""
    n = te.var("n") if n is None else n
    x = te.placeholder((n,), name="x")
    s = te.compute((n,), lambda i: te.sin(x[i]), name="s")
    c = te.compute((n,), lambda i: te.cos(x[i]), name="c")
    s2 = te.compute((n,), lambda i: s[i] * s[i], name="s2")
    c2 = te.compute((n,), lambda i: c[i] * c[i], name="c2")
    y = te.compute((n,), lambda i: s2[i] + c2[i], name="y")

    def ref(xa):
        x64 = xa.astype(np.float64)
        return ((np.sin(x64) ** 2 + np.cos(x64) ** 2).astype(np.float32),)

    return [x], [y], ref


def gelu_chain(m=None, n=None):
    """The tanh GELU over a (m, n) matrix as four stages (workloads.gelu in 2-D)."""
    return from_workload(workloads.gelu(n, m=te.var("m") if m is None else m))


def horizontal2d(m=None, n=None):
    """relu, sigmoid and tanh of one (m, n) input: three independent outputs."""
    m = te.var("m") if m is None else m
    n = te.var("n") if n is None else n
    x = te.placeholder((m, n), name="x")
    r = te.compute((m, n), lambda i, j: te.maximum(x[i, j], 0.0), name="relu")
    s = te.compute((m, n), lambda i, j: te.sigmoid(x[i, j]), name="sigmoid")
    t = te.compute((m, n), lambda i, j: te.tanh(x[i, j]), name="tanh")

    def ref(xa):
        x64 = xa.astype(np.float64)
        return tuple(a.astype(np.float32) for a in (np.maximum(x64, 0), 1 / (1 + np.exp(-x64)), np.tanh(x64)))

    return [x], [r, s, t], ref


def from_workload(w):
    return list(w.inputs), list(w.outputs), w.reference


def five():
    """name -> (inputs, outputs, reference, number of stages)."""
    return {
        "sincos": (*sincos_chain(), 5),
        "gelu": (*gelu_chain(), 4),
        "horizontal": (*horizontal2d(), 3),
        "softmax": (*from_workload(workloads.softmax()), 3),
        "layernorm": (*from_workload(workloads.layernorm()), 3),
    }


# ----------------------------------------------------------------------------- groups


@pytest.mark.parametrize("name", ["sincos", "gelu", "horizontal", "softmax", "layernorm"])
@pytest.mark.parametrize("target", ["cuda", "cpu"])
def test_each_workload_is_one_kernel_fused_and_one_per_stage_unfused(name, target):
    _, outs, _, nstages = five()[name]
    plan = plan_fusion(outs, target=target)
    assert plan.kernels == 1
    unfused = plan_fusion(outs, target=target, fuse=False)
    assert unfused.kernels == nstages and not unfused.inlined
    assert all(len(g.stages) == 1 for g in unfused.groups)
    assert plan.bytes_after < plan.bytes_before or nstages == 1


def test_sincos_inlines_the_chain():
    _, (y,), _ = sincos_chain()
    plan = plan_fusion([y])
    assert sorted(t.name for t in plan.inlined) == ["c", "c2", "s", "s2"]
    (g,) = plan.groups
    assert g.stage_names == ["y"] and g.mapping == "flat"


def test_softmax_groups_reductions_with_epilogue_on_the_row_loop():
    w = workloads.softmax()
    plan = plan_fusion(list(w.outputs), target="cuda")
    (g,) = plan.groups
    assert g.stage_names == ["row_max", "row_sum", "y"] and g.depth == 1 and g.mapping == "row"
    assert not plan.inlined  # reductions are never inlined


def test_horizontal_fuses_independent_outputs():
    _, outs, _ = horizontal2d()
    plan = plan_fusion(outs)
    (g,) = plan.groups
    assert g.stage_names == ["relu", "sigmoid", "tanh"] and g.depth == 2
    assert any(d.action == "horizontal" and d.accepted for d in g.log)
    # x is read once instead of three times
    x_bytes = C.buffer_bytes(outs[0].shape, "float32", {})
    assert plan.bytes_before - plan.bytes_after == 2 * x_bytes


# ----------------------------------------------------------------------------- refusals


def test_reduction_read_at_other_points_is_not_fused():
    # colsum[j] = sum_i x[i, j]; y[i, j] = x[i, j] / colsum[j]: every row of y needs all of colsum
    m, n = te.var("m"), te.var("n")
    x = te.placeholder((m, n), name="x")
    k = te.reduce_axis(m, name="k")
    colsum = te.compute((n,), lambda j: te.sum(x[k, j], axis=k), name="colsum")
    y = te.compute((m, n), lambda i, j: x[i, j] / colsum[j], name="y")
    plan = plan_fusion([y])
    assert plan.kernels == 2
    text = plan.explain()
    assert "do not fuse colsum, y" in text and "recompute the reduction" in text
    assert "colsum[j]" in text


def test_expensive_recompute_is_not_inlined():
    # probs is read once per output column of `out`: inlining would recompute exp d times
    w = workloads.attention()
    plan = plan_fusion(list(w.outputs), sizes={"n": 1024, "m": 1024, "d": 128})
    assert "probs" not in [t.name for t in plan.inlined]
    assert re.search(r"- do not inline probs: each element would be recomputed", plan.explain())


def test_cheap_recompute_is_inlined():
    # a stencil reading an elementwise producer at 3 points: recomputing x*2 is cheaper than a round trip
    n = te.var("n")
    x = te.placeholder((n,), name="x")
    b = te.compute((n,), lambda i: x[i] * 2.0, name="b")
    c = te.compute((n - 2,), lambda i: b[i] + b[i + 1] + b[i + 2], name="c")
    plan = plan_fusion([c])
    assert [t.name for t in plan.inlined] == ["b"]
    assert "recomputed" in plan.explain()


def test_row_cache_refused_when_symbolic_or_too_big_and_accepted_when_it_fits():
    sym = plan_fusion(list(workloads.softmax().outputs), target="cuda")
    assert "do not cache x" in sym.explain() and "symbolic" in sym.explain()
    # a row of 256 KB: over any block's shared memory (a thread-block cluster's registers hold it by default)
    big = plan_fusion(list(workloads.softmax(n=65536).outputs), target="cuda", rows={"cluster_row_max": 0})
    assert not big.groups[0].caches and "exceeds" in big.explain()
    assert plan_fusion(list(workloads.softmax(n=65536).outputs), target="cuda").groups[0].strategy.cluster == 4
    small = plan_fusion(list(workloads.softmax(n=1024).outputs), target="cuda")
    (c,) = small.groups[0].caches
    assert c.tensor.name == "x" and c.scope == "shared" and c.nbytes == 4096
    assert "+ cache x" in small.explain()
    assert not plan_fusion(list(workloads.softmax(n=1024).outputs), target="cpu").groups[0].caches


def test_different_iteration_spaces_are_not_fused_horizontally():
    n, m = te.var("n"), te.var("m")
    a = te.placeholder((n,), name="a")
    b = te.placeholder((m,), name="b")
    ya = te.compute((n,), lambda i: a[i] + 1.0, name="ya")
    yb = te.compute((m,), lambda i: b[i] + 1.0, name="yb")
    plan = plan_fusion([ya, yb])
    assert plan.kernels == 2
    assert "iteration spaces differ" in plan.explain()


# ----------------------------------------------------------------------------- explain


@pytest.mark.parametrize("name", ["sincos", "gelu", "horizontal", "softmax", "layernorm"])
def test_explain_mentions_every_stage_and_consistent_bytes(name):
    ins, outs, _, _ = five()[name]
    sizes = {"n": 512, "m": 64}
    plan = plan_fusion(outs, target="cuda", sizes=sizes)
    text = plan.explain()
    for t in plan.stage_order + ins:
        assert t.name in text
    # the numbers printed are the cost model's: before = one kernel per stage, after = per group
    ev = dict(sizes)
    before = 0
    for t in plan.stage_order:
        before += sum(C.buffer_bytes(u.shape, u.dtype, ev) for u in {id(u): u for u in t.op.inputs}.values())
        before += C.buffer_bytes(t.shape, t.dtype, ev)
    assert plan.bytes_before == before
    assert f"before {C.fmt_bytes(before)} ({before:,} B" in text
    after = plan.bytes_after
    assert after == sum(g.cost.bytes for g in plan.groups)
    assert f"after {C.fmt_bytes(after)} ({after:,} B, 1 kernel)" in text
    # after fusion: read every input once, write every output once (plus row-sized temporaries)
    io = sum(C.buffer_bytes(t.shape, t.dtype, ev) for t in ins + outs)
    assert io <= after <= io + 2 * 4 * 64
    assert plan.time_after <= plan.time_before


def test_explain_softmax_refuses_inlining_reductions():
    text = plan_fusion(list(workloads.softmax().outputs)).explain()
    assert "- do not inline row_max" in text and "- do not inline row_sum" in text
    assert "+ fuse row_max, row_sum" in text
    assert text.count("kernel ") == 1


# ----------------------------------------------------------------------------- misuse


def test_bad_inputs_are_refused_naming_the_thing():
    x = te.placeholder((4,), name="xin")
    with pytest.raises(ValueError, match="xin"):
        plan_fusion([x])
    y = te.compute((4,), lambda i: x[i] + 1.0, name="yout")
    with pytest.raises(ValueError, match="tpu"):
        plan_fusion([y], target="tpu")
    with pytest.raises(TypeError, match="str"):
        plan_fusion(["yout"])
    with pytest.raises(ValueError, match="no outputs"):
        plan_fusion([])
