"""Split-K for skinny GEMMs (issue 11, part 5): `rfactor(..., factor_axis=0)`, the recipes' `split_k` (SIMT and
tensor cores), the planner's skinny tiles, the memory-safety refusal of tensor-core tiles larger than the matrix,
and the call-time class of a matmul's rows. Numerics against float64 on fresh random data, outputs poisoned with
NaN, under the adversarial GPU interpreter (threads in reverse and forward order); device runs are gpu-marked."""

from __future__ import annotations

import numpy as np
import pytest

from codegen import build
from codegen.passes import lower as lower_cuda
from codegen.specialize import SKINNY_CLASSES, skinny_class
from loopir import blocks, interp, te
from loopir import workloads as w
from loopir.errors import ArgumentError, ArgumentTypeError
from loopir.nodes import Store
from loopir.visit import walk
from schedules import Schedule, auto_schedule
from schedules.errors import ScheduleError
from schedules.recipes import schedule_gemm_cuda
from schedules.recipes.gemm_mma import schedule_gemm_mma

SIMT = dict(block=(4, 32), thread_tile=(2, 1), k_tile=8)


def _data(n, m, p, dtype="float32", seed=0):
    rng = np.random.default_rng(seed)
    a, b, bias = (rng.standard_normal(s).astype(dtype) for s in ((n, p), (p, m), (m,)))
    ref = np.maximum(a.astype(np.float64) @ b.astype(np.float64) + bias.astype(np.float64), 0.0)
    return (a, b, bias), ref


def _interp(prog, n, m, p, dtype="float32", seed=0, sizes=None):
    args, ref = _data(n, m, p, dtype, seed)
    for order in ("reversed", "forward"):
        out = np.full((n, m), np.nan, dtype)
        interp.run(prog, *args, out, gpu_order=order, **({"sizes": sizes} if sizes else {}))
        err = np.abs(out.astype(np.float64) - ref).max() / np.abs(ref).max()
        assert not np.isnan(out).any() and err < (2e-2 if dtype == "float16" else 1e-5), (order, err)


# ----------------------------------------------------------------------------- rfactor's factor_axis


def test_rfactor_factor_axis_first_makes_the_chunks_a_batch():
    wl = w.matmul_bias_relu(n=3, m=10, p=20)
    s = Schedule(list(wl.outputs))
    _, _, k = s.loops("matmul")
    ko, _ = s.split(k, 8)
    part = s.rfactor("matmul", ko, factor_axis=0)
    assert [str(d) for d in part.shape] == ["3", "3", "10"]  # (chunks, rows, columns)
    upd = next(x for x in walk(s.program.body) if isinstance(x, Store) and x.name == part.name)
    assert [v.name for v in upd.iters][:3] == [str(x) for x in upd.indices]  # the chunk loop outermost
    assert [h.name for h in s.loops(part.name)][0].startswith("k_o")
    out = np.full((3, 10), np.nan, np.float32)
    args, ref = _data(3, 10, 20, seed=4)
    interp.run(s.program, *args, out)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
    assert s.trace[-1]["kwargs"] == {"factor_axis": 0}


def test_rfactor_factor_axis_out_of_range_or_not_an_int_is_refused():
    wl = w.matmul_bias_relu(n=3, m=10, p=20)
    s = Schedule(list(wl.outputs))
    _, _, k = s.loops("matmul")
    ko, _ = s.split(k, 8)
    with pytest.raises(ArgumentError, match="factor_axis 3 is out of range .* 3 dimensions"):
        s.rfactor("matmul", ko, factor_axis=3)
    with pytest.raises(ArgumentTypeError, match="factor_axis must be an int"):
        s.rfactor("matmul", ko, factor_axis="0")


# ----------------------------------------------------------------------------- the recipes


