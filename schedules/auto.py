"""auto_schedule: the fusion plan plus a default mapping for each kernel, built from checked
Schedule primitives (every step is verified against the dependences and recorded in the trace).

    s = auto_schedule([y], target="cuda")      # a Schedule; s.plan.explain() says why
    mod = build(s, [x, y], target="cuda")

Per kernel of the plan (`schedules.fusion`):
1. `compute_inline` every stage the plan inlines; `fuse` the shared outer loops of the stages
   the plan groups (vertical and horizontal fusion are both loop fusion here);
2. the mapping —
   * cuda "flat" (elementwise): `collapse` the loops, `split` by 4 + `vectorize` (float4 accesses;
     run-time checked by the target unless 4 provably divides the row), `split` by the block size
     (128), `split` by `per_thread` (2 chunks of 16 bytes per thread, coalesced: `reorder` + `unroll`),
     `bind` blockIdx / threadIdx.x;
   * cuda "row" (a reduction with its prologue and epilogue): the shared outer loops collapsed and
     bound to blockIdx.x; in each phase below, a reduction loop becomes a cross-thread reduction
     (`bind_reduction(k, threads=128)`: strided per-thread shares, then combined across the block)
     and a spatial loop is `split` by 4 (vectorized when the row length is a constant multiple of 4)
     and by the block size, the inner part bound to threadIdx.x;
     A row read by several phases is kept in shared memory (`cache_read`; `cache_row` when its length is
     symbolic: dynamic shared memory, sized per launch); rows of 8192 elements or more get 512 threads;
   * cuda "warp" (rows shorter than a block, `schedules.rows`): the row loop `split` by the rows per block
     (threadIdx.y), each phase over W <= 16 lanes (threadIdx.x), reductions by shuffles within a row;
   * cuda "split" (very wide rows, too few to fill the GPU, `schedules.rows`): the stages stay apart; each
     reduction `split` into chunks and `rfactor`ed (partials over rows x chunks blocks, then a combine per
     row), the elementwise phases flat;
   * cuda "thread": the shared outer loops collapsed, one thread per point, inner loops serial;
   * cpu: the outer loop `parallel`, the innermost spatial loop of each elementwise phase
     `vectorize`d when it carries nothing;
   * "gemm" (a matmul-shaped reduction with its elementwise epilogue chain, e.g. relu(A @ B + bias)):
     the tiled GEMM recipe of `schedules.gemm` instead of loop fusion — on cuda `schedule_gemm_cuda`
     (block tiles staged in shared memory, a register tile per thread; defaults block 64x128,
     thread_tile 8x8, k_tile 16, the measured best on an H200), on cpu the register-tiled CPU recipe —
     with the epilogue computed on the register tile before the single store. The tile sizes are
     parameters: `auto_schedule(outs, "cuda", gemm={"block": (128, 128), "k_tile": 8})` (keys:
     `schedules.gemm.GEMM_KEYS`); `gemm=False` maps matmuls like any other reduction.
`fuse=False` maps each stage as its own kernel (no inlining), for comparison.
"""

from __future__ import annotations

from typing import Any

import islpy as isl

from loopir import poly
from loopir.affine import multiple_of, same_value, simplify
from loopir.dtypes import vector_lanes
from loopir.errors import ArgumentError, ArgumentTypeError
from loopir.lower import lower
from loopir.nodes import Allocate, Const, Expr, For, If, Load, Seq, Store, Var
from loopir.subst import stages_of
from loopir.te import Tensor
from loopir.te_scan import is_recurrence, statement_names
from loopir.visit import deep_recursion, free_vars, substitute, walk

from .attention import (
    KEY_TILE, ROWS_PER_BLOCK, AttentionParams, AttentionPlan, apply_online, attention_params, attention_rewrites,
    map_online, on_tensor_cores, online_stages, schedule_attention,
)
from .errors import InexactCheckError, ScheduleError
from .fusion import THREADS, Decision, FusionGroup, FusionPlan, plan_fusion
from .rows import RowParams
from .primitives import find_loop
from .primitives.cache import reduction_parts
from .primitives.extents import padded_trip
from .gemm_mapping import map_gemm
from .schedule import Schedule

__all__ = ["auto_schedule", "map_statements"]

PER_THREAD = 2  # 16-byte chunks per thread in vectorized flat kernels (benchmarks/gpu_suite.py --sweep)


