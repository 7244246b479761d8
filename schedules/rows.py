"""Row kernels on CUDA: which strategy a group of row phases gets, and what it keeps in shared memory.

The fusion planner (`schedules.fusion`) groups a reduction with its prologue and epilogue under a shared
row loop (row softmax: max, sum of exp, normalize). How those rows map to the GPU depends on the row
length L and the row count R, evaluated at the plan's sizes (`auto_schedule(..., sizes=)`; a symbolic size
not given is unknown, and then the safe block-per-row strategy is kept):

* **warp** — L shorter than a block's threads (128): W lanes of a warp per row (W = 16, half a warp, or a
  smaller power of two for rows shorter than 32), THREADS // W rows per block on threadIdx.y; the reductions
  are shuffles within the row's lanes (`Kernel.subwarp`), with no shared scratch. This is also strategy (d)
  of issue 11, several rows per block for short rows. A kernel planned so is correct at every size (each
  lane strides over the row). Longer rows measured slower this way than with a block per row (each phase
  re-reads the row; see `choose_row_strategy`).
* **block** — one block per row: THREADS threads, WIDE_THREADS from WIDE_ROW elements on; block all-reduces,
  128-bit accesses where the row length is a constant multiple of 4; a row read by several phases is kept
  in shared memory when the kernel's whole shared-memory budget allows it (`plan_row_caches`), in dynamic
  shared memory when it is symbolic or above 48 KiB.

* **cluster** — a block row longer than register rows go (REGISTER_ROW_MAX) and up to CLUSTER_ROW_MAX elements,
  of a constant (or call-time bounded) length, several phases reading it: one row per *thread-block cluster* of
  C = 2..8 blocks of CLUSTER_THREADS threads (sm_90). The cluster is one virtual block of C x CLUSTER_THREADS
  threads (threadIdx.x beyond 1024: codegen.passes.launch, the `cluster` pragma on the row loop); each thread keeps
  its chunks of the row in registers as register rows do, so the row is read from DRAM once, where a block of
  1024 threads per row re-read it from L2 in every phase; the reductions combine across the cluster through
  distributed shared memory (`loopir_cluster_allreduce`). Kept only when a row cache is planned (several
  phases read the row); otherwise the block strategy stays. Not for 16-bit rows that are not whole 16-byte
  vectors (their 2-byte loads: below). On by default since 2026-12-08 (H100, benchmarks/rows_half.py).
* **split** — very wide rows (>= `RowParams.split_row_min`) with too few of them to fill the GPU (fewer than
  `split_rows_per_sm` x the SM count): the group is not fused; each reduction is `split` into chunks and
  `rfactor`ed (partials per (row, chunk) block, `split_waves` waves of blocks), a small kernel combines each
  row's partials, and the elementwise phases run as flat kernels. Five launches for softmax, each row read
  three times (from L2 at these sizes: few rows).
"""

from __future__ import annotations

from collections.abc import Callable
import dataclasses
from dataclasses import dataclass, fields

from loopir.errors import ArgumentError, ArgumentTypeError
from loopir.gpu import CLUSTER_MAX
from loopir.nodes import Binary, Load, Var
from loopir.te import ComputeOp, Reduce, Tensor
from loopir.visit import walk

from . import cost as C

