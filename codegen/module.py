"""Compiled modules: what `build` returns.

`Module` is the target-independent base: `mod(*arrays)` checks the arguments with
`loopir.args.bind_args` (count and dtype -> TypeError; rank, shape, size-variable conflicts,
non-contiguous -> ValueError) before any native code runs, then calls `_run(arrays, sizes)`.
`.source` is the generated code, `.kernels` the native functions one call runs, `.program`
the compiled program (arguments in call order).

A module built with symbolic sizes may specialize at call time (`codegen.specialize`): after the
checks, `_select(sizes)` picks the variant compiled for the call's key (the module itself when the
key asks for nothing); `.specializations` lists the variants built, `explain()` the last call's key.

The fast path (`mod.fast_path`, on by default): a module remembers the last few argument *signatures*
(per argument everything the checks read except the data: type, shape, dtype, contiguity, writeability,
on CUDA the device) with what the checked call decided (sizes, variant, size values, temporaries; on CUDA
each launch's grid, block, shared bytes and arguments). A call with a remembered signature re-reads only
the pointers (and re-checks what depends on them: overlapping memory on the CPU, the stream on CUDA) and
runs; any other call takes the full path, so it is refused or handled exactly as without the cache.
`mod.fast_path = False` makes every call take the full path.

Scalar arguments: a 0-d argument the program only reads (`te.var("alpha", "float32")`) takes a Python or
numpy number in its place (`mod(a, 2.5, b)`), checked against its dtype (a float for an integer scalar, a
bool, a value outside a small integer's range: a typed error naming it). A size variable listed in build's
`args` (`build(outs, [a, tsteps, b])`, `size_args`) takes a non-negative int at its position; it is bound
like a size inferred from a shape (and checked against the shapes that carry it), so call-time
specialization and the fast path see it (the fast path keys on its value).
"""

from __future__ import annotations

import copy
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from loopir.errors import ArgumentError, ArgumentTypeError, ResourceLimitError
from loopir.dtypes import INT_RANGE, is_float, np_dtype, to_bfloat16
from loopir.args import bind_args, size_of
from loopir.nodes import Buffer, Program, Var
from loopir.visit import buffers_of

from .llvm import size_vars
from .llvm.runtime import default_threads