def auto_schedule(
    outputs: Tensor | list[Tensor],
    target: str = "cuda",
    fuse: bool = True,
    sizes: dict[Any, int] | None = None,
    threads: int = THREADS,
    plan: FusionPlan | None = None,
    check: bool = True,
    per_thread: int = PER_THREAD,
    gemm: dict[str, Any] | bool | None = None,
    online: bool | dict[str, Any] | AttentionParams = True,
    rows: RowParams | dict | None = None,
    bounds: dict[Any, int] | None = None,
) -> Schedule:
    """A Schedule of `outputs` fused as `plan_fusion` decides and mapped to `target` ("cuda" or "cpu").

    The plan is kept as `schedule.plan` (`schedule.plan.explain()` is the readable log). `sizes`
    are the sizes the cost model assumes; `threads` the block size of the CUDA mappings;
    `per_thread` how many 16-byte chunks each thread of a vectorized flat kernel handles.
    `gemm`: tile parameters of the GEMM kernels of matmul-shaped reductions (cuda: "block",
    "thread_tile", "k_tile", "shared", "strided", "unroll_k"; cpu: "cpu_tile"; the recipe's defaults
    for those not given); False: no GEMM mapping. ValueError naming an unknown key or a tile size
    the device cannot hold. `online`: a softmax(.) V chain gets the online-softmax rewrite
    (`schedules.attention`); False keeps the chain materialized as the fusion plan maps it; a dict of
    `AttentionParams` fields ("wgmma", "tensor_cores", "tf32": bools) rewrites it and picks the tensor-core
    kernels its pass is offered.
    `rows`: the row strategies' thresholds (`schedules.rows.RowParams` or a dict of its fields:
    wide_row, wide_threads, split_row_min, split_rows_per_sm, split_waves, split_threads).
    `bounds` ({size Var or name: int}): upper bounds of symbolic sizes that every call meets (call-time
    specialization by row class gives them): the schedule's first steps `assume` them (each call checks
    them), and a row of a symbolic length so bounded is planned like a row of the bound's length (register
    rows: its chunk loops padded to constant trip counts, `pad_loop`). The cost model evaluates a bounded size
    at its bound unless `sizes` gives it."""
    if not isinstance(outputs, Tensor) and not (isinstance(outputs, (list, tuple)) and outputs
                                                and all(isinstance(t, Tensor) for t in outputs)):
        raise ArgumentTypeError(
            f"auto_schedule takes a te tensor or a non-empty list of them (the outputs), got "
            f"{type(outputs).__name__}; a Program or Schedule is scheduled by hand (Schedule(program))")
    outs = [outputs] if isinstance(outputs, Tensor) else list(outputs)
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 32 or threads > 1024 or threads % 32:
        raise ArgumentError(f"auto_schedule: threads must be a multiple of 32 in [32, 1024], got {threads!r}")
    if isinstance(per_thread, bool) or not isinstance(per_thread, int) or not 1 <= per_thread <= 16:
        raise ArgumentError(f"auto_schedule: per_thread must be an int in [1, 16], got {per_thread!r}")
    recurrences = [t for t in stages_of(outs) if is_recurrence(t)]
    if recurrences and plan is None:
        fuse = False  # a scan / update stage is several nests: each stage its own kernel (no inlining into one)
    rewrites = []
    params = attention_params(online) if online is not False else AttentionParams()
    if online is not False and fuse and plan is None:  # softmax(.) V chains: the online rewrite (attention.py)
        s_online = schedule_attention(outs, target, check=check, params=params)
        if s_online is not None:  # the program is the attention chain alone
            return s_online
        with deep_recursion():  # a chain among other stages: its pass is one kernel of the plan
            rewrites = attention_rewrites(lower(outs))
    plan = plan or plan_fusion(outs, target=target, fuse=fuse, sizes={**(bounds or {}), **(sizes or {})} or None,
                               gemm=gemm, rows=rows, online=[online_stages([r]) for r in rewrites], bounds=bounds)
    s = Schedule(outs, check=check)
    s.plan = plan  # type: ignore[attr-defined]
    for v, b in (bounds or {}).items():
        s.assume(v, at_most=b)
    done = apply_online(s, rewrites)  # first: the rewrite takes the chain's unscheduled nests
    for t in plan.inlined:
        s.compute_inline(t)
    for g in plan.groups:
        # the GEMM recipe fuses its epilogue itself (cache_write ... epilogue=); split rows stay apart (rfactor
        # moves each reduction's partials before its nest, which must not hold what they read)
        if g.mapping not in ("gemm", "split", "online"):
            _fuse_group(s, g)
    for g in plan.groups:
        if g.mapping == "online":
            continue
        if any(is_recurrence(t) for t in g.stages):
            for t in g.stages:
                _map_recurrence(s, t, target, threads)
            g.mapping = "serial"  # what the plan printed (flat, cpu) is not what ran: the note below says what did
            g.log.append(Decision("note", tuple(g.stage_names), None, _RECURRENCE_NOTE[target == "cuda"]))
        elif g.mapping == "gemm":
            map_gemm(s, g, target)
        elif target == "cuda" and g.mapping == "split":
            _map_split_rows(s, g, threads, per_thread)
        elif target == "cuda":
            _map_cuda(s, g, threads, per_thread)
        else:
            _map_cpu(s, g)
    if done:
        notes = map_online(s, done, target, params=params)
        g = next(g for g in plan.groups if g.mapping == "online")
        g.log += [Decision("note", tuple(r.max_stage for r in done), None, line) for line in
                  AttentionPlan(tuple(done), target, ROWS_PER_BLOCK, KEY_TILE, tuple(notes),
                                on_tensor_cores(s.program)).explain().splitlines()]
    return s


