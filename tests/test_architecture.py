"""The import structure of the project, read from the source with `ast` (nothing is imported).

Rules, for the modules of the three packages (`loopir`, `schedules`, `codegen`):

- layers: `loopir` imports neither `schedules` nor `codegen`; `schedules` does not import
  `codegen` (every import counts: module level, inside functions, under TYPE_CHECKING);
- no import circle between project modules (imports that run when a module loads: module level,
  outside `if TYPE_CHECKING:`; a package's `__init__` is not counted as imported by its submodules,
  as Python has already started it when a submodule runs);
- renderers import no passes-level analysis: the modules of `RENDERERS` (the code generators of
  `codegen/cuda/` and `codegen/llvm/`) never import `codegen.passes` (every import counts); what they
  print was decided by the pipeline and recorded in the IR. The targets' `build` and runtimes may;
- no lazy import of a project module (an `import` inside a function, or `importlib.import_module`);
  except the entries of `LAZY_ALLOWED`, each with its reason: that list is meant to shrink to nothing.

And for every project .py file (the packages, tests, examples, benchmarks): at most `MAX_LINES`
lines, except the files in `LONG_ALLOWED`.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Iterator

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("loopir", "schedules", "codegen")
OTHER_DIRS = ("tests", "examples", "benchmarks")
MAX_LINES = 850

# (file, project module it imports lazily): why it is still lazy. Empty, and meant to stay so: per-target
# loading needs no lazy project import (codegen.llvm imports llvmlite and codegen.cuda.runtime the CUDA driver
# inside the functions that use them, so `import codegen` loads neither); `loopir` imports its submodules at
# the top (`python -X importtime -c "import loopir"`: ~4 ms with PEP 562 lazy submodules, ~200 ms eager, what
# numpy and islpy cost, which every use pays); str() of a node reaches the printer through the table
# `loopir.nodes.PRINTERS` that `loopir.printer` fills; interp's compiler is `loopir.interp_compile`, which both
# the interpreter and its GPU mode import.
LAZY_ALLOWED: dict[tuple[str, str], str] = {}

# the code generators proper: they render the lowered IR and decide nothing the pipeline should decide
RENDERERS = tuple(f"codegen.cuda.{m}" for m in ("kernel", "expr", "reduce", "staging", "vector", "prelude")) + tuple(
    f"codegen.llvm.{m}" for m in ("emit", "vec", "queries", "types", "math", "expr"))

# files allowed over MAX_LINES, with their size when listed. None today (schedules/fusion.py is ~680 lines since the
# plan's data and report went to schedules/fusion_plan.py).
LONG_ALLOWED: dict[str, str] = {}


# ----------------------------------------------------------------------------- reading the tree


def _files(dirs: tuple[str, ...]) -> Iterator[str]:
    for top in dirs:
        for d, subdirs, fs in os.walk(os.path.join(ROOT, top)):
            subdirs[:] = sorted(x for x in subdirs if not x.startswith((".", "__pycache__")))
            for f in sorted(fs):
                if f.endswith(".py"):
                    yield os.path.relpath(os.path.join(d, f), ROOT).replace(os.sep, "/")


def _module(rel: str) -> str:
    parts = rel[:-3].split("/")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module(f): f for f in _files(PACKAGES)}


def _is_project(name: str) -> bool:
    return name.split(".")[0] in PACKAGES


def _targets(node: ast.Import | ast.ImportFrom, mod: str, is_pkg: bool) -> list[str]:
    """The project modules an import statement loads (a `from X import y` names X.y when y is a module)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if _is_project(a.name)]
    if node.level:
        base = mod.split(".") if is_pkg else mod.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        name = ".".join(base + ([node.module] if node.module else []))
    else:
        name = node.module or ""
    if not _is_project(name):
        return []
    subs = [f"{name}.{a.name}" for a in node.names if f"{name}.{a.name}" in MODULES]
    plain = [a for a in node.names if f"{name}.{a.name}" not in MODULES]
    return subs + ([name] if plain or not subs else [])


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


class _Imports(ast.NodeVisitor):
    """Each project import of one module: (target, where) with where in "module", "lazy", "typing"."""

    def __init__(self, mod: str, is_pkg: bool) -> None:
        self.mod, self.is_pkg = mod, is_pkg
        self.found: list[tuple[str, str, int]] = []
        self._fn = 0
        self._typing = 0

    def _where(self) -> str:
        return "lazy" if self._fn else "typing" if self._typing else "module"

    def visit_FunctionDef(self, node: ast.AST) -> None:
        self._fn += 1
        self.generic_visit(node)
        self._fn -= 1

    visit_AsyncFunctionDef = visit_Lambda = visit_FunctionDef

    def visit_If(self, node: ast.If) -> None:
        if _is_type_checking(node.test):
            self._typing += 1
            for s in node.body:
                self.visit(s)
            self._typing -= 1
            for s in node.orelse:
                self.visit(s)
        else:
            self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        self.found += [(t, self._where(), node.lineno) for t in _targets(node, self.mod, self.is_pkg)]

    visit_ImportFrom = visit_Import  # type: ignore[assignment]

    def visit_Call(self, node: ast.Call) -> None:
        f = node.func
        name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
        if name in ("import_module", "__import__"):
            self.found.append(("<importlib>", "lazy", node.lineno))
        self.generic_visit(node)


