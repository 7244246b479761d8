"""The tuner's data: a knob, a search space, a configuration and a trial record.

    space = Space((Knob("threads", (64, 128, 256)), Knob("k_tile", (8, 16, 32))))
    cfg = {"threads": 128, "k_tile": 16}              # a Config: knob name -> one of its choices
    Trial(workload=wk, target=tk, shape="512x1024", config=cfg, status="ok", times=(1.2e-4, 1.21e-4), ...)

Everything here is plain data that round-trips through JSON (`Trial.to_json` / `Trial.from_json`): a
configuration's values are ints, floats, bools, strings or tuples of them (JSON lists come back as tuples).
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from loopir.errors import ArgumentError

__all__ = ["Config", "Knob", "Space", "Trial", "STATUSES", "config_key", "freeze"]

Config = dict[str, Any]

# ok: built, ran, matched the reference; invalid: pruned before building (the reason in `error`);
# build_error / run_error: the candidate failed (never ranks); timeout: the watchdog killed it; wrong: ran but
# did not match the reference
STATUSES = ("ok", "invalid", "build_error", "run_error", "timeout", "wrong")


def freeze(v: Any) -> Any:
    """A configuration value with JSON lists turned back into tuples (hashable, equal to the original)."""
    return tuple(freeze(x) for x in v) if isinstance(v, (list, tuple)) else v


def config_key(config: Mapping[str, Any]) -> str:
    """A canonical string of a configuration (sorted keys, tuples as lists): equal configurations, equal keys."""
    return json.dumps({k: config[k] for k in sorted(config)}, separators=(",", ":"), default=list)


@dataclass(frozen=True, slots=True)
class Knob:
    """One decision of a schedule rule: its name (the auto_schedule option it sets) and its choices, ordered
    (neighbouring choices are close values: mutation may step to a neighbour)."""

    name: str
    choices: tuple[Any, ...]

    def __post_init__(self) -> None:
        if not self.choices:
            raise ArgumentError(f"knob {self.name!r} has no choices")


@dataclass(frozen=True, slots=True)
class Space:
    """The knobs of one workload on one target and a validity test: `check(config)` returns None for a
    candidate that may be built, else the reason it is pruned (e.g. shared memory over the device's limit).
    `default` is the configuration the untuned rules pick (measured first: the baseline to beat)."""

    knobs: tuple[Knob, ...]
    default: Config
    check: Callable[[Config], str | None] = field(default=lambda c: None, compare=False)

    def knob(self, name: str) -> Knob:
        for k in self.knobs:
            if k.name == name:
                return k
        raise KeyError(name)

    def size(self) -> int:
        return math.prod(len(k.choices) for k in self.knobs)


@dataclass(frozen=True, slots=True)
class Trial:
    """One measured (or refused) candidate, as the database journals it.

    workload: the workload key (hash of the canonical loop IR, names ignored); target: the target key (device,
    arch, driver, NVRTC and loopir versions); shape: the shape bucket ("512x1024"); config: the candidate;
    trace: the schedule's recorded steps (replayable); times: seconds of each timed run (empty unless ok);
    build_s: seconds to schedule and compile; trial: its index within its tuning run; run: that run's id;
    meta: free-form (workload name, device name, features)."""

    workload: str
    target: str
    shape: str
    config: Config
    status: str
    times: tuple[float, ...] = ()
    error: str = ""
    trace: tuple[str, ...] = ()
    build_s: float = 0.0
    trial: int = 0
    run: str = ""
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ArgumentError(f"trial status {self.status!r} is not one of {', '.join(STATUSES)}")
        if self.status == "ok" and not self.times:
            raise ArgumentError("a trial with status 'ok' needs its times")

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def median(self) -> float:
        """Median seconds (inf unless ok: a failed candidate never ranks)."""
        return statistics.median(self.times) if self.ok else math.inf

    def key(self) -> str:
        return config_key(self.config)

    def to_json(self) -> str:
        d = {s: getattr(self, s) for s in self.__slots__}
        return json.dumps(d, separators=(",", ":"), default=list)

    @classmethod
    def from_json(cls, line: str) -> Trial:
        d = json.loads(line)
        d["config"] = {k: freeze(v) for k, v in d["config"].items()}
        d["times"], d["trace"] = tuple(d.get("times", ())), tuple(d.get("trace", ()))
        return cls(**d)
