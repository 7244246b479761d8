"""What `build` asks the tuning database: the tuned options of a workload on this target, if any.

    ctx = tuned_context(outs, args, "cuda", tuned=None)   # None: no database, or nothing tuned for this workload
    tuned_options(ctx, args, sizes)        # (schedule options, build options, note) for the generic build
    bucket_options(ctx, {"n": 1024})       # ... for a call-time variant whose row length n is in the class <= 1024

`tuned`: None or True reads `$LOOPIR_TUNING_DB` (the value "off" disables) else ~/.cache/loopir/tuning, when that
directory exists; a str is a database directory; False never reads one. The workload key is taken from the
graph as the user built it (before `sizes=` pins anything), the shape from the pinned or fixed sizes: the best
trial at that shape, else at the nearest tuned shape; a build with sizes left symbolic takes the best trial of
the largest tuned shape; and each call-time variant (codegen.specialize: a class of row lengths) takes the best
trial of the largest tuned shape in its class, when one is tuned (the shape-bucket dispatch). The module's (and
each variant's) notes say which trial it came from.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

from schedules.tuning.database import Database, default_path, parse_shape

from ..specialize import ROW_CLASSES
from .keys import shape_key, target_key, workload_key

__all__ = ["Tuned", "tuned_context", "tuned_options", "bucket_options", "database_path"]

_dbs: dict[str, Database] = {}
_targets: dict[str, str] = {}


def database_path(tuned: Any) -> str | None:
    if tuned is False:
        return None
    if isinstance(tuned, str):
        return tuned
    env = os.environ.get("LOOPIR_TUNING_DB")
    if env == "off":
        return None
    path = env or default_path()
    return str(path) if os.path.isdir(path) else None


def _symbolic(args: list[Any], sizes: dict[str, int]) -> bool:
    return any(getattr(e, "value", None) is None and getattr(e, "name", None) not in sizes
               for a in args for e in a.shape)


@dataclass
class Tuned:
    """A workload's records in a tuning database: where, its keys, and which position of a shape key holds
    which size variable (a shape key lists every argument's dimensions in order)."""

    path: str
    db: Database
    workload: str
    target: str
    positions: dict[int, str]


def tuned_context(outs: list[Any], args: list[Any] | None, target: str, tuned: Any) -> Tuned | None:
    """The database `tuned` names (see the module doc) when it holds trials of this workload on this target."""
    path = database_path(tuned)
    if path is None or args is None:
        return None
    db = _dbs.get(path)
    if db is None:
        db = _dbs[path] = Database(path)
    db.refresh()
    if not len(db):
        return None
    if target not in _targets:
        _targets[target] = target_key(target)[0]
    wk, tk = workload_key(outs, args), _targets[target]
    if not db.shapes(wk, tk):
        return None
    flat = [e for a in args for e in a.shape]
    positions = {k: e.name for k, e in enumerate(flat) if getattr(e, "value", None) is None and hasattr(e, "name")}
    return Tuned(path, db, wk, tk, positions)


def _options(ctx: Tuned, t: Any, how: str) -> tuple[dict[str, Any], dict[str, Any], str] | None:
    if t is None or "options" not in t.meta:
        return None
    sched, bopts = t.meta["options"]
    opts = f"schedule options {sched or '{}'}" + (f" and build options {bopts}" if bopts else "")
    note = (f"tuned: {opts} from the tuning database {ctx.path}, trial {t.trial} of run "
            f"{t.run} ({t.median * 1e3:.4f} ms at {t.shape}), chosen for {how}")
    return dict(sched), dict(bopts), note


def _area(shape: str) -> int:
    return math.prod(parse_shape(shape) or (0,))


def tuned_options(ctx: Tuned, args: list[Any], sizes: dict[Any, int] | None
                  ) -> tuple[dict[str, Any], dict[str, Any], str] | None:
    """(schedule options, build options, note) of the best trial for a build at `sizes` (pinned sizes): at that
    shape, else the nearest tuned one; sizes left symbolic: the largest tuned shape."""
    named = {getattr(k, "name", k): int(v) for k, v in (sizes or {}).items()}
    if _symbolic(args, named):
        shape = max(ctx.db.shapes(ctx.workload, ctx.target), key=_area)
        return _options(ctx, ctx.db.best(ctx.workload, ctx.target, shape),
                        f"the largest tuned shape {shape} (sizes symbolic)")
    shape = shape_key(args, named)
    t = ctx.db.nearest(ctx.workload, ctx.target, shape)
    how = f"shape {shape}" if t is not None and t.shape == shape else f"the nearest tuned shape to {shape}"
    return _options(ctx, t, how)


def _in_class(value: int, bound: int) -> bool:
    """`value` falls in the row class whose upper bound is `bound` (0: above every class)."""
    if bound == 0:
        return value > ROW_CLASSES[-1]
    lower = max((b for b in ROW_CLASSES if b < bound), default=0)
    return lower < value <= bound


def bucket_options(ctx: Tuned, rows: dict[str, int]) -> tuple[dict[str, Any], str, str] | None:
    """The shape-bucket dispatch: for a call-time variant whose row lengths fall in the classes `rows` (size
    name -> class bound, codegen.specialize), the best trial of the largest tuned shape in those classes:
    (schedule options, note, the trial's identity for the variant's cache key); None when no tuned shape is."""
    fit = []
    for shape in ctx.db.shapes(ctx.workload, ctx.target):
        dims = parse_shape(shape) or ()
        vals = {name: dims[k] for k, name in ctx.positions.items() if k < len(dims)}
        if all(n in vals and _in_class(vals[n], b) for n, b in rows.items()):
            fit.append(shape)
    if not fit:
        return None
    shape = max(fit, key=_area)
    t = ctx.db.best(ctx.workload, ctx.target, shape)
    bucket = ", ".join(f"{n} <= {b}" if b else f"{n} > {ROW_CLASSES[-1]}" for n, b in rows.items())
    hit = _options(ctx, t, f"the row class {bucket} (tuned shape {shape})")
    if hit is None:
        return None
    return hit[0], hit[2], f"{ctx.path}:{t.run}:{t.trial}"