@pytest.mark.parametrize(("n", "m", "p", "chunk"), [(5, 40, 100, 32), (1, 33, 64, 16), (4, 64, 48, 24)])
def test_simt_split_k_matches_numpy_in_any_thread_order(n, m, p, chunk):
    """Ragged chunks (100 = 3 x 32 + 4), edge tiles (5 rows in blocks of 4, 33 columns), one row."""
    wl = w.matmul_bias_relu(n=n, m=m, p=p)
    s = Schedule(list(wl.outputs))
    plan = schedule_gemm_cuda(s, "matmul", **SIMT, split_k=chunk)
    assert "rfactor(matmul" in plan.explain() and "the combine" in plan.explain()
    low = lower_cuda(s.program, "cuda")
    assert sum(1 for x in walk(low.body) if type(x).__name__ == "Kernel") == 2
    _interp(low, n, m, p, seed=n)


def test_simt_split_k_at_symbolic_sizes():
    wl = w.matmul_bias_relu(n=te.var("n"), m=te.var("m"), p=te.var("p"))
    s = Schedule(list(wl.outputs))
    schedule_gemm_cuda(s, "matmul", **SIMT, split_k=16)
    low = lower_cuda(s.program, "cuda")
    for n, m, p in [(3, 40, 50), (8, 32, 16)]:
        _interp(low, n, m, p, seed=p, sizes={"n": n, "m": m, "p": p})


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_tensor_core_split_k_matches_numpy(dtype):
    n, m, p = 20, 72, 96  # two blocks of 16 rows (the second 4), 72 = 64 + 8 columns, chunks of 32
    wl = w.matmul_bias_relu(n=n, m=m, p=p, dtype=dtype)
    s = Schedule(list(wl.outputs))
    plan = schedule_gemm_mma(s, "matmul", block=(16, 64), warp=(16, 32), k_tile=16, split_k=32)
    assert "rfactor(matmul" in plan.explain() and "tensorize" in plan.explain()
    _interp(lower_cuda(s.program, "cuda"), n, m, p, dtype, seed=7)


def test_split_k_bad_arguments_are_refused():
    wl = w.matmul_bias_relu(n=4, m=32, p=64)
    with pytest.raises(ArgumentError, match="split_k must be a positive multiple of k_tile \\(8\\), got 12"):
        schedule_gemm_cuda(Schedule(list(wl.outputs)), "matmul", **SIMT, split_k=12)
    a = te.placeholder((2, 4, 16), name="a")
    b = te.placeholder((2, 16, 8), name="b")
    k = te.reduce_axis(16, "k")
    c = te.compute((2, 4, 8), lambda z, i, j: te.sum(a[z, i, k] * b[z, k, j], axis=k), name="c")
    with pytest.raises(ArgumentError, match="split_k takes a plain 2-d matmul; 'c' has 1 batch loop"):
        schedule_gemm_cuda(Schedule([c]), "c", **SIMT, split_k=8)


def test_tensor_core_tiles_larger_than_the_matrix_are_refused():
    """Memory safety: the fragments read whole tiles, the shared tile is clipped to the 16-row matrix."""
    wl = w.matmul_bias_relu(n=16, m=128, p=64, dtype="float16")
    s = Schedule(list(wl.outputs))
    with pytest.raises(ArgumentError, match="shared tile of 'A' is 16 x 32, smaller than the 64 x 32 tile"):
        schedule_gemm_mma(s, "matmul", block=(64, 64), warp=(32, 32), k_tile=32)


def test_forced_tensor_cores_fit_their_tiles_to_a_small_matrix():
    wl = w.matmul_bias_relu(n=16, m=40, p=64, dtype="float16")
    s = auto_schedule(list(wl.outputs), target="cuda", gemm={"tensor_cores": True})
    assert "tiles {'block': (16, 32), 'warp': (16, 32)" in s.plan.explain()
    _interp(lower_cuda(s.program, "cuda"), 16, 40, 64, "float16", seed=2)


# ----------------------------------------------------------------------------- the planner and the call-time key


@pytest.mark.parametrize(("dtype", "rows", "tensor"), [("float32", 16, False), ("float16", 16, True),
                                                        ("float16", 8, False), ("float32", 1, False)])
