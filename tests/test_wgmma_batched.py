"""Linear layers over (B, T, C) activations on Hopper's warpgroup recipe (schedules/recipes/gemm_wgmma.py): the
weight W[k, j] is not read by the batch loop, so the planner either collapses b into the rows (T a constant: one
(B*T) x C matrix, its addresses folded back from (f // T, f % T) to f) or, with a symbolic T, keeps the batch loop
on blockIdx.z; the TMA kernel reads A as its 2-d view. A true batched matmul (each batch its own B) keeps mma.sync.
The lowered programs match float64 in the GPU interpreter under adversarial thread orders, the CUDA source compiles
for sm_90a with no division by T per element, and on a GPU whole blocks and single layers match float64."""

from __future__ import annotations

import itertools
import random
import re

import numpy as np
import pytest

from codegen import build
from codegen.cuda.cubin_info import cubin_resources
from codegen.cuda.tensor_map import view_extents
from codegen.passes import lower as lower_passes
from loopir import blocks, interp, te
from loopir.affine import eval_index, fold_divmod, row_major
from loopir.errors import LoopirError
from loopir.nodes import Binary, Const, For, Unary, Var
from loopir.visit import substitute, walk
from schedules import Schedule, auto_schedule
from schedules.primitives.wgmma import WGMMA, a_view, kernel_tile, tma_plan, wgmma_parts
from schedules.recipes.gemm_wgmma import schedule_gemm_wgmma

GELU_C = blocks.GELU_C


def _mode(source: str) -> str:
    return "tma" if "loopir_tma2d(" in source else "cp" if "wgmma.mma_async" in source else "none"


def _tiles(program):
    return [f for f in walk(program.body) if isinstance(f, For) and f.kind == WGMMA]


def _linear(B, T, C=64, N=192, dtype="float16", table=False):
    """gelu(x[b, t, :] @ W + bias) (+ pos[t, :] with `table`: an epilogue read at t alone), float32 accumulation."""
    x = te.placeholder((B, T, C), dtype, name="x")
    W = te.placeholder((C, N), dtype, name="W")
    bias = te.placeholder((N,), dtype, name="bias")
    k = te.reduce_axis(C, "k")
    mm = te.compute((B, T, N), lambda b, t, j: te.sum(te.cast("float32", x[b, t, k]) * te.cast("float32", W[k, j]),
                                                      axis=k), name="mm")
    args = [x, W, bias]
    pos = None
    if table:
        pos = te.placeholder((T, N), dtype, name="pos")
        args.append(pos)

    def f(b, t, j):
        v = mm[b, t, j] + te.cast("float32", bias[j])
        g = 0.5 * v * (1.0 + te.tanh(GELU_C * (v + 0.044715 * v * v * v)))
        return te.cast(dtype, g + te.cast("float32", pos[t, j]) if table else g)

    y = te.compute((B, T, N), f, name="y")
    return y, args + [y]


def _data(sizes, C=64, N=192, table=False, seed=0):
    rng = np.random.default_rng(seed)
    B, T = sizes
    f64 = [rng.standard_normal((B, T, C)), rng.standard_normal((C, N)) / np.sqrt(C), 0.1 * rng.standard_normal(N)]
    if table:
        f64.append(rng.standard_normal((T, N)))
    host = [a.astype(np.float16) for a in f64]
    f64 = [a.astype(np.float64) for a in host]
    v = f64[0] @ f64[1] + f64[2]
    ref = 0.5 * v * (1 + np.tanh(GELU_C * (v + 0.044715 * v ** 3)))
    if table:
        ref = ref + f64[3]
    return host, ref


def _check_interp(s, sizes, symbolic, table=False, N=192):
    low = lower_passes(s.program, "cuda")
    host, ref = _data(sizes, N=N, table=table, seed=sum(sizes))
    for order in ("reversed", 1):
        out = np.full(ref.shape, np.nan, np.float16)
        interp.run(low, *host, out, gpu_order=order,
                   sizes=dict(zip("BT", sizes)) if symbolic else None)
        got = out.astype(np.float64)
        assert not np.isnan(got).any(), f"gpu_order={order!r}: an element was never written"
        assert np.abs(got - ref).max() / np.abs(ref).max() < 1e-2, f"gpu_order={order!r}"


