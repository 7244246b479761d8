"""The registered primitives are real methods of Schedule (dir(), help(), inspect, IDEs), and every
primitive's docstring states its precondition and shows the nest before and after."""

from __future__ import annotations

import ast
import inspect
import os
import pydoc
import re

import pytest

from loopir import te
from schedules import Schedule
from schedules.primitives import REGISTRY, primitive

NAMES = sorted(REGISTRY)


def test_every_primitive_is_a_method():
    assert "split" in dir(Schedule)
    for name in NAMES:
        assert name in dir(Schedule), name
        assert inspect.isfunction(Schedule.__dict__[name]), name


def test_signature_names_the_parameters():
    sig = inspect.signature(Schedule.split)
    assert list(sig.parameters) == ["self", "loop", "factor", "nparts", "tail"]
    assert list(inspect.signature(Schedule.tile).parameters) == ["self", "i", "j", "ti", "tj"]
    assert inspect.signature(Schedule.reorder).parameters["loops"].kind is inspect.Parameter.VAR_POSITIONAL
    assert "LoopHandle" in str(sig.parameters["loop"].annotation)


@pytest.mark.parametrize("name", NAMES)
def test_method_doc_is_the_primitives(name):
    assert getattr(Schedule, name).__doc__ == REGISTRY[name].fn.__doc__
    assert getattr(Schedule, name).__name__ == name


def test_split_doc():
    assert Schedule.split.__doc__ == REGISTRY["split"].fn.__doc__ and "factor" in Schedule.split.__doc__


def test_help_lists_the_primitives():
    text = pydoc.render_doc(Schedule, renderer=pydoc.plaintext)
    for name in NAMES:
        assert f"{name}(self" in text, name
    assert "Precondition" in text


def test_methods_run_the_checked_primitive():
    n = te.var("n")
    x = te.placeholder((n,), dtype="float32", name="x")
    y = te.compute((n,), lambda i: x[i] * 2.0, name="y")
    s = Schedule(y)
    (i,) = s.loops(y)
    io, ii = Schedule.split(s, i, 4)
    assert s.trace[-1]["primitive"] == "split"
    assert s.parallel(io) is s


def test_a_later_registration_is_still_reachable():
    @primitive("test_late_prim", check=None)
    def late(program):
        """Nothing. Precondition: none::

            for i ...: S(i)   ->   for i ...: S(i)
        """
        return program

    try:
        n = te.var("n")
        x = te.placeholder((n,), dtype="float32", name="x")
        y = te.compute((n,), lambda i: x[i] + 1.0, name="y")
        s = Schedule(y)
        assert s.test_late_prim() is s and "test_late_prim" in dir(s)
    finally:
        REGISTRY.pop("test_late_prim")


def _stubs() -> dict[str, ast.FunctionDef]:
    """The declarations for type checkers: the defs under `if TYPE_CHECKING:` in class Schedule."""
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "schedules", "schedule.py")
    with open(path) as fh:
        tree = ast.parse(fh.read())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Schedule")
    block = next(n for n in cls.body if isinstance(n, ast.If) and getattr(n.test, "id", "") == "TYPE_CHECKING")
    return {f.name: f for f in block.body if isinstance(f, ast.FunctionDef)}


def test_type_checker_declarations_match_the_registry():
    stubs = _stubs()
    assert sorted(stubs) == [n for n in NAMES if not n.startswith("test_")], "declare each primitive once"
    for name, f in stubs.items():
        declared = [a.arg for a in f.args.args] + ([f"*{f.args.vararg.arg}"] if f.args.vararg else [])
        sig = inspect.signature(getattr(Schedule, name))
        real = [("*" if p.kind is p.VAR_POSITIONAL else "") + p.name for p in sig.parameters.values()]
        assert declared == real, f"{name}: declared {declared}, registered {real}"
        defaults = [ast.literal_eval(d) for d in f.args.defaults]
        assert defaults == [p.default for p in sig.parameters.values() if p.default is not p.empty], name


# a line of a nest example: the nest before, an arrow set apart by spaces, the nest after
_EXAMPLE = re.compile(r"\S\s{2,}(->|==>)\s{2,}\S")


@pytest.mark.parametrize("name", NAMES)
def test_docstring_has_precondition_and_example(name):
    doc = REGISTRY[name].fn.__doc__ or ""
    assert "precondition" in doc.lower(), f"{name}: the docstring states no precondition"
    assert "for " in doc and any(_EXAMPLE.search(line) for line in doc.splitlines()), \
        f"{name}: the docstring shows no nest before -> after (loops, and '->' or '==>' between two columns)"