def test_planner_splits_skinny_gemms_and_costs_the_partials(dtype, rows, tensor):
    wl = w.matmul_bias_relu(n=rows, m=4096, p=4096, dtype=dtype)
    s = auto_schedule(list(wl.outputs), target="cuda")
    text = s.plan.explain()
    assert "split-K" in text and "rfactor(matmul" in text and "matmul_rf" in text
    assert ("mma.sync" in text) == tensor
    g = s.plan.groups[0]
    assert g.cost.launches == 2 and g.cost.writes["matmul_rf"] == g.cost.reads["matmul_rf"] > 0


def test_two_matmuls_of_the_same_rows_key_them_once():
    blk = blocks.mlp(B=te.var("B"), T=te.var("T"), C=64)
    sp = build(list(blk.outputs), list(blk.args), target="cuda").specializer
    sizes = {v: {"B": 2, "T": 5}[v.name] for v in sp.vars}
    key = sp.key(sizes)
    # T once (both matmuls' rows); B once, a linear layer's batches (2 x 5 rows in all: few, class 2)
    assert [n for n, _ in key.rows] == ["T", "B"] and dict(key.rows) == {"T": 8, "B": 4}
    assert sum("T=5: matmul rows <= 8" in line for line in sp.explain(key, sizes)) == 1
    assert sum("B=2: a linear layer's batches, 4 at most" in line for line in sp.explain(key, sizes)) == 1


def test_skinny_classes_key_the_rows_of_a_symbolic_matmul():
    wl = w.matmul_bias_relu(n=te.var("n"), m=te.var("m"), p=te.var("p"))
    mod = build(list(wl.outputs), list(wl.inputs) + list(wl.outputs), target="cuda")
    sp = mod.specializer
    got = {}
    for n in (1, 3, 16, 17, 64, 65, 1000):
        sizes = {v: {"n": n, "m": 4096, "p": 4096}[v.name] for v in sp.vars}
        key = sp.key(sizes)
        got[n] = dict(key.rows).get("n", 0)
        assert got[n] == skinny_class(n)
        why = "\n".join(sp.explain(key, sizes))
        assert ("planned as a skinny GEMM" in why) == (n <= SKINNY_CLASSES[-1])
    assert got == {1: 4, 3: 4, 16: 16, 17: 32, 64: 64, 65: 0, 1000: 0}
    key = sp.key({v: {"n": 40, "m": 4096, "p": 4096}[v.name] for v in sp.vars})
    var = sp.make(key)
    assert "n8 <= 8" in str(var.program)  # n = 8 * n8 <= 64: assumed, and checked at each call
    assert "matmul_rf" in str(var.program)  # planned skinny: split-K


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_gpu_skinny_gemms_fixed_and_symbolic(dtype):
    """One symbolic module called at several row counts (its variants) and fixed-size builds, 1104-long reductions
    (ragged chunks and k tiles), against float64."""
    m, p = 200, 1104
    sym = w.matmul_bias_relu(n=te.var("n"), m=te.var("m"), p=te.var("p"), dtype=dtype)
    mod = build(list(sym.outputs), list(sym.inputs) + list(sym.outputs), target="cuda")
    for n in (1, 3, 7, 16, 20, 33, 64, 65):
        fixed = w.matmul_bias_relu(n=n, m=m, p=p, dtype=dtype)
        fmod = build(list(fixed.outputs), list(fixed.inputs) + list(fixed.outputs), target="cuda")
        args, ref = _data(n, m, p, dtype, seed=n)
        for f in (fmod, mod):
            out = np.full((n, m), np.nan, dtype)
            f(*args, out)
            err = np.abs(out.astype(np.float64) - ref).max() / np.abs(ref).max()
            assert err < (2e-2 if dtype == "float16" else 1e-5), (n, err)
    assert len(mod.specializations) >= 4


