"""A learned cost model for the autotuner: features of a configuration, and a ranker trained on measured times.

    model = CostModel(space, extra_names=("blocks", "shared_bytes"))
    model.fit(configs, times, extras=[{"blocks": 264, "shared_bytes": 16384}, ...])   # seconds; None = failed
    scores = model.predict(candidates, extras=...)   # higher = predicted faster
    model.kind                                       # "xgboost", "ridge" or "none" (untrained: random scores)

`encode(space, config)` turns a configuration into a fixed-length vector (per knob: its choice index in [0, 1];
numbers as log2 and raw; bools 0/1; strings one-hot over the knob's choices; tuples element-wise in log2 plus the
log2 of their product), optionally followed by extra features in a fixed sorted order (the caller passes features
of the lowered loop IR: threads per block, shared bytes, registers, blocks...).

The model ranks, it does not predict seconds: XGBoost with the `rank:pairwise` objective on `-log(time)`, the
whole history one group, when xgboost is installed and there are at least `MIN_XGB_POINTS` points; else ridge
regression (numpy) on the standardised features and their squares; with fewer than two usable points, "none".
"""

from __future__ import annotations

import importlib.util
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from loopir.errors import ArgumentError
from schedules.tuning.record import Config, Knob, Space


__all__ = ["CostModel", "Encoder", "encode", "targets", "HAVE_XGBOOST", "MIN_XGB_POINTS", "FAIL_PENALTY"]

# read at fit time, so a test can turn XGBoost off with monkeypatch; the package itself is imported at the first
# fit (0.2 s, which `import codegen` should not pay); without it the ridge fallback ranks
HAVE_XGBOOST = importlib.util.find_spec("xgboost") is not None
# below this many points a boosted ranker overfits what a ridge line would get right
MIN_XGB_POINTS = 8
# a failed candidate trains as this many times the worst measured time: ranked last, yet on the same scale, so
# one failure does not stretch the targets (an infinite or huge time would)
FAIL_PENALTY = 2.0


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _log2(v: float) -> float:
    # non-positive values sit below every positive one (log2 of 1 is 0); they are rare in tuning knobs
    return math.log2(v) if v > 0 else -1.0


def _jkey(v: Any) -> str:
    # json tells True from 1 and 1 from 1.0, which `==` (and so dict lookup) does not
    return json.dumps(v, default=list)


@dataclass(frozen=True, slots=True)
class _Codec:
    """How one knob becomes features: which slots exist follows from the types among its choices."""

    knob: Knob
    index: dict[str, int]  # json of a choice -> its position
    flag: bool  # some choice is a bool
    numeric: bool  # some choice is an int or float
    labels: tuple[str, ...]  # json of the other scalar choices (strings, None): one-hot
    width: int  # the longest tuple choice (0: none)
    levels: tuple[dict[str, int], ...]  # per tuple position: its non-numeric values -> their rank

    @classmethod
    def of(cls, knob: Knob) -> _Codec:
        cs = knob.choices
        tuples = [c for c in cs if isinstance(c, tuple)]
        width = max((len(t) for t in tuples), default=0)
        levels = []
        for i in range(width):
            seen: dict[str, int] = {}
            for t in tuples:
                if i < len(t) and not _is_num(t[i]) and not isinstance(t[i], bool):
                    seen.setdefault(_jkey(t[i]), len(seen))
            levels.append(seen)
        labels = tuple(dict.fromkeys(_jkey(c) for c in cs if not isinstance(c, (bool, int, float, tuple))))
        return cls(knob, {_jkey(c): i for i, c in enumerate(cs)}, any(isinstance(c, bool) for c in cs),
                   any(_is_num(c) for c in cs), labels, width, tuple(levels))

    def names(self) -> list[str]:
        n = self.knob.name
        out = [f"{n}.index"] + [f"{n}.flag"] * self.flag + [f"{n}.log2", f"{n}.raw"] * self.numeric
        out += [f"{n}={lab}" for lab in self.labels]
        if self.width:
            out += [f"{n}[{i}]" for i in range(self.width)] + [f"{n}.prod.log2"]
        return out

    def encode(self, v: Any, out: list[float]) -> None:
        i = self.index.get(_jkey(v))
        # a value outside the choices (an old database's) still encodes, at index -1
        out.append(-1.0 if i is None else i / max(1, len(self.knob.choices) - 1))
        if self.flag:
            out.append(1.0 if v is True else 0.0)
        if self.numeric:
            out += [_log2(v), float(v)] if _is_num(v) else [0.0, 0.0]
        if self.labels:
            k = _jkey(v)
            out += [1.0 if k == lab else 0.0 for lab in self.labels]
        if self.width:
            t = v if isinstance(v, tuple) else ()
            prod = 1.0
            for pos in range(self.width):
                x = t[pos] if pos < len(t) else None
                if _is_num(x):
                    out.append(_log2(x))
                    prod *= x
                elif isinstance(x, bool):
                    out.append(float(x))
                else:
                    lv = self.levels[pos]
                    out.append(lv.get(_jkey(x), -1) / max(1, len(lv) - 1) if x is not None else 0.0)
            out.append(_log2(prod) if t else 0.0)


