"""Attention recognized in plain te and scheduled in the online form (FlashAttention's rewrite).

`auto_schedule` asks `schedule_attention(outputs, target)` first: when the program holds a row
maximum whose readers satisfy the precondition of `online_softmax` (an exponential of the difference,
consumed by sums of products with it, e.g. softmax(Q K^T) V), the rewrite is applied as a checked
step and the single pass is mapped:
  * cuda, float16 / bfloat16 data that tensorize "attention.wgmma" (head dimensions 64 or 128) or else
    "attention.m16n8k16" accepts (schedules/primitives/flash.py): a block per (batch, 128 query rows) runs the pass
    as FlashAttention's tensor-core kernel. The division after it (Y = O / sm) is fused into the pass's row loops
    (two checked fuse steps) when tensorize accepts the fused pass, and runs as the kernel's epilogue on the
    registers; a division that cannot be the epilogue reads the stored sums in a kernel of its own (a flat grid
    over rows x columns when the rows are short);
  * cuda otherwise: a block per (batch, tile of `rows` query rows), a thread per row (batch loops on blockIdx.y/z,
    the query loop split into blockIdx.x and threadIdx.x: with symbolic sizes collapse would make the
    coordinates non-affine). Then, each a checked step that is skipped (and named in the plan) when
    refused: the row's running state in registers (cache_write "local", the final division as its
    epilogue, so one kernel), the query row in registers (cache_read "local"), the keys split in tiles
    of `key_tile` whose K and V rows the block copies cooperatively to shared memory (sink_guard, so
    every thread reaches the copy, then cache_read "shared");
  * cpu: the outer row loop of each nest parallel.
The plan's `explain()` names the rewrite. Otherwise None, and auto_schedule goes on as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from loopir.errors import ArgumentError, LoopirError
from loopir.lower import lower
from loopir.nodes import Buffer, Const, For, Load, Program, Seq, Stmt
from loopir.te import Tensor
from loopir.visit import deep_recursion, statements, walk, walk_stmts

from .primitives import const_extent, find_loop_path
from .primitives.flash import (FLASH, FLASH_KINDS, FLASH_TF32, FLASH_WGMMA, ROW_CHOICES, FlashMismatch, FlashShape,
                               flash_parts)
from .primitives.loop_fusion import fuse as fuse_loops
from .primitives.loops import split as split_loop
from .primitives.online import OnlineRewrite, find_softmax_max, online_softmax
from .schedule import Schedule

__all__ = ["AttentionPlan", "AttentionParams", "attention_params", "schedule_attention", "attention_rewrites",
           "apply_online", "map_online",
           "online_stages", "on_tensor_cores", "ROWS_PER_BLOCK", "KEY_TILE"]

ROWS_PER_BLOCK = 64  # query rows per block (one per thread)
KEY_TILE = 32  # keys per shared-memory tile of K and V
DIVISION_THREADS = 128  # threads across the row of a division that is not the pass's epilogue
UNROLL_MAX = 128  # constant loops up to this length are unrolled (the head dimension)
TENSOR_CORES = True  # offer a half-precision pass to the tensor-core kernel (off: the SIMT mapping, for comparison)
# offer it to the warpgroup kernel first (attention.wgmma, sm_90a: Hopper, the target's architecture; off: mma.sync)
WGMMA_ATTENTION = True
# offer a float32 pass to the TF32 kernel with three products per product (attention.tf32x3: float32-class accuracy;
# off: the SIMT mapping)
TF32_ATTENTION = True


@dataclass(frozen=True, slots=True)
class AttentionParams:
    """Which tensor-core kernels the online pass is offered (`auto_schedule(online={...})`; None: the module's
    default above, read when the schedule is made). `build(..., arch="sm_8x")` turns `wgmma` off (sm_90a only)."""

    wgmma: bool | None = None  # attention.wgmma (half data, sm_90a)
    tensor_cores: bool | None = None  # any tensor-core kernel at all (off: the SIMT mapping)
    tf32: bool | None = None  # attention.tf32x3 for float32 data

    def offers(self) -> tuple[bool, bool, bool]:
        """(tensor cores, wgmma, tf32x3) with the module defaults filled in."""
        pick = lambda v, d: d if v is None else v  # noqa: E731
        return pick(self.tensor_cores, TENSOR_CORES), pick(self.wgmma, WGMMA_ATTENTION), pick(self.tf32, TF32_ATTENTION)


def attention_params(online: Any) -> AttentionParams:
    """`auto_schedule`'s `online` option as AttentionParams: True (the defaults), an AttentionParams, or a dict of
    its fields; ArgumentError naming an unknown key or a value that is not a bool."""
    if online is True:
        return AttentionParams()
    if isinstance(online, AttentionParams):
        return online
    if not isinstance(online, dict):
        raise ArgumentError(f"auto_schedule: online must be a bool or a dict of {sorted(_PARAM_KEYS)}, "
                            f"got {type(online).__name__}")
    bad = sorted(set(online) - _PARAM_KEYS)
    if bad:
        raise ArgumentError(f"auto_schedule: online has no option {bad[0]!r} (options: {sorted(_PARAM_KEYS)})")
    for k, v in online.items():
        if v is not None and not isinstance(v, bool):
            raise ArgumentError(f"auto_schedule: online[{k!r}] must be a bool, got {v!r}")
    return AttentionParams(**online)


_PARAM_KEYS = frozenset(AttentionParams.__dataclass_fields__)


@dataclass(frozen=True)
class AttentionPlan:
    """What `schedule_attention` did, for `schedule.plan.explain()`."""

    rewrites: tuple[OnlineRewrite, ...]
    target: str
    rows: int
    key_tile: int
    notes: tuple[str, ...] = ()
    tensor_cores: FlashShape | None = None  # the pass runs as FlashAttention's tensor-core kernel, so tiled
    epilogue: str | None = None  # the buffer the tensor-core pass's epilogue writes (the division fused into it)

    @property
    def groups(self) -> tuple[()]:
        return ()

    @property
    def inlined(self) -> tuple[()]:
        return ()

    def explain(self) -> str:
        lines = []
        for r in self.rewrites:
            lines.append(
                f"online_softmax({r.max_stage}): the running maximum {r.max_stage} rescales the sums "
                f"{', '.join(r.rolling)} by exp(m_old - m_new) in one pass over the keys ({r.key}); "
                + (f"{', '.join(r.prepared + r.inlined)} folded into them; " if r.inlined else "")
                + (f"{r.scores} computed one key at a time (no n x m temporary)" if r.scores else
                   "the maximized values stay materialized")
                + (f"; {', '.join(r.divided)} divided by a sum of the pass once it is over" if r.divided else ""))
            if r.mask:
                lines.append(f"masked keys skipped: each key's update runs under `if {r.mask}` (a masked key leaves "
                             "the state unchanged); on cuda, where the mask bounds the keys from above (causal), a "
                             "block stops after the last key tile its rows attend to (codegen.passes.dead_tiles; the "
                             "tensor-core kernel skips every tile the mask kills at its four corners, and, when "
                             "no conjunct also bounds them from below (a window), launches the heaviest row blocks "
                             "first)")
        if self.target == "cuda" and self.tensor_cores is not None:
            sh = self.tensor_cores
            if sh.tf32:
                lines.append(f"cuda: a block per {sh.rows} query rows of one batch on TF32 tensor cores ({FLASH_TF32}: "
                             "a warp per 16 rows, S = Q K^T and O += P V on mma.sync m16n8k8 with each float32 "
                             "operand split in a TF32 high part and the rest, three products per product (float32-"
                             f"class accuracy), P in registers, K and V in tiles of {sh.keys} keys double-buffered in "
                             "shared memory by cp.async)")
            elif sh.wgmma:
                lines.append(f"cuda: a block per {sh.rows} query rows of one batch on warpgroup tensor cores "
                             f"({FLASH_WGMMA}: a warpgroup per 64 rows, S = Q K^T and O += P V on wgmma with P in "
                             f"registers, K and V in tiles of {sh.keys} keys in {sh.stages} swizzled shared stages "
                             "filled by TMA, one thread per block and an mbarrier per stage, where the pass reads "
                             "them as rows (or a head's slice of rows) of their tensors, else by the threads' "
                             "cp.async copies; the softmax of a tile runs while the tensor cores run the previous "
                             "tile's P V)")
            else:
                lines.append(f"cuda: a block per {sh.rows} query rows of one batch on tensor cores ({FLASH}: a warp "
                             f"per {16 * sh.mt} rows, S = Q K^T and O += P V on mma.sync with P in registers, K and "
                             f"V in tiles of {sh.keys} keys double-buffered in shared memory by cp.async)")
            if self.epilogue:
                lines.append(f"cuda: {self.epilogue} (the division by the sums) is the pass's epilogue, on the "
                             "registers (its loops fused with the pass's rows): one kernel, O and the sums never "
                             "stored")
        elif self.target == "cuda":
            lines.append(f"cuda: a block per {self.rows} query rows of one batch, a thread per row running the pass "
                         f"with its state in registers; K and V staged in shared memory {self.key_tile} keys at a time")
        else:
            lines.append("cpu: the rows in parallel")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


def schedule_attention(outputs: list[Tensor], target: str, rows: int = ROWS_PER_BLOCK, key_tile: int = KEY_TILE,
                       check: bool = True, params: AttentionParams = AttentionParams()) -> Schedule | None:
    """The online-softmax schedule of `outputs`, or None when no row maximum fits the rewrite or when the
    program computes more than the attention chain (`auto_schedule` then plans the other stages and maps
    the chain with `apply_online`)."""
    with deep_recursion():
        program = lower(outputs)
    found = attention_rewrites(program)
    if not found or not _only_attention(outputs, found):
        return None
    s = Schedule(outputs, check=check)
    rewrites = apply_online(s, found)
    notes = map_online(s, rewrites, target, rows, key_tile, every_nest=True, params=params)
    s.plan = AttentionPlan(tuple(rewrites), target, rows, key_tile, tuple(notes),  # type: ignore[attr-defined]
                           on_tensor_cores(s.program), pass_epilogue(s.program))
    return s


def on_tensor_cores(program: Program) -> FlashShape | None:
    """The tiling of the first online pass of `program` that runs as a tensor-core kernel (tensorize
    "attention.wgmma" or "attention.m16n8k16"), or None."""
    f = _flash_loop(program)
    return None if f is None else flash_parts(f).shape


def pass_epilogue(program: Program) -> str | None:
    """The buffer the epilogue of the first tensor-core pass of `program` writes, or None."""
    f = _flash_loop(program)
    ep = None if f is None else flash_parts(f).epilogue
    return None if ep is None else ep.buffer.name


def _flash_loop(program: Program) -> For | None:
    return next((f for f in walk_stmts(program.body) if isinstance(f, For) and f.kind in FLASH_KINDS), None)


def online_rewrites(outputs: list[Tensor]) -> tuple[list[OnlineRewrite], bool]:
    """The online-softmax rewrites `auto_schedule` applies to `outputs`, and whether the program is the
    attention chain alone (then `schedule_attention` maps it whole, with no fusion plan)."""
    with deep_recursion():
        found = attention_rewrites(lower(outputs))
    return found, bool(found) and _only_attention(outputs, found)


def attention_rewrites(program: Program) -> list[OnlineRewrite]:
    """What `online_softmax` would do for each row maximum of the unscheduled `program` that fits it."""
    return [online_softmax(program, name)[1] for name in find_softmax_max(program)]


def online_stages(rewrites: list[OnlineRewrite]) -> set[str]:
    """The stages the rewrites fold into their passes (the max, the scores, the sums and what they inline)."""
    out: set[str] = set()
    for r in rewrites:
        out |= {r.max_stage, *r.inlined, *r.prepared, *r.rolling, *([r.scores] if r.scores else [])}
    return out


def _only_attention(outputs: list[Tensor], rewrites: list[OnlineRewrite]) -> bool:
    """Every stage is folded by a rewrite or reads only folded stages and inputs (the final division)."""
    folded = online_stages(rewrites)
    seen: set[int] = set()
    stack = list(outputs)
    while stack:
        t = stack.pop()
        if id(t) in seen or not t.op.inputs:
            continue
        seen.add(id(t))
        if any(u.op.inputs and u.name not in folded for u in t.op.inputs):
            return False
        stack.extend(t.op.inputs)
    return True


def apply_online(s: Schedule, rewrites: list[OnlineRewrite]) -> list[OnlineRewrite]:
    """The checked `online_softmax` step of each rewrite, applied to `s`; what each step did."""
    out = []
    for r in rewrites:
        _, info = online_softmax(s.program, r.max_stage)  # what the step does, for the plan
        s.online_softmax(r.max_stage)
        out.append(info)
    return out


def map_online(s: Schedule, rewrites: list[OnlineRewrite], target: str, rows: int = ROWS_PER_BLOCK,
               key_tile: int = KEY_TILE, every_nest: bool = False,
               params: AttentionParams = AttentionParams()) -> list[str]:
    """Map the nests of the online passes of `rewrites` for `target` (`every_nest`: every nest of the program,
    the passes first, then the divisions reading them); the notes say which optional steps were refused."""
    mine = ({st.store.buffer.name for st in statements(s.program)} if every_nest
            else {b for r in rewrites for b in (r.max_stage, *r.rolling, *r.sums, *r.state)})
    notes = _map(s, target, rows, mine, params if len(rewrites) == 1 else None)
    if target == "cuda" and len(rewrites) == 1 and on_tensor_cores(s.program) is None:
        notes += _registers_and_tiles(s, rewrites[0], key_tile)
    return notes


def _top(program: Program) -> tuple[Stmt, ...]:
    return program.body.body if isinstance(program.body, Seq) else (program.body,)


def _rows(s: Schedule, nest: Stmt) -> list[Any]:
    """The handles of the perfectly nested loops at the top of `nest`."""
    out = []
    f: Any = nest
    while isinstance(f, For):
        out.append(s.loop(s._ref(f.var)))
        f = f.body
    return out


def _nest_writes(nest: Stmt) -> set[str]:
    return {st.store.buffer.name for st in statements(nest)}


def _map(s: Schedule, target: str, rows: int, mine: set[str], params: AttentionParams | None) -> list[str]:
    """The nests writing a buffer of `mine` (the passes, their divisions): rows on blocks and threads (with
    `params` offering tensor cores, the pass's block of rows is first offered to tensorize)."""
    notes: list[str] = []
    tensor_cores = params is not None and params.offers()[0]
    params = params or AttentionParams()
    first = True
    for k in range(len(_top(s.program))):
        if k >= len(_top(s.program)):  # the division was fused into the pass: one nest less
            break
        if not _nest_writes(_top(s.program)[k]) & mine:
            continue
        is_pass, first = first, False
        loops = _rows(s, _top(s.program)[k])
        if not loops:
            continue
        if target != "cuda":
            s.parallel(loops[0])
            continue
        # the first nest is the pass over the rows (batch..., query): a thread per row. A later one (the division
        # when it is not the pass's epilogue) is elementwise: a block per row, its innermost loop across the threads
        # (consecutive threads, consecutive elements)
        if is_pass or len(loops) == 1:
            if is_pass and tensor_cores and _division_into_pass(s, k, mine, notes, params):
                loops = _rows(s, _top(s.program)[k])
            *batch, q = loops[-3:]
            flash = _flash_rows(s, q, notes, params) if is_pass and tensor_cores else None
            bo, ti = s.split(q, flash[1] if flash else rows)
            s.bind(bo, "blockIdx.x")
            if flash is not None:
                s.tensorize(ti, flash[0])
            else:
                s.bind(ti, "threadIdx.x")
        else:
            *batch, q = loops[:-1][-3:]
            inner = _top(s.program)[k]
            for _ in loops[:-1]:
                inner = inner.body
            width = const_extent(inner)
            if width is not None and DIVISION_THREADS % width == 0:
                # a short row (the head dimension): rows and columns fused, consecutive threads on consecutive
                # elements of several rows (a block per row would leave most of its threads idle)
                bo, ti = s.split(s.collapse(q, loops[-1]), 2 * DIVISION_THREADS)
                s.bind(bo, "blockIdx.x").bind(ti, "threadIdx.x")
            else:
                _, ti = s.split(loops[-1], DIVISION_THREADS)
                s.bind(q, "blockIdx.x").bind(ti, "threadIdx.x")
        for axis, b in zip(("blockIdx.y", "blockIdx.z"), reversed(batch)):
            s.bind(b, axis)
    return notes


def _division_into_pass(s: Schedule, k: int, mine: set[str], notes: list[str], params: AttentionParams) -> bool:
    """Fuse the nest after the pass (the division Y = O / sm) into the pass's row loops, when the fused pass is what
    tensorize accepts (tried on the program alone first): the division becomes the kernel's epilogue, on the
    registers, and O and sm are never stored. Each fuse is a checked step."""
    top = _top(s.program)
    if k + 1 >= len(top) or not _nest_writes(top[k + 1]) & mine:  # a nest this mapping owns
        return False
    rows, div = _rows(s, top[k]), _rows(s, top[k + 1])
    if not rows or len(div) != len(rows) + 1:  # the division: the pass's row loops, then one over the columns
        return False
    program = s.program
    try:
        for a, b in zip(rows, div):
            program, _ = fuse_loops(program, s._resolve(a, "fuse"), s._resolve(b, "fuse"))
    except LoopirError:
        return False
    if _flash_rows(s, rows[-1], [], params, program) is None:
        return False
    for a, b in zip(rows, div):
        if _try(s, notes, "the division as the pass's epilogue", "fuse", a, b) is None:
            return False
    return True


def _flash_rows(s: Schedule, q: Any, notes: list[str], params: AttentionParams,
                program: Program | None = None) -> tuple[str, int] | None:
    """The tensor-core intrinsic and the rows per block with which the pass, its query loop `q` split by them, is
    what tensorize accepts (attention.wgmma first, then attention.m16n8k16, then attention.tf32x3; tried on the
    program alone, `program` or the schedule's: the schedule is unchanged), or None; the note says why not, for
    half data and float32 data."""
    whys, half, single = [], False, False
    _, wgmma, tf32x3 = params.offers()
    tries = [(FLASH_WGMMA, 128)] if wgmma else []
    tf32 = [(FLASH_TF32, 64)] if tf32x3 else []
    base = program or s.program
    for intrinsic, rows in tries + [(FLASH, r) for r in ROW_CHOICES] + tf32:
        split, (_, inner) = split_loop(base, s._resolve(q, "split"), rows)
        f = find_loop_path(split.body, inner)[0]  # type: ignore[index]
        try:
            return intrinsic, flash_parts(f, split, intrinsic).shape.rows
        except FlashMismatch as e:
            types = {n.buffer.dtype for n in walk(f) if isinstance(n, Load)}
            if intrinsic == FLASH and types & {"float16", "bfloat16"}:
                whys.append(str(e))
                half = True
            if intrinsic == FLASH_TF32 and "float32" in types and not types & {"float16", "bfloat16"}:
                whys.append(str(e))
                single = True
    if half or single:  # the reason that is not about the rows per block, when there is one
        why = next((w for w in whys if "has extent" not in w), whys[0])
        notes.append(f"tensor cores ({FLASH if half else FLASH_TF32}): not applied ({why})")
    return None


def _try(s: Schedule, notes: list[str], what: str, name: str, *args: Any, **kw: Any) -> Any:
    try:
        return s.apply(name, *args, **kw)
    except LoopirError as e:  # refused: the schedule is unchanged; say so and go on without this step
        notes.append(f"{what}: not applied ({type(e).__name__}: {str(e).splitlines()[0]})")
        return None


def _buf(program: Program, name: str) -> Buffer | None:
    return next((b for b in program.args + program.temps if b.name == name), None)


def _reads(program: Program, stmt_buf: Buffer, name: str) -> bool:
    return any(isinstance(n, Load) and n.buffer.name == name
               for st in statements(program) if st.store.buffer is stmt_buf for n in walk(st.store.value))


def _pass_nest(s: Schedule, info: OnlineRewrite) -> Stmt | None:
    return next((n for n in _top(s.program) if f"{info.max_stage}_online" in {st.store.name for st in statements(n)}),
                None)


def _registers_and_tiles(s: Schedule, info: OnlineRewrite, key_tile: int) -> list[str]:
    notes: list[str] = []
    nest = _pass_nest(s, info)
    thread = nest and next((f for f in walk_stmts(nest) if isinstance(f, For) and f.thread == "threadIdx.x"), None)
    if thread is None:
        return notes
    ti = s.loop(s._ref(thread.var))
    for name in info.state:  # this key's score, m_new and the rescale factor: per key, initialised in place
        _try(s, notes, f"{name} in registers", "cache_write", name, "local", ti,
             hoist_init=not (info.scores is not None and name == info.state[0]))
    done: set[str] = set()
    # the sums: the consumers that write an output become the epilogue. The widest first: an epilogue reads it
    # elementwise (O / sm reads O[b, i, c]), which cache_write's epilogue needs; the row sums it also reads then
    # stay in registers beside it
    rank = {b.name: len(b.shape) for b in s.program.temps + s.program.args}
    for name in sorted(info.sums, key=lambda nm: -rank.get(nm, 0)):
        epi = [st.store.name for st in statements(s.program)
               if st.store.buffer in s.program.args and st.store.name not in done
               and any(isinstance(n, Load) and n.buffer.name == name for n in walk(st.store.value))
               and not any(f.var is thread.var for f in st.loops)]
        if epi and _try(s, notes, f"{name} in registers with {', '.join(epi)} as its epilogue", "cache_write", name,
                        "local", ti, epilogue=epi) is not None:
            done |= set(epi)
        else:  # no epilogue (or one that reads the sum permuted, e.g. heads merged back): copied out after the pass
            _try(s, notes, f"{name} in registers", "cache_write", name, "local", ti)
    _try(s, notes, f"{info.max_stage} in registers", "cache_write", info.max_stage, "local", ti)
    nest = _pass_nest(s, info)
    key = nest and next((f for f in walk_stmts(nest) if isinstance(f, For) and f.var.name == info.key), None)
    if key is None:
        return notes
    # what the pass reads and another kernel (or the caller) wrote: the rows read once per row (the query row)
    # into registers; those read per key (K, V): tiles in shared memory
    per_row, per_key = [], []
    written = _nest_writes(nest)
    for b in s.program.args + s.program.temps:
        if b.name in written:
            continue
        uses = [n for n in walk(key) if isinstance(n, Load) and n.buffer is b]
        if not uses:
            continue
        (per_key if any(any(v is key.var for v in walk(i)) for u in uses for i in u.indices) else per_row).append(b)
    for b in per_row:
        _try(s, notes, f"the row of {b.name} in registers", "cache_read", b.name, "local", ti)
    key = next(f for f in walk_stmts(s.program) if isinstance(f, For) and f.var.name == info.key)
    split = _try(s, notes, f"keys in tiles of {key_tile}", "split", s.loop(s._ref(key.var)), key_tile)
    if split is None:
        return notes
    ko = split[0]
    if _try(s, notes, "every thread at the key tiles", "sink_guard", ko) is None:
        notes.append("the shared copies below are made by each thread, not cooperatively")
    for b in per_key:
        _try(s, notes, f"{b.name} tiles in shared memory", "cache_read", b.name, "shared", ko)
    # the loops over the head dimension unrolled, so that the register arrays stay in registers (not the
    # loop over the keys of a tile: its body is the whole update)
    key_inner = split[1].var
    for f in list(walk_stmts(_pass_nest(s, info) or Seq(()))):
        if (isinstance(f, For) and f.kind == "serial" and f.var is not key_inner and isinstance(f.lo, Const)
                and isinstance(f.hi, Const) and 1 < int(f.hi.value) - int(f.lo.value) <= UNROLL_MAX):
            _try(s, notes, f"unroll {f.var.name}", "unroll", s.loop(s._ref(f.var)))
    return notes
