"""Cluster rows: a row longer than one block's register rows (schedules.rows, RowParams.cluster_row_max) runs on a
thread-block cluster of C blocks, one virtual block of C x T threads (the `cluster` pragma on the row loop,
codegen.passes.launch), its row in the threads' registers and its reductions combined across the cluster
(`loopir_cluster_allreduce`). Checked here: the plan and the rendered kernel, the pragma's and the lowering's
refusals, results against float64 on fresh data in adversarial thread orders of the lowered program (the
interpreter models the cluster's combine order) and, on a GPU, of the module."""

from __future__ import annotations

import numpy as np
import pytest

from codegen import build
from codegen.cuda.kernel import generate_cuda
from codegen.passes import lower as lower_passes
from loopir import blocks, interp
from loopir import nodes as N
from loopir import te
from loopir import workloads as w
from loopir.errors import ArgumentError, CudaCodegenError
from loopir.visit import walk
from schedules import Schedule, auto_schedule
from schedules.rows import CLUSTER_ROW_MAX

from test_register_rows import TOL, _inputs, _reference, check_thread_orders

# cluster rows are on by default (rows of 16-bit elements only when whole 16-byte vectors); these name them
CLUSTERS = {"rows": {"cluster_row_max": CLUSTER_ROW_MAX}}
# small clusters, so that the interpreter runs them quickly: rows beyond 256 elements on blocks of 32 threads
SMALL = {"register_row_max": 256, "cluster_threads": 32, "cluster_row_max": CLUSTER_ROW_MAX}


def _source(wl, schedule=None) -> str:
    src = build(list(wl.outputs), list(wl.inputs) + list(wl.outputs), target="cuda", schedule=schedule).source
    return src[src.index('extern "C"'):]


def _kernels(program: N.Program) -> list[N.Kernel]:
    return [k for k in walk(program.body) if isinstance(k, N.Kernel)]


@pytest.mark.parametrize("name, n, dtype, c, per_thread, regs", [("softmax", 65536, "float32", 4, 32, 32),
                                                                 ("layernorm", 50257, "float32", 4, 25, 25),
                                                                 ("rmsnorm", 20000, "float16", 2, 20, 24),
                                                                 ("softmax", 131072, "bfloat16", 8, 32, 32)])
def test_a_row_beyond_one_blocks_registers_takes_a_cluster(name, n, dtype, c, per_thread, regs):
    """`regs`: a thread's row registers, whole 16-byte chunks where the row is a multiple of one (20000 halves: 3
    chunks of 8), else single elements strided over the cluster's threads (50257 floats)."""
    wl = getattr(w, name)(m=1024, n=n, dtype=dtype)
    text = auto_schedule(list(wl.outputs), "cuda", **CLUSTERS).explain()
    assert f"a thread-block cluster of {c} blocks of 512 threads per row" in text
    assert f"at most {per_thread} elements" in text and "into its threads' registers" in text
    src = _source(wl, CLUSTERS)
    # 32 row registers a thread: two blocks of 512 an SM (64 registers each), as register rows of one block
    bound = "__launch_bounds__(512, 2)" if regs == 32 else "__launch_bounds__(512)"
    assert f"__cluster_dims__(1, {c}, 1) {bound}" in src
    assert f"float x_shared_reg[{regs}];" in src and "__shared__ __align__" not in src
    assert "threadIdx.x" not in src.split("// in the cluster", 1)[1]  # every thread index is the cluster's
    reductions = 1 if name == "rmsnorm" else 2
    assert src.count(f"loopir_cluster_allreduce<{c}>(") == reductions
    assert "loopir_block_allreduce(" not in src and src.rstrip().endswith("loopir_cluster_sync();  // no block "
                                                                          "leaves while a peer may read its "
                                                                          "reduction slots\n}")
    # the default: the same cluster kernel; turned off, the block row re-read from memory in each phase
    assert _source(wl) == src
    assert "__cluster_dims__" not in _source(wl, {"rows": {"cluster_row_max": 0}})


def test_a_wide_row_that_one_phase_reads_keeps_a_block_per_row():
    """A row sum of 65,536 elements: no row to keep in registers, so no cluster (only its barriers would remain)."""
    x = te.placeholder((1024, 65536), "float32", name="x")
    k = te.reduce_axis(65536, "k")
    y = te.compute((1024,), lambda i: te.sum(x[i, k], axis=k), name="y")
    s = auto_schedule([y], "cuda", **CLUSTERS)
    assert "no row that several phases read: no cluster of register rows" in s.explain()
    assert "__cluster_dims__" not in build([y], [x, y], target="cuda", schedule=CLUSTERS).source


