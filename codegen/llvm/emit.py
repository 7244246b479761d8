"""Loop IR -> LLVM IR text (the CPU target's code generator).

The IR is written as text rather than through `llvmlite.ir`: the things the fast path needs —
string call-site attributes ("vector-function-abi-variant"), `memory(none)` declarations,
fast-math flags on single instructions and self-referential `distinct` loop metadata — are
either refused by `llvmlite.ir`'s attribute whitelist or need text patching there anyway.

One program becomes a few functions sharing one signature
    i32 @<name>_s<k>(ptr noalias <args and temps>..., i64 <sizes>..., i64 %lo, i64 %hi)
one per *segment* of the top-level statement list: a maximal run of serial statements
(`lo`/`hi` unused) or one top-level parallel loop, whose chunk `[lo, hi)` the runtime hands
to a thread. `void @<name>_b<k>(i64 <sizes>..., ptr %out)` writes a parallel loop's bounds.
The return value is 0, or 1 when a heap scratch allocation failed.

Numerics: float16 is loaded/stored as `half` and computed in float32 (rounded back at casts
and stores only). Integer `//` and `%` follow Python (floor); a zero divisor gives 0 (numpy's
result) instead of a trap. Float max/min propagate NaN (`llvm.maximum`, as numpy). The update
of a recognised reduction (`C[..] = C[..] op x`, op in add/max/min) carries `reassoc nsz`, so
the vectorizer may reorder the sum: float results then differ from a sequential sum by rounding
(relative ~n*eps worst case), never by more — the same freedom numpy's pairwise sum takes. A sum's
update and the product feeding it also carry `contract` (one rounding instead of two: an FMA).

The CPU pipeline (`codegen.passes`) has already turned tiling guards into loop bounds and given
tile loops a full-tile version with constant bounds; constant `vectorize` loops in the simple
subset become explicit vector code (`codegen.llvm.vec.emit_vector_loop`), the rest go to LLVM's vectorizer.

Layout: `types` (dtype -> LLVM type tables, constants, CodegenError), `math` (libmvec; the host's features
and vector width are target facts from `loopir.target`), `queries` (IR queries; index forms from
`loopir.affine`), `expr` (expression lowering), `vec` (explicit vectors); this module emits statements,
functions and the module.
"""

from __future__ import annotations

from dataclasses import dataclass

from loopir.nodes import Allocate, Barrier, Binary, Buffer, Const, For, If, Kernel, Program, Seq, Stmt, Store, Var
from loopir.target import UNROLL_EMIT_LIMIT  # one limit: the schedule notes read it too
from loopir.te_extern import extern_nest
from loopir.visit import walk

from ..names import mangle
from .expr import _ExprEmitter
from .math import host_features, libm_name, libmvec, vector_bits, vector_variants
from .queries import _const_extent, _is_parallel_top, _top_level, is_reduction, size_vars
from .types import FLT, INTS, ITEMSIZE, STORE_T, VALUE_T, CodegenError, const_text, fconst
from .vec import emit_vector_loop

# The public names of the CPU code generator, importable from here as before the split.
__all__ = [
    "FLT", "INTS", "ITEMSIZE", "STACK_LIMIT", "STORE_T", "UNROLL_EMIT_LIMIT", "VALUE_T", "CodegenError",
    "Generated", "Segment", "const_text", "fconst", "generate", "host_features", "is_reduction", "libmvec",
    "size_vars", "vector_bits", "vector_variants",
]

STACK_LIMIT = 64 * 1024  # bytes: a constant-size scratch up to this lives on the stack


@dataclass(frozen=True)
class Segment:
    """One native function of a program: serial statements, or a parallel loop's chunk."""

    fn: str
    parallel: bool
    bounds_fn: str | None  # for a parallel segment: writes (lo, hi)


@dataclass(frozen=True)
class Generated:
    source: str
    segments: tuple[Segment, ...]
    buffers: tuple[Buffer, ...]  # pointer parameters in order: args then temps
    sizes: tuple[Var, ...]  # i64 parameters in order


# ----------------------------------------------------------------------------- module emitter


