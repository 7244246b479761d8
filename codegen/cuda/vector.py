"""128-bit vector accesses of the CUDA generator (`_VectorEmitter`, a part of `codegen.cuda.kernel._KernelGen`).

Vector loads (loop kind "vectorize")
------------------------------------
A vectorized loop `v in 0..4` whose body is one float32 Store whose flat index is `base + v`
becomes one 128-bit `float4` store, with `float4` loads for every float32 load of the form
`base' + v`. `base` must be a multiple of 4: proven statically from its affine form where every
term's coefficient is a multiple of 4, otherwise checked at run time in the kernel (size
parameters divisible, base pointers 16-byte aligned) with the scalar unrolled loop as fallback.
Anything else emits the scalar unrolled loop. Also handled: several float32 stores in one lane loop
(horizontally fused outputs: the loads are shared and hoisted, so no store may write a buffer the
group reads), and a lane loop body under a guard that is a conjunction of `a < b` / `a <= b` growing
with the lane (a non-dividing split, a cache_read clip): checked at lane 3, scalar fallback otherwise.
Global float4 accesses go through `LOOPIR_LD4` / `LOOPIR_ST4` (plain by default; the NVRTC options
`-DLOOPIR_STREAMING_LOADS` / `-DLOOPIR_STREAMING_STORES` make them evict-first `__ldcs` / `__stcs`).
sin and cos of one argument share one `sincosf`, per lane too.
"""

from __future__ import annotations

from loopir import nodes as N
from loopir.affine import polynomial
from loopir.visit import free_vars, loops_of, subst_coords, substitute, walk

from .expr import _is_const

_VEC_SCOPES = ("global", "shared")  # float4 accesses: global memory, and shared arrays (declared __align__(16))


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



class _VectorEmitter:
    """float4 emission of vectorized lane loops and the alignment proofs behind it; uses `_KernelGen`'s state
    (nest, names, vec_lanes, pre) and its emission helpers."""

    def _vector_prepare(self, f: N.For) -> tuple | None:
        """(checks, stores, [(store, base, value)], [(load, base)]) when f maps to float4 accesses."""
        body = f.body
        if not (_is_const(f.lo) and _is_const(f.hi) and f.lo.value == 0 and f.hi.value == 4):  # type: ignore[attr-defined]
            return None
        guard = None
        if isinstance(body, N.If) and body.orelse is None and isinstance(body.then, (N.Store, N.Seq)):
            guard, body = body.cond, body.then  # a non-dividing split's guard, a cache_read copy's clip
        # one store, or several (horizontally fused outputs of one element) sharing the lane loop
        stores = list(body.body) if isinstance(body, N.Seq) else [body]
        if not all(isinstance(st, N.Store) and st.buffer.dtype == "float32" and st.buffer.scope in _VEC_SCOPES
                   for st in stores):
            return None
        v = f.var
        checks: list[str] = []
        if guard is not None:
            if not _monotone_guard(guard, v):
                return None
            # every conjunct grows with the lane: holding at lane 3 it holds at lanes 0..3
            checks.append(self.expr(substitute(guard, {v: N.const(3)})))
        written = {id(st.buffer) for st in stores}
        outs: list[tuple[N.Store, N.Expr, N.Expr]] = []  # (store, base, value in loop variables)
        vec_loads: list[tuple[N.Load, N.Expr]] = []
        for st in stores:
            sub = subst_coords(st)
            sflat = self.flat(st.buffer, tuple(substitute(i, sub) for i in st.indices))
            base = self._aligned_base(sflat, v, checks)
            if base is None:
                return None
            checks.append(f"(((unsigned long long){self.buf(st.buffer)}) & 15) == 0")
            value = substitute(st.value, sub)
            for n in walk(value):
                if isinstance(n, N.Load) and id(n.buffer) in written and len(stores) > 1:
                    return None  # loads are hoisted above all the stores: none may read what they write
                if isinstance(n, N.Load) and v in free_vars(n):
                    lflat = self.flat(n.buffer, n.indices)
                    if n.buffer.dtype != "float32" or n.buffer.scope not in _VEC_SCOPES:
                        continue
                    lbase = self._aligned_base(lflat, v, checks)
                    if lbase is None:
                        continue
                    if all(n != x for x, _ in vec_loads):
                        vec_loads.append((n, lbase))
                        checks.append(f"(((unsigned long long){self.buf(n.buffer)}) & 15) == 0")
            outs.append((st, base, value))
        return checks, stores, outs, vec_loads

    def try_vector(self, f: N.For) -> bool:
        prep = self._vector_prepare(f)
        if prep is None:
            return False
        checks, stores, outs, vec_loads = prep
        v = f.var
        cond = " && ".join(dict.fromkeys(checks))
        names = ", ".join(st.name for st in stores)
        self.line(f"if ({cond}) {{  // {names}: 128-bit vector loads/stores over {v.name}")
        self.ind += 1
        self._vector_emit(v, outs, vec_loads)
        self.ind -= 1
        self.line("} else {")
        self.ind += 1
        vn = self.var(v)
        self.line("#pragma unroll")
        self.line(f"for ({self.ix} {vn} = 0; {vn} < 4; ++{vn}) {{")
        self.block(f.body, False)
        self.line("}")
        self.ind -= 1
        self.line("}")
        return True

    def _vector_emit(self, v: N.Var, outs: list, vec_loads: list) -> None:
        lane_names = {}
        for ld, lbase in vec_loads:
            nm = self.names.fresh(f"{ld.buffer.name}_v")
            lane_names[ld] = nm
            addr = f"&{self.buf(ld.buffer)}[{self.expr(lbase)}]"
            ptr = f"reinterpret_cast<const float4*>({addr})"
            self.line(f"const float4 {nm} = {f'LOOPIR_LD4({ptr})' if ld.buffer.scope == 'global' else '*' + ptr};")
        for st, base, value in outs:
            out = self.names.fresh(f"{st.name}_v")
            self.line(f"float4 {out};  // {st.name}")
            for lane, comp in enumerate("xyzw"):
                lc = N.const(lane)
                self.vec_lanes = {substitute(ld, {v: lc}): f"{nm}.{comp}" for ld, nm in lane_names.items()}
                lane_value = substitute(value, {v: lc})
                self.sincos(lane_value)  # sin and cos of one lane's argument share one sincosf
                self.line(f"{out}.{comp} = {self.expr(lane_value)};")
            self.vec_lanes = {}
            self.pre = {}
            ptr = f"reinterpret_cast<float4*>(&{self.buf(st.buffer)}[{self.expr(base)}])"
            self.line(f"LOOPIR_ST4({ptr}, {out});" if st.buffer.scope == "global" else f"*{ptr} = {out};")
            self._invalidate(st.buffer)

    def _aligned_base(self, flat: N.Expr, v: N.Var, checks: list[str]) -> N.Expr | None:
        """flat - v if flat = base + v with base a multiple of 4 (run-time checks appended), else None."""
        p = polynomial(flat)
        if p is None or p.get((id(v),)) != 1:
            return None
        if any(id(v) in k for k in p if k != (id(v),)):
            return None
        loopvars = {id(x.var) for x in loops_of(self.nest)}
        byid = {id(x): x for x in free_vars(flat)}
        for k, c in p.items():
            if k == (id(v),) or c % 4 == 0:
                continue
            sizes = [byid[i] for i in k if i not in loopvars]
            if not sizes:
                return None  # a loop-variable term with a coefficient not divisible by 4
            prod = " * ".join(self.var(s) for s in sizes)
            checks.append(f"(({c}LL * {prod}) % 4 == 0)")
        return substitute(flat, {v: N.const(0)})
