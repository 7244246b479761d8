"""The reference interpreter: executes any loop-IR program on numpy arrays, exactly and slowly.

Every other target is tested against it, so it follows the IR to the letter:

- Each program is compiled once to Python source (cached per program object) and exec'd;
  loops become `for` loops over `range`, every kind alike (parallel, unrolled, vectorized and
  GPU-bound loops run serially in order; `Barrier` does nothing), so a program whose
  correctness depends on threads running concurrently is outside what this mode can check;
  `run(..., gpu_order="reversed" | "forward" | seed)` runs it as the CUDA target maps it
  instead, the threads of each block interleaved adversarially (`loopir.interp_gpu`).
- A Store first evaluates `iters[k] = coords[k]`, then its indices and value.
- Arithmetic happens on numpy scalars of the expression's dtype: float32 stays float32
  (numpy scalar arithmetic does not widen), float16 operations are done by numpy's float16
  scalar loops (each operation rounded to float16). Index arithmetic on loop variables and
  sizes uses Python ints. Integer `//` and `%` floor (Python semantics, as the IR defines).
  `max`/`min` of floats propagate NaN (numpy.maximum/minimum); `erf` is math.erf in double,
  rounded to the dtype; `sigmoid(x) = 1 / (1 + exp(-x))`, `rsqrt(x) = 1 / sqrt(x)` in the dtype.
  bfloat16 (numpy has none) is held as float32 scalars, as the compiled targets compute it: a load
  widens the buffer's uint16 bits (`loopir.dtypes.from_bfloat16`), arithmetic is float32, a cast to
  bfloat16 and a store round to nearest even (`to_bfloat16`).
  Small integers (int8, uint8, int16, uint16) are numpy scalars of their dtype, so each operation
  wraps as numpy's does (and as the targets narrow it); a cast to one goes through int64 (`astype`).
  A scalar argument (`te.var(name, "float32")`) is a 0-d array argument.
  `where(c, a, b)` and `and`/`or` evaluate only the branch taken, as C does.
- Every load and store is bounds-checked: an index outside `[0, dim)` raises IndexError
  naming the buffer (numpy's wrap-around of negative indices never happens).
- Temporaries (`Program.temps`) and `Allocate` buffers are fresh arrays filled with NaN
  (integers: the most negative value), so reading what was never written shows.
- `trace`, when a list, receives `(statement name, tuple of iteration values)` for every
  executed statement instance, in execution order.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from .errors import ArgumentError, ArgumentTypeError
from . import interp_gpu_run
from .args import bind_args, size_of
from .interp_compile import _alloc, compiled, source
from .nodes import Program, Var


def run(
    program: Program,
    *arrays: np.ndarray,
    trace: list | None = None,
    sizes: Mapping[Var | str, int] | None = None,
    gpu_order: str | int | None = None,
) -> None:
    """Execute `program` on `arrays` (in `program.args` order), writing them in place.

    Sizes are inferred from the arrays' shapes (`loopir.args.bind_args`); `sizes` gives those
    no argument determines. `trace`, when a list, gets `(stmt_name, iters)` per executed
    statement instance, in order. A `Schedule` (anything with a `.program`) is accepted too.

    `gpu_order`: None runs every loop serially in order (GPU-bound loops too). "reversed",
    "forward" or an int seed runs the program as the CUDA target maps it (one launch per top-level
    statement, every thread of a block running the kernel body, shared buffers per block, barriers
    and cross-thread reductions as meeting points), with the threads of each block interleaved
    adversarially: "reversed" runs them in reverse order between barriers ("forward" in order), a
    seed picks a random thread at every statement. A missing barrier then shows as a wrong result,
    barriers that not every thread reaches as `interp_gpu.BarrierDivergenceError` (see
    `loopir.interp_gpu`)."""
    if not isinstance(program, Program) and isinstance(getattr(program, "program", None), Program):
        program = program.program
    if not isinstance(program, Program):
        raise ArgumentTypeError(f"interp.run needs a loopir Program, got {type(program).__name__}")
    env = bind_args(program, arrays, sizes)
    if gpu_order is not None:
        temps = [_alloc(size_of(t.shape, env), t.dtype) for t in program.temps]
        interp_gpu_run.run(program, list(arrays) + temps, env, gpu_order, trace)
        return
    c = compiled(program, trace is not None)
    missing = [v.name for v in c.size_vars if v not in env]
    if missing:
        raise ArgumentError(
            f"program {program.name!r} uses variable(s) {', '.join(repr(m) for m in missing)} that are neither "
            "loop variables around their use nor sizes of its arguments (pass sizes={...} for free sizes)"
        )
    bufs = list(arrays) + [_alloc(size_of(t.shape, env), t.dtype) for t in program.temps]
    with np.errstate(all="ignore"):
        c.fn(bufs, [env[v] for v in c.size_vars], trace)


__all__ = ["run", "source", "compiled"]
