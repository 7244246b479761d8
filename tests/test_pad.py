"""Zero-padded reductions (codegen/passes/pad.py): a GEMM whose k tile does not divide K zero-fills its shared
tiles and runs its last k tile unguarded, one copy of the unrolled update; anything that is not exactly a sum of
products of zero-filled tiles keeps its guard. Numerics run in the GPU mode of the interpreter (threads in
adversarial orders, shared tiles NaN-filled when a block starts, so an element the fill missed poisons C)."""

from __future__ import annotations

import numpy as np
import pytest

from codegen.cuda import generate_cuda
from codegen.passes import lower
from codegen.passes.pad import pad_reductions
from loopir import interp, te
from loopir.nodes import If, Program, Store
from loopir.visit import walk
from schedules import auto_schedule

_TILES = dict(block=(16, 32), thread_tile=(4, 4), k_tile=8)


def _gemm(n, m, p, body=None, dtype="float32") -> Program:  # noqa: ANN001
    A = te.placeholder((n, p), name="A", dtype=dtype)
    B = te.placeholder((p, m), name="B", dtype=dtype)
    k = te.reduce_axis(p, "k")
    body = body or (lambda a, b: a * b)
    C = te.compute((n, m), lambda i, j: te.sum(body(A[i, k], B[k, j]), axis=k), name="C")
    return auto_schedule([C], target="cuda", gemm=_TILES).program


def _update_guards(p: Program) -> list[str]:
    """The guard conjuncts around the update statement C (as printed), over the lowered program."""
    out: list[str] = []

    def go(s, conds) -> None:  # noqa: ANN001
        if isinstance(s, Store):
            if s.name == "C":
                out.append(" and ".join(conds))
            return
        if isinstance(s, If):
            go(s.then, [*conds, str(s.cond)])
            if s.orelse is not None:
                go(s.orelse, [*conds, f"not {s.cond}"])
            return
        for c in getattr(s, "body", ()) if isinstance(getattr(s, "body", None), tuple) else \
                ([s.body] if hasattr(s, "body") else []):
            go(c, conds)

    go(p.body, [])
    return out


def _run(p: Program, n: int, m: int, kk: int, seed: int, order, dtype="float32"):  # noqa: ANN001
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((n, kk)).astype(dtype)
    B = rng.standard_normal((kk, m)).astype(dtype)
    C = np.full((n, m), np.nan, dtype=dtype)
    interp.run(p, A, B, C, gpu_order=order)
    return A.astype(np.float64), B.astype(np.float64), C


def test_untiled_k_gemm_zero_fills_its_tiles_and_drops_the_k_guard() -> None:
    p = _gemm(20, 36, 13)  # k tile 8 does not divide 13
    low = lower(p, "cuda")
    fills = sorted({s.name for s in walk(low.body) if isinstance(s, Store) and s.name.endswith("_fill")})
    assert fills == ["A_shared_fill", "B_shared_fill"]
    assert all("13" not in g for g in _update_guards(low)), _update_guards(low)  # no k bound on the update
    src = generate_cuda(low).source
    # one copy of the unrolled update, not a full-tile copy beside a guarded last tile
    assert src.count("// C\n") == 1, src
    assert "else A_shared" in src or "// A_shared_fill" in src


@pytest.mark.parametrize("order", ["reversed", "forward", 3])
def test_padded_gemm_matches_numpy_in_any_thread_order(order) -> None:  # noqa: ANN001
    for n, m, kk in [(20, 36, 13), (17, 40, 25), (16, 32, 8)]:
        low = lower(_gemm(n, m, kk), "cuda")
        A, B, C = _run(low, n, m, kk, seed=n + kk, order=order)
        assert not np.isnan(C).any()
        np.testing.assert_allclose(C, A @ B, rtol=1e-5, atol=1e-5)


def test_symbolic_k_is_padded_and_correct_at_several_sizes() -> None:
    N, M, K = te.var("N"), te.var("M"), te.var("K")
    A = te.placeholder((N, K), name="A")
    B = te.placeholder((K, M), name="B")
    k = te.reduce_axis(K, "k")
    C = te.compute((N, M), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    low = lower(auto_schedule([C], target="cuda", gemm=_TILES).program, "cuda")
    assert any(isinstance(s, Store) and s.name == "A_shared_fill" for s in walk(low.body))
    for n, m, kk in [(5, 33, 7), (16, 32, 19)]:
        a, b, c = _run(low, n, m, kk, seed=kk, order="reversed")
        np.testing.assert_allclose(c, a @ b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("what, body", [
    ("exp(a) * b: exp(0) = 1, the padding would add b", lambda a, b: te.exp(a) * b),
    ("(a + 1) * b: (0 + 1) * 0 is 0, but (0 + 1) * b is not", lambda a, b: (a + 1.0) * b),
])
def test_a_body_that_is_not_zero_at_zero_keeps_its_guard(what, body) -> None:  # noqa: ANN001
    p = _gemm(20, 36, 13, body=body)
    low = lower(p, "cuda")
    assert not any(isinstance(s, Store) and s.name.endswith("_fill") for s in walk(low.body)), what
    assert any("13" in g for g in _update_guards(low)), what
    A, B, C = _run(low, 20, 36, 13, seed=1, order="reversed")
    ref = np.exp(A) @ B if "exp" in what else (A + 1) @ B
    np.testing.assert_allclose(C, ref, rtol=1e-4, atol=1e-4)


def test_a_max_reduction_is_not_padded() -> None:
    n, m, kk = 20, 36, 13
    A = te.placeholder((n, kk), name="A")
    B = te.placeholder((kk, m), name="B")
    k = te.reduce_axis(kk, "k")
    C = te.compute((n, m), lambda i, j: te.max(A[i, k] * B[k, j], axis=k), name="C")
    p = auto_schedule([C], target="cuda", gemm=_TILES).program
    assert pad_reductions(p) is p


def test_the_pass_is_the_identity_where_the_tiles_divide() -> None:
    p = _gemm(32, 64, 32)
    assert pad_reductions(p) is p
