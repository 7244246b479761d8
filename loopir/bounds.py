"""Memory safety of a program, proven with isl for all sizes: bounds and initialised reads.

For every load and store `S[iters] -> B[idx(iters)]`, with `D_S` the statement's domain (its
instances in the current nest) and `C` the size constraints (every dimension of every argument
is >= 0: arrays cannot have negative extents), the access is

* **proven** when `{ S[iters] in D_S : some idx_k < 0 or idx_k >= shape_k } ∩ C` is empty — for
  every value of the sizes, so no runtime check is needed;
* **disproved** otherwise: a `BoundsWitness` names the statement instance, the index, the
  buffer's extent and the sizes at which it happens (small sizes are preferred);
* **unknown** when the index (or the extent) is not affine (an indirect `x[idx[i]]`, `i * j`):
  isl cannot decide it, and the caller must guard it (`codegen.passes.bounds` does, and says so).

A disproved access on a statement whose domain is over-approximated (non-affine loop bounds,
guards or coords) may be spurious: it is reported as unknown, never as a witness. A load under a
`Select` carries the select's condition (the renderers evaluate only the taken branch).

Reads of a temporary (a program temp or a scratch buffer, per allocation instance) must have a
write of the same element earlier in the schedule; a read without one is reported the same way
(`kind == "uninitialized"`), with the instance and the element.

The model is over *loop space*: a statement instance is `s[loops..., iters...]` with the iteration
variables tied to the loops by equalities, so no isl text has existential quantifiers (parsing and
deciding those cost milliseconds each). Two isl-free sufficient tests run first and decide the
common cases: an index whose interval over the loop box is inside the buffer with every size
cancelling (`_interval_proven`), and a temporary read at the index an earlier statement under the
same loops wrote (`_written_before`). benchmarks/bounds_cost.py measures what is left.

    check_bounds(program)        -> BoundsWitness | None     (cheap: at most one isl parse and emptiness test)
    check_initialized(program)   -> BoundsWitness | None
    analyse(program)             -> BoundsReport             (both, plus the unknown accesses and notes)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import islpy as isl

from .isl_conv import NonAffine, _Names, aff, cond, params_text
from .affine import mixed_radix, wrapped_digits
from .nodes import Allocate, Buffer, Expr, Load, Program, Select, Store, Var, binary
from .poly_model import StmtInfo, _program_params, stmt_infos
from .visit import _child_fields, subst_coords, substitute, walk, walk_stmts
from .poly import _small_point
from .args import _affine, eval_expr
from .nodes import For, If

__all__ = ["BoundsError", "BoundsWitness", "Access", "BoundsReport", "SizePrecondition", "check_bounds",
           "check_initialized", "analyse", "LARGE"]

# Sizes from which on every program we accept is proven in bounds: an access that leaves its buffer only
# when some size is below this (an empty or tiny array the program's author did not mean) is checked at
# each call instead of refused at build (PolyBench's fdtd-2d writes ey[0, j], out of bounds only at nx = 0).
LARGE = 64


class BoundsError(ValueError):
    """A load or store that leaves its buffer (or a read of a temporary nothing wrote), with a witness."""

    def __init__(self, witness: BoundsWitness, where: str = "build") -> None:
        self.witness = witness
        super().__init__(f"{where}: {witness}")


@dataclass(frozen=True)
class BoundsWitness:
    """One statement instance that accesses `buffer` outside `extent` (kind "out_of_bounds") or
    reads an element of a temporary that nothing wrote before (kind "uninitialized").

    `instance` maps the statement's iteration variables to values, `index` is the element,
    `extent` the buffer's shape, `params` the sizes at which it happens (all by name)."""

    kind: str
    statement: str
    instance: dict[str, int]
    buffer: str
    access: str  # "reads" | "writes"
    index: tuple[int, ...]
    extent: tuple[int, ...]
    params: dict[str, int] = field(default_factory=dict)

    def instance_str(self) -> str:
        return f"{self.statement}[{', '.join(f'{k}={v}' for k, v in self.instance.items())}]"

    def __str__(self) -> str:
        at = f" at {', '.join(f'{k}={v}' for k, v in self.params.items())}" if self.params else ""
        idx = ", ".join(map(str, self.index))
        ext = ", ".join(map(str, self.extent))
        if self.kind == "uninitialized":
            return (f"statement {self.statement} reads temporary {self.buffer!r} before anything writes it: "
                    f"instance {self.instance_str()} reads {self.buffer}[{idx}]{at}, and no statement writes "
                    "that element earlier (write it first, or pass the buffer as an argument)")
        return (f"statement {self.statement} {self.access} {self.buffer!r} out of bounds: instance "
                f"{self.instance_str()} {self.access.rstrip('s')}s {self.buffer}[{idx}], but {self.buffer!r} has "
                f"extent ({ext}){at}")