@pytest.mark.parametrize(("block", "tile"), [((8, 32), (4, 4)), ((1, 32), (1, 1))])
def test_dead_row_guards_of_a_split_k_register_tile_are_dropped_at_symbolic_sizes(block, tile):
    """The partial's register tile is indexed [0, ii, jj] (the chunk's batch index is a constant): its row and column
    guards only keep dead elements, so the FMA nest runs unguarded for every tile (an edge tile at symbolic sizes
    had run every FMA under compares: 20 x 4096 x 4096 float32, 0.65 ms against 0.06 at the fixed size). A 1 x 1
    tile (index [0, 0, 0]: a skinny GEMM's single row) drops its thread's column guard the same way."""
    wl = w.matmul_bias_relu(n=te.var("n"), m=te.var("m"), p=te.var("p"))
    s = Schedule(list(wl.outputs))
    schedule_gemm_cuda(s, "matmul", block=block, thread_tile=tile, k_tile=8, split_k=16)
    low = lower_cuda(s.program, "cuda")

    def guards_of(node, conds=()):
        if isinstance(node, Store) and node.name == "matmul_rf":
            yield conds
        for kid in (getattr(node, "body", None), getattr(node, "then", None), getattr(node, "orelse", None)):
            kids = kid if isinstance(kid, tuple) else (kid,)
            for k in kids:
                if k is not None and not isinstance(k, (str, int)):
                    yield from guards_of(k, conds + ((node.cond,) if type(node).__name__ == "If" else ()))

    found = list(guards_of(low.body))
    assert found and all(not any({"n", "m"} & {v.name for v in walk(c) if type(v).__name__ == "Var"} for c in cs)
                         for cs in found)
    _interp(low, 5, 40, 40, seed=9, sizes={"n": 5, "m": 40, "p": 40})


# ----------------------------------------------------------------------------- tiles of a matrix smaller than the block


def _shared_rows(low, name="A_shared"):
    return [int(x.buffer.shape[0].value) for x in walk(low.body)
            if type(x).__name__ == "Allocate" and x.buffer.name.startswith(name)]


def _update_guards(low, name):
    """The conditions of the Ifs around each store named `name` in the lowered program."""
    out = []

    def go(node, conds):
        if isinstance(node, Store):
            if node.name == name:
                out.append(conds)
            return
        for f in ("body", "then", "orelse"):
            kid = getattr(node, f, None)
            for k in kid if isinstance(kid, tuple) else (kid,):
                if k is not None and hasattr(k, "__dataclass_fields__"):
                    go(k, conds + ((node.cond,) if type(node).__name__ == "If" and f == "then" else ()))

    go(low.body, ())
    return out


def test_a_tile_of_fewer_rows_than_the_block_grows_and_the_update_runs_unguarded():
    """7 rows under the skinny recipe's 8-row block: the A tile (clipped to 7 rows) grows to 8, its row 7 zero-filled,
    so the register tile's update needs no row guard (with one, the warp of rows 6-7 ran every update guarded: the
    fixed-size kernel 10x slower than the symbolic one on an H100)."""
    wl = w.matmul_bias_relu(n=7, m=40, p=100)
    s = auto_schedule(list(wl.outputs), target="cuda")
    assert s.plan.groups[0].gemm["block"][0] == 8
    low = lower_cuda(s.program, "cuda")
    assert _shared_rows(low) and set(_shared_rows(low)) == {8}
    fills = [x for x in walk(low.body) if isinstance(x, Store) and x.name == "A_shared_fill"]
    assert fills
    guards = _update_guards(low, "matmul")
    assert guards and all(cs == () for cs in guards), guards  # no row, column or k guard: one unguarded nest
    _interp(low, 7, 40, 100, seed=11)


def test_a_hand_scheduled_tile_grows_to_the_block_but_not_past_the_static_shared_memory():
    from codegen.passes.shared import STATIC_SHARED_MAX

    wl = w.matmul_bias_relu(n=3, m=40, p=64)
    s = Schedule(list(wl.outputs))
    schedule_gemm_cuda(s, "matmul", block=(8, 32), thread_tile=(2, 1), k_tile=8)
    low = lower_cuda(s.program, "cuda")
    assert set(_shared_rows(low)) == {8}  # 3 rows read by a block of 8: grown
    _interp(low, 3, 40, 64, seed=12)
    # a block of 256 rows, k tile 64: the grown A tile (64 KiB) would pass the cap, so it keeps its 3 rows, guarded
    s = Schedule(list(wl.outputs))
    schedule_gemm_cuda(s, "matmul", block=(256, 8), thread_tile=(8, 1), k_tile=64)
    assert 256 * 64 * 4 > STATIC_SHARED_MAX
    low = lower_cuda(s.program, "cuda")
    assert set(_shared_rows(low)) == {3}
    assert not [x for x in walk(low.body) if isinstance(x, Store) and x.name == "A_shared_fill"]
    _interp(low, 3, 40, 64, seed=13)


