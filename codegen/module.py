"""Compiled modules: what `build` returns.

`Module` is the target-independent base: `mod(*arrays)` checks the arguments with
`loopir.args.bind_args` (count and dtype -> TypeError; rank, shape, size-variable conflicts,
non-contiguous -> ValueError) before any native code runs, then calls `_run(arrays, sizes)`.
`.source` is the generated code, `.kernels` the native functions one call runs, `.program`
the compiled program (arguments in call order).

A module built with symbolic sizes may specialize at call time (`codegen.specialize`): after the
checks, `_select(sizes)` picks the variant compiled for the call's key (the module itself when the
key asks for nothing); `.specializations` lists the variants built, `explain()` the last call's key.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from loopir.errors import ArgumentError, ResourceLimitError
from loopir.dtypes import np_dtype
from loopir.args import bind_args, size_of
from loopir.nodes import Buffer, Program, Var
from loopir.visit import buffers_of

from .llvm import size_vars
from .llvm.runtime import default_threads


class Module:
    """A compiled program. Subclasses implement `_run(arrays, sizes)`."""

    target = "none"

    def __init__(self, program: Program, source: str, kernels: list[str]) -> None:
        self.program = program
        self.source = source
        self.kernels = list(kernels)
        _, writes = buffers_of(program.body)
        self.written: frozenset[Buffer] = frozenset(writes)
        # what the build decided that the user should know (e.g. accesses guarded at run time)
        self.notes: list[str] = []
        # sizes the build proved unsafe (only small ones; loopir.bounds.SizePrecondition): refused per call
        self.preconditions: tuple[Any, ...] = ()
        # call-time specialization (codegen.specialize.Specializer), None for a module that never dispatches
        self.specializer: Any = None
        self._last_call: tuple[Any, dict[Var, int]] | None = None

    def explain(self) -> str:
        """The build's notes, one per line, then which specialization the last call took and why
        ("" when there is nothing to say)."""
        lines = list(self.notes)
        if self.specializer is not None and self._last_call is not None:
            lines += self.specializer.explain(*self._last_call)
        return "\n".join(lines)

    @property
    def specializations(self) -> list[str]:
        """The keys of the variants compiled so far (readable; [] for a module that does not specialize)."""
        return [] if self.specializer is None else self.specializer.specializations

    def _select(self, sizes: dict[Var, int]) -> Module:
        """The module that runs a call with these (checked) sizes: a variant for its key, or this one."""
        if self.specializer is None:
            return self
        mod, key = self.specializer.select(sizes)
        self._last_call = (key, dict(sizes))
        return mod

    def check(self, arrays: tuple[Any, ...]) -> dict[Var, int]:
        """The size variables, after every check of the arguments."""
        sizes = bind_args(self.program, arrays)
        for pre in self.preconditions:
            pre.check(sizes)
        for buf, a in zip(self.program.args, arrays):
            if buf in self.written and not a.flags.writeable:
                raise ArgumentError(
                    f"argument {buf.name!r} is written by program {self.program.name!r} but is read-only")
        return sizes

    def __call__(self, *arrays: Any) -> None:
        sizes = self.check(arrays)
        mod = self._select(sizes)
        if mod is not self:
            mod(*arrays)  # the variant checks again (its own program), then runs
            return
        self._run(arrays, sizes)

    def _run(self, arrays: tuple[Any, ...], sizes: dict[Var, int]) -> None:
        raise NotImplementedError

    def __repr__(self) -> str:
        args = ", ".join(f"{b.name}: {b.dtype}" for b in self.program.args)
        return f"<{type(self).__name__} {self.program.name}({args}) target={self.target} kernels={self.kernels}>"


INT64_MAX = 2**63 - 1


class CpuModule(Module):
    """A program JIT-compiled for this CPU. `threads` (default: the CPUs this process may use)
    run the top-level parallel loops; `threads=1` runs everything on the calling thread."""

    target = "cpu"

    def __init__(self, program: Program, kernel: Any, threads: int | None = None) -> None:
        super().__init__(program, kernel.gen.source, kernel.kernels)
        self.kernel = kernel
        self.size_vars = size_vars(program)  # positionally equal to kernel.gen.sizes (same structure)
        self.threads = default_threads() if threads is None else max(int(threads), 1)
        # temporaries are per thread: two threads calling one module must not share them
        self._local = threading.local()

    def check(self, arrays: tuple[Any, ...]) -> dict[Var, int]:
        sizes = super().check(arrays)
        # The native code declares every buffer `noalias`: refuse overlapping arrays when one is written.
        args = self.program.args
        for i in range(len(args)):
            for j in range(i + 1, len(args)):
                if (args[i] in self.written or args[j] in self.written) and arrays[i].size and arrays[j].size:
                    if np.may_share_memory(arrays[i], arrays[j]):
                        raise ArgumentError(
                            f"arguments {args[i].name!r} and {args[j].name!r} overlap in memory and one of them "
                            "is written; pass separate arrays (copy one)"
                        )
        return sizes

    def _size_values(self, sizes: dict[Var, int]) -> list[int]:
        out = []
        for v in self.size_vars:
            if v not in sizes:
                raise ArgumentError(f"size variable {v.name!r} of program {self.program.name!r} has no value")
            x = int(sizes[v])
            if not -INT64_MAX <= x <= INT64_MAX:
                raise ArgumentError(f"size variable {v.name!r} = {x} does not fit in 64 bits")
            out.append(x)
        return out

    def temps(self, sizes: dict[Var, int]) -> list[np.ndarray]:
        shapes = []
        for t in self.program.temps:
            shape = tuple(max(d, 0) for d in size_of(t.shape, sizes))
            nbytes = np_dtype(t.dtype).itemsize
            for d in shape:
                nbytes *= d
            if nbytes > INT64_MAX // 2:
                raise ResourceLimitError(f"temporary {t.name!r} of shape {shape} ({t.dtype}) is too large to allocate")
            shapes.append(shape)
        key = tuple(x for s in shapes for x in (len(s), *s))
        cached = getattr(self._local, "temps", None)
        if cached is not None and cached[0] == key:
            return cached[1]
        arrs = []
        for t, shape in zip(self.program.temps, shapes):
            try:
                arrs.append(np.empty(shape, dtype=np_dtype(t.dtype)))
            except MemoryError:
                raise MemoryError(f"cannot allocate temporary {t.name!r} of shape {shape} ({t.dtype})") from None
        self._local.temps = (key, arrs)
        return arrs

    def _run(self, arrays: tuple[Any, ...], sizes: dict[Var, int]) -> None:
        svals = self._size_values(sizes)
        temps = self.temps(sizes)
        ptrs = [a.ctypes.data for a in arrays] + [t.ctypes.data for t in temps]
        self.kernel.run(ptrs, svals, self.threads)

    @property
    def optimized_ir(self) -> str:
        return self.kernel.optimized_ir()