@dataclass(frozen=True)
class Access:
    """One load or store of a statement (`indices` in the statement's iteration variables)."""

    statement: str
    buffer: Buffer
    indices: tuple[Expr, ...]
    access: str  # "reads" | "writes"
    store: Store
    conds: tuple[Expr, ...] = ()  # the Select conditions under which a load runs
    reason: str = "the index is not affine"  # why isl could not decide it


@dataclass(frozen=True)
class SizePrecondition:
    """The sizes at which some access would leave its buffer — only small ones (some size below LARGE).
    `violating` is an isl set of sizes, `names` maps its parameters to the size variables, `example` is
    a witness at one such size. `check(sizes)` raises BoundsError at those sizes (called by the modules)."""

    violating: str
    names: tuple[tuple[str, Var], ...]
    example: BoundsWitness

    def describe(self) -> str:
        text = self.violating.split("->", 1)[-1].strip().strip("{} :").strip() or "always"
        return (f"statement {self.example.statement} {self.example.access} {self.example.buffer!r} out of bounds "
                f"when {text} (e.g. {self.example.instance_str()} at "
                f"{', '.join(f'{k}={v}' for k, v in self.example.params.items())}); checked at each call")

    def check(self, sizes: dict[Var, int]) -> None:
        key = tuple(int(sizes.get(v, 0)) for _, v in self.names)
        ok = _PRE_MEMO.get((self.violating, key))
        if ok is None:
            fix = " and ".join(f"{n} = {x}" for (n, _), x in zip(self.names, key)) or "1 = 1"
            point = isl.Set(f"[{', '.join(n for n, _ in self.names)}] -> {{ : {fix} }}")
            ok = isl.Set(self.violating).intersect_params(point).is_empty()
            if len(_PRE_MEMO) > 4096:
                _PRE_MEMO.clear()
            _PRE_MEMO[(self.violating, key)] = ok
        if not ok:
            at = ", ".join(f"{v.name}={x}" for (_, v), x in zip(self.names, key))
            raise BoundsError(self.example, where=f"call at {at}: the build proved these sizes leave a buffer "
                                                   f"({self.describe()}); for example")


_PRE_MEMO: dict[tuple[str, tuple[int, ...]], bool] = {}


@dataclass
class BoundsReport:
    """What `analyse` found: `witness` (a disproved access or an uninitialised read, or None),
    `unknown` (accesses isl could not decide; the caller guards them), `notes` (sentences)."""

    witness: BoundsWitness | None
    unknown: list[Access]
    notes: list[str]
    precondition: SizePrecondition | None = None


# ----------------------------------------------------------------------------- the model


