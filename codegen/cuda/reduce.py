"""Cross-thread reductions of the CUDA generator (`_ReductionEmitter`, a part of `codegen.cuda.kernel._KernelGen`).

Pattern: a loop T bound to `threadIdx.x`, containing a Store `C[idx] = C[idx] op e` (op in add, max,
min, mul; operands in either order) whose index, written in the loops around it, does NOT use T's
variable or any loop inside T. Such a statement is computed as:

    acc = identity(op)                       // one register per reduction statement
    if (t < hi) { ...loops inside T...  acc = acc op e; }   // each thread's strided share
    acc = loopir_block_allreduce(acc)        // warp shuffles, then shared memory across warps
    if (threadIdx.x == 0) C[idx] = C[idx] op acc;
    (the barrier after it, where other threads read C, is placed by codegen.passes.barriers)

Every thread ends with the total (all-reduce), so later loads of exactly `C[idx]` in the same
block read the register instead of memory (forwarding); when the init `C[idx] = identity` was
emitted just before in the same scope (nothing stored to C since), the share starts from that
constant instead of reading C[idx] back from global memory. The all-reduce is per row
(threadIdx.y, threadIdx.z), so T may sit inside loops bound to threadIdx.y / threadIdx.z (TVM's
reduction layout: rows on threadIdx.y, the reduction on threadIdx.x).

A float sum's term divided by a value the same at every iteration of T and the loops inside it (`x / n` in a
mean, `(x - mean)^2 / n` in a variance) is computed as `x * (1 / n)` (`reciprocal_terms`): the sum is
reassociated already, so one more rounding per term (half an ulp) is below the error it has anyway, and an
IEEE division per element doubled the instructions of a row kernel (H200, float16 layer norm 65536 x 768: 0.143
-> 0.061 ms, 61.7 -> 29.2 M instructions). The reciprocal of a constant is folded (correctly rounded); of a
size it is one division the compiler hoists out of the loop.

Every thread of the block must reach the shuffles and barriers of the all-reduce. A guard that
depends on a thread index around T (the guard of a threadIdx.y loop shorter than the block, the
`if i < n` of a split row loop) is therefore not emitted as an `if` around it but as a predicate
(predication): `const bool p = (i < n);`, every statement in that region runs under `if (p)`, the
reduction's share and its final store too, while the all-reduce itself runs on every thread (a
thread whose predicate is false contributes the identity). Refused: a serial loop whose bounds
depend on a thread index around T (threads would reach the all-reduce different numbers of times);
a T-invariant store inside T that is not of the form C = C op e, except to a "local" buffer
(registers are per thread). The block's x extent is rounded up to a multiple of 32 so that warps
are full, except when the rows are narrower than a warp (x extent a constant power of two W <= 16,
the block whole warps, the reductions inside a threadIdx.y / z loop): then `loopir_subwarp_allreduce<W>`
reduces each row by shuffles within its W lanes, with no shared memory and no barrier (`subwarp_width`).
"""

from __future__ import annotations

import dataclasses

from loopir import nodes as N
from loopir.dtypes import INT_RANGE, is_int
from loopir.gpu import REDUCE_OPS, reduction_parts, reduction_stores
from loopir.visit import Transformer, free_vars, loops_of, subst_coords, substitute, walk

from .expr import _CTYPE, _FROM_FLOAT, _TO_FLOAT, CudaCodegenError, _wrap, reciprocal_const



def _identity(op: str, dtype: str) -> str:
    if op == "add":
        return "0" if is_int(dtype) else ("0.0f" if _CTYPE[dtype] == "float" else "0.0")
    if op == "mul":
        return "1" if is_int(dtype) else ("1.0f" if _CTYPE[dtype] == "float" else "1.0")
    neg = op == "max"
    if dtype == "int32":
        return "(-2147483647 - 1)" if neg else "2147483647"
    if dtype == "int64":
        return "(-9223372036854775807LL - 1)" if neg else "9223372036854775807LL"
    if dtype in INT_RANGE:  # the small integers (computed in int)
        return str(INT_RANGE[dtype][0 if neg else 1])
    inf = "LOOPIR_INF_F" if _CTYPE[dtype] == "float" else "LOOPIR_INF_D"
    return f"(-{inf})" if neg else inf