@pytest.mark.parametrize(("rows", "dtype"), [(3, "float32"), (7, "float32")])
def test_default_path_skinny_gemms_of_odd_rows_match_in_any_thread_order(rows, dtype):
    """auto_schedule's skinny plan at fixed odd row counts (tiles grown past the matrix, split into 2 chunks of a
    1100-long reduction with a ragged last k tile; the tensor-core split of 20 rows: test_tensor_core_split_k_...)."""
    wl = w.matmul_bias_relu(n=rows, m=40, p=1100, dtype=dtype)
    s = auto_schedule(list(wl.outputs), target="cuda")
    assert "split-K" in s.plan.explain()
    _interp(lower_cuda(s.program, "cuda"), rows, 40, 1100, dtype, seed=rows)


# ----------------------------------------------------------------------------- gemm={"split_k": ...}


def test_gemm_split_k_option_turns_the_split_off_or_sets_the_chunk_and_keeps_the_skinny_tiles():
    wl = w.matmul_bias_relu(n=16, m=4096, p=4096)
    for asked, launches in ((None, 2), (0, 1), (1024, 2)):
        s = auto_schedule(list(wl.outputs), target="cuda", gemm=None if asked is None else {"split_k": asked})
        g = s.plan.groups[0]
        assert g.gemm["block"] == (16, 128) and g.cost.launches == launches  # the planner's skinny tiles either way
        assert ("matmul_rf" in str(s.program)) == (launches == 2)
        if asked:
            assert f"split k by {asked};" in s.plan.explain()


def test_gemm_split_k_on_a_square_half_gemm_takes_mma_sync_not_the_warpgroup_recipe():
    wl = w.matmul_bias_relu(n=256, m=256, p=1024, dtype="float16")
    assert "wgmma" in auto_schedule(list(wl.outputs), target="cuda").plan.explain()
    s = auto_schedule(list(wl.outputs), target="cuda", gemm={"split_k": 512})
    text = s.plan.explain()
    assert "mma.sync m16n8k16" in text and "split k by 512;" in text and "wgmma" not in text


@pytest.mark.parametrize("bad", [-1, True, "512", 1.5])
def test_gemm_split_k_option_refuses_what_is_no_chunk_length(bad):
    wl = w.matmul_bias_relu(n=16, m=256, p=256)
    with pytest.raises(ArgumentError, match="gemm split_k must be None .*, 0 \\(no split\\) or a chunk length"):
        auto_schedule(list(wl.outputs), target="cuda", gemm={"split_k": bad})
    with pytest.raises(ArgumentError, match="split_k must be a positive multiple of k_tile \\(32\\), got 100"):
        auto_schedule(list(wl.outputs), target="cuda", gemm={"split_k": 100})


# ----------------------------------------------------------------------------- linear layers: all batches' rows


def _linear(b, t, c, n, dtype):
    x = te.placeholder((b, t, c), name="x", dtype=dtype)
    wt = te.placeholder((c, n), name="w", dtype=dtype)
    k = te.reduce_axis(c, "k")
    y = te.compute((b, t, n), lambda i, j, o: te.sum(x[i, j, k] * wt[k, o], axis=k), name="y")
    return x, wt, y