def _accesses(st: Store) -> list[tuple[Buffer, tuple[Expr, ...], str, tuple[Expr, ...]]]:
    """(buffer, indices, "reads" | "writes", conditions) of every access of a statement: a load under a
    `Select` runs only when its branch is taken (the renderers branch), so it carries that condition.
    Iterative: expressions may be deeper than Python's recursion limit."""
    out: list[tuple[Buffer, tuple[Expr, ...], str, tuple[Expr, ...]]] = []
    stack: list[tuple[Expr, tuple[Expr, ...]]] = [(i, ()) for i in reversed(st.indices)]
    stack.append((st.value, ()))
    while stack:
        e, conds = stack.pop()
        if isinstance(e, Select):
            stack += [(e.b, conds + (~e.cond,)), (e.a, conds + (e.cond,)), (e.cond, conds)]
            continue
        if isinstance(e, Load):
            out.append((e.buffer, e.indices, "reads", conds))
        for name in _child_fields(type(e)):
            v = getattr(e, name)
            for x in reversed(v) if isinstance(v, tuple) else (v,):
                if isinstance(x, Expr) and not isinstance(x, Var):
                    stack.append((x, conds))
    return out + [(st.buffer, st.indices, "writes", ())]


@dataclass
class _Stmt:
    """One statement occurrence in isl terms: `tup[l..., it...]` (its loop values, then its iteration
    variables, tied by equalities: no existentials, so isl parses and decides it quickly)."""

    info: StmtInfo
    tup: str
    dims: list[str]  # loop names, then iteration-variable names
    names: _Names  # binds loops and iteration variables
    cons: list[str]  # the domain: loop bounds, guards, it_k = coord_k(l)
    exact: bool
    loops_exact: bool  # the loop bounds and guards are affine (the coords may not be)
    lnames: _Names  # binds the loops alone


class _Model:
    """The program in isl text over loop space (see `_Stmt`), sizes as parameters."""

    def __init__(self, program: Program) -> None:
        self.program = program
        self.params: dict[str, Var] = _program_params(program)
        self.notes: list[str] = []
        self.stmts: list[_Stmt] = []
        self.bufnames: dict[Buffer, str] = {}
        for k, info in enumerate(stmt_infos(program)):
            self.stmts.append(self._stmt(k, info))

    def _stmt(self, k: int, info: StmtInfo) -> _Stmt:
        st = info.store
        lnames = _Names(self.params)  # bounds, guards and coords are written in the loops
        loops = [lnames.bind(lp.var, "l_" + lp.var.name) for lp in info.loops]
        names = _Names(self.params, set(loops))  # indices are written in the iteration variables
        its = [names.bind(v, "i_" + v.name) for v in st.iters]
        cons, exact = [], True
        for lp, v in zip(info.loops, loops):
            try:
                cons.append(f"({aff(lp.lo, lnames)}) <= {v} < ({aff(lp.hi, lnames)})")
            except NonAffine:
                exact = False
        for g in info.guards:
            try:
                cons.append(cond(g, lnames))
            except NonAffine:
                exact = False
        loops_exact = exact
        for v, c in zip(its, st.coords):
            try:
                cons.append(f"{v} = ({aff(c, lnames)})")
            except NonAffine:
                exact = False
        if not exact:
            self.notes.append(f"statement {st.name} has non-affine loop bounds, guards or coordinates; "
                              "its instances are over-approximated")
        return _Stmt(info, f"s{k}", loops + its, names, cons, exact, loops_exact, lnames)

    def prefix(self) -> str:
        return params_text(self.params)

    def bname(self, buf: Buffer) -> str:
        return self.bufnames.setdefault(buf, f"b{len(self.bufnames)}")

    def context(self) -> isl.Set:
        """The size constraints: every affine dimension of every argument is >= 0, and so is every size variable
        (a `te.var` size: a call refuses a negative one; T of a `T + 1`-row temporary is not -1)."""
        names = _Names(self.params)
        cons = [f"({aff(v, names)}) >= 0" for v in self.params.values()]
        for buf in self.program.args:
            for d in buf.shape:
                try:
                    cons.append(f"({aff(d, names)}) >= 0")
                except NonAffine:
                    pass
        return isl.Set(self.prefix() + "{ : " + (" and ".join(dict.fromkeys(cons)) or "1 = 1") + " }")

    def access(self, s: _Stmt, buf: Buffer, idx: tuple[Expr, ...], conds: tuple[Expr, ...]
               ) -> tuple[list[str], list[str], bool] | None:
        """(index texts, condition texts, exact) of one access, or None when the index is not affine."""
        try:
            ix = [aff(i, s.names) for i in idx]
        except NonAffine:
            return None
        cs, exact = [], True
        for c in conds:
            try:
                cs.append(cond(c, s.names))
            except NonAffine:  # dropped: over-approximates the instances that run the access
                exact = False
        return ix, cs, exact