def _no_division_by(source: str, t: str) -> None:
    """No `/ t`, `% t`, floordiv or mod by t anywhere in the kernel (per element or not; inline asm's operands
    `%40` aside)."""
    source = "\n".join(ln for ln in source.splitlines() if "asm" not in ln)
    assert not re.search(rf"[/%]\s*\(?{t}(LL)?\b", source), t
    assert not re.search(rf"loopir_(floordiv|mod)\([^;]*?,\s*\(?{t}(LL)?\)?\)", source), t


# ----------------------------------------------------------------------------- the planner


@pytest.mark.parametrize("C, want", [(64, {"mm_fc"}), (128, {"mm_q", "mm_k", "mm_v", "mm_proj", "mm_fc", "mm_fc2"})])
def test_the_gpt2_blocks_linear_layers_take_the_warpgroup_recipe(C, want):
    """Every linear layer the planner puts on tensor cores takes the warpgroup recipe at symbolic B and T (at C = 64
    the layers of 64 output columns keep the SIMT skinny tiles, as before), with the batch loop on blockIdx.z."""
    wl = blocks.gpt2(B=te.var("B"), T=te.var("T"), C=C, H=1, dtype="float16")
    s = auto_schedule(list(wl.outputs), "cuda")
    text = s.plan.explain()
    assert "mma.sync m16n8k16" not in text
    tensorized = [t for t in s.trace if t["primitive"] == "tensorize" and t["args"][-1] == WGMMA]
    assert len(tensorized) == len(want) == len(_tiles(s.program))
    notes = [ln for ln in text.splitlines() if "Hopper's warpgroup recipe" in ln]
    assert {ln.split(":")[0].strip(" ·") for ln in notes} == want
    assert all("the batch loop on blockIdx.z" in ln for ln in notes)


@pytest.mark.parametrize("name", ["gpt2", "mlp", "llama"])
def test_fixed_sizes_collapse_the_batch_into_the_rows(name):
    kw = dict(B=2, T=130, C=128, dtype="float16", **({} if name == "mlp" else {"H": 2}))
    wl = blocks.BLOCKS[name](**kw)
    s = auto_schedule(list(wl.outputs), "cuda")
    text = s.plan.explain()
    n = sum(1 for g in s.plan.groups if g.mapping == "gemm")
    assert n >= 2 and "mma.sync m16n8k16" not in text
    assert text.count("batch loops collapsed into the rows") == n == len(_tiles(s.program))
    collapses = [t for t in s.trace if t["primitive"] == "collapse"]
    assert len(collapses) >= n  # recorded in the trace: a replay redoes them
    assert str(Schedule.replay(s.trace_json(), list(wl.outputs)).program) == str(s.program)


def test_a_true_batched_matmul_keeps_the_mma_sync_recipe():
    B, T = te.var("B"), te.var("T")
    x = te.placeholder((B, T, 128), "float16", name="x")
    wt = te.placeholder((B, 128, 256), "float16", name="w")  # each batch its own weight
    k = te.reduce_axis(128, "k")
    y = te.compute((B, T, 256), lambda b, t, j: te.sum(te.cast("float32", x[b, t, k]) * te.cast("float32", wt[b, k, j]),
                                                       axis=k), name="y")
    s = auto_schedule([y], "cuda")
    assert not _tiles(s.program) and "mma.sync m16n8k16" in s.plan.explain()
    assert "Hopper's warpgroup recipe" not in s.plan.explain()


def test_an_epilogue_read_at_t_alone_keeps_the_batch_loop_apart():
    """pos[t, j] in the epilogue would need t = f % T per element once collapsed: the batch loop stays on
    blockIdx.z (each batch its own row tiles), and the program is right."""
    y, _ = _linear(2, 160, table=True)
    s = auto_schedule([y], "cuda")
    text = s.plan.explain()
    assert "the batch loop on blockIdx.z" in text and "collapsed" not in text
    assert not [t for t in s.trace if t["primitive"] == "collapse"]
    _check_interp(s, (2, 160), symbolic=False, table=True)


# ----------------------------------------------------------------------------- lowered programs, CPU interpreter


