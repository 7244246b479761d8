"""128-bit vector accesses of the CUDA generator (`_VectorEmitter`, a part of `codegen.cuda.kernel._KernelGen`).

Vector loads (loop kind "vectorize")
------------------------------------
A vectorized loop `v in 0..L` whose body is one Store of a dtype with L = 16 / itemsize lanes (float32: 4, float16
/ bfloat16 / int16 / uint16: 8, int8 / uint8: 16) and whose flat index is `base + v` becomes one 128-bit store
(`float4`; `uint4` of packed half pairs for the 16-bit floats, converted two lanes at a time with
`cvt.rn.f16x2.f32` / `cvt.rn.bf16x2.f32`; `uint4` of packed bytes / shorts for the small integers), with 128-bit
loads for every load of the same dtype of the form `base' + v` (halves are widened to float lane by lane: the
arithmetic is float32; small integers to int). `base` must be a multiple of L: proven statically from its affine
form where every term's coefficient is a multiple of L, otherwise checked at run time (size parameters divisible,
base pointers 16-byte aligned) with the scalar unrolled loop as fallback. The checks on pointers and sizes are
computed once at the kernel's entry (`const bool`s, `_KernelGen.entry_checks`), not at each access.
Anything else emits the scalar unrolled loop. Also handled: several float32 stores in one lane loop
(horizontally fused outputs: the loads are shared and hoisted, so no store may write a buffer the
group reads), and a lane loop body under a guard that is a conjunction of `a < b` / `a <= b` growing
with the lane (a non-dividing split, a cache_read clip): checked at the last lane, scalar fallback otherwise.
Global float4 accesses go through `LOOPIR_LD4` / `LOOPIR_ST4` (plain by default; the NVRTC options
`-DLOOPIR_STREAMING_LOADS` / `-DLOOPIR_STREAMING_STORES` make them evict-first `__ldcs` / `__stcs`).
sin and cos of one argument share one `sincosf`, per lane too.
"""

from __future__ import annotations

from typing import Any

from loopir import nodes as N
from loopir.affine import polynomial
from loopir.dtypes import itemsize, vector_lanes
from loopir.visit import free_vars, loops_of, subst_coords, substitute, walk

from .expr import _NPTYPE, _SMALL, _is_const, unrounded

_VEC_SCOPES = ("global", "shared")  # float4 accesses: global memory, and shared arrays (declared __align__(16))
# a 32-bit word of a 128-bit access of halves: (lane 2k in the low half, lane 2k + 1 in the high half)
_UNPACK = {"float16": ("loopir_h2f_lo", "loopir_h2f_hi"), "bfloat16": ("loopir_bf2f_lo", "loopir_bf2f_hi")}
_PACK = {"float16": "loopir_f2h_x2", "bfloat16": "loopir_f2bf_x2"}
# the vector type of an access of `lanes` elements: 16 bytes, or 8 (half the lanes: a float32 row of an even length,
# a 16-bit one a multiple of 4, whose rows are 8-byte aligned but not 16: 4 halves per load, not 1)
_VTYPE = {("float32", 4): "float4", ("float32", 2): "float2", ("float16", 8): "uint4", ("float16", 4): "uint2",
          ("bfloat16", 8): "uint4", ("bfloat16", 4): "uint2"}


def vector_type(dt: str, lanes: int) -> str | None:
    """The CUDA type of one access of `lanes` elements of `dt` (16 or 8 bytes), None where there is none
    (small integers: 16 bytes only, `uint4`)."""
    if dt in _SMALL and lanes == vector_lanes(dt):
        return "uint4"
    return _VTYPE.get((dt, lanes))


def _monotone_guard(cond: N.Expr, v: N.Var) -> bool:
    """cond is a conjunction of `a < b` / `a <= b` where a - b is affine with a coefficient >= 0 on v."""
    if isinstance(cond, N.Logical) and cond.op == "and":
        return _monotone_guard(cond.a, v) and _monotone_guard(cond.b, v)  # type: ignore[arg-type]
    if not (isinstance(cond, N.Compare) and cond.op in ("lt", "le")):
        return False
    p = polynomial(N.binary("sub", cond.a, cond.b))
    if p is None or any(id(v) in k and k != (id(v),) for k in p):
        return False
    return p.get((id(v),), 0) >= 0