def _imports() -> dict[str, list[tuple[str, str, int]]]:
    out = {}
    for mod, rel in MODULES.items():
        with open(os.path.join(ROOT, rel)) as fh:
            tree = ast.parse(fh.read(), rel)
        v = _Imports(mod, rel.endswith("__init__.py"))
        v.visit(tree)
        out[mod] = v.found
    return out


IMPORTS = _imports()


# ----------------------------------------------------------------------------- the rules


def test_the_tree_is_read():
    assert {"loopir.nodes", "schedules.schedule", "codegen.build", "schedules.recipes.gemm"} <= set(MODULES)
    assert ("schedules.auto", "module") in {(t, w) for t, w, _ in IMPORTS["codegen.build"]}


def test_layers():
    below = {"loopir": ("schedules", "codegen"), "schedules": ("codegen",), "codegen": ()}
    bad = [f"{MODULES[m]}:{line} imports {t}" for m, found in IMPORTS.items() for t, _, line in found
           if t.split(".")[0] in below[m.split(".")[0]]]
    assert not bad, "the layers are loopir <- schedules <- codegen:\n" + "\n".join(bad)


def test_renderers_import_no_passes():
    assert set(RENDERERS) <= set(MODULES), sorted(set(RENDERERS) - set(MODULES))
    bad = [f"{MODULES[m]}:{line} imports {t}" for m in RENDERERS for t, _, line in IMPORTS[m]
           if t == "codegen.passes" or t.startswith("codegen.passes.")]
    assert not bad, "a renderer reads the decisions recorded in the IR, not the passes:\n" + "\n".join(bad)


def test_no_import_circle():
    graph = {m: sorted({t for t, w, _ in found if w == "module" and t in MODULES and t != m})
             for m, found in IMPORTS.items()}
    cycles = [c for c in _sccs(graph) if len(c) > 1]
    assert not cycles, "import circles:\n" + "\n".join(" <-> ".join(sorted(c)) for c in cycles)


def test_no_lazy_import_of_project_modules():
    lazy = {(MODULES[m], t): line for m, found in IMPORTS.items() for t, w, line in found if w == "lazy"}
    bad = [f"{f}:{line} imports {t} inside a function" for (f, t), line in sorted(lazy.items())
           if (f, t) not in LAZY_ALLOWED]
    assert not bad, "import project modules at the top of the file:\n" + "\n".join(bad)
    stale = sorted(k for k in LAZY_ALLOWED if k not in lazy)
    assert not stale, f"LAZY_ALLOWED lists imports that are no longer lazy (remove them): {stale}"
    assert not LAZY_ALLOWED, "no lazy import of a project module is allowed: move it to the top of its file"


def test_file_size():
    sizes = {}
    for rel in _files(PACKAGES + OTHER_DIRS):
        with open(os.path.join(ROOT, rel)) as fh:
            sizes[rel] = sum(1 for _ in fh)
    bad = [f"{f}: {n} lines" for f, n in sorted(sizes.items()) if n > MAX_LINES and f not in LONG_ALLOWED]
    assert not bad, f"files over {MAX_LINES} lines (split them):\n" + "\n".join(bad)
    stale = [f for f in LONG_ALLOWED if sizes.get(f, 0) <= MAX_LINES]
    assert not stale, f"LONG_ALLOWED lists files that are short enough now (remove them): {stale}"


BARE = ("ValueError", "TypeError")


def test_no_bare_value_or_type_error():
    # every failure the packages raise on purpose is a class of the tree in loopir/errors.py (each also the built-in
    # it replaced), so a caller can catch "not found" apart from "bad argument"; re-raising a caught one is fine
    bad = []
    for rel in _files(PACKAGES):
        with open(os.path.join(ROOT, rel)) as fh:
            tree = ast.parse(fh.read(), rel)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Raise) or node.exc is None:
                continue
            exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            if isinstance(exc, ast.Name) and exc.id in BARE:
                bad.append(f"{rel}:{node.lineno} raises {exc.id}")
    assert not bad, "raise a class of loopir/errors.py (ArgumentError, NotFoundError, ...):\n" + "\n".join(bad)


def test_bare_raise_check_can_fail():
    tree = ast.parse("def f(x):\n    if x:\n        raise ValueError('no')\n    raise TypeError\n")
    found = [n for n in ast.walk(tree) if isinstance(n, ast.Raise)
             and getattr(getattr(n.exc, "func", n.exc), "id", None) in BARE]
    assert len(found) == 2


def _sccs(graph: dict[str, list[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components (iterative: the graph is small, recursion is not the issue)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(graph[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(graph[w])))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                out.append(comp)
    return out
