"""Conversions between loopir integer expressions and isl: Expr -> isl text (`aff`, `cond`),
isl (piecewise) quasi-affine functions -> Expr (`aff_to_expr`, `pw_to_expr`, `constraints_to_cond`); the
bounds rebuilt from isl go through `loopir.affine.simplify_affine` so that they print the way a person
would write them (`i - m + 3`, not `-1 * m + i + 3`). Formula pieces: `prefix` (the parameter list),
`loop_constraints` (the bounds and guards around a statement), `_conj`, `_exists`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import islpy as isl

from .errors import IslConversionError
from .affine import _collect, _const_int, _is_int_expr, _rebuild, simplify_affine
from .dtypes import INDEX
from .names import fresh, sanitize
from .nodes import Binary, Cast, Compare, Const, Expr, Logical, Unary, Var, binary, const

__all__ = [
    "NonAffine",
    "aff",
    "cond",
    "aff_to_expr",
    "constraints_to_cond",
    "loop_constraints",
    "params_text",
    "prefix",
    "pw_to_expr",
]


class NonAffine(Exception):
    """An expression that isl cannot represent (raised internally, then over-approximated)."""


# ----------------------------------------------------------------------------- names

_ISL_WORDS = {"and", "or", "not", "exists", "mod", "floor", "ceil", "min", "max", "true", "false", "infty", "NaN", "Z"}


_sanitize = functools.partial(sanitize, reserved=_ISL_WORDS)


class _Names:
    """isl identifiers for Vars (by identity) within one formula; unknown Vars become parameters.

    `_Names.unique()` names every Var on first sight `<name>_<k>` instead (call the object, or let
    `aff` meet it): for formulas built piece by piece over several statements whose loop variables
    may share a name, and whose own fixed names (`x0`, `q0`, `it0`, `o`) never end in `_<k>`."""

    def __init__(self, params: dict[str, Var] | None = None, taken: set[str] | None = None,
                 unique: bool = False) -> None:
        self.params = {} if params is None else params
        self.env: dict[Var, str] = {}
        self.taken = set(taken or ()) | set(self.params)
        self.unique = unique

    def __call__(self, v: Var) -> str:
        n = self.env.get(v)
        if n is None:
            n = self.env[v] = fresh(f"{sanitize(v.name)}_{len(self.env)}", self.taken)
        return n

    def by_name(self) -> dict[str, Var]:
        """The Var each isl identifier stands for (what `aff_to_expr` maps names back with)."""
        return {n: v for v, n in self.env.items()}

    def bind(self, v: Var, hint: str | None = None) -> str:
        name = fresh(_sanitize(hint or v.name), self.taken)
        self.env[v] = name
        return name

    def name(self, v: Var) -> str:
        n = self.env.get(v)
        if n is not None:
            return n
        if self.unique:
            return self(v)
        p = _sanitize(v.name)
        if p not in self.params:
            self.params[p] = v
        self.env[v] = p
        return p


def _exists(names: list[str], body: str) -> str:
    return f"exists ({', '.join(names)} : {body})" if names else body


def _conj(cs: list[str]) -> str:
    return " and ".join(cs) if cs else "0 = 0"


def prefix(params: Any, names: _Names) -> str:
    """The parameter list `[n, m] -> ` of a formula over `params` (Vars), empty for none; with the products of
    those sizes that stand for their own parameter (`derived_size`)."""
    ps = list(params)
    given = {id(p) for p in ps}
    ps += [var for var, _, fs in _DERIVED.values() if all(id(f) in given for f in fs) and id(var) not in given]
    return params_text([names(p) for p in ps])


def params_text(isl_names: Any) -> str:
    """The parameter list `[n, m] -> ` of a formula over parameters already named, empty for none."""
    ps = list(isl_names)
    return f"[{', '.join(ps)}] -> " if ps else ""


def loop_constraints(loops: Any, guards: Any, names: _Names) -> list[str]:
    """The constraints of the loops (`lo <= i < hi`, outermost first) and guards around a statement."""
    out = [f"{aff(f.lo, names)} <= {names(f.var)} < {aff(f.hi, names)}" for f in loops]
    out.extend(cond(g, names) for g in guards)
    return out


# ----------------------------------------------------------------------------- products of sizes

# (the factors' ids) -> (the derived size Var, the product of the factors): kept for the process, so a product
# has one parameter in every formula (the factors are held, so their ids are not reused)
_DERIVED: dict[tuple[int, ...], tuple[Var, Expr, tuple[Var, ...]]] = {}
_PRODUCT_OF: dict[Var, Expr] = {}


def _factors(e: Expr) -> list[Expr]:
    if isinstance(e, Binary) and e.op == "mul":
        return _factors(e.a) + _factors(e.b)
    if isinstance(e, Cast) and _is_int_expr(e) and _is_int_expr(e.a):
        return _factors(e.a)
    return [e]


def derived_size(e: Expr, names: _Names, register: bool = False) -> str | None:
    """The isl parameter standing for a product of size parameters (`B * T`, as in a shape (B*T, C); times the
    product of its constant factors, if any: `(8*B8) * (16*T16)`, the sizes of a specialized variant, is
    `(128*B8_x_T16)`), or None when `e` is not one (a factor is an expression or a loop variable). The product is
    its own parameter, unrelated to its factors (a product is not affine in them); expressions isl gives back in it are
    written with the product again (`product_of`). A formula's parameters are listed before its constraints are
    written, so the parameter must be among `names.params` already (`poly_model._program_params` registers every
    product a program uses, `register=True`); otherwise None, and the product stays non-affine there."""
    coef, vs = 1, []
    for f in _factors(e):  # constant factors scale the parameter: 8*B8 * (16*T16) is 128 * (B8*T16)
        c = _const_int(f)
        if c is not None:
            coef *= c
        elif isinstance(f, Var):
            vs.append(f)
        else:
            return None
    if len(vs) < 2:
        return None
    vs.sort(key=lambda v: (v.name, id(v)))
    key = tuple(id(v) for v in vs)
    hit = _DERIVED.get(key)
    if hit is None and not register:
        return None  # not a product of sizes a program was analysed with (a loop variable times a size: b * T)
    if hit is None:
        name = "_x_".join(_sanitize(v.name) for v in vs)  # type: ignore[union-attr]
        prod: Expr = vs[0]  # type: ignore[assignment]
        for v in vs[1:]:
            prod = binary("mul", prod, v)
        hit = _DERIVED[key] = (Var(name, prod.dtype), prod, tuple(vs))  # type: ignore[arg-type]
        _PRODUCT_OF[hit[0]] = prod
    var = hit[0]
    n = names.env.get(var) or next((k for k, p in names.params.items() if p is var), None)
    if n is None and (not register or names.unique):
        return None
    if n is None:
        n = fresh(_sanitize(var.name), names.taken) if var.name in names.taken else var.name
        names.taken.add(n)
        names.params[n] = var
    names.env[var] = n
    for v in vs:
        names.name(v)  # type: ignore[arg-type]
    return n if coef == 1 else f"({coef}*{n})"


def product_of(v: Var) -> Expr:
    """The product a derived size parameter stands for (`v` itself for any other variable)."""
    return _PRODUCT_OF.get(v, v)


# ----------------------------------------------------------------------------- Expr -> isl text


def aff(e: Expr, names: _Names) -> str:
    """isl text of an affine integer expression; raises NonAffine otherwise."""
    if isinstance(e, Const):
        if isinstance(e.value, bool) or not isinstance(e.value, int):
            raise NonAffine(e)
        return str(e.value)
    if isinstance(e, Var):
        return names.name(e)
    if isinstance(e, Cast):
        if _is_int_expr(e) and _is_int_expr(e.a):
            return aff(e.a, names)
        raise NonAffine(e)
    if isinstance(e, Unary) and e.op == "neg":
        return f"-({aff(e.a, names)})"
    if isinstance(e, Binary) and _is_int_expr(e):
        if e.op in ("add", "sub"):
            return f"({aff(e.a, names)}) {'+' if e.op == 'add' else '-'} ({aff(e.b, names)})"
        if e.op == "mul":
            ca, cb = _const_int(e.a), _const_int(e.b)
            if cb is not None:
                return f"{cb}*({aff(e.a, names)})"
            if ca is not None:
                return f"{ca}*({aff(e.b, names)})"
            derived = derived_size(e, names)
            if derived is not None:
                return derived
            raise NonAffine(e)
        if e.op in ("floordiv", "mod"):
            c = _const_int(e.b)
            if c is None or c <= 0:
                raise NonAffine(e)
            a = aff(e.a, names)
            if e.op == "floordiv":
                return f"floor(({a})/{c})"
            return f"(({a}) - {c}*floor(({a})/{c}))"
        if e.op in ("max", "min"):
            return f"{e.op}({aff(e.a, names)}, {aff(e.b, names)})"
    raise NonAffine(e)


_CMP = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "="}
_NEG = {"lt": "ge", "le": "gt", "gt": "le", "ge": "lt", "eq": "ne", "ne": "eq"}


def cond(e: Expr, names: _Names, negate: bool = False) -> str:
    """isl text of an affine condition; raises NonAffine otherwise."""
    if isinstance(e, Const) and isinstance(e.value, bool):
        return "1 = 1" if e.value != negate else "1 = 0"
    if isinstance(e, Compare):
        if not (_is_int_expr(e.a) and _is_int_expr(e.b)):
            raise NonAffine(e)
        op = _NEG[e.op] if negate else e.op
        a, b = aff(e.a, names), aff(e.b, names)
        if op == "ne":
            return f"(({a}) < ({b}) or ({a}) > ({b}))"
        return f"({a}) {_CMP[op]} ({b})"
    if isinstance(e, Logical):
        if e.op == "not":
            return cond(e.a, names, not negate)
        assert e.b is not None
        op = e.op if not negate else ("or" if e.op == "and" else "and")
        return f"(({cond(e.a, names, negate)}) {op} ({cond(e.b, names, negate)}))"
    raise NonAffine(e)


# ----------------------------------------------------------------------------- isl -> Expr


def pw_to_expr(pw: isl.PwAff, vars_by_name: dict[str, Var], what: str = "bound", single: bool = False,
               simplify: bool = True) -> Expr:
    """A loopir Expr for an isl piecewise quasi-affine function that is one affine piece or the
    max / min of its pieces (pieces not needed for that are dropped); IslConversionError (a ValueError) otherwise.
    `single`: one affine piece after coalescing, else NonAffine (callers that fall back to another
    region rather than take a max / min); `simplify` as `aff_to_expr`'s, for that piece."""
    if single:
        pieces = pw.coalesce().get_pieces()
        if len(pieces) != 1:
            raise NonAffine(f"{what} is piecewise ({pw}); one affine expression is needed")
        return aff_to_expr(pieces[0][1], vars_by_name, simplify)
    pieces = pw.get_pieces()
    if not pieces:
        raise IslConversionError(f"the {what} is empty (no iteration)")
    if len(pieces) == 1:
        return aff_to_expr(pieces[0][1], vars_by_name)
    dom = pw.domain()
    affs = _distinct(pw)
    for op in ("max", "min"):
        if not _combine(affs, op, dom).is_equal(pw):
            continue
        # drop arguments that never decide the value
        return _fold(_fewest(affs, lambda xs, op=op: _combine(xs, op, dom).is_equal(pw)), op, vars_by_name)
    raise IslConversionError(f"the {what} {pw} is not a max or min of affine pieces")


