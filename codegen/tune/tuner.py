"""`autotune`: a checked search over schedules, journaled trial by trial.

    res = autotune([C], [A, B, bias, C], target="cuda", sizes={"n": 4096, "m": 4096, "p": 4096}, trials=200)
    print(res.explain())            # best vs the untuned rules, how many trials, where it is stored
    mod = build([C], [A, B, bias, C], target="cuda")   # later, any process: the tuned configuration is used

The loop: the search space is the rules' own decisions (`schedules.tuning.space`); the untuned configuration is
measured first (the baseline to beat); the strategy (`schedules.tuning.search`: evolutionary with a learned cost
model, or random) proposes a batch of unseen, valid candidates whenever a build worker is free and none is
queued, having observed every result so far. Builds and runs are one pipeline (`codegen.tune.feed`): a built
candidate goes to the next free device worker at once (`codegen.tune.executor`: one long-lived worker per GPU, a
watchdog), so no device waits for a batch's slowest build. Every finished trial, failed ones included, is
appended to the database's journal at once (`schedules.tuning.database`), so a tuning process killed at any
point loses no completed trial and a rerun (`resume=True`) measures none twice: it warm-starts the strategy from
the journal and continues to `trials`.
"""

from __future__ import annotations

import functools
import os
import pickle
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from loopir.errors import ArgumentError, ArgumentTypeError
from loopir.lower import lower
from loopir.subst import stages_of
from loopir.te import Tensor
from schedules.tuning.database import Database, default_path
from schedules.tuning.record import Config, Trial, config_key
from schedules.tuning.search import history_from_trials, make_strategy
from schedules.tuning.space import options, space_for

from ..cuda.runtime import gpu_available
from .executor import Executor, LocalExecutor
from .feed import Feed
from .keys import shape_key, target_key, workload_key
from .measure import TimingPolicy
from .progress import Progress, plot_png
from .task import Job, WrongResult, build_candidate, measure_candidate

__all__ = ["autotune", "TuneResult"]


@dataclass
class TuneResult:
    """What a tuning run found: the best trial and the untuned one at this shape (from this run or earlier ones
    in the database), this run's trials, and where they are stored."""

    workload: str
    target: str
    shape: str
    best: Trial | None
    default: Trial | None
    trials: list[Trial] = field(default_factory=list)
    resumed: int = 0
    seconds: float = 0.0
    db: str = ""
    pruned: int = 0

    @property
    def speedup(self) -> float:
        """Untuned median / best median (1.0 when either is missing)."""
        if self.best is None or self.default is None or not self.default.ok:
            return 1.0
        return self.default.median / self.best.median

    def explain(self) -> str:
        ok = sum(t.ok for t in self.trials)
        lines = [f"autotune {self.shape} ({self.target[:8]}): {len(self.trials)} trials this run ({ok} ok), "
                 f"{self.resumed} resumed from {self.db}, {self.seconds:.1f} s"]
        if self.default is not None and self.default.ok:
            lines.append(f"  untuned rules: {self.default.median * 1e3:.4f} ms")
        if self.best is not None:
            lines.append(f"  best: {self.best.median * 1e3:.4f} ms ({self.speedup:.2f}x the untuned rules), trial "
                         f"{self.best.trial} of run {self.best.run}: {config_key(self.best.config)}")
        fails: dict[str, int] = {}
        for t in self.trials:
            if not t.ok:
                fails[t.status] = fails.get(t.status, 0) + 1
        if fails or self.pruned:
            lines.append("  not ranked: " + ", ".join(f"{n} {s}" for s, n in sorted(fails.items()))
                         + (f"; {self.pruned} pruned before building" if self.pruned else ""))
        return "\n".join(lines)


def _check_sizes(outs: list[Tensor], args: list[Any], sizes: dict[Any, int] | None) -> dict[str, int]:
    named = {}
    for k, v in (sizes or {}).items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ArgumentError(f"autotune: sizes[{getattr(k, 'name', k)!r}] must be a positive int, got {v!r}")
        named[getattr(k, "name", k)] = int(v)
    symbolic = set()
    for a in args:
        for e in a.shape:
            n = getattr(e, "name", None)
            if getattr(e, "value", None) is None and n is not None:
                symbolic.add(n)
                if n not in named:
                    raise ArgumentError(f"autotune: {a.name!r} has the symbolic size {n!r}; tune at a shape: "
                                        f"sizes={{{n!r}: ...}}")
    unknown = sorted(set(named) - symbolic)
    if unknown:
        raise ArgumentError(f"autotune: sizes names {', '.join(map(repr, unknown))}, which no argument's shape uses "
                            f"(its symbolic sizes: {', '.join(sorted(symbolic)) or 'none'})")
    return named