# ----------------------------------------------------------------------------- loop fusion


def _fuse_group(s: Schedule, g: FusionGroup) -> None:
    first = g.stages[0].name
    for t in g.stages[1:]:
        for d in range(g.depth):
            la, lb = s.loops(first)[d], s.loops(t.name)[d]
            if la.var is not lb.var:
                s.fuse(la, lb)


# ----------------------------------------------------------------------------- GEMM


def _group_root(s: Schedule, g: FusionGroup) -> list[Any]:
    """Handles of the group's shared outer loops (outermost first)."""
    return list(s.loops(g.stages[0].name)[: g.depth])


def _is_const(e: Expr, v: int) -> bool:
    e = simplify(e)
    return isinstance(e, Const) and e.value == v


def _collapse(s: Schedule, loops: list[Any], symbolic: bool = False) -> list[Any]:
    """Collapse the nested `loops` into one where the checker can prove it legal and the inner extent
    is a constant (or, with `symbolic`, any extent) — else the loops stay separate (and map to several grid
    dimensions). With a symbolic inner extent n the collapsed index (v // n, v % n) is not quasi-affine (nor
    is the extent m * n): collapse refuses a nest whose statements depend on each other, and the lowering
    places the instances of one without dependences by their loop values and the accesses by their flat
    offsets (x[v // n, v % n] is x[v]: codegen.passes.barriers, loopir.bounds), which only a pointwise nest
    keeps affine: `symbolic` is for those."""
    out = [loops[0]]
    for nxt in loops[1:]:
        f = find_loop(s.program, nxt.var)
        if not symbolic and not isinstance(simplify(f.hi - f.lo), Const):
            out.append(nxt)
            continue
        try:
            out[-1] = s.collapse(out[-1], nxt)
        except (ScheduleError, InexactCheckError, ArgumentError):
            out.append(nxt)
    return out


_BLOCK_AXES = ("blockIdx.x", "blockIdx.y", "blockIdx.z")


def _bind_blocks(s: Schedule, loops: list[Any]) -> None:
    """Bind loops (outermost first) to blockIdx: the innermost gets x (the largest grid extent)."""
    if len(loops) > len(_BLOCK_AXES):
        loops = _collapse_strict(s, loops, len(_BLOCK_AXES))
    for h, axis in zip(reversed(loops), _BLOCK_AXES):
        s.bind(h, axis)


def _collapse_strict(s: Schedule, loops: list[Any], keep: int) -> list[Any]:
    loops = list(loops)
    while len(loops) > keep:
        loops[0:2] = [s.collapse(loops[0], loops[1])]
    return loops