@pytest.mark.parametrize("case", ["symbolic", "fixed64", "fixed128"])
def test_a_linear_layer_is_right_in_any_thread_order(case):
    """B = 2, T = 40 (a third of a 128-row tile), C = 64, N = 192, bias + GELU. Symbolic B, T: 128-row tiles per
    batch (TMA). Fixed: the batch collapsed into 80 rows, a 64-row tile (cp.async), or a 128-row one asked for
    (TMA, the box past row 80 zero-filled)."""
    symbolic = case == "symbolic"
    y, _ = _linear(te.var("B"), te.var("T")) if symbolic else _linear(2, 40)
    gemm = {"tensor_cores": True, **({"wgmma": {"block": (128, 192)}} if case == "fixed128" else {})}
    s = auto_schedule([y], "cuda", gemm=gemm)
    (f,) = _tiles(s.program)
    assert int(f.hi.value) == (64 if case == "fixed64" else 128)
    assert bool([t for t in s.trace if t["primitive"] == "collapse"]) == (not symbolic)
    low = lower_passes(s.program, "cuda")
    kern = next(x for x in walk(low.body) if type(x).__name__ == "Kernel")
    found = kernel_tile(kern.body)
    assert found is not None and (found[2] is not None) == (case != "fixed64")
    if symbolic:
        assert found[2].bz is not None and "blockIdx.z" in str(s)
    _check_interp(s, (2, 40), symbolic)


@pytest.mark.parametrize("case", ["symbolic", "fixed64", "fixed128"])
def test_the_source_compiles_with_no_division_by_t(case):
    symbolic = case == "symbolic"
    y, args = _linear(te.var("B"), te.var("T")) if symbolic else _linear(2, 40)
    gemm = {"tensor_cores": True, **({"wgmma": {"block": (128, 192)}} if case == "fixed128" else {})}
    mod = build(auto_schedule([y], "cuda", gemm=gemm), args, target="cuda")  # NVRTC, sm_90a
    src = mod.source
    assert mod.cubin[:4] == b"\x7fELF"
    assert _mode(src) == ("cp" if case == "fixed64" else "tma")
    assert "wgmma.mma_async.sync.aligned.m64n192k16.f32.f16.f16" in src
    _no_division_by(src, "T" if symbolic else "40")
    if symbolic:  # A's map is of its 2-d view (B * T rows); the batch is walked with the tiles
        assert "x_tmap" in src and "< (B * T) ?" in src
    if case != "fixed64":  # 384 threads: setmaxnreg's producer 40 / consumers 232 need <= 168 registers at launch
        (regs, _), = cubin_resources(mod.cubin).values()
        assert regs <= 168
    stores = [ln for ln in src.splitlines() if "wg_at0 = " in ln]
    assert stores and all(re.search(r"\bj_i\b", ln) and "floordiv" not in ln and "mod" not in ln for ln in stores)
    if case == "fixed64":  # A's chunks by cp.async: the collapsed row times the row length
        assert re.search(r"&x\[\(\(\(\(b_t_f_o \* 64\) \+ b_t_f_i\) \* 64\) \+ k\)\]", src)
    # the epilogue: the rows' tail (80 rows in tiles of 64 or 128, or T's) is tested once per row, around its
    # columns, so that the bias loads are not each behind a per-element branch
    tail = src[src.index("wgmma.wait_group.sync.aligned 0"):]
    h, i = tail.index("for (int wg_h = 0;"), re.search(r"for \(int wg_i0? = 0;", tail).start()  # TMA store: i0
    row_test = re.search(r"if \(+(-1 \+ T\)|79 )", tail)
    assert row_test and h < row_test.start() < i and "wg_ok0 = true;" in tail


# ----------------------------------------------------------------------------- the analysis


def test_the_tma_plan_reads_a_as_its_2d_view():
    y, _ = _linear(te.var("B"), te.var("T"))
    s = auto_schedule([y], "cuda")
    (f,) = _tiles(s.program)
    p = wgmma_parts(f)
    row, rows = a_view(p.a)
    B, T = (x for x in p.a.buffer.shape[:2])
    assert str(rows) == str(Binary("mul", B, T, "int64"))
    kern = next(x for x in walk(lower_passes(s.program, "cuda").body) if type(x).__name__ == "Kernel")
    plan = kernel_tile(kern.body)[2]
    assert plan is not None and plan.bz is not None and plan.a_rows is rows or str(plan.a_rows) == str(rows)
    assert str(plan.row0) == str(substitute(row, {p.row: Const(0, "int64")}))
    assert eval_index(plan.row0, {plan.bz.var: 3, plan.bi.var: 2, T: 40}) == 3 * 40 + 2 * 128  # b * T + t_o * 128
    # a tile without its kernel's block loops (another statement beside it) has no TMA plan
    assert tma_plan(p, f) is None