def aff_to_expr(a: isl.Aff, vars_by_name: dict[str, Var], simplify: bool = True) -> Expr:
    """A loopir Expr for an isl quasi-affine expression (divisions become floordiv), normalized
    by `simplify_affine`. `simplify=False` writes it as isl holds it instead: the constant, then the
    input dimensions, the parameters and the divisions, each `c * term` (the regions and guards of
    cache_read / cache_write print this way; their nests and generated sources depend on it)."""
    den_val = a.get_denominator_val()
    den = int(den_val.to_python())
    terms: list[tuple[Expr, int]] = []

    def coef(t: Any, k: int) -> int:
        return int(a.get_coefficient_val(t, k).mul(den_val).to_python())

    for t in (isl.dim_type.param, isl.dim_type.in_) if simplify else (isl.dim_type.in_, isl.dim_type.param):
        for k in range(a.dim(t)):
            c = coef(t, k)
            if c:
                name = a.get_dim_name(t, k)
                if name not in vars_by_name:
                    raise IslConversionError(f"unknown variable {name!r} in {a}")
                terms.append((product_of(vars_by_name[name]), c))
    for k in range(a.dim(isl.dim_type.div)):
        c = coef(isl.dim_type.div, k)
        if c:
            terms.append((aff_to_expr(a.get_div(k), vars_by_name, simplify), c))
    c0 = int(a.get_constant_val().mul(den_val).to_python())
    if not simplify:
        out: Expr = binary("add", const(0, INDEX), c0) if c0 else const(0, INDEX)
        for t, c in terms:
            out = binary("add", out, t if c == 1 else binary("mul", c, t))
        return binary("floordiv", out, den) if den != 1 else out
    out = _rebuild(_collect(terms), c0, "int64" if not terms else _dtype_of(terms))
    if den != 1:
        out = binary("floordiv", out, const(den))
    return out