def test_a_linear_layer_of_many_rows_in_short_batches_is_no_skinny_gemm():
    """64 x 32 rows of a float16 MLP against one weight: tensor cores (the warpgroup recipe, batches collapsed into
    its rows), not the skinny SIMT tiles its 32 rows per batch had taken; a decode step (1 x 1 rows) stays skinny, and
    so does a truly batched matmul (each batch its own right operand) of 16 rows per batch."""
    text = auto_schedule(list(blocks.mlp(B=64, T=32, C=256, dtype="float16").outputs), target="cuda").plan.explain()
    assert "skinny GEMM" not in text and "wgmma" in text and "collapse the batch loops" in text
    assert "skinny GEMM" in auto_schedule(list(blocks.mlp(B=1, T=1, C=256, dtype="float16").outputs),
                                          target="cuda").plan.explain()
    a = te.placeholder((64, 16, 256), name="a", dtype="float16")
    b = te.placeholder((64, 256, 512), name="b", dtype="float16")
    k = te.reduce_axis(256, "k")
    c = te.compute((64, 16, 512), lambda z, i, j: te.sum(a[z, i, k] * b[z, k, j], axis=k), name="c")
    assert "skinny GEMM" in auto_schedule([c], target="cuda").plan.explain()


def test_a_float32_linear_layer_of_many_rows_takes_tensor_cores_and_matches_in_any_thread_order():
    x, wt, y = _linear(4, 32, 32, 128, "float32")  # 128 rows against one weight, 32 a batch
    s = auto_schedule([y], target="cuda")
    assert "skinny GEMM" not in s.plan.explain() and "mma.sync m16n8k8 tf32" in s.plan.explain()
    low = lower_cuda(s.program, "cuda")
    rng = np.random.default_rng(5)
    xa, wa = rng.standard_normal((4, 32, 32)).astype("float32"), rng.standard_normal((32, 128)).astype("float32")
    ref = xa.astype(np.float64) @ wa.astype(np.float64)
    for order in ("reversed", "forward"):
        out = np.full((4, 32, 128), np.nan, np.float32)
        interp.run(low, xa, wa, out, gpu_order=order)
        assert np.abs(out - ref).max() / np.abs(ref).max() < 1e-5, order


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_gpu_linear_layer_of_short_batches_on_tensor_cores(dtype):
    """64 batches of 32 rows against one weight (tensor cores, the batches collapsed into the rows) on fresh data."""
    x, wt, y = _linear(64, 32, 256, 512, dtype)
    mod = build([y], [x, wt, y], target="cuda")
    rng = np.random.default_rng(21)
    xa, wa = rng.standard_normal((64, 32, 256)).astype(dtype), rng.standard_normal((256, 512)).astype(dtype)
    out = np.full((64, 32, 512), np.nan, dtype)
    mod(xa, wa, out)
    ref = xa.astype(np.float64) @ wa.astype(np.float64)
    assert np.abs(out.astype(np.float64) - ref).max() / np.abs(ref).max() < (2e-2 if dtype == "float16" else 1e-5)


@pytest.mark.parametrize("b, t, dtype", [(8, 1, "float32"), (4, 4, "float16"), (3, 2, "float32"), (3, 1, "bfloat16")])
def test_a_decode_steps_linear_layer_streams_its_weight_once_with_split_k(b, t, dtype):
    """B x T <= 64 rows against one weight (a decode step's B x 1): one skinny GEMM over all batches' rows, the batch
    loops collapsed into the row loop, split-K, instead of a GEMM per batch that read the whole weight each (B x T
    rows not a multiple of the block's 8 or 16 included; one batch's rows a power of two). The lowered program with a
    bias + ReLU epilogue matches
    float64 in reversed and forward thread order."""
    c, n = 1024, 160
    x, wt, y = _linear(b, t, c, n, dtype)
    bias = te.placeholder((n,), name="bias", dtype=dtype)
    z = te.compute((b, t, n), lambda i, j, o: te.maximum(y[i, j, o] + bias[o], 0.0), name="z")
    s = auto_schedule([z], target="cuda")
    text = s.plan.explain()
    assert f"a linear layer: all {b * t} rows of its batches ({b} x {t}) against one weight" in text
    assert "the batch loops collapsed into the rows" in text and "rfactor(y, k_o, factor_axis=0)" in text
    assert "blockIdx.z (batched GEMM)" not in text.split("rfactor")[0]  # no GEMM per batch before the split
    low = lower_cuda(s.program, "cuda")
    rng = np.random.default_rng(b * 10 + t)
    xa, wa, ba = (blocks.as_dtype(rng.standard_normal(sh), dtype) for sh in ((b, t, c), (c, n), (n,)))
    x64, w64, b64 = (blocks.as_float64(a, dtype) for a in (xa, wa, ba))
    ref = np.maximum(x64 @ w64 + b64, 0.0)
    for order in ("reversed", "forward"):
        out = blocks.as_dtype(np.full((b, t, n), np.nan), dtype)
        interp.run(low, xa, wa, ba, out, gpu_order=order)
        err = np.abs(blocks.as_float64(out, dtype) - ref).max() / np.abs(ref).max()
        assert err < {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1.6e-2}[dtype], order