def test_tensor_map_extents_of_a_view():
    assert view_extents([2, 40, 64]) == (80, 64) and view_extents((7, 8)) == (7, 8)
    assert view_extents([3, 5, 7, 16]) == (105, 16)
    with pytest.raises(LoopirError, match="rank 2 or more"):
        view_extents([16])


def test_fold_divmod_cancels_a_collapsed_row_and_keeps_values():
    i64 = "int64"
    o, i, f = (Var(n, i64) for n in "oif")
    c = lambda v: Const(v, i64)  # noqa: E731
    b = lambda op, x, y: Binary(op, x, y, i64)  # noqa: E731
    assert str(row_major((c(2), c(40), c(64)), (b("floordiv", f, c(40)), b("mod", f, c(40)), i))) == "f * 64 + i"
    # the same row as an exact region names it (cache_write's origin): f = 64 * o + i
    first = b("add", b("mul", c(2), o), b("floordiv", b("add", i, b("mul", c(-16), o)), c(40)))  # 2o + (i - 16o) // 40
    r24 = b("add", b("mul", c(24), o), i)
    second = b("sub", r24, b("mul", c(40), b("floordiv", r24, c(40))))  # 24o + i - 40 ((24o + i) // 40)
    isl_form = b("add", b("mul", first, c(40)), second)
    assert str(fold_divmod(isl_form)) == "64 * o + i"
    opaque = b("floordiv", f, Var("n", i64))  # a symbolic divisor: an atom, kept
    assert fold_divmod(opaque) is opaque
    rng = random.Random(4)

    def draw(d):
        if d == 0 or rng.random() < 0.2:
            return rng.choice([o, i, c(rng.randint(-50, 50))])
        op = rng.choice(["add", "sub", "mul", "floordiv", "mod", "neg"])
        if op == "neg":
            return Unary("neg", draw(d - 1), i64)
        if op == "mul":
            return b("mul", c(rng.randint(-7, 7)), draw(d - 1)) if rng.random() < 0.8 else b("mul", draw(d - 1),
                                                                                                 draw(d - 1))
        if op in ("floordiv", "mod"):
            return b(op, draw(d - 1), c(rng.choice([1, 2, 3, 7, 40, 64])))
        return b(op, draw(d - 1), draw(d - 1))

    for _ in range(800):
        e = draw(5)
        g = fold_divmod(e)
        for ov, iv in itertools.product(range(-5, 6, 3), range(-70, 90, 17)):
            env = {o: ov, i: iv}
            assert eval_index(e, env) == eval_index(g, env), (e, g, env)


def test_the_recipe_takes_one_batch_loop_onto_blockidx_z():
    y, _ = _linear(te.var("B"), te.var("T"))
    s = Schedule([y])
    plan = schedule_gemm_wgmma(s, "mm", block=(128, 192))
    assert any("blockIdx.z" in step for step in plan.steps)
    (f,) = _tiles(s.program)
    assert wgmma_parts(f).shape.rows == 128
    _check_interp(s, (3, 17), symbolic=True)


# ----------------------------------------------------------------------------- on the GPU


def _err(got, want, dtype):
    g, w = blocks.as_float64(got, dtype), blocks.as_float64(want, dtype)
    assert not np.isnan(g).any(), "an output element was never written"
    return float(np.max(np.abs(g - w)) / np.max(np.abs(w)))


@pytest.mark.gpu
@pytest.mark.parametrize("fixed", [True, False], ids=["fixed", "symbolic"])
def test_the_gpt2_block_in_float16_matches_float64_on_the_gpu(fixed):
    sizes = {"B": 2, "T": 130}
    kw = dict(C=128, H=2, dtype="float16", **(sizes if fixed else {}))
    w = blocks.gpt2(**kw)
    mod = build(list(w.outputs), list(w.args), target="cuda")
    for seed in (1, 2):
        ins = blocks.inputs(w, sizes, rng=seed)
        want = w.reference(*ins)[0]
        got = blocks.as_dtype(np.full(want.shape, np.nan), "float16")
        mod(*ins, got)
        assert _err(got, want, "float16") < w.tolerance