def _plus_v(e: N.Expr, v: N.Var) -> dict | None:
    """The polynomial of `e` when `e` is base + v with v in no term of base (coefficient 1), else None."""
    p = polynomial(e)
    if p is None or p.get((id(v),)) != 1 or any(id(v) in k for k in p if k != (id(v),)):
        return None
    return p


class _VectorEmitter:
    """float4 emission of vectorized lane loops and the alignment proofs behind it; uses `_KernelGen`'s state
    (nest, names, vec_lanes, pre) and its emission helpers."""

    vec_ok: str | None = None  # the alignment test each global access of the lane loop makes (try_vector)

    def _vector_prepare(self, f: N.For) -> tuple | None:
        """(checks, stores, [(store, base, value)], [(load, base)]) when f maps to float4 accesses."""
        body = f.body
        if not (_is_const(f.lo) and _is_const(f.hi) and f.lo.value == 0):  # type: ignore[attr-defined]
            return None
        lanes = f.hi.value  # type: ignore[attr-defined]
        guard = None
        if isinstance(body, N.If) and body.orelse is None and isinstance(body.then, (N.Store, N.Seq)):
            guard, body = body.cond, body.then  # a non-dividing split's guard, a cache_read copy's clip
        # one store, or several (horizontally fused outputs of one element) sharing the lane loop
        stores = list(body.body) if isinstance(body, N.Seq) else [body]
        scopes = {st.buffer.scope if isinstance(st, N.Store) else None for st in stores}
        if not (scopes <= set(_VEC_SCOPES) or scopes == {"local"}):  # memory, or a thread's registers
            return None
        dt = stores[0].buffer.dtype  # type: ignore[union-attr]
        if any(st.buffer.dtype != dt for st in stores):  # type: ignore[union-attr]
            return None
        # 8 float32 lanes from 16-bit loads (a half row widened into shared memory): 128-bit loads of the halves,
        # two float4 stores per store
        ldt = dt
        if dt == "float32" and lanes == 8:
            halves = {n.buffer.dtype for st in stores for n in walk(st.value) if isinstance(n, N.Load)
                      and n.buffer.dtype in _UNPACK}
            if len(halves) != 1:
                return None
            ldt = halves.pop()
        elif vector_type(dt, lanes) is None:
            return None
        elif dt == "float32" and lanes == 4:
            # 4 float32 lanes whose loads along the lane are all of one 16-bit type (a half row of 8-byte chunks
            # widened into registers or shared memory): 64-bit loads of the halves
            along = {n.buffer.dtype for st in stores for n in walk(substitute(st.value, subst_coords(st)))
                     if isinstance(n, N.Load) and f.var in free_vars(n)}
            if len(along) == 1 and along <= set(_UNPACK):
                ldt = along.pop()
        v = f.var
        checks: list[str] = []
        last = None
        if guard is not None:
            if not _monotone_guard(guard, v):
                return None
            # every conjunct grows with the lane: holding at the last lane it holds at all of them
            last = self.expr(substitute(guard, {v: N.const(lanes - 1)}))
        written = {id(st.buffer) for st in stores}
        outs: list[tuple[N.Store, N.Expr, N.Expr]] = []  # (store, base, value in loop variables)
        vec_loads: list[tuple[N.Load, N.Expr]] = []
        for st in stores:
            sub = subst_coords(st)
            sflat = self.flat(st.buffer, tuple(substitute(i, sub) for i in st.indices))
            base = self._aligned_base(sflat, v, checks, lanes)
            if base is None:
                return None
            checks += self._pointer_check(st.buffer)
            value = substitute(st.value, sub)
            for n in walk(value):
                if isinstance(n, N.Load) and id(n.buffer) in written and len(stores) > 1:
                    return None  # loads are hoisted above all the stores: none may read what they write
                if isinstance(n, N.Load) and v in free_vars(n):
                    lflat = self.flat(n.buffer, n.indices)
                    if n.buffer.dtype != ldt or n.buffer.scope not in _VEC_SCOPES:
                        continue
                    lbase = self._aligned_base(lflat, v, checks, lanes)
                    if lbase is None:
                        continue
                    if all(n != x for x, _ in vec_loads):
                        vec_loads.append((n, lbase))
                        checks += self._pointer_check(n.buffer)
            outs.append((st, base, value))
        return checks, stores, outs, vec_loads, last

    def try_vector(self, f: N.For) -> bool:
        """The lane loop `f` as 128-bit accesses, under the run-time checks of their alignment (and of the lane
        guard at the last lane) with the scalar loop as the other branch. In a kernel whose rows live in registers
        (codegen.passes.registers), where only alignment is tested, the lanes are computed once and each global
        access picks the 128-bit instruction or the same bytes element by element (`loopir_ld16` / `loopir_st16`):
        a scalar copy of the computation beside the vector one in the unrolled row epilogue doubled its registers
        (NVCC: 48 -> 103 for a float16 softmax of 4096-element rows; 80% of the DRAM floor against 91% with the
        check removed, H200). Other kernels keep the two branches, as measured before."""
        prep = self._vector_prepare(f)
        if prep is None:
            return False
        checks, stores, outs, vec_loads, last = prep
        v = f.var
        lanes = f.hi.value  # type: ignore[attr-defined]
        names = ", ".join(st.name for st in stores)
        buffers = [st.buffer for st in stores] + [ld.buffer for ld, _ in vec_loads]
        per_access = bool(self.kern.register_rows) and last is None and all(b.scope != "shared" for b in buffers)
        cond = " && ".join(dict.fromkeys(([last] if last else []) + ([] if per_access else checks)))
        self.vec_ok = " && ".join(dict.fromkeys(checks)) if per_access and checks else None
        bits = 8 * lanes * itemsize(stores[0].buffer.dtype)
        if cond:
            self.line(f"if ({cond}) {{  // {names}: {bits}-bit vector loads/stores over {v.name}")
        else:
            self.line(f"{{  // {names}: {bits}-bit vector loads/stores over {v.name}"
                      + (f" (each global access tests {self.vec_ok})" if self.vec_ok else ""))
        self.ind += 1
        if stores[0].buffer.scope == "local":
            self._vector_emit_registers(v, outs, vec_loads, lanes)
        elif stores[0].buffer.dtype == "float32" and lanes == 8:
            self._vector_emit_widen(v, outs, vec_loads)
        elif stores[0].buffer.dtype == "float32":
            self._vector_emit(v, outs, vec_loads, lanes)
        elif stores[0].buffer.dtype in _SMALL:
            self._vector_emit_small(v, outs, vec_loads, stores[0].buffer.dtype)
        else:
            self._vector_emit_half(v, outs, vec_loads, stores[0].buffer.dtype, lanes)
        self.vec_ok = None
        if cond:
            self._scalar_fallback(f, lanes)
        else:
            self.ind -= 1
            self.line("}")
        return True

    def _store16(self, b: N.Buffer, at: str, value: str, vt: str, note: str = "") -> None:
        """`value` (a float4 / uint4) stored at element `at` of `b`: 128-bit (streaming per LOOPIR_ST4 for global
        memory), or per `vec_ok`'s run-time test element by element (try_vector)."""
        ptr = f"reinterpret_cast<{vt}*>(&{self.buf(b)}[{at}])"
        if b.scope != "global":
            self.line(f"*{ptr} = {value};{note}")
        elif self.vec_ok:
            self.line(f"loopir_st16<{vt}>(&{self.buf(b)}[{at}], {value}, {self.vec_ok});{note}")
        else:
            self.line(f"LOOPIR_ST4({ptr}, {value});{note}")
        self._invalidate(b)

    def _scalar_fallback(self, f: N.For, lanes: int) -> None:
        """Close the vector branch with `} else {` the lane loop as scalars `}`."""
        self.ind -= 1
        self.line("} else {")
        self.ind += 1
        vn = self.var(f.var)
        self.line("#pragma unroll 1" if f.var in self.kern.rolled else "#pragma unroll")  # rolled: a remainder copy
        self.line(f"for ({self.ix} {vn} = 0; {vn} < {lanes}; ++{vn}) {{")
        self.block(f.body, False)
        self.line("}")
        self.ind -= 1
        self.line("}")

    def try_vector_reads(self, f: N.For) -> bool:
        """An unrolled loop `v in 0..L` (L the lanes of a 16-byte access) whose body is stores (a reduction's
        share: `acc = max(acc, x[base + v])`) reading `x[base + v]` with base a multiple of L: one 128-bit load
        per such array before the body, each lane's body written out with its elements taken from the load's
        lanes (the stores keep their own form). Run-time checks as for `try_vector` (16-byte aligned pointers,
        sizes divisible, the thread's row predicate), the unrolled scalar loop as fallback. Only the shares of
        cross-thread reductions (every store a reduction's register target). A warp's share of a 16-bit row then
        issues one load per 8 elements instead of 8."""
        if not (_is_const(f.lo) and _is_const(f.hi) and f.lo.value == 0):  # type: ignore[attr-defined]
            return False
        lanes = f.hi.value  # type: ignore[attr-defined]
        stores = list(f.body.body) if isinstance(f.body, N.Seq) else [f.body]
        if not stores or not all(isinstance(st, N.Store) and id(st) in self.red_targets for st in stores):
            return False  # the shares of cross-thread reductions only (other unrolled nests keep their form)
        v, checks = f.var, ([self.pred] if self.pred is not None else [])
        written = {id(st.buffer) for st in stores}
        found: list[tuple[N.Load, N.Expr]] = []  # (the load as its statement writes it, base in the loops)
        for st in stores:
            sub = subst_coords(st)
            for n in walk(st.value):
                if not isinstance(n, N.Load) or any(n == x for x, _ in found):
                    continue
                at = tuple(substitute(i, sub) for i in n.indices)
                if not any(v in free_vars(i) for i in at) or n.buffer.scope not in _VEC_SCOPES \
                        or n.buffer.dtype not in ("float32", *_UNPACK) or vector_type(n.buffer.dtype, lanes) is None:
                    continue
                if id(n.buffer) in written:
                    return False  # the loads are hoisted above the stores
                base = self._aligned_base(self.flat(n.buffer, at), v, checks, lanes)
                if base is not None:
                    found.append((n, base))
                    checks += self._pointer_check(n.buffer)
        if not found:
            return False
        bits = 8 * lanes * itemsize(found[0][0].buffer.dtype)
        self.line(f"if ({' && '.join(dict.fromkeys(checks)) or 'true'}) {{  // {bits}-bit loads over {v.name}")
        self.ind += 1
        names = self._word_loads(found, lanes)
        vn = self.var(v)
        for lane in range(lanes):
            self.line(f"{{  // {v.name} = {lane}")
            self.ind += 1
            self.line(f"const {self.ix} {vn} = {lane};")
            self.vec_lanes = {n: self._lane(n.buffer.dtype, nm, lane) for n, nm in names.items()}
            self.stmt(f.body, False)
            self.vec_lanes = {}
            self.ind -= 1
            self.line("}")
        self._scalar_fallback(f, lanes)
        return True

    def _vector_emit(self, v: N.Var, outs: list, vec_loads: list, lanes: int = 4) -> None:
        lane_names = self._word_loads(vec_loads, lanes)
        vt = f"float{lanes}"
        for st, base, value in outs:
            out = self.names.fresh(f"{st.name}_v")
            self.line(f"{vt} {out};  // {st.name}")
            mods = self._lane_mods(v, value, lanes, lane_names)
            for lane, comp in enumerate("xyzw"[:lanes]):
                self.vec_lanes, lane_value = self._lanes_of(v, lane, value, lane_names, lanes)
                self.vec_lanes.update(mods)
                self.sincos(lane_value)  # sin and cos of one lane's argument share one sincosf
                self.line(f"{out}.{comp} = {self.expr(lane_value)};")
            self.vec_lanes = {}
            self.pre = {}
            self._store16(st.buffer, self.expr(base), out, vt)

    def _vector_emit_widen(self, v: N.Var, outs: list, vec_loads: list) -> None:
        """8 float32 lanes whose vector loads are 16-bit: one `uint4` per load (each word two lanes), the lanes
        computed in float, two float4 stores (the alignment proved for 8 lanes covers both)."""
        self.uses_half = True
        lane_names = self._word_loads(vec_loads)
        for st, base, value in outs:
            vals = self._half_lanes(v, st, value, lane_names, 8)
            for half in (0, 1):
                at = self.expr(N.binary("add", base, N.const(4 * half)))
                self._store16(st.buffer, at, f"make_float4({', '.join(vals[4 * half:4 * half + 4])})", "float4")

    def _vector_emit_registers(self, v: N.Var, outs: list, vec_loads: list, lanes: int) -> None:
        """Lanes stored into a thread's register array (codegen.passes.registers): the 128-bit loads as everywhere,
        then one register per lane (registers have no vector type)."""
        lane_names = self._word_loads(vec_loads, lanes)
        for st, base, value in outs:
            mods = self._lane_mods(v, value, lanes, lane_names)
            for lane in range(lanes):
                self.vec_lanes, lane_value = self._lanes_of(v, lane, value, lane_names, lanes)
                self.vec_lanes.update(mods)
                self.sincos(lane_value)
                at = self.expr(N.binary("add", base, N.const(lane)))
                self.line(f"{self.buf(st.buffer)}[{at}] = {self.expr(lane_value)};  // {st.name}")
            self.vec_lanes = {}
            self.pre = {}
            self._invalidate(st.buffer)

    def _half_lanes(self, v: N.Var, st: N.Store, value: N.Expr, lane_names: dict, lanes: int) -> list[str]:
        """The `lanes` (8 or 4) lanes of `value` as float constants (their names), the vector loads' lanes unpacked
        from the words of their `uint4` / `uint2` (lane 2k the low half of word k)."""
        vals = [self.names.fresh(f"{st.name}_{lane}") for lane in range(lanes)]
        mods = self._lane_mods(v, value, lanes, lane_names)
        for lane in range(lanes):
            self.vec_lanes, lane_value = self._lanes_of(v, lane, value, lane_names, lanes)
            self.vec_lanes.update(mods)
            self.sincos(lane_value)
            self.line(f"const float {vals[lane]} = {self.expr(lane_value)};")
        self.vec_lanes = {}
        self.pre = {}
        return vals

    def _lanes_of(self, v: N.Var, lane: int, value: N.Expr, lane_names: dict, lanes: int) -> tuple[dict, N.Expr]:
        """`value` at lane `lane`, and what its loads read from the loaded vectors: each vector load's own lane,
        and any other load of such a buffer at that load's base plus a constant k < lanes (a neighbour inside
        the vector: rotary embedding's partner element c + 1 - 2 (c % 2)) its lane k, not a load of its own."""
        lc = N.const(lane)
        got = {substitute(ld, {v: lc}): self._lane(ld.buffer.dtype, nm, lane) for ld, nm in lane_names.items()}
        lane_value = substitute(value, {v: lc})
        for n in walk(lane_value):
            if not isinstance(n, N.Load) or n in got:
                continue
            for ld, nm in lane_names.items():
                if ld.buffer is not n.buffer:
                    continue
                base = self.flat(ld.buffer, tuple(substitute(i, {v: N.const(0)}) for i in ld.indices))  # lane 0's
                d = polynomial(N.binary("sub", self.flat(n.buffer, n.indices), base))
                if d is not None and set(d) <= {()} and 0 <= d.get((), 0) < lanes:
                    got[n] = self._lane(n.buffer.dtype, nm, d.get((), 0))
                    break
        return got, lane_value

    def _word_loads(self, vec_loads: list, lanes: int | None = None) -> dict:
        """One vector load per load of `vec_loads` (`lanes` elements, its dtype's 16-byte lanes if None: a
        `float4` / `float2` of float32, else a `uint4` / `uint2` of packed lanes); the loaded words' names by
        load."""
        lane_names = {}
        for ld, lbase in vec_loads:
            nm = self.names.fresh(f"{ld.buffer.name}_v")
            lane_names[ld] = nm
            vt = vector_type(ld.buffer.dtype, lanes or vector_lanes(ld.buffer.dtype))
            ptr = f"reinterpret_cast<const {vt}*>(&{self.buf(ld.buffer)}[{self.expr(lbase)}])"
            if ld.buffer.scope != "global":
                self.line(f"const {vt} {nm} = *{ptr};")
            elif self.vec_ok:
                at = f"&{self.buf(ld.buffer)}[{self.expr(lbase)}]"
                self.line(f"const {vt} {nm} = loopir_ld16<{vt}>({at}, {self.vec_ok});")
            else:
                self.line(f"const {vt} {nm} = LOOPIR_LD4({ptr});")
        return lane_names

    def _lane(self, dt: str, word: str, lane: int) -> str:
        """Lane `lane` of the loaded 128-bit `word` of `dt` as a float: a float4's component, or the low / high
        half of a uint4's 32-bit word (lane 2k the low half of word k)."""
        if dt == "float32":
            return f"{word}.{'xyzw'[lane]}"
        self.uses_half = True
        return f"{_UNPACK[dt][lane % 2]}({word}.{'xyzw'[lane // 2]})"

    def _word_copy(self, st: N.Store, at: str, value: N.Expr, lane_names: dict, vt: str = "uint4") -> bool:
        """Store a loaded vector of packed words (`vt`: `uint4` / `uint2`) as it is when `value` is one of the loads
        (a copy); False otherwise."""
        if not (isinstance(value, N.Load) and value in lane_names):
            return False
        self._store16(st.buffer, at, lane_names[value], vt, f"  // {st.name}: a copy")
        return True

    def _vector_emit_half(self, v: N.Var, outs: list, vec_loads: list, dt: str, lanes: int = 8) -> None:
        """8 lanes of float16 / bfloat16 per 128-bit access (4 per 64-bit one): a `uint4` of 4 words (`uint2` of
        2), each word two lanes."""
        self.uses_half = True
        vt = vector_type(dt, lanes)
        lane_names = self._word_loads(vec_loads, lanes)
        for st, base, value in outs:
            out = self.names.fresh(f"{st.name}_v")
            at = self.expr(base)
            if self._word_copy(st, at, value, lane_names, vt):  # a copy (a cache_read row): the bits as they are
                continue
            value = unrounded(value, dt)  # the pack rounds each lane to dt: rounding first as well changes nothing
            vals = self._half_lanes(v, st, value, lane_names, lanes)
            words = ", ".join(f"{_PACK[dt]}({vals[2 * k]}, {vals[2 * k + 1]})" for k in range(lanes // 2))
            self.line(f"const {vt} {out} = make_{vt}({words});  // {st.name}")
            self._store16(st.buffer, at, out, vt)

    def _vector_emit_small(self, v: N.Var, outs: list, vec_loads: list, dt: str) -> None:
        """16 lanes of int8 / uint8 (8 of int16 / uint16) per 128-bit access: a `uint4` of 4 little-endian words,
        lane l in word l // per at bit 8 * size * (l % per); a lane is computed in int (narrowed like every small
        integer, codegen.cuda.expr) and packed back masked to its bytes."""
        size = _NPTYPE[dt]
        per, bits = 4 // size, 8 * size
        mask = "0xFFu" if size == 1 else "0xFFFFu"
        lanes = per * 4
        lane_names = self._word_loads(vec_loads)
        for st, base, value in outs:
            out = self.names.fresh(f"{st.name}_v")
            at = self.expr(base)
            if self._word_copy(st, at, value, lane_names):  # a copy: the bits as they are
                continue
            vals = [self.names.fresh(f"{st.name}_{lane}") for lane in range(lanes)]
            for lane in range(lanes):
                word, shift = f".{'xyzw'[lane // per]}", bits * (lane % per)
                self.vec_lanes = {substitute(ld, {v: N.const(lane)}): f"((int)({_SMALL[dt]})({nm}{word} >> {shift}))"
                                  for ld, nm in lane_names.items()}
                lane_value = substitute(value, {v: N.const(lane)})
                self.line(f"const int {vals[lane]} = {self.expr(lane_value)};")
            self.vec_lanes = {}
            self.pre = {}
            words = ", ".join(" | ".join(f"(((unsigned)({vals[w * per + k]}) & {mask}) << {bits * k})"
                                         for k in range(per)) for w in range(4))
            self.line(f"const uint4 {out} = make_uint4({words});  // {st.name}")
            self._store16(st.buffer, at, out, "uint4")

    def _lane_mods(self, v: N.Var, value: N.Expr, lanes: int, vector: Any) -> dict[N.Expr, str]:
        """Per `(base + v) % d` in `value` (d and base free of v: the column of a flat index, where a broadcast
        operand b[f % n] joins a collapsed row), each lane's node (v substituted) and the name of its value,
        declared here: lane 0's remainder r_0 = base % d, then r_l = r_(l-1) + 1, wrapped to 0 where it reaches d
        (exact for every d >= 1: (x + 1) % d is x % d + 1 or 0). One integer division per vector instead of one
        per lane (a division by a size is a sequence of ~20 instructions). The indices of the `vector` loads
        (read as 128-bit words) are not rendered and are skipped."""
        out: dict[N.Expr, str] = {}
        skip = set(vector)
        for n in walk(value, prune=lambda x: isinstance(x, N.Load) and x in skip):
            if not (isinstance(n, N.Binary) and n.op == "mod" and v in free_vars(n.a) and v not in free_vars(n.b)):
                continue
            lane0 = substitute(n, {v: N.const(0)})
            if lane0 in out or _plus_v(n.a, v) is None:
                continue
            r, d = self.names.fresh("col"), self.expr(n.b)
            self.line(f"const {self.ix} {r} = {self.expr(lane0)};  // the column of lane 0, then of each next lane")
            out[lane0] = r
            for lane in range(1, lanes):
                nxt = self.names.fresh("col")
                self.line(f"const {self.ix} {nxt} = ({r} + 1 == {d}) ? 0 : ({r} + 1);")
                out[substitute(n, {v: N.const(lane)})] = r = nxt
        return out

    def _pointer_check(self, b: N.Buffer) -> list[str]:
        """`b` is 16-byte aligned: a global buffer's test is one `const bool` at the kernel entry; a shared
        array needs none (declared `__align__(16)` by `allocate`)."""
        if b.scope != "global":
            return []
        return [self._entry_check(f"(((unsigned long long){self.buf(b)}) & 15) == 0", f"{b.name}_aligned16")]

    def _entry_check(self, cond: str, base: str) -> str:
        if cond not in self.entry_checks:
            self.entry_checks[cond] = self.names.fresh(base)
        return self.entry_checks[cond]

    def _aligned_base(self, flat: N.Expr, v: N.Var, checks: list[str], lanes: int = 4) -> N.Expr | None:
        """flat - v if flat = base + v with base a multiple of `lanes` (run-time checks appended), else None."""
        p = _plus_v(flat, v)
        if p is None:
            return None
        loopvars = {id(x.var) for x in loops_of(self.nest)}
        byid = {id(x): x for x in free_vars(flat)}
        for k, c in p.items():
            if k == (id(v),) or c % lanes == 0:
                continue
            sizes = [byid[i] for i in k if i not in loopvars]
            if not sizes:
                return None  # a loop-variable term with a coefficient not divisible by the lanes
            prod = " * ".join(self.var(s) for s in sizes)
            check = f"(({c}LL * {prod}) % {lanes} == 0)"
            params = set(self.program.params) | self.host_vars
            # a check on kernel parameters only is computed once at the entry
            checks.append(self._entry_check(check, "sizes_divisible") if all(s in params for s in sizes) else check)
        return substitute(flat, {v: N.const(0)})
