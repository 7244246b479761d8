"""Register rows: block-per-row kernels whose every phase walks the row in the same 16-byte chunks per thread
(schedules.rows, RowParams.register_row_max) keep a row that several phases read in their threads' registers
instead of shared memory (codegen.passes.registers), proven per buffer: every access's element e has
floor(e / W) mod T equal to its threadIdx.x. Checked here: the rendered kernels (no shared row, the 16-bit rows
widened once), results against float64 on fresh data in adversarial thread orders of the lowered program and, on a
GPU, of the module; the kernels whose mapping differs keep the shared row."""

from __future__ import annotations

import numpy as np
import pytest

from codegen import build
from codegen.passes import lower as lower_passes
from codegen.passes.registers import MAX_SLOTS, promote_register_rows
from loopir import blocks, interp, te
from loopir.errors import ArgumentError
from loopir import nodes as N
from loopir import workloads as w
from loopir.visit import walk
from schedules import auto_schedule

NO_REGISTERS = {"rows": {"register_row_max": 0}}


def _kernel_text(wl, schedule=None) -> str:
    src = build(list(wl.outputs), list(wl.inputs) + list(wl.outputs), target="cuda", schedule=schedule).source
    return src[src.index('extern "C"'):]


def _reference(name: str, xs: list[np.ndarray], dtype: str) -> np.ndarray:
    from loopir.workloads import LAYERNORM_EPS, RMSNORM_EPS

    x, *p = (blocks.as_float64(a, dtype) for a in xs)
    if name == "softmax":
        e = np.exp(x - x.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)
    if name == "rmsnorm":
        return x / np.sqrt((x * x).mean(axis=1, keepdims=True) + RMSNORM_EPS) * p[0]
    mu = x.mean(axis=1, keepdims=True)
    return (x - mu) / np.sqrt(((x - mu) ** 2).mean(axis=1, keepdims=True) + LAYERNORM_EPS) * p[0] + p[1]


def _inputs(wl, m: int, n: int, dtype: str, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    shapes = [(m, n)] + [(n,)] * (len(wl.inputs) - 1)
    return [blocks.as_dtype(rng.standard_normal(s) * 2, dtype) for s in shapes]


TOL = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1.6e-2}


def check_thread_orders(program, name: str, xs: list[np.ndarray], dtype: str,
                        orders=("reversed", "forward", 7)) -> None:
    """`program` (lowered) run in the GPU interpreter on `xs` in each thread order, its output poisoned with NaN
    first, matches the float64 reference of workload `name` within TOL."""
    want = _reference(name, xs, dtype)
    for order in orders:
        got = blocks.as_dtype(np.full(xs[0].shape, np.nan), dtype)
        interp.run(program, *xs, got, gpu_order=order)
        err = np.abs(blocks.as_float64(got, dtype) - want).max() / np.abs(want).max()
        assert err < TOL[dtype], f"gpu_order={order!r}: {err}"


def _call_error(mod, wl, name: str, m: int, n: int, dtype: str, seed: int) -> float:
    """`mod` called on fresh inputs of m x n with a NaN-poisoned output: its largest error relative to float64."""
    xs = _inputs(wl, m, n, dtype, seed=seed)
    got = blocks.as_dtype(np.full((m, n), np.nan), dtype)
    mod(*xs, got)
    want = _reference(name, xs, dtype)
    return float(np.abs(blocks.as_float64(got, dtype) - want).max() / np.abs(want).max())