def test_rows_of_a_symbolic_length_keep_no_cluster_unless_bounded():
    n = te.var("n")
    wl = w.softmax(m=1024, n=n, dtype="float32")
    assert "cluster" not in auto_schedule(list(wl.outputs), "cuda", **CLUSTERS).explain()


@pytest.mark.parametrize("name, n, dtype", [("softmax", 1500, "float32"), ("layernorm", 3000, "float16"),
                                            ("rmsnorm", 5000, "float32"), ("softmax", 1111, "float32"),
                                            ("softmax", 1112, "bfloat16")])
def test_cluster_rows_match_float64_in_any_thread_order(name, n, dtype):
    """Lengths the cluster's threads do not tile (1500 = 375 chunks over 64 threads; 1111 not a multiple of the
    16-byte chunk, 1112 = 139 chunks of 8 halves), clusters of 2, 4 and 8 blocks: the lowered program, its kernel a
    cluster, in reversed, forward and shuffled order."""
    m = 3
    wl = getattr(w, name)(m=m, n=n, dtype=dtype)
    s = auto_schedule(list(wl.outputs), "cuda", rows=SMALL)
    low = lower_passes(s.program, "cuda")
    (k,) = _kernels(low)
    assert k.cluster >= 2 and int(k.block[0].value) == 32 * k.cluster
    assert not [a for a in walk(low.body) if isinstance(a, N.Allocate) and a.buffer.scope == "shared"]
    check_thread_orders(low, name, _inputs(wl, m, n, dtype, seed=n), dtype, ("reversed", "forward", 11))


def test_the_interpreter_combines_a_cluster_in_rank_order():
    """The renderer's combine order, modeled: each block's threads (loopir_block_allreduce: warps, then the warps'
    totals), then the blocks' totals in rank order. Two blocks of 64 threads, warps w0..w3 with totals 1.28e10, 128,
    -1.28e10, 128: one block of 128 threads would add (w0 + w2) + (w1 + w3) = 256; the cluster adds
    (w0 + w1) + (w2 + w3), where each 128 is below half an ulp of 1.28e10 (1024): 0."""
    m, n = 1, 512
    x = te.placeholder((m, n), "float32", name="x")
    k = te.reduce_axis(n, "k")
    y = te.compute((m,), lambda i: te.sum(x[i, k], axis=k), name="y")
    s = Schedule([y])
    i, kk = s.loops("y")
    s.bind(i, "blockIdx.x")
    s.bind_reduction(kk, threads=128)  # thread t: elements t, t + 128, t + 256, t + 384
    s.pragma(i, "cluster", 2)
    low = lower_passes(s.program, "cuda")
    (kern,) = _kernels(low)
    assert kern.cluster == 2 and int(kern.block[0].value) == 128
    warp = (np.arange(n) % 128) // 32
    xs = np.where(warp == 0, 1e8, np.where(warp == 2, -1e8, 1.0)).astype(np.float32)[None, :]
    for order in ("forward", "reversed"):
        got = np.full((m,), np.nan, np.float32)
        interp.run(low, xs, got, gpu_order=order)
        assert got[0] == 0.0
    s1 = Schedule([y])  # the same threads as one block: the other order
    i, kk = s1.loops("y")
    s1.bind(i, "blockIdx.x")
    s1.bind_reduction(kk, threads=128)
    got = np.full((m,), np.nan, np.float32)
    interp.run(lower_passes(s1.program, "cuda"), xs, got, gpu_order="forward")
    assert got[0] == 256.0


def test_the_cluster_pragma_is_checked():
    x = te.placeholder((8, 1024), "float32", name="x")
    y = te.compute((8, 1024), lambda i, j: x[i, j] * 2, name="y")
    s = Schedule([y])
    i, j = s.loops("y")
    with pytest.raises(ArgumentError, match="loop 'i' is serial; a cluster size applies to the loop bound to "
                                            "blockIdx.x"):
        s.pragma(i, "cluster", 2)
    s.bind(i, "blockIdx.x")
    for bad in (1, 9, 2.0, True):
        with pytest.raises(ArgumentError, match="needs a cluster size in 2..8"):
            s.pragma(i, "cluster", bad)
    s.bind(j, "threadIdx.x")
    with pytest.raises(ArgumentError, match="loop 'j' is threadIdx.x"):
        s.pragma(j, "cluster", 2)
    s.pragma(i, "cluster", 2)
    assert "pragma cluster 2" in str(s.program)
    src = generate_cuda(lower_passes(s.program, "cuda")).source
    assert "__cluster_dims__(1, 2, 1) __launch_bounds__(512)" in src


