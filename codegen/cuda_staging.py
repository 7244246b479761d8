"""Shared-memory staging of the CUDA generator (`_StagingEmitter`, a part of `codegen.cuda._KernelGen`):
cooperative block-tile copies (the block's threads share a cache_read "shared" copy, with 128-bit accesses
where alignment allows) and their software pipelining with `cp.async` into two stages (`pipelined`)."""

from __future__ import annotations

import math

from loopir import nodes as N
from loopir.visit import free_vars, substitute, walk

from .cuda_expr import _AXES, _NPTYPE, _is_const, _loops, _subst_coords


class _StagingEmitter:
    """Uses `_KernelGen`'s state (nest, names, launch, extent, forward, thread_depth, ix, pipeline_copies) and
    its emission helpers; `_coop_vector` uses `_aligned_base` of `codegen.cuda_vector`."""

    def cooperative(self, f: N.For, async_: bool = False) -> bool:
        """A "parallel" nest inside thread-bound loops whose one statement fills a shared buffer with values that
        do not depend on the thread (cache_read "shared" of a block tile): every thread would write the same
        values, so the block's threads share the iterations (thread t: flat iterations t, t + T, ...), with
        128-bit loads and stores where the alignment is proven (else checked at run time). Requires every thread
        of the block to reach the nest (no thread-dependent guard around it); otherwise plain loops.
        `async_`: the copies are `cp.async` (16 or 4 bytes), completed by the caller (see `pipelined`)."""
        loops: list[N.For] = []
        inner: N.Stmt = f
        while isinstance(inner, N.For) and inner.kind == "parallel":
            if not (_is_const(inner.lo) and _is_const(inner.hi)) or inner.lo.value != 0:  # type: ignore[attr-defined]
                return False
            loops.append(inner)
            inner = inner.body
        guard = None
        if isinstance(inner, N.If) and inner.orelse is None:
            guard, inner = inner.cond, inner.then
        if not isinstance(inner, N.Store) or inner.buffer.scope != "shared":
            return False
        tvars = {x.var for x in _loops(self.nest) if x.kind == "thread" and (x.thread or "").startswith("threadIdx")}
        sub = _subst_coords(inner)
        used = free_vars(substitute(inner.value, sub)) | free_vars(guard if guard is not None else N.const(0))
        for i in inner.indices:
            used |= free_vars(substitute(i, sub))
        if used & tvars or not self._uniform_path(f, tvars):
            return False
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

    def _copy_store(self, c: N.Stmt) -> N.Store | None:
        """The Store of a cooperative block-tile copy nest (parallel loops, an optional clip, one Store of a
        global float32 load into a float32 shared buffer), else None."""
        inner = c
        while isinstance(inner, N.For) and inner.kind == "parallel":
            inner = inner.body
        if isinstance(inner, N.If) and inner.orelse is None:
            inner = inner.then
        if not (c is not inner and isinstance(inner, N.Store) and inner.buffer.scope == "shared"
                and inner.buffer.dtype == "float32" and isinstance(inner.value, N.Load)
                and inner.value.buffer.scope == "global" and inner.value.buffer.dtype == "float32"):
            return None
        return inner

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
        cooperative) and sm_80+ (cp.async). Returns False (plain emission) when the loop has another shape."""
        if not (self.pipeline_copies and f.kind == "serial" and self.thread_depth > 0):
            return False
        chain: list[N.Buffer] = []
        inner: N.Stmt = f.body
        while isinstance(inner, N.Allocate) and inner.buffer.scope == "shared":
            chain.append(inner.buffer)
            inner = inner.body
        if not chain or not isinstance(inner, N.Seq):
            return False
        items = list(inner.body)
        first = next((k for k, x in enumerate(items) if isinstance(x, N.Barrier)), None)
        if first is None or first == 0 or first == len(items) - 1 or not isinstance(items[-1], N.Barrier):
            return False
        stores = [self._copy_store(c) for c in items[:first]]
        if any(st is None for st in stores):
            return False
        ids = {id(b) for b in chain}
        if sorted(id(st.buffer) for st in stores) != sorted(ids):  # type: ignore[union-attr]
            return False
        if any(math.prod(int(d.value) for d in b.shape) % 4 for b in chain):  # type: ignore[attr-defined]
            return False  # each stage must start 16-byte aligned
        others = sum(math.prod(int(d.value) for d in n.buffer.shape) * _NPTYPE[n.buffer.dtype]  # type: ignore[attr-defined]
                     for n in walk(self.nest) if isinstance(n, N.Allocate) and n.buffer.scope == "shared")
        if others + sum(4 * math.prod(int(d.value) for d in b.shape) for b in chain) > 48 * 1024:  # type: ignore[attr-defined]
            return False  # a second stage would pass the 48 KiB of static shared memory
        written = {id(n.buffer) for n in walk(self.nest) if isinstance(n, N.Store)}
        if any(id(st.value.buffer) in written for st in stores):  # type: ignore[union-attr]
            return False
        if any(isinstance(n, N.Store) and id(n.buffer) in ids for r in items[first:] for n in walk(r)):
            return False
        tvars = {x.var for x in _loops(self.nest) if x.kind == "thread" and (x.thread or "").startswith("threadIdx")}
        for c, st in zip(items[:first], stores):
            sub = _subst_coords(st)  # type: ignore[arg-type]
            used = free_vars(substitute(st.value, sub)).union(  # type: ignore[union-attr]
                *(free_vars(substitute(i, sub)) for i in st.indices))  # type: ignore[union-attr]
            if isinstance(c, N.For) and isinstance(c.body, N.If):
                used |= free_vars(c.body.cond)
            guards = [n.cond for n in walk(c) if isinstance(n, N.If)]
            used = used.union(*(free_vars(g) for g in guards))
            if used & tvars or not self._uniform_path(c, tvars):
                return False
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
                assert self.cooperative(c, async_=True)  # type: ignore[arg-type]
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

    def _uniform_path(self, target: N.Stmt, tvars: set[N.Var]) -> bool:
        """Every thread of the block reaches `target`: no guarded thread-bound loop, no thread-dependent If."""
        def go(s: N.Stmt) -> bool | None:
            if s is target:
                return True
            kids: list[N.Stmt] = []
            if isinstance(s, N.For):
                kids = [s.body]
            elif isinstance(s, N.Seq):
                kids = list(s.body)
            elif isinstance(s, N.Allocate):
                kids = [s.body]
            elif isinstance(s, N.If):
                kids = [s.then] + ([s.orelse] if s.orelse is not None else [])
            for k in kids:
                r = go(k)
                if r is None:
                    continue
                if not r:
                    return False
                if isinstance(s, N.If) and free_vars(s.cond) & tvars:
                    return False
                if isinstance(s, N.For) and s.kind == "thread" and (s.thread or "").startswith("threadIdx"):
                    ext = self.extent[id(s)]
                    if not (ext == self.launch[s.thread] and ext == N.binary("sub", s.hi, s.lo)):
                        return False
                return True
            return None

        return bool(go(self.nest))