@dataclass
class _Journal:
    """Journals each finished trial at once (database, result, progress bar), from the build thread (failed
    builds) and the run loop alike, and keeps the results the strategy has not observed yet."""

    default: Config
    wk: str
    tk: str
    shape: str
    run: str
    meta: dict[str, Any]
    db: Database
    done: dict[str, Trial]
    res: TuneResult
    bar: Progress
    flying: set[str] = field(default_factory=set)  # proposed, not yet journaled
    unseen: list[tuple[Config, float | None]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, config: Config, trial: int, **kw: Any) -> None:
        meta = {**self.meta, "options": list(options(config, self.default))}  # what build applies
        t = Trial(self.wk, self.tk, self.shape, config, trial=trial, run=self.run, meta=meta, **kw)
        with self.lock:
            self.db.append(t)
            self.done[t.key()] = t
            self.flying.discard(config_key(config))
            self.res.trials.append(t)
            self.unseen.append((config, t.median if t.ok else None))
            self.bar.add(t)

    def take_unseen(self) -> list[tuple[Config, float | None]]:
        with self.lock:
            out, self.unseen = self.unseen, []
        return out


def _failed(o: Any, kind: str) -> str:
    """The status of a failed build or run (`kind`: "build_error" / "run_error"), unless the watchdog stopped it
    or the candidate ran and differed from the reference."""
    if WrongResult.__name__ in o.error:
        return "wrong"
    return "timeout" if "timeout" in o.error else kind