class _ModuleEmitter:
    def __init__(self) -> None:
        self.decls: dict[str, str] = {}
        self.attr_groups: list[str] = []
        self.vfabi_attr: dict[str, int] = {}
        self.used_vector: list[str] = []
        self.metadata: list[str] = []
        self.n_md = 0
        self.mem_none = self.attr_group("nounwind willreturn memory(none)")

    def attr_group(self, text: str) -> int:
        self.attr_groups.append(text)
        return len(self.attr_groups) - 1

    def declare(self, name: str, decl: str) -> None:
        self.decls.setdefault(name, decl)

    def md(self, text: str) -> int:
        k = self.n_md
        self.n_md += 1
        self.metadata.append(f"!{k} = {text}")
        return k

    def loop_md(self, props: list[str]) -> int:
        ids = [self.md("!{" + p + "}") for p in props]
        k = self.n_md
        self.n_md += 1
        self.metadata.append(f"!{k} = distinct !{{!{k}" + "".join(f", !{i}" for i in ids) + "}")
        return k

    def math_call(self, fn: str, dtype: str) -> tuple[str, str]:
        """(callee, call-site attribute text) for libm `fn` in `dtype`'s compute type."""
        name = libm_name(fn, dtype)
        t = "double" if dtype == "float64" else "float"
        self.declare(name, f"declare {t} @{name}({t}) #{self.mem_none}")
        variants = vector_variants(name)
        if not variants:
            return name, ""
        if name not in self.vfabi_attr:
            maps = ",".join(f"_ZGV_LLVM_N{vf}v_{name}({sym})" for vf, sym in variants)
            self.vfabi_attr[name] = self.attr_group(f'"vector-function-abi-variant"="{maps}"')
            for vf, sym in variants:
                self.declare(sym, f"declare <{vf} x {t}> @{sym}(<{vf} x {t}>)")
                self.used_vector.append(sym)
        return name, f" #{self.vfabi_attr[name]}"

    def text(self, functions: list[str]) -> str:
        parts = list(self.decls.values())
        if self.used_vector:
            refs = ", ".join(f"ptr @{s}" for s in self.used_vector)
            parts.append(f'@llvm.compiler.used = appending global [{len(self.used_vector)} x ptr] [{refs}], '
                         'section "llvm.metadata"')
        parts += functions
        parts += [f"attributes #{k} = {{ {t} }}" for k, t in enumerate(self.attr_groups)]
        parts += self.metadata
        return "\n".join(parts) + "\n"


# ----------------------------------------------------------------------------- function emitter


