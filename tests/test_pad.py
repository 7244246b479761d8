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


def _user_gemm(n, m, kk, dtype: str, mode: str):  # noqa: ANN001, ANN202
    """relu(A @ B + bias) as a user writes it (float16: float32 accumulation, cast back)."""
    N, M, K = (te.var("N"), te.var("M"), te.var("K")) if mode == "sym" else (n, m, kk)
    a = te.placeholder((N, K), name="A", dtype=dtype)
    b = te.placeholder((K, M), name="B", dtype=dtype)
    bias = te.placeholder((M,), name="bias", dtype=dtype)
    k = te.reduce_axis(K, "k")
    half = dtype == "float16"

    def f32(x):  # noqa: ANN001, ANN202
        return te.cast("float32", x) if half else x

    c = te.compute((N, M), lambda i, j: te.sum(f32(a[i, k]) * f32(b[k, j]), axis=k), name="C")

    def epilogue(i, j):  # noqa: ANN001, ANN202
        y = te.maximum(c[i, j] + f32(bias[j]), 0.0)
        return te.cast("float16", y) if half else y

    d = te.compute((N, M), epilogue, name="D")
    return [d], [a, b, bias, d]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("mode", ["fixed", "sym"])
def test_padded_gemms_on_the_gpu_match_float64(dtype, mode) -> None:  # noqa: ANN001
    # the user's path (auto-scheduled, default tiles, fused bias + ReLU) at sizes no tile divides, NaN-poisoned output
    from codegen import build

    for n, m, kk in [(130, 70, 99), (130, 200, 99), (33, 257, 1001), (200, 136, 64)]:
        outs, args = _user_gemm(n, m, kk, dtype, mode)
        mod = build(outs, args, target="cuda")
        rng = np.random.default_rng(n + kk)
        A = rng.standard_normal((n, kk)).astype(dtype)
        B = rng.standard_normal((kk, m)).astype(dtype)
        Bi = rng.standard_normal(m).astype(dtype)
        D = np.full((n, m), np.nan, dtype=dtype)
        mod(A, B, Bi, D)
        ref = np.maximum(A.astype(np.float64) @ B.astype(np.float64) + Bi.astype(np.float64), 0)
        err = float(np.max(np.abs(D.astype(np.float64) - ref)) / np.max(np.abs(ref)))
        assert np.isfinite(D).all() and err < (2e-3 if dtype == "float16" else 1e-5), (n, m, kk, err)


def test_the_users_untiled_gemm_is_padded_in_both_dtypes() -> None:
    for dtype in ("float32", "float16"):
        outs, args = _user_gemm(130, 200, 99, dtype, "fixed")  # (N below one block tile: a clipped hull, no padding)
        low = lower(auto_schedule(outs, target="cuda").program, "cuda")
        assert {s.name for s in walk(low.body) if isinstance(s, Store) and s.name.endswith("_fill")} == \
            {"A_shared_fill", "B_shared_fill"}, dtype


# --------------------------------------------------------------------- tensor cores: a K that 32 does not divide


def _mma_loops(p: Program) -> list:
    from loopir.nodes import For

    return [f for f in walk(p.body) if isinstance(f, For) and f.kind.startswith("mma.")]


@pytest.mark.parametrize("k", [72, "sym"])
def test_tensor_core_gemm_with_an_untiled_k_runs_its_last_k_tile_zero_padded(k) -> None:
    from loopir import workloads as W

    # symbolic: K = 8 * k8, as call-time specialization substitutes a K that 8 divides
    w = W.matmul_bias_relu(n=200, m=136, p=k if k != "sym" else 8 * te.var("k8"), dtype="float16")
    s = auto_schedule(list(w.outputs), target="cuda", gemm={"wgmma": False})  # the mma.sync recipe's k pipeline
    assert "tensorize" in [t["primitive"] for t in s.trace]  # K % 32 != 0 no longer keeps it off tensor cores
    other = W.matmul_bias_relu(n=200, m=136, p=36, dtype="float16")  # rows of A off 16-byte boundaries: SIMT
    assert "tensorize" not in [t["primitive"] for t in auto_schedule(list(other.outputs), target="cuda").trace]
    low = lower(s.program, "cuda")
    nests = _mma_loops(low)  # (full-tile versioning may give the edge tiles a copy of the nest)
    guards = [str(n.cond) for f in nests for n in walk(f) if isinstance(n, If)]
    assert nests and not any("k_o" in g for g in guards), guards  # no k guard: the tiles past K are zeros
    assert {st.name for st in walk(low.body) if isinstance(st, Store) and st.name.endswith("_fill")} == \
        {"A_shared_fill", "B_shared_fill"}
    assert "mma.sync" in generate_cuda(low).source


def test_tensorize_keeps_refusing_a_k_guard_the_pipeline_did_not_remove() -> None:
    # the lowered nest must have no k guard: rendering a tensorized nest that still has one is refused by name
    from loopir import workloads as W
    from schedules.primitives.tensorize import TensorizeError, mma_operands

    w = W.matmul_bias_relu(n=200, m=136, p=72, dtype="float16")
    s = auto_schedule(list(w.outputs), target="cuda", gemm={"wgmma": False})
    mma = _mma_loops(s.program)[0]  # scheduled, not lowered: the k guard is still there
    lanes = {f.var: f for f in walk(s.program.body) if getattr(f, "thread", None) == "threadIdx.x"}
    with pytest.raises(TensorizeError, match="guarded on k .* zeros in the shared tiles"):
        mma_operands(mma, lanes, what="CUDA mma")
    assert mma_operands(mma, lanes, k_guard=True).k is not None


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_tensor_core_gemms_with_untiled_k_on_the_gpu_match_float64(dtype) -> None:
    from codegen import build
    from loopir import workloads as W
    from loopir.dtypes import from_bfloat16, to_bfloat16

    def cast(x):  # noqa: ANN001, ANN202
        return to_bfloat16(x) if dtype == "bfloat16" else x.astype(dtype)

    def f64(x):  # noqa: ANN001, ANN202
        return (from_bfloat16(x) if dtype == "bfloat16" else x).astype(np.float64)

    ws = W.matmul_bias_relu(dtype=dtype)
    sym = build(list(ws.outputs), list(ws.args), target="cuda")  # K = 72, 1000: its %8 variants, on tensor cores
    for n, m, kk in [(200, 136, 72), (256, 256, 1000), (130, 260, 33)]:  # 33: SIMT (rows of A off 16 bytes)
        w = W.matmul_bias_relu(n=n, m=m, p=kk, dtype=dtype)
        fixed = build(list(w.outputs), list(w.args), target="cuda")
        rng = np.random.default_rng(kk)
        a, b, bias = (cast(rng.standard_normal(x)) for x in ((n, kk), (kk, m), (m,)))
        ref = np.maximum(f64(a) @ f64(b) + f64(bias), 0)
        for mod in (fixed, sym):
            out = cast(np.full((n, m), np.nan))
            mod(a, b, bias, out)
            err = float(np.max(np.abs(f64(out) - ref)) / np.max(np.abs(ref)))
            assert np.isfinite(f64(out)).all() and err < 2e-2, (n, m, kk, err)
