"""The autotuner's search strategies and cost model on synthetic spaces with a known cost (CPU only, fast).

    pytest tests/test_tuning_search.py -q

The main space: a tile (m, n), a k tile, threads, vector width, unroll and loop order (4800 configurations,
about a third pruned by shared memory or too little work per thread); its cost is smooth in the log2 of the
sizes (a bowl around one optimum) with two cliffs (occupancy, register spills), measured with 2% noise.
"""

from __future__ import annotations

import itertools
import math
import random

import numpy as np
import pytest

from loopir.errors import ArgumentError
from schedules.tuning import model as model_mod
from schedules.tuning.model import CostModel, Encoder, encode, targets
from schedules.tuning.record import Config, Knob, Space, Trial, config_key
from schedules.tuning.search import (EvolutionarySearch, RandomSearch, Strategy, history_from_trials,
                                     make_strategy)

TILES = tuple((m, n) for m in (16, 32, 64, 128, 256) for n in (16, 32, 64, 128, 256))
KNOBS = (Knob("tile", TILES), Knob("k_tile", (8, 16, 32, 64)), Knob("threads", (64, 128, 256, 512)),
         Knob("vector", (1, 2, 4)), Knob("unroll", (False, True)), Knob("order", ("ijk", "ikj")))
DEFAULT = {"tile": (64, 64), "k_tile": 16, "threads": 128, "vector": 1, "unroll": False, "order": "ijk"}


def check(c: Config) -> str | None:
    m, n = c["tile"]
    if (m + n) * c["k_tile"] * 4 > 48 * 1024:
        return "shared memory over 48 KB"
    if m * n < c["threads"] * c["vector"] * 4:
        return "under 4 vectors of work per thread"
    return None


def cost(c: Config) -> float:
    m, n = c["tile"]
    lg = math.log2
    s = 0.5 * (lg(m) - 7) ** 2 + 0.4 * (lg(n) - 6) ** 2 + 0.3 * (lg(c["k_tile"]) - 5) ** 2
    s += 0.35 * (lg(c["threads"]) - 8) ** 2 + 0.3 * (lg(c["vector"]) - 2) ** 2
    s += 0.1 * (lg(m) - 7) * (lg(c["threads"]) - 8)  # tile and threads interact
    s += (0.0 if c["unroll"] else 0.12) + (0.0 if c["order"] == "ikj" else 0.08)
    t = 1e-4 * math.exp(0.5 * s)
    if (m + n) * c["k_tile"] * 4 > 16 * 1024:
        t *= 1.3  # fewer blocks per SM
    if c["unroll"] and c["k_tile"] >= 64:
        t *= 1.25  # spills
    return t


SPACE = Space(KNOBS, DEFAULT, check)
ALL = [dict(zip([k.name for k in KNOBS], v)) for v in itertools.product(*(k.choices for k in KNOBS))]
VALID = [c for c in ALL if check(c) is None]
OPT = min(cost(c) for c in VALID)


def simulate(strategy: Strategy, budget: int = 200, batch: int = 16, seed: int = 0,
             fail: object = None) -> tuple[int | None, list[Config]]:
    """A tuning loop: measure batches (2% noise); the trial count at which the best true cost is within 5% of
    the optimum (None if never), and every proposal in order. `fail(config)` -> True marks a failed candidate."""
    rng = random.Random(seed + 1000)
    proposed: list[Config] = []
    reached = None
    while len(proposed) < budget:
        got = strategy.propose(min(batch, budget - len(proposed)))
        if not got:
            break
        results = []
        for c in got:
            proposed.append(c)
            if reached is None and cost(c) <= 1.05 * OPT:
                reached = len(proposed)
            failed = fail is not None and fail(c)
            results.append((c, None if failed else cost(c) * math.exp(rng.gauss(0, 0.02))))
        strategy.observe(results)
    return reached, proposed


def keys(configs: list[Config]) -> list[str]:
    return [config_key(c) for c in configs]


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1])


