"""A masked online pass (online_softmax turns `where(mask, s, -inf)` into a guard around each key's statements)
and the CUDA pass `skip_dead_tiles`, which stops a block's key-tile loop after the last tile any of its rows may
attend to: the nest, the clipped bound, the bound's arithmetic against brute force, a loop it must leave alone,
and numerics (float64 reference, NaN-poisoned output, adversarial thread orders) at sizes the tiles do not
divide, for the causal mask and for one whose first keys are masked."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from codegen import build
from codegen.passes import lower as lower_passes
from codegen.passes.dead_tiles import _bound, skip_dead_tiles
from loopir import interp, nodes as N, te, workloads
from loopir.affine import eval_index
from loopir.nodes import For, If
from loopir.visit import walk
from schedules import Schedule, auto_schedule
from schedules import attention as attention_mod


@pytest.fixture(autouse=True)
def _simt_pass_for_float32(monkeypatch: pytest.MonkeyPatch) -> None:
    """skip_dead_tiles acts on the SIMT pass's key-tile loop, which float32 data takes with the TF32 tensor-core
    kernel off (that kernel skips dead tiles itself: tests/test_flash_tf32.py, test_flash.py)."""
    monkeypatch.setattr(attention_mod, "TF32_ATTENTION", False)


def _attention(mask: str):
    w = workloads.naive_attention(te.var("B"), te.var("n"), te.var("m"), 16, mask, scale=0.25)
    return list(w.inputs), w.outputs[0]


def _reference(q, k, v, mask: str) -> np.ndarray:
    with np.errstate(invalid="ignore"):  # rows that see no key: NaN, as in the kernel
        return workloads.naive_attention_reference(q, k, v, mask, 0.25)


def test_the_rewrite_guards_each_key_and_drops_the_where():
    args, y = _attention("causal")
    s = Schedule([y])
    s.online_softmax("mx")
    key_loop = next(f for f in walk(s.program.body) if isinstance(f, For) and f.var.name == "r2")
    assert isinstance(key_loop.body, If) and str(key_loop.body.cond) == "r2 <= i"
    assert "-inf" not in str(key_loop.body.then)  # the score inside is the unmasked one


@pytest.mark.parametrize("mask", ["causal", "late"])
def test_masked_attention_on_cuda_in_any_thread_order(mask):
    """`late` masks every key before the row: the first keys of each row are masked (the running maximum is still
    -inf when they come), which the guard skips instead of computing exp(-inf - (-inf))."""
    args, y = _attention(mask)
    s = auto_schedule([y], "cuda")
    low = lower_passes(s.program, "cuda")
    tiles = [f for f in walk(low.body) if isinstance(f, For) and f.kind == "serial"
             and any(isinstance(n, N.Barrier) for n in walk(f.body))]
    assert tiles and all("min(" in str(f.hi) for f in tiles) == (mask == "causal")
    rng = np.random.default_rng(31)
    B, n, m = 2, 70, 45  # 70 rows: two blocks of 64, the second partial; 45 keys: a partial tile of 32
    q, k, v = (rng.standard_normal((B, x, 16)).astype(np.float32) for x in (n, m, m))
    want = _reference(q, k, v, mask)
    for order in ("reversed", 1):
        got = np.full((B, n, 16), np.nan, np.float32)
        interp.run(low, q, k, v, got, gpu_order=order, sizes={"B": B, "n": n, "m": m})
        if mask == "late":  # rows past the last key attend to nothing: 0 / 0 in the reference as in the kernel
            keep = np.arange(n) < m
            assert np.isnan(got[:, ~keep]).all() == np.isnan(want[:, ~keep]).all()
            got, want_ = got[:, keep], want[:, keep]
        else:
            want_ = want
        np.testing.assert_allclose(got, want_, rtol=1e-4, atol=1e-5, err_msg=f"gpu_order={order!r}")
    assert "loopir_min(" in build(s, [*args, y], target="cuda").source
    assert f"if r2 {'<=' if mask == 'causal' else '>='} i" in s.plan.explain()


def test_the_bound_is_the_largest_tile_some_thread_needs():
    """_bound(32*ko + ki <= 64*bo + t) over ki in [0, 32), t in [0, 64) against brute force."""
    ko, ki, bo, t = (N.Var(x) for x in ("ko", "ki", "bo", "t"))
    for op in ("le", "lt"):
        u = _bound(N.compare(op, 32 * ko + ki, 64 * bo + t), ko, {ki: (0, 31), t: (0, 63)})
        cmp = (lambda a, b: a <= b) if op == "le" else (lambda a, b: a < b)
        for b in range(5):
            want = max(x for x in range(-2, 40) if any(cmp(32 * x + i, 64 * b + tt)
                                                       for i, tt in itertools.product(range(32), range(64))))
            assert eval_index(u, {bo: b}) == want, (op, b)
    assert _bound(N.compare("le", 64 * bo + t, 32 * ko), ko, {t: (0, 63)}) is None  # a lower bound on ko


def test_loops_without_a_moving_bound_are_left_alone():
    """Unmasked attention (every key is needed) and a row sum (its k tiles are needed by every row)."""
    B, n, m = te.var("B"), te.var("n"), te.var("m")
    w = workloads.naive_attention(B, n, m, 16)
    low = lower_passes(auto_schedule(list(w.outputs), "cuda").program, "cuda")
    tiles = [f for f in walk(low.body) if isinstance(f, For) and any(isinstance(x, N.Barrier) for x in walk(f.body))]
    assert tiles and not any("min(" in str(f.hi) for f in tiles)
    x = te.placeholder((te.var("n"), 64), name="x")
    r = te.reduce_axis(64, "r")
    rs = te.compute((x.shape[0],), lambda i: te.sum(x[i, r], axis=r), name="rs")
    low2 = lower_passes(auto_schedule([rs], "cuda").program, "cuda")
    assert skip_dead_tiles(low2) is low2


@pytest.mark.parametrize("mask", ["causal", "late"])
def test_masked_attention_on_the_cpu(mask):
    """The guarded pass through the LLVM target (symbolic sizes), against float64."""
    args, y = _attention(mask)
    mod = build([y], [*args, y], target="cpu")
    rng = np.random.default_rng(33)
    q, k, v = (rng.standard_normal((2, x, 16)).astype(np.float32) for x in (40, 45, 45))
    got = np.full((2, 40, 16), np.nan, np.float32)
    mod(q, k, v, got)
    np.testing.assert_allclose(got, _reference(q, k, v, mask), rtol=1e-4, atol=1e-5)