def _lin(e: Expr) -> dict[Var | None, int] | None:

    return _affine(e, {})


def _over_loops(st: Store, e: Expr) -> dict[Var | None, int] | None:
    """An index of a statement as an affine form over the loops around it (and sizes), or None."""
    a = _lin(e)
    if a is None:
        return None
    flat: dict[Var | None, int] = {}
    for v, c in a.items():
        k = st.iters.index(v) if v in st.iters else -1
        sub = _lin(st.coords[k]) if k >= 0 else {v: 1}
        if sub is None:
            return None
        for w, x in sub.items():
            flat[w] = flat.get(w, 0) + c * x
    return {w: c for w, c in flat.items() if c}


def _written_before(users: list[_Stmt], s: _Stmt, buf: Buffer, idx: tuple[Expr, ...]) -> bool:
    """A cheap sufficient test (no isl) that the element is written before each instance of `s` reads it:
    an earlier statement under a prefix of the same loop nodes, its guards among those of `s`, in the same
    allocation, writes `buf` at the same index (as a function of those loops)."""
    want = [_over_loops(s.info.store, i) for i in idx]
    if any(w is None for w in want):
        return False
    site = s.info.alloc_of(buf)
    for w in users:
        if w is s:
            return False  # only statements textually before `s`
        wi = w.info
        if wi.store.buffer is not buf or len(wi.loops) > len(s.info.loops):
            continue
        if any(a is not b for a, b in zip(wi.loops, s.info.loops)) or not all(g in s.info.guards for g in wi.guards):
            continue
        ws = wi.alloc_of(buf)
        if (ws is None) != (site is None) or (ws is not None and site is not None and ws.ident != site.ident):
            continue
        if [_over_loops(wi.store, i) for i in wi.store.indices] == want:
            return True
    return False


def _interval_proven(info: StmtInfo, idx: tuple[Expr, ...], shape: tuple[Expr, ...]) -> bool:
    """A cheap sufficient test (no isl) for the common case: with each loop in a box [lo, hi) whose
    bounds use sizes only, the index's minimum is a constant >= 0 and shape - 1 - its maximum a
    constant >= 0 (every size cancels). Guards are ignored: that only widens the box, so True is a proof."""
    st = info.store
    loops = {lp.var: lp for lp in info.loops}
    coords = {}
    for v, c in zip(st.iters, st.coords):
        a = _lin(c)
        if a is None:
            return False
        coords[v] = a
    for i, d in zip(idx, shape):
        a, ext = _lin(i), _lin(d)
        if a is None or ext is None:
            return False
        flat: dict[Var | None, int] = {}  # the index over loops and sizes
        for v, c in a.items():
            for w, k in (coords[v].items() if v in coords else ((v, 1),)):
                flat[w] = flat.get(w, 0) + c * k
        lo: dict[Var | None, int] = {}
        hi: dict[Var | None, int] = {}
        for v, c in flat.items():
            if c == 0:
                continue
            lp = loops.get(v) if v is not None else None
            if lp is None:  # a size or the constant: the same in both bounds
                lo[v] = lo.get(v, 0) + c
                hi[v] = hi.get(v, 0) + c
                continue
            b_lo, b_hi = _lin(lp.lo), _lin(lp.hi)
            if b_lo is None or b_hi is None or any(w in loops for w in (*b_lo, *b_hi) if w is not None):
                return False
            b_hi = {**b_hi, None: b_hi.get(None, 0) - 1}  # the last iteration
            for w, k in (b_lo if c > 0 else b_hi).items():
                lo[w] = lo.get(w, 0) + c * k
            for w, k in (b_hi if c > 0 else b_lo).items():
                hi[w] = hi.get(w, 0) + c * k
        # in bounds iff min >= 0 and max <= extent - 1, here with every size cancelling
        slack = {w: ext.get(w, 0) - hi.get(w, 0) for w in set(ext) | set(hi)}
        slack[None] = slack.get(None, 0) - 1
        if any(k for w, k in lo.items() if w is not None) or lo.get(None, 0) < 0:
            return False
        if any(k for w, k in slack.items() if w is not None) or slack.get(None, 0) < 0:
            return False
    return True