def tiny_space() -> Space:
    # 3 x 2 x 2 = 12 configurations, 3 invalid (a=3 with b=2, and a=1, b=1, c="x")
    knobs = (Knob("a", (1, 2, 3)), Knob("b", (1, 2)), Knob("c", ("x", "y")))

    def chk(c: Config) -> str | None:
        if c["a"] == 3 and c["b"] == 2:
            return "a3b2"
        return "a1b1x" if (c["a"], c["b"], c["c"]) == (1, 1, "x") else None

    return Space(knobs, {"a": 2, "b": 1, "c": "y"}, chk)


def sparse_space() -> Space:
    # 1000 configurations, 28 valid: most samples are pruned
    knobs = tuple(Knob(n, tuple(range(10))) for n in "xyz")
    return Space(knobs, {"x": 0, "y": 0, "z": 0}, lambda c: None if (c["x"] + 3 * c["y"] + 7 * c["z"]) % 37 == 0
                 else "off the lattice")


def toy_time(c: Config) -> float:
    return 1.0 + sum(abs(v) for v in c.values() if isinstance(v, int))


# ----------------------------------------------------------------------------- random search


def test_random_covers_a_tiny_space_exactly() -> None:
    space = tiny_space()
    s = RandomSearch(space, seed=3)
    got: list[Config] = []
    while batch := s.propose(5):
        got += batch
    assert got[0] == space.default
    assert len(got) == 9 and len(set(keys(got))) == 9
    valid = [dict(zip("abc", v)) for v in itertools.product((1, 2, 3), (1, 2), ("x", "y"))]
    assert set(keys(got)) == {config_key(c) for c in valid if space.check(c) is None}
    assert s.pruned == 3 and s.exhausted and s.propose(4) == []


def test_random_never_repeats_and_proposals_are_valid() -> None:
    s = RandomSearch(SPACE, seed=1)
    got: list[Config] = []
    for _ in range(40):
        got += s.propose(16)
    assert len(got) == 640 and len(set(keys(got))) == 640
    assert all(check(c) is None for c in got)
    assert s.pruned > 0  # the space is about a third invalid: samples were refused, and counted


@pytest.mark.parametrize("name", ["random", "evolutionary"])
def test_space_of_size_one(name: str) -> None:
    one = Space((Knob("a", (7,)),), {"a": 7})
    s = make_strategy(name, one, seed=0)
    assert s.propose(4) == [{"a": 7}]
    s.observe([({"a": 7}, 1.0)])
    assert s.propose(4) == []
    refused = make_strategy(name, Space((Knob("a", (7,)),), {"a": 7}, lambda c: "too big"), seed=0)
    assert refused.propose(4) == [] and refused.pruned == 1


@pytest.mark.parametrize("name", ["random", "evolutionary"])
def test_mostly_invalid_space_is_exhausted_exactly(name: str) -> None:
    space = sparse_space()
    n_valid = sum(space.check(dict(zip("xyz", v))) is None for v in itertools.product(range(10), repeat=3))
    s = make_strategy(name, space, seed=5)
    got: list[Config] = []
    while batch := s.propose(8):
        assert all(space.check(c) is None for c in batch)
        got += batch
        s.observe([(c, toy_time(c)) for c in batch])
    assert len(got) == n_valid == len(set(keys(got)))


@pytest.mark.parametrize("name", ["random", "evolutionary"])
def test_n_larger_than_what_remains(name: str) -> None:
    space = tiny_space()
    s = make_strategy(name, space, seed=0)
    first = s.propose(2)
    s.observe([(c, toy_time(c)) for c in first])
    rest = s.propose(50)
    assert len(first) == 2 and len(rest) == 7
    assert len(set(keys(first + rest))) == 9 and s.propose(50) == []


@pytest.mark.parametrize("name", ["random", "evolutionary"])
def test_deterministic_given_the_seed(name: str) -> None:
    runs = [simulate(make_strategy(name, SPACE, seed=seed), budget=64)[1] for seed in (11, 11, 12)]
    assert keys(runs[0]) == keys(runs[1])
    assert keys(runs[0]) != keys(runs[2])


def test_make_strategy_names() -> None:
    assert isinstance(make_strategy("random", SPACE), RandomSearch)
    assert isinstance(make_strategy("evolutionary", SPACE, seed=2, population=16), EvolutionarySearch)
    with pytest.raises(ArgumentError, match="unknown search strategy 'annealing'"):
        make_strategy("annealing", SPACE)


