"""Index simplification for packed layouts (issue 20 item 9): `(no*32 + ni)//32` -> `no` and `(no*32 + ni)%32`
-> `ni` when 0 <= ni < 32 is known from the loop bounds (loopir.affine.simplify_divmod, applied to accesses by
the pass codegen/passes/simplify_indices.py on both targets), so a vectorized loop over a packed buffer (TVM's
opt_gemm packing step) reads it contiguously. The timing lives in benchmarks/opt_gemm_packing.py."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from codegen import build
from codegen.cuda.build import build_cuda
from codegen.passes import lower as lower_passes
from codegen.passes.simplify_indices import simplify_indices
from loopir import interp, te
from loopir.affine import eval_index, simplify_divmod
from loopir.nodes import Binary, Var
from loopir.printer import program_str
from loopir.visit import walk
from schedules import Schedule


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LOOPIR_CACHE_DIR", str(tmp_path / "cache"))


def _divmods(e) -> int:
    return sum(1 for n in walk(e) if isinstance(n, Binary) and n.op in ("floordiv", "mod"))


def test_simplify_divmod_packed_pair():
    no, ni = Var("no", "int64"), Var("ni", "int64")
    r = {ni: (0, 31)}
    assert str(simplify_divmod((no * 32 + ni) // 32, r)) == "no"
    assert str(simplify_divmod((no * 32 + ni) % 32, r)) == "ni"
    assert str(simplify_divmod((ni + no * 64 + 3) // 32, {ni: (0, 28)})) == "2 * no"
    assert str(simplify_divmod((ni + no * 64 + 3) % 32, {ni: (0, 28)})) == "ni + 3"


@pytest.mark.parametrize("expr_range", [
    ("(no*32 + ni)//32", (0, 32)),      # ni may reach 32: stays
    ("(no*32 + ni)%32", (-1, 31)),      # ni may be negative: stays
    ("(no*16 + ni)//32", (0, 31)),      # 16 is no multiple of 32: stays
    ("(no*32 + ni)//32", None),         # ni's range unknown: stays
])
def test_simplify_divmod_leaves_what_it_cannot_prove(expr_range):
    text, rng = expr_range
    no, ni = Var("no", "int64"), Var("ni", "int64")
    e = eval(text, {"no": no, "ni": ni})
    out = simplify_divmod(e, {} if rng is None else {ni: rng})
    assert _divmods(out) == _divmods(e)


def test_simplify_divmod_values_equal_on_random_points():
    rng = np.random.default_rng()
    a, b, c = (Var(x, "int64") for x in "abc")
    for _ in range(60):
        d = int(rng.integers(2, 9))
        ka, kb, kc, k0 = (int(x) for x in rng.integers(-3, 4, 4))
        e = a * (ka * d) + b * kb + c * (kc * d) + k0
        ranges = {b: (int(rng.integers(-2, 3)), int(rng.integers(3, 9)))}
        for op in ("floordiv", "mod"):
            x = e // d if op == "floordiv" else e % d
            y = simplify_divmod(x, ranges)
            for va, vc in itertools.product((-5, 0, 7), (-2, 3)):
                for vb in range(ranges[b][0], ranges[b][1] + 1):
                    env = {a: va, b: vb, c: vc}
                    assert eval_index(y, env) == eval_index(x, env), (x, y, env)


def _packed(n: int, bn: int = 32):
    A = te.placeholder((n, n), name="A")
    B = te.placeholder((n, n), name="B")
    k = te.reduce_axis(n, "k")
    pB = te.compute((n // bn, n, bn), lambda x, y, z: B[y, x * bn + z], name="packedB")
    C = te.compute((n, n), lambda x, y: te.sum(A[x, k] * pB[y // bn, k, y % bn], axis=k), name="C")
    return Schedule(C), [A, B, C]


def _opt_gemm_gpu(n: int, bn: int = 32):
    # one block per (row, column panel), a thread per column of the panel: yi's range 0..31 is the thread loop's
    s, args = _packed(n, bn)
    x, y, _ = s.loops("C")
    yo, yi = s.split(y, bn)
    s.bind(x, "blockIdx.x").bind(yo, "blockIdx.y").bind(yi, "threadIdx.x")
    px, py, pz = s.loops("packedB")
    s.bind(px, "blockIdx.x").bind(py, "blockIdx.y").bind(pz, "threadIdx.x")
    return s, args


def _opt_gemm(n: int, bn: int = 32):
    s, args = _packed(n, bn)
    A, B, C = args
    x, y, kk = s.loops("C")
    xo, yo, xi, yi = s.tile(x, y, bn, bn)
    ko, ki = s.split(kk, 4)
    s.reorder(xo, yo, ko, xi, ki, yi)
    return s, [A, B, C], (xo, yi)


def _gemm_data(n: int, seed: int):
    rng = np.random.default_rng(seed)
    a, b = (rng.standard_normal((n, n)).astype(np.float32) for _ in range(2))
    return a, b, np.full((n, n), np.nan, np.float32)


def _check(a, b, c):
    ref = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(c, ref, rtol=1e-4, atol=1e-4 * a.shape[0])


def test_opt_gemm_packed_access_is_contiguous_after_lowering_cpu():
    s, args, (xo, yi) = _opt_gemm(64)
    s.vectorize(yi).parallel(xo)
    assert "packedB[y // 32, k, y % 32]" in str(s)  # the schedule keeps the te index
    low = program_str(lower_passes(s.program, "cpu"))
    assert "A[x, k] * packedB[y_o, k, y_i]" in low, low
    a, b, c = _gemm_data(64, 1)
    build(s, args, target="cpu")(a, b, c)
    _check(a, b, c)


def test_simplify_indices_pass_is_identity_when_nothing_resolves():
    s, _, _ = _opt_gemm(64)
    p = s.original  # untiled: y ranges over 0..63, so y // 32 stays
    assert simplify_indices(p) is p


def test_opt_gemm_packed_cuda_source_cubin_and_adversarial_interpreter():
    s, args = _opt_gemm_gpu(64)
    mod = build_cuda(s.program, arch="sm_90")
    assert mod.cubin[:4] == b"\x7fELF"
    reads = [ln for ln in mod.source.splitlines() if "* packedB[" in ln]
    assert reads and not any("loopir_floordiv" in ln or "loopir_mod" in ln for ln in reads), reads
    for order in ("reversed", 2):
        a, b, c = _gemm_data(64, 3)
        interp.run(s.program, a, b, c, gpu_order=order)
        _check(a, b, c)


@pytest.mark.gpu
def test_opt_gemm_packed_gpu():
    s, args = _opt_gemm_gpu(64)
    a, b, c = _gemm_data(64, 4)
    build(s, args, target="cuda")(a, b, c)
    _check(a, b, c)


# ----------------------------------------------------------------------------- a vectorize that falls back says so


def _matvec(vectorize_outer: bool):
    n = 64
    A = te.placeholder((n, n), name="A")
    x = te.placeholder((n,), name="x")
    k = te.reduce_axis(n, "k")
    y = te.compute((n,), lambda i: te.sum(A[i, k] * x[k], axis=k), name="y")
    s = Schedule(y)
    i, kk = s.loops(y)
    if vectorize_outer:
        s.vectorize(i)  # its body keeps the k loop: LLVM vectorizes innermost loops only
    else:
        io, ii = s.split(i, 8)
        s.reorder(io, kk, ii).vectorize(ii)
    return s, [A, x, y]


def test_vectorize_falling_back_says_so_in_notes_explain_and_the_nest(capfd):
    s, args = _matvec(vectorize_outer=True)
    assert "    for i in vectorize(0, 64):  # not vectorized on the CPU: its body holds loop k" in str(s), str(s)
    assert any("loop i is vectorize but its body holds loop k" in n for n in s.notes), s.notes
    assert "note: loop i is vectorize but its body holds loop k" in s.explain()
    capfd.readouterr()
    mod = build(s, args, target="cpu", cache=False)
    assert "loop not vectorized" in capfd.readouterr().err  # what LLVM says, and all it says, on its own
    rng = np.random.default_rng()
    a, x = rng.standard_normal((64, 64)).astype(np.float32), rng.standard_normal(64).astype(np.float32)
    y = np.full(64, np.nan, np.float32)
    mod(a, x, y)
    np.testing.assert_allclose(y, a.astype(np.float64) @ x.astype(np.float64), rtol=1e-4, atol=1e-4)


def test_vectorize_of_an_innermost_loop_has_no_note(capfd):
    s, args = _matvec(vectorize_outer=False)
    assert "not vectorized" not in str(s) and not s.notes
    capfd.readouterr()
    build(s, args, target="cpu", cache=False)
    assert "loop not vectorized" not in capfd.readouterr().err


def test_vectorize_around_a_constant_unrolled_loop_has_no_note():
    A = te.placeholder((16, 4), name="A")
    B = te.compute((16, 4), lambda i, j: A[i, j] * 2.0, name="B")
    s = Schedule(B)
    i, j = s.loops(B)
    s.unroll(j).vectorize(i)  # the renderer unrolls j (4 <= UNROLL_EMIT_LIMIT): i is innermost for LLVM
    assert "not vectorized" not in str(s) and not s.notes