def _fresh(name: str, taken: list[str]) -> str:
    while name in taken:
        name += "_"
    return name


def _model(program: Program) -> tuple[_Model, list[tuple[_Stmt, Buffer, tuple[Expr, ...], str, tuple[Expr, ...],
                                                       bool]], list[Access], str]:
    """The model, the decided accesses (tuple a{k} of the violation set), the unknown ones, and the
    violation set's text: `a{k}[l, it, e] : domain and e = index and conditions and e outside the shape`."""
    m = _Model(program)
    parts: list[str] = []
    decided: list[tuple[_Stmt, Buffer, tuple[Expr, ...], str, tuple[Expr, ...], bool]] = []
    unknown: list[Access] = []
    for s in m.stmts:
        st = s.info.store
        seen: set[tuple] = set()
        for buf, idx, what, conds in _accesses(st):
            key = (id(buf), idx, what, conds)
            if key in seen:
                continue
            seen.add(key)
            if _interval_proven(s.info, idx, buf.shape):
                continue
            at = _in_loops(s, idx)  # a collapsed statement's indices in its loops
            if at is not None and wrapped_digits(buf.shape, at):
                continue  # a bias b[f % n]: in bounds whatever f
            digits = _digits_access(s, buf, at, _in_loops(s, conds)) if at is not None else None
            if digits is not None:
                es = [_fresh("e0", s.dims + list(m.params))]
                body = s.cons + [f"{es[0]} = ({digits[0]})"] + digits[2]
                parts.append(f"a{len(decided)}[{', '.join(s.dims + es)}] : {' and '.join(body)} and "
                             f"({es[0]} < 0 or {es[0]} >= ({digits[1]}))")
                decided.append((s, buf, idx, what, conds, False))  # a violation found is guarded, not refused
                continue
            acc = m.access(s, buf, idx, conds)
            try:
                ext = [aff(d, s.names) for d in buf.shape]
            except NonAffine:
                acc = None
            if acc is None:
                unknown.append(Access(st.name, buf, idx, what, st, conds))
                continue
            ix, cs, exact = acc
            es = [_fresh(f"e{k}", s.dims + list(m.params)) for k in range(len(ix))]
            # out of bounds iff some index_k < 0 or index_k >= shape_k
            out = " or ".join(f"{e} < 0 or {e} >= ({x})" for e, x in zip(es, ext)) or "1 = 0"
            body = s.cons + [f"{e} = ({x})" for e, x in zip(es, ix)] + cs
            parts.append(f"a{len(decided)}[{', '.join(s.dims + es)}] : {' and '.join(body) or '1 = 1'} and ({out})")
            decided.append((s, buf, idx, what, conds, exact and s.exact))
    return m, decided, unknown, m.prefix() + "{ " + "; ".join(parts) + " }"


def _in_loops(s: _Stmt, exprs: tuple[Expr, ...]) -> tuple[Expr, ...] | None:
    """`exprs` (indices or conditions in the iteration variables) written in the loops, for a statement whose
    coords are not affine but whose loop bounds and guards are (after `collapse` of a symbolic extent); None
    for any other statement."""
    if s.exact or not s.loops_exact:
        return None
    sub = subst_coords(s.info.store)
    return tuple(substitute(e, sub) for e in exprs)


