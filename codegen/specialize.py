"""Call-time shape specialization: a module built with symbolic sizes dispatches each call to a variant
compiled for a small key of the call's sizes.

    mod = build([y], [x, y], target="cuda")     # n = te.var("n"): the generic kernel is compiled now
    mod(x, y)                                    # n = 4096: key "n%16, int32" -> variant compiled, cached
    mod.specializations                          # ['n%16 int32']
    print(mod.explain())                         # which key the last call took and why

The key, per size variable (in the order the arguments' shapes name them): `1` when it is 1 (the variant
substitutes the constant), `%16` when 16 divides it (n -> 16*n16 with a fresh size variable, so the
scheduler proves 4-wide vector lanes and tiles exact), `%8` (8 halves: one 16-byte access) and `%4`
likewise, `*` otherwise;
on CUDA whether every buffer's padded reach (launch.padded_reach: its flat index with every index SLACK past
its dimension's end) stays below 2**31 at these sizes (the variant is lowered with `Assume(index_int32=True)`:
32-bit index arithmetic);
and for each size a row length depends on (the bounds of a reduction) a coarse class, <= 127, 2**10, 2**12, 2**13,
2**14, 2**16 or larger, whose upper bound is handed to `auto_schedule(sizes=..., bounds=...)`: the cost model
plans at it, and the variant's program assumes it (`Schedule.assume`, checked at each call: a plan for rows <= S
runs only rows <= S), so that a row's chunk loops get constant trip counts (register rows). A key that asks for
nothing is the generic module itself.

A variant is built on first use (under a lock: two threads never build one key twice) and kept in
memory; the build cache (codegen/build_cache.py) stores each variant as a sub-entry, so a later process
loads it instead of scheduling and compiling it again. A variant that cannot be built falls
back to the generic module (always correct), and `explain()` says why. A hand-made schedule (Program,
Schedule) is not rescheduled: the key's sizes are substituted in its scheduled program
(`loopir.subst.substitute_program_sizes`), with no row classes (nothing plans rows again).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from loopir.args import eval_expr
from loopir.errors import LoopirError
from loopir.names import fresh as fresh_name
from loopir.nodes import Buffer, Program, Var, binary, const
from loopir.visit import free_vars

from .passes.launch import padded_reach

# upper bounds of the row-length classes; above the last: unbounded. A class is planned at its bound, which the
# variant also assumes (every call of it meets it, checked), so its chunk loops get the bound's constant trip counts
# (register rows up to rows.REGISTER_ROW_MAX, warp rows). The classes are powers of two and three times powers of
# two (768, 1536, 3072, ...: hidden sizes and MLP widths), so that a row is planned at most 1.5x its length: at 2x
# (the classes 2**10 < n <= 2**12 before) a row of 3000 half-precision elements took 32 registers of row per thread
# where its fixed-size kernel took 24 (ptxas 59-64 registers against 44-48, __launch_bounds__(128, 8)), and the
# kernel 1.11-1.15x the fixed size's time (H200, 4096 x 3000 float16 softmax / layer norm), and a row of 64 was
# planned as one of 127 without 16-byte loads (1.7x). 127: rows shorter than a block of 128 threads, which the
# planner maps as warp rows (schedules/rows.py); 128 apart (a head dimension), planned as itself
ROW_CLASSES = (16, 32, 64, 96, 127, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288,
               16384, 32768, 2**16)
# upper bounds of the classes of a matmul's rows (the rows of C) at symbolic sizes: up to schedules.recipes.SKINNY_ROWS
# the planner maps a skinny GEMM (tiles that cover every row, split-K), planned at the class's bound; above the last:
# the square tiles
SKINNY_CLASSES = (4, 8, 16, 32, 64)
_DIV_WHY = {"1": "is 1 -> scheduled with the constant 1 (loops over it vanish)",
            "%16": "divisible by 16 -> scheduled with {v} = 16*{v}16 (vector lanes along it provably whole)",
            "%8": "divisible by 8, not 16 -> scheduled with {v} = 8*{v}8 (16-byte half lanes along it provably whole)",
            "%4": "divisible by 4, not 8 -> scheduled with {v} = 4*{v}4 (float4 lanes along it provably whole)",
            "*": "not divisible by 4 -> generic (guarded) code for {v}"}


@dataclass(frozen=True, slots=True)
class Key:
    """What a variant may rely on. `div` per size variable ("1", "%16", "%8", "%4", "*"), `int32` (CUDA: every
    buffer's padded reach below 2**31), `rows` per row-length size variable its class's upper
    bound (0: unbounded)."""

    names: tuple[str, ...]
    div: tuple[str, ...]
    int32: bool
    rows: tuple[tuple[str, int], ...]

    @property
    def generic(self) -> bool:
        """The generic module already is this variant: nothing to substitute or assume."""
        return all(d == "*" for d in self.div) and not self.int32 and not any(b for _, b in self.rows)

    def __str__(self) -> str:
        parts = [f"{n}{'=1' if d == '1' else d}" for n, d in zip(self.names, self.div)]
        if self.int32:
            parts.append("int32")
        parts += [f"{n}<={b}" for n, b in self.rows if b]
        return " ".join(parts)


def div_class(value: int) -> str:
    if value == 1:
        return "1"
    if value > 0 and value % 16 == 0:
        return "%16"
    if value > 0 and value % 8 == 0:  # 8 halves make one 16-byte access
        return "%8"
    if value > 0 and value % 4 == 0:
        return "%4"
    return "*"


def row_class(value: int) -> int:
    """The upper bound of the row-length class of `value` (0: larger than every class)."""
    return next((b for b in ROW_CLASSES if value <= b), 0)


def skinny_class(value: int) -> int:
    """The upper bound of the matmul-rows class of `value` (0: more rows than every class)."""
    return next((b for b in SKINNY_CLASSES if value <= b), 0)


def fits_int32_at(buffers: Sequence[Buffer], sizes: dict[Var, int]) -> bool:
    """Every buffer's padded reach (launch.padded_reach) at `sizes` stays below 2**31."""
    return _shapes_fit_int32([b.shape for b in buffers], sizes)


def _shapes_fit_int32(shapes: Sequence[tuple[Any, ...]], sizes: dict[Var, int]) -> bool:
    for shape in shapes:
        try:
            # a plain size variable's value is read directly (eval_expr would give the same)
            dims = [int(sizes[d]) if type(d) is Var and d in sizes else int(eval_expr(d, sizes)) for d in shape]
        except (ValueError, KeyError, TypeError, ZeroDivisionError):
            return False
        if padded_reach(dims) >= 2**31:
            return False
    return True


def size_vars_of(program: Program) -> list[Var]:
    """The size variables of the program's arguments, in the order their shapes name them."""
    out: list[Var] = []
    for b in program.args:
        for d in b.shape:
            for v in sorted(free_vars(d), key=lambda v: v.name):
                if v not in out:
                    out.append(v)
    return out


Make = Callable[[Key], Any]  # a key -> its compiled Module


class Specializer:
    """The dispatch of one generic module: the key of a call's sizes and the variants built so far.

    `vars`: the size variables keyed (divisibility); `rows`: those a row length depends on; `buffers`:
    the buffers whose element counts decide `int32` (an empty tuple: the target has no index width to
    choose); `make(key)` compiles a variant; `divisibility=False` keys only the index width (a hand
    schedule, which is not rescheduled)."""

    def __init__(self, generic: Any, vars: Sequence[Var], rows: Sequence[Var], buffers: Sequence[Buffer],
                 make: Make, int32: bool, divisibility: bool = True, generic_int32: bool = False,
                 skinny: Sequence[Var] = (), batch_rows: Sequence[tuple[Var, tuple[Any, ...]]] = ()) -> None:
        self.generic = generic
        self.generic_int32 = generic_int32  # the generic module assumes 32-bit indices (codegen.build)
        self.vars = tuple(vars)
        self.rows = tuple(v for v in rows if v in self.vars) if divisibility else ()
        # the rows of a matmul's C (not a row length): classed by SKINNY_CLASSES, each size once (two matmuls of
        # an MLP share their rows T)
        self.skinny = tuple(v for v in self.vars if any(v is x for x in skinny) and v not in self.rows) \
            if divisibility else ()
        # a linear layer's batch sizes (X[b, t, k] @ W[k, j]), each with the layer's row extents: classed by
        # SKINNY_CLASSES while all batches' rows are few (a decode step's B x 1: one skinny GEMM over them), else 0
        batch: dict[Var, tuple[Any, ...]] = {}
        for v, d in batch_rows if divisibility else ():
            if v in self.vars and v not in self.rows and v not in self.skinny:
                batch.setdefault(v, tuple(d))  # each size once (the layers of an MLP share B)
        self.batch_rows = tuple(batch.items())
        self.buffers = tuple(buffers)
        self.make = make
        self.int32 = int32
        self.divisibility = divisibility
        self._names = tuple(v.name for v in self.vars)
        self._shapes = tuple(dict.fromkeys(b.shape for b in self.buffers))  # buffers of one shape: one test
        self.variants: dict[Key, Any] = {}
        self.failed: dict[Key, str] = {}
        self._lock = threading.Lock()

    def key(self, sizes: dict[Var, int]) -> Key:
        """The key of a call with these sizes (cheap: no allocation, no compilation)."""
        names = self._names
        div = tuple(div_class(int(sizes[v])) if self.divisibility and v in sizes else "*" for v in self.vars)
        i32 = self.int32 and _shapes_fit_int32(self._shapes, sizes)
        rows = tuple((v.name, row_class(int(sizes[v])) if v in sizes else 0) for v in self.rows)
        rows += tuple((v.name, skinny_class(int(sizes[v])) if v in sizes else 0) for v in self.skinny)
        rows += tuple((v.name, _batch_class(v, dims, sizes)) for v, dims in self.batch_rows)
        return Key(names, div, i32, rows)

    def select(self, sizes: dict[Var, int]) -> tuple[Any, Key]:
        """The module for a call with these sizes (built on first use) and its key."""
        key = self.key(sizes)
        if self.runs_generic(key):
            return self.generic, key
        mod = self.variants.get(key)
        if mod is not None:
            return mod, key
        with self._lock:
            mod = self.variants.get(key)
            if mod is None:
                if key in self.failed:
                    return self.generic, key
                try:
                    mod = self.make(key)
                except (LoopirError, ValueError, TypeError) as e:  # the generic module is right for every key
                    if self.generic_int32 and not key.int32:  # but a 32-bit one not for these sizes
                        raise
                    self.failed[key] = f"{type(e).__name__}: {e}"
                    return self.generic, key
                self.variants[key] = mod
        return mod, key

    def explain(self, key: Key, sizes: dict[Var, int]) -> list[str]:
        """Why a call with `sizes` took `key`, one line per decision."""
        lines = [f"specialization {str(key) or '(generic)'}:"]
        for v, d in zip(self.vars, key.div):
            if v in sizes and self.divisibility:
                lines.append(f"  {v.name}={sizes[v]}: {_DIV_WHY[d].format(v=v.name)}")
        if self.buffers:
            lines.append("  every buffer < 2^31 elements (padded) -> 32-bit indices" if key.int32 else
                         "  some buffer reaches 2^31 elements (padded) -> 64-bit indices" if self.int32 else
                         "  64-bit indices")
        for name, b in key.rows:
            v = next(x for x in self.vars if x.name == name)
            if any(v is x for x, _ in self.batch_rows):
                lines.append(f"  {name}={sizes.get(v)}: a linear layer's batches, {b} at most, all their rows few "
                             f"-> one skinny GEMM over them, planned at {name}={b}, which the variant assumes (checked "
                             "at each call)" if b else f"  {name}={sizes.get(v)}: a linear layer's batches, with more "
                             f"than {SKINNY_CLASSES[-1]} rows in all (or unknown) -> planned for any count")
                continue
            if v in self.skinny:
                lines.append(f"  {name}={sizes.get(v)}: matmul rows <= {b} -> planned as a skinny GEMM at {name}={b}, "
                             "which the variant assumes (checked at each call)" if b else
                             f"  {name}={sizes.get(v)}: matmul rows > {SKINNY_CLASSES[-1]} -> the square tiles")
                continue
            lines.append(f"  {name}={sizes.get(v)}: row length <= {b} -> planned with {name}={b}, which the variant "
                         "assumes (checked at each call)" if b else
                         f"  {name}={sizes.get(v)}: row length > {ROW_CLASSES[-1]} -> planned for any length")
        if key in self.failed:
            lines.append(f"  variant could not be built ({self.failed[key]}); ran the generic module")
        elif self.runs_generic(key):
            lines.append("  nothing to specialize: ran the generic module")
        return lines

    def runs_generic(self, key: Key) -> bool:
        """The generic module is the variant of `key` (one assuming 32-bit indices: of the keys with int32)."""
        return (all(d == "*" for d in key.div) and key.int32 == self.generic_int32
                and not any(b for _, b in key.rows))

    @property
    def specializations(self) -> list[str]:
        return [str(k) for k in self.variants]


def _batch_class(v: Var, dims: tuple[Any, ...], sizes: dict[Var, int]) -> int:
    """The class of a linear layer's batch size `v`: its SKINNY_CLASSES bound while the layer's rows (the product of
    `dims` at these sizes) are at most the last class, else 0 (a size not bound: 0)."""
    if v not in sizes:
        return 0
    try:
        total = math.prod(int(eval_expr(d, sizes)) for d in dims)
    except (KeyError, ValueError, TypeError):
        return 0
    return skinny_class(int(sizes[v])) if total <= SKINNY_CLASSES[-1] else 0


def substitution(key: Key, vars: Sequence[Var]) -> tuple[dict[Var, Any], dict[Var, int]]:
    """The size substitution of a key ({old var: 1 | k*fresh var}) and the sizes hint for the planner
    ({var of the variant: the row class's upper bound})."""
    sub: dict[Var, Any] = {}
    hint: dict[Var, int] = {}
    bounds = dict(key.rows)
    # the variant's new size n16 must not take the name of another size (the user's own `n16`): sizes are
    # bound by name, and lowering refuses two of one name. Tensors and loops may share it (codegen.names).
    taken = {v.name for v in vars}
    for v, d in zip(vars, key.div):
        b = bounds.get(v.name, 0)
        if d == "1":
            sub[v] = 1
        elif d in ("%16", "%8", "%4"):
            k = int(d[1:])
            fresh = Var(fresh_name(f"{v.name}{k}", taken), v.dtype)
            sub[v] = binary("mul", const(k), fresh)
            if b:
                hint[fresh] = b // k
        elif b:
            hint[v] = b
    return sub, hint


__all__ = ["Key", "Specializer", "ROW_CLASSES", "SKINNY_CLASSES", "div_class", "row_class", "skinny_class",
           "fits_int32_at", "size_vars_of", "substitution"]
