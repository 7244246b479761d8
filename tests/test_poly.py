"""loopir.poly: domains, dependences, schedules, violations, carried dependences, footprints."""

from __future__ import annotations

import islpy as isl
import pytest

from loopir import ir, poly, te, workloads
from loopir.nodes import For, Load, Program, Seq, binary, const
from loopir.visit import walk
from tests.test_prim_loops import matmul, stencil


def two_stage(read_offset: int) -> Program:
    """B[i] = A[i] * 2 for i < n; C[i] = B[i + off] for i < n - off."""
    n = te.var("n")
    a, bb, c = ir.buffer((n,), name="A"), ir.buffer((n,), name="B"), ir.buffer((n,), name="C")
    b = ir.Builder("two")
    with b.loop("i", 0, n) as i:
        b.store(bb, (i,), a[i] * 2.0, name="P")
    with b.loop("i2", 0, n - read_offset) as i:
        b.store(c, (i,), bb[i + read_offset], name="Q")
    return b.finish([a, bb, c])


def test_stencil_flow_dependence_exact():
    d = poly.dependences(stencil())
    expect = isl.UnionMap("[n, m] -> { S[i, j] -> S[i + 1, j - 1] : 1 <= i <= n - 2 and 1 <= j <= m - 2 }")
    assert d.flow.is_equal(expect)
    assert d.anti.is_empty() and d.output.is_empty() and d.notes == []


def test_anti_dependence_in_place():
    n = te.var("n")
    a = ir.buffer((n,), name="A")
    b = ir.Builder("shift")
    with b.loop("i", 0, n - 1) as i:
        b.store(a, (i,), a[i + 1] + 1.0, name="S")
    d = poly.dependences(b.finish([a]))
    assert d.flow.is_empty()
    assert d.anti.is_equal(isl.UnionMap("[n] -> { S[i] -> S[i + 1] : 0 <= i <= n - 3 }"))


def test_cross_statement_and_textual_order():
    p = two_stage(1)
    d = poly.dependences(p)
    assert d.flow.is_equal(isl.UnionMap("[n] -> { P[i] -> Q[i - 1] : 1 <= i < n }"))
    # swapping the two nests (textual order only) is caught: trap 3 / trap 1 would hide it
    body = p.body
    assert isinstance(body, Seq)
    swapped = Program(p.name, p.args, Seq((body.body[1], body.body[0])), p.temps, p.params)
    w = poly.find_violation(d, swapped)
    assert w is not None and w.kind == "flow" and w.buffer == "B"
    assert w.sink[1]["i2"] == w.source[1]["i"] - 1
    assert poly.find_violation(d, p) is None


def test_different_depths_common_length():
    m = matmul()
    from loopir.lower import lower

    p = lower(m)
    sched = poly.schedule_map(p)
    widths = {sched.get_map_list().get_at(k).dim(isl.dim_type.out) for k in range(sched.n_map())}
    assert widths == {7}
    d = poly.dependences(p)
    assert not d.flow.is_empty() and not d.output.is_empty()
    # C_init must precede the first update: moving the init after the reduction is illegal
    i = p.body
    assert isinstance(i, For)
    j = i.body
    assert isinstance(j, For) and isinstance(j.body, Seq)
    init, red = j.body.body
    bad = Program(p.name, p.args, For(i.var, i.lo, i.hi, For(j.var, j.lo, j.hi, Seq((red, init)))), p.temps, p.params)
    w = poly.find_violation(d, bad)
    assert w is not None and w.source[0] == "C_init" and w.buffer == "C"


def test_witness_prefers_small_sizes():
    w = poly.find_violation(poly.dependences(stencil()), _interchanged_stencil())
    assert w is not None and all(v <= 4 for v in w.params.values())


def _interchanged_stencil() -> Program:
    p = stencil()
    i = p.body
    assert isinstance(i, For) and isinstance(i.body, For)
    j = i.body
    return Program(p.name, p.args, For(j.var, j.lo, j.hi, For(i.var, i.lo, i.hi, j.body)), p.temps, p.params)


def test_non_affine_access_noted():
    n = te.var("n")
    idx = ir.buffer((n,), dtype="int64", name="idx")
    a, out = ir.buffer((n,), name="A"), ir.buffer((n,), name="O")
    b = ir.Builder("gather")
    with b.loop("i", 0, n) as i:
        b.store(out, (i,), a[idx[i]], name="G")
    d = poly.dependences(b.finish([idx, a, out]))
    assert any("G" in s and "A" in s and "non-affine" in s for s in d.notes)


def test_carried_by():
    p = stencil()
    d = poly.dependences(p)
    i, j = p.body.var, p.body.body.var  # type: ignore[attr-defined]
    w = poly.carried_by(d, p, i)
    assert w is not None and w.kind == "flow"
    assert poly.carried_by(d, p, j) is None
    pre = workloads.prefix_sum().program()
    assert poly.carried_by(poly.dependences(pre), pre, pre.body.var) is not None  # type: ignore[attr-defined]