def _digits_access(s: _Stmt, buf: Buffer, at: tuple[Expr, ...], conds: tuple[Expr, ...]
                   ) -> tuple[str, str, list[str]] | None:
    """(offset, extent, conditions) as isl text over the loops when the indices `at` (in the loops) are the
    mixed-radix digits of an affine offset f (x[i, j] after `collapse` of a symbolic n: i = f // n, j = f % n;
    `mixed_radix`): in bounds iff 0 <= f < prod(shape). None otherwise."""
    f = mixed_radix(buf.shape, at)
    if f is None:
        return None
    size: Expr = buf.shape[0]
    for d in buf.shape[1:]:
        size = binary("mul", size, d)
    try:
        return aff(f, s.lnames), aff(size, s.lnames), [cond(c, s.lnames) for c in conds]
    except NonAffine:
        return None


def _point(s: isl.Set) -> isl.Point:
    """A small point of `s`, preferring every size >= 1 (a witness at an empty size is less telling)."""

    npar = s.dim(isl.dim_type.param)
    if npar:
        pn = [s.get_dim_name(isl.dim_type.param, k) for k in range(npar)]
        pos = s.intersect_params(isl.Set(f"[{', '.join(pn)}] -> {{ : {' and '.join(f'{p} >= 1' for p in pn)} }}"))
        if not pos.is_empty():
            return _small_point(pos)
    return _small_point(s)


def _val(pt: isl.Point, t: object, k: int) -> int:
    return int(pt.get_coordinate_val(t, k).to_python())


def _params_of(m: _Model, pt: isl.Point) -> tuple[dict[str, int], dict[Var, int]]:
    sp = pt.get_space()
    by_name: dict[str, int] = {}
    env: dict[Var, int] = {}
    for k in range(sp.dim(isl.dim_type.param)):
        n = sp.get_dim_name(isl.dim_type.param, k)
        v = _val(pt, isl.dim_type.param, k)
        var = m.params.get(n)
        if var is not None:
            env[var] = v
        by_name[var.name if var is not None else n] = v
    return by_name, env


def _extent(buf: Buffer, env: dict[Var, int]) -> tuple[int, ...]:

    try:
        return tuple(int(eval_expr(d, env)) for d in buf.shape)
    except ValueError:
        return ()


def _bounds(program: Program) -> tuple[BoundsWitness | None, list[Access], SizePrecondition | None]:
    """The first disproved access (witness), the accesses isl cannot decide, and the precondition on the
    sizes when the disproved accesses happen only at small sizes (then the witness is None)."""
    m, decided, unknown, text = _model(program)
    if not decided:
        return None, unknown, None
    viol = isl.UnionSet(text).intersect_params(m.context())
    if viol.is_empty():
        return None, unknown, None
    sets = viol.get_set_list()
    found = {}
    for k in range(sets.n_set()):
        st_ = sets.get_at(k)
        if not st_.is_empty():
            found[int(st_.get_tuple_name()[1:])] = st_
    first: BoundsWitness | None = None
    sizes: isl.Set | None = None  # the sizes at which some exact access leaves its buffer
    for k in sorted(found):
        s, buf, idx, what, conds, exact = decided[k]
        st = s.info.store
        if not exact:  # the violation may be spurious: guard it instead
            unknown.append(Access(st.name, buf, idx, what, st, conds,
                                  "the statement's loop bounds, guards or coordinates (or a condition of the "
                                  "load) are not affine, e.g. after collapse of a symbolic extent"))
            continue
        ps = found[k].params()
        sizes = ps if sizes is None else sizes.union(ps)
        if first is None:
            first = _witness_in(m, s, buf, idx, what, found[k])
    if first is None or sizes is None:
        return None, unknown, None
    # refused iff it leaves a buffer at some sizes that are all >= LARGE; else a precondition checked per call
    npar = sizes.dim(isl.dim_type.param)
    pn = [sizes.get_dim_name(isl.dim_type.param, i) for i in range(npar)]
    large = isl.Set(f"[{', '.join(pn)}] -> {{ : {' and '.join(f'{p} >= {LARGE}' for p in pn) or '1 = 1'} }}")
    if npar == 0 or not sizes.intersect_params(large).is_empty():
        for k in sorted(found):  # a witness at large sizes when there is one: the telling example
            s, buf, idx, what, conds, exact = decided[k]
            if exact and npar and not found[k].intersect_params(large).is_empty():
                return _witness_in(m, s, buf, idx, what, found[k].intersect_params(large)), unknown, None
        return first, unknown, None
    names = tuple((n, m.params[n]) for n in pn if n in m.params)
    return None, unknown, SizePrecondition(str(sizes.coalesce()), names, first)


