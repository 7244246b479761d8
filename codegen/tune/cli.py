"""The `loopir` command (`[project.scripts]`); `python -m codegen.tune.cli` is the same.

    loopir tune examples/tune_gemm.py:workload --trials 200 --sizes n=4096,m=4096,p=4096 --target cuda
    loopir tune loopir.workloads:softmax --kwargs m=64,n=256 --target cpu --trials 40 --resume
    loopir tune ... --ray auto        # the Ray back end (pip install loopir[tune]); "ray://host:10001" to join one
    loopir db --db DIR                # what a database holds: per workload and shape, trials and the best
    loopir db --db DIR --export team.jsonl / --import team.jsonl   # share trials (or point --db at a shared dir)

FILE:FUNCTION (a .py path) or MODULE:FUNCTION names a function returning a `loopir.workloads.Workload`, or a
tuple (outputs, args) or (outputs, args, sizes). `--kwargs` are passed to it (ints where they parse).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import pickle
import sys
from typing import Any

from loopir.workloads import Workload
from schedules.tuning.database import Database, default_path

from .executor import LocalExecutor
from .ray_executor import make_executor
from .tuner import autotune

__all__ = ["main", "load_function"]


def _kv(text: str | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for part in filter(None, (text or "").split(",")):
        k, _, v = part.partition("=")
        try:
            out[k.strip()] = int(v)
        except ValueError:
            out[k.strip()] = v.strip()
    return out


def load_function(spec: str) -> Any:
    """The function named by FILE.py:FUNCTION or MODULE:FUNCTION."""
    where, _, name = spec.rpartition(":")
    if not where or not name:
        raise SystemExit(f"loopir tune: expected FILE:FUNCTION or MODULE:FUNCTION, got {spec!r}")
    if where.endswith(".py"):
        if not os.path.exists(where):
            raise SystemExit(f"loopir tune: no file {where!r}")
        m = importlib.util.spec_from_file_location(os.path.splitext(os.path.basename(where))[0], where)
        mod = importlib.util.module_from_spec(m)  # type: ignore[arg-type]
        m.loader.exec_module(mod)  # type: ignore[union-attr]
    elif where in sys.modules:
        mod = sys.modules[where]
    else:  # the user's module, loaded by its spec (as `import` would; the name is only known at run time)
        m = importlib.util.find_spec(where)
        if m is None or m.loader is None:
            raise SystemExit(f"loopir tune: no module {where!r}")
        mod = importlib.util.module_from_spec(m)
        sys.modules[where] = mod
        m.loader.exec_module(mod)
    fn = getattr(mod, name, None)
    if not callable(fn):
        raise SystemExit(f"loopir tune: {where!r} has no function {name!r}")
    return fn


def _picklable(f: Any) -> Any:
    """`f` when tuning workers can receive it, else None (a closure: the untuned build is the reference)."""
    try:
        pickle.dumps(f)
        return f
    except Exception:  # noqa: BLE001
        return None


def _workload(obj: Any, spec: str) -> tuple[list[Any], list[Any], dict[str, int], Any]:
    if isinstance(obj, Workload):
        return list(obj.outputs), list(obj.args), {}, _picklable(obj.reference)
    if isinstance(obj, tuple) and len(obj) in (2, 3):
        return list(obj[0]), list(obj[1]), dict(obj[2]) if len(obj) == 3 else {}, None
    raise SystemExit(f"loopir tune: {spec} must return a Workload or (outputs, args[, sizes]), got "
                     f"{type(obj).__name__}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="loopir")
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("tune", help="tune a workload's schedule")
    t.add_argument("function", help="FILE.py:FUNCTION or MODULE:FUNCTION")
    t.add_argument("--kwargs", help="k=v,... passed to the function")
    t.add_argument("--sizes", help="values of the symbolic sizes, n=4096,...")
    t.add_argument("--target", choices=("cuda", "cpu"))
    t.add_argument("--trials", type=int, default=64)
    t.add_argument("--strategy", choices=("evolutionary", "random"), default="evolutionary")
    t.add_argument("--batch", type=int)
    t.add_argument("--db", help=f"database directory (default {default_path()})")
    t.add_argument("--gpus", type=int, help="GPUs to use (default: all visible)")
    t.add_argument("--ray", metavar="ADDRESS", help="run on Ray: 'local', 'auto' or ray://host:port")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--timeout", type=float, default=120.0)
    t.add_argument("--plot", help="write best time against trials to this PNG")
    g = t.add_mutually_exclusive_group()
    g.add_argument("--resume", dest="resume", action="store_true", default=True,
                   help="continue from the database's trials of this workload and shape (default)")
    g.add_argument("--fresh", dest="resume", action="store_false", help="ignore earlier trials")
    d = sub.add_parser("db", help="summarize a tuning database; export or import its trials")
    d.add_argument("--db")
    d.add_argument("--export", metavar="FILE.jsonl", help="write every trial to this file")
    d.add_argument("--import", dest="import_", metavar="FILE_OR_DIR", help="merge trials from a file or database")
    a = ap.parse_args(argv)
    if a.cmd == "db":
        db = Database(a.db or default_path())
        if a.import_:
            print(f"imported {db.import_(a.import_)} trials from {a.import_}")
        if a.export:
            print(f"exported {db.export(a.export)} trials to {a.export}")
        print(repr(db))
        for t_ in sorted({(x.workload, x.target, x.shape) for x in db.trials()}):
            best = db.best(*t_)
            n = len(db.trials(*t_))
            print(f"  {t_[0][:12]} {t_[1][:8]} {t_[2]}: {n} trials, best "
                  + (f"{best.median * 1e3:.4f} ms (trial {best.trial}, run {best.run})" if best else "none"))
        return 0
    sys.path.insert(0, os.getcwd())
    fn, kwargs = load_function(a.function), _kv(a.kwargs)
    try:
        made = fn(**kwargs)
    except TypeError as e:  # the arguments do not fit the function: say which call
        raise SystemExit(f"loopir tune: calling {a.function} with {kwargs or 'no arguments'} failed: {e}") from e
    outs, args, sizes, ref = _workload(made, a.function)
    sizes.update(_kv(a.sizes))
    gpus = list(range(a.gpus)) if a.gpus is not None else None
    ex = (make_executor("ray", address=None if a.ray == "local" else a.ray, devices=a.gpus) if a.ray
          else LocalExecutor(devices=gpus if a.target != "cpu" else []))
    try:
        res = autotune(outs, args, a.target, sizes=sizes, trials=a.trials, strategy=a.strategy, batch=a.batch,
                       db=a.db, executor=ex, seed=a.seed, resume=a.resume, plot=a.plot, timeout=a.timeout,
                       reference=ref)
    finally:
        ex.close()
    print(res.explain())
    return 0


if __name__ == "__main__":
    sys.exit(main())
