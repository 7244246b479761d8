"""Products of sizes (issue 19): a shape or bound `B * T` is a size of its own in the polyhedral model (an isl
parameter standing for the product, loopir/isl_conv.derived_size), so rows shaped (B*T, C) are analysed exactly,
scheduled (the GEMM recipe's register tile over B*T rows) and built on both targets; B and T themselves come
from other arguments' shapes or are passed (a clear error says which when neither)."""

from __future__ import annotations

import numpy as np
import pytest

from codegen import build
from codegen.passes import lower as lower_passes
from loopir import interp, poly, te
from loopir.errors import ArgumentError
from loopir.workloads import naive_attention_reference
from schedules import Schedule, auto_schedule

C, N = 16, 24


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LOOPIR_CACHE_DIR", str(tmp_path / "cache"))


def _rows():
    """Rows (B*T, C): centred by their mean, then relu(h @ w) — a row reduction and a GEMM over B*T rows."""
    B, T = te.var("B"), te.var("T")
    x, w = te.placeholder((B * T, C), name="x"), te.placeholder((C, N), name="w")
    k = te.reduce_axis(C, "k")
    mu = te.compute((B * T,), lambda r: te.sum(x[r, k] / float(C), axis=k), name="mu")
    h = te.compute((B * T, C), lambda r, c: x[r, c] - mu[r], name="h")
    rr = te.reduce_axis(C, "rr")
    mm = te.compute((B * T, N), lambda r, n: te.sum(h[r, rr] * w[rr, n], axis=rr), name="mm")
    y = te.compute((B * T, N), lambda r, n: te.maximum(mm[r, n], 0.0), name="y")
    return B, T, x, w, y


def _data(rows: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    xa, wa = rng.standard_normal((rows, C)).astype(np.float32), rng.standard_normal((C, N)).astype(np.float32)
    x64 = xa.astype(np.float64)
    return xa, wa, np.maximum((x64 - x64.mean(1, keepdims=True)) @ wa, 0)


def test_a_product_of_sizes_is_analysed_exactly():
    B, T, x, w, y = _rows()
    p = Schedule([y]).program
    deps = poly.dependences(p)
    assert deps.notes == []  # no over-approximation: B * T is one parameter
    # the parameter set of a formula names the product beside its factors
    assert "B_x_T" in str(deps.flow) or "B_x_T" in str(deps.domain)


def test_rows_of_a_product_on_the_cpu_with_the_sizes_passed():
    B, T, x, w, y = _rows()
    s = auto_schedule([y], "cpu")
    assert [g.mapping for g in s.plan.groups][-1] == "gemm"
    mod = build(s, [x, w, y, B, T], target="cpu")
    for b, t in ((2, 7), (3, 1)):
        xa, wa, want = _data(b * t, b)
        got = np.full(want.shape, np.nan, np.float32)
        mod(xa, wa, got, b, t)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_rows_of_a_product_without_the_sizes_is_a_clear_error():
    B, T, x, w, y = _rows()
    mod = build([y], [x, w, y], target="cpu")
    xa, wa, want = _data(14)
    with pytest.raises(ArgumentError, match=r"cannot infer size\(s\) B, T from argument 'x'.*B \* T"):
        mod(xa, wa, np.zeros(want.shape, np.float32))


def test_rows_of_a_product_on_cuda_gemm_and_adversarial_orders():
    B, T, x, w, y = _rows()
    s = auto_schedule([y], "cuda")
    assert [g.mapping for g in s.plan.groups][-1] == "gemm"
    mod = build(s, [x, w, y, B, T], target="cuda")
    assert mod.cubin[:4] == b"\x7fELF"
    low = lower_passes(s.program, "cuda")
    xa, wa, want = _data(2 * 7)
    for order in ("reversed", "forward", 1):
        got = np.full(want.shape, np.nan, np.float32)
        interp.run(low, xa, wa, got, gpu_order=order, sizes={"B": 2, "T": 7})
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=f"gpu_order={order!r}")