class Encoder:
    """The feature layout of one space (plus sorted extra names): `enc(config, extra)` -> vector,
    `enc.matrix(configs, extras)` -> (n, size) array; `enc.names` labels the columns."""

    def __init__(self, space: Space, extra_names: Sequence[str] = ()) -> None:
        self.space = space
        self.codecs = tuple(_Codec.of(k) for k in space.knobs)
        self.extra_names = tuple(sorted(set(extra_names)))
        self.names = tuple(n for c in self.codecs for n in c.names()) + tuple(f"extra.{n}" for n in self.extra_names)
        self.size = len(self.names)

    def row(self, config: Mapping[str, Any], extra: Mapping[str, float] | None = None) -> list[float]:
        out: list[float] = []
        for c in self.codecs:
            c.encode(config.get(c.knob.name, self.space.default.get(c.knob.name)), out)
        ex = extra or {}
        out += [float(ex.get(n, 0.0)) for n in self.extra_names]
        return out

    def __call__(self, config: Mapping[str, Any], extra: Mapping[str, float] | None = None) -> np.ndarray:
        return np.asarray(self.row(config, extra), dtype=np.float64)

    def matrix(self, configs: Sequence[Mapping[str, Any]],
               extras: Sequence[Mapping[str, float] | None] | None = None) -> np.ndarray:
        if extras is not None and len(extras) != len(configs):
            raise ArgumentError(f"{len(extras)} extra-feature rows for {len(configs)} configurations")
        rows = [self.row(c, extras[i] if extras is not None else None) for i, c in enumerate(configs)]
        return np.asarray(rows, dtype=np.float64).reshape(len(configs), self.size)


def encode(space: Space, config: Config, extra: Mapping[str, float] | None = None,
           extra_names: Sequence[str] | None = None) -> np.ndarray:
    """The feature vector of one configuration. Extra features follow in sorted `extra_names` order (missing
    ones 0); without `extra_names`, the sorted keys of `extra` (a model passes its fixed list instead, so every
    row has the same length). Many rows: build an `Encoder` once."""
    names = extra_names if extra_names is not None else tuple(extra or ())
    return Encoder(space, names)(config, extra)


def targets(times: Sequence[float | None]) -> np.ndarray:
    """The ranking targets of measured times: -log(seconds); a failure (None, or a time that is not a positive
    finite number) gets -log(FAIL_PENALTY x the worst measured time). NaN everywhere when nothing succeeded."""
    good = [t for t in times if t is not None and math.isfinite(t) and t > 0]
    if not good:
        return np.full(len(times), np.nan)
    bad = FAIL_PENALTY * max(good)
    return np.array([-math.log(t if t is not None and math.isfinite(t) and t > 0 else bad) for t in times])


