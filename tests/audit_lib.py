"""The machinery of the bad-input audit (tests/test_audit.py): the case registry and the helpers the
cases share. The cases are in tests/audit_cases.py and tests/audit_cases_more.py."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

CLEAR_TYPES = ("ValueError", "TypeError", "AttributeError", "OverflowError", "IndexError", "ScheduleError",
               "BoundsError", "InexactCheckError", "UnboundLoopError", "NotImplementedError", "MemoryError")


@dataclass(frozen=True)
class Case:
    name: str
    fn: Callable[[], bool]
    names: tuple[str, ...] | None  # words a clear error must name; None: a result is expected
    isolated: bool = False  # may crash the process: run alone


CASES: dict[str, Case] = {}


def case(names: tuple[str, ...] | str | None = None, isolated: bool = False) -> Callable:
    def deco(fn: Callable[[], bool]) -> Callable[[], bool]:
        ns = (names,) if isinstance(names, str) else names
        CASES[fn.__name__] = Case(fn.__name__, fn, ns, isolated)
        return fn

    return deco


R = np.random.default_rng(209)


def rnd(*shape: int, dtype: str = "float32") -> np.ndarray:
    return (R.standard_normal(shape) + 3).astype(dtype)  # never zero


def nan(*shape: int, dtype: str = "float32") -> np.ndarray:
    return np.full(shape, np.nan, dtype)


def chain():
    from loopir import te

    n = te.var("n")
    x = te.placeholder((n,), name="x")
    a = te.compute((n,), lambda i: x[i] * 2.0, name="a")
    y = te.compute((n,), lambda i: a[i] + 1.0, name="y")
    return x, a, y


def sched():
    from schedules import Schedule

    x, a, y = chain()
    return Schedule(y), x, a, y


def cpu_mod():
    from codegen import build

    s, x, a, y = sched()
    return build(s, [x, y])


def one_store(idx, size=8, name="A"):
    from loopir import ir

    A = ir.buffer((size,), name=name)
    b = ir.Builder("p")
    b.store(A, idx, 1.0, name="S")
    return b.finish([A])


def run_cpu(prog, *arrays):
    from codegen import build

    build(prog)(*arrays)
