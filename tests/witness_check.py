"""verify_witness: check a ScheduleError's witness independently of loopir.poly.

(a) The access functions, evaluated at the witness, touch the same element of `err.buffer`
    with the right kinds (flow: source writes, sink reads; anti: source reads, sink writes;
    output: both write).
(b) Running the programs in the reference interpreter at the witness sizes: the original
    program runs both instances, source first; the new program runs the sink first. Loops
    marked parallel / vectorize / GPU-bound may run their iterations in any order, so the new
    program is run in several orders they allow — all forward, all reversed, and each one alone
    reversed — and the dependence must break in at least one of them (one legal execution of
    the new program that computes something else is enough to make the step illegal).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from loopir import interp
from loopir.nodes import Const, Expr, For, Load, Program, Store, Var
from loopir.visit import Transformer, walk

__all__ = ["verify_witness", "reverse_concurrent_loops", "concurrent_orders", "eval_int"]


def eval_int(e: Expr, env: dict[str, int]) -> int:
    """An integer index expression evaluated with variables looked up by NAME."""
    from loopir.nodes import Binary, Cast, Unary

    if isinstance(e, Const):
        return int(e.value)
    if isinstance(e, Var):
        return env[e.name]
    if isinstance(e, Cast):
        return eval_int(e.a, env)
    if isinstance(e, Unary) and e.op == "neg":
        return -eval_int(e.a, env)
    if isinstance(e, Binary):
        a, b = eval_int(e.a, env), eval_int(e.b, env)
        return {"add": a + b, "sub": a - b, "mul": a * b, "max": max(a, b), "min": min(a, b),
                "floordiv": a // b if b else 0, "mod": a % b if b else 0}[e.op]
    raise ValueError(f"not an integer index expression: {e!r}")


def _store(program: Program, name: str) -> Store:
    for n in walk(program.body):
        if isinstance(n, Store) and n.name == name:
            return n
    raise AssertionError(f"witness names statement {name!r}, which the original program does not have")


def _accesses(st: Store, kind: str) -> list[tuple[str, tuple[Expr, ...]]]:
    if kind == "write":
        return [(st.buffer.name, st.indices)]
    return [(n.buffer.name, n.indices) for n in walk(st.value) if isinstance(n, Load)]


_CONCURRENT = ("parallel", "vectorize", "thread")


def reverse_concurrent_loops(program: Program, only: Var | None = None) -> Program:
    """`program` with every parallel / vectorize / thread loop (or just the loop `only`) iterating
    backwards, the others forwards; all serial afterwards."""
    from schedules.primitives import subst_loops

    class _R(Transformer):
        def visit_For(self, f: For) -> For:
            body = self.visit(f.body)
            if f.kind not in _CONCURRENT:
                return f if body is f.body else dataclasses.replace(f, body=body)
            if only is not None and f.var is not only:
                return dataclasses.replace(f, body=body, kind="serial", thread=None)
            v = Var(f.var.name + "_rev")
            body = subst_loops(body, {f.var: f.lo + f.hi - 1 - v})
            return dataclasses.replace(f, var=v, body=body, kind="serial", thread=None)

        def visit(self, node: Any) -> Any:
            return node if isinstance(node, Expr) else super().visit(node)

    return dataclasses.replace(program, body=_R().visit(program.body))


def concurrent_orders(program: Program) -> list[Program]:
    """Serial versions of `program` in orders its concurrent loops allow: all forward, all
    reversed, and (with several concurrent loops) each one alone reversed."""
    conc = [n.var for n in walk(program.body) if isinstance(n, For) and n.kind in _CONCURRENT]
    if not conc:
        return [program]
    forward = reverse_concurrent_loops(program, only=Var("__none__"))
    out = [forward, reverse_concurrent_loops(program)]
    if len(conc) > 1:
        out += [reverse_concurrent_loops(program, only=v) for v in conc]
    return out


def _run_trace(program: Program, params: dict[str, int], seed: int = 0) -> list[tuple[str, tuple[int, ...]]]:
    rng = np.random.default_rng(seed)
    arrays = []
    for b in program.args:
        shape = tuple(eval_int(s, params) for s in b.shape)
        if b.dtype.startswith("float"):
            arrays.append(rng.standard_normal(shape).astype(b.dtype))
        elif b.dtype == "bool":
            arrays.append(rng.integers(0, 2, shape).astype(bool))
        else:
            arrays.append(rng.integers(0, 2, shape).astype(b.dtype))
    trace: list[tuple[str, tuple[int, ...]]] = []
    sizes = {p.name: params[p.name] for p in program.params if p.name in params}
    interp.run(program, *arrays, trace=trace, sizes=sizes)
    return trace


def _positions(trace: list[tuple[str, tuple[int, ...]]], inst: tuple[str, tuple[int, ...]]) -> list[int]:
    return [k for k, t in enumerate(trace) if t == inst]


def verify_witness(original: Program, new: Program, err: Any) -> None:
    """Assert that `err` (a ScheduleError) names a real dependence that `new` breaks."""
    assert err.kind in ("flow", "anti", "output"), f"unknown dependence kind {err.kind!r}"
    src_name, src_it = err.source
    snk_name, snk_it = err.sink
    src, snk = _store(original, src_name), _store(original, snk_name)
    assert set(src_it) == {v.name for v in src.iters}, f"source iterators {src_it} vs {[v.name for v in src.iters]}"
    assert set(snk_it) == {v.name for v in snk.iters}, f"sink iterators {snk_it} vs {[v.name for v in snk.iters]}"
    params = {k: int(v) for k, v in err.params.items()}

    # (a) the two instances touch one element of err.buffer, with the right access kinds
    kinds = {"flow": ("write", "read"), "anti": ("read", "write"), "output": ("write", "write")}[err.kind]
    env_src, env_snk = {**params, **src_it}, {**params, **snk_it}
    hits = []
    for bs, ixs in _accesses(src, kinds[0]):
        for bk, ixk in _accesses(snk, kinds[1]):
            if bs != err.buffer or bk != err.buffer:
                continue
            es = tuple(eval_int(i, env_src) for i in ixs)
            ek = tuple(eval_int(i, env_snk) for i in ixk)
            if es == ek:
                hits.append(es)
    assert hits, (f"{err.kind} witness on {err.buffer}: {src_name}{src_it} ({kinds[0]}) and "
                  f"{snk_name}{snk_it} ({kinds[1]}) do not touch one element of {err.buffer}")
    if err.element is not None:
        assert tuple(err.element) in hits, f"reported element {err.element} is not where they meet ({hits})"

    # (b) the original runs source before sink; the new program does not
    key_src = (src_name, tuple(int(src_it[v.name]) for v in src.iters))
    key_snk = (snk_name, tuple(int(snk_it[v.name]) for v in snk.iters))
    t_old = _run_trace(original, params)
    ps, pk = _positions(t_old, key_src), _positions(t_old, key_snk)
    assert ps, f"the original program never runs the source {key_src} at {params}"
    assert pk, f"the original program never runs the sink {key_snk} at {params}"
    assert ps[0] < pk[0], f"the original program runs the sink {key_snk} before the source {key_src}"
    orders = concurrent_orders(new)
    for variant in orders:
        t_new = _run_trace(variant, params)
        ns, nk = _positions(t_new, key_src), _positions(t_new, key_snk)
        assert ns and nk, f"the new program does not run both instances at {params} ({len(ns)}, {len(nk)} times)"
        if {"flow": nk[0] < ns[0], "anti": ns[-1] > nk[0], "output": ns[-1] > nk[-1]}[err.kind]:
            return
    raise AssertionError(f"the new program still runs {key_src} before {key_snk} at {params} in every order "
                         f"its concurrent loops allow ({len(orders)} tried): the witness does not show a "
                         "broken dependence")


def refused_step(s: Any, name: str, *args: Any) -> Any:
    """Apply step `name` to Schedule `s`, which must refuse it (a ScheduleError naming `name`) and stay unchanged;
    check the witness against the program the step would have made (or, where the error says the conflict was
    found in a program the step rebuilt, against that one). Returns the error."""
    import pytest

    from schedules import ScheduleError
    from schedules.primitives import REGISTRY

    before, original = s.program, s.original
    with pytest.raises(ScheduleError) as info:
        s.apply(name, *args)
    err = info.value
    assert s.program is before, f"a refused {name} changed the schedule"
    assert err.primitive == name
    if err.analysed is not None and err.analysed is not original:
        verify_witness(err.analysed, err.analysed, err)  # found in the program the step rebuilt
    else:
        out = REGISTRY[name].fn(before, *(s._resolve(a, name) for a in args))
        verify_witness(original, out if isinstance(out, Program) else out[0], err)
    return err