def test_linear_layers_that_do_not_collapse_keep_a_gemm_per_batch():
    """A symbolic T (the collapsed index would divide by it: not quasi-affine), a T that is no power of two (a
    thread's tile of rows could straddle two batches) and a truly batched matmul (each batch its own weight) keep the
    batch loop on blockIdx.z, with no split."""
    x, wt, y = _linear(5, 3, 2048, 320, "float32")
    text = auto_schedule([y], target="cuda").plan.explain()
    assert "collapsed into the rows" not in text and "rfactor" not in text and "skinny GEMM (3 rows" in text
    tv = te.var("T")
    x, wt, y = _linear(4, tv, 2048, 320, "float32")
    text = auto_schedule([y], target="cuda", sizes={"T": 2}).plan.explain()
    assert "collapsed into the rows" not in text and "rfactor" not in text
    a = te.placeholder((8, 1, 2048), name="a", dtype="float32")
    bb = te.placeholder((8, 2048, 320), name="b", dtype="float32")
    k = te.reduce_axis(2048, "k")
    cc = te.compute((8, 1, 320), lambda z, i, j: te.sum(a[z, i, k] * bb[z, k, j], axis=k), name="c")
    text = auto_schedule([cc], target="cuda").plan.explain()
    assert "collapsed into the rows" not in text and "blockIdx.z (batched GEMM)" in text


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("b, t", [(8, 1), (3, 5)])
def test_gpu_decode_linear_layer_with_split_k(dtype, b, t):
    x, wt, y = _linear(b, t, 4096, 1000, dtype)
    mod = build([y], [x, wt, y], target="cuda")
    # T a power of two: the batches' rows collapsed, split-K (the partials and the combine); T = 5: a GEMM per batch
    assert len(mod.kernels) == (2 if t & (t - 1) == 0 else 1)
    rng = np.random.default_rng(b + t)
    xa, wa = rng.standard_normal((b, t, 4096)).astype(dtype), rng.standard_normal((4096, 1000)).astype(dtype)
    out = np.full((b, t, 1000), np.nan, dtype)
    mod(xa, wa, out)
    ref = xa.astype(np.float64) @ wa.astype(np.float64)
    assert np.abs(out.astype(np.float64) - ref).max() / np.abs(ref).max() < (2e-2 if dtype == "float16" else 1e-5)


def test_a_decode_step_at_symbolic_sizes_takes_a_collapsed_variant():
    """`te.var` B and T: a call with few rows in all (B x 1) keys B by its skinny class, and its variant collapses
    the batches' rows of both linear layers and splits K (each GEMM two kernels, no batch loop on blockIdx.z);
    it matches float64 in any thread order. A call with many rows keeps B unclassed."""
    blk = blocks.mlp(B=te.var("B"), T=te.var("T"), C=256)
    mod = build(list(blk.outputs), list(blk.args), target="cuda")
    xs = blocks.inputs(blk, {"B": 6, "T": 1}, rng=3)
    want = blk.reference(*xs)[0]
    got = np.full(want.shape, np.nan, np.float32)
    var = mod._select(mod.check((*xs, got)))
    assert mod.specializations == ["B* T=1 int32 T<=4 B<=8"]
    assert "B=6: a linear layer's batches, 8 at most" in mod.explain()
    heads = [ln for ln in var.source.splitlines() if "// statements" in ln]
    # the row kernel, mm_fc (K = 256: too short to split) and mm_fc2 as partials (split-K: only for the collapsed
    # rows) and their combine
    assert len(heads) == 4 and sum("_rf_init" in h for h in heads) == 1
    for order in ("reversed", 3):
        got = np.full(want.shape, np.nan, np.float32)
        interp.run(var.program, *xs, got, gpu_order=order)
        assert np.abs(got - want).max() / np.abs(want).max() < 1e-4, order
    key = mod.specializer.key({v: {"B": 4, "T": 128}[v.name] for v in mod.specializer.vars})
    assert dict(key.rows) == {"T": 0, "B": 0}