def test_the_last_k_tile_is_awaited_inside_the_loop_and_the_accumulators_fenced():
    """ptxas had scheduled a GEMM epilogue's reads of the accumulators above the wait for the last wgmma group when
    that wait followed the k loop (codegen.cuda.wgmma `_Emit.wait_previous`): the last iteration waits for every
    group, and after the wait an empty asm names every accumulator (both kernels: TMA and cp.async)."""
    for case in ("symbolic", "fixed64"):
        y, args = _linear(te.var("B"), te.var("T")) if case == "symbolic" else _linear(2, 40)
        src = build(auto_schedule([y], "cuda", gemm={"tensor_cores": True}), args, target="cuda").source
        k_loop = src[src.index("for (int wg_kt = 0; wg_kt < wg_nk;"):]
        last = k_loop.index('else asm volatile("wgmma.wait_group.sync.aligned 0;')
        assert k_loop.index('if (wg_kt + 1 < wg_nk) asm volatile("wgmma.wait_group.sync.aligned 1;') < last
        fence = k_loop.index('asm volatile("" : "+f"(wg_d[0]), ')
        assert last < fence and '"+f"(wg_d[95]) :: "memory");' in k_loop[fence:fence + 3000]


@pytest.mark.gpu
@pytest.mark.parametrize("C, H", [(128, 2), (768, 12)])
def test_the_llama_block_at_fixed_sizes_matches_float64_and_repeats_its_bits_on_the_gpu(C, H):
    """The race of the epilogue with the last wgmma group (see the test above) showed as this block at fixed sizes
    (its w2 GEMM of 6 or 32 k tiles) returning wrong rows, different ones from call to call."""
    sizes = {"B": 1, "T": 128}
    w = blocks.llama(C=C, H=H, dtype="float16", **sizes)
    mod = build(list(w.outputs), list(w.args), target="cuda")
    ins = blocks.inputs(w, sizes, rng=3)
    want = w.reference(*ins)[0]
    outs = []
    for _ in range(3):
        got = blocks.as_dtype(np.full(want.shape, np.nan), "float16")
        mod(*ins, got)
        assert _err(got, want, "float16") < w.tolerance
        outs.append(got.view(np.uint16))
    assert all(np.array_equal(outs[0], o) for o in outs[1:])


@pytest.mark.gpu
def test_a_linear_layer_at_symbolic_sizes_matches_float64_on_the_gpu():
    """One module at symbolic B, T called at several sizes: a partial last row tile, rows past T read from the next
    batch's rows of the view (never stored), more tiles than resident blocks, repeated calls (maps remade)."""
    y, args = _linear(te.var("B"), te.var("T"))
    mod = build([y], args, target="cuda")
    assert _mode(mod.source) == "tma"
    for sizes in [(2, 40), (3, 130), (1, 1), (8, 1024), (2, 40)]:
        host, ref = _data(sizes, seed=sizes[1])
        out = np.full(ref.shape, np.nan, np.float16)
        mod(*host, out)
        got = out.astype(np.float64)
        assert not np.isnan(got).any(), sizes
        assert np.abs(got - ref).max() / np.abs(ref).max() < 1e-2, sizes


@pytest.mark.gpu
@pytest.mark.parametrize("gemm", [{"tensor_cores": True}, {"tensor_cores": True, "wgmma": {"block": (128, 192)}}],
                         ids=["cp_async", "tma"])
def test_a_collapsed_linear_layer_matches_float64_on_the_gpu(gemm):
    y, args = _linear(2, 40)
    mod = build(auto_schedule([y], "cuda", gemm=gemm), args, target="cuda")
    host, ref = _data((2, 40), seed=9)
    out = np.full(ref.shape, np.nan, np.float16)
    mod(*host, out)
    got = out.astype(np.float64)
    assert not np.isnan(got).any() and np.abs(got - ref).max() / np.abs(ref).max() < 1e-2
