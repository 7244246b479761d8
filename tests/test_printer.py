"""Golden tests pinning the printed form of programs, statements and expressions."""

from __future__ import annotations

import textwrap

from loopir import ir, nodes
from loopir.nodes import Allocate, Barrier, Buffer, For, If, Program, Seq, Store, Var, call, cast, select
from loopir.printer import expr_str, program_str, stmt_str


def _n() -> Var:
    return Var("n")


def test_prefix_sum_golden() -> None:
    n = _n()
    A = ir.buffer((n,), "float32", "A")
    b = ir.Builder("prefix_sum")
    with b.loop("i", 1, n) as i:
        b.store(A, (i,), A[i - 1] + A[i], name="S")
    p = b.finish([A])
    want = """\
        def prefix_sum(A: float32[n]):  # sizes: n
            for i in range(1, n):
                A[i] = A[i - 1] + A[i]  # S"""
    assert str(p) == textwrap.dedent(want)
    assert program_str(p) == str(p)


def test_kinds_bindings_guards_alloc_barrier_temps_golden() -> None:
    n = _n()
    x = Buffer("x", (n,), "float32")
    y = Buffer("y", (n,), "float32")
    t = Buffer("t", (n,), "float32")
    sh = Buffer("sh", (nodes.const(256),), "float32", "shared")
    i = Var("i")
    bx, tx = Var("bx"), Var("tx")
    coord = bx * 256 + tx
    s1 = Store("T", t, (i,), x[i] * 2.0, (i,), (coord,))
    s2 = Store("Y", y, (i,), t[i] + 1.0, (i,), (coord,))
    body = For(
        bx,
        nodes.const(0),
        (n + 255) // 256,
        Allocate(
            sh,
            Seq(
                (
                    For(tx, nodes.const(0), nodes.const(256), If(coord < n, s1), "thread", "threadIdx.x"),
                    Barrier(),
                    For(tx, nodes.const(0), nodes.const(256), If(coord < n, s2, Seq(())), "thread", "threadIdx.x"),
                )
            ),
        ),
        "thread",
        "blockIdx.x",
    )
    p = Program("k", (x, y), body, (t,), (n,))
    want = """\
        def k(x: float32[n], y: float32[n]):  # sizes: n
            t: float32[n]  # temporary
            for bx in range(0, (n + 255) // 256):  # blockIdx.x
                with allocate(float32[256], 'shared') as sh:
                    for tx in range(0, 256):  # threadIdx.x
                        if bx * 256 + tx < n:
                            t[i] = x[i] * 2.0  # T (i = bx * 256 + tx)
                    sync_threads()
                    for tx in range(0, 256):  # threadIdx.x
                        if bx * 256 + tx < n:
                            y[i] = t[i] + 1.0  # Y (i = bx * 256 + tx)
                        else:
                            pass"""
    assert program_str(p) == textwrap.dedent(want)
    marked = program_str(p, marks={bx: "<-- bind"})
    assert marked.splitlines()[2] == "    for bx in range(0, (n + 255) // 256):  # blockIdx.x  <-- bind"


def test_loop_kinds_and_marks() -> None:
    n = _n()
    A = ir.buffer((n, 4), "float32", "A")
    i, j = Var("i"), Var("j")
    s = Store("S", A, (i, j), A[i, j] + 1.0, (i, j), (i, j))
    for kind in ("parallel", "unroll", "vectorize"):
        st = For(i, nodes.const(0), n, For(j, nodes.const(0), nodes.const(4), s, kind), "serial")
        text = stmt_str(st, marks={i: "<-- here"})
        assert text == (
            f"for i in range(0, n):  <-- here\n    for j in {kind}(0, 4):\n        A[i, j] = A[i, j] + 1.0  # S"
        )


def test_binding_shows_only_rebound_iters() -> None:
    A = ir.buffer((8, 8), "float32", "A")
    i, j, io, ii = Var("i"), Var("j"), Var("io"), Var("ii")
    s = Store("S", A, (i, j), A[i, j] * 3.0, (i, j), (io * 4 + ii, j))
    assert stmt_str(s) == "A[i, j] = A[i, j] * 3.0  # S (i = io * 4 + ii)"


def test_expression_precedence() -> None:
    a, b, c = Var("a"), Var("b"), Var("c")
    assert expr_str(a - (b - c)) == "a - (b - c)"
    assert expr_str((a - b) - c) == "a - b - c"
    assert expr_str(a + (b + c)) == "a + (b + c)"
    assert expr_str((a + b) * c) == "(a + b) * c"
    assert expr_str(a + b * c) == "a + b * c"
    assert expr_str(a // 2 % 3) == "a // 2 % 3"
    assert expr_str(a // (b * c)) == "a // (b * c)"
    assert expr_str(-(a + b)) == "-(a + b)"
    assert expr_str(-a * b) == "-a * b"
    assert expr_str(a * -3) == "a * -3"
    assert expr_str(nodes.binary("max", a, b + 1)) == "max(a, b + 1)"
    assert expr_str((a < b) & (b <= c) | (a.eq(c))) == "a < b and b <= c or a == c"
    assert expr_str((a < b) & ((b <= c) | a.ne(c))) == "a < b and (b <= c or a != c)"
    assert expr_str(~(a < b)) == "not a < b"


def test_calls_casts_select_loads() -> None:
    n = _n()
    X = Buffer("X", (n, n), "float32")
    i, j = Var("i"), Var("j")
    e = select(i < j, call("exp", X[i, j]), cast("float32", i) * 0.5)
    assert expr_str(e) == "where(i < j, exp(X[i, j]), float32(i) * 0.5)"
    assert expr_str(call("erf", X[i, j] / 2.0)) == "erf(X[i, j] / 2.0)"
    assert expr_str(nodes.const(True)) == "True"
    assert expr_str(nodes.const(float("inf"), "float32")) == "inf"
    assert expr_str(-nodes.const(float("inf"), "float32")) == "-inf"
    assert str(X[i + 1, j]) == "X[i + 1, j]"


def test_empty_program_and_scalar_buffer() -> None:
    s = Buffer("s", (), "float64")
    st = Store("S", s, (), s[()] + 1.0, (), ())
    p = Program("scal", (s,), st)
    assert program_str(p) == "def scal(s: float64[()]):\n    s[()] = s[()] + 1.0  # S"
    assert program_str(Program("nothing", (), Seq(()))) == "def nothing():\n    pass"
