"""Shared-memory staging of the CUDA generator (`_StagingEmitter`, a part of `codegen.cuda.kernel._KernelGen`):
cooperative block-tile copies (the block's threads share a cache_read "shared" copy, with 128-bit accesses
where alignment allows) and their software pipelining with `cp.async` into two stages (`pipelined`).
Which copies are cooperative and which loops are pipelined is decided by the CUDA pipeline
(`codegen.passes.launch`, `codegen.passes.staging`) and read here from the `Kernel` node."""

from __future__ import annotations

import math

from loopir import nodes as N
from loopir.visit import subst_coords, substitute

from .expr import _AXES, _is_const


class _StagingEmitter:
    """Uses `_KernelGen`'s state (nest, names, launch, extent, forward, thread_depth, ix, pipeline_copies) and
    its emission helpers; `_coop_vector` uses `_aligned_base` of `codegen.cuda.vector`."""

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
        guard = None
        if isinstance(inner, N.If) and inner.orelse is None:
            guard, inner = inner.cond, inner.then
        assert isinstance(inner, N.Store), "codegen.passes.launch marks only copy nests cooperative"
        sub = subst_coords(inner)
        dims = [int(x.hi.value) for x in loops]  # type: ignore[attr-defined]
        total = math.prod(dims)
        ext = [self.launch.get(f"threadIdx.{a}", N.const(1)) for a in _AXES]
        nt = math.prod(int(e.value) for e in ext) if all(_is_const(e) for e in ext) else None  # type: ignore[attr-defined]
        t, e = self.names.fresh("coop_t"), self.names.fresh("coop_e")
        self.line(f"{{  // {inner.name}: cooperative copy of {total} elements by the block's threads")
        self.ind += 1
        self.line(f"const int {t} = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);")
        vec = None
        if guard is None and dims[-1] % 4 == 0 and isinstance(inner.value, N.Load):
            vec = self._coop_vector(inner, loops[-1].var, sub)
        if vec is not None:
            checks, src, dst = vec
            if checks:
                self.line(f"if ({' && '.join(checks)}) {{")
                self.ind += 1
            self._coop_loop(loops, dims, total // 4, nt, t, e, 4, lambda: self.line(
                f"loopir_cp_async16(&{self.buf(inner.buffer)}[{self.expr(dst)}], "
                f"&{self.buf(inner.value.buffer)}[{self.expr(src)}]);") if async_ else self.line(  # type: ignore[union-attr]
                f"*reinterpret_cast<float4*>(&{self.buf(inner.buffer)}[{self.expr(dst)}]) = "
                f"*reinterpret_cast<const float4*>(&{self.buf(inner.value.buffer)}[{self.expr(src)}]);"))  # type: ignore[union-attr]
            if checks:
                self.ind -= 1
                self.line("} else {")
                self.ind += 1
        if vec is None or vec[0]:
            body = inner if guard is None else N.If(guard, inner)
            self._coop_loop(loops, dims, total, nt, t, e, 1, lambda: self._async_scalar(inner, guard) if async_
                            else self.stmt(body, False))
        if vec is not None and vec[0]:
            self.ind -= 1
            self.line("}")
        self._invalidate(inner.buffer)
        self.ind -= 1
        self.line("}")
        return True

    def _async_scalar(self, st: N.Store, guard: N.Expr | None) -> None:
        """One element of a pipelined cooperative copy: a 4-byte cp.async (skipped where the copy's clip fails)."""
        self.open_store(st)
        ld = st.value
        assert isinstance(ld, N.Load)
        call = (f"loopir_cp_async4(&{self.buf(st.buffer)}[{self.expr(self.flat(st.buffer, st.indices))}], "
                f"&{self.buf(ld.buffer)}[{self.expr(self.flat(ld.buffer, ld.indices))}]);")
        self.line(call if guard is None else f"if ({self.expr(guard)}) {call}")
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
        cooperative) and sm_80+ (cp.async); `codegen.passes.staging` checks the shape and marks the loop."""
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
        self.line(f"{{  // loop {f.var.name}: software-pipelined, next tiles copied by cp.async into a second stage")
        self.ind += 1
        for b in chain:
            self.line(f"__shared__ __align__(16) float {stages[id(b)]}[{2 * size[id(b)]}];  // 2 stages of {b.name}")
        saved = dict(self.names.of)

        def issue(k: str) -> None:
            for b in chain:
                nb = self.names.fresh(f"{b.name}_st")
                self.line(f"float* {nb} = {stages[id(b)]} + ((({k}) - ({lo})) & 1) * {size[id(b)]};")
                self.names.of[id(b)] = nb
            kn = self.names.fresh(f"{f.var.name}_copy")
            self.line(f"const {ix} {kn} = {k};")
            self.names.of[id(f.var)] = kn
            for c in items[:first]:
                self._issue_copy(c)
            self.names.of.clear()
            self.names.of.update(saved)

        self.line(f"if ({lo} < {hi}) {{  // the first tiles")
        self.ind += 1
        issue(lo)
        self.ind -= 1
        self.line("}")
        self.line('asm volatile("cp.async.commit_group;" ::: "memory");')
        self.line(f"for ({ix} {v} = {lo}; {v} < {hi}; ++{v}) {{")
        self.ind += 1
        self.forward.append({})
        self.line(f"if ({v} + 1 < {hi}) {{  // the next tiles, into the other stage")
        self.ind += 1
        issue(f"{v} + 1")
        self.ind -= 1
        self.line("}")
        self.line('asm volatile("cp.async.commit_group;" ::: "memory");')
        self.line('asm volatile("cp.async.wait_group 1;" ::: "memory");  // this iteration\'s tiles have landed')
        for b in chain:
            self.line(f"float* {self.buf(b)} = {stages[id(b)]} + (({v} - ({lo})) & 1) * {size[id(b)]};")
        for k, x in enumerate(items[first:]):
            self.stmt(x, last and k == len(items) - first - 1)
        self.forward.pop()
        self.ind -= 1
        self.line("}")
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
                   body) -> None:
        if nt is not None:
            reps = -(-n // nt)
            self.line("#pragma unroll")
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

    def _coop_vector(self, st: N.Store, v: N.Var, sub: dict) -> tuple[list[str], N.Expr, N.Expr] | None:
        ld = st.value
        if not (isinstance(ld, N.Load) and ld.buffer.dtype == "float32" and st.buffer.dtype == "float32"
                and ld.buffer.scope == "global"):
            return None
        checks: list[str] = []
        src = self._aligned_base(substitute(self.flat(ld.buffer, ld.indices), sub), v, checks)
        dchecks: list[str] = []
        dst = self._aligned_base(substitute(self.flat(st.buffer, st.indices), sub), v, dchecks)
        if src is None or dst is None or dchecks:
            return None
        checks.append(f"(((unsigned long long){self.buf(ld.buffer)}) & 15) == 0")
        return list(dict.fromkeys(checks)), N.binary("add", src, v), N.binary("add", dst, v)