class _ReductionEmitter:
    """Finds and emits cross-thread reductions; uses `_KernelGen`'s state (nest, names, forward, init_consts,
    red_targets, red_smem) and its statement emission (bound_loop, stmt)."""

    def _is_reduction_loop(self, f: N.For) -> bool:
        return f.var in self.kern.reductions  # decided by codegen.passes.launch

    @staticmethod
    def red_combine(op: str, a: str, b: str) -> str:
        if op in ("add", "mul"):
            return f"{a} {'+' if op == 'add' else '*'} {b}"
        return f"loopir_{op}({a}, {b})"

    # ---------------------------------------------------------------- predication
    def _thread_vars(self) -> set[N.Var]:
        return {x.var for x in loops_of(self.nest) if x.kind == "thread" and x.thread.startswith("threadIdx")}

    def _thread_dependent(self, e: N.Expr) -> bool:
        return bool(free_vars(e) & self._thread_vars())

    def _needs_uniform(self, s: N.Stmt) -> bool:
        """True when every thread of the block must reach `s` (it holds a cross-thread reduction or a
        barrier), so a thread-dependent guard around it must become a predicate."""
        hit = self.uniform_memo.get(id(s))
        if hit is None:
            hit = any(isinstance(n, N.Barrier) or (isinstance(n, N.For) and self._is_reduction_loop(n))
                      for n in walk(s))
            self.uniform_memo[id(s)] = hit
        return hit

    def with_pred(self, cond: str, body) -> None:
        """Run `body()` (emission) with the predicate `self.pred && cond`."""
        p = self.names.fresh("pred")
        self.line(f"const bool {p} = {cond if self.pred is None else f'{self.pred} && {cond}'};")
        saved, self.pred = self.pred, p
        body()
        self.pred = saved

    def under_pred(self, s: N.Stmt, last: bool) -> None:
        """`s` (no reduction, no barrier inside) only on the threads whose predicate holds."""
        self.line(f"if ({self.pred}) {{")
        saved, self.pred = self.pred, None
        if isinstance(s, N.Store):
            # a store declares no register the code after it reads, so it keeps the scope of forwarded
            # values: a reduction's init constant stays known to the reduction after it
            self.ind += 1
            self.stmt(s, last)
            self.ind -= 1
        else:
            self.block(s, last)
        self.pred = saved
        self.line("}")

    def predicated_if(self, s: N.If, last: bool) -> None:
        c = self.names.fresh("cond")
        self.line(f"const bool {c} = {self.expr(s.cond)};")
        self.forward.append({})
        # both branches run on every thread (each predicated): the `then` branch is last only without `else`
        self.with_pred(c, lambda: self.stmt(s.then, last and s.orelse is None))
        self.forward.pop()
        if s.orelse is not None:
            self.forward.append({})
            self.with_pred(f"!{c}", lambda: self.stmt(s.orelse, last))
            self.forward.pop()

    # ---------------------------------------------------------------- cross-thread reduction
    def reduction_loop(self, f: N.For, last: bool) -> None:
        f, recip = reciprocal_terms(f)
        reds = reduction_stores(f)
        for st in reds:
            if reduction_parts(st) is None:
                raise CudaCodegenError(
                    f"statement {st.name!r} inside loop {f.var.name!r} (bound to threadIdx.x) writes the same "
                    f"element of {st.buffer.name!r} from every thread, and is not a reduction C = C op e "
                    f"(op in {', '.join(REDUCE_OPS)})")
        self.uses_reduce = True
        accs: dict[int, str] = {}
        for st in reds:
            op, _ = reduction_parts(st)  # type: ignore[misc]
            ct = _CTYPE[st.buffer.dtype]
            acc = self.names.fresh(f"{st.name}_acc")
            accs[id(st)] = acc
            note = " (its terms' invariant divisor as a reciprocal)" if st.name in recip else ""
            self.line(f"{ct} {acc} = {_identity(op, st.buffer.dtype)};  // {st.name}: this thread's share{note}")
        saved = self.red_targets
        self.red_targets = {**saved, **accs}
        self.bound_loop(f, lambda: self.stmt(f.body, last))
        self.red_targets = saved
        for st in reds:
            op, _ = reduction_parts(st)  # type: ignore[misc]
            ct = _CTYPE[st.buffer.dtype]
            acc = accs[id(st)]
            smem = None if self.subwarp else self.red_smem.setdefault(
                ct, self.names.fresh(f"loopir_red_{ct.replace(' ', '_')}"))
            idx = tuple(substitute(i, subst_coords(st)) for i in st.indices)
            flat = self.flat(st.buffer, idx)
            ref = f"{self.buf(st.buffer)}[{self.expr(flat)}]"
            # read the current value BEFORE the barriers of the all-reduce: thread 0 overwrites it after them
            cur = self.names.fresh(f"{st.name}_before")
            key = self.forward_key(st.buffer, idx, {})
            init = self.init_consts.get(key)
            load = f"{_TO_FLOAT[st.buffer.dtype]}({ref})" if st.buffer.dtype in _TO_FLOAT else ref
            if init is not None and init[0] is self.forward[-1]:  # written in this scope, nothing since
                self.line(f"const {ct} {cur} = {init[1]};  // {st.buffer.name}[...] as initialized above")
            elif self.pred is not None:  # a thread outside the guard must not read C[idx] (out of bounds)
                self.line(f"const {ct} {cur} = {self.pred} ? {load} : ({ct}){_identity(op, st.buffer.dtype)};")
            else:
                self.line(f"const {ct} {cur} = {load};")
            if self.subwarp:
                self.uses_subwarp = True
                self.line(f"{acc} = loopir_subwarp_allreduce<{self.subwarp}>({acc}, loopir_op_{op}());  "
                          f"// {st.name}: across the {self.subwarp} threads of its row")
            elif self.kern.cluster:
                slots = self.cluster_slots.setdefault(ct, self.names.fresh(f"loopir_slots_{ct.replace(' ', '_')}"))
                self.line(f"{acc} = loopir_cluster_allreduce<{self.kern.cluster}>({acc}, loopir_op_{op}(), "
                          f"({ct}){_identity(op, st.buffer.dtype)}, {smem}, {slots}, loopir_parity);  "
                          f"// {st.name}: across the cluster's threads")
            else:
                self.line(f"{acc} = loopir_block_allreduce({acc}, loopir_op_{op}(), "
                          f"({ct}){_identity(op, st.buffer.dtype)}, {smem});  // {st.name}: across threads")
            total = self.names.fresh(f"{st.name}_total")
            # a small integer's total is narrowed (wraps): later statements may read it from this register
            self.line(f"const {ct} {total} = {_wrap(st.buffer.dtype, self.red_combine(op, cur, acc))};")
            val = f"{_FROM_FLOAT[st.buffer.dtype]}({total})" if st.buffer.dtype in _FROM_FLOAT else total
            if st.buffer.name not in self.kern.forwarded:  # else every later read takes `total` (passes.forwarded)
                self.line(f"if ({'' if self.pred is None else self.pred + ' && '}threadIdx.x == 0) {ref} = {val};")
            self._invalidate(st.buffer)
            self.forward[-1][key] = total
        # the barrier that makes the total visible to other threads is placed by codegen.passes.barriers
        return None


