"""tensorize (mma.sync m16n8k16) and the tensor-core GEMM recipe: nest before/after, refusals, numerics through
the interpreters (float16 and bfloat16 against a float64 reference), NVRTC compile, GPU runs (gpu-marked)."""

from __future__ import annotations

import numpy as np
import pytest

from codegen.passes import lower as lower_passes
from codegen.passes.accumulate import widen_accumulators
from loopir import interp
from loopir import workloads as w
from loopir.dtypes import from_bfloat16, to_bfloat16
from loopir.lower import lower
from schedules import Schedule
from schedules.primitives.tensorize import TensorizeError
from schedules.recipes.gemm_mma import schedule_gemm_mma

SMALL = dict(block=(64, 64), warp=(32, 32), k_tile=32)


def _sched(n: int = 64, m: int = 64, p: int = 32, dtype: str = "float16") -> tuple[Schedule, w.Workload]:
    wl = w.matmul_bias_relu(n=n, m=m, p=p, dtype=dtype)
    return Schedule(lower(list(wl.outputs), list(wl.inputs) + list(wl.outputs))), wl


def _inputs(wl: w.Workload, dtype: str, n: int, m: int, p: int, seed: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    f64 = [rng.standard_normal((n, p)), rng.standard_normal((p, m)), rng.standard_normal(m)]
    if dtype == "bfloat16":
        host = [to_bfloat16(x.astype(np.float32)) for x in f64]
        f64 = [from_bfloat16(x).astype(np.float64) for x in host]
    else:
        host = [x.astype(np.float16) for x in f64]
        f64 = [x.astype(np.float64) for x in host]
    return host, f64


def _out(dtype: str, n: int, m: int) -> np.ndarray:
    if dtype == "bfloat16":
        return np.full((n, m), 0x7FC0, dtype=np.uint16)  # NaN
    return np.full((n, m), np.nan, dtype=np.float16)


def _as64(x: np.ndarray, dtype: str) -> np.ndarray:
    return (from_bfloat16(x) if dtype == "bfloat16" else x).astype(np.float64)


def _rel(got: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(got - ref).max() / np.abs(ref).max())


def test_nest_after_tensorize() -> None:
    s, _ = _sched()
    schedule_gemm_mma(s, **SMALL)
    text = str(s.program)
    assert "mma.m16n8k16(0, 2)" in text
    assert "threadIdx.x" in text and "threadIdx.z" in text
    # the nest stays the reference semantics: 2 x 2 x 16 loops around the update
    assert "range(0, 16)" in text


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("order", [None, "reversed"])
def test_numerics_interp(dtype: str, order: str | None) -> None:
    n, m, p = 64, 64, 32
    s, wl = _sched(n, m, p, dtype)
    schedule_gemm_mma(s, **SMALL)
    host, f64 = _inputs(wl, dtype, n, m, p, seed=3 if order else 4)
    out = _out(dtype, n, m)
    # the accumulators widened to float32 as every target does (a bfloat16 running sum alone is off by ~1%)
    interp.run(widen_accumulators(s.program), *host, out, gpu_order=order)
    ref = np.maximum(f64[0] @ f64[1] + f64[2], 0.0)
    assert _rel(_as64(out, dtype), ref) < 1e-2


def test_edge_tiles_guarded_interp() -> None:
    """Sizes the tiles do not divide (80 x 72): the update keeps its edge guard inside the tensorized nest."""
    n, m, p = 80, 72, 32
    s, wl = _sched(n, m, p)
    schedule_gemm_mma(s, **SMALL)
    assert "mma.m16n8k16(0, 2)" in str(s.program)
    host, f64 = _inputs(wl, "float16", n, m, p, seed=9)
    out = _out("float16", n, m)
    interp.run(widen_accumulators(s.program), *host, out, gpu_order="reversed")
    ref = np.maximum(f64[0] @ f64[1] + f64[2], 0.0)
    assert _rel(_as64(out, "float16"), ref) < 1e-2


def test_symbolic_reduction_length_is_tensorized_with_a_zero_padded_last_k_tile() -> None:
    # (it was refused before codegen.passes.pad): the k guard stays in the schedule, the CUDA pipeline zero-fills
    # the operand tiles past K and drops it, and the rendered nest is one mma.sync per fragment
    from codegen.cuda import generate_cuda
    from loopir.nodes import For, If
    from loopir.visit import walk

    wl = w.matmul_bias_relu(dtype="float16")
    s = Schedule(lower(list(wl.outputs), list(wl.inputs) + list(wl.outputs)))
    schedule_gemm_mma(s, **SMALL)
    low = lower_passes(s.program, "cuda")
    nests = [f for f in walk(low.body) if isinstance(f, For) and f.kind.startswith("mma.")]
    assert nests and not any(" < p" in str(n.cond) for f in nests for n in walk(f) if isinstance(n, If))
    assert "mma.sync" in generate_cuda(low).source


def _kernel(prog):
    from loopir.nodes import Kernel
    from loopir.visit import walk

    ks = [k for k in walk(prog.body) if isinstance(k, Kernel)]
    assert len(ks) == 1
    return ks[0]


def shared_tiles(prog):
    """The one kernel of the lowered `prog` and the shapes of its shared buffers by name."""
    from loopir.nodes import Allocate
    from loopir.visit import walk

    k = _kernel(prog)
    return k, {a.buffer.name: tuple(int(d.value) for d in a.buffer.shape) for a in walk(k.body)
               if isinstance(a, Allocate) and a.buffer.scope == "shared"}


def test_padded_row_lengths() -> None:
    from codegen.passes.mma import padded_row

    # the byte stride of a row becomes 16 x an odd number: 8 ldmatrix rows fall in 8 distinct bank groups
    assert [padded_row(x, 2) for x in (16, 24, 32, 64, 128, 256)] == [24, 24, 40, 72, 136, 264]


def test_plan_mma_pads_pipelines_and_reuses_fragments() -> None:
    """codegen.passes.mma records its decisions in the IR: padded operand tiles, a 4-stage ring, the mma grid."""
    s, _ = _sched(64, 64, 64)
    schedule_gemm_mma(s, **SMALL)
    k, shapes = shared_tiles(lower_passes(s.program, "cuda"))
    assert shapes == {"A_shared": (64, 40), "B_shared": (32, 72)}
    assert k.pipeline_stages == 4 and len(k.pipelined) == 1
    assert len(k.mma_grids) == 1
    assert k.min_blocks >= 1
    # 4 stages of (64 x 40 + 32 x 72) halves pass 48 KiB? no: 38 KiB, static shared memory
    assert k.dynamic_shared == ()


def test_plan_mma_dynamic_shared_for_big_rings() -> None:
    s, _ = _sched(128, 128, 64)
    schedule_gemm_mma(s)  # block 128 x 128: 4 stages of 18.5 KiB
    k = _kernel(lower_passes(s.program, "cuda"))
    assert k.pipeline_stages == 4
    assert k.dynamic_shared[-1][0] is None and int(k.dynamic_shared[-1][1].value) == 4 * (128 * 40 + 32 * 136) * 2


@pytest.mark.parametrize("size", [(64, 64, 32), (64, 64, 64), (80, 72, 64)])
def test_lowered_edge_program_adversarial(size: tuple[int, int, int]) -> None:
    """The lowered (padded, pipelined) program, edge tiles included, through the adversarial GPU interpreter."""
    n, m, p = size
    s, wl = _sched(n, m, p)
    schedule_gemm_mma(s, **SMALL)
    prog = lower_passes(s.program, "cuda")
    host, f64 = _inputs(wl, "float16", n, m, p, seed=11)
    out = _out("float16", n, m)
    interp.run(prog, *host, out, gpu_order="reversed")
    ref = np.maximum(f64[0] @ f64[1] + f64[2], 0.0)
    assert _rel(_as64(out, "float16"), ref) < 1e-2


def test_source_ring_and_clipped_chunks() -> None:
    from codegen import build

    s, wl = _sched(80, 72, 64)
    schedule_gemm_mma(s, **SMALL)
    src = build(s, list(wl.inputs) + list(wl.outputs), target="cuda").source
    assert "ring of 4 stages" in src and "cp.async.wait_group 2;" in src  # 3 tiles in flight, one waited for
    assert "loopir_cp_async16(&A_shared_st" in src and "loopir_cp_async16(&B_shared_st" in src
    assert "chunk_q" in src  # the edge tiles' copies: 16-byte chunks inside the clip, element-wise across it
    assert "frag_a" in src and "__launch_bounds__(" in src
    assert "A_shared_st[(((c0 * 40)" in src  # the padded row stride


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_nvrtc_source(dtype: str) -> None:
    from codegen import build

    s, wl = _sched(dtype=dtype)
    schedule_gemm_mma(s, **SMALL)
    mod = build(s, list(wl.inputs) + list(wl.outputs), target="cuda")
    src = mod.source
    t = "f16" if dtype == "float16" else "bf16"
    assert f"mma.sync.aligned.m16n8k16.row.col.f32.{t}.{t}.f32" in src
    assert "ldmatrix.sync.aligned.m8n8.x4.shared.b16" in src and "ldmatrix.sync.aligned.m8n8.x4.trans" in src


def test_refuses_an_intrinsic_of_the_other_type(monkeypatch) -> None:
    import schedules.recipes.gemm_mma as gm

    # the recipe asking for the half instruction on float32 tiles, and for the TF32 one on float16 tiles
    for dtype, wrong, hint in [("float32", "mma.m16n8k16", "float32 operands take 'mma.m16n8k16.tf32x3'"),
                               ("float16", "mma.m16n8k16.tf32x3", "float16 / bfloat16 operands take 'mma.m16n8k16'")]:
        s, _ = _sched(dtype=dtype)
        monkeypatch.setattr(gm, "mma_kind", lambda dt, wrong=wrong: wrong)
        named = fr"operands .A_shared. \({dtype}\) and .B_shared. \({dtype}\)"  # the offending tiles
        with pytest.raises(TensorizeError, match=f"{named} of {wrong} must be both .*{hint}"):
            gm.schedule_gemm_mma(s, **SMALL)


def test_refuses_wrong_extents_and_unknown_intrinsic() -> None:
    s, _ = _sched()
    name = "matmul"
    i, j, k = s.loops(name)[-3:]
    with pytest.raises(TensorizeError, match="perfect nest|extents"):
        s.tensorize(i)
    with pytest.raises(TensorizeError, match="unknown intrinsic"):
        s.tensorize(i, "mma.m8n8k4")


def test_refuses_global_operands_and_wrong_layout() -> None:
    s, _ = _sched()
    i, j, k = s.loops("matmul")[-3:]
    ih, ir = s.split(i, 2)
    jh, jr = s.split(j, 2)
    ko, ki = s.split(k, 16)
    s.reorder(ih, jh, ko, ir, jr, ki)
    with pytest.raises(TensorizeError, match="local"):
        s.tensorize(ir)


def test_refuses_bad_tiles() -> None:
    from loopir.errors import ArgumentError

    s, _ = _sched()
    with pytest.raises(ArgumentError, match="multiple of the warp tile"):
        schedule_gemm_mma(s, block=(64, 64), warp=(24, 32), k_tile=32)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("size", [(256, 256, 256), (200, 136, 64), (4096, 4096, 4096), (4000, 4000, 4000)])
def test_gpu_gemm_mma(dtype: str, size: tuple[int, int, int]) -> None:
    from codegen import build

    n, m, p = size
    s, wl = _sched(n, m, p, dtype)
    schedule_gemm_mma(s)
    mod = build(s, list(wl.inputs) + list(wl.outputs), target="cuda")
    host, f64 = _inputs(wl, dtype, n, m, p, seed=7)
    out = _out(dtype, n, m)
    mod(*host, out)
    ref = np.maximum(f64[0] @ f64[1] + f64[2], 0.0)
    assert _rel(_as64(out, dtype), ref) < 1e-2


# ----------------------------------------------------------------------------- auto_schedule takes tensor cores


def _ref(f64: list[np.ndarray]) -> np.ndarray:
    a, b, bias = f64
    return np.maximum(a @ b + bias, 0)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_auto_schedule_uses_tensor_cores_for_half_gemm(dtype: str) -> None:
    from codegen import build
    from schedules import auto_schedule

    n, m, p = 256, 128, 64
    wl = w.matmul_bias_relu(n=n, m=m, p=p, dtype=dtype)
    s = auto_schedule(list(wl.outputs), "cuda", gemm={"wgmma": False})  # Hopper's recipe: tests/test_wgmma.py
    assert "tensor cores" in s.plan.explain() and "mma.sync m16n8k16" in s.plan.explain()
    mod = build(s, list(wl.args), target="cuda")
    assert "mma.sync.aligned.m16n8k16" in mod.source
    host, f64 = _inputs(wl, dtype, n, m, p, seed=3)
    out = _out(dtype, n, m)
    interp.run(mod.program, *host, out, gpu_order="reversed")
    assert _rel(_as64(out, dtype), _ref(f64)) < 1e-2


def test_auto_schedule_tensor_cores_symbolic_rows_and_columns() -> None:
    """Symbolic rows and columns (a constant reduction length, a multiple of 32) take the tensor-core recipe."""
    from codegen.passes import lower as lower_cuda
    from schedules import auto_schedule

    wl = w.matmul_bias_relu(p=64, dtype="float16")
    s = auto_schedule(list(wl.outputs), "cuda")
    assert "tensor cores" in s.plan.explain()
    n, m, p = 136, 72, 64
    host, f64 = _inputs(wl, "float16", n, m, p, seed=13)
    out = _out("float16", n, m)
    interp.run(lower_cuda(s.program, "cuda"), *host, out, gpu_order="reversed")
    assert _rel(_as64(out, "float16"), _ref(f64)) < 1e-2


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_tensor_cores_take_the_float32_accumulation_idiom(dtype: str) -> None:
    """sum(cast(float32, A) * cast(float32, B)): the product of two halves is exact in float32, so the instruction
    computes the same values; auto_schedule takes tensor cores for it (it took the SIMT recipe before)."""
    from codegen import build, gpu_available
    from loopir import te
    from schedules import auto_schedule

    n, m, p = te.var("n"), te.var("m"), 64
    A, B = te.placeholder((n, p), dtype, name="A"), te.placeholder((p, m), dtype, name="B")
    bias = te.placeholder((m,), dtype, name="bias")
    k = te.reduce_axis(p, "k")
    mm = te.compute((n, m), lambda i, j: te.sum(te.cast("float32", A[i, k]) * te.cast("float32", B[k, j]), axis=k),
                    name="matmul")
    C = te.compute((n, m), lambda i, j: te.cast(dtype, te.maximum(mm[i, j] + te.cast("float32", bias[j]), 0.0)),
                   name="C")
    s = auto_schedule([C], "cuda")
    assert "tensor cores" in s.plan.explain()
    assert "mma.sync.aligned.m16n8k16" in build(s, [A, B, bias, C], target="cuda").source
    wl = w.matmul_bias_relu(p=p, dtype=dtype)  # only for _inputs' shapes
    host, f64 = _inputs(wl, dtype, 136, 72, p, seed=21)
    for order in ("reversed", "forward"):
        out = _out(dtype, 136, 72)
        interp.run(lower_passes(s.program, "cuda"), *host, out, gpu_order=order, sizes={"n": 136, "m": 72})
        assert _rel(_as64(out, dtype), _ref(f64)) < 1e-2
    if gpu_available():  # and the instruction itself, on the device
        out = _out(dtype, 136, 72)
        build(s, [A, B, bias, C], target="cuda")(*host, out)
        assert _rel(_as64(out, dtype), _ref(f64)) < 1e-2


def test_auto_schedule_keeps_simt_where_tensor_cores_do_not_apply() -> None:
    from schedules import auto_schedule

    # K = 36: A's rows off 16-byte boundaries; K = 24: under one k tile; 8 rows: skinny, fewer than a fragment's
    # 16; float64 inputs; float32 with K = 36 (float32 with K a multiple of 8: mma.m16n8k16.tf32x3,
    # tests/test_gemm_tf32.py; a half skinny GEMM of 16 rows or more: tests/test_split_k.py)
    for n, m, p, dt in [(256, 128, 36, "float16"), (256, 128, 24, "float16"), (8, 128, 64, "float16"),
                        (256, 128, 64, "float64"), (256, 128, 36, "float32")]:
        wl = w.matmul_bias_relu(n=n, m=m, p=p, dtype=dt)
        assert "tensor cores" not in auto_schedule(list(wl.outputs), "cuda").plan.explain(), (n, m, p, dt)


@pytest.mark.gpu
@pytest.mark.parametrize("size", [(1000, 1000), (4000, 4096), (100, 300)])
def test_gpu_auto_tensor_core_symbolic_rows_columns(size: tuple[int, int]) -> None:
    from codegen import build

    wl = w.matmul_bias_relu(p=512, dtype="float16")
    mod = build(list(wl.outputs), list(wl.args), target="cuda")
    assert "mma.sync" in mod.source
    n, m = size
    host, f64 = _inputs(wl, "float16", n, m, 512, seed=6)
    out = _out("float16", n, m)
    mod(*host, out)
    assert _rel(_as64(out, "float16"), _ref(f64)) < 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_gpu_auto_tensor_core_gemm_matches_float64(dtype: str) -> None:
    from codegen import build

    n, m, p = 1000, 1024, 512
    wl = w.matmul_bias_relu(n=n, m=m, p=p, dtype=dtype)
    mod = build(list(wl.outputs), list(wl.args), target="cuda", schedule={"gemm": {"wgmma": False}})
    assert "mma.sync" in mod.source  # the default on Hopper is the warpgroup recipe: tests/test_wgmma.py
    host, f64 = _inputs(wl, dtype, n, m, p, seed=5)
    out = _out(dtype, n, m)
    mod(*host, out)
    assert _rel(_as64(out, dtype), _ref(f64)) < 1e-2


def _fragment_nest(a_shape: tuple[int, ...]):
    """One lane's m16n8k16 nest reading A from a shared tile of `a_shape` (its last two dimensions rows, k) and B
    from a 16 x 8 tile: (the eh loop, the lanes)."""
    from loopir.nodes import Buffer, Cast, For, Store, Var, const

    lane, eh, el, k = (Var(x) for x in ("lane", "eh", "el", "k"))
    a = Buffer("A_shared", a_shape, "float16", "shared")
    b = Buffer("B_shared", (16, 8), "float16", "shared")
    acc = Buffer("acc", (2, 2), "float32", "local")
    lead = (const(0),) * (len(a_shape) - 2)
    row = lane // 4 + 8 * eh
    val = acc[eh, el] + Cast("float32", a[(*lead, row, k)]) * Cast("float32", b[k, 2 * (lane % 4) + el])
    st = Store("upd", acc, (eh, el), val, (lane, eh, el, k), (lane, eh, el, k))
    f = For(eh, const(0), const(2), For(el, const(0), const(2), For(k, const(0), const(16), st)))
    return f, {lane: For(lane, const(0), const(32), f, "thread", "threadIdx.x")}


def test_tensorize_takes_a_unit_leading_tile_dimension_and_refuses_a_wider_one():
    from schedules.primitives.tensorize import mma_operands

    f, lanes = _fragment_nest((1, 16, 16))
    assert mma_operands(f, lanes).a.buffer.name == "A_shared"  # a batched GEMM's tile: batch extent 1
    f, lanes = _fragment_nest((2, 16, 16))
    with pytest.raises(TensorizeError, match="operand 'A_shared' must be a 2-d shared tile"):
        mma_operands(f, lanes)