def test_attention_reading_rows_b_times_t_plus_t_builds_on_both_targets():
    # q, k, v as rows (B*T, D) of a flattened batch, read at row b*T + t (a loop variable times a size: not affine,
    # guarded and over-approximated where needed) — the form the block failed to build in
    B, T, D = te.var("B"), te.var("T"), 8
    q, k, v = (te.placeholder((B * T, D), name=n) for n in "qkv")
    rd = te.reduce_axis(D, "rd")
    s = te.compute((B, T, T), lambda b, t, u: te.sum(q[b * T + t, rd] * k[b * T + u, rd], axis=rd), name="s")
    ru = te.reduce_axis(T, "ru")
    mx = te.compute((B, T), lambda b, t: te.max(s[b, t, ru], axis=ru), name="mx")
    p = te.compute((B, T, T), lambda b, t, u: te.exp(s[b, t, u] - mx[b, t]), name="p")
    rz = te.reduce_axis(T, "rz")
    z = te.compute((B, T), lambda b, t: te.sum(p[b, t, rz], axis=rz), name="z")
    ro = te.reduce_axis(T, "ro")
    pv = te.compute((B, T, D), lambda b, t, d: te.sum(p[b, t, ro] * v[b * T + ro, d], axis=ro), name="pv")
    o = te.compute((B, T, D), lambda b, t, d: pv[b, t, d] / z[b, t], name="o")
    rng = np.random.default_rng(1)
    Bn, Tn = 2, 5
    qa, ka, va = (rng.standard_normal((Bn * Tn, D)).astype(np.float32) for _ in range(3))
    want = naive_attention_reference(*(a.reshape(Bn, Tn, D) for a in (qa, ka, va)), scale=1.0)
    got = np.full(want.shape, np.nan, np.float32)
    build([o], [q, k, v, o], target="cpu")(qa, ka, va, got)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    sched = auto_schedule([o], "cuda")
    assert build(sched, [q, k, v, o], target="cuda").cubin[:4] == b"\x7fELF"
    low = lower_passes(sched.program, "cuda")
    got = np.full(want.shape, np.nan, np.float32)
    interp.run(low, qa, ka, va, got, gpu_order="reversed", sizes={"B": Bn, "T": Tn})
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def _scaled_sizes():
    """y = x * w over (8*B, 16*T, 64) — the sizes a call-time variant gets (B = 8*B8, T = 16*T16,
    codegen.specialize) — and one over (B, T, 64) at the call's sizes."""
    B, T = te.var("B"), te.var("T")
    x = te.placeholder((8 * B, 16 * T, 64), "float16", name="x")
    w = te.placeholder((8 * B, 16 * T, 64), "float16", name="w")
    y = te.compute(x.shape, lambda i, t, c: x[i, t, c] * w[i, t, c], name="y")
    return B, T, x, w, y


def test_a_product_with_constant_factors_is_the_product_parameter_scaled():
    B, T, x, w, y = _scaled_sizes()
    s = auto_schedule([y], "cuda")
    assert "collapse" in s.explain()  # one flat grid over all three dimensions: its extent is 8*B * 16*T * 64
    assert poly.dependences(s.program).domain.is_empty() is False
    assert "B_x_T" in str(poly.dependences(s.program).domain)  # (8*B) * (16*T) is 128 * B_x_T: affine
    # each element is written by one thread of one block; the race analysis proves it once the extent is affine
    # (it lost the grid loop's bounds, then refused this kernel as a cross-block race)
    build(s, [x, w, y], target="cuda")  # lowering (race analysis) and NVRTC


def test_the_llama_swiglu_operator_specializes_at_call_sizes():
    """The variant `codegen.specialize` builds for B = 8, T = 1024 (B%8 T%16): B = 8*B8, T = 16*T16."""
    from loopir import blocks
    w = blocks.BLOCKS["llama"](C=96, H=2, dtype="float16")
    out, ins = next((o, i) for o, i in blocks.operators(w, "llama") if o.name == "swiglu")
    sp = build([out], [*ins, out], target="cuda").specializer
    key = sp.key({v: {"B": 8, "T": 1024}[v.name] for v in sp.vars})
    assert not sp.runs_generic(key)
    assert "swiglu" in sp.make(key).source