def test_a_linear_layer_whose_rows_do_not_fold_falls_back_to_a_gemm_per_batch():
    """gpt2's projection reads the heads merged back ([b, t, h * d] from [b, h, t, d]): its batch loops do not fold
    into its rows, so the planned collapse is refused as a whole (Schedule.attempt) and the layer is a GEMM per
    batch with the skinny tiles of one batch's rows, no split; the block still matches float64."""
    blk = blocks.gpt2(B=4, T=1, C=64, H=4)
    s = auto_schedule(list(blk.outputs), target="cuda")
    text = s.plan.explain()
    assert "mm_q: skinny linear layer: the batch loops collapsed into the rows" in text
    assert "mm_proj: skinny linear layer: its batches' rows not collapsed" in text and "no split" in text
    xs = blocks.inputs(blk, {}, rng=4)
    want = blk.reference(*xs)[0]
    got = np.full(want.shape, np.nan, np.float32)
    interp.run(lower_cuda(s.program, "cuda"), *xs, got, gpu_order="reversed")
    assert np.abs(got - want).max() / np.abs(want).max() < 1e-4


def test_attempt_restores_the_schedule_when_a_step_is_refused():
    wl = w.matmul_bias_relu(n=8, m=64, p=64)
    s = Schedule(list(wl.outputs))
    before, steps = s.program, len(s.trace)
    i, j, k = s.loops("matmul")[:3]
    with pytest.raises(ScheduleError, match="is illegal"):
        with s.attempt():
            s.split(i, 4)  # a legal step, then one the dependences refuse: the reduction loop on threads
            s.bind(k, "threadIdx.x")
    assert s.program is before and len(s.trace) == steps
    s.split(i, 2)  # the schedule goes on from where it was
    assert len(s.trace) == steps + 1


def test_a_variants_combine_runs_its_chunks_unrolled_to_the_assumed_bound():
    """At symbolic sizes the chunk count of split-K's combine is symbolic; the call's variant assumes p <= 1536 (its
    class), so the combine's chunk loop is padded to that bound's 3 chunks (guarded), unrolled as at fixed sizes,
    and the variant still matches float64 at a p inside the class with a ragged last chunk."""
    wl = w.matmul_bias_relu(n=te.var("n"), m=te.var("m"), p=te.var("p"))
    mod = build(list(wl.outputs), list(wl.inputs) + list(wl.outputs), target="cuda")
    n, m, p = 16, 160, 1104
    rng = np.random.default_rng(9)
    a, b, bias = (rng.standard_normal(sh).astype(np.float32) for sh in ((n, p), (p, m), (m,)))
    out = np.full((n, m), np.nan, np.float32)
    var = mod._select(mod.check((a, b, bias, out)))
    combine = var.source[var.source.index("C_matmul_init("):]
    assert mod.specializations == ["n%16 p%16 m%16 int32 p<=1536 n<=16"]
    # p <= 1536: 3 chunks of 512 at most (here 3, the last of 80), each under its guard
    assert "for (int k_o = 0; k_o < 3; ++k_o) {" in combine and "if ((k_o < loopir_floordiv(" in combine
    ref = np.maximum(a.astype(np.float64) @ b.astype(np.float64) + bias, 0.0)
    for order in ("reversed", "forward"):
        got = np.full((n, m), np.nan, np.float32)
        interp.run(var.program, a, b, bias, got, gpu_order=order)
        assert np.abs(got - ref).max() / np.abs(ref).max() < 1e-5, order