def test_footprint_stencil5():
    p = workloads.stencil5().program()
    i = p.body
    assert isinstance(i, For)
    fp = poly.footprint(p, "out", "x", i.var)
    assert [(str(lo), str(hi)) for lo, hi in fp] == [("i", "i + 3"), ("0", "m")]
    j = i.body
    assert isinstance(j, For)
    fp = poly.footprint(p, "out", "x", j.var)
    assert [(str(lo), str(hi)) for lo, hi in fp] == [("i", "i + 3"), ("j", "j + 3")]


def test_footprint_errors():
    p = stencil()
    with pytest.raises(ValueError, match="no statement 'T'"):
        poly.footprint(p, "T", "A", p.body.var)  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="does not read buffer 'Z'"):
        poly.footprint(p, "S", "Z", p.body.var)  # type: ignore[attr-defined]


def test_dependences_cached():
    p = stencil()
    assert poly.dependences(p) is poly.dependences(p)


def test_simplify_affine_prints_cleanly():
    i, m, j = te.var("i"), te.var("m"), te.var("j")
    cases = [
        (binary("add", binary("add", binary("mul", const(-1), m), i), const(3)), "i - m + 3"),
        (-m + 3, "3 - m"),
        (-m - 1, "-m - 1"),
        (binary("add", i, binary("sub", j, j)), "i"),
        (i - (m - i), "2 * i - m"),
        (2 * (i + 1) - 2, "2 * i"),
        (binary("min", binary("min", i, i + 1), i), "min(i, i + 1)"),
        (binary("max", binary("max", const(3), i), const(5)), "max(i, 5)"),
        (binary("floordiv", i * 4 + 3 + 0, const(4)), "(4 * i + 3) // 4"),
    ]
    for e, want in cases:
        got = poly.simplify_affine(e)
        assert str(got) == want, (str(e), str(got))
        for iv, mv, jv in ((0, 0, 0), (3, 7, -2), (-5, 2, 9)):
            env = {i: iv, m: mv, j: jv}
            assert poly.eval_index(got, env) == poly.eval_index(e, env)


def test_pw_to_expr_drops_pieces_and_normalizes():
    n, i = te.var("n"), te.var("i")
    names = {"n": n, "i": i}
    pw = isl.PwAff("[n, i] -> { [(-i + n - 1)] }")
    assert str(poly.pw_to_expr(pw, names)) == "n - i - 1"
    # min(n, i + 4, i + 8) on i >= 0: i + 8 never decides the value, and is dropped
    pw = isl.PwAff("[n, i] -> { [(min(n, min(i + 4, i + 8)))] : i >= 0 }")
    assert str(poly.pw_to_expr(pw, names)) in ("min(n, i + 4)", "min(i + 4, n)")
    with pytest.raises(ValueError, match="empty"):
        poly.pw_to_expr(isl.PwAff("[n] -> { [(n)] : 1 = 0 }"), names)


def test_split_modules_keep_poly_names():
    from loopir import footprint, isl_conv, poly_model

    assert poly.footprint is footprint.footprint and poly.aff is isl_conv.aff
    assert poly.stmt_infos is poly_model.stmt_infos and poly._sanitize is isl_conv._sanitize
    for name in ("_Names", "_exists", "_witness", "NonAffine", "cond", "pw_to_expr", "time_of", "isl"):
        assert hasattr(poly, name), name


def _buffers(p: Program) -> list:
    from loopir.visit import statements

    out: dict[int, object] = {}
    for c in statements(p):
        for b in (c.store.buffer, *(n.buffer for n in walk(c.store.value) if isinstance(n, Load))):
            out.setdefault(id(b), b)
    return list(out.values())


@pytest.mark.parametrize("make", ["stencil", "two_stage", "softmax", "attention", "in_place"])
def test_dependences_through_some_buffers_are_those_of_the_whole_analysis(make):
    # a buffer's dependences depend on its own accesses and the schedule alone: the analysis restricted to each
    # buffer in turn gives, together, exactly the whole analysis (flow with its kills, anti, output)
    from schedules import auto_schedule

    if make == "stencil":
        p = stencil()
    elif make == "in_place":
        p = _interchanged_stencil()
    elif make == "two_stage":
        p = two_stage(1)
    else:
        w = workloads.SEEDS[make]()
        p = auto_schedule(list(w.outputs), target="cuda").program
    full = poly.dependences(p)
    parts = [poly.dependences(p, frozenset({b})) for b in _buffers(p)]
    for kind in ("flow", "anti", "output"):
        union = getattr(parts[0], kind)
        for d in parts[1:]:
            union = union.union(getattr(d, kind))
        assert union.is_equal(getattr(full, kind)), kind
    assert any(not getattr(d, k).is_empty() for d in parts for k in ("flow", "anti"))  # not vacuous
    assert poly.dependences(p, frozenset(_buffers(p)[:1])) is poly.dependences(p, frozenset(_buffers(p)[:1]))