def _map_cuda(s: Schedule, g: FusionGroup, threads: int, per_thread: int = 1) -> None:
    if g.depth == 0:  # a scalar stage: one thread does it (the target launches a 1-thread kernel)
        return
    root = _group_root(s, g)
    if g.mapping in ("flat", "thread"):
        lanes = _flat_lanes(g)  # 16 bytes of the stages' dtype: float32 4, float16 / bfloat16 8
        # every access reads or writes the point it computes, in arrays of one shape: collapsed, each access is
        # contiguous in the flat index (the target folds `(f // n) * n + f % n` to `f`), so the nest vectorizes
        # whatever the row length, an odd one (1024 x 50257) included, with no row-length test at run time.
        # A symbolic row length collapses too: the bounds and barrier passes place a collapsed instance by its
        # loop values and an access by its flat offset (a bias b[f % n] is in bounds for any f), so a call's row
        # length need not be a multiple of the lanes, nor long enough to fill a block. H200, symbolic sizes,
        # rows apart -> collapsed: horizontal 1024 x 50257 f32 0.95 -> 0.21 ms (4.5x -> 0.99x torch.compile;
        # the vectors were refused at run time), f16 0.77 -> 0.11 ms; GELU f16 0.22 -> 0.057 ms; GELU 65536 x 64
        # f32 0.044 -> 0.017 ms (16 of a block's 128 threads had a column)
        # A broadcast operand (`b[j]`, per-lane scalar loads once collapsed) joins only where the row length is
        # not provably whole vectors (an odd constant; a symbolic n, or 4*n4 for 8 half lanes, whose call-time
        # key says no more), where the rows kept apart could not vectorize (H200, 1024 x 50257: GELU 39% -> 95%
        # of the DRAM floor at the fixed size; bias+GELU f16 symbolic 0.197 -> 0.106 ms)
        width = simplify(g.stages[0].shape[-1]) if len(g.stages[0].shape) >= 2 else None  # rows: misaligned
        odd = isinstance(width, Const) and lanes > 0 and int(width.value) % lanes != 0
        ragged = width is not None and lanes > 0 and not multiple_of(width, lanes)
        nest = find_loop(s.program, root[0].var)
        const_rows = all(isinstance(simplify(d), Const) for d in g.stages[0].shape[1:])
        flat = g.mapping == "flat" and lanes > 0 and len(root) >= 2 and _pointwise(nest, broadcast=ragged)
        if flat:
            root = _collapse(s, root, symbolic=not const_rows)
            flat = len(root) == 1
        # otherwise a row length known not to be a multiple of the lanes would fail the run-time check of every
        # vector and run guarded scalars: map it as scalars over the collapsed loops instead
        vec = g.mapping == "flat" and lanes > 0 and (flat or not odd)
        if vec:
            # 128-bit accesses: a 4-wide vector loop innermost — unguarded when 4 provably divides the
            # extent; otherwise guarded, and the target checks at run time (size divisible by 4, guard
            # true for the last lane, 16-byte aligned pointers) before taking the float4 path
            jo, lane = s.split(root[-1], lanes)
            s.vectorize(lane)
            root = root[:-1] + [jo]
        rows = g.stages[0].shape[0]
        # with a vector lane, keep the row loop apart: the vector base stays affine, so the target can
        # check (or prove) its 16-byte alignment — a collapsed index i = f // n, j = f % n is not affine
        # and costs a 64-bit division per element. Rows go to blockIdx.y when provably <= 65535, else to
        # blockIdx.x (2^31 - 1) with the column blocks on blockIdx.y
        loops = root if vec and len(root) == 2 else _collapse(s, root)
        apart = len(loops) == 2
        rows_on_y = apart and isinstance(rows, Const) and rows.value <= 65535
        bo, bi = s.split(loops[-1], threads)
        if vec and per_thread > 1:
            # several 16-byte chunks per thread, each chunk coalesced across the block
            # (flat = ((b * U + u) * T + t) * 4 + lane): more bytes in flight per thread
            bo, u = s.split(bo, per_thread)
            s.reorder(bi, u)
            s.unroll(u)
        s.bind(bi, "threadIdx.x")
        if apart and not rows_on_y:
            s.bind(loops[0], "blockIdx.x")
            s.bind(bo, "blockIdx.y")
        else:
            _bind_blocks(s, loops[:-1] + [bo])
        return
    blocks = _collapse(s, root)
    if g.mapping == "warp" and g.strategy is not None and len(blocks) == 1:
        _map_warp_rows(s, g, blocks[0])
        return
    # "row" (and "warp" rows whose loops stay apart): one block per point of the shared loops, threads
    # across each phase below
    cluster = g.strategy.cluster if g.strategy is not None else 0
    if cluster:  # a cluster row: its blocks take the grid's y axis, so the rows are one loop on x
        blocks = _collapse_strict(s, blocks, 1)
    _bind_blocks(s, blocks)
    if cluster:
        s.pragma(blocks[-1], "cluster", cluster)
    for c in g.caches:  # rows that several phases read, kept in shared memory (the plan checked the size)
        if all(isinstance(simplify(d), Const) for d in c.tensor.shape[g.depth:]):
            s.cache_read(c.tensor, c.scope, blocks[-1])
        else:  # a row of symbolic length: dynamic shared memory, sized per launch
            s.cache_row(c.tensor, blocks[-1])
    if g.strategy is not None and g.strategy.name == "block":  # very wide rows: more threads per row
        threads = g.strategy.lanes if cluster else max(threads, g.strategy.lanes)
    registers = g.strategy is not None and g.strategy.registers
    for phase in _phases(s, blocks[-1].var):
        if _is_reduction_loop(phase):
            n = simplify(phase.hi - phase.lo)
            vl = _row_lanes(s, _load_lanes(phase), n, g) if registers or not g.caches else 0
            if vl and _is_const(phase.lo, 0) and multiple_of(n, vl):
                # register rows: thread t's share is the 16-byte chunks t, t + T, ..., as in the copy and the
                # epilogue below, so that each cached element has one owner thread (codegen.passes.registers); a
                # row no cache holds is read in those chunks too, one 128-bit load each (H200, symbolic 1024 x
                # 65536 float16: softmax 0.189 -> 0.138 ms, layer norm 0.157 -> 0.138 ms)
                _bind_chunks(s, phase.var, vl, threads)
            else:
                _bind_reduction(s, phase.var, threads, pad=registers)
        else:
            while isinstance(phase.body, For) and _is_const(phase.hi - phase.lo, 1):
                phase = phase.body  # e.g. the row copy of cache_read: for c0 in 0..1: for c1 in 0..n
            var = phase.var
            lanes = _row_lanes(s, _store_lanes(phase.body), phase.hi, g)
            if _is_const(phase.lo, 0) and multiple_of(phase.hi, lanes) and _single_store(phase.body):
                # 128-bit accesses along the row (the row copy into shared memory and the epilogue)
                var, lane = s.split(var, lanes)
                s.vectorize(lane)
            jo, ti = s.split(var, threads)
            if registers:
                _pad_to_bound(s, jo)
            _unroll_symbolic(s, jo, SYMBOLIC_SPATIAL_UNROLL)
            s.bind(ti, "threadIdx.x")