def constraints_to_cond(bset: isl.BasicSet, vars_by_name: dict[str, Var], simplify: bool = True) -> Expr | None:
    """The constraints of a basic set as one loopir condition (None when there are none)."""
    conds: list[Expr] = []
    for c in bset.get_constraints():
        e = aff_to_expr(c.get_aff(), vars_by_name, simplify)
        conds.append(e.eq(0) if c.is_equality() else e >= 0)
    if not conds:
        return None
    out = conds[0]
    for c in conds[1:]:
        out = out & c
    return out


def _dtype_of(terms: list[tuple[Expr, int]]) -> str:
    return "int64" if any(t.dtype == "int64" for t, _ in terms) else terms[0][0].dtype


def _plus1(pw: isl.PwAff) -> isl.PwAff:
    return pw.add_constant_val(isl.Val.one(pw.get_ctx()))


def _scale(e: Expr, c: int) -> Expr:
    return e if c == 1 else binary("mul", const(c), e)


def pw_bound(pw: isl.PwAff, vars_by_name: dict[str, Var], side: str, what: str = "bound") -> tuple[Expr, bool]:
    """A loop bound for the piecewise `pw` (a projection's minimum when side == "lo", maximum when
    side == "hi"): (the exact Expr, True) when `pw` is one piece or a max / min of its pieces, else
    (a sound over-approximation, False): the min (lo) or max (hi) of the fewest pieces that still bounds
    `pw` on its whole domain, so a loop with it runs every iteration (and the caller guards the extra ones).
    Pieces on degenerate parameter values (an empty nest at n <= 2) no longer make the bound fail."""
    try:
        return pw_to_expr(pw, vars_by_name, what), True
    except ValueError:
        pass
    dom = pw.domain()
    op = "min" if side == "lo" else "max"
    if dom.is_empty():  # no iteration at all (a reduction over k < i at i = 0 only): the empty loop 0..0
        return const(0), False

    def bounds(xs: list[isl.Aff]) -> bool:
        c = _combine(xs, op, dom)
        ok = c.le_set(pw) if side == "lo" else c.ge_set(pw)
        return dom.is_subset(ok)

    return _fold(_fewest(_distinct(pw), bounds), op, vars_by_name), False  # drop pieces the bound does not need