def _witness_in(m: _Model, s: _Stmt, buf: Buffer, idx: tuple[Expr, ...], what: str, where: isl.Set) -> BoundsWitness:
    st = s.info.store
    pt = _point(where)
    nl = len(s.info.loops)
    vals = [_val(pt, isl.dim_type.set, i) for i in range(len(s.dims) + len(idx))]
    params, env = _params_of(m, pt)
    inst = {v.name: x for v, x in zip(st.iters, vals[nl:len(s.dims)])}
    return BoundsWitness("out_of_bounds", st.name, inst, buf.name, what, tuple(vals[len(s.dims):]),
                         _extent(buf, env), params)


def check_bounds(program: Program) -> BoundsWitness | None:
    """A load or store of `program` that leaves its buffer for some sizes, or None (proven, or
    not affine: see `analyse` for those). The check a schedule can run after every step."""
    return _bounds(program)[0]


# ----------------------------------------------------------------------------- initialised reads


def _temporaries(program: Program) -> set[Buffer]:
    scratch = {s.buffer for s in walk_stmts(program) if isinstance(s, Allocate)}
    return set(program.temps) | scratch


_LEX_GT: dict[int, isl.UnionMap] = {}


def _lex_gt(width: int) -> isl.UnionMap:
    if width not in _LEX_GT:
        sp = isl.Set("{ [" + ", ".join(f"t{k}" for k in range(width)) + "] }").get_space()
        _LEX_GT[width] = isl.UnionMap(isl.Map.lex_gt(sp))
    return _LEX_GT[width]