# a thread's share of a reduction whose trip count is known only at run time (a symbolic row length) is unrolled
# by this many: as many loads in flight as a fixed-size kernel, whose constant trip count NVCC unrolls whole
SYMBOLIC_SHARE_UNROLL = 8
SYMBOLIC_SPATIAL_UNROLL = 4  # the same for a spatial phase's loop over a thread's 16-byte chunks of a row


def _bind_reduction(s: Schedule, loop: Any, threads: int, pad: bool = False) -> None:
    """`bind_reduction(loop, threads=threads)`, the thread's share unrolled by SYMBOLIC_SHARE_UNROLL where its
    trip count is not a constant (NVCC unrolled such a loop by 4, one predicated load per iteration); with `pad`,
    first padded to the constant its assumed sizes bound it by (`_pad_to_bound`)."""
    share = s.bind_reduction(loop, threads=threads)[1]
    if pad:
        _pad_to_bound(s, share)
    _unroll_symbolic(s, share, SYMBOLIC_SHARE_UNROLL)


# a loop of a symbolic trip count that the program's assumed sizes bound by at most this many iterations is padded
# to that constant (register rows of a bounded symbolic length: REGISTER_ROW_ELEMENTS per thread at most)
PAD_MAX = 32


def _pad_to_bound(s: Schedule, loop: Any) -> None:
    """`pad_loop(loop, K)` where its trip count is symbolic and the program's `assume`d sizes bound it by K <=
    PAD_MAX: a register row's chunk loops of a symbolic row length get constant trip counts, so that the
    row stays in registers (codegen.passes.registers unrolls them)."""
    k = padded_trip(s.program, loop.var, PAD_MAX)
    if k is not None:
        s.pad_loop(loop, k)


def _bind_chunks(s: Schedule, loop: Any, lanes: int, threads: int) -> None:
    """A reduction loop `split` into 16-byte chunks of `lanes` elements (the chunk unrolled: one 128-bit load in the
    renderer), the chunks `bind_reduction`ed over `threads` (thread t: chunks t, t + threads, ...), a symbolic
    share padded to its assumed bound (`_pad_to_bound`)."""
    kq, kv = s.split(loop, lanes)
    s.unroll(kv)
    _bind_reduction(s, kq, threads, pad=True)


def _unroll_symbolic(s: Schedule, loop: Any, by: int) -> None:
    f = find_loop(s.program, loop.var)
    if f.kind == "serial" and not isinstance(simplify(f.hi - f.lo), Const):
        s.pragma(loop, "unroll", by)


def _pointwise(nest: For, broadcast: bool = False) -> bool:
    """Every store of `nest` writes the point of its own instance (indices = its iteration variables) and every
    load reads that same point of an array of the store's shape (no shift); with `broadcast`, also the trailing
    coordinates of the point in an array of the trailing dimensions (a bias `b[j]` beside `x[i, j]`)."""
    stores = [n for n in walk(nest) if isinstance(n, Store)]
    for st in stores:
        if len(st.indices) < 2 or len(st.indices) != len(st.iters) or any(
                a is not b for a, b in zip(st.indices, st.iters)):
            return False
        for ld in walk(st.value):
            if not isinstance(ld, Load):
                continue
            k = len(ld.indices)
            tail = len(st.indices) - k  # the leading coordinates a broadcast operand does not have
            if not (tail == 0 or (broadcast and 0 <= tail < len(st.indices))) or ld.indices != st.indices[tail:] \
                    or len(ld.buffer.shape) != k \
                    or not all(same_value(a, b) for a, b in zip(ld.buffer.shape, st.buffer.shape[tail:])):
                return False
    return bool(stores)