WIDE_ROW = 8192  # rows at least this long get WIDE_THREADS threads per block (unmeasured: see explain)
WIDE_THREADS = 512
# rows at least this long, and too few to fill the SMs, are split over blocks (RowParams). H200, softmax and layer norm,
# float32 and float16, 1 to 128 rows of 65,536 and 8 or 64 rows of 16,384 (benchmarks/rows_half.py): a block of 1024
# threads per row (UNCACHED_THREADS) ran 1.6-3.2x faster than the split's five launches in all 32 cases (e.g. 32 x
# 65536 float16 softmax 0.0305 -> 0.0112 ms); so the split is kept for rows beyond those measured
SPLIT_ROW_MIN = 2**17
# lanes per row: the shuffle-only reduction (`Kernel.subwarp`, codegen.passes.launch.subwarp_width) takes rows
# of up to 32 lanes; 16 by default: two rows share a warp, each load instruction still reading 2 x 64 contiguous
# bytes (RowParams.warp_lanes = 32: a whole warp per row, unmeasured)
MAX_LANES = 16
# 16-bit rows up to this many elements (2 KB) get a whole warp each, 4 rows a block of 128 threads: measured on the
# H200 (benchmarks/rows_half.py, float16 softmax / layer norm / RMSNorm at 131072x256, 65536x512, 32768x1024) 1.1 to
# 2.8x faster than a block per row (e.g. softmax 65536x512 0.0794 -> 0.0449 ms, 131072x256 0.1317 -> 0.0470 ms),
# and faster than 16 lanes per row at 512 and 1024 elements
HALF_WARP_ROW_MAX = 1024
# block rows of a constant length up to this get register rows (each thread its chunks t, t + T, ... in every
# phase; a row cached for several phases lives in registers, codegen.passes.registers) with T threads so that a
# thread holds at most REGISTER_ROW_ELEMENTS: H200, float16 softmax / RMSNorm / layer norm, hand kernels of that
# form against the shared-row kernels (benchmarks/rows_half.py): 16384x4096 85-92% of the DRAM floor against 77-86%,
# 8192x8192 91-94% against 74-80%, 10000x3000 85-88% against 67-75%
REGISTER_ROW_MAX = 16384
REGISTER_ROW_ELEMENTS = 32
# longer block rows, up to this, of constant or bounded length: a row per thread-block cluster of 2..8 blocks of
# CLUSTER_THREADS threads, register rows across the cluster (8 x 512 x 32 elements; beyond, and with few rows, the
# split). 512 threads of at most 32 row registers each leave room for two blocks per SM (64 registers a thread), so
# one block's loads overlap the other's reductions and cluster barriers. H100, one run against a block of 1024
# threads per row (benchmarks/rows_half.py, 2026-12-08): float32 1024 x 65536 softmax 0.360 -> 0.220 ms, layer
# norm 0.279 -> 0.220, RMSNorm 0.258 -> 0.203; 1024 x 50257 softmax 0.330 -> 0.176; float16 1024 x 65536 0.148 ->
# 0.137 (softmax), 0.132 -> 0.119 (RMSNorm), layer norm even; 32 rows within -10% .. +37%. A float16 row of 50257
# (2-byte loads, not whole vectors) gained 9-12% for softmax and layer norm but lost 31% for RMSNorm (0.206 ->
# 0.269 ms): 16-bit rows that are not whole 16-byte vectors keep the block row
CLUSTER_ROW_MAX = 2**17
CLUSTER_THREADS = 512
RED_SCRATCH_SLOTS = 32  # the block all-reduce's shared scratch: one slot per warp (codegen.cuda.reduce)
# a block row of at least WIDE_ROW elements that no cache holds (each phase re-reads it) gets this many threads: half
# the rows in flight of WIDE_THREADS, so that a phase's re-read finds more of its row in L2. H200, 1024 x 65536
# (benchmarks/rows_half.py, 512 -> 1024 threads): float16 softmax 0.136 -> 0.099 ms, layer norm 0.133 -> 0.097 ms,
# float32 layer norm 0.271 -> 0.199 ms, float32 softmax 0.264 ms either way; 256 threads: no faster than 512
UNCACHED_THREADS = 1024


