"""What `build` asks the tuning database: the tuned options of a workload on this target, if any.

    hit = tuned_options(outs, args, "cuda", sizes=None, tuned=None)   # None, or (schedule, build opts, note)

`tuned`: None or True reads `$LOOPIR_TUNING_DB` (the value "off" disables) else ~/.cache/loopir/tuning, when that
directory exists; a str is a database directory; False never reads one. The workload key is taken from the
graph as the user built it (before `sizes=` pins anything), the shape from the pinned or fixed sizes: the best
trial at that shape, else at the nearest tuned shape; a build with sizes left symbolic takes the best trial of
the largest tuned shape. The module's notes say which trial it came from.
"""

from __future__ import annotations

import math
import os
from typing import Any

from schedules.tuning.database import Database, default_path

from .keys import shape_key, target_key, workload_key

__all__ = ["tuned_options", "database_path"]

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


def tuned_options(outs: list[Any], args: list[Any] | None, target: str, sizes: dict[Any, int] | None,
                  tuned: Any) -> tuple[dict[str, Any], dict[str, Any], str] | None:
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
    named = {getattr(k, "name", k): int(v) for k, v in (sizes or {}).items()}
    if _symbolic(args, named):
        shapes = db.shapes(wk, tk)
        if not shapes:
            return None
        shape = max(shapes, key=lambda s: math.prod(int(x) for x in s.split("x")))
        t, how = db.best(wk, tk, shape), f"the largest tuned shape {shape} (sizes symbolic)"
    else:
        shape = shape_key(args, named)
        t = db.nearest(wk, tk, shape)
        how = f"shape {shape}" if t is not None and t.shape == shape else f"the nearest tuned shape to {shape}"
    if t is None or "options" not in t.meta:
        return None
    sched, bopts = t.meta["options"]
    opts = f"schedule options {sched or '{}'}" + (f" and build options {bopts}" if bopts else "")
    note = (f"tuned: {opts} from the tuning database {path}, trial {t.trial} of run "
            f"{t.run} ({t.median * 1e3:.4f} ms at {t.shape}), chosen for {how}")
    return dict(sched), dict(bopts), note