def test_a_kernel_asking_for_two_cluster_sizes_is_refused():
    """Two nests under one serial loop (one kernel) whose blockIdx.x loops ask for clusters of 2 and of 4."""
    import dataclasses

    from codegen.passes.launch import plan_kernels

    x = te.placeholder((8, 64), "float32", name="x")
    y = te.compute((8, 64), lambda i, j: x[i, j] * 2, name="y")
    z = te.compute((8, 64), lambda i, j: y[i, j] + 1, name="z")
    s = Schedule([z])
    for stage, c in (("y", 2), ("z", 4)):
        i, j = s.loops(stage)
        s.bind(i, "blockIdx.x").bind(j, "threadIdx.x").pragma(i, "cluster", c)
    one = N.For(N.Var("t"), N.const(0), N.const(1), s.program.body)
    with pytest.raises(CudaCodegenError, match=r"loops bound to blockIdx.x ask for different cluster sizes \[2, 4\]"):
        plan_kernels(dataclasses.replace(s.program, body=one))


def test_row_parameters_refuse_a_cluster_block_that_is_no_power_of_two():
    from schedules.rows import RowParams

    for bad in (100, 2048, 16):
        with pytest.raises(ArgumentError, match=f"must be a power of two in \\[32, 1024\\], got cluster_threads {bad}"):
            RowParams.of({"cluster_threads": bad})
    assert RowParams.of({"cluster_threads": 256}).cluster_threads == 256