@pytest.mark.parametrize("name", ["softmax", "rmsnorm", "layernorm"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_a_cached_row_lives_in_registers(name, dtype):
    src = _kernel_text(getattr(w, name)(m=64, n=4096, dtype=dtype))
    assert "float x_shared_reg[32];  // local" in src  # 4096 / 128 threads: 32 elements per thread
    assert "x_shared[" not in src and "__shared__ __align__" not in src  # no shared row left
    if dtype != "float32":  # widened once at the copy: the phases read floats, no conversion or rounding back
        assert "loopir_round_" not in src
        assert "(loopir_h2f_lo(x_v.x)));  // x_shared" in src or "(loopir_bf2f_lo(x_v.x)));  // x_shared" in src
    # whole chunks: no scalar copy of the computation; each global access tests its alignment (loopir_ld16 / st16)
    assert "loopir_ld16<" in src and "loopir_st16<" in src and "} else {" not in src
    # the user's switch keeps the shared row
    assert "x_shared_reg" not in _kernel_text(getattr(w, name)(m=64, n=4096, dtype=dtype), NO_REGISTERS)


def test_a_row_the_threads_do_not_tile_keeps_one_guarded_nest_per_phase():
    """3000 = 375 chunks of 8 over 3 x 128 threads: no thread's chunks are all in range in the worst case, so no
    full-tile copy (whose test would be the constant 383 < 375) is rendered beside the guarded nest."""
    import re

    src = _kernel_text(w.softmax(m=64, n=3000, dtype="float16"))
    assert "float x_shared_reg[24];" in src
    assert not re.search(r"if \(\(\d+ < \d+\)\)", src)
    assert src.count("< 375)) {") == 4  # the copy, the two reductions' shares and the epilogue: one guard each


def test_explain_names_register_rows_and_the_threads():
    s = auto_schedule(list(w.softmax(m=4096, n=8192, dtype="float16").outputs), "cuda")
    text = s.explain()
    assert "registers" in text and "a block of 256 threads per row" in text  # 8192 elements: 32 per thread


@pytest.mark.parametrize("name, n, dtype", [("softmax", 3000, "float16"), ("rmsnorm", 1000, "float32"),
                                            ("layernorm", 2056, "bfloat16"), ("softmax", 4096, "float32")])
def test_register_rows_match_float64_in_any_thread_order(name, n, dtype):
    """Rows the threads do not tile (3000 = 375 chunks of 8 over 128 threads; 2056) included: the lowered program
    (its register arrays private to each thread in the interpreter) in reversed, forward and shuffled order."""
    m = 3
    wl = getattr(w, name)(m=m, n=n, dtype=dtype)
    s = auto_schedule(list(wl.outputs), "cuda")
    low = lower_passes(s.program, "cuda")
    regs = [a.buffer for a in walk(low.body) if isinstance(a, N.Allocate) and a.buffer.scope == "local"]
    assert [b.name for b in regs] == ["x_shared_reg"] and regs[0].dtype == "float32"
    check_thread_orders(low, name, _inputs(wl, m, n, dtype, seed=n), dtype)


def test_a_row_whose_phases_map_differently_stays_shared():
    """The pass proves ownership per buffer: with the reductions strided over the threads (element k to thread
    k mod 128) and the copy chunked (k // 8 mod 128), a thread reads elements another wrote, so the row stays in
    shared memory, and the result is still right."""
    wl = w.softmax(m=2, n=2048, dtype="float32")
    s = auto_schedule(list(wl.outputs), "cuda", rows={"register_row_max": 0})
    low = lower_passes(s.program, "cuda")
    assert promote_register_rows(low) is low
    shared = [a.buffer.name for a in walk(low.body) if isinstance(a, N.Allocate) and a.buffer.scope == "shared"]
    assert shared == ["x_shared"]
    xs = _inputs(wl, 2, 2048, "float32", seed=3)
    got = np.full((2, 2048), np.nan, np.float32)
    interp.run(low, *xs, got, gpu_order="reversed")
    assert np.abs(got - _reference("softmax", xs, "float32")).max() < 1e-6


def test_rows_beyond_the_register_budget_and_symbolic_rows_stay_shared():
    # beyond REGISTER_ROW_MAX: one block's registers cannot hold it (by default a cluster's do: test_cluster_rows)
    long = _kernel_text(w.rmsnorm(m=1024, n=32768, dtype="float16"), {"rows": {"cluster_row_max": 0}})
    assert "x_shared_reg" not in long
    from loopir import te

    n = te.var("n")
    sym = w.softmax(m=4096, n=n, dtype="float16")
    src = build(list(sym.outputs), list(sym.inputs) + list(sym.outputs), target="cuda").source
    assert "x_shared_reg" not in src  # the generic module: a symbolic row of any length is no register count
    assert MAX_SLOTS >= 32


@pytest.mark.parametrize("name, dtype, n, key", [("softmax", "float16", 3000, "n%8 int32 n<=3072"),
                                                 ("layernorm", "float32", 1000, "n%8 int32 n<=1024"),
                                                 ("rmsnorm", "bfloat16", 5008, "n%16 int32 n<=6144"),
                                                 ("softmax", "float32", 16384, "n%16 int32 n<=16384")])
def test_a_symbolic_row_bounded_by_its_call_time_class_lives_in_registers(name, dtype, n, key):
    """A module built with `te.var` sizes: the call's variant assumes its row class's bound (n <= 4096, ...), pads
    its chunk loops to that bound's constant trip counts (pad_loop) and keeps the row in registers; its lowered
    program matches float64 in reversed, forward and shuffled thread orders at a length inside the class that the
    threads do not tile. The variant refuses a call past its bound (a longer row takes another variant)."""
    from loopir import te

    mv, nv = te.var("m"), te.var("n")
    wl = getattr(w, name)(m=mv, n=nv, dtype=dtype)
    mod = build(list(wl.outputs), list(wl.inputs) + list(wl.outputs), target="cuda")
    m = 3
    xs = _inputs(wl, m, n, dtype, seed=n)
    got = blocks.as_dtype(np.full((m, n), np.nan), dtype)
    var = mod._select(mod.check((*xs, got)))
    assert mod.specializations == [f"m* {key}"]
    assert "x_shared_reg[" in var.source and "__shared__ __align__" not in var.source and "extern __shared__" \
        not in var.source
    bound = int(key.split("<=")[-1])
    (assumed,) = var.program.assume  # n <= bound, or n16 <= bound / 16 where 16 divides n
    assert str(assumed) in (f"n <= {bound}", f"n8 <= {bound // 8}", f"n16 <= {bound // 16}")
    check_thread_orders(var.program, name, xs, dtype)
    long = _inputs(wl, m, bound + 16, dtype, seed=1)
    with pytest.raises(ArgumentError, match="assumes"):
        var.check((*long, blocks.as_dtype(np.zeros((m, bound + 16)), dtype)))


@pytest.mark.parametrize("name, dtype, n, key", [("softmax", "float16", 40, "n%8 int32 n<=64"),
                                                 ("rmsnorm", "float32", 100, "n%4 int32 n<=127"),
                                                 ("layernorm", "bfloat16", 600, "n%8 int32 n<=768")])
def test_a_symbolic_warp_row_takes_the_constant_loops_of_its_class_bound(name, dtype, n, key):
    """Warp rows (a row per 2..32 lanes) of a `te.var` length: the call's variant assumes its class's bound and pads
    each lane's loops to that bound's constant trip counts, as the fixed-size kernel of the bound has them (no loop
    bound computed from n, each element guarded instead); its lowered program matches float64 in every thread
    order at a length inside the class that the lanes do not tile."""
    from loopir import te

    wl = getattr(w, name)(m=te.var("m"), n=te.var("n"), dtype=dtype)
    mod = build(list(wl.outputs), list(wl.inputs) + list(wl.outputs), target="cuda")
    m = 5
    xs = _inputs(wl, m, n, dtype, seed=n)
    var = mod._select(mod.check((*xs, blocks.as_dtype(np.full((m, n), np.nan), dtype))))
    assert mod.specializations == [f"m* {key}"]
    assert "loopir_subwarp_allreduce<" in var.source, "warp rows expected"
    loops = [line for line in var.source.splitlines() if line.lstrip().startswith("for (")]
    assert loops and all("loopir_floordiv" not in line and "n4" not in line and "n8" not in line
                         for line in loops), loops
    check_thread_orders(var.program, name, xs, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["softmax", "rmsnorm", "layernorm"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("n", [1000, 3000, 8192])
def test_gpu_register_rows_match_float64(name, dtype, n):
    m = 300
    wl = getattr(w, name)(m=m, n=n, dtype=dtype)
    mod = build(list(wl.outputs), list(wl.inputs) + list(wl.outputs), target="cuda")
    assert ("x_shared_reg" in mod.source) == (dtype == "float32" or n > 1024)  # 16-bit rows to 1024: warp rows
    for seed in (1, 2):  # repeated calls on fresh data
        err = _call_error(mod, wl, name, m, n, dtype, seed)
        assert err < TOL[dtype], (seed, err)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["softmax", "layernorm"])
@pytest.mark.parametrize("dtype, n", [("float32", 4096), ("float32", 3000), ("float16", 8192), ("bfloat16", 2056)])
@pytest.mark.parametrize("offset", [0, 3])
def test_gpu_register_rows_at_unaligned_addresses(name, dtype, n, offset):
    """Operands 4 or 2 bytes past a 16-byte boundary: every 128-bit access takes its element-wise path. (300 rows:
    fewer than 2 per SM of 8192 elements would be split over blocks.)"""
    import torch
    import torch.nn.functional as F

    from loopir.workloads import LAYERNORM_EPS

    m = 300
    wl = getattr(w, name)(m=m, n=n, dtype=dtype)
    tdt = getattr(torch, dtype)
    g = torch.Generator(device="cuda").manual_seed(n + offset)
    x = (torch.randn(m * n + offset, device="cuda", generator=g) * 3).to(tdt)[offset:].view(m, n)
    params = [torch.randn(n + offset, device="cuda", generator=g).to(tdt)[offset:] for _ in wl.inputs[1:]]
    out = torch.full((m * n + offset,), float("nan"), device="cuda", dtype=tdt)[offset:].view(m, n)
    view = (lambda t: t.view(torch.uint16)) if dtype == "bfloat16" else (lambda t: t)
    mod = build(list(wl.outputs), list(wl.inputs) + list(wl.outputs), target="cuda")
    assert "x_shared_reg" in mod.source
    mod(view(x), *(view(p) for p in params), view(out))
    torch.cuda.synchronize()
    xd, pd = x.double(), [p.double() for p in params]
    ref = torch.softmax(xd, -1) if name == "softmax" else F.layer_norm(xd, (n,), pd[0], pd[1], LAYERNORM_EPS)
    assert not torch.isnan(out).any()
    err = float((out.double() - ref).abs().max() / ref.abs().max())
    assert err < TOL[dtype], err


def test_two_cached_rows_over_the_register_budget_one_stays_shared():
    """x + p cached for a layer norm of 4096-element rows: 32 registers a row, the kernel's budget (MAX_SLOTS) holds
    one; the other stays in shared memory. Both are walked in the same chunks per thread, so no thread reads what
    another copied: place_barriers (run after the promotion dropped the copies' barriers) needs none, and the
    lowered program is right in every thread order."""
    from loopir import te

    L = 4096
    n = te.var("n")
    x, p = te.placeholder((n, L), name="x"), te.placeholder((n, L), name="p")
    h = te.compute((n, L), lambda i, j: x[i, j] + p[i, j], name="h")
    k, k2 = te.reduce_axis(L, "k"), te.reduce_axis(L, "k2")
    mu = te.compute((n,), lambda i: te.sum(h[i, k] / float(L), axis=k), name="mu")
    var = te.compute((n,), lambda i: te.sum((h[i, k2] - mu[i]) * (h[i, k2] - mu[i]) / float(L), axis=k2),
                     name="var")
    y = te.compute((n, L), lambda i, j: (h[i, j] - mu[i]) * te.rsqrt(var[i] + 1e-5), name="y")
    low = lower_passes(auto_schedule([y], "cuda", sizes={"n": 4096}).program, "cuda")
    scopes = sorted(a.buffer.scope for a in walk(low.body) if isinstance(a, N.Allocate))
    assert scopes == ["local", "shared"] and not any(isinstance(b, N.Barrier) for b in walk(low.body))
    rng = np.random.default_rng(11)
    xa, pa = (rng.standard_normal((3, L)).astype(np.float32) for _ in range(2))
    h64 = xa.astype(np.float64) + pa
    want = (h64 - h64.mean(1, keepdims=True)) / np.sqrt(h64.var(1, keepdims=True) + 1e-5)
    for order in ("reversed", "forward", 5):
        got = np.full((3, L), np.nan, np.float32)
        interp.run(low, xa, pa, got, gpu_order=order, sizes={"n": 3})
        assert np.abs(got - want).max() < 1e-5, order


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["softmax", "rmsnorm", "layernorm"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_gpu_symbolic_register_rows_match_float64_across_shapes(name, dtype):
    """One module built with `te.var` sizes, called at row lengths in several classes (divisible by 16, by 8 only,
    by nothing, the class bounds themselves) on fresh data with poisoned outputs: each call's variant (register rows
    where its class allows) matches float64, and a shorter row after a longer one takes its own variant."""
    from loopir import te

    mv, nv = te.var("m"), te.var("n")
    wl = getattr(w, name)(m=mv, n=nv, dtype=dtype)
    mod = build(list(wl.outputs), list(wl.inputs) + list(wl.outputs), target="cuda")
    for n in (3000, 4096, 16384, 5008, 1000, 777, 8192, 2056):
        err = _call_error(mod, wl, name, 67, n, dtype, seed=n)
        assert err < TOL[dtype], (n, err)
    assert any("x_shared_reg" in v.source for v in mod.specializer.variants.values())


@pytest.mark.parametrize("name, dtype, m, n, lanes", [("softmax", "float16", 37, 64, 8),
                                                      ("rmsnorm", "float16", 37, 48, 4),
                                                      ("layernorm", "bfloat16", 21, 128, 16),
                                                      ("softmax", "float32", 19, 32, 8)])
def test_short_rows_of_whole_vectors_give_each_lane_a_16_byte_access(name, dtype, m, n, lanes):
    """Warp rows shorter than 32 lanes' 16-byte vectors (a float16 row of 64: 8 vectors): as many lanes as the row
    has vectors (a power of two), each lane's accesses 128-bit, more rows per block; the row count not a multiple of
    the block's rows. The lowered program matches float64 in every thread order, outputs NaN-poisoned."""
    wl = getattr(w, name)(m=m, n=n, dtype=dtype)
    mod = build(list(wl.outputs), list(wl.inputs) + list(wl.outputs), target="cuda")
    (k,) = mod.gen.kernels
    assert [int(str(e)) for e in k.launch.block] == [lanes, 128 // lanes, 1]
    assert "LOOPIR_LD4(" in mod.source and f"loopir_subwarp_allreduce<{lanes}>" in mod.source
    check_thread_orders(mod.program, name, _inputs(wl, m, n, dtype, seed=m * n), dtype)


def test_an_integer_row_is_not_planned_as_16_byte_vectors():
    """The row mapping loads float rows 16 bytes at a time and integer rows by element: a 16-bit integer row of 64
    keeps a lane per two elements (32 lanes), where a float16 row of 64 takes one lane per 8-element vector."""
    def lanes(dt: str) -> int:
        a = te.placeholder((4096, 64), dt, name="A")
        k = te.reduce_axis(64, name="k")
        b = te.compute((4096,), lambda i: te.sum(a[i, k], axis=k), name="B")
        c = te.compute((4096, 64), lambda i, j: a[i, j] - b[i], name="C")
        (g,) = [g for g in auto_schedule([c], "cuda").plan.groups if g.strategy is not None]
        return g.strategy.lanes

    assert (lanes("int16"), lanes("float16")) == (32, 8)