def _flat_lanes(g: FusionGroup) -> int:
    """Lanes of a 16-byte access when every stage of `g` has one dtype that has one (else 0)."""
    dts = {t.dtype for t in g.stages}
    return vector_lanes(dts.pop()) if len(dts) == 1 else 0


def _load_lanes(phase: For) -> int:
    """Lanes of a 16-byte access of the one dtype a reduction phase loads along its loop (0: several, none)."""
    dts = {n.buffer.dtype for n in walk(phase.body) if isinstance(n, Load)
           and any(phase.var in free_vars(i) for i in n.indices)}
    return vector_lanes(dts.pop()) if len(dts) == 1 and dts <= {"float32", "float16", "bfloat16"} else 0


def _row_lanes(s: Schedule, lanes: int, n: Any, g: FusionGroup) -> int:
    """The lanes of a vector access along a row of length `n` whose 16-byte access has `lanes` (float32 4,
    float16 / bfloat16 8): those, or half of them (an 8-byte access) where `n` is a multiple of half but not of all
    of them (a float16 row of 700: 175 loads of 4 halves, not 700 of one) and the plan's `rows.vector_bytes` is 8;
    the group's log says so once."""
    params = getattr(getattr(s, "plan", None), "row_params", None)
    if lanes in (4, 8) and not multiple_of(n, lanes) and multiple_of(n, lanes // 2) \
            and (params is None or params.vector_bytes == 8):
        note = (f"8-byte accesses along the row ({lanes // 2} elements a load or store): its length {n} is not a "
                f"multiple of a 16-byte vector's {lanes}, its rows are 8-byte aligned (rows.vector_bytes 8)")
        if not any(d.reason == note for d in g.log):
            g.log.append(Decision("note", tuple(g.stage_names), None, note))
        return lanes // 2
    return lanes


def _store_lanes(body: Any) -> int:
    """Lanes of a 16-byte access of the dtype stored in a row phase (4 when it has none: not vectorized then)."""
    stores = [n for n in walk(body) if isinstance(n, Store)]
    return (vector_lanes(stores[0].buffer.dtype) or 4) if stores else 4


def _map_warp_rows(s: Schedule, g: FusionGroup, row: Any) -> None:
    """Rows of `g.strategy.lanes` threads (threadIdx.x), `g.strategy.rows` rows per block (threadIdx.y):
    the (collapsed) row loop `split` by the rows per block, each reduction phase `split` into 16-byte chunks
    (the chunk loop unrolled: one 128-bit load in the renderer) where the row is whole chunks and a row of the
    planned length gives every lane one, then `bind_reduction(threads=lanes)` over the chunks (over the elements
    otherwise), each spatial phase `split` by the lanes (and first by a 16-byte vector,
    vectorized, when the lanes' vectors tile the row, or when the row is whole vectors (a symbolic n = 16*n16)
    and a row of the planned length gives every lane one: then each vector is guarded, not each element)."""
    st = g.strategy
    assert st is not None
    bo, bi = s.split(row, st.rows)
    s.bind(bo, "blockIdx.x")
    s.bind(bi, "threadIdx.y")
    for phase in _phases(s, bi.var):
        if _is_reduction_loop(phase):
            n = simplify(phase.hi - phase.lo)
            vl = _row_lanes(s, _load_lanes(phase), n, g)
            if vl and _is_const(phase.lo, 0) and multiple_of(n, vl) and vl * st.lanes <= st.row_len:
                # each lane's share in 16-byte chunks: the unrolled chunk is one 128-bit load (the renderer's
                # vector reads), where 8 scalar 2-byte loads per chunk left the 16-bit rows issue-bound (ncu,
                # H200, softmax 65536 x 768 float16: SM 79%, DRAM 56%)
                _bind_chunks(s, phase.var, vl, st.lanes)
            else:
                _bind_reduction(s, phase.var, st.lanes, pad=True)
            continue
        var = phase.var
        n = simplify(phase.hi - phase.lo)
        vl = _row_lanes(s, _store_lanes(phase.body), n, g)  # 16 bytes: 4 floats or 8 halves (or 8 bytes)
        tiled = multiple_of(n, vl * st.lanes)
        if _is_const(phase.lo, 0) and _single_store(phase.body) and (
                tiled or (multiple_of(n, vl) and vl * st.lanes <= st.row_len)):
            # 128-bit accesses when the row is whole vectors; where the lanes' vectors do not tile it (a symbolic
            # n = 16*n16) each vector is guarded, not each element, if a row is long enough to give every lane
            # one (H200, 65536 x 768 float16 at symbolic sizes: softmax 0.108 -> 0.092 ms; x 64 keeps scalars)
            var, lane = s.split(var, vl)
            s.vectorize(lane)
        jo, ti = s.split(var, st.lanes)
        _pad_to_bound(s, jo)  # a row of an assumed bound: its constant trip count, as at fixed sizes
        _unroll_symbolic(s, jo, SYMBOLIC_SPATIAL_UNROLL)
        s.bind(ti, "threadIdx.x")


def _map_split_rows(s: Schedule, g: FusionGroup, threads: int, per_thread: int) -> None:
    """Rows split over several blocks (`schedules.rows`, strategy "split"); the group's stages are separate
    nests. Each reduction: its reduction loop `split` by the strategy's chunk, `rfactor` at the chunk loop;
    the partial nest on blockIdx.y (rows) x blockIdx.x (chunks), each chunk a cross-thread reduction of
    `strategy.lanes` threads; the combine one block per row (a 32-thread reduction over the chunks). The
    elementwise stages are flat kernels."""
    st = g.strategy
    assert st is not None and st.chunk > 0
    for t in g.stages:
        if len(t.shape) == g.depth and t.op.reduce_axis:
            loops = s.loops(t.name)
            ko, _ = s.split(loops[-1], st.chunk)
            part = s.rfactor(t.name, ko)  # its statements are named after the partial buffer
            pl = list(s.loops(part.name))
            rows = _collapse(s, pl[:g.depth])
            _bind_blocks(s, rows + [pl[g.depth]])
            s.bind_reduction(pl[-1], threads=st.lanes)
            comb = list(s.loops(t.name))
            blocks = _collapse(s, comb[:g.depth])
            _bind_blocks(s, blocks)
            s.bind_reduction(comb[-1], threads=32)
        else:  # an elementwise phase: the flat mapping of a group of its own
            _map_cuda(s, FusionGroup(t.name, [t], depth=len(t.shape), mapping="flat"), threads, per_thread)


def _single_store(body: Any) -> bool:
    """One Store, possibly under a guard (the bounds clip of a cache_read copy)."""
    if isinstance(body, If) and body.orelse is None:
        body = body.then
    return isinstance(body, Store)



def _phases(s: Schedule, block: Var) -> list[For]:
    """The loops directly under the block loop (through sequences, allocations and the guard of a split row
    loop), in order. Allocations nest: with two rows cached, the second row's allocation holds every phase after
    the first row's copy (missing them left a layer norm's sums on one thread: 1.8 ms for 0.02 predicted)."""
    out: list[For] = []

    def go(body: Any) -> None:
        if isinstance(body, Allocate):
            go(body.body)
        elif isinstance(body, If) and body.orelse is None:
            go(body.then)
        elif isinstance(body, Seq):
            for k in body.body:
                if isinstance(k, (Allocate, Seq, For)):
                    go(k)
        elif isinstance(body, For):
            out.append(body)

    go(find_loop(s.program, block).body)
    return out


def _is_reduction_loop(f: For) -> bool:
    """Every statement inside `f` accumulates into an element that does not change with `f`."""
    inner = {n.var for n in walk(f) if isinstance(n, For)}
    stores = [n for n in walk(f.body) if isinstance(n, Store)]
    if not stores:
        return False
    for st in stores:
        if reduction_parts(st) is None:
            return False
        sub = dict(zip(st.iters, st.coords))
        used = {n for ix in st.indices for n in walk(substitute(ix, sub)) if isinstance(n, Var)}
        if used & inner:
            return False
    return True


# ----------------------------------------------------------------------------- recurrences (te.scan, te.update)

_RECURRENCE_NOTE = {
    False: "recurrence: per definition, the loops that carry no dependence of its own moved outside and the "
           "outermost parallel; the others serial inside, in order",
    True: "recurrence: per definition, the loops that carry no dependence of its own moved outside and bound "
          "(threadIdx.x, blockIdx); the others serial inside each thread; a definition with none runs on one "
          "thread",
}


def _map_recurrence(s: Schedule, t: Tensor, target: str, threads: int) -> None:
    map_statements(s, statement_names(t.name, len(t.op.body.defs)), target, threads)


def map_statements(s: Schedule, stmts: list[str], target: str = "cuda", threads: int = THREADS) -> Schedule:
    """Map the nest of each statement in `stmts` (freshly lowered: one loop per iteration dimension) with
    checked primitives: its dependence-free loops moved outside (`reorder`), the loops that carry a
    dependence (a scan axis, a scatter's domain) serial inside them. cpu: the outermost free loop of extent
    > 1 `parallel` (the innermost split into vectorized blocks inside the carrying loops when it is free:
    `_map_recurrence_cpu`). cuda: the innermost free loop `split` by `threads` onto threadIdx.x, the rest
    onto blockIdx; a nest with no free loop runs on one thread (`split(loop, 1)`, the unit loop moved out
    and bound to blockIdx.x). auto_schedule maps te.scan / te.update stages so; a hand-written recurrence
    (the builder's prefix sum) the same way: `map_statements(Schedule(program), ["S"], "cuda")`."""
    for stmt in stmts:
        loops = list(s.loops(stmt))
        if not loops:
            continue
        free = _dependence_free(s, stmt, len(loops))
        par = [h for h, ok in zip(loops, free) if ok]
        ser = [h for h, ok in zip(loops, free) if not ok]
        if par and ser and loops != par + ser:
            s.reorder(*par, *ser)
        if target != "cuda":
            _map_recurrence_cpu(s, loops, par, ser)
            continue
        # a free loop of extent 1 (an update over a 1 x 1 box: free only because it has one value) takes no
        # thread: its statement's element would be "written by every thread" of the split, the guard aside
        wide = [h for h in par if not _at_most_one(simplify((f := find_loop(s.program, h.var)).hi - f.lo))]
        if not wide:
            outer, unit = s.split(loops[0], 1)
            s.reorder(unit, outer)
            s.bind(unit, "blockIdx.x")
            continue
        bo, bi = s.split(wide[-1], threads)
        s.bind(bi, "threadIdx.x")
        _bind_blocks(s, [h for h in par if h.var is not wide[-1].var] + [bo])
    return s


CPU_SCAN_BLOCK = 64  # columns per block of a recurrence on cpu: serial loop inside, the block vectorized


def _map_recurrence_cpu(s: Schedule, loops: list[Any], par: list[Any], ser: list[Any]) -> None:
    """cpu: with a carrying loop and the innermost (contiguous) loop free, the innermost is `split` into
    blocks, the block loop outside and `parallel`, the carrying loops inside it, the block's columns innermost
    and `vectorize`d (each step of the recurrence reads and writes whole rows of the block); otherwise the
    outermost free loop of extent > 1 `parallel`."""
    if ser and par and par[-1].var is loops[-1].var:
        bo, bi = s.split(par[-1], CPU_SCAN_BLOCK)
        s.reorder(*par[:-1], bo, *ser, bi)
        s.vectorize(bi)
        par = par[:-1] + [bo]
    wide = [h for h in par if not _at_most_one(simplify((f := find_loop(s.program, h.var)).hi - f.lo))]
    if wide:
        s.parallel(wide[0])


def _at_most_one(e: Expr) -> bool:
    """An extent of at most 1: the constant, or a min with such an operand (a scan's init rows, min(1, m))."""
    if isinstance(e, Const):
        return e.value <= 1
    return getattr(e, "op", None) == "min" and (_at_most_one(e.a) or _at_most_one(e.b))


def _dependence_free(s: Schedule, stmt: str, depth: int) -> list[bool]:
    """Per loop of the freshly lowered nest of `stmt` (its iteration dimensions): no dependence between two of
    its instances crosses two values of it (the delta of every dependence is 0 there). May-dependences
    (a scatter's accesses) count: they relate every pair, so their loops are never free."""
    name = poly._sanitize(stmt)
    maps = s.deps.all.get_map_list()
    deltas = None
    for k in range(maps.n_map()):
        m = maps.get_at(k)
        if m.get_tuple_name(isl.dim_type.in_) == name and m.get_tuple_name(isl.dim_type.out) == name:
            d = m.deltas()
            deltas = d if deltas is None else deltas.union(d)
    if deltas is None:
        return [True] * depth
    n = deltas.dim(isl.dim_type.set)
    out = []
    for k in range(depth):
        if k >= n:
            out.append(False)
            continue
        dk = deltas.project_out(isl.dim_type.set, k + 1, n - k - 1).project_out(isl.dim_type.set, 0, k)
        zero = isl.BasicSet.universe(dk.get_space()).fix_val(isl.dim_type.set, 0, isl.Val.int_from_si(dk.get_ctx(), 0))
        out.append(dk.subtract(zero).is_empty())
    return out


# ----------------------------------------------------------------------------- CPU


def _map_cpu(s: Schedule, g: FusionGroup) -> None:
    if g.depth == 0:
        return
    root = _group_root(s, g)
    s.parallel(root[0])
    # vectorize the innermost loop of each elementwise phase (a hint to LLVM's vectorizer)
    for t in g.stages:
        loops = s.loops(t.name)
        if len(loops) < 2 or len(loops) != len(t.shape):
            continue  # 1-D (the loop is parallel) or a reduction phase (its innermost loop accumulates)
        inner = loops[-1]
        f = find_loop(s.program, inner.var)
        if f.kind == "serial" and not any(isinstance(n, For) for n in walk(f.body)):
            try:
                s.vectorize(inner)
            except ScheduleError:  # carries a dependence: leave it serial (the plan stays valid)
                pass