def test_the_lowering_refuses_cluster_kernels_it_cannot_render():
    x = te.placeholder((8, 1000), "float32", name="x")
    y = te.compute((8, 1000), lambda i, j: x[i, j] * 2, name="y")
    s = Schedule([y])  # 1000 threads: not whole warps in each of 2 blocks
    i, j = s.loops("y")
    s.bind(i, "blockIdx.x").bind(j, "threadIdx.x").pragma(i, "cluster", 2)
    with pytest.raises(CudaCodegenError, match="whole warps in each of its 2 blocks"):
        lower_passes(s.program, "cuda")
    s = Schedule([y])  # a second grid axis: the cluster's blocks take y
    i, j = s.loops("y")
    jo, ji = s.split(j, 500)
    s.bind(i, "blockIdx.x").bind(jo, "blockIdx.y").bind(ji, "threadIdx.x").pragma(i, "cluster", 2)
    with pytest.raises(CudaCodegenError, match="binds blockIdx.y"):
        lower_passes(s.program, "cuda")
    # a shared row the threads do not own (strided reductions, chunked copy): each block would hold its own copy
    wl = w.softmax(m=2, n=2048, dtype="float32")
    s = auto_schedule(list(wl.outputs), "cuda", rows={"register_row_max": 0})
    (row,) = [f for f in walk(s.program.body) if isinstance(f, N.For) and f.thread == "blockIdx.x"]
    s.pragma(row.var, "cluster", 2)
    with pytest.raises(CudaCodegenError, match="shared buffer 'x_shared' in a cluster kernel"):
        generate_cuda(lower_passes(s.program, "cuda"))


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["softmax", "layernorm", "rmsnorm"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("m, n", [(5, 20000), (3, 50257), (2, 65536), (300, 131072)])
def test_cluster_rows_on_the_gpu(name, dtype, m, n):
    # (rows of 2**17 elements are split over blocks when fewer than 2 per SM: 300 of them keep a cluster each)
    wl = getattr(w, name)(m=m, n=n, dtype=dtype)
    mod = build(list(wl.outputs), list(wl.inputs) + list(wl.outputs), target="cuda", schedule=CLUSTERS)
    assert "__cluster_dims__" in mod.source
    xs = _inputs(wl, m, n, dtype, seed=m + n)
    got = blocks.as_dtype(np.full((m, n), np.nan), dtype)
    mod(*xs, got)
    err = np.abs(blocks.as_float64(got, dtype) - _reference(name, xs, dtype)).max()
    assert err / np.abs(_reference(name, xs, dtype)).max() < TOL[dtype]


def test_a_symbolic_row_in_a_bounded_class_takes_a_cluster_variant():
    """`te.var` sizes: the call's variant assumes its row class (n <= 3072), plans a cluster row at that bound (the
    chunk loops padded to constant trip counts) and matches float64 in any thread order at a length inside it."""
    mv, nv = te.var("m"), te.var("n")
    for name, n, dtype in (("softmax", 3000, "float32"), ("layernorm", 2904, "float16")):
        wl = getattr(w, name)(m=mv, n=nv, dtype=dtype)
        mod = build(list(wl.outputs), list(wl.inputs) + list(wl.outputs), target="cuda", schedule={"rows": SMALL})
        m = 3
        xs = _inputs(wl, m, n, dtype, seed=n)
        got = blocks.as_dtype(np.full((m, n), np.nan), dtype)
        var = mod._select(mod.check((*xs, got)))
        assert mod.specializations[0].endswith("n<=3072")
        (k,) = _kernels(var.program)
        assert k.cluster == 4 and int(k.block[0].value) == 128  # 3072 / (32 x 32) = 3 -> 4 blocks of 32 threads
        assert "__cluster_dims__(1, 4, 1)" in var.source and "x_shared_reg[" in var.source
        check_thread_orders(var.program, name, xs, dtype, ("reversed", "forward", 5))


def test_the_tuning_space_offers_clusters_for_rows_beyond_register_rows():
    from schedules.tuning.space import options, space_for

    sp = space_for(list(w.softmax(m=1024, n=65536, dtype="float32").outputs), "cuda")
    names = [k.name for k in sp.knobs]
    assert "rows.cluster_row_max" in names and sp.default["rows.cluster_row_max"] == CLUSTER_ROW_MAX  # on by default
    cfg = {**sp.default, "rows.cluster_row_max": 0}
    sched, _ = options(cfg, sp.default)
    assert sched == {"rows": {"cluster_row_max": 0}}
    wl = w.softmax(m=1024, n=65536, dtype="float32")
    args = list(wl.inputs) + list(wl.outputs)
    assert "__cluster_dims__(1, 4, 1)" in build(list(wl.outputs), args, target="cuda").source
    assert "__cluster_dims__" not in build(list(wl.outputs), args, target="cuda", schedule=sched).source
    short = space_for(list(w.softmax(m=1024, n=4096, dtype="float32").outputs), "cuda")  # register rows already
    assert "rows.cluster_row_max" not in [k.name for k in short.knobs]


def test_a_16_bit_row_of_partial_vectors_keeps_the_block_row():
    """By default a float32 row of 50257 elements takes a cluster; a float16 row of that length (2-byte loads: not
    whole 16-byte vectors) keeps a block per row (an RMSNorm of it ran 31% slower on a cluster, H100), as does a
    float16 row that is whole vectors when clusters are turned off."""
    for dtype, n, cluster in (("float32", 50257, True), ("float16", 50257, False), ("float16", 50256, True)):
        wl = w.rmsnorm(m=1024, n=n, dtype=dtype)
        assert ("__cluster_dims__" in _source(wl)) is cluster, (dtype, n)
        text = auto_schedule(list(wl.outputs), "cuda").explain()
        assert ("thread-block cluster" in text) is cluster


def test_an_architecture_before_sm_90_builds_block_rows_unless_clusters_are_named():
    """Thread-block clusters need sm_90: a build for sm_80 turns the default off (the kernel compiles, no cluster),
    at fixed and at symbolic sizes; a schedule that names cluster_row_max keeps it. So for the warpgroup GEMM."""
    wl = w.softmax(m=1024, n=65536, dtype="float32")
    args = list(wl.inputs) + list(wl.outputs)
    mod = build(list(wl.outputs), args, target="cuda", arch="sm_80")
    assert "__cluster_dims__" not in mod.source and mod.cubin[:4] == b"\x7fELF"
    assert "__cluster_dims__" in build(list(wl.outputs), args, target="cuda", arch="sm_90").source
    named = build(list(wl.outputs), args, target="cuda", arch="sm_80", schedule={"rows": {"cluster_row_max": 0}})
    assert "__cluster_dims__" not in named.source
    from codegen.build import _arch_defaults

    assert _arch_defaults({"rows": {"cluster_row_max": CLUSTER_ROW_MAX}}, "sm_80")["rows"]["cluster_row_max"] == \
        CLUSTER_ROW_MAX  # named: the caller's
    assert _arch_defaults(None, "sm_90a") is None
    assert _arch_defaults(None, "sm_86") == {"rows": {"cluster_row_max": 0}, "gemm": {"wgmma": False},
                                             "online": {"wgmma": False}}
    assert _arch_defaults({"online": False}, "sm_80")["online"] is False  # named: no rewrite at all
    half = w.matmul_bias_relu(256, 256, 256, dtype="float16")  # the warpgroup GEMM (sm_90a) is a default too
    gm = build(list(half.outputs), list(half.inputs) + list(half.outputs), target="cuda", arch="sm_80")
    assert "wgmma" not in gm.source and "mma.sync" in gm.source and gm.cubin[:4] == b"\x7fELF"
    sym = w.softmax(m=te.var("m"), n=te.var("n"), dtype="float32")
    smod = build(list(sym.outputs), list(sym.inputs) + list(sym.outputs), target="cuda", arch="sm_80")
    xs = _inputs(sym, 2, 20000, "float32", seed=3)
    var = smod._select(smod.check((*xs, np.full((2, 20000), np.nan, np.float32))))
    assert "__cluster_dims__" not in var.source and var.cubin[:4] == b"\x7fELF"
