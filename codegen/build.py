"""`build`: from a schedule, a program or tensors to a callable module for a target.

    mod = build(s, [x, y], target="cpu")   # s: Schedule | Program | Tensor | [Tensor]
    mod(x_arr, y_arr)

Plain tensors go through `schedules.auto_schedule(outputs, target=target)` when it exists,
else they are lowered unscheduled. `args` (te Tensors or Buffers) fixes the call order; a
buffer the program reads or writes that is neither in `args` nor a temporary is refused, an
intermediate listed in `args` becomes an argument, so it is written. A te stage listed in `args` that
the scheduled program no longer writes (after `compute_inline(a)` or `auto_schedule`, which may inline
it) is refused with a ValueError naming it: passing it would leave the array untouched; build its
stage unscheduled-out (do not inline it) or drop it from `args`. CPU code is compiled once per program:
an in-memory cache keyed by the program's *structure* (variables and buffers renumbered,
names ignored) serves a structurally equal program, even one built from fresh objects.

Whole builds are cached (`codegen.build_cache`, memory and disk): a build whose key (the program as given,
target, machine, options, the project's version) was built before, in this process or an earlier one, is
loaded without scheduling, lowering or compiling; `cache=False` (both targets) bypasses it.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from loopir.errors import ArgumentError, ArgumentTypeError, CudaCodegenError, NotFoundError, ResourceLimitError
from loopir.nodes import Allocate, Buffer, Const, For, Program, Var
from loopir.subst import stages_of, substitute_program_sizes, substitute_sizes
from loopir.lower import passed_sizes, size_arguments
from loopir.te import ComputeOp, scalar_tensor, tensor_of
from loopir.te_extern import stage_call
from loopir.visit import buffers_of, deep_recursion, free_vars, walk, walk_stmts
from schedules import Schedule
from schedules.auto import auto_schedule
from schedules.recipes import is_matmul_tensor, shared_weight_rows
from schedules.rows import RowParams

from . import build_cache
from .build_cache import BuildKey
from .cuda.build import CUDA_OPTS, build_cuda, cuda_module, cuda_source
from .cuda.kernel import CudaSource
from .cuda.nvrtc import normalize_arch, prefetch_cubin
from .cuda.runtime import default_arch
from .llvm import generate, size_vars
from .llvm.math import load_library
from .llvm.runtime import CpuKernel
from .module import CpuModule, Module
from .passes import Assume, lower
from .passes.bounds import DEFER_INIT_CHECK, notes_for, preconditions_for, refuse_uninitialized
from .specialize import Key, Specializer, size_vars_of, substitution
from .structure import structural_key
from .tune.lookup import Tuned, bucket_options, tuned_context, tuned_options

TARGETS = ("cpu", "cuda")
_cache: dict[tuple, Any] = {}
_cache_lock = threading.Lock()
_CPU_OPTS = ("threads", "cache", "extern_libs")
MAX_NATIVE_ARGS = 1024  # ctypes' limit on the parameters of one foreign function
UNROLL_LIMIT = 4096  # iterations of one unrolled loop; beyond it, the build takes seconds to minutes


# ----------------------------------------------------------------------------- inputs


def _is_tensor(x: Any) -> bool:
    return hasattr(x, "buffer") and hasattr(x, "op") and isinstance(getattr(x, "buffer", None), Buffer)


def _buffer_of(x: Any, k: int) -> Buffer:
    if isinstance(x, Buffer):
        return x
    if _is_tensor(x):
        return x.buffer
    raise ArgumentTypeError(f"build: args[{k}] must be a te Tensor or a Buffer, got {type(x).__name__} {x!r}")


def to_program(obj: Any, target: str, args: Sequence[Any] | None = None) -> Program:
    """The program to compile for a Schedule, Program, Tensor or list of Tensors."""
    if isinstance(obj, Program):
        return obj
    prog = getattr(obj, "program", None)
    if isinstance(prog, Program):  # a Schedule (or anything holding its current program)
        return prog
    tensors = list(obj) if isinstance(obj, (list, tuple)) else [obj]
    if not tensors or not all(_is_tensor(t) for t in tensors):
        raise ArgumentTypeError(
            f"build takes a Schedule, a Program, a te Tensor or a list of Tensors, got {type(obj).__name__}"
        )
    s = auto_schedule(tensors, target=target)
    p = s if isinstance(s, Program) else getattr(s, "program", None)
    if isinstance(p, Program):
        return p
    raise ArgumentTypeError(f"auto_schedule returned {type(s).__name__}, not a Schedule or Program")


def with_args(program: Program, args: Sequence[Any] | None) -> Program:
    """`program` with its arguments in the order of `args` (Tensors or Buffers)."""
    if args is None:
        return program
    if isinstance(args, (Buffer,)) or _is_tensor(args):
        args = [args]
    bufs = [_buffer_of(a, k) for k, a in enumerate(args)]
    seen: set[Buffer] = set()
    for b in bufs:
        if b in seen:
            raise ArgumentError(f"build: argument {b.name!r} is listed twice in args")
        seen.add(b)
    scoped = {n.buffer for n in walk(program.body) if isinstance(n, Allocate)}
    reads, writes = buffers_of(program.body)
    temps = tuple(t for t in program.temps if t not in seen)
    for b in [*reads, *writes, *program.args]:
        if b not in seen and b not in scoped and b not in temps:
            raise ArgumentError(
                f"build: buffer {b.name!r} is used by program {program.name!r} but is missing from args "
                f"(args: {', '.join(x.name for x in bufs) or 'none'})"
            )
    _refuse_unwritten_stages(program, bufs, writes)
    if tuple(bufs) == program.args and temps == program.temps:
        return program
    return dataclasses.replace(program, args=tuple(bufs), temps=temps)


def _refuse_unwritten_stages(program: Program, bufs: list[Buffer], writes: list[Buffer]) -> None:
    """A te compute stage passed as an argument must be written by the program (else it is silently untouched)."""

    written = set(writes)
    for b in bufs:
        t = tensor_of(b)
        if t is not None and isinstance(t.op, ComputeOp) and b not in written:
            raise ArgumentError(
                f"build: argument {b.name!r} is a computed stage that program {program.name!r} never writes "
                "(a schedule step inlined it: compute_inline, or auto_schedule's fusion), so its array would be "
                f"left untouched; drop {b.name!r} from args, or keep it computed (do not inline it)"
            )


def check_unroll(program: Program, limit: int | None = None) -> None:
    """Refuse a loop marked `unroll` whose constant extent exceeds `limit` (code size and build time)."""

    limit = UNROLL_LIMIT if limit is None else limit
    for s in walk_stmts(program):
        if isinstance(s, For) and s.kind == "unroll":
            if isinstance(s.lo, Const) and isinstance(s.hi, Const) and s.hi.value - s.lo.value > limit:
                raise ResourceLimitError(
                    f"build: loop {s.var.name!r} is unrolled over {s.hi.value - s.lo.value} iterations, more than "
                    f"the limit of {limit}; split it first (s.split(loop, 8)) and unroll the inner loop"
                )


# ----------------------------------------------------------------------------- build


def build(obj: Any, args: Sequence[Any] | None = None, target: str = "cpu", sizes: dict[Any, int] | None = None,
          specialize: bool = True, schedule: dict[str, Any] | None = None, tuned: bool | str | None = None,
          **opts: Any) -> Module:
    """Compile a Schedule / Program / Tensor(s) for `target` ("cpu" or "cuda"); see the module doc.

    `dump_passes=True` prints the program after each pass of the target's lowering pipeline
    (`codegen.passes.pipeline(target)`); a callable receives the text instead.

    Memory safety is proven first (pass `prove_bounds`, loopir/bounds.py): an access that leaves
    its buffer for some sizes, or a read of a temporary nothing wrote, raises `BoundsError` (a
    ValueError) with a witness; an access isl cannot bound (non-affine index) is guarded at run
    time and `mod.notes` says so. A te stage in `args` that the schedule inlined (never written)
    is refused (see the module doc). A loop unrolled over more than UNROLL_LIMIT iterations is
    refused. Options: cpu `threads` (a positive int), `extern_libs` (shared libraries of te.call_extern's C
    symbols); cuda `arch`, `options` (a tuple of str), `extern_source` (CUDA C defining te.call_extern's
    `__device__` functions); both `cache`
    (False: no build cache, no disk cache of binaries; codegen/build_cache.py).

    `schedule={...}`: keyword options of `auto_schedule` for te tensors (e.g. `{"gemm": {"k_tile": 32}, "threads":
    256}`: what a tuned configuration sets, `codegen.tune`); part of the build's cache key. Refused for a Schedule
    or Program (already scheduled). `tuned`: where te tensors built without `schedule=` take a tuned
    configuration from (`codegen.tune.lookup`: None reads $LOOPIR_TUNING_DB or ~/.cache/loopir/tuning when it
    exists; a path; False: never); `mod.notes` names the trial used.

    Sizes: `sizes={n: 4096}` (size Vars or their names) pins sizes before scheduling (te tensors only).
    With symbolic sizes left, the module specializes at call time (`codegen.specialize`: a variant per
    key of the call's sizes, compiled on first use; `mod.specializations`, `mod.explain()`); the generic
    module is still built here, so errors surface now. `specialize=False`: the generic module only."""
    if not isinstance(specialize, bool):
        raise ArgumentTypeError(f"build: specialize must be True or False, got {type(specialize).__name__} "
                                f"{specialize!r}")
    args, size_args = _scalar_args(args)
    with deep_recursion(), size_arguments(v for _, v in size_args):  # the visitors recurse: deep expressions
        # and long stage chains need room
        mod = _build(obj, args, target, sizes, specialize, schedule, tuned, **opts)
    if not size_args:
        return mod
    for k, v in size_args:
        if v not in mod.program.params:
            raise NotFoundError(f"build: args[{k}] is the size variable {v.name!r}, which program "
                                f"{mod.program.name!r} does not use")
    return mod.with_size_args(size_args)


def _scalar_args(args: Any) -> tuple[Any, tuple[tuple[int, Var], ...]]:
    """`args` with each scalar argument (`te.var(name, "float32")`, a 0-d read) as its tensor and the size
    variables taken out, with their positions (sizes passed in the call's argument order)."""
    if args is None or isinstance(args, Buffer) or _is_tensor(args) or not isinstance(args, (list, tuple)):
        return args, ()
    out, sizes = [], []
    for k, a in enumerate(args):
        if isinstance(a, Var):
            if any(v is a for _, v in sizes):
                raise ArgumentError(f"build: size variable {a.name!r} is listed twice in args")
            sizes.append((k, a))
            continue
        t = scalar_tensor(a)
        out.append(a if t is None else t)
    return out, tuple(sizes)


def _build(obj: Any, args: Sequence[Any] | None, target: str, sizes: dict[Any, int] | None, specialize: bool,
           schedule: dict[str, Any] | None, tuned: Any = False, **opts: Any) -> Module:
    if target not in TARGETS:
        raise ArgumentError(f"unknown target {target!r}; loopir targets: {', '.join(TARGETS)}")
    dump = opts.pop("dump_passes", False)
    _check_opts(target, opts)
    # the whole-build cache (codegen/build_cache.py): off for dump_passes (the passes must run to print)
    use_cache = not dump and opts.get("cache", True) is not False
    outs = _tensors(obj)
    sched = _schedule_options(schedule, outs is not None, type(obj).__name__)
    tuned_note = None
    ctx = tuned_context(outs, args, target, tuned) if outs is not None and not sched and not dump else None
    if ctx is not None:
        hit = tuned_options(ctx, args, sizes)
        if hit is not None:
            sched, topts, tuned_note = hit
            opts = {**topts, **opts}  # the caller's own build options win
    if outs is not None and target == "cuda":
        sched = _arch_defaults(sched, _arch(opts))
    if outs is None:
        if sizes is not None:
            raise ArgumentError(f"build: sizes= pins sizes before scheduling, so it needs te tensors; a "
                                f"{type(obj).__name__} is already scheduled (pin sizes where its tensors are made)")
        program = with_args(to_program(obj, target, args), args)
        assume = _generic_assume(program, target, specialize)
        ck = build_cache.program_key(program, target, _key_opts(target, opts, specialize)) if use_cache else None
        mod = _cached_compile(ck, lambda: _compile(program, target, opts, dump=dump, assume=assume), target, opts)
        if specialize and isinstance(mod, Module) and size_vars_of(program):
            _specialize_program(mod, program, target, opts, ck, assume is not None)
        return mod
    pinned = _check_sizes(sizes, outs)
    if pinned:
        new = substitute_sizes(outs, pinned)
        outs, args = [new[t] for t in outs], _map_args(args, new)
    key_opts = _key_opts(target, opts, specialize)
    if sched:
        key_opts["schedule"] = json.dumps(sched, sort_keys=True, default=repr)  # equal options, equal keys
    ck = build_cache.te_key(outs, args, target, key_opts) if use_cache else None

    def compile_() -> Module:
        spec = _speculate(outs, args, opts, specialize, sched) if target == "cuda" and not dump else None
        program, trace = _schedule(outs, target, None, sched)
        program = with_args(program, args)
        if spec is not None and _same(spec, program):
            late = refuse_uninitialized(program)  # deferred by the speculation; NVRTC works meanwhile
            mod = _module(spec, opts)
            mod.notes.extend(n for n in late if n not in mod.notes)
        else:
            mod = _compile(program, target, opts, dump=dump, assume=_generic_assume(program, target, specialize))
        if isinstance(mod, Module):
            mod.trace = trace
        return mod

    mod = _cached_compile(ck, compile_, target, opts)
    if tuned_note is not None:
        mod.notes.append(tuned_note)
    if specialize and isinstance(mod, Module) and size_vars_of(mod.program):
        _specialize_te(mod, outs, args, target, opts, ck, _generic_assume(mod.program, target, True) is not None,
                       sched, ctx)
    return mod


def _generic_assume(program: Program, target: str, specialize: bool) -> Assume | None:
    """What the generic module of a build may assume: on CUDA, with symbolic sizes and call-time specialization,
    32-bit indices. The specializer runs it only for calls whose every buffer stays below 2**31 elements
    (padded), the calls a 32-bit variant would take anyway, and sends any other to a 64-bit variant built at
    that call; NVRTC compiles 32-bit index arithmetic in four fifths of the time (a symbolic GEMM: 376 ms vs
    451 ms), and the generic module becomes the variant that calls with sizes of no divisibility run."""
    if target == "cuda" and specialize and size_vars_of(program):
        return Assume(index_int32=True)
    return None


def _key_opts(target: str, opts: dict[str, Any], specialize: bool = True) -> dict[str, Any]:
    """The options as the cache key sees them: all but `threads` and `cache`, which change no code (CUDA:
    the arch resolved, as build_cuda will; whether the generic module may assume 32-bit indices)."""
    out = {k: v for k, v in opts.items() if k not in ("threads", "cache")}
    if target == "cuda":
        out["arch"] = normalize_arch(opts.get("arch") or default_arch())
        out["options"] = tuple(opts.get("options") or ())
        out["specialize"] = specialize
    return out


def _cached_compile(ck: BuildKey | None, compile_: Any, target: str, opts: dict[str, Any]) -> Module:
    """The module of key `ck` from the build cache, else `compile_()` (and cached under `ck`)."""
    if ck is not None:
        hit = build_cache.load(ck, target, opts)
        if hit is not None:
            return hit
    mod = compile_()
    if ck is not None and isinstance(mod, Module):
        build_cache.store(ck, mod)
    return mod


def _tensors(obj: Any) -> list[Any] | None:
    """The output tensors of a te build (None for a Schedule or Program)."""
    if isinstance(obj, Program) or isinstance(getattr(obj, "program", None), Program):
        return None
    tensors = list(obj) if isinstance(obj, (list, tuple)) else [obj]
    if not tensors or not all(_is_tensor(t) for t in tensors):
        return None  # to_program names the mistake
    return tensors


def _schedule_options(schedule: Any, tensors: bool, what: str) -> dict[str, Any]:
    """build's `schedule=` checked: a dict of auto_schedule keywords, for te tensors only."""
    if schedule is None:
        return {}
    if not isinstance(schedule, dict) or not all(isinstance(k, str) for k in schedule):
        raise ArgumentTypeError(f"build: schedule= must be a dict of auto_schedule options, got {schedule!r}")
    if not tensors:
        raise ArgumentError(f"build: schedule= sets auto_schedule's options, but a {what} is already scheduled "
                            "(pass te tensors, or apply the options by hand)")
    bad = [k for k in schedule if k not in SCHEDULE_OPTIONS]
    if bad:
        raise ArgumentError(f"build: unknown schedule option {bad[0]!r} (auto_schedule options that a build may set: "
                            f"{', '.join(SCHEDULE_OPTIONS)})")
    return dict(schedule)


# the auto_schedule keywords `build(schedule=...)` passes on: all but what build itself decides (the outputs, the
# target, the sizes it pins, checking) and a whole fusion plan
SCHEDULE_OPTIONS = tuple(p for p in inspect.signature(auto_schedule).parameters
                         if p not in ("outputs", "target", "sizes", "plan", "check", "bounds"))


def _schedule(outs: list[Any], target: str, sizes: dict[Var, int] | None = None, options: dict[str, Any] | None = None,
              bounds: dict[Var, int] | None = None) -> tuple[Program, str | None]:
    """auto_schedule's program for `outs` and its trace (JSON for Schedule.replay; None for a te.extern graph);
    `bounds`: upper bounds of sizes every call meets (a specialization key's row classes)."""
    ext = [t.name for t in stages_of(outs) if stage_call(getattr(t.op, "body", None)) is not None]
    if ext and target == "cuda":
        raise CudaCodegenError(f"build: the graph has the te.extern stage {ext[0]!r}, which auto_schedule does not "
                               "schedule; on target 'cuda' schedule the other stages by hand (Schedule(outputs), "
                               "bind their loops) and build that Schedule")
    if ext:
        return Schedule(outs).program, None  # a te.extern stage is opaque to auto_schedule: runs as lowered
    s = auto_schedule(outs, target=target, sizes=sizes, bounds=bounds, **(options or {}))
    return s.program, s.trace_json()


@dataclasses.dataclass(frozen=True)
class _Speculation:
    key: BuildKey  # the structural key of the unchecked schedule's program
    program: Program  # that program (scheduled, not lowered)
    gen: CudaSource  # its lowered, rendered source (NVRTC in flight on it)
    notes: list[str]
    pre: list[Any]


def _speculate(outs: list[Any], args: Sequence[Any] | None, opts: dict[str, Any],
               specialize: bool = True, sched: dict[str, Any] | None = None) -> _Speculation | None:
    """Schedule `outs` *unchecked*, lower and render that, and start NVRTC on it on a background thread, before
    the checked schedule is computed: NVRTC and the legality checks then run at the same time (each is about
    half of a cold GEMM build). Nothing is trusted from here: the checked schedule is computed as always, and the
    speculation is used only when the checked program is the same program (`build_cache.program_key`, the key
    the build cache already relies on: the same structure, the same arguments and sizes); otherwise it is
    dropped and the checked program is lowered and compiled. Any error is left for the checked build."""
    try:
        fast = with_args(auto_schedule(outs, target="cuda", check=False, **(sched or {})).program, args)
        key = build_cache.program_key(fast, "cuda", {})
        if key is None:
            return None
        check_unroll(fast)
        token = DEFER_INIT_CHECK.set(True)
        try:
            low, notes, pre = _lower(fast, "cuda", assume=_generic_assume(fast, "cuda", specialize))
        finally:
            DEFER_INIT_CHECK.reset(token)
        gen = cuda_source(low, opts.get("extern_source"))
        prefetch_cubin(gen.source, _arch(opts), _options(opts), name=f"{low.name}.cu")
        return _Speculation(key, fast, gen, notes, pre)
    except Exception:  # noqa: BLE001 - a speculation only; the checked build that follows reports every error
        return None


def _arch(opts: dict[str, Any]) -> str:
    return normalize_arch(opts.get("arch") or default_arch())


def _arch_defaults(sched: dict[str, Any] | None, arch: str) -> dict[str, Any] | None:
    """The schedule options with the defaults an architecture cannot run turned off, where the caller did not
    name them: thread-block clusters (rows.cluster_row_max), the warpgroup GEMM (gemm.wgmma: mma.sync instead)
    and the warpgroup attention pass (online.wgmma: attention.m16n8k16 instead) need sm_90."""
    digits = "".join(ch for ch in arch.removeprefix("sm_") if ch.isdigit())
    if not digits or int(digits) >= 90:
        return sched
    out = dict(sched or {})
    rows = out.get("rows")
    if isinstance(rows, RowParams):
        named = rows.cluster_row_max != RowParams().cluster_row_max
        out["rows"] = rows if named else dataclasses.replace(rows, cluster_row_max=0)
    elif rows is None or isinstance(rows, dict):
        out["rows"] = {"cluster_row_max": 0, **(rows or {})}
    gemm = out.get("gemm")
    if gemm is None or isinstance(gemm, dict):
        out["gemm"] = {"wgmma": False, **(gemm or {})}
    online = out.get("online", True)
    if online is True or isinstance(online, dict):  # False: no rewrite; AttentionParams: named by the caller
        out["online"] = {"wgmma": False, **(online if isinstance(online, dict) else {})}
    return out


def _options(opts: dict[str, Any]) -> tuple[str, ...]:
    return tuple(opts.get("options") or ())


def _check_sizes(sizes: Any, outs: list[Any]) -> dict[Var, int]:
    """`sizes` as {Var: int}: each key a size variable of the graph (or its name), each value an int >= 0."""
    if sizes is None:
        return {}
    if not isinstance(sizes, dict):
        raise ArgumentTypeError(f"build: sizes must be a dict {{size variable or name: int}}, got "
                                f"{type(sizes).__name__} {sizes!r}")
    known: dict[str, Var] = {}
    for t in stages_of(outs):
        for e in (*t.shape, *(x for lh in getattr(t.op, "reduce_dom", ()) for x in lh)):
            for v in free_vars(e):
                if v.name not in known and v not in getattr(t.op, "axis", ()) and \
                        v not in getattr(t.op, "reduce_axis", ()):
                    known[v.name] = v
    out: dict[Var, int] = {}
    for k, val in sizes.items():
        v = known.get(k.name if isinstance(k, Var) else k) if isinstance(k, (Var, str)) else None
        if v is None or (isinstance(k, Var) and k is not v):
            raise NotFoundError(f"build: sizes names {getattr(k, 'name', k)!r}, which is not a size variable of "
                                f"these tensors (size variables: {', '.join(sorted(known)) or 'none'})")
        if isinstance(val, bool) or not isinstance(val, (int, np.integer)):
            raise ArgumentTypeError(f"build: size {v.name!r} must be an int, got {type(val).__name__} {val!r}")
        if val < 0:
            raise ArgumentError(f"build: size {v.name!r} must be >= 0, got {int(val)}")
        out[v] = int(val)
    return out


def _map_args(args: Sequence[Any] | None, new: dict[Any, Any]) -> list[Any] | None:
    """`args` (tensors or their buffers) of the original graph, as the substituted graph's tensors."""
    if args is None:
        return None
    if isinstance(args, Buffer) or _is_tensor(args):
        args = [args]
    out = []
    for a in args:
        t = a if _is_tensor(a) else tensor_of(a) if isinstance(a, Buffer) else None
        out.append(new.get(t, a) if t is not None else a)
    return out


def _specialize_te(mod: Module, outs: list[Any], args: Sequence[Any] | None, target: str,
                   opts: dict[str, Any], ck: BuildKey | None = None, generic_int32: bool = False,
                   sched: dict[str, Any] | None = None, tuned: Tuned | None = None) -> None:
    """Let `mod` (built from `outs`) dispatch each call to a variant rescheduled for the call's key (with a
    tuning database: the options tuned for the key's class of row lengths, `bucket_options`)."""
    svars = size_vars_of(mod.program)
    rows = {v for t in stages_of(outs) for lh in getattr(t.op, "reduce_dom", ()) for x in lh for v in free_vars(x)}
    # a matmul's rows of symbolic count: a skinny one (few rows) is planned apart (skinny tiles, split-K)
    skinny = [t.shape[-2] for t in stages_of(outs) if target == "cuda" and is_matmul_tensor(t)
              and isinstance(t.shape[-2], Var)]
    # a linear layer's batch sizes (all batches' rows meet one weight): few rows in all, one skinny GEMM
    batch_rows = [(d, tuple(dims)) for t in stages_of(outs) if target == "cuda"
                  for dims in [shared_weight_rows(t)] if dims for d in dims[:-1] if isinstance(d, Var)]
    # the int32 test covers every stage a variant could keep in memory (its schedule may inline fewer)
    bufs = [*{id(t.buffer): t.buffer for t in stages_of(outs)}.values(), *mod.program.temps]
    passed = passed_sizes()  # sizes the call passes as arguments: a variant is lowered later, outside build

    def bucket(key: Key) -> tuple[dict[str, Any], str, str] | None:
        rows_of = {n: b for n, b in key.rows if n not in {v.name for v in skinny}}
        return bucket_options(tuned, rows_of) if tuned is not None and rows_of else None

    def make(key: Key) -> Module:
        sub, hint = substitution(key, svars)
        hit = bucket(key)
        with deep_recursion(), size_arguments(passed):  # called at a call, outside build's own deep_recursion
            new = substitute_sizes(outs, sub) if sub else {}
            outs2 = [new.get(t, t) for t in outs]
            options = hit[0] if hit is not None else sched
            prog = with_args(_schedule(outs2, target, hint or None, options, bounds=hint or None)[0],
                             _map_args(args, new) if new else args)
            m = _compile(prog, target, opts, assume=Assume(index_int32=key.int32))
        if hit is not None and isinstance(m, Module):
            m.notes.append(hit[1])
        return m

    def extra(key: Key) -> Any:  # a variant built from tuned options is another cache entry than an untuned one
        hit = bucket(key)
        return None if hit is None else hit[2]

    mod.specializer = Specializer(mod, svars, [v for v in svars if v in rows], bufs,
                                  _cached_make(make, ck, target, opts, extra), int32=target == "cuda",
                                  generic_int32=generic_int32, skinny=skinny, batch_rows=batch_rows)


def _specialize_program(mod: Module, program: Program, target: str, opts: dict[str, Any],
                        ck: BuildKey | None = None, generic_int32: bool = False) -> None:
    """A hand schedule is not rescheduled: the key's sizes are substituted in the scheduled program
    (loopir.subst.substitute_program_sizes), and on CUDA its index width follows the call's sizes."""
    reads, writes = buffers_of(program.body)
    bufs = list(dict.fromkeys([*program.args, *program.temps, *reads, *writes]))
    svars = size_vars_of(program)

    def make(key: Key) -> Module:
        sub, _ = substitution(key, svars)
        with deep_recursion():  # called at a call, outside build's own deep_recursion
            prog = substitute_program_sizes(program, sub)
            return _compile(prog, target, opts, assume=Assume(index_int32=key.int32))

    mod.specializer = Specializer(mod, svars, [], bufs, _cached_make(make, ck, target, opts), int32=target == "cuda",
                                  generic_int32=generic_int32)


def _cached_make(make: Any, ck: BuildKey | None, target: str, opts: dict[str, Any], extra: Any = None) -> Any:
    """`make` (a specialization key -> its variant module) through the build cache: each variant is a
    sub-entry of the generic build's entry, so a warm process compiles no variant it met before (`extra(key)`:
    more of what the variant depends on, e.g. the tuned trial it was built from)."""
    if ck is None:
        return make

    def cached(key: Key) -> Module:
        more = extra(key) if extra is not None else None
        vk = build_cache.variant_key(ck, key, more)
        return _cached_compile(vk, lambda: make(key), target, opts)

    return cached


def _compile(program: Program, target: str, opts: dict[str, Any], dump: Any = False,
             assume: Assume | None = None) -> Module:
    """Lower and compile a scheduled program (arguments in call order) for `target`."""
    check_unroll(program)
    program, notes, pre = _lower(program, target, dump, assume)
    mod: Module
    if target == "cuda":
        mod = build_cuda(program, **opts)
    else:
        mod = CpuModule(program, compile_cpu(program, use_cache=opts.get("cache", True) is not False),
                        threads=opts.get("threads"))
    if isinstance(mod, Module):
        mod.notes = notes
        mod.preconditions = tuple(pre)
    return mod


def _lower(program: Program, target: str, dump: Any = False,
           assume: Assume | None = None) -> tuple[Program, list[str], list[Any]]:
    """`target`'s passes over `program`, with the notes and preconditions the passes left (each once)."""
    notes: list[str] = []
    pre: list[Any] = []

    def collect(_p: Any, prog: Program) -> None:
        notes.extend(n for n in notes_for(prog) if n not in notes)
        pre.extend(x for x in preconditions_for(prog) if x not in pre)

    return lower(program, target, dump=dump, after=collect, assume=assume), notes, pre


def _same(spec: _Speculation, program: Program) -> bool:
    """The checked `program` is the speculated one: the same structural digest (names, dtypes, shapes, every
    node), and wherever the two differ in an object's identity, the object is private to the program (a loop
    variable, a temporary), never one the caller passes or sizes it by (an argument buffer, a size variable)."""
    key = build_cache.program_key(program, "cuda", {})
    if key is None or key.digest != spec.key.digest or len(key.objs) != len(spec.key.objs):
        return False
    ours = {id(x) for x in (*program.args, *program.params, *size_vars_of(program))}
    theirs = {id(x) for x in (*spec.program.args, *spec.program.params, *size_vars_of(spec.program))}
    return all(a is b or (id(a) not in ours and id(b) not in theirs) for a, b in zip(key.objs, spec.key.objs))


def _module(spec: _Speculation, opts: dict[str, Any]) -> Module:
    """The CUDA module of a speculation that the checked program confirmed."""
    mod = cuda_module(spec.gen, _arch(opts), _options(opts), opts.get("cache", True))
    mod.notes = list(spec.notes)
    mod.preconditions = tuple(spec.pre)
    return mod


def _check_opts(target: str, opts: dict[str, Any]) -> None:
    if "cache" in opts and not isinstance(opts["cache"], bool):
        raise ArgumentTypeError(f"build: cache must be True or False, got {type(opts['cache']).__name__} "
                                f"{opts['cache']!r}")
    if target == "cpu":
        for o in opts:
            if o not in _CPU_OPTS:
                raise ArgumentTypeError(f"build: unknown option {o!r} for target 'cpu' (known: {', '.join(_CPU_OPTS)})")
        libs = opts.get("extern_libs")
        if libs is not None:  # shared libraries of external functions (loopir.te_extern), loaded before the JIT
            if isinstance(libs, str) or not isinstance(libs, (tuple, list)) or \
                    not all(isinstance(x, str) for x in libs):
                raise ArgumentTypeError(f"build: extern_libs must be a tuple of library paths, got {libs!r}")
            for lib in libs:
                load_library(lib)
        th = opts.get("threads")
        if th is not None and (isinstance(th, bool) or not isinstance(th, (int, np.integer)) or th < 1):
            raise ArgumentError(f"build: threads must be a positive integer (or None for all CPUs), got {th!r}")
        if th is not None:
            opts["threads"] = int(th)
        return
    for o in opts:  # named before any work (a confirmed speculation never reaches build_cuda's own check)
        if o not in CUDA_OPTS:
            raise ArgumentTypeError(f"build: unknown option {o!r} for target 'cuda' (known: {', '.join(CUDA_OPTS)})")
    if opts.get("arch") is not None:
        normalize_arch(opts["arch"])  # a bad arch is named before any lowering work
    src = opts.get("extern_source")
    if src is not None and not isinstance(src, str):
        raise ArgumentTypeError(f"build: extern_source must be CUDA C text (a str), got {type(src).__name__}")
    o = opts.get("options")
    if o is not None:
        if isinstance(o, (str, bytes)) or not all(isinstance(x, str) for x in o):
            raise ArgumentTypeError(f"build: options must be a tuple of str (one NVRTC option each), got {o!r}; "
                                    f"write options=({o!r},)" if isinstance(o, str) else
                                    f"build: options must be a tuple of str (one NVRTC option each), got {o!r}")


def compile_cpu(program: Program, use_cache: bool = True) -> Any:
    """The cached native kernel of `program` (compiled at the first request)."""
    n_params = len(program.args) + len(program.temps) + len(size_vars(program)) + 2
    # the native functions are called through ctypes, which passes at most MAX_NATIVE_ARGS arguments
    if n_params > MAX_NATIVE_ARGS:
        raise ResourceLimitError(
            f"build: program {program.name!r} needs {len(program.args) + len(program.temps)} buffers "
            f"({len(program.args)} arguments, {len(program.temps)} temporaries): more than a native CPU call can "
            f"take ({MAX_NATIVE_ARGS} parameters); inline stages (s.compute_inline) or fuse them so that fewer "
            "temporaries remain"
        )
    key = structural_key(program)
    with _cache_lock:
        hit = _cache.get(key)
    if hit is not None:
        return hit
    # generate mangles the name for LLVM; use_cache=False: no disk object cache
    kernel = CpuKernel(generate(program, program.name), use_cache=use_cache)
    with _cache_lock:
        return _cache.setdefault(key, kernel)


def cache_clear() -> None:
    """Forget this process's compiled kernels and cached builds (the disk cache stays: clear it with
    `python -m codegen.cache clear`)."""
    with _cache_lock:
        _cache.clear()
    build_cache.clear_memory()


def cache_size() -> int:
    return len(_cache)