# ----------------------------------------------------------------------------- evolutionary search


@pytest.mark.skipif(not model_mod.HAVE_XGBOOST, reason="xgboost is not installed")
def test_evolutionary_reaches_the_optimum_sooner_than_random() -> None:
    evo, rnd = [], []
    for seed in range(3):
        e = EvolutionarySearch(SPACE, seed)
        reached, proposed = simulate(e, seed=seed)
        assert e.model.kind == "xgboost"
        assert len(set(keys(proposed))) == len(proposed) and all(check(c) is None for c in proposed)
        evo.append(reached if reached is not None else math.inf)
        reached, _ = simulate(RandomSearch(SPACE, seed), seed=seed)
        rnd.append(reached if reached is not None else math.inf)
    evo_median, rnd_median = sorted(evo)[1], sorted(rnd)[1]
    assert evo_median <= 200, f"evolutionary search never came within 5% of the optimum: {evo}"
    assert evo_median < rnd_median, f"trials to within 5%: evolutionary {evo}, random {rnd}"


def test_evolutionary_batch_mixes_model_picks_and_random_samples(monkeypatch: pytest.MonkeyPatch) -> None:
    s = EvolutionarySearch(SPACE, seed=4, eps_random=0.25)
    simulate(s, budget=48)
    drawn: list[int] = []
    real_draw = s._sampler.draw
    monkeypatch.setattr(s._sampler, "draw", lambda n, exclude=None: drawn.append(n) or real_draw(n, exclude))
    batch = s.propose(16)
    # the population's fill draws `population - elite`; the batch's random share is the last draw: 4 of 16
    assert len(batch) == 16 and drawn[-1] == 4
    assert s.model.trained


def test_failed_candidates_are_never_reproposed_and_rank_last() -> None:
    def fails(c: Config) -> bool:
        return c["threads"] == 512  # e.g. too many registers per block: the launch fails

    s = EvolutionarySearch(SPACE, seed=0)
    _, proposed = simulate(s, budget=160, fail=fails)
    assert len(set(keys(proposed))) == len(proposed)
    failed = [c for c, t in s.history if t is None]
    assert failed and all(fails(c) for c in failed)
    assert s.model.trained
    ok = [c for c, t in s.history if t is not None]
    # the model learnt from the penalty: failed configurations score below the measured ones on average
    assert s.model.predict(failed).mean() < s.model.predict(ok).mean()
    t = targets([1.0, None, 2.0, float("inf")])
    assert np.allclose(t, -np.log([1.0, 4.0, 2.0, 4.0]))


def test_extra_features_reach_the_model_once_per_configuration() -> None:
    calls: list[str] = []

    def features(c: Config) -> dict[str, float]:
        calls.append(config_key(c))
        m, n = c["tile"]
        return {"shared_bytes": (m + n) * c["k_tile"] * 4}

    model = CostModel(SPACE, extra_names=("shared_bytes",))
    s = EvolutionarySearch(SPACE, seed=0, model=model, features=features)
    simulate(s, budget=48)
    assert model.trained and len(calls) == len(set(calls))  # cached by the search
    assert {config_key(c) for c, _ in s.history} <= set(calls)
    assert model.encoder.names[-1] == "extra.shared_bytes"


def test_warm_start_from_the_database() -> None:
    trials = [Trial("w", "t", "s", dict(DEFAULT), "ok", times=(3e-4, 1e-4, 2e-4)),
              Trial("w", "t", "s", {**DEFAULT, "vector": 2}, "build_error", error="ptxas"),
              Trial("w", "t", "s", {**DEFAULT, "tile": (256, 256), "k_tile": 64}, "invalid", error="smem")]
    trials += [Trial("w", "t", "s", c, "ok", times=(cost(c),)) for c in VALID[::97]]
    hist = history_from_trials(trials)
    assert hist[0] == (DEFAULT, 2e-4) and hist[1] == ({**DEFAULT, "vector": 2}, None)
    assert len(hist) == len(trials) - 1  # the invalid one is skipped
    s = EvolutionarySearch(SPACE, seed=0)
    s.observe(hist)
    assert s.model.kind == ("xgboost" if model_mod.HAVE_XGBOOST else "ridge")
    batch = s.propose(32)
    assert len(batch) == 32 and not set(keys(batch)) & {config_key(c) for c, _ in hist}
    assert DEFAULT not in batch