def _host_signature(arrays: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """What `Module.check` reads from numpy arguments except their data (type, shape, dtype, contiguity,
    writeability); None when some argument is not a numpy array (the full path says why)."""
    sig = []
    for a in arrays:
        if not isinstance(a, np.ndarray):
            return None
        f = a.flags
        sig.append((type(a), a.shape, a.dtype, f.c_contiguous, f.writeable))
    return tuple(sig)


@dataclass(slots=True)
class _HostPlan:
    """What a checked call decided, for later calls with its signature: the module that runs (a variant or
    the one called), the sizes, `explain()`'s record, the argument pairs whose memory must not overlap (both
    non-empty, one written: re-checked per call, since that depends on the pointers), and the run's data."""

    module: Module
    sizes: dict[Var, int]
    last_call: tuple[Any, dict[Var, int]] | None
    pairs: tuple[tuple[int, int, int, int], ...]  # (i, nbytes of i, j, nbytes of j)
    run: Any = None  # the module's own precomputation (CpuModule: size values, temporaries' key)


MAX_PLANS = 8  # signatures remembered per module


class Module:
    """A compiled program. Subclasses implement `_run(arrays, sizes)`; one that can replay a checked call
    (`_plannable`) implements `_plan_run(sizes)` and `_run_planned(arrays, ptrs, plan)`."""

    target = "none"
    # (position in a call's arguments, size variable) of each size passed as a scalar argument (set by build)
    size_args: tuple[tuple[int, Var], ...] = ()
    # remember the last few argument signatures and what their checks decided (the fast path); False: every
    # call takes the full checking path (same results, slower)
    fast_path = True
    _plannable = False

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
        # the schedule as data: auto_schedule's trace (JSON for Schedule.replay) when build scheduled te tensors
        self.trace: str | None = None
        # call-time specialization (codegen.specialize.Specializer), None for a module that never dispatches
        self.specializer: Any = None
        self._last_call: tuple[Any, dict[Var, int]] | None = None
        self._plans: dict[Any, Any] = {}  # signature -> plan (the fast path)
        # positions of the scalar arguments: 0-d buffers the program only reads take a number in their place
        self._scalars = tuple(k for k, b in enumerate(program.args) if not b.shape and b not in self.written)

    def with_size_args(self, size_args: tuple[tuple[int, Var], ...]) -> Module:
        """This module called with sizes among its arguments at these positions (a copy: the build cache may
        hand this module to another build whose args differ)."""
        mod = copy.copy(self)
        mod.size_args = tuple(size_args)
        mod._plans = {}
        return mod

    def split_call(self, args: tuple[Any, ...]) -> tuple[tuple[Any, ...], dict[Var, int] | None]:
        """A call's arguments as (arrays in program.args order, sizes passed as arguments or None): size
        arguments taken out, a number passed for a scalar argument made a 0-d array of its dtype."""
        known = None
        if self.size_args:
            names = [b.name for b in self.program.args]
            for k, v in self.size_args:
                names.insert(k, v.name)
            if len(args) != len(names):
                raise ArgumentTypeError(f"program {self.program.name!r} takes {len(names)} argument(s) "
                                        f"({', '.join(names)}), got {len(args)}")
            known = {}
            where = dict(self.size_args)
            arrays = []
            for k, a in enumerate(args):
                v = where.get(k)
                if v is None:
                    arrays.append(a)
                    continue
                if isinstance(a, (bool, np.bool_)) or not isinstance(a, (int, np.integer)):
                    raise ArgumentTypeError(f"size argument {v.name!r} (argument {k}) must be an int, got "
                                            f"{type(a).__name__} {a!r}")
                if a < 0:
                    raise ArgumentError(f"size argument {v.name!r} (argument {k}) is negative: {int(a)}")
                known[v] = int(a)
            args = tuple(arrays)
        if self._scalars and len(args) == len(self.program.args):
            fixed = None
            for k in self._scalars:
                a = args[k]
                if isinstance(a, np.generic) or not hasattr(a, "shape"):  # a number (numpy scalars have a shape)
                    if fixed is None:
                        fixed = list(args)
                    fixed[k] = _scalar_array(self.program.args[k], a)
            if fixed is not None:
                args = tuple(fixed)
        return args, known

    def explain(self) -> str:
        """The build's notes, one per line, then which specialization the last call took and why
        ("" when there is nothing to say)."""
        lines = list(self.notes)
        if self.specializer is not None and self._last_call is not None:
            lines += self.specializer.explain(*self._last_call)
        return "\n".join(lines)

    @property
    def last_ran(self) -> Module:
        """The module the last call ran: the variant built for its sizes (codegen.specialize), else this one."""
        if self.specializer is None or self._last_call is None:
            return self
        return self.specializer.variants.get(self._last_call[0], self)

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

    def check(self, arrays: tuple[Any, ...], known: dict[Var, int] | None = None) -> dict[Var, int]:
        """The size variables, after every check of the arguments (`known`: sizes passed as arguments)."""
        sizes = bind_args(self.program, arrays, known_sizes(self.program, known))
        for pre in self.preconditions:
            pre.check(sizes)
        for buf, a in zip(self.program.args, arrays):
            if buf in self.written and not a.flags.writeable:
                raise ArgumentError(
                    f"argument {buf.name!r} is written by program {self.program.name!r} but is read-only")
        return sizes

    def _overlap_pairs(self) -> tuple[tuple[int, int], ...]:
        """The argument pairs `check` refuses to overlap in memory (none here)."""
        return ()

    def __call__(self, *args: Any) -> None:
        if self.size_args or self._scalars:
            arrays, known = self.split_call(args)
        else:
            arrays, known = args, None
        self._call(arrays, known)

    def _call(self, arrays: tuple[Any, ...], known: dict[Var, int] | None) -> None:
        sig = _host_signature(arrays) if self.fast_path and self._plannable else None
        if sig is not None and known:
            sig = (*sig, tuple(known.items()))
        if sig is not None:
            plan = self._plans.get(sig)
            if plan is not None:
                ptrs = [a.ctypes.data for a in arrays]
                # C-contiguous (the signature says so): memory bounds are [data, data + nbytes), exactly
                # what np.may_share_memory compares
                if not any(ptrs[i] < ptrs[j] + nj and ptrs[j] < ptrs[i] + ni for i, ni, j, nj in plan.pairs):
                    if self.specializer is not None:
                        self._last_call = plan.last_call
                    plan.module._run_planned(arrays, ptrs, plan)
                    return
        sizes = self.check(arrays, known)
        mod = self._select(sizes)
        if mod is not self:
            if mod.specializer is not None:
                mod._call(arrays, known)
                return
            sizes = mod.check(arrays, known)  # what mod(*arrays) does (the variant checks its own program), keeping
            # the variant's sizes for the plan
        mod._run(arrays, sizes)
        if sig is not None and mod._plannable:
            pairs = sorted(set(self._overlap_pairs()) | set(mod._overlap_pairs()))
            plan = _HostPlan(mod, dict(sizes), self._last_call if self.specializer is not None else None,
                             tuple((i, arrays[i].nbytes, j, arrays[j].nbytes) for i, j in pairs
                                   if arrays[i].size and arrays[j].size), mod._plan_run(sizes))
            if len(self._plans) >= MAX_PLANS:
                try:
                    self._plans.pop(next(iter(self._plans), None), None)
                except RuntimeError:  # another thread changed the dict meanwhile: evict next time
                    pass
            self._plans[sig] = plan

    def _plan_run(self, sizes: dict[Var, int]) -> Any:
        return None

    def _run_planned(self, arrays: tuple[Any, ...], ptrs: list[int], plan: _HostPlan) -> None:
        self._run(arrays, plan.sizes)

    def _run(self, arrays: tuple[Any, ...], sizes: dict[Var, int]) -> None:
        raise NotImplementedError

    def __repr__(self) -> str:
        args = ", ".join(f"{b.name}: {b.dtype}" for b in self.program.args)
        return f"<{type(self).__name__} {self.program.name}({args}) target={self.target} kernels={self.kernels}>"


def known_sizes(program: Program, known: dict[Var, int] | None) -> dict[Var, int] | None:
    """Sizes passed as arguments, as `program`'s own size variables: a specialized variant's program is a
    substituted copy (its variables are its own, matched by name; one it pinned to a constant is dropped)."""
    if not known:
        return known
    own = {v.name: v for v in program.params}
    return {own[v.name]: x for v, x in known.items() if v.name in own}


def _scalar_array(buf: Buffer, value: Any) -> np.ndarray:
    """A number passed for the scalar argument `buf` (a 0-d buffer), as the 0-d array the program reads."""
    dt = buf.dtype
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ArgumentTypeError(f"scalar argument {buf.name!r} ({dt}) must be a number, got "
                                f"{type(value).__name__} {value!r}")
    if is_float(dt):
        if dt == "bfloat16":
            return np.array(to_bfloat16(np.float64(value)), np.uint16)  # its bits, rounded once
        return np.array(value, np_dtype(dt))
    if isinstance(value, (float, np.floating)):
        raise ArgumentTypeError(f"scalar argument {buf.name!r} is {dt}, got the float {value!r}; pass an int")
    lo, hi = INT_RANGE[dt]
    if not lo <= int(value) <= hi:
        raise ArgumentError(f"scalar argument {buf.name!r} ({dt}) cannot hold {int(value)} (range [{lo}, {hi}])")
    return np.array(int(value), np_dtype(dt))


INT64_MAX = 2**63 - 1


class CpuModule(Module):
    """A program JIT-compiled for this CPU. `threads` (default: the CPUs this process may use)
    run the top-level parallel loops; `threads=1` runs everything on the calling thread."""

    target = "cpu"
    _plannable = True

    def __init__(self, program: Program, kernel: Any, threads: int | None = None) -> None:
        super().__init__(program, kernel.gen.source, kernel.kernels)
        self.kernel = kernel
        self.size_vars = size_vars(program)  # positionally equal to kernel.gen.sizes (same structure)
        self.threads = default_threads() if threads is None else max(int(threads), 1)
        # temporaries are per thread: two threads calling one module must not share them
        self._local = threading.local()

    def _overlap_pairs(self) -> tuple[tuple[int, int], ...]:
        args = self.program.args
        return tuple((i, j) for i in range(len(args)) for j in range(i + 1, len(args))
                     if args[i] in self.written or args[j] in self.written)

    def check(self, arrays: tuple[Any, ...], known: dict[Var, int] | None = None) -> dict[Var, int]:
        sizes = super().check(arrays, known)
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

    def _temps_key(self, sizes: dict[Var, int]) -> tuple[int, ...]:
        return tuple(x for t in self.program.temps for s in [tuple(max(d, 0) for d in size_of(t.shape, sizes))]
                     for x in (len(s), *s))

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
        self._local.temps = (key, arrs, [a.ctypes.data for a in arrs])
        return arrs

    def _run(self, arrays: tuple[Any, ...], sizes: dict[Var, int]) -> None:
        svals = self._size_values(sizes)
        temps = self.temps(sizes)
        ptrs = [a.ctypes.data for a in arrays] + [t.ctypes.data for t in temps]
        self.kernel.run(ptrs, svals, self.threads)

    def _plan_run(self, sizes: dict[Var, int]) -> Any:
        return self._size_values(sizes), self._temps_key(sizes)

    def _run_planned(self, arrays: tuple[Any, ...], ptrs: list[int], plan: _HostPlan) -> None:
        svals, tkey = plan.run
        cached = getattr(self._local, "temps", None)  # per thread, the last sizes' (as in temps())
        if cached is None or cached[0] != tkey:
            self.temps(plan.sizes)
            cached = self._local.temps
        self.kernel.run(ptrs + cached[2], svals, self.threads)

    @property
    def optimized_ir(self) -> str:
        return self.kernel.optimized_ir()