@dataclass(frozen=True)
class RowParams:
    """The thresholds of the row strategies, parameters of the planner (`auto_schedule(..., rows=RowParams(...))`
    or a dict of these fields) so that they can be swept on a device (`benchmarks/rows_gpu.py --threshold`).

    `wide_row` / `wide_threads`: rows at least this long get this many threads per block. `split_row_min`:
    rows at least this long are split over several blocks when there are fewer than `split_rows_per_sm` x the
    SM count of them (`split_rows_per_sm` 0: never split); `split_waves`: the split aims at this many waves of
    blocks over the SMs; `split_threads`: threads per block of the partial kernels."""

    wide_row: int = WIDE_ROW
    wide_threads: int = WIDE_THREADS
    split_row_min: int = SPLIT_ROW_MIN
    split_rows_per_sm: float = 2.0
    split_waves: float = 2.0
    split_threads: int = 256
    warp_lanes: int = MAX_LANES  # most lanes per row of warp rows (2 to 32: 32 is a whole warp per row)
    warp_row_max: int = 0  # rows shorter than this get warp rows (0: shorter than the block's threads)
    register_row_max: int = REGISTER_ROW_MAX  # constant rows up to this long: register rows (0: never)
    uncached_threads: int = UNCACHED_THREADS  # wide rows that every phase re-reads from memory: threads per row
    # cached rows beyond register_row_max up to this: a cluster each (0: never; CLUSTER_ROW_MAX above)
    cluster_row_max: int = CLUSTER_ROW_MAX
    cluster_threads: int = CLUSTER_THREADS  # threads per block of a cluster row
    # the narrowest vector access of a row that is not whole 16-byte vectors: 8 (a float16 row of 4k elements, a
    # float32 row of 2k: 8-byte accesses, 4 halves or 2 floats a load) or 16 (none: element by element)
    vector_bytes: int = 8
    # a row cache above the static 48 KiB costs occupancy: it is kept only while the model below says the
    # kernel streams faster with it than re-reading the row (from L2 while the rows in flight fit its share)
    cache_max_bytes: int = 227 * 1024  # never cache a kernel's rows beyond this (48 KiB: static caches only)
    smem_per_sm: int = 228 * 1024  # H200 / H100
    threads_per_sm: int = 2048
    full_occupancy: float = 0.5  # the fraction of an SM's threads that saturates DRAM with 16-byte loads
    l2_bytes: int = 50 * 2**20  # H200 / H100 L2; half of it is the rows' share
    l2_speedup: float = 2.5  # L2 bandwidth / DRAM bandwidth

    @staticmethod
    def of(x: RowParams | dict | None) -> RowParams:
        """`x` as RowParams (None: the defaults); ArgumentError naming an unknown key or a bad value."""
        if x is None:
            return RowParams()
        if isinstance(x, RowParams):
            p = x
        elif isinstance(x, dict):
            bad = sorted(set(x) - {f.name for f in fields(RowParams)})
            if bad:
                raise ArgumentError(f"row parameters: unknown key(s) {', '.join(map(repr, bad))}; known: "
                                    f"{', '.join(f.name for f in fields(RowParams))}")
            p = RowParams(**x)
        else:
            raise ArgumentTypeError(f"row parameters must be a RowParams or a dict, got {type(x).__name__}")
        for f in fields(RowParams):
            v = getattr(p, f.name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
                raise ArgumentError(f"row parameter {f.name} must be a number >= 0, got {v!r}")
        if p.vector_bytes not in (8, 16):
            raise ArgumentError(f"row parameter vector_bytes must be 8 or 16, got {p.vector_bytes!r}")
        if p.warp_lanes not in (2, 4, 8, 16, 32):
            raise ArgumentError(f"row parameter warp_lanes must be 2, 4, 8, 16 or 32, got {p.warp_lanes!r}")
        pow2 = (32, 64, 128, 256, 512, 1024)
        counts = ("split_threads", "wide_threads", "uncached_threads", "cluster_threads")
        bad = [f"{n} {getattr(p, n)!r}" for n in counts if getattr(p, n) not in pow2]
        if bad:
            raise ArgumentError(f"row parameters: {', '.join(counts)} must be a power of two in [32, 1024], got "
                                f"{', '.join(bad)}")
        return p


@dataclass(frozen=True)
class RowStrategy:
    """How one row group maps to the GPU: `name` "warp", "block" or "split", `lanes` threads per row (per
    block of the partial kernels for "split"; of the whole cluster for a cluster row), `rows` rows per block,
    `chunk` the elements of a row each block of a split row reduces (0 unless "split"), `cluster` the blocks of a
    cluster row (0: none), and the numbers that chose it (for explain())."""

    name: str
    lanes: int
    rows: int
    why: str
    chunk: int = 0
    row_len: int = 0  # the row length it was chosen for (at the plan's sizes: a call-time class's upper bound)
    registers: bool = False  # "block": every phase walks the row in 16-byte chunks per thread (register rows)
    cluster: int = 0  # "block": the row's blocks per thread-block cluster (lanes = cluster x threads per block)


def _pow2_ceil(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


def _pow2_floor(n: int) -> int:
    p = 1
    while p * 2 <= n:
        p *= 2
    return p


def choose_row_strategy(row_len: int, rows: int, symbolic: list[str], given: bool, threads: int,
                        dev: C.Device, params: RowParams | None = None, splittable: bool = True,
                        itemsize: int = 4, bounded: bool = False, vector: int = 0) -> RowStrategy:
    """The strategy of a row group with rows of `row_len` elements (at the plan's sizes) and `rows` rows.
    `symbolic`: the row length's sizes that are symbolic; `given`: whether the plan was given their values;
    `params`: the thresholds (RowParams); `splittable`: whether the group's shape allows a split (one
    reduction loop per reduction stage); `itemsize`: the bytes of the group's output elements; `bounded`: every
    call's row length is at most `row_len` (its symbolic sizes are assumed at most their given values); `vector`:
    the elements of a 16-byte access when every row is whole such vectors (0: not known to be)."""
    prm = params or RowParams()
    nums = f"row length {row_len:,}, {rows:,} row{'s' if rows != 1 else ''}"
    if symbolic and not given:
        return RowStrategy("block", threads, 1, f"{nums} at the costed size, but the row length "
                           f"({', '.join(symbolic)}) is symbolic and no sizes were given: a block per row, "
                           "which holds up at every length", row_len=row_len)
    if itemsize <= 2 and not prm.warp_row_max and row_len <= HALF_WARP_ROW_MAX:
        lanes = 32 if prm.warp_lanes == MAX_LANES else prm.warp_lanes
        lanes = _warp_lanes(lanes, row_len, vector)
        return RowStrategy("warp", lanes, threads // lanes,
                           f"{nums}: 16-bit rows of up to {HALF_WARP_ROW_MAX} elements get {lanes} lanes each "
                           f"({threads // lanes} rows per block; shuffle reductions within a row; measured faster "
                           "than a block per row)", row_len=row_len)
    if row_len < (prm.warp_row_max or threads):
        # measured on the H200 (benchmarks/rows_gpu.py): a warp-per-row kernel re-reads its row from L1/L2 in
        # each phase and lost to a block per row with the row in shared memory at 768 and 1000 elements
        # (1.96x / 2.76x torch.compile); it is kept for rows shorter than a block, which would idle threads
        lanes = _warp_lanes(prm.warp_lanes, row_len, vector)
        per_block = threads // lanes
        return RowStrategy("warp", lanes, per_block,
                           f"{nums}: rows shorter than {prm.warp_row_max or threads} elements get {lanes} lanes each "
                           f"({per_block} rows per block; shuffle reductions within a row)", row_len=row_len)
    few = rows < prm.split_rows_per_sm * dev.sm_count
    if row_len >= prm.split_row_min and few and splittable:
        # a block per row would leave most SMs idle: each row's reductions are split over chunks of blocks
        # (rfactor: partials per chunk, then a small combine), ~split_waves waves of blocks over the SMs
        sp = prm.split_threads
        want = max(1, int(prm.split_waves * dev.sm_count))
        per = max(1, -(-want // max(rows, 1)))
        per_chunk = -(-row_len // per)
        chunk = max(sp, -(-per_chunk // sp) * sp)  # whole multiples of the block's threads
        n_chunks = -(-row_len // chunk)
        return RowStrategy("split", sp, 1, f"{nums}: {rows:,} row{'s' if rows != 1 else ''} < "
                           f"{prm.split_rows_per_sm:g} x {dev.sm_count} SMs and rows of {prm.split_row_min:,} "
                           f"elements or more: each row split into {n_chunks} chunks of {chunk:,} elements "
                           f"({rows * n_chunks:,} blocks of {sp} threads, aiming at {prm.split_waves:g} waves of "
                           f"{dev.sm_count} SMs); the fusions above are left apart: per reduction a partials "
                           "kernel (rfactor) and a combine kernel, the elementwise phases as flat kernels (the "
                           "prediction below is the fused kernel's, not the split's)", chunk, row_len)
    if (not symbolic or bounded) and prm.register_row_max and row_len <= prm.register_row_max:
        # register rows: every phase maps chunk c of 16 bytes to thread c mod T, so a cached row never crosses
        # threads and lives in registers (codegen.passes.registers), at most REGISTER_ROW_ELEMENTS per thread
        per_row = max(threads, min(1024, _pow2_ceil(-(-row_len // REGISTER_ROW_ELEMENTS))))
        upto = (f" (a symbolic length of at most {row_len:,}: the chunk loops padded to constant trip counts, "
                "pad_loop)" if symbolic else "")
        return RowStrategy("block", per_row, 1, f"{nums}{upto}: a block of {per_row} threads per row, each thread "
                           f"taking the row's 16-byte chunks t, t + {per_row}, ... in every phase (at most "
                           f"{-(-row_len // per_row)} elements): a row read by several phases stays in its threads' "
                           f"registers, not in shared memory (rows up to {prm.register_row_max:,} "
                           "elements; measured faster than a shared row)", row_len=row_len, registers=True)
    if (not symbolic or bounded) and prm.register_row_max < row_len <= prm.cluster_row_max and prm.cluster_threads \
            and (itemsize >= 4 or vector):
        # a cluster row: register rows over the C blocks of a thread-block cluster (the module docstring); kept by
        # the planner only where a row cache is planned (`unclustered` otherwise)
        tb = prm.cluster_threads
        c = _pow2_ceil(-(-row_len // (tb * REGISTER_ROW_ELEMENTS)))
        if 2 <= c <= CLUSTER_MAX:
            upto = (" (a symbolic length of at most that: chunk loops padded to constant trip counts)"
                    if symbolic else "")
            return RowStrategy("block", c * tb, 1, f"{nums}{upto}: longer than register rows in one block "
                               f"({prm.register_row_max:,} elements): a thread-block cluster of {c} blocks of {tb} "
                               f"threads per row, each thread taking the row's 16-byte chunks t, t + {c * tb}, ... "
                               f"(at most {-(-row_len // (c * tb))} elements) in registers, read from memory once; "
                               "the reductions combine across the cluster's distributed shared memory",
                               row_len=row_len, registers=True, cluster=c)
    return _block_rows(nums, row_len, rows, threads, dev, prm)


def _warp_lanes(most: int, row_len: int, vector: int) -> int:
    """Lanes per warp row: at most `most`, a power of two from 2 to half the row, and, for a row of whole 16-byte
    vectors (`vector` elements each), no more than the row has vectors, so that every lane's accesses are 128-bit
    (auto._map_warp_rows vectorizes a phase only when the lanes' vectors fit in the row), where 32 lanes gave a
    float16 row of 64 elements two 2-byte loads per lane and phase (H200: 65536 x 64 float16 softmax 13.5 us, 29%
    of the DRAM floor; float32 at 16 lanes of float4, 63%)."""
    lanes = min(most, max(2, _pow2_floor(max(1, row_len // 2))))
    if vector and row_len >= 2 * vector:
        lanes = min(lanes, _pow2_floor(row_len // vector))
    return lanes


def _block_rows(nums: str, row_len: int, rows: int, threads: int, dev: C.Device, prm: RowParams) -> RowStrategy:
    """A block per row, more threads for wide rows (the last case of `choose_row_strategy`)."""
    wide = row_len >= prm.wide_row
    per_row = prm.wide_threads if wide and threads < prm.wide_threads else threads
    why = f"{nums}: rows of {threads} elements or more get a block of {per_row} threads each"
    if wide and per_row != threads:
        why += (f" (at least {prm.wide_row:,} elements: more threads per row, since a block's shared row leaves "
                "room for few blocks per SM)")
    if row_len >= prm.split_row_min and rows < prm.split_rows_per_sm * dev.sm_count:
        why += (f"; only {rows} block{'s' if rows != 1 else ''} for {dev.sm_count} SMs, but the group's shape "
                "does not allow a split of its rows (a reduction over several loops)")
    return RowStrategy("block", per_row, 1, why, row_len=row_len)


def unclustered(st: RowStrategy, rows: int, threads: int, dev: C.Device, prm: RowParams) -> RowStrategy:
    """`st` when it is no cluster row, else the block row it would be without clusters: a cluster row is kept only
    where a row cache goes to its threads' registers (with no row to keep it would only add cluster barriers)."""
    if not st.cluster:
        return st
    nums = f"row length {st.row_len:,}, {rows:,} row{'s' if rows != 1 else ''}"
    st = _block_rows(nums, st.row_len, rows, threads, dev, prm)
    return dataclasses.replace(st, why=st.why + " (no row that several phases read: no cluster of register rows)")


def uncached(st: RowStrategy, reread: bool, prm: RowParams) -> RowStrategy:
    """`st` once its caches are planned: a block row of at least `wide_row` elements that every phase re-reads from
    memory (`reread`: a row several phases read stays uncached) gets `uncached_threads` threads per row."""
    if not (st.name == "block" and not st.registers and reread and st.row_len >= prm.wide_row
            and prm.uncached_threads > st.lanes):
        return st
    why = (f"{st.why}; its phases re-read the row from memory, so {prm.uncached_threads} threads per row: half the "
           "rows in flight, more of each re-read from L2 (measured faster)")
    return dataclasses.replace(st, lanes=prm.uncached_threads, why=why)


def splittable(stages: list[Tensor], depth: int) -> bool:
    """Whether a row group of `stages` (sharing `depth` loops) can be split over blocks: each reduction stage
    is one value per row over one reduction loop (one `rfactor` each)."""
    return all(len(t.shape) == depth and len(t.op.reduce_axis) == 1 for t in stages if isinstance(t.op.body, Reduce))


def fit_shared(candidates: list[tuple[str, int, int]], scratch: int, budget: int) -> tuple[list[str], list[str]]:
    """Which of the `candidates` (name, bytes, bytes of DRAM traffic saved) stay in shared memory when the
    kernel also needs `scratch` bytes (reduction slots, staging) and may use `budget` bytes per block: the
    most saving first, each only while the running total fits. Returns (kept names, dropped names)."""
    kept, dropped, total = [], [], scratch
    for name, nbytes, _ in sorted(candidates, key=lambda c: -c[2]):
        if total + nbytes <= budget:
            kept.append(name)
            total += nbytes
        else:
            dropped.append(name)
    return kept, dropped


def reduction_scratch(stages: list[Tensor]) -> int:
    """Bytes of the block all-reduce scratch a row kernel of `stages` declares: one array of
    RED_SCRATCH_SLOTS per C type of its reductions (float and double kept apart)."""
    types = {C.itemsize(t.dtype) if t.dtype != "float16" else 4 for t in stages if isinstance(t.op.body, Reduce)}
    return sum(RED_SCRATCH_SLOTS * s for s in types)


def operands_split(t: Tensor) -> bool:
    """A matmul's operands each read at most one of its two last output axes (X[.., i, k] * Y[.., k, j]; the
    axes before them are batch axes, which both may read); a sum of products whose factors both read the
    whole output point (a variance, sum of (x[i, t, q] - m)^2) is a row reduction, not a GEMM, and its tiles
    would not be what the GEMM recipe sizes."""
    op = t.op
    if not isinstance(op, ComputeOp) or not isinstance(op.body, Reduce) or len(op.axis) < 2:
        return False
    body = op.body.body
    if not isinstance(body, Binary):
        return False
    i, j = op.axis[-2:]

    def axes(e) -> set[Var]:
        return {n for ld in walk(e) if isinstance(ld, Load) for ix in ld.indices for n in walk(ix)
                if isinstance(n, Var) and n in (i, j)}

    a, b = axes(body.a), axes(body.b)
    return len(a) <= 1 and len(b) <= 1 and a != b


def cache_worth(used: int, saved_reads: int, threads: int, dev: C.Device, prm: RowParams) -> tuple[bool, str]:
    """Whether a row kernel whose block keeps `used` bytes of shared memory (above the static 48 KiB) streams
    faster than re-reading its rows `saved_reads` more times, in units of one pass over the rows' bytes:
    cached, the occupancy (blocks per SM limited by shared memory) scales the DRAM bandwidth below
    `full_occupancy`; re-read, the extra passes come from L2 (`l2_speedup` x DRAM) while the rows of the blocks
    in flight fit half the L2, else from DRAM. Returns (keep, the numbers as a sentence)."""
    if used > prm.cache_max_bytes:
        return False, f"{C.fmt_bytes(used)} per block is above the cache_max_bytes {C.fmt_bytes(prm.cache_max_bytes)}"
    per_sm = max(1, prm.threads_per_sm // threads)
    cached_blocks = max(1, min(per_sm, prm.smem_per_sm // max(used, 1)))
    occ = cached_blocks * threads / prm.threads_per_sm
    t_cache = 1.0 / min(1.0, occ / prm.full_occupancy) if prm.full_occupancy > 0 else 1.0
    in_flight = dev.sm_count * per_sm * used
    from_l2 = in_flight <= prm.l2_bytes // 2
    t_reread = 1.0 + saved_reads / (prm.l2_speedup if from_l2 else 1.0)
    why = (f"cached: {cached_blocks} block{'s' if cached_blocks != 1 else ''} of {threads} threads per SM "
           f"(occupancy {occ:.0%}), {t_cache:.2f} passes of DRAM time; re-read: {per_sm} blocks per SM, the rows "
           f"in flight ({C.fmt_bytes(in_flight)}) {'fit' if from_l2 else 'exceed'} half the "
           f"{C.fmt_bytes(prm.l2_bytes)} L2, 1 + {saved_reads} pass{'es' if saved_reads != 1 else ''} "
           f"{'from L2' if from_l2 else 'from DRAM'} = {t_reread:.2f}")
    return t_cache <= t_reread, why


def plan_row_caches(stages: list[Tensor], depth: int, loads: Callable[[Tensor], list[tuple[Tensor, tuple]]],
                    ev: dict, dev: C.Device, given: set[str], params: RowParams | None = None,
                    threads: int = 128, registers: bool = False,
                    cluster: int = 0) -> list[tuple[Tensor, bool, int, str]]:
    """The rows a block-per-row kernel of `stages` (sharing `depth` outer loops; `loads(t)`: what t reads,
    producers inlined) keeps in shared memory: an input row read by several phases, while everything the
    kernel keeps there (these rows and the reduction scratch) fits one block's budget. A row of symbolic
    length is a candidate only when its sizes are `given` (the plan is for sizes up to those): it lives in
    dynamic shared memory sized per launch, and a launch whose row the device cannot hold is refused
    (codegen.cuda.runtime.SharedMemoryError). `registers`: the kernel maps register rows (RowStrategy.registers),
    so a kept row of constant length goes to its threads' registers where the lowering proves each element stays
    with one thread (codegen.passes.registers); `cluster`: the row is spread over that many blocks of a cluster (a
    block's share, 1/cluster of the row, counts against its budget). Returns (tensor, kept, bytes, why) per
    candidate."""
    readers: dict[int, tuple[Tensor, set[str]]] = {}
    ids = {id(t) for t in stages}
    for t in stages:
        for p, idx in loads(t):
            if id(p) in ids or len(p.shape) <= depth:
                continue
            if all(idx[k] is t.op.axis[k] for k in range(depth)):
                readers.setdefault(id(p), (p, set()))[1].add(t.name)
    # above the static 48 KiB a row lives in dynamic shared memory (codegen.passes.shared); at most half the
    # opt-in maximum, so that two blocks still share an SM (one block per SM would leave the row loads idle)
    scratch, budget = reduction_scratch(stages), max(dev.smem_per_block, dev.smem_per_block_optin // 2)
    out: list[tuple[Tensor, bool, int, str]] = []
    cands: dict[str, tuple[Tensor, int, str]] = {}
    for p, users in readers.values():
        if len(users) < 2:
            continue
        row_shape = p.shape[depth:]
        nbytes = C.buffer_bytes(row_shape, p.dtype, ev)
        sym = sorted({n.name for s in row_shape for n in walk(s) if isinstance(n, Var)})
        users_s = ", ".join(sorted(users))
        if sym and not set(sym) <= given:
            out.append((p, False, nbytes, f"its row ({C.fmt_bytes(nbytes)} at the costed size) is read by {users_s}, "
                        f"but its length {', '.join(sym)} is symbolic and a shared buffer needs a constant size — "
                        "re-read from global memory (L2-resident)"))
        else:
            cands[p.name] = (p, nbytes, users_s)
    per = max(1, cluster)
    kept, _ = fit_shared([(n, -(-b // per), b * u.count(",")) for n, (_, b, u) in cands.items()], scratch, budget)
    used = scratch + sum(-(-cands[n][1] // per) for n in kept)
    dyn = " (dynamic shared memory above the static 48 KiB)" if used > dev.smem_per_block else ""
    if kept and used > dev.smem_per_block:  # dynamic shared memory: worth its occupancy cost?
        ok, model = cache_worth(used, max(cands[n][2].count(",") for n in kept), threads, dev, params or RowParams())
        if not ok:
            for name in kept:
                p, nbytes, users_s = cands.pop(name)
                out.append((p, False, nbytes, f"its row ({C.fmt_bytes(nbytes)}) is read by {users_s} and would fit "
                            f"the {C.fmt_bytes(budget)} per block, but above the static 48 KiB it costs occupancy; "
                            f"{model} — re-read from global memory"))
            kept = []
        else:
            dyn += f"; worth its occupancy: {model}"
    for name, (p, nbytes, users_s) in cands.items():
        if name in kept:
            symbolic = any(isinstance(n, Var) for d in p.shape[depth:] for n in walk(d))
            at = " at the given sizes; symbolic: dynamic shared memory sized per launch" if symbolic else ""
            if registers:
                out.append((p, True, nbytes, f"its row ({C.fmt_bytes(nbytes)}) is read by {users_s}: loaded once per "
                            f"row into its threads' registers ({-(-nbytes // C.itemsize(p.dtype) // threads)} "
                            "elements each; the chunks each thread reads in every phase are the ones it loaded)"))
                continue
            out.append((p, True, nbytes, f"its row ({C.fmt_bytes(nbytes)}{at}) is read by {users_s}; the kernel's "
                        f"shared memory ({C.fmt_bytes(used)} with {scratch} B of reduction scratch) fits the "
                        f"{C.fmt_bytes(budget)} per block (shared-memory budget){dyn}: "
                        "loaded once per row"))
        else:
            out.append((p, False, nbytes, f"its row ({C.fmt_bytes(nbytes)}) is read by {users_s}, but the kernel's "
                        f"shared memory with it ({C.fmt_bytes(used + nbytes)}) exceeds the {C.fmt_bytes(budget)} "
                        "per block (shared-memory budget) — re-read from global memory"))
    return out


__all__ = ["RowParams", "RowStrategy", "choose_row_strategy", "uncached", "unclustered", "CLUSTER_ROW_MAX",
           "fit_shared", "reduction_scratch",
           "operands_split", "WIDE_ROW", "SPLIT_ROW_MIN", "plan_row_caches", "cache_worth", "splittable"]