# ----------------------------------------------------------------------------- the cost model


def test_encode_features() -> None:
    space = Space((Knob("tile", ((32, 64), (64, 128))), Knob("k", (8, 16, 32)), Knob("unroll", (False, True)),
                   Knob("layout", ("row", "col", "tiled"))), {"tile": (32, 64), "k": 8, "unroll": False,
                                                               "layout": "row"})
    cfg = {"tile": (64, 128), "k": 16, "unroll": True, "layout": "col"}
    enc = Encoder(space)
    f = dict(zip(enc.names, encode(space, cfg)))
    assert (f["tile[0]"], f["tile[1]"], f["tile.prod.log2"], f["tile.index"]) == (6.0, 7.0, 13.0, 1.0)
    assert (f["k.log2"], f["k.raw"], f["k.index"]) == (4.0, 16.0, 0.5)
    assert (f["unroll.flag"], f["unroll.index"]) == (1.0, 1.0)
    assert [f['layout="row"'], f['layout="col"'], f['layout="tiled"']] == [0.0, 1.0, 0.0]
    assert len(encode(space, space.default)) == enc.size == len(f)
    # extra features: a fixed sorted list, missing ones 0
    assert list(encode(space, cfg, {"b": 2.0, "a": 1.0})[-2:]) == [1.0, 2.0]
    assert list(Encoder(space, ("z", "a"))(cfg, {"a": 3.0})[-2:]) == [3.0, 0.0]
    m = CostModel(space, extra_names=("z", "a"))
    assert m.extra_names == ("a", "z") and m.encoder.matrix([cfg, cfg], [{"z": 1}, None]).shape == (2, enc.size + 2)


def _train_and_rank(n_train: int = 300) -> tuple[CostModel, float]:
    rng = random.Random(0)
    configs = VALID[:]
    rng.shuffle(configs)
    train, held_out = configs[:n_train], configs[n_train:n_train + 500]
    m = CostModel(SPACE, seed=0)
    m.fit(train, [cost(c) * math.exp(rng.gauss(0, 0.02)) for c in train])
    return m, spearman(m.predict(held_out), np.array([-cost(c) for c in held_out]))


@pytest.mark.skipif(not model_mod.HAVE_XGBOOST, reason="xgboost is not installed")
def test_xgboost_model_ranks_held_out_configurations() -> None:
    m, rho = _train_and_rank()
    assert m.kind == "xgboost"
    assert rho > 0.7, f"Spearman {rho:.3f}"


def test_fallback_model_without_xgboost(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(model_mod, "HAVE_XGBOOST", False)
    m, rho = _train_and_rank()
    assert m.kind == "ridge" and rho > 0.7, f"{m.kind}, Spearman {rho:.3f}"
    # the search runs on it end to end
    e = EvolutionarySearch(SPACE, seed=0)
    reached, _ = simulate(e, seed=0)
    assert e.model.kind == "ridge" and reached is not None


def test_untrained_and_small_models() -> None:
    m = CostModel(SPACE, seed=1)
    assert m.kind == "none" and not m.trained
    m.fit(VALID[:1], [1e-4])
    assert m.kind == "none"
    a, b = m.predict(VALID[:20]), CostModel(SPACE, seed=1).predict(VALID[:20])
    assert np.array_equal(a, b) and np.ptp(a) > 0  # random, seeded: an untrained model still spreads a search
    m.fit(VALID[:3], [None, None, None])
    assert m.kind == "none"  # nothing succeeded: nothing to rank by
    m.fit(VALID[:5], [cost(c) for c in VALID[:5]])
    assert m.kind == "ridge"  # too few points for boosting, whether or not xgboost is installed
    with pytest.raises(ArgumentError, match="2 times for 3"):
        m.fit(VALID[:3], [1.0, 2.0])