class CostModel:
    """Ranks configurations of one space by predicted speed. `fit` replaces the previous training (pass the
    whole history); `predict` returns scores, higher = faster; `kind` says which model answered."""

    def __init__(self, space: Space, extra_names: Sequence[str] = (), *, seed: int = 0, rounds: int = 100,
                 max_depth: int = 4, eta: float = 0.1, ridge: float = 1.0, min_points: int = MIN_XGB_POINTS) -> None:
        self.encoder = Encoder(space, extra_names)
        self.seed, self.rounds, self.max_depth, self.eta = seed, rounds, max_depth, eta
        self.ridge, self.min_points = ridge, min_points
        self.kind = "none"
        self.points = 0
        self._booster: Any = None
        self._ridge: tuple[np.ndarray, np.ndarray, np.ndarray, float] | None = None
        self._rng = np.random.default_rng(seed)

    @property
    def trained(self) -> bool:
        return self.kind != "none"

    @property
    def extra_names(self) -> tuple[str, ...]:
        return self.encoder.extra_names

    def fit(self, configs: Sequence[Config], times: Sequence[float | None],
            extras: Sequence[Mapping[str, float] | None] | None = None) -> None:
        if len(configs) != len(times):
            raise ArgumentError(f"{len(times)} times for {len(configs)} configurations")
        y = targets(times)
        self.points = len(y)
        self._booster, self._ridge, self.kind = None, None, "none"
        if len(y) < 2 or np.isnan(y).any():
            return
        x = self.encoder.matrix(configs, extras)
        if HAVE_XGBOOST and len(y) >= self.min_points:
            self._fit_xgboost(x, y)
        else:
            self._fit_ridge(x, y)

    def _fit_xgboost(self, x: np.ndarray, y: np.ndarray) -> None:
        params = {
            "objective": "rank:pairwise",
            # pairs sampled uniformly over the whole list: the ranking must be right everywhere the search
            # looks, not only among the best few ("topk" pairs)
            "lambdarank_pair_method": "mean",
            "lambdarank_num_pair_per_sample": 8,
            "eta": self.eta,
            "max_depth": self.max_depth,
            # pairwise gradients have small hessians: the default minimum (1) forbids most splits on few points
            "min_child_weight": 0.0,
            "gamma": 1e-4,
            "seed": self.seed,
            "verbosity": 0,
        }
        import xgboost as xgb  # noqa: PLC0415 - third-party, loaded when a model is first trained

        dtrain = xgb.DMatrix(x, label=y)
        dtrain.set_group([len(y)])  # one query: every measured configuration ranks against every other
        self._booster = xgb.train(params, dtrain, num_boost_round=self.rounds)
        self.kind = "xgboost"

    def _fit_ridge(self, x: np.ndarray, y: np.ndarray) -> None:
        mu, sd = x.mean(axis=0), x.std(axis=0)
        sd[sd == 0] = 1.0
        z = self._ridge_features((x - mu) / sd)
        ym = float(y.mean())
        a = z.T @ z + self.ridge * np.eye(z.shape[1])
        w = np.linalg.solve(a, z.T @ (y - ym))
        self._ridge = (mu, sd, w, ym)
        self.kind = "ridge"

    @staticmethod
    def _ridge_features(z: np.ndarray) -> np.ndarray:
        # the squares let a linear model fit a bowl (cost rising on both sides of the best tile)
        return np.hstack([z, z * z])

    def predict(self, configs: Sequence[Config],
                extras: Sequence[Mapping[str, float] | None] | None = None) -> np.ndarray:
        if not configs:
            return np.zeros(0)
        if self.kind == "none":
            # untrained: random scores (seeded) rather than all equal, so a search ranking by them samples
            return self._rng.random(len(configs))
        x = self.encoder.matrix(configs, extras)
        if self.kind == "xgboost":
            import xgboost as xgb  # noqa: PLC0415

            return np.asarray(self._booster.predict(xgb.DMatrix(x)), dtype=np.float64)
        assert self._ridge is not None
        mu, sd, w, ym = self._ridge
        return self._ridge_features((x - mu) / sd) @ w + ym