class _FnEmitter(_ExprEmitter):
    """One native function: `_ExprEmitter`'s expressions plus statements, loops and scratch memory."""

    def __init__(self, mod: _ModuleEmitter, bufs: dict[Buffer, str], env: dict[Var, str]) -> None:
        super().__init__(mod, bufs, env)
        self.allocas: list[str] = []
        self.uses_fail = False

    # --- statements
    def stmt(self, s: Stmt) -> None:
        if isinstance(s, Seq):
            for c in s.body:
                self.stmt(c)
        elif isinstance(s, Store):
            self.store(s)
        elif isinstance(s, For):
            self.loop(s)
        elif isinstance(s, If):
            self.if_(s)
        elif isinstance(s, Allocate):
            self.allocate(s)
        elif isinstance(s, Barrier):
            pass  # every CPU "thread" loop runs serially; see gaps in the report
        elif isinstance(s, Kernel):
            self.stmt(s.body)  # a CUDA-lowered program run on the CPU: its launch is its body, serially
        else:
            raise CodegenError(f"cannot compile statement {type(s).__name__}")

    def store(self, s: Store) -> None:
        self.memo = {}
        saved = {v: self.env[v] for v in s.iters if v in self.env}
        vals = [self.index(c) for c in s.coords]
        for v, x in zip(s.iters, vals):
            self.env[v] = x
        red = is_reduction(s)
        if red is not None:
            self.reduction_ops.add(id(red))
            if red.op == "add":
                self.contract_ops.update(id(x) for x in (red.a, red.b) if isinstance(x, Binary) and x.op == "mul")
        val = self.expr(s.value)
        ptr = self.address(s.buffer, s.indices)
        dt = s.buffer.dtype
        if s.value.dtype != dt:
            val = self.cast(val, s.value.dtype, dt)
        if dt == "float16":
            val = self.op(f"fptrunc float {val} to half")
        elif dt == "bfloat16":
            val = self.float_to_bf16(val)
        elif dt == "bool":
            val = self.op(f"zext i1 {val} to i8")
        self.emit(f"store {STORE_T[dt]} {val}, ptr {ptr}, align {ITEMSIZE[dt]}")
        for v in s.iters:
            self.env.pop(v, None)
        self.env.update(saved)
        self.memo = {}

    def loop_props(self, f: For) -> list[str]:
        if f.kind == "vectorize":
            widest = max((ITEMSIZE[n.buffer.dtype] for n in walk(f.body) if isinstance(n, Store)), default=4)
            width = max(vector_bits() // (8 * max(widest, 4)), 2)  # narrow types are computed as 32-bit
            return ['!"llvm.loop.vectorize.enable", i1 true', f'!"llvm.loop.vectorize.width", i32 {width}']
        if f.kind == "unroll":
            return ['!"llvm.loop.unroll.full"'] if _const_extent(f) is not None else ['!"llvm.loop.unroll.enable"']
        count = dict(f.pragmas).get("unroll")  # the primitive `pragma`: an unroll count (1: keep it rolled)
        if count:
            return ['!"llvm.loop.mustprogress"',
                    '!"llvm.loop.unroll.disable"' if count == 1 else f'!"llvm.loop.unroll.count", i32 {count}']
        return ['!"llvm.loop.mustprogress"']  # serial, and "host" (a GPU loop of launches): a plain loop here

    def loop(self, f: For, lo_hi: tuple[str, str] | None = None) -> None:
        self.memo = {}
        stage = extern_nest(f)
        if stage is not None:  # a te.extern stage: its model nest runs as one call of its function
            return self.extern_stage(stage[1])
        ext = _const_extent(f)
        if f.kind == "unroll" and ext is not None and ext <= UNROLL_EMIT_LIMIT and lo_hi is None:
            saved = self.env.get(f.var)
            for k in range(ext):
                self.env[f.var] = str(int(f.lo.value) + k)  # type: ignore[union-attr]
                self.stmt(f.body)
            self._restore(f.var, saved)
            return
        if f.kind == "vectorize" and lo_hi is None and emit_vector_loop(self, f):
            return
        lo, hi = lo_hi if lo_hi is not None else (self.index(f.lo), self.index(f.hi))
        pre = self.block
        lb, ll, lx = self.label("body"), self.label("latch"), self.label("exit")
        c = self.op(f"icmp slt i64 {lo}, {hi}")
        self.emit(f"br i1 {c}, label %{lb}, label %{lx}")
        self.start(lb)
        i = self.tmp()
        nxt = self.tmp()
        self.emit(f"{i} = phi i64 [ {lo}, %{pre} ], [ {nxt}, %{ll} ]")
        saved = self.env.get(f.var)
        self.env[f.var] = i
        self.stmt(f.body)
        self._restore(f.var, saved)
        self.emit(f"br label %{ll}")
        self.start(ll)
        self.emit(f"{nxt} = add nsw i64 {i}, 1")
        c2 = self.op(f"icmp slt i64 {nxt}, {hi}")
        md = self.m.loop_md(self.loop_props(f))
        self.emit(f"br i1 {c2}, label %{lb}, label %{lx}, !llvm.loop !{md}")
        self.start(lx)
        self.memo = {}

    def if_(self, s: If) -> None:
        self.memo = {}
        c = self.expr(s.cond, index=True)
        lt, lf, lj = self.label("then"), self.label("else"), self.label("endif")
        self.emit(f"br i1 {c}, label %{lt}, label %{lf if s.orelse is not None else lj}")
        self.start(lt)
        self.stmt(s.then)
        self.emit(f"br label %{lj}")
        if s.orelse is not None:
            self.start(lf)
            self.memo = {}
            self.stmt(s.orelse)
            self.emit(f"br label %{lj}")
        self.start(lj)
        self.memo = {}

    def allocate(self, s: Allocate) -> None:
        b = s.buffer
        st, isz = STORE_T[b.dtype], ITEMSIZE[b.dtype]
        if all(isinstance(d, Const) for d in b.shape):
            n = 1
            for d in b.shape:
                n *= max(int(d.value), 0)  # type: ignore[union-attr]
            if n * isz <= STACK_LIMIT:
                p = self.tmp()
                self.allocas.append(f"  {p} = alloca [{max(n, 1)} x {st}], align 64")
                self.bufs[b] = p
                self.stmt(s.body)
                return
        self.memo = {}
        nbytes = str(isz)
        for d in b.shape:
            dv = self.index(d)
            pos = self.op(f"call i64 @llvm.smax.i64(i64 {dv}, i64 0)")
            nbytes = self.op(f"mul i64 {nbytes}, {pos}")
        self.m.declare("llvm.smax.i64", "declare i64 @llvm.smax.i64(i64, i64)")
        self.m.declare("malloc", "declare noalias ptr @malloc(i64) nounwind")
        self.m.declare("free", "declare void @free(ptr) nounwind")
        p = self.op(f"call ptr @malloc(i64 {nbytes})")
        bad = self.op(f"icmp eq ptr {p}, null")
        ok = self.label("alloc_ok")
        self.emit(f"br i1 {bad}, label %fail, label %{ok}")
        self.uses_fail = True
        self.start(ok)
        self.bufs[b] = p
        self.stmt(s.body)
        self.emit(f"call void @free(ptr {p})")
        self.memo = {}

    def finish(self, header: str) -> str:
        tail = ["  ret i32 0"]
        if self.uses_fail:
            tail += ["fail:", "  ret i32 1"]
        return "\n".join([header, "entry:", *self.allocas, *self.lines, *tail, "}"])



# ----------------------------------------------------------------------------- program


def generate(program: Program, fn_name: str) -> Generated:
    """LLVM IR text for `program`: one function per top-level segment (see module doc)."""
    # the functions' names are the only names this target takes from the IR (values are numbered: buffers
    # %a<k>, sizes %n<k>, temporaries %t<k>), through the one mangling of codegen.names
    fn_name = mangle(fn_name)
    bufs = (*program.args, *program.temps)
    if len(set(bufs)) != len(bufs):
        raise CodegenError(f"program {program.name!r} lists a buffer twice among its arguments and temporaries")
    sizes = size_vars(program)
    mod = _ModuleEmitter()
    ptr_names = {b: f"%a{k}" for k, b in enumerate(bufs)}
    size_names = {v: f"%n{k}" for k, v in enumerate(sizes)}
    params = [f"ptr noalias {ptr_names[b]}" for b in bufs] + [f"i64 {size_names[v]}" for v in sizes]
    header_params = ", ".join(params + ["i64 %lo", "i64 %hi"])

    # group top-level statements: runs of serial statements, and each parallel loop alone
    groups: list[tuple[bool, list[Stmt]]] = []
    for s in _top_level(program.body):
        if _is_parallel_top(s):
            groups.append((True, [s]))
        elif groups and not groups[-1][0]:
            groups[-1][1].append(s)
        else:
            groups.append((False, [s]))

    functions: list[str] = []
    segments: list[Segment] = []
    for k, (par, stmts) in enumerate(groups):
        name = f"{fn_name}_s{k}"
        fe = _FnEmitter(mod, ptr_names, size_names)
        if par:
            f = stmts[0]
            assert isinstance(f, For)
            fe.loop(f, lo_hi=("%lo", "%hi"))
            be = _FnEmitter(mod, {}, size_names)
            lo, hi = be.index(f.lo), be.index(f.hi)
            be.emit(f"store i64 {lo}, ptr %out, align 8")
            p1 = be.op("getelementptr inbounds i64, ptr %out, i64 1")
            be.emit(f"store i64 {hi}, ptr {p1}, align 8")
            bname = f"{fn_name}_b{k}"
            bparams = ", ".join([f"i64 {size_names[v]}" for v in sizes] + ["ptr %out"])
            btext = be.finish(f"define i32 @{bname}({bparams}) nounwind {{")
            functions.append(btext)
            segments.append(Segment(name, True, bname))
        else:
            for s in stmts:
                fe.stmt(s)
            segments.append(Segment(name, False, None))
        functions.append(fe.finish(f"define i32 @{name}({header_params}) nounwind {{"))
    if not groups:  # an empty program still gets a function
        fe = _FnEmitter(mod, ptr_names, size_names)
        functions.append(fe.finish(f"define i32 @{fn_name}_s0({header_params}) nounwind {{"))
        segments.append(Segment(f"{fn_name}_s0", False, None))
    return Generated(mod.text(functions), tuple(segments), tuple(bufs), sizes)