def _distinct(pw: isl.PwAff) -> list[isl.Aff]:
    """The functions of `pw`'s pieces, each once (the same function on several pieces counts once)."""
    affs: list[isl.Aff] = []
    for _, a in pw.get_pieces():
        if not any(a.plain_is_equal(b) for b in affs):
            affs.append(a)
    return affs


def _combine(xs: list[isl.Aff], op: str, dom: isl.Set) -> isl.PwAff:
    """The max / min (`op`) of `xs` on `dom`."""
    acc = isl.PwAff.from_aff(xs[0])
    for a in xs[1:]:
        acc = acc.max(isl.PwAff.from_aff(a)) if op == "max" else acc.min(isl.PwAff.from_aff(a))
    return acc.intersect_domain(dom)


def _fewest(affs: list[isl.Aff], enough: Callable[[list[isl.Aff]], bool]) -> list[isl.Aff]:
    """`affs` less each one that `enough` does not need (tried in order, greedily)."""
    k = 0
    while k < len(affs) and len(affs) > 1:
        rest = affs[:k] + affs[k + 1:]
        if enough(rest):
            affs = rest
        else:
            k += 1
    return affs


def _fold(affs: list[isl.Aff], op: str, vars_by_name: dict[str, Var]) -> Expr:
    """`op` (max / min) of the expressions of `affs`, simplified."""
    out = aff_to_expr(affs[0], vars_by_name)
    for a in affs[1:]:
        out = binary(op, out, aff_to_expr(a, vars_by_name))
    return simplify_affine(out)