# ----------------------------------------------------------------------------- reciprocal terms

_FLOAT_DIV = ("float32", "float64")


def reciprocal_terms(f: N.For) -> tuple[N.For, set[str]]:
    """`f` (a loop bound to threadIdx.x holding cross-thread reductions) with each float sum's term `a / d`, `d`
    free of loads and of the variables of `f` and the loops inside it, computed as `a * (1 / d)` (the module
    docstring says why), and the names of the statements so changed (`f` itself when none)."""
    inside = {lp.var for lp in walk(f) if isinstance(lp, N.For)}

    def invariant(d: N.Expr, sub: dict) -> bool:
        return not any(isinstance(n, N.Load) for n in walk(d)) and not (free_vars(substitute(d, sub)) & inside)

    def rewrite(e: N.Expr, sub: dict) -> N.Expr:
        if isinstance(e, N.Binary):
            a, b = rewrite(e.a, sub), rewrite(e.b, sub)
            if e.op == "div" and e.dtype in _FLOAT_DIV and invariant(b, sub):
                if not isinstance(b, N.Const):
                    return N.binary("mul", a, N.binary("div", N.Const(1.0, e.dtype), b))
                r = reciprocal_const(b.value, e.dtype)
                if r is not None:
                    return N.binary("mul", a, N.Const(r, e.dtype))
            return e if (a is e.a and b is e.b) else N.Binary(e.op, a, b, e.dtype)
        if isinstance(e, N.Cast):
            a = rewrite(e.a, sub)
            return e if a is e.a else N.Cast(e.dtype, a)
        if isinstance(e, N.Unary):
            a = rewrite(e.a, sub)
            return e if a is e.a else N.Unary(e.op, a, e.dtype)
        return e

    new: dict[int, N.Store] = {}
    for st in reduction_stores(f):
        parts = reduction_parts(st)
        if parts is None or parts[0] != "add" or st.buffer.dtype not in _FLOAT_DIV:
            continue
        term = rewrite(parts[1], subst_coords(st))
        if term is not parts[1]:
            new[id(st)] = dataclasses.replace(st, value=N.binary("add", N.Load(st.buffer, st.indices), term))
    if not new:
        return f, set()

    class _R(Transformer):
        def visit_Store(self, st: N.Store) -> N.Store:
            return new.get(id(st), st)

    return _R().visit(f), {st.name for st in new.values()}
