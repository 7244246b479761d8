"""Checking a step on the one loop nest it changed (the fast path of `Schedule`'s legality checks).

A program is a sequence of top-level nests run one after the other. A step that replaces a run of nests K
(one nest, or several neighbours: a GEMM and its epilogue) by K' and leaves every nest before and after
the same object keeps the order of every pair of instances that are not both in K: K' still runs after
the nests before and before the nests after. So the step is legal iff it is legal for the program that is
K alone, where a buffer K shares with another nest (or the caller) is an argument of that program (read:
its values come from outside; written: they are live after K) and a temporary only K touches stays a
temporary.

The dependences of K are those of its *base*: K as it was when a step last changed its statements (a
rebase, as for the whole program) or when a step first touched it; every later step on K is checked
against them, exactly as `Schedule` checks steps against the whole original program. The bases are keyed
by the set of statement names in the run (unique in a program). A step that changes the whole program is
checked on the whole program and drops every base, since it may have changed the accesses of statements a
base describes.

Only acceptance takes this path: a step the nest check refuses (or cannot decide) is checked again on the
whole program, so refusals, witnesses and messages are those of the whole program. The nest check may accept
a step the whole program's check could not decide: when another nest is not affine (a collapse of symbolic
extents), the whole program's analysis over-approximates and refuses as inexact; the nest alone is exact.
"""

from __future__ import annotations

from dataclasses import replace

from loopir import poly
from loopir.nodes import Allocate, Buffer, Load, Program, Seq, Stmt, Store
from loopir.visit import walk, walk_stmts

__all__ = ["NestBases", "changed_nest", "common_ends", "nest_local", "nest_program"]

ENABLED = True  # False: every step is checked on the whole program (tests/test_nest_scope.py compares both)

# the steps whose checks look at nothing but the instances, accesses and loops of the nests they change. Not
# here: a split with tail="round_up" (it writes elements past the extent: its check asks whether another nest
# reads them), the storage steps (whether other nests read a buffer decides its scope), compute_at, rfactor,
# cache_row, online_softmax (each with a check of its own over the whole program)
NEST_LOCAL = frozenset({"split", "tile", "reorder", "collapse", "skew", "fuse", "unroll", "vectorize", "parallel",
                        "bind", "vthread", "pragma", "bind_reduction", "cache_read", "cache_write", "compute_inline",
                        "sink_guard"})


def nest_local(name: str, rebase: bool) -> bool:
    """Whether step `name` may be checked on the nests it changes alone (`rebase`: this application of it
    changes the instances or accesses; for split, only its round_up tail does)."""
    return name in NEST_LOCAL and not (name == "split" and rebase)


def _top(p: Program) -> tuple[Stmt, ...]:
    return p.body.body if isinstance(p.body, Seq) else (p.body,)


def common_ends(a: tuple[Stmt, ...], b: tuple[Stmt, ...]) -> tuple[int, int]:
    """(lo, hi): a[:lo] and b[:lo] are the same objects, and so are their last hi elements (not overlapping)."""
    lo = 0
    while lo < min(len(a), len(b)) and a[lo] is b[lo]:
        lo += 1
    hi = 0
    while hi < min(len(a), len(b)) - lo and a[len(a) - 1 - hi] is b[len(b) - 1 - hi]:
        hi += 1
    return lo, hi


def changed_nest(old: Program, new: Program) -> tuple[int, int, int] | None:
    """(lo, hi_old, hi_new): the nests old[lo:hi_old] are what the step replaced by new[lo:hi_new], every nest
    before and after them the same object in both (same arguments); None when that run is the whole program."""
    a, b = _top(old), _top(new)
    if old.args != new.args:
        return None
    lo, hi = common_ends(a, b)
    if lo + hi == 0 or lo == len(a) == len(b):
        return None
    return lo, len(a) - hi, len(b) - hi


class _Uses:
    """The buffers each nest object touches (nests are immutable: cached by identity, the object kept alive)."""

    def __init__(self) -> None:
        self._memo: dict[int, tuple[Stmt, frozenset[Buffer]]] = {}

    def __call__(self, nest: Stmt) -> frozenset[Buffer]:
        hit = self._memo.get(id(nest))
        if hit is not None and hit[0] is nest:
            return hit[1]
        local = {n.buffer for n in walk_stmts(nest) if isinstance(n, Allocate)}
        out = frozenset(n.buffer for n in walk(nest) if isinstance(n, (Load, Store)) and n.buffer not in local)
        if len(self._memo) > 4096:
            self._memo.clear()
        self._memo[id(nest)] = (nest, out)
        return out


def nest_program(p: Program, lo: int, hi: int, uses: _Uses) -> Program | None:
    """The nests p[lo:hi] as a program of their own (see the module doc); None when there are none."""
    nests = _top(p)
    if hi <= lo:
        return None
    mine: set[Buffer] = set()
    for n in nests[lo:hi]:
        mine |= uses(n)
    others: set[Buffer] = set(p.args)
    for n in nests[:lo] + nests[hi:]:
        others |= uses(n)
    args = tuple(b for b in (*p.args, *p.temps) if b in mine and b in others)
    temps = tuple(t for t in p.temps if t in mine and t not in others)
    body = nests[lo] if hi == lo + 1 else Seq(nests[lo:hi])
    return replace(p, args=args, temps=temps, body=body)


def _key(p: Program) -> frozenset[str]:
    return frozenset(st.name for st in walk_stmts(p.body) if isinstance(st, Store))


class NestBases:
    """The base of each nest (the program it was, its dependences computed at first use)."""

    def __init__(self) -> None:
        self._bases: dict[frozenset[str], list] = {}
        self.uses = _Uses()

    def clear(self) -> None:
        self._bases.clear()

    def base(self, nest: Program) -> list:
        """[base program, its dependences or None] of the nest program `nest` (it becomes the base if none)."""
        return self._bases.setdefault(_key(nest), [nest, None])

    def after(self, old: Program, new: Program, rebase: bool) -> None:
        """Record an accepted step on the run old -> new: a base that shares statements with the run and is not
        the run's own unchanged base is dropped (the step may have changed their accesses: compute_inline keeps
        the consumer's statement names), and after a rebase the new run is its own base."""
        ko, kn = _key(old), _key(new)
        if ko == kn and not rebase:
            return
        for k in [k for k in self._bases if k & (ko | kn)]:
            del self._bases[k]
        if rebase:
            self._bases[kn] = [new, None]

    @staticmethod
    def deps(base: list) -> poly.Deps:
        if base[1] is None:
            base[1] = poly.dependences(base[0])
        return base[1]
