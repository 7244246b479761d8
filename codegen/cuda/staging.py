"""Shared-memory staging of the CUDA generator (`_StagingEmitter`, a part of `codegen.cuda.kernel._KernelGen`):
cooperative block-tile copies (the block's threads share a cache_read "shared" copy, with 128-bit accesses
where alignment allows) and their software pipelining with `cp.async` into two stages (`pipelined`).
Which copies are cooperative and which loops are pipelined is decided by the CUDA pipeline
(`codegen.passes.launch`, `codegen.passes.staging`) and read here from the `Kernel` node."""

from __future__ import annotations

import math

from loopir import nodes as N
from loopir.affine import linear_form
from loopir.visit import subst_coords, substitute

from .expr import _AXES, _STORAGE, _is_const

_HALF = ("float16", "bfloat16")
# rings planned by codegen.passes.mma issue the next tile after the first barrier and drop the closing one
RING_ONE_BARRIER = True
_CMP = ("lt", "le", "gt", "ge")


def _affine_clip(g: N.Expr) -> bool:
    """`g` is a conjunction of comparisons of affine index expressions (a copy's clip)."""
    if isinstance(g, N.Logical) and g.op == "and" and g.b is not None:
        return _affine_clip(g.a) and _affine_clip(g.b)
    return (isinstance(g, N.Compare) and g.op in _CMP and linear_form(g.a) is not None
            and linear_form(g.b) is not None)


