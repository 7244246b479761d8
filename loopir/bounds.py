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
guards or coords) may be spurious: it is reported as unknown, never as a witness.

Reads of a temporary (a program temp or a scratch buffer) that no write of the program can have
produced first are found with isl's dataflow analysis (`compute_flow`, sinks without a source)
and reported the same way (`kind == "uninitialized"`).

    check_bounds(program)        -> BoundsWitness | None     (cheap: one isl parse, one emptiness test)
    check_initialized(program)   -> BoundsWitness | None
    analyse(program)             -> BoundsReport             (both, plus the unknown accesses and notes)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import islpy as isl

from .isl_conv import NonAffine, _Names, _sanitize, aff, cond
from .nodes import Allocate, Buffer, Expr, Load, Program, Select, Store, Var
from .poly_model import StmtInfo, _Builder
from .visit import _child_fields, walk, walk_stmts

__all__ = ["BoundsError", "BoundsWitness", "Access", "BoundsReport", "check_bounds", "check_initialized", "analyse"]


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


@dataclass
class BoundsReport:
    """What `analyse` found: `witness` (a disproved access or an uninitialised read, or None),
    `unknown` (accesses isl could not decide; the caller guards them), `notes` (sentences)."""

    witness: BoundsWitness | None
    unknown: list[Access]
    notes: list[str]


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


def _context(b: _Builder) -> str:
    """The size constraints: every affine dimension of every argument is >= 0."""
    names = _Names(b.params)
    cons = []
    for buf in b.program.args:
        for d in buf.shape:
            try:
                cons.append(f"({aff(d, names)}) >= 0")
            except NonAffine:
                pass
    return " and ".join(dict.fromkeys(cons)) or "1 = 1"


def _fresh(name: str, *taken: object) -> str:
    while any(name in t for t in taken):  # type: ignore[operator]
        name += "_"
    return name


@dataclass
class _Model:
    builder: _Builder
    decided: list[tuple[StmtInfo, Buffer, tuple[Expr, ...], str, tuple[Expr, ...]]]  # a{k} of the violation set
    unknown: list[Access]
    text: str  # the violation union set (isl text, params prefixed)
    inexact: set[int]  # accesses whose conditions were over-approximated


def _model(program: Program) -> _Model:
    b = _Builder(program)
    parts: list[str] = []
    decided: list[tuple[StmtInfo, Buffer, tuple[Expr, ...], str, tuple[Expr, ...]]] = []
    unknown: list[Access] = []
    inexact: set[int] = set()
    for info in b.infos:
        st = info.store
        inst, lnames, lcons = b._instance(info)
        its = b.iter_names(st)
        names = _Names(b.params)  # indices are written in the statement's iteration variables
        for v, n in zip(st.iters, its):
            names.env[v] = n
            names.taken.add(n)
        for buf, idx, what, conds in _accesses(st):
            try:
                ix = [aff(i, names) for i in idx]
                ext = [aff(d, names) for d in buf.shape]
            except NonAffine:
                unknown.append(Access(st.name, buf, idx, what, st, conds))
                continue
            guards = []
            for c in conds:
                try:
                    guards.append(cond(c, names))
                except NonAffine:  # dropped: over-approximates the instances that run the access
                    inexact.add(len(decided))
            # out of bounds iff some index_k < 0 or index_k >= shape_k (e_k names the element)
            es = [_fresh(f"e{k}", its, b.params) for k in range(len(ix))]
            eqs = [f"{e} = ({x})" for e, x in zip(es, ix)] + guards
            out = " or ".join(f"{e} < 0 or {e} >= ({s})" for e, s in zip(es, ext)) or "1 = 0"
            body = b._exists(info, lnames, lcons)
            parts.append(f"a{len(decided)}[{', '.join(its + es)}] : ({body}) and {' and '.join(eqs) or '1 = 1'}"
                         f" and ({out})")
            decided.append((info, buf, idx, what, conds))
    text = b.prefix() + "{ " + "; ".join(parts) + " }"
    return _Model(b, decided, unknown, text, inexact)


def _point(s: isl.Set) -> isl.Point:
    """A small point of `s`, preferring every size >= 1 (a witness at an empty size is less telling)."""
    from .poly import _small_point

    npar = s.dim(isl.dim_type.param)
    if npar:
        pn = [s.get_dim_name(isl.dim_type.param, k) for k in range(npar)]
        pos = s.intersect_params(isl.Set(f"[{', '.join(pn)}] -> {{ : {' and '.join(f'{p} >= 1' for p in pn)} }}"))
        if not pos.is_empty():
            return _small_point(pos)
    return _small_point(s)


def _val(pt: isl.Point, t: object, k: int) -> int:
    return int(pt.get_coordinate_val(t, k).to_python())


def _params_of(b: _Builder, pt: isl.Point) -> tuple[dict[str, int], dict]:
    sp = pt.get_space()
    by_name: dict[str, int] = {}
    env = {}
    for k in range(sp.dim(isl.dim_type.param)):
        n = sp.get_dim_name(isl.dim_type.param, k)
        v = _val(pt, isl.dim_type.param, k)
        var = b.params.get(n)
        if var is not None:
            env[var] = v
            by_name[var.name] = v
        else:
            by_name[n] = v
    return by_name, env


def _extent(buf: Buffer, env: dict) -> tuple[int, ...]:
    from .args import eval_expr

    try:
        return tuple(int(eval_expr(d, env)) for d in buf.shape)
    except ValueError:
        return ()


def _violations(m: _Model) -> isl.UnionSet | None:
    if not m.decided:
        return None
    b = m.builder
    viol = isl.UnionSet(m.text)
    ctx = isl.Set(b.prefix() + "{ : " + _context(b) + " }")
    return viol.intersect_params(ctx)


