"""Affine index expressions: their linear form, their evaluation, and the questions passes ask of them.

One home for the integer-index algebra every layer needs, so that the analysis, the schedule
primitives and each code generator read an index the same way:

- `linear_in(e, v)`: `e` as `c*v + rest` with `rest` free of `v` (guard tightening, strides);
- `access_pattern(indices, v)`: how an access moves with loop `v` (uniform, contiguous, other);
- `eval_index(e, env)`: the value of an integer index at concrete sizes and loop values;
- `linear_form(e)`: `e` as {Var: coefficient, 1: constant}; `const_diff`, `same_value` and
  `simplify` (first-use order, provable min/max resolved) built on it for the schedule primitives;
- `simplify_affine(e)`: the normal form bounds rebuilt from isl print in (`i - m + 3`).

Expressions are built with the IR's own operators, so a result prints as the IR does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from .args import eval_expr
from .dtypes import is_int
from .nodes import Binary, Cast, Const, Expr, Unary, Var, binary, const
from .visit import walk

__all__ = ["access_pattern", "const_diff", "eval_index", "linear_form", "linear_in", "multiple_of", "polynomial",
           "row_major", "mixed_radix", "wrapped_digits", "term_range",
           "fold_divmod", "same_value", "simplify", "ceil_div", "simplify_affine", "simplify_divmod"]


def linear_in(e: Expr, v: Var) -> tuple[int, Expr] | None:
    """(c, rest) with e == c*v + rest, rest free of v; None if not of that form."""
    if e is v:
        return 1, Const(0, "int64")
    if not any(n is v for n in walk(e)):
        return 0, e
    if isinstance(e, Binary) and e.op in ("add", "sub"):
        a, b = linear_in(e.a, v), linear_in(e.b, v)
        if a is None or b is None:
            return None
        return (a[0] + b[0], a[1] + b[1]) if e.op == "add" else (a[0] - b[0], a[1] - b[1])
    if isinstance(e, Binary) and e.op == "mul":
        for x, y in ((e.a, e.b), (e.b, e.a)):
            if isinstance(y, Const) and isinstance(y.value, int):
                lx = linear_in(x, v)
                if lx is not None:
                    return lx[0] * y.value, lx[1] * y.value
    return None


def access_pattern(indices: tuple[Expr, ...], v: Var) -> Literal["uniform", "contig"] | None:
    """'uniform' if no index uses v; 'contig' if only the last does, as v + (free of v); else None."""
    uses = [any(n is v for n in walk(e)) for e in indices]
    if not any(uses):
        return "uniform"
    if any(uses[:-1]):
        return None
    lin = linear_in(indices[-1], v)
    return "contig" if lin is not None and lin[0] == 1 else None


def eval_index(e: Expr, env: Mapping[Var, int]) -> int:
    """Value of an integer index expression at concrete values of its variables, with Python's floor
    semantics for `//` and `%` (as the loop IR has); ValueError naming a variable without a value."""
    return int(eval_expr(e, env))


def linear_form(e: Expr) -> dict[Any, int] | None:
    """`e` as {atom Var: coefficient, 1: constant}, or None when it is not affine (integer). Lenient
    about dtypes (an integral float constant, any cast), as the schedule primitives need."""
    p = _monomials(e, strict=False)
    if p is None or any(len(k) > 1 for k in p):
        return None
    return {(k[0] if k else 1): c for k, c in p.items()}


def const_diff(a: Expr, b: Expr) -> int | None:
    """a - b when it is a constant (affine normal form), else None."""
    la, lb = linear_form(a), linear_form(b)
    if la is None or lb is None:
        return None
    d = {k: la.get(k, 0) - lb.get(k, 0) for k in set(la) | set(lb)}
    if any(v for k, v in d.items() if k != 1):
        return None
    return d.get(1, 0)


def multiple_of(e: Expr, k: int) -> bool:
    """`e` is provably a multiple of k: affine with every coefficient and the constant divisible by k
    (`4096`, `16*n16` after call-time specialization substituted a size)."""
    lin = linear_form(e)
    return lin is not None and all(isinstance(c, int) and c % k == 0 for c in lin.values())


def ceil_div(e: Expr, k: int) -> Expr:
    """The trip count ceil(e / k) of a loop split by k: `(e + k - 1) // k`, folded to the exact quotient when
    `e` is provably a multiple of k (`16*n16` split by 16 runs `n16` times: a bound the target compiler can
    unroll and reason with, not a division per test)."""
    return simplify_divmod(binary("floordiv", binary("add", e, const(k - 1)), const(k)), {})


def same_value(a: Expr, b: Expr) -> bool:
    """True when `a` and `b` are provably equal (affine normal form, else structure)."""
    la, lb = linear_form(a), linear_form(b)
    if la is not None and lb is not None:
        return {k: v for k, v in la.items() if v} == {k: v for k, v in lb.items() if v}
    return a == b


def simplify(e: Expr) -> Expr:
    """An affine integer expression in a canonical form (variables in first-use order, then
    the constant); `max`/`min` operands simplified; anything else unchanged."""
    if isinstance(e, Binary) and e.op in ("max", "min"):
        a, b = simplify(e.a), simplify(e.b)
        la, lb = linear_form(a), linear_form(b)
        if la is not None and lb is not None:
            d = {k: la.get(k, 0) - lb.get(k, 0) for k in set(la) | set(lb)}
            if all(v == 0 for k, v in d.items() if k != 1):
                c = d.get(1, 0)
                return a if (c >= 0) == (e.op == "max") else b
        return Binary(e.op, a, b, e.dtype)
    la = linear_form(e)
    if la is None or isinstance(e, (Const, Var)):
        return e
    out: Expr | None = None
    for k, v in la.items():
        if k == 1 or v == 0:
            continue
        term: Expr = k if v in (1, -1) else k * v
        if out is None:
            out = term if v != -1 else -term
        else:
            out = out + term if v != -1 else out - term
    c = la.get(1, 0)
    if out is None:
        return Const(c, e.dtype)
    return out + c if c > 0 else out - (-c) if c < 0 else out


def row_major(shape: tuple[Expr, ...], indices: tuple[Expr, ...]) -> Expr:
    """The row-major element offset of `indices` in an array of `shape`, `((i0 * s1 + i1) * s2 + i2) ...`,
    with the index of a collapsed loop folded back: `(a // d) * s + a % d` is `a` when `d == s` (floor
    division and modulo satisfy `a == d * (a // d) + a % d` for every a and d != 0). `collapse` writes
    `i = f // n, j = f % n`, so an access `x[i, j]` of an n-wide array becomes `x[f]`: contiguous in f,
    which the CUDA target can vectorize whatever n is."""
    if not indices:
        return Const(0, "int64")
    e = indices[0]
    for s, i in zip(shape[1:], indices[1:]):
        if (isinstance(e, Binary) and e.op == "floordiv" and isinstance(i, Binary) and i.op == "mod"
                and e.a == i.a and same_value(e.b, i.b) and same_value(e.b, s)):
            e = e.a
        else:
            e = binary("add", binary("mul", e, s), i)
    n = _divmods(e)
    if n:  # a pair written apart (an exact region's origin names the row as isl does): `fold_divmod` may cancel it
        folded = fold_divmod(e)
        if _divmods(folded) < n:
            return folded
    return e


def mixed_radix(shape: tuple[Expr, ...], indices: tuple[Expr, ...]) -> Expr | None:
    """`f` when `indices` are the digits of f in the mixed radix of `shape`, as `collapse` writes them:
    the last `f % s[-1]`, each one before it `(a // s[k+1]) % s[k]` of the quotient a left by the digits after
    it, the first the last quotient `a // s[1]`. Such indices are in bounds iff 0 <= f < prod(shape) (for
    positive extents), a condition affine in f where the indices are not (n a size: f // n). None otherwise."""
    shape, indices = _without_unit_dims(shape, indices)
    if len(indices) < 2 or len(indices) != len(shape):
        return None
    f, a = _digits(shape, indices)
    if a is None or _part(indices[0], "floordiv", shape[1]) != a:
        return None
    return f


def wrapped_digits(shape: tuple[Expr, ...], indices: tuple[Expr, ...]) -> bool:
    """`indices` are the last digits of some f in the mixed radix of `shape`, the first of them wrapped too:
    `f % s[0]` in one dimension (a bias b[j] read at j = f % n), `((f // s[1]) % s[0], f % s[1])` in two.
    Always in bounds for positive extents."""
    shape, indices = _without_unit_dims(shape, indices)
    if not indices or len(indices) != len(shape):
        return False
    _, a = _digits(shape, indices)
    return a is not None and (len(indices) == 1 or _part(indices[0], "mod", shape[0]) is not None
                              and _part(indices[0].a, "floordiv", shape[1]) == a)  # type: ignore[attr-defined]


def _without_unit_dims(shape: tuple[Expr, ...], indices: tuple[Expr, ...]) -> tuple[tuple, tuple]:
    """`shape` and `indices` without the dimensions of extent 1 indexed by 0 (a size specialized to 1: `collapse`
    left no digit there, and 0 is in bounds)."""
    if len(shape) != len(indices):
        return shape, indices
    keep = [k for k, (d, i) in enumerate(zip(shape, indices))
            if not (same_value(d, Const(1, "int64")) and same_value(i, Const(0, "int64")))]
    return tuple(shape[k] for k in keep), tuple(indices[k] for k in keep)


def _part(e: Expr, op: str, s: Expr) -> Expr | None:
    return e.a if isinstance(e, Binary) and e.op == op and same_value(e.b, s) else None


def _digits(shape: tuple[Expr, ...], indices: tuple[Expr, ...]) -> tuple[Expr | None, Expr | None]:
    """(f, the quotient a left for indices[0]) when indices[1:] are the last digits of f (`mixed_radix`);
    for one index, (f, f) when it is f % s[0]."""
    if len(indices) == 1:
        f = _part(indices[0], "mod", shape[0])
        return f, f
    f = _part(indices[-1], "mod", shape[-1])
    a = f
    for k in range(len(indices) - 2, 0, -1):
        d = _part(indices[k], "mod", shape[k])
        if a is None or d is None or _part(d, "floordiv", shape[k + 1]) != a:
            return f, None
        a = d
    return f, a


def _divmods(e: Expr) -> int:
    return sum(1 for x in walk(e) if isinstance(x, Binary) and x.op in ("floordiv", "mod"))


def fold_divmod(e: Expr) -> Expr:
    """`e` (an integer index) with each `x // d` and `x % d` (d a positive constant) in a normal form in which
    one quotient is one atom, so that sums of them cancel: `x % d` is `x - d * (x // d)`, and `x // d` is
    `q + r // d` where x = d*q + r and every coefficient and the constant of r lie in [0, d) (floor semantics:
    (d*q + r) // d = q + r // d for all integers). `(f // T) * T + f % T` is then `f` (T a constant), and so is
    `(2*o + (i - 16*o) // 40) * 40 + 24*o + i - 40 * ((24*o + i) // 40)` with f = 64*o + i: the same row of a
    collapsed (B, 40) nest as an exact region (isl) names it. The value is unchanged; a non-affine part (a
    product of variables, min, max, a division by a non-constant) stays an atom, unfolded."""
    r = _linear(e, fold=True)
    if r is None:
        return e
    return _rebuild(_collect(r[0]), r[1], e.dtype)


def polynomial(e: Expr) -> dict[tuple, int] | None:
    """e as a polynomial: {sorted tuple of var ids (monomial): integer coefficient}; None if not one
    (products of sizes allowed: the CUDA alignment proofs and the GPU interpreter read it)."""
    p = _monomials(e, strict=True)
    return None if p is None else {tuple(id(v) for v in k): c for k, c in p.items()}


def _monomials(e: Expr, strict: bool) -> dict[tuple[Var, ...], int] | None:
    """e as {monomial (Vars sorted by id): nonzero coefficient} in first-seen order; None if not a
    polynomial. strict: integer dtypes only (else an integral float constant and any cast pass)."""
    if isinstance(e, Const):
        if strict:
            return ({(): int(e.value)} if e.value else {}) if is_int(e.dtype) else None
        if isinstance(e.value, float) and e.value != int(e.value):
            return None
        return {(): int(e.value)} if e.value else {}
    if isinstance(e, Var):
        return {(e,): 1}
    if isinstance(e, Cast) and (not strict or (is_int(e.dtype) and is_int(e.a.dtype))):
        return _monomials(e.a, strict)
    if isinstance(e, Unary) and e.op == "neg":
        p = _monomials(e.a, strict)
        return None if p is None else {k: -c for k, c in p.items()}
    if isinstance(e, Binary) and e.op in ("add", "sub", "mul"):
        pa, pb = _monomials(e.a, strict), _monomials(e.b, strict)
        if pa is None or pb is None:
            return None
        out: dict[tuple[Var, ...], int] = {}
        if e.op == "mul":
            for ka, ca in pa.items():
                for kb, cb in pb.items():
                    k = tuple(sorted(ka + kb, key=id))
                    out[k] = out.get(k, 0) + ca * cb
        else:
            sign = 1 if e.op == "add" else -1
            out = dict(pa)
            for k, c in pb.items():
                out[k] = out.get(k, 0) + sign * c
        return {k: c for k, c in out.items() if c}
    return None


def _is_int_expr(e: Expr) -> bool:
    return e.dtype in ("int32", "int64")


def _const_int(e: Expr) -> int | None:
    if isinstance(e, Const) and isinstance(e.value, int) and not isinstance(e.value, bool):
        return e.value
    if isinstance(e, Unary) and e.op == "neg":
        c = _const_int(e.a)
        return None if c is None else -c
    if isinstance(e, Cast) and _is_int_expr(e):
        return _const_int(e.a)
    return None


# ----------------------------------------------------------------------------- affine normal form


def _linear(e: Expr, fold: bool = False) -> tuple[list[tuple[Expr, int]], int] | None:
    """`e` as (terms, constant) with terms [(atom, coefficient)] in first-seen order, or None when
    `e` is not a sum of integer multiples of atoms (an atom: a Var, or a floordiv/mod/min/max/other
    integer subexpression, itself normalized). With `fold`, `x // d` and `x % d` (d a positive constant)
    are expanded in the quotient normal form of `fold_divmod`, and every other such atom stays as written."""
    if not _is_int_expr(e):
        return None
    c = _const_int(e)
    if c is not None:
        return [], c
    if isinstance(e, Var):
        return [(e, 1)], 0
    if isinstance(e, Cast) and _is_int_expr(e.a):
        return _linear(e.a, fold)
    if isinstance(e, Unary) and e.op == "neg":
        r = _linear(e.a, fold)
        return None if r is None else ([(t, -k) for t, k in r[0]], -r[1])
    if isinstance(e, Binary) and e.op in ("add", "sub", "mul"):
        if e.op == "mul":
            ca, cb = _const_int(e.a), _const_int(e.b)
            if ca is None and cb is None:
                return [(e, 1)], 0
            k, other = (ca, e.b) if ca is not None else (cb, e.a)
            r = _linear(other, fold)
            return None if r is None else ([(t, k * x) for t, x in r[0]], k * r[1])
        ra, rb = _linear(e.a, fold), _linear(e.b, fold)
        if ra is None or rb is None:
            return None
        sign = 1 if e.op == "add" else -1
        return _collect(ra[0] + [(t, sign * k) for t, k in rb[0]]), ra[1] + sign * rb[1]
    if isinstance(e, Binary) and e.op in ("floordiv", "mod", "min", "max"):
        if fold:
            return _fold_quotient(e)
        return [(binary(e.op, simplify_affine(e.a), simplify_affine(e.b)), 1)], 0
    return [(e, 1)], 0


def _fold_quotient(e: Binary) -> tuple[list[tuple[Expr, int]], int]:
    """`x // d` as q + r // d and `x % d` as x - d * (x // d), x = d*q + r with every coefficient and the
    constant of r in [0, d) (`fold_divmod`); any other atom as it is."""
    d = _const_int(e.b)
    ra = _linear(e.a, fold=True) if e.op in ("floordiv", "mod") and d is not None and d > 0 else None
    if ra is None or d is None:
        return [(e, 1)], 0
    terms, c = _collect(ra[0]), ra[1]
    q_terms = [(t, k // d) for t, k in terms if k // d]
    r_terms = sorted(((t, k % d) for t, k in terms if k % d), key=lambda tk: str(tk[0]))  # one order: one atom
    quot = (q_terms, c // d)
    if r_terms:  # else 0 <= c % d < d: no remainder term
        quot = ([(Binary("floordiv", _rebuild(r_terms, c % d, e.dtype), Const(d, e.dtype), e.dtype), 1)]
                + q_terms, c // d)
    if e.op == "floordiv":
        return quot
    return _collect(terms + [(t, -d * k) for t, k in quot[0]]), c - d * quot[1]


def _collect(terms: list[tuple[Expr, int]]) -> list[tuple[Expr, int]]:
    out: dict[Expr, list[Any]] = {}  # Vars by identity, other atoms structurally
    for t, k in terms:
        if t in out:
            out[t][1] += k
        else:
            out[t] = [t, k]
    return [(t, k) for t, k in out.values() if k]


def _rebuild(terms: list[tuple[Expr, int]], c: int, dtype: str) -> Expr:
    """Positive terms first (`a + 2 * b`), then the negative ones subtracted, then the constant:
    `i - m + 3`; `3 - m` when no term is positive."""
    pos = [(t, k) for t, k in terms if k > 0]
    neg = [(t, -k) for t, k in terms if k < 0]

    def scaled(t: Expr, k: int) -> Expr:
        return t if k == 1 else Binary("mul", Const(k, dtype), t, dtype)

    out: Expr | None = None
    for t, k in pos:
        out = scaled(t, k) if out is None else Binary("add", out, scaled(t, k), dtype)
    if out is None and neg and c > 0:
        out, c = Const(c, dtype), 0
    for t, k in neg:
        out = Unary("neg", scaled(t, k), dtype) if out is None else Binary("sub", out, scaled(t, k), dtype)
    if out is None:
        return Const(c, dtype)
    if c > 0:
        return Binary("add", out, Const(c, dtype), dtype)
    if c < 0:
        return Binary("sub", out, Const(-c, dtype), dtype)
    return out


def simplify_affine(e: Expr) -> Expr:
    """`e` with integer sums in a normal form: like terms collected, constants folded, `+ 0` and
    `1 *` dropped, negative terms subtracted (`-1 * m + i + 3` -> `i - m + 3`); nested min/max of
    one kind flattened with duplicates removed. Non-integer or non-affine parts are kept as
    atoms (their integer subexpressions normalized). The value is unchanged."""
    if not isinstance(e, Expr) or not _is_int_expr(e):
        return e
    if isinstance(e, Binary) and e.op in ("min", "max"):
        args: list[Expr] = []
        for a in _flatten(e, e.op):
            a = simplify_affine(a)
            if a not in args:
                args.append(a)
        cs = [_const_int(a) for a in args]
        if sum(x is not None for x in cs) > 1:  # fold the constant arguments into one
            k = (min if e.op == "min" else max)(x for x in cs if x is not None)
            args = [a for a, x in zip(args, cs) if x is None] + [Const(k, e.dtype)]
        out = args[0]
        for a in args[1:]:
            out = Binary(e.op, out, a, e.dtype)
        return out
    if isinstance(e, Binary) and e.op in ("floordiv", "mod"):
        a, b = simplify_affine(e.a), simplify_affine(e.b)
        return binary(e.op, a, b)
    r = _linear(e)
    if r is None:
        return e
    return _rebuild(_collect(r[0]), r[1], e.dtype)


def _flatten(e: Expr, op: str) -> list[Expr]:
    if isinstance(e, Binary) and e.op == op:
        return _flatten(e.a, op) + _flatten(e.b, op)
    return [e]


# ----------------------------------------------------------------------------- div / mod by known ranges


def term_range(terms: list[tuple[Expr, int]], c: int,
                ranges: Mapping[Var, tuple[int, int]]) -> tuple[int, int] | None:
    """[min, max] of sum(k * atom) + c when every atom is a Var with a known inclusive range."""
    lo = hi = c
    for t, k in terms:
        if not isinstance(t, Var) or t not in ranges:
            return None
        a, b = ranges[t]
        lo, hi = lo + min(k * a, k * b), hi + max(k * a, k * b)
    return lo, hi


def simplify_divmod(e: Expr, ranges: Mapping[Var, tuple[int, int]]) -> Expr:
    """`e` with each `x // d` and `x % d` (d a positive constant) resolved where the loop ranges allow:
    x = d*q + r with every term of q a multiple of d and 0 <= r < d over `ranges` (Var -> inclusive
    [lo, hi]) gives x // d = q and x % d = r. The packed layouts of TVM's opt_gemm read
    `(no*32 + ni) // 32` and `(no*32 + ni) % 32` with 0 <= ni < 32: `no` and `ni`, so an access stays
    contiguous in `ni`. Anything else is returned unchanged (floor semantics, so the value is equal)."""
    if isinstance(e, Binary):
        a, b = simplify_divmod(e.a, ranges), simplify_divmod(e.b, ranges)
        d = _const_int(b)
        if e.op in ("floordiv", "mod") and d is not None and d > 0 and _is_int_expr(e):
            lin = _linear(a)
            if lin is not None:
                terms, c = lin
                q_terms = [(t, k // d) for t, k in terms if k % d == 0]
                r_terms = [(t, k) for t, k in terms if k % d != 0]
                r_range = term_range(r_terms, c % d, ranges)
                if r_range is not None and 0 <= r_range[0] and r_range[1] < d:
                    if e.op == "floordiv":
                        return _rebuild(q_terms, c // d, e.dtype)
                    return _rebuild(r_terms, c % d, e.dtype)
        if a is not e.a or b is not e.b:
            return Binary(e.op, a, b, e.dtype)
        return e
    if isinstance(e, Unary):
        a = simplify_divmod(e.a, ranges)
        return e if a is e.a else Unary(e.op, a, e.dtype)
    if isinstance(e, Cast):
        a = simplify_divmod(e.a, ranges)
        return e if a is e.a else Cast(e.dtype, a)
    return e