class _StagingEmitter:
    """Uses `_KernelGen`'s state (nest, names, launch, extent, forward, thread_depth, ix, pipeline_copies) and
    its emission helpers; `_coop_vector` uses `_aligned_base` of `codegen.cuda.vector`."""

    roll_copies = False  # the copies being emitted are a pipeline's prologue: their loops stay rolled

    def cooperative(self, f: N.For, async_: bool = False) -> bool:
        """A "parallel" nest the pass marked cooperative (its one statement fills a shared buffer with values
        free of the thread, and every thread reaches it): the block's threads share the iterations (thread t:
        flat iterations t, t + T, ...), with 128-bit loads and stores where the alignment is proven (else
        checked at run time). `async_`: the copies are `cp.async` (16 or 4 bytes), completed by the caller."""
        loops: list[N.For] = []
        inner: N.Stmt = f
        while isinstance(inner, N.For) and inner.kind == "parallel":
            loops.append(inner)
            inner = inner.body
        guard, fill = None, None
        if isinstance(inner, N.If):  # a clip, perhaps with the zero fill of codegen.passes.pad
            guard, fill, inner = inner.cond, inner.orelse, inner.then
        assert isinstance(inner, N.Store), "codegen.passes.launch marks only copy nests cooperative"
        sub = subst_coords(inner)
        dims = [int(x.hi.value) for x in loops]  # type: ignore[attr-defined]
        total = math.prod(dims)
        if any(x.thread for x in loops):  # copy loops the schedule bound to thread axes (s.bind on a copy loop)
            self._coop_bound(loops, dims, guard, inner, async_, fill)
            return True
        ext = [self.launch.get(f"threadIdx.{a}", N.const(1)) for a in _AXES]
        nt = math.prod(int(e.value) for e in ext) if all(_is_const(e) for e in ext) else None  # type: ignore[attr-defined]
        t, e = self.names.fresh("coop_t"), self.names.fresh("coop_e")
        self.line(f"{{  // {inner.name}: cooperative copy of {total} elements by the block's threads")
        self.ind += 1
        self.line(f"const int {t} = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);")
        vec = None
        w = 8 if inner.buffer.dtype in _HALF else 4  # elements per 16 bytes
        # a clipped (edge-tile) pipelined copy of half tiles still goes by 16-byte chunks: a chunk whose first and
        # last elements pass the clip passes it whole (the clip is affine, so its set along the row is an interval)
        # (float32 tiles: those of a tensor-core ring, codegen.passes.mma; the SIMT GEMM's keep their 4-byte copies)
        chunk_guard = guard is not None and async_ and (w == 8 or bool(self.kern.mma_grids)) and _affine_clip(guard)
        if (guard is None or chunk_guard) and dims[-1] % w == 0 and isinstance(inner.value, N.Load):
            vec = self._coop_vector(inner, loops[-1].var, sub, w)
        if vec is not None:
            checks, src, dst = vec
            if checks:
                self.line(f"if ({' && '.join(checks)}) {{")
                self.ind += 1
            if guard is not None:
                self._coop_loop(loops, dims, total // w, nt, t, e, w,
                                lambda: self._clipped_chunk(inner, guard, loops[-1].var, w, src, dst, fill))
            else:
                self._coop_loop(loops, dims, total // w, nt, t, e, w, lambda: self.line(
                    f"loopir_cp_async16(&{self.buf(inner.buffer)}[{self.expr(dst)}], "
                    f"&{self.buf(inner.value.buffer)}[{self.expr(src)}]);") if async_ else self.line(  # type: ignore[union-attr]
                    f"*reinterpret_cast<float4*>(&{self.buf(inner.buffer)}[{self.expr(dst)}]) = "
                    f"*reinterpret_cast<const float4*>(&{self.buf(inner.value.buffer)}[{self.expr(src)}]);"))  # type: ignore[union-attr]
            if checks:
                self.ind -= 1
                self.line("} else {")
                self.ind += 1
        if vec is None or vec[0]:
            body = inner if guard is None else N.If(guard, inner, fill)
            # a 2-byte element has no cp.async: copied synchronously, which the pipeline's argument also covers
            # (the stage it writes was last read before the previous iteration's closing barrier)
            # the element-wise fallback of a 16-byte path (misaligned pointer or size) stays a rolled loop: unrolled
            # it keeps dozens of loads in flight, and the registers they take spill a tensor-core kernel's accumulators
            self._coop_loop(loops, dims, total, nt, t, e, 1, lambda: self._async_scalar(inner, guard, fill)
                            if async_ and inner.buffer.dtype not in _HALF else self.stmt(body, False),
                            unroll=vec is None or inner.buffer.dtype not in _HALF)
        if vec is not None and vec[0]:
            self.ind -= 1
            self.line("}")
        self._invalidate(inner.buffer)
        self.ind -= 1
        self.line("}")
        return True

    def _coop_bound(self, loops: list[N.For], dims: list[int], guard: N.Expr | None, st: N.Store,
                    async_: bool, fill: N.Stmt | None = None) -> None:
        """A cooperative copy whose loops the schedule bound to thread axes: loop c bound to threadIdx.a runs
        c = threadIdx.a, threadIdx.a + blockDim.a, ... below its extent, the others run whole in every thread, so
        each element is copied by one thread (no two loops of one copy share an axis: schedules' bind). An
        unbound innermost loop goes by 16-byte chunks where the alignment is proven (else checked at run time)."""
        bound = ", ".join(f"{x.var.name} on {x.thread}" for x in loops if x.thread)
        self.line(f"{{  // {st.name}: copy spread over the block's threads as bound ({bound})")
        self.ind += 1
        w = 8 if st.buffer.dtype in _HALF else 4  # elements per 16 bytes
        vec = None
        if guard is None and loops[-1].thread is None and dims[-1] % w == 0 and isinstance(st.value, N.Load):
            vec = self._coop_vector(st, loops[-1].var, subst_coords(st), w)

        def nest(step: int, body) -> None:  # noqa: ANN001
            ix = self.ix
            for k, (x, d) in enumerate(zip(loops, dims)):
                v = self.var(x.var)
                if x.thread:
                    a, e = x.thread.split(".")[1], self.launch.get(x.thread)
                    if e is not None and _is_const(e) and int(e.value) == d:  # type: ignore[attr-defined]
                        self.line(f"{{  const {ix} {v} = ({ix})threadIdx.{a};  // one iteration per thread")
                    else:
                        self.line(f"for ({ix} {v} = ({ix})threadIdx.{a}; {v} < {d}; {v} += ({ix})blockDim.{a}) {{")
                else:
                    inc = f"{v} += {step}" if k == len(loops) - 1 and step != 1 else f"++{v}"
                    self.line("#pragma unroll 1" if self.roll_copies else "#pragma unroll")
                    self.line(f"for ({ix} {v} = 0; {v} < {d}; {inc}) {{")
                self.ind += 1
            body()
            for _ in loops:
                self.ind -= 1
                self.line("}")

        def scalar() -> None:
            if async_ and st.buffer.dtype not in _HALF:
                self._async_scalar(st, guard, fill)
            else:
                self.stmt(st if guard is None else N.If(guard, st, fill), False)

        if vec is None:
            nest(1, scalar)
        else:
            checks, src, dst = vec
            to, frm = f"{self.buf(st.buffer)}[{self.expr(dst)}]", f"{self.buf(st.value.buffer)}[{self.expr(src)}]"  # type: ignore[union-attr]

            def chunk() -> None:
                self.line(f"loopir_cp_async16(&{to}, &{frm});" if async_ else
                          f"*reinterpret_cast<float4*>(&{to}) = *reinterpret_cast<const float4*>(&{frm});")

            if checks:
                self.line(f"if ({' && '.join(checks)}) {{")
                self.ind += 1
            nest(w, chunk)
            if checks:
                self.ind -= 1
                self.line("} else {")
                self.ind += 1
                nest(1, scalar)
                self.ind -= 1
                self.line("}")
        self._invalidate(st.buffer)
        self.ind -= 1
        self.line("}")

    def _clipped_chunk(self, st: N.Store, guard: N.Expr, v: N.Var, w: int, src: N.Expr, dst: N.Expr,
                       fill: N.Stmt | None = None) -> None:
        """One 16-byte chunk (elements v .. v + w - 1) of a clipped pipelined copy: cp.async when the clip holds at
        both ends, else the elements that pass it one by one (synchronously; a rolled loop, few registers)."""
        ends = f"({self.expr(guard)}) && ({self.expr(substitute(guard, {v: N.binary('add', v, N.const(w - 1))}))})"
        self.line(f"if ({ends}) {{")
        self.ind += 1
        self.line(f"loopir_cp_async16(&{self.buf(st.buffer)}[{self.expr(dst)}], "
                  f"&{self.buf(st.value.buffer)}[{self.expr(src)}]);")  # type: ignore[union-attr]
        self.ind -= 1
        self.line("} else {")
        self.ind += 1
        q = N.Var(self.names.fresh("chunk_q"))
        self.line("#pragma unroll 1")
        self.line(f"for (int {self.var(q)} = 0; {self.var(q)} < {w}; ++{self.var(q)}) {{")
        self.ind += 1
        self.stmt(substitute(N.If(guard, st, fill), {v: N.binary("add", v, q)}), False)
        self.ind -= 1
        self.line("}")
        self.ind -= 1
        self.line("}")

    def _async_scalar(self, st: N.Store, guard: N.Expr | None, fill: N.Stmt | None = None) -> None:
        """One element of a pipelined cooperative copy: a 4-byte cp.async (where the copy's clip fails: skipped, or
        the zero `fill` stored, which the barrier after the copies publishes as it does the cp.async)."""
        self.open_store(st)
        ld = st.value
        assert isinstance(ld, N.Load)
        to = f"{self.buf(st.buffer)}[{self.expr(self.flat(st.buffer, st.indices))}]"
        call = f"loopir_cp_async4(&{to}, &{self.buf(ld.buffer)}[{self.expr(self.flat(ld.buffer, ld.indices))}]);"
        zero = f" else {to} = {self.expr(fill.value)};" if isinstance(fill, N.Store) else ""
        self.line(call if guard is None else f"if ({self.expr(guard)}) {call}{zero}")
        self.cur_sub = {}
        self.ind -= 1
        self.line("}")

    def pipelined(self, f: N.For, last: bool) -> bool:
        """Software pipelining of a loop that stages block tiles (cache_read "shared"): the body is
        `allocate S1.. shared: copies into S1..; barrier; REST; barrier`. Emitted with two stages per shared
        buffer: tile k+1 is copied by `cp.async` into the other stage while tile k is computed on.

            issue copy(lo) -> stage 0                  for k: issue copy(k+1) -> stage (k+1-lo)&1 (if k+1 < hi)
                                                              wait for copy(k); barrier; REST on stage (k-lo)&1; barrier

        Same results as the plain loop, because: (1) the copies read global buffers that no statement of this
        kernel writes, so reading them one iteration early reads the same values; (2) the shared buffers are
        allocated inside the loop (no value flows between iterations) and REST does not write them, so every
        load in iteration k reads what copy(k) wrote, in stage (k-lo)&1, which nothing else writes during
        iteration k: copy(k+1) writes the other stage, last read in iteration k-1, before that iteration's
        closing barrier; copy(k+2) is issued after iteration k's closing barrier; (3) wait_group + barrier
        make copy(k) complete and visible to every thread before REST, as the first barrier did. Elements a
        copy's clip skips stay unspecified, as before. Requires every thread to reach the loop (the copies are
        cooperative) and sm_80+ (cp.async); `codegen.passes.staging` checks the shape and marks the loop.

        A ring of `Kernel.pipeline_stages` stages (codegen.passes.mma) keeps ns - 1 tiles in flight and issues
        tile k + ns - 1 after iteration k's first barrier instead of before it (see the comment there), which
        makes the closing barrier redundant."""
        chain: list[N.Buffer] = []
        inner: N.Stmt = f.body
        while isinstance(inner, N.Allocate) and inner.buffer.scope == "shared":
            chain.append(inner.buffer)
            inner = inner.body
        assert isinstance(inner, N.Seq), "codegen.passes.staging marks only staged loops pipelined"
        items = list(inner.body)
        first = next(k for k, x in enumerate(items) if isinstance(x, N.Barrier))
        self.uses_async = True
        v, ix = self.var(f.var), self.ix
        lo, hi = self.expr(f.lo), self.expr(f.hi)
        size = {id(b): math.prod(int(d.value) for d in b.shape) for b in chain}  # type: ignore[attr-defined]
        stages = {id(b): self.names.fresh(f"{b.name}_stages") for b in chain}
        ns = self.kern.pipeline_stages or 2  # the ring's depth, as codegen.passes.mma planned it
        ring = RING_ONE_BARRIER and self.kern.pipeline_stages >= 2 and isinstance(items[-1], N.Barrier)
        dyn = {id(b): off for b, off in self.kern.dynamic_shared if b is not None}
        self.line(f"{{  // loop {f.var.name}: software-pipelined, next tiles copied by cp.async into a ring of "
                  f"{ns} stages")
        self.ind += 1
        for b in chain:
            st = _STORAGE[b.dtype]
            if id(b) in dyn:
                self.line(f"{st}* {stages[id(b)]} = reinterpret_cast<{st}*>(loopir_dyn_smem + "
                          f"{self.expr(dyn[id(b)])});  // {ns} stages of {b.name}, dynamic shared")
            else:
                self.line(f"__shared__ __align__(16) {st} {stages[id(b)]}[{ns * size[id(b)]}];  "
                          f"// {ns} stages of {b.name}")
        saved = dict(self.names.of)

        def slot(k: str) -> str:
            return f"(({k} - ({lo})) & 1)" if ns == 2 else f"(({k} - ({lo})) % {ns})"

        def issue(k: str) -> None:
            for b in chain:
                nb = self.names.fresh(f"{b.name}_st")
                st = _STORAGE[b.dtype]
                self.line(f"{st}* {nb} = {stages[id(b)]} + {slot(f'({k})')} * {size[id(b)]};")
                self.names.of[id(b)] = nb
            kn = self.names.fresh(f"{f.var.name}_copy")
            self.line(f"const {ix} {kn} = {k};")
            self.names.of[id(f.var)] = kn
            for c in items[:first]:
                self._issue_copy(c)
            self.names.of.clear()
            self.names.of.update(saved)

        # the first ns - 1 tiles, one commit group each (empty groups past the end keep the count uniform); their
        # copy loops stay rolled: they run once per block, and unrolled they were a fifth of NVRTC's time on a GEMM
        # with edge tiles (folding them into the loop as extra iterations instead cost the loop up to 5% on an H200;
        # rolling the edge-tile copies of the loop cost a one-wave GEMM 70%: its edge blocks set its time)
        self.roll_copies = True
        for j in range(ns - 1):
            at = lo if j == 0 else f"{lo} + {j}"
            self.line(f"if ({at} < {hi}) {{  // tile {j} of the prologue")
            self.ind += 1
            issue(at)
            self.ind -= 1
            self.line("}")
            self.line('asm volatile("cp.async.commit_group;" ::: "memory");')
        self.roll_copies = False
        self.line(f"for ({ix} {v} = {lo}; {v} < {hi}; ++{v}) {{")
        self.ind += 1
        self.forward.append({})

        def later() -> None:
            self.line(f"if ({v} + {ns - 1} < {hi}) {{  // a later tile, into the stage freed last iteration")
            self.ind += 1
            issue(f"{v} + {ns - 1}")
            self.ind -= 1
            self.line("}")
            self.line('asm volatile("cp.async.commit_group;" ::: "memory");')

        def views() -> None:
            for b in chain:
                st = _STORAGE[b.dtype]
                self.line(f"{st}* {self.buf(b)} = {stages[id(b)]} + {slot(v)} * {size[id(b)]};")

        if ring:
            # a ring planned by codegen.passes.mma: wait for tile v (ns - 2 later groups may still be in flight),
            # barrier, then issue tile v + ns - 1 into stage (v - 1) % ns: every thread has passed this barrier,
            # so iteration v - 1's reads of that stage are over, and the loop's closing barrier is not needed
            # (REST writes no staged buffer); one barrier after the loop frees the ring for what follows
            self.line(f'asm volatile("cp.async.wait_group {ns - 2};" ::: "memory");  '
                      '// this iteration\'s tiles have landed')
            self.stmt(items[first], False)
            later()
            views()  # after issue(), which restores the buffer names it rebinds
            for x in items[first + 1:-1]:
                self.stmt(x, False)
        else:
            # tile v + ns - 1 goes to the stage tile v - 1 used: read before iteration v - 1's closing barrier
            later()
            self.line(f'asm volatile("cp.async.wait_group {ns - 1};" ::: "memory");  '
                      '// this iteration\'s tiles have landed')
            views()
            for k, x in enumerate(items[first:]):
                self.stmt(x, last and k == len(items) - first - 1)
        self.forward.pop()
        self.ind -= 1
        self.line("}")
        if ring:
            self.line("__syncthreads();  // the loop's last closing barrier")
        self.ind -= 1
        self.line("}")
        return True

    def _issue_copy(self, c: N.Stmt) -> None:
        """One pipelined copy: a cooperative nest, or the full-tile / edge-tile versions of one
        (`codegen.passes.full_tiles`: a block-uniform condition, so the whole block takes one branch)."""
        if isinstance(c, N.If):
            self.line(f"if ({self.expr(c.cond)}) {{  // the block's whole tile is in range")
            self.ind += 1
            self._issue_copy(c.then)
            self.ind -= 1
            if c.orelse is not None:
                self.line("} else {")
                self.ind += 1
                self._issue_copy(c.orelse)
                self.ind -= 1
            self.line("}")
            return
        assert self.cooperative(c, async_=True)  # type: ignore[arg-type]

    def _coop_loop(self, loops: list[N.For], dims: list[int], n: int, nt: int | None, t: str, e: str, width: int,
                   body, unroll: bool = True) -> None:
        if nt is not None:
            reps = -(-n // nt)
            self.line("#pragma unroll" if unroll and not self.roll_copies else "#pragma unroll 1")
            r = self.names.fresh("coop_r")
            self.line(f"for (int {r} = 0; {r} < {reps}; ++{r}) {{")
            self.ind += 1
            self.line(f"const int {e} = {t} + {r} * {nt};")
            if n % nt:
                self.line(f"if ({e} < {n}) {{")
                self.ind += 1
        else:
            self.line(f"for (int {e} = {t}; {e} < {n}; {e} += blockDim.x * blockDim.y * blockDim.z) {{")
            self.ind += 1
        flat = f"({e} * {width})" if width != 1 else e
        stride = 1
        for x, d in reversed(list(zip(loops, dims))):
            q = f"({flat} / {stride})" if stride != 1 else flat
            self.line(f"const {self.ix} {self.var(x.var)} = {q} % {d};")
            stride *= d
        body()
        if nt is not None and n % nt:
            self.ind -= 1
            self.line("}")
        self.ind -= 1
        self.line("}")

    def _coop_vector(self, st: N.Store, v: N.Var, sub: dict, w: int = 4) -> tuple[list[str], N.Expr, N.Expr] | None:
        """16-byte chunks of `w` elements (float32: 4; float16 / bfloat16: 8, copied as raw bits)."""
        ld = st.value
        if not (isinstance(ld, N.Load) and ld.buffer.dtype == st.buffer.dtype
                and ld.buffer.dtype == ("float32" if w == 4 else ld.buffer.dtype) and ld.buffer.scope == "global"):
            return None
        checks: list[str] = []
        src = self._aligned_base(substitute(self.flat(ld.buffer, ld.indices), sub), v, checks, w)
        dchecks: list[str] = []
        dst = self._aligned_base(substitute(self.flat(st.buffer, st.indices), sub), v, dchecks, w)
        if src is None or dst is None or dchecks:
            return None
        checks.append(f"(((unsigned long long){self.buf(ld.buffer)}) & 15) == 0")
        return list(dict.fromkeys(checks)), N.binary("add", src, v), N.binary("add", dst, v)