def _first_witness(m: _Model, viol: isl.UnionSet) -> tuple[BoundsWitness | None, list[Access]]:
    """The witness of the first exactly-modelled violating access; over-approximated ones are unknown."""
    b = m.builder
    sets = viol.get_set_list()
    spurious: list[Access] = []
    found: dict[int, isl.Set] = {}
    for k in range(sets.n_set()):
        s = sets.get_at(k)
        if not s.is_empty():
            found[int(s.get_tuple_name()[1:])] = s
    for k in sorted(found):
        info, buf, idx, what, conds = m.decided[k]
        st = info.store
        if not b.exact.get(st.name, True) or k in m.inexact:
            spurious.append(Access(st.name, buf, idx, what, st, conds))
            continue
        pt = _point(found[k])
        nit = len(st.iters)
        vals = [_val(pt, isl.dim_type.set, i) for i in range(nit + len(idx))]
        params, env = _params_of(b, pt)
        return BoundsWitness("out_of_bounds", st.name, {v.name: x for v, x in zip(st.iters, vals[:nit])},
                             buf.name, what, tuple(vals[nit:]), _extent(buf, env), params), spurious
    return None, spurious


def check_bounds(program: Program) -> BoundsWitness | None:
    """A load or store of `program` that leaves its buffer for some sizes, or None (proven, or
    not affine: see `analyse` for those). The check a schedule can run after every step."""
    m = _model(program)
    viol = _violations(m)
    if viol is None or viol.is_empty():
        return None
    return _first_witness(m, viol)[0]


# ----------------------------------------------------------------------------- initialised reads


def _temporaries(program: Program) -> set[Buffer]:
    scratch = {s.buffer for s in walk_stmts(program) if isinstance(s, Allocate)}
    return set(program.temps) | scratch


def check_initialized(program: Program, notes: list[str] | None = None) -> BoundsWitness | None:
    """A read of a temporary (program temp or scratch buffer) whose element no earlier write
    of the program produced, or None. Skipped (with a note) when the model is inexact."""
    temps = _temporaries(program)
    if not temps:
        return None
    b = _Builder(program)
    reads_t, must_t, may_t = b.access_texts()
    if b.notes:
        if notes is not None:
            notes.append("reads of temporaries are not checked for initialisation: the program is not affine "
                          "everywhere (" + "; ".join(b.notes) + ")")
        return None
    tnames = {n for n, buf in b.bufnames.items() if buf in temps}
    dom = isl.UnionSet(b.prefix() + b.domain_text())
    reads = isl.UnionMap(b.prefix() + reads_t).intersect_domain(dom)
    keep = isl.UnionMap("{ }")
    ml = reads.get_map_list()
    for k in range(ml.n_map()):
        mp = ml.get_at(k)
        if mp.get_tuple_name(isl.dim_type.out) in tnames:
            keep = keep.union(isl.UnionMap.from_map(mp))
    if keep.is_empty():
        return None
    must = isl.UnionMap(b.prefix() + must_t).intersect_domain(dom)
    may = isl.UnionMap(b.prefix() + may_t).intersect_domain(dom)
    sched = isl.UnionMap(b.prefix() + b.schedule_text()).intersect_domain(dom)
    # initialised iff every read of a temporary has a write source earlier in the schedule (no-source set empty)
    flow = (isl.UnionAccessInfo.from_sink(keep).set_must_source(must).set_may_source(may)
            .set_schedule_map(sched).compute_flow())
    bad = flow.get_must_no_source()
    ctx = isl.Set(b.prefix() + "{ : " + _context(b) + " }")
    bad = bad.intersect_params(ctx)
    if bad.is_empty():
        return None
    mp = bad.get_map_list().get_at(0)
    pt = _point(mp.wrap())
    st = next(i.store for i in b.infos if _sanitize(i.store.name) == mp.get_tuple_name(isl.dim_type.in_))
    buf = b.bufnames[mp.get_tuple_name(isl.dim_type.out)]
    nin, nout = mp.dim(isl.dim_type.in_), mp.dim(isl.dim_type.out)
    vals = [_val(pt, isl.dim_type.set, i) for i in range(nin + nout)]
    params, env = _params_of(b, pt)
    elem = tuple(vals[nin + nout - len(buf.shape):])  # a scratch element is prefixed by its allocation
    return BoundsWitness("uninitialized", st.name, {v.name: x for v, x in zip(st.iters, vals[:nin])}, buf.name,
                         "reads", elem, _extent(buf, env), params)


# ----------------------------------------------------------------------------- everything


def _loads_outside_statements(program: Program) -> list[str]:
    """Loads in loop bounds or guards: data-dependent control flow the bounds model does not cover."""
    from .nodes import For, If

    out = []
    for s in walk_stmts(program):
        exprs = (s.lo, s.hi) if isinstance(s, For) else (s.cond,) if isinstance(s, If) else ()
        for e in exprs:
            out += [n.buffer.name for n in walk(e) if isinstance(n, Load)]
    return out


def analyse(program: Program) -> BoundsReport:
    """The bounds proof and the initialisation check of `program` (see the module docstring)."""
    m = _model(program)
    notes: list[str] = []
    unknown = list(m.unknown)
    witness = None
    viol = _violations(m)
    if viol is not None and not viol.is_empty():
        witness, spurious = _first_witness(m, viol)
        unknown += spurious
    if witness is None:
        witness = check_initialized(program, notes)
    for name in dict.fromkeys(_loads_outside_statements(program)):
        notes.append(f"a loop bound or guard reads buffer {name!r}; those loads are not bounds-checked")
    return BoundsReport(witness, unknown, notes)
