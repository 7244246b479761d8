"""GEMM for every shape (issue 11, part 5): full-tile / remainder versioning of the CUDA GEMM kernel
(codegen/passes/full_tiles.py) at sizes the tiles do not divide and at symbolic sizes, and the skinny-M
tiles the planner picks (schedules/recipes/gemm_cuda.py `skinny_params`). Both branches of each versioned
nest are shown to run (dropping either one breaks a known part of the output) under the adversarial GPU
interpreter; the CUDA source compiles with NVRTC; device runs are gpu-marked."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from codegen import build
from codegen.cuda.kernel import generate_cuda
from codegen.passes import lower as lower_cuda
from codegen.passes import pipeline
from codegen.passes.bounds import prove_bounds
from codegen.passes.full_tiles import version_full_tiles
from loopir import interp, te
from loopir import nodes as N
from loopir import workloads as w
from loopir.lower import lower
from loopir.visit import walk
from schedules import Schedule, auto_schedule
from schedules.recipes import SKINNY_ROWS, gemm_params, schedule_gemm_cuda, skinny_params

SMALL = dict(block=(8, 16), thread_tile=(2, 4), k_tile=4)


def _sched(n, m, p, dtype="float32", **tiles):
    wl = w.matmul_bias_relu(n=n, m=m, p=p, dtype=dtype)
    s = Schedule(lower(list(wl.outputs), list(wl.inputs) + list(wl.outputs)))
    schedule_gemm_cuda(s, **tiles)
    return wl, s


def _data(n, m, p, seed):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, p)).astype(np.float32), rng.standard_normal((p, m)).astype(np.float32),
            rng.standard_normal(m).astype(np.float32))


def _run(prog, n, m, p, seed=0):
    a, b, bias = _data(n, m, p, seed)
    out = np.full((n, m), np.nan, np.float32)
    interp.run(prog, a, b, bias, out, gpu_order="reversed")
    return out, np.maximum(a.astype(np.float64) @ b.astype(np.float64) + bias, 0.0)


def _versioned(prog) -> list[N.If]:
    return [x for x in walk(prog.body) if isinstance(x, N.If) and x.orelse is not None]


def _keep(prog, branch: str):
    """`prog` with every versioned If reduced to one branch (the other replaced by nothing)."""
    ids = {id(x) for x in _versioned(prog)}

    def go(s):
        if isinstance(s, N.If) and id(s) in ids:
            return N.If(s.cond, go(s.then), N.Seq(())) if branch == "then" else N.If(s.cond, N.Seq(()), go(s.orelse))
        if isinstance(s, N.Seq):
            return N.Seq(tuple(go(c) for c in s.body))
        if isinstance(s, N.If):
            return N.If(s.cond, go(s.then), None if s.orelse is None else go(s.orelse))
        if isinstance(s, (N.For, N.Allocate, N.Kernel)):
            return dataclasses.replace(s, body=go(s.body))
        return s

    return dataclasses.replace(prog, body=go(prog.body))


def test_pass_is_named_in_the_cuda_pipeline_after_staging():
    names = [p.name for p in pipeline("cuda")]
    # after staging (the copies it versions are the pipelined ones); the passes between (widen_staged, skip_dead_tiles)
    # change tile types and loop bounds, not the copies' shape
    assert names.index("version_full_tiles") > names.index("plan_staging")


@pytest.mark.parametrize("sizes", [(11, 20, 9), None])
def test_versioned_kernel_both_branches_run_and_match_numpy(sizes):
    n, m, p = sizes or (te.var("n"), te.var("m"), te.var("p"))
    _, s = _sched(n, m, p, **SMALL)
    prog = lower_cuda(s.program, "cuda")
    vers = _versioned(prog)
    # the register-tile init and the FMA nest (per thread), the two copies (per block)
    assert len(vers) >= 4, prog
    for shape in [(11, 20, 9)] if sizes else [(11, 20, 9), (16, 32, 8), (3, 5, 1)]:
        got, ref = _run(prog, *shape)
        assert not np.isnan(got).any()
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
    # 11 x 20 x 9 with 8 x 16 x 4 tiles: block (0, 0) is whole, its last k tile is not, the edge blocks are not
    gi, ref = _run(_keep(prog, "then"), 11, 20, 9)
    ge, _ = _run(_keep(prog, "else"), 11, 20, 9)
    assert not np.allclose(gi, ref, atol=1e-3, equal_nan=False), "the remainder branch never ran"
    assert not np.allclose(ge, ref, atol=1e-3, equal_nan=False), "the full-tile branch never ran"


def test_divisible_sizes_have_no_version_and_no_guard():
    _, s = _sched(16, 32, 8, **SMALL)
    prog = lower_cuda(s.program, "cuda")
    assert not _versioned(prog) and not any(isinstance(x, N.If) for x in walk(prog.body))


def test_bounds_proof_accepts_the_unguarded_branches():
    _, s = _sched(te.var("n"), te.var("m"), te.var("p"), **SMALL)
    prog = lower_cuda(s.program, "cuda")
    assert _versioned(prog)
    # the accesses of the unguarded copies are in range under the version conditions, for all sizes
    assert prove_bounds(prog).body is not None


def test_pass_is_identity_without_guards_and_idempotent_in_effect():
    _, s = _sched(16, 32, 8, **SMALL)
    prog = lower_cuda(s.program, "cuda")
    assert version_full_tiles(prog) is prog


def _compile(src):
    from codegen.cuda.nvrtc import compile_cubin

    assert compile_cubin(src, "sm_90", use_cache=False)


@pytest.mark.parametrize("size", [1000, None])
def test_cuda_source_versioned_and_compiles(size):
    n = size or te.var("n")
    wl = w.matmul_bias_relu(n=n, m=n, p=n)
    mod = build(auto_schedule(list(wl.outputs), target="cuda"), list(wl.inputs) + list(wl.outputs), target="cuda")
    src = mod.source
    assert "the block's whole tile is in range" in src
    assert "cp.async.wait_group" in src  # the pipeline is kept
    if size == 1000:  # rows of 1000 floats are 16-byte multiples: the whole tiles are copied 16 bytes at a time
        assert "loopir_cp_async16(" in src
    _compile(src)


def _fp16_gemm(n, m, p):
    A = te.placeholder((n, p), "float16", name="A")
    B = te.placeholder((p, m), "float16", name="B")
    bias = te.placeholder((m,), "float32", name="bias")
    k = te.reduce_axis(p, name="k")
    mm = te.compute((n, m), lambda i, j: te.sum(te.cast("float32", A[i, k]) * te.cast("float32", B[k, j]), axis=k),
                    name="matmul")
    C = te.compute((n, m), lambda i, j: te.maximum(mm[i, j] + bias[j], 0.0), name="C")
    return [A, B, bias, C], C


@pytest.mark.parametrize("n", [17, te.var("n")])
def test_fp16_inputs_versioned_compiles(n):
    args, c = _fp16_gemm(n, 1001, 77)
    s = auto_schedule([c], target="cuda")
    assert _versioned(lower_cuda(s.program, "cuda"))
    if isinstance(n, int):  # (the symbolic source compiles in test_cuda_source_versioned_and_compiles)
        _compile(build(s, args, target="cuda").source)


# ----------------------------------------------------------------------------- skinny M


@pytest.mark.parametrize("rows", [1, 2, 8, 17, 33, 64])
@pytest.mark.parametrize("itemsize", [4, 2])
def test_skinny_params_cover_every_row_and_fit(rows, itemsize):
    prm, why = skinny_params(rows, itemsize, cols=4096, depth=4096)
    (b0, b1), (t0, t1), kt = prm["block"], prm["thread_tile"], prm["k_tile"]
    assert b0 >= rows and b0 % t0 == 0 and t1 == (1 if b0 < 8 else 4) and "skinny" in why
    assert 2 * (b0 * kt + kt * b1) * itemsize <= 48 * 1024
    gemm_params("cuda", prm)  # a valid tile set
    # split-K: every chunk a whole number of k tiles, at least two chunks, the partials within 1/8 of B's bytes
    chunk = prm["split_k"]
    chunks = -(-4096 // chunk)
    assert chunk % kt == 0 and chunks >= 2 and chunks * rows <= 4096 / 8 and "split-K" in why
    if itemsize == 2 and rows >= 16:  # half inputs of 16 rows or more: tensor cores, a block no taller than them
        assert prm["tensor_cores"] and prm["mma"]["block"][0] <= rows and "tensor cores" in why
    else:
        assert "tensor_cores" not in prm


def test_skinny_params_no_split_where_the_reduction_is_short_or_unknown():
    assert "split_k" not in skinny_params(16, cols=4096, depth=512)[0]  # one chunk of SPLIT_K_MIN_CHUNK
    assert "split_k" not in skinny_params(16, cols=4096)[0]  # the reduction's length unknown
    assert "split_k" not in skinny_params(16, cols=2**20, depth=4096)[0]  # the column blocks fill the GPU


def test_skinny_params_none_for_tall_or_bad_rows():
    assert skinny_params(SKINNY_ROWS + 1) is None and skinny_params(0) is None and skinny_params(4096) is None


@pytest.mark.parametrize(("n", "sizes", "skinny"), [(16, None, True), (64, None, True), (65, None, False),
                                                    ("n", {"n": 8}, True), ("n", None, False)])
def test_planner_picks_skinny_tiles_and_explains(n, sizes, skinny):
    n = te.var("n") if n == "n" else n
    wl = w.matmul_bias_relu(n=n, m=te.var("m"), p=te.var("p"))
    plan = auto_schedule(list(wl.outputs), target="cuda", sizes=sizes).plan
    g = plan.groups[0]
    assert g.mapping == "gemm"
    assert ("skinny GEMM" in plan.explain()) == skinny
    assert (g.gemm["thread_tile"] != gemm_params("cuda")["thread_tile"]) == skinny
    assert ("split-K" in plan.explain()) == skinny  # the reduction costed at 4096: split


def test_explicit_tiles_are_kept_for_skinny_shapes():
    wl = w.matmul_bias_relu(n=16, m=64, p=64)
    plan = auto_schedule(list(wl.outputs), target="cuda", gemm={"block": (32, 64), "k_tile": 8}).plan
    assert plan.groups[0].gemm["block"] == (32, 64) and "skinny" not in plan.explain()


def test_skinny_kernel_matches_numpy_in_the_interpreter():
    wl = w.matmul_bias_relu(n=3, m=40, p=6)
    s = auto_schedule(list(wl.outputs), target="cuda", gemm={"block": (4, 32), "thread_tile": (4, 1), "k_tile": 4})
    got, ref = _run(lower_cuda(s.program, "cuda"), 3, 40, 6, seed=3)
    assert not np.isnan(got).any()
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("rows", [1, 16, 64])
def test_skinny_cuda_source_compiles(rows):
    wl = w.matmul_bias_relu(n=rows, m=te.var("m"), p=te.var("p"))
    mod = build(auto_schedule(list(wl.outputs), target="cuda"), list(wl.inputs) + list(wl.outputs), target="cuda")
    assert "cp.async.wait_group" in mod.source
    _compile(mod.source)


# ----------------------------------------------------------------------------- device runs

SHAPES = [(1000, 1000, 1000), (1001, 1001, 1001), (17, 1, 33), (1, 1, 1), (1, 4096, 300), (64, 1000, 513),
          (33, 129, 4096)]


@pytest.mark.gpu
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("symbolic", [False, True])
def test_gpu_every_shape_fp32(shape, symbolic):
    n, m, p = shape
    sz = (te.var("n"), te.var("m"), te.var("p")) if symbolic else shape
    wl = w.matmul_bias_relu(*sz)
    mod = build(auto_schedule(list(wl.outputs), target="cuda", sizes=dict(zip("nmp", shape)) if symbolic else None),
                list(wl.inputs) + list(wl.outputs), target="cuda")
    a, b, bias = _data(n, m, p, seed=sum(shape))
    out = np.full((n, m), np.nan, np.float32)
    mod(a, b, bias, out)
    ref = np.maximum(a.astype(np.float64) @ b.astype(np.float64) + bias, 0.0)
    assert not np.isnan(out).any()
    assert np.abs(out - ref).max() <= 1e-4 * max(1.0, float(np.abs(ref).max()))


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(1000, 1000, 1000), (17, 1001, 33), (1, 4096, 300)])
def test_gpu_every_shape_fp16_inputs(shape):
    n, m, p = shape
    for sizes in (shape, (te.var("n"), te.var("m"), te.var("p"))):
        args, c = _fp16_gemm(*sizes)
        mod = build(auto_schedule([c], target="cuda"), args, target="cuda")
        rng = np.random.default_rng(sum(shape))
        a = rng.standard_normal((n, p)).astype(np.float16)
        b = rng.standard_normal((p, m)).astype(np.float16)
        bias = rng.standard_normal(m).astype(np.float32)
        out = np.full((n, m), np.nan, np.float32)
        mod(a, b, bias, out)
        ref = np.maximum(a.astype(np.float64) @ b.astype(np.float64) + bias, 0.0)
        assert not np.isnan(out).any()
        assert np.abs(out - ref).max() <= 1e-4 * max(1.0, float(np.abs(ref).max()))


# ----------------------------------------------------------------------------- CPU: panel packing


def _cpu_matmul(n, m, p):
    a = te.placeholder((n, p), name="A")
    b = te.placeholder((p, m), name="B")
    k = te.reduce_axis(p, "k")
    c = te.compute((n, m), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    return [a, b, c], c


def _panels(prog):
    return [x.buffer for x in walk(prog.body) if isinstance(x, N.Allocate) and x.buffer.name.endswith("_panel")]


def _before_packing(prog):
    for step in pipeline("cpu"):
        if step.name != "pack_panels":
            prog = step(prog)
    return prog


def test_cpu_pipeline_packs_the_panel_at_fixed_and_symbolic_sizes():
    assert "pack_panels" in [p.name for p in pipeline("cpu")]
    for sizes in ((64, 128, 32), (te.var("n"), te.var("m"), te.var("p"))):
        args, c = _cpu_matmul(*sizes)
        prog = lower_cuda(auto_schedule([c], target="cpu").program, "cpu")
        panels = _panels(prog)
        # fixed 128 columns: two whole panels, one version; symbolic: the whole-width version and the
        # partial one (padded with zeros to the tile width)
        assert len(panels) == (1 if isinstance(sizes[0], int) else 2), prog
        for pb in panels:
            assert str(pb.shape[0]) == str(sizes[2]) and pb.scope == "local"
        if not isinstance(sizes[0], int):
            assert any(x.name == "B_panel_pad" for x in walk(prog.body) if isinstance(x, N.Store))
            # the partial panel's register-tile loops run to the full width; only the store to C is clipped
            tile_loops = [f for f in walk(prog.body) if isinstance(f, N.For) and f.kind == "vectorize"
                          and isinstance(f.body, N.Store) and f.body.buffer.scope == "local"]
            assert tile_loops and all(isinstance(f.hi, N.Const) for f in tile_loops)
        loads_b = [x for x in walk(prog.body) if isinstance(x, N.Load) and x.buffer.name == "B"]
        if isinstance(sizes[0], int):  # 128 = 2 whole panels: B is read only by the packing copy
            assert len({id(x) for x in loads_b}) == 1


def test_cpu_pack_skipped_when_the_operand_is_written():
    from codegen.passes.packing import pack_panels

    args, c = _cpu_matmul(12, 64, 8)
    prog = _before_packing(auto_schedule([c], target="cpu").program)
    assert _panels(pack_panels(prog))
    b = next(x for x in prog.args if x.name == "B")
    zero = N.Const(0, "int64")
    written = dataclasses.replace(prog, body=N.Seq((N.Store("W", b, (zero, zero), N.Const(1.0, "float32"), (), ()),
                                                    prog.body)))
    assert not _panels(pack_panels(written))


@pytest.mark.parametrize("shape", [(1, 1, 1), (17, 1, 33), (7, 64, 5), (13, 130, 70), (70, 200, 129), (6, 192, 64),
                                   (33, 40, 17)])  # (33, 40, 17): the register tile is narrower than the panel
@pytest.mark.parametrize("symbolic", [False, True])
def test_cpu_gemm_default_path_every_shape(shape, symbolic):
    n, m, p = shape
    sizes = (te.var("n"), te.var("m"), te.var("p")) if symbolic else shape
    args, c = _cpu_matmul(*sizes)
    mod = build([c], args, threads=2)
    rng = np.random.default_rng(sum(shape) + symbolic)
    a = rng.standard_normal((n, p)).astype(np.float32)
    b = rng.standard_normal((p, m)).astype(np.float32)
    out = np.full((n, m), np.nan, np.float32)
    mod(a, b, out)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    assert not np.isnan(out).any()
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(ref).max())))


def test_cpu_packed_program_in_the_interpreter():
    args, c = _cpu_matmul(te.var("n"), te.var("m"), te.var("p"))
    prog = lower_cuda(auto_schedule([c], target="cpu").program, "cpu")
    assert _panels(prog)
    rng = np.random.default_rng(5)
    for n, m, p in ((7, 70, 3), (6, 64, 2)):
        a = rng.standard_normal((n, p)).astype(np.float32)
        b = rng.standard_normal((p, m)).astype(np.float32)
        out = np.full((n, m), np.nan, np.float32)
        interp.run(prog, a, b, out)
        np.testing.assert_allclose(out, a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)


def _guards_of(prog, name):
    """The If conditions around each store named `name` (the lowered program)."""
    out = []

    def go(s, conds):
        if isinstance(s, N.Store):
            if s.name == name:
                out.append(conds)
        elif isinstance(s, N.If):
            go(s.then, conds + (s.cond,))
            if s.orelse is not None:
                go(s.orelse, conds)
        elif isinstance(s, N.Seq):
            for c in s.body:
                go(c, conds)
        elif isinstance(s, (N.For, N.Allocate, N.Kernel)):
            go(s.body, conds)

    go(prog.body, ())
    return out


def test_dead_register_tile_guards_dropped_k_guard_kept():
    _, s = _sched(11, 20, 9, **SMALL)
    prog = lower_cuda(s.program, "cuda")
    # the register tile is initialised and updated whole (rows / columns out of range are never stored) ...
    assert all(not g for g in _guards_of(prog, "matmul_init"))
    upd = _guards_of(prog, "matmul")
    assert upd
    vars_in = {v.name for g in upd for c in g for v in walk(c) if isinstance(v, N.Var)}
    assert vars_in <= {"k_o", "k_i"}, vars_in  # ... the k test stays (stale shared entries past p)
    # the stores to C keep their guards
    assert all(g for g in _guards_of(prog, "C"))


def test_guards_kept_when_the_tile_reads_global_memory():
    _, s = _sched(11, 20, 9, shared=False, **SMALL)
    prog = lower_cuda(s.program, "cuda")
    vars_in = {v.name for g in _guards_of(prog, "matmul") for c in g for v in walk(c) if isinstance(v, N.Var)}
    assert {"i_i_i", "j_i_i"} & vars_in  # an unguarded instance would read A / B out of range
    got, ref = _run(prog, 11, 20, 9)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


def test_remainder_copy_of_an_edge_nest_is_rolled_a_k_remainder_is_not():
    # only edge blocks take an elementwise nest's remainder: its unrolled loops are rolled (`#pragma unroll 1`,
    # fresh loop variables; the vector access stays, its scalar fallback rolls), which cuts what NVRTC compiles;
    # the GEMM's last k tile is taken by every block, inside the k loop: its remainder stays unrolled
    _, s = _sched(11, 20, 9, **SMALL)
    prog = lower_cuda(s.program, "cuda")
    kern = next(x for x in walk(prog.body) if isinstance(x, N.Kernel))
    assert _versioned(prog) and not kern.rolled
    n = te.var("n")
    x = te.placeholder((n,), name="x")
    y = te.compute((n,), lambda i: te.sin(x[i]) * te.cos(x[i]), name="y")
    prog = lower_cuda(auto_schedule([y], target="cuda").program, "cuda")
    assert [b.name for b in prog.args] == ["x", "y"]
    kern = next(k for k in walk(prog.body) if isinstance(k, N.Kernel))
    vers = _versioned(prog)
    rolled = [f for v in vers for f in walk(v.orelse) if isinstance(f, N.For) and f.var in kern.rolled]
    assert rolled and all(f.kind in ("serial", "vectorize") for f in rolled)
    assert not any(isinstance(f, N.For) and f.var in kern.rolled for v in vers for f in walk(v.then)), \
        "a loop of the full-tile copy was rolled"
    assert "#pragma unroll 1" in generate_cuda(prog).source
    rng = np.random.default_rng(5)
    for size in (1, 1003, 4096 + 5):
        xs = rng.standard_normal(size).astype(np.float32)
        out = np.full(size, np.nan, np.float32)
        interp.run(prog, xs, out, gpu_order="reversed")
        np.testing.assert_allclose(out, np.sin(xs.astype(np.float64)) * np.cos(xs), rtol=1e-5, atol=1e-6)
