"""Every seed workload, lowered (or built) with symbolic sizes, runs correctly through the
reference interpreter at two different sizes, against numpy on fresh random data."""

from __future__ import annotations

import numpy as np
import pytest

from loopir import workloads
from loopir.nodes import Var

interp = pytest.importorskip("loopir.interp")

# two size assignments per workload: small (the interpreter is slow) and unequal per dimension
SIZES: dict[str, list[dict[str, int]]] = {
    "sincos": [{"n": 7}, {"n": 13}],
    "gelu": [{"n": 7}, {"n": 13}],
    "horizontal": [{"n": 7}, {"n": 13}],
    "softmax": [{"m": 3, "n": 7}, {"m": 5, "n": 13}],
    "layernorm": [{"m": 3, "n": 7}, {"m": 5, "n": 13}],
    "matmul_bias_relu": [{"n": 3, "m": 5, "p": 7}, {"n": 6, "m": 4, "p": 9}],
    "attention": [{"n": 3, "m": 5, "d": 4}, {"n": 5, "m": 7, "d": 6}],
    "stencil5": [{"n": 5, "m": 7}, {"n": 9, "m": 6}],
    "prefix_sum": [{"n": 7}, {"n": 13}],
}


def test_every_seed_has_sizes() -> None:
    assert set(SIZES) == set(workloads.SEEDS)


@pytest.mark.parametrize("name", sorted(workloads.SEEDS))
def test_seed_runs_at_two_sizes(name: str) -> None:
    w = workloads.SEEDS[name]()
    prog = w.program()
    assert prog.params and all(isinstance(v, Var) for v in prog.params)  # sizes stay symbolic
    assert {v.name for v in prog.params} == set(SIZES[name][0])
    for seed, sizes in enumerate(SIZES[name]):
        rng = np.random.default_rng(1000 + seed)
        ins = w.random_inputs(sizes, rng)
        assert all(np.all(a != 0) for a in ins)
        expected = w.reference(*(a.copy() for a in ins))
        outs = w.empty_outputs(sizes)
        arrays = w.call_args(ins, outs)
        interp.run(prog, *arrays)
        got = ins if w.in_place else outs
        assert len(got) == len(expected)
        for o, g, e in zip(w.outputs, got, expected):
            assert g.dtype == e.dtype == np.dtype(o.dtype)
            assert g.shape == e.shape == w.shape_of(o, sizes)
            assert not np.isnan(g).any(), f"{name}: {o.name} has unwritten elements at {sizes}"
            np.testing.assert_allclose(g, e, rtol=w.tolerance, atol=w.tolerance, err_msg=f"{name} {o.name} {sizes}")


def test_seed_with_concrete_sizes() -> None:
    w = workloads.softmax(4, 6)
    prog = w.program()
    assert prog.params == ()
    x = w.random_inputs({}, 7)[0]
    (y,) = w.empty_outputs({})
    interp.run(prog, x, y)
    np.testing.assert_allclose(y, w.reference(x)[0], rtol=1e-5, atol=1e-6)


def test_reference_is_not_trivially_satisfied() -> None:
    # the comparison can fail: the reference of slightly different inputs is refused by the same check
    w = workloads.matmul_bias_relu()
    sizes = {"n": 3, "m": 4, "p": 5}
    ins = w.random_inputs(sizes, 3)
    outs = w.empty_outputs(sizes)
    interp.run(w.program(), *w.call_args(ins, outs))
    wrong = w.reference(ins[0], ins[1] * 1.01, ins[2])[0]
    assert not np.allclose(outs[0], wrong, rtol=w.tolerance, atol=w.tolerance)