def autotune(outputs: Tensor | list[Tensor], args: list[Any] | None = None, target: str | None = None, *,
             sizes: dict[Any, int] | None = None, trials: int = 64, strategy: str = "evolutionary",
             batch: int | None = None, db: str | Database | None = None, executor: Executor | None = None,
             gpus: int | list[int] | None = None, seed: int = 0, policy: TimingPolicy | None = None,
             resume: bool = True, progress: bool = True, plot: str | None = None, timeout: float = 120.0,
             reference: Any = None, tolerance: float | None = None) -> TuneResult:
    """Tune the schedule of `outputs` (te tensors, called with `args` as `build` takes them; None: the inputs in
    the order the program reads them first, then the outputs, as `lower` orders them) on `target` at
    `sizes` (values of the symbolic sizes, by Var or name) until the database holds `trials` trials of this
    workload, target and shape. `strategy`: "evolutionary" (a learned cost model, XGBoost when installed) or
    "random"; `batch`: candidates per proposal (default: the executor's build slots, at least 8 and 4 per device;
    at most one batch of built candidates waits for the devices);
    `db`: a database directory or object (default `$LOOPIR_TUNING_DB`, else ~/.cache/loopir/tuning);
    `executor`: default a LocalExecutor on
    `gpus` (None: every visible GPU; CPU runs otherwise); `timeout`: seconds per build or run before the
    watchdog kills it; `reference`: a picklable callable giving the expected outputs from the input arrays
    (default: the untuned build's outputs); `plot`: a PNG path for the best time against trials."""
    outs = [outputs] if isinstance(outputs, Tensor) else list(outputs)
    if not outs or not all(isinstance(t, Tensor) for t in outs):
        raise ArgumentTypeError("autotune takes a te tensor or a list of them (the outputs)")
    if isinstance(trials, bool) or not isinstance(trials, int) or trials < 1:
        raise ArgumentError(f"autotune: trials must be a positive int, got {trials!r}")
    target = target or ("cuda" if gpu_available() else "cpu")
    if target not in ("cuda", "cpu"):
        raise ArgumentError(f"autotune: target must be 'cuda' or 'cpu', got {target!r}")
    if target == "cuda" and executor is None and not gpu_available():
        raise ArgumentError("autotune: target 'cuda' measures on a GPU and none is visible here (tune with "
                            "target='cpu', or pass an executor whose workers have GPUs, e.g. a Ray cluster's)")
    if args is None:  # lower's argument order, as the tensors themselves (the keys and build take tensors)
        by_buffer = {id(t.buffer): t for t in stages_of(outs)}
        args = [by_buffer[id(b)] for b in lower(outs).args]
    args = list(args)
    named = _check_sizes(outs, args, sizes)
    if reference is not None:
        try:
            pickle.dumps(reference)
        except Exception as e:  # noqa: BLE001 - whatever pickle raises, the message says what to pass
            raise ArgumentError(f"autotune: reference must be picklable (a module-level function: the tuning "
                                f"workers call it), got {reference!r} ({type(e).__name__})") from None
    t_start = time.perf_counter()
    space = space_for(outs, target, named or None)
    wk, (tk, tdesc) = workload_key(outs, args), target_key(target)
    shape = shape_key(args, named)
    base = db if isinstance(db, Database) else Database(db or default_path())
    done = base.measured(wk, tk, shape) if resume else {}
    strat = make_strategy(strategy, space, seed=seed)
    strat.observe(history_from_trials(list(done.values())))
    own = executor is None
    ex = executor or LocalExecutor(devices=gpus if target == "cuda" else [],
                                   build_workers=max(1, (os.cpu_count() or 2) - 1))
    # proposed a batch at a time; the batch fills the build slots, and the devices wait on no batch's slowest build
    nb = batch or max(8, 4 * max(ex.devices, 1), getattr(ex, "build_slots", 0))
    graph = pickle.dumps((outs, args))
    run_id = uuid.uuid4().hex[:12]
    short = {k: v for k, v in tdesc.items() if k != "host"} | ({"host": " ".join(tdesc["host"].split()[:3])}
                                                               if "host" in tdesc else {})
    meta = {"workload": outs[0].name, "target_desc": short, "strategy": strategy}
    res = TuneResult(wk, tk, shape, None, None, resumed=len(done), db=str(base.path))
    bar = Progress(trials, len(done), enabled=progress)
    for t in done.values():
        bar.add(t)
    journal = _Journal(space.default, wk, tk, shape, run_id, meta, base, done, res, bar)
    make = functools.partial(Job, graph, target, named, default=space.default, policy=policy or TimingPolicy(),
                             seed=seed, reference=reference, tolerance=tolerance, arch=tdesc.get("arch"))
    index = max((t.trial for t in done.values()), default=-1) + 1
    cands: dict[int, tuple[Config, int, Job]] = {}  # build-feed index -> the candidate, its trial number, its job
    built: dict[int, dict[str, Any]] = {}
    run_of: dict[int, int] = {}  # run-feed index -> build-feed index
    handoff = threading.Lock()
    run_feed = Feed()
    idle = False  # the last proposal was empty, and nothing was observed since

    def refill(feed: Feed) -> None:
        # called by the build stream when a build worker is free and nothing is queued: propose with every
        # result observed so far, unless a batch of built candidates already waits for the devices
        nonlocal index, idle
        if run_feed.pending >= nb:
            return
        seen_new = journal.take_unseen()
        if seen_new:
            strat.observe(seen_new)
        elif idle:
            with journal.lock:
                if not journal.flying:
                    feed.close()  # nothing proposable, nothing in flight: the search is over
            return
        with journal.lock:
            seen, room = done.keys() | journal.flying, trials - len(done) - len(journal.flying)
        todo = [] if config_key(space.default) in seen else [dict(space.default)]
        todo += [c for c in strat.propose(nb) if config_key(c) not in seen and c != space.default]
        todo = todo[: max(room, 0)]
        idle = not todo
        if room <= 0:
            feed.close()
        with journal.lock:
            journal.flying.update(config_key(c) for c in todo)
        for c in todo:
            job = make(c)
            cands[feed.put(job)] = (c, index, job)  # read only after this job's build: the entry is in by then
            index += 1

    build_feed = Feed(refill=refill)
    failure: list[BaseException] = []

    def build_side() -> None:
        try:
            for i, o in ex.builds(build_candidate, build_feed, timeout):
                c, trial, job = cands[i]
                if o.ok:
                    built[i] = o.value
                    with handoff:  # the run loop looks the index up under the same lock
                        run_of[run_feed.put(job)] = i
                else:
                    del cands[i]
                    journal.record(c, trial, status=_failed(o, "build_error"), error=o.error[-2000:],
                                   build_s=o.seconds)
        except BaseException as e:  # noqa: BLE001 - raised again in the tuner's thread
            failure.append(e)
        finally:
            run_feed.close()

    builder = threading.Thread(target=build_side, name="tune-builds", daemon=True)
    builder.start()
    try:
        for r, o in ex.runs(measure_candidate, run_feed, timeout):
            with handoff:
                i = run_of.pop(r)
            (c, trial, _), b = cands.pop(i), built.pop(i)
            trace = (b.get("trace") or "",)
            if o.ok:
                journal.record(c, trial, status="ok", times=o.value["times"], trace=trace, build_s=b["build_s"],
                               error=f"rel. error {o.value['error']:.1e}")
            else:
                journal.record(c, trial, status=_failed(o, "run_error"), error=o.error[-2000:], trace=trace,
                               build_s=b["build_s"])
    finally:
        build_feed.close(drop=True)  # an interrupted tuner starts no more builds; the running ones finish
        builder.join()
        bar.close()
        if own:
            ex.close()
    if failure:
        raise failure[0]
    res.seconds = time.perf_counter() - t_start
    res.best = base.best(wk, tk, shape)
    res.default = done.get(config_key(space.default))
    res.pruned = getattr(strat, "pruned", 0)
    if plot:
        mine = sorted(base.trials(wk, tk, shape), key=lambda t: (t.run != run_id, t.trial))
        plot_png(plot, [t.median for t in mine], title=f"{meta['workload']} {shape} {target}")
    return res