def check_initialized(program: Program, notes: list[str] | None = None) -> BoundsWitness | None:
    """A read of a temporary (program temp or scratch buffer) whose element no earlier write
    of the program produced, or None. Skipped (with a note) when the model is inexact there."""
    # initialised iff every read of a temporary has a write source earlier in the schedule (no-source set empty)
    temps = _temporaries(program)
    if not temps:
        return None
    m = _Model(program)
    users = [s for s in m.stmts if any(b in temps for b, _, _, _ in _accesses(s.info.store))]
    if not users:
        return None
    width = 2 * max(len(s.info.loops) for s in users) + 1
    depth = {b: 1 + max((len(a.loops) for s in users for a in s.info.allocs if a.buffer is b), default=0)
             for b in temps}
    reads, must, may, sched = [], [], [], []
    inexact = []
    for s in users:
        info = s.info
        nl = len(info.loops)
        t = [x for k in range(nl) for x in (str(info.betas[k]), s.dims[k])] + [str(info.betas[-1])]
        t += ["0"] * (width - len(t))
        dom = " and ".join(s.cons) or "1 = 1"
        sched.append(f"{s.tup}[{', '.join(s.dims)}] -> [{', '.join(t)}] : {dom}")
        for buf, idx, what, conds in _accesses(info.store):
            if buf not in temps or (what == "reads" and _written_before(users, s, buf, idx)):
                continue
            acc = m.access(s, buf, idx, conds)
            if acc is None or not acc[2] or not s.exact:
                inexact.append(f"{info.store.name} {what} {buf.name}")
                if acc is None:
                    continue
            ix, cs, exact = acc
            site = info.alloc_of(buf)
            pre = [] if site is None else [str(site.ident)] + [s.dims[k] for k in site.loops]
            pre += ["0"] * ((depth[buf] if site is not None else 0) - len(pre))
            rel = f"{s.tup}[{', '.join(s.dims)}] -> {m.bname(buf)}[{', '.join(pre + ix)}] : " + \
                  " and ".join(s.cons + cs or ["1 = 1"])
            (reads if what == "reads" else must if exact and s.exact else may).append(rel)
    if inexact:
        if notes is not None:
            notes.append("reads of temporaries are not checked for initialisation where the model is inexact ("
                         + "; ".join(dict.fromkeys(inexact)) + ")")
        return None
    if not reads:
        return None
    wrap = lambda xs: isl.UnionMap(m.prefix() + "{ " + "; ".join(xs) + " }")  # noqa: E731
    # a read (instance r, element e) is initialised iff some write w of e has time(w) <lex time(r); computed on
    # the wrapped pairs [r -> e] so that one instance's other reads cannot hide it (cheaper than compute_flow)
    rd, sc = wrap(reads), wrap(sched)
    t_r = rd.domain_map().apply_range(sc)  # [r -> e] -> time(r)
    t_w = rd.range_map().apply_range(wrap(must + may).reverse()).apply_range(sc)  # [r -> e] -> time(w), w writes e
    init = t_w.intersect(t_r.apply_range(_lex_gt(width))).domain()
    bad = rd.wrap().subtract(init).intersect_params(m.context())
    if bad.is_empty():
        return None
    ws = bad.get_set_list().get_at(0)
    mp = ws.unwrap()
    pt = _point(ws)
    s = next(x for x in users if x.tup == mp.get_tuple_name(isl.dim_type.in_))
    buf = next(b for b, n in m.bufnames.items() if n == mp.get_tuple_name(isl.dim_type.out))
    nin, nout = mp.dim(isl.dim_type.in_), mp.dim(isl.dim_type.out)
    vals = [_val(pt, isl.dim_type.set, i) for i in range(nin + nout)]
    params, env = _params_of(m, pt)
    st = s.info.store
    inst = {v.name: x for v, x in zip(st.iters, vals[len(s.info.loops):nin])}
    elem = tuple(vals[nin + nout - len(buf.shape):])  # a scratch element is prefixed by its allocation
    return BoundsWitness("uninitialized", st.name, inst, buf.name, "reads", elem, _extent(buf, env), params)


# ----------------------------------------------------------------------------- everything


def _loads_outside_statements(program: Program) -> list[str]:
    """Loads in loop bounds or guards: data-dependent control flow the bounds model does not cover."""

    out = []
    for s in walk_stmts(program):
        exprs = (s.lo, s.hi) if isinstance(s, For) else (s.cond,) if isinstance(s, If) else ()
        for e in exprs:
            out += [n.buffer.name for n in walk(e) if isinstance(n, Load)]
    return out


def analyse(program: Program, initialized: bool = True) -> BoundsReport:
    """The bounds proof and the initialisation check of `program` (see the module docstring); `initialized=False`
    leaves the initialisation check to the caller (`check_initialized`), which only refuses."""
    notes: list[str] = []
    witness, unknown, pre = _bounds(program)
    if witness is None and initialized:
        witness = check_initialized(program, notes)
    if pre is not None and witness is None:
        notes.append(pre.describe())
    for name in dict.fromkeys(_loads_outside_statements(program)):
        notes.append(f"a loop bound or guard reads buffer {name!r}; those loads are not bounds-checked")
    return BoundsReport(witness, unknown, notes, pre)
