"""Search strategies of the autotuner: which configurations to measure next, given what was measured.

    strategy = make_strategy("evolutionary", space, seed=0)
    strategy.observe(history_from_trials(old_trials))    # warm start from the database (optional)
    while trials < budget and (batch := strategy.propose(16)):
        strategy.observe([(cfg, measure(cfg)) for cfg in batch])   # seconds, or None when it failed

A strategy never proposes a configuration twice (nor one it was told about in `observe`), and every proposal
passes `space.check`. `RandomSearch` samples uniformly (the default configuration first); `EvolutionarySearch`
(Ansor / MetaSchedule style) evolves the best measured configurations by mutation and crossover, ranks the
offspring with a learned `CostModel`, and spends a fraction `eps_random` of each batch on uniform samples so a
wrong model cannot trap it. Both are deterministic given their seed.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from loopir.errors import ArgumentError
from schedules.tuning.model import CostModel
from schedules.tuning.record import Config, Space, Trial, config_key

__all__ = ["Strategy", "RandomSearch", "EvolutionarySearch", "make_strategy", "history_from_trials", "STRATEGIES",
           "ENUM_LIMIT"]

# a space this small is enumerated once rejection sampling stalls (most configurations seen or invalid): then
# "nothing left" is exact. A larger one just returns fewer proposals when samples keep hitting seen/invalid ones
ENUM_LIMIT = 1 << 16

Result = tuple[Config, float | None]


class Strategy(Protocol):
    name: str

    def propose(self, n: int) -> list[Config]:
        """Up to n configurations never proposed nor observed before, each valid (`space.check` is None)."""
        ...

    def observe(self, results: Sequence[Result]) -> None:
        """Measured seconds of configurations (None: the candidate failed to build, run or match)."""
        ...


def history_from_trials(trials: Iterable[Trial]) -> list[Result]:
    """A database's trials as `observe` takes them: ok -> median seconds, failed -> None; invalid ones (pruned
    before building, never measured) are skipped."""
    return [(dict(t.config), t.median if t.ok else None) for t in trials if t.status != "invalid"]


class _Sampler:
    """Uniform sampling of unseen valid configurations, with a cache of validity verdicts."""

    def __init__(self, space: Space, rng: random.Random) -> None:
        self.space, self.rng = space, rng
        self.seen: set[str] = set()  # membership tests only: set order varies with the hash seed
        self.invalid: dict[str, str] = {}  # key -> the reason space.check gave
        self._valid: set[str] = set()
        self._rest: list[tuple[str, Config]] | None = None  # every valid unseen one, once enumerated

    def ok(self, config: Config, key: str | None = None) -> bool:
        key = key or config_key(config)
        if key in self._valid:
            return True
        if key in self.invalid:
            return False
        reason = self.space.check(config)
        if reason is None:
            self._valid.add(key)
            return True
        self.invalid[key] = reason
        return False

    def random_config(self) -> Config:
        return {k.name: self.rng.choice(k.choices) for k in self.space.knobs}

    def draw(self, n: int, exclude: set[str] | None = None) -> list[Config]:
        """Up to n distinct valid configurations, none seen nor in `exclude`; fewer when the space runs out."""
        if n <= 0:
            return []
        taken = set(exclude or ())
        out: list[Config] = []
        if self._rest is None:
            for _ in range(max(256, 64 * n)):
                c = self.random_config()
                k = config_key(c)
                if k in self.seen or k in taken or not self.ok(c, k):
                    continue
                out.append(c)
                taken.add(k)
                if len(out) == n:
                    return out
            if self.space.size() > ENUM_LIMIT:
                return out
            names = [k.name for k in self.space.knobs]
            every = (dict(zip(names, vs)) for vs in itertools.product(*(k.choices for k in self.space.knobs)))
            self._rest = [(config_key(c), c) for c in every]
            self._rest = [(k, c) for k, c in self._rest if self.ok(c, k)]
        self._rest = [(k, c) for k, c in self._rest if k not in self.seen]
        left = [(k, c) for k, c in self._rest if k not in taken]
        out += [dict(c) for _, c in self.rng.sample(left, min(n - len(out), len(left)))]
        return out

    @property
    def exhausted(self) -> bool:
        return self._rest is not None and all(k in self.seen for k, _ in self._rest)


class _Base:
    """What both strategies share: the sampler, the history, the default configuration first."""

    name = ""

    def __init__(self, space: Space, seed: int) -> None:
        self.space, self.seed = space, seed
        self.rng = random.Random(seed)
        self._sampler = _Sampler(space, self.rng)
        self._results: dict[str, Result] = {}  # key -> the latest (config, seconds | None), in observed order
        self._default_done = False

    @property
    def pruned(self) -> int:
        """How many distinct configurations space.check refused so far."""
        return len(self._sampler.invalid)

    @property
    def exhausted(self) -> bool:
        """True once every valid configuration of the space was proposed or observed (known for small spaces)."""
        return self._sampler.exhausted

    @property
    def history(self) -> list[Result]:
        return list(self._results.values())

    @property
    def best(self) -> Result | None:
        ok = [r for r in self._results.values() if r[1] is not None]
        return min(ok, key=lambda r: r[1]) if ok else None

    def _default(self, n: int) -> list[Config]:
        # the untuned choice goes first: the baseline every later candidate must beat
        if n <= 0 or self._default_done:
            return []
        self._default_done = True
        d = dict(self.space.default)
        k = config_key(d)
        return [d] if k not in self._sampler.seen and self._sampler.ok(d, k) else []

    def _mark(self, configs: list[Config]) -> list[Config]:
        for c in configs:
            self._sampler.seen.add(config_key(c))
        return configs

    def _record(self, results: Sequence[Result]) -> None:
        for c, t in results:
            k = config_key(c)
            self._sampler.seen.add(k)
            self._results.pop(k, None)  # a re-measurement moves to the end
            self._results[k] = (dict(c), t)


class RandomSearch(_Base):
    """Uniform sampling without repetition; the default configuration first."""

    name = "random"

    def __init__(self, space: Space, seed: int = 0) -> None:
        super().__init__(space, seed)

    def propose(self, n: int) -> list[Config]:
        out = self._default(n)
        out += self._sampler.draw(n - len(out), {config_key(c) for c in out})
        return self._mark(out)

    def observe(self, results: Sequence[Result]) -> None:
        self._record(results)


class EvolutionarySearch(_Base):
    """Evolve the best measured configurations, rank the offspring with a cost model, measure the best ranked.

    Each `propose(n)`: a population of the top measured configurations (kept in every generation: elitism)
    plus uniform samples, evolved for `generations` rounds; a child is a mutation of a tournament winner
    (probability `mutation_prob`: one or two knobs change, to a neighbouring choice with probability
    `neighbour_prob`, else to a uniform one) or a uniform per-knob crossover of two winners; the population keeps
    the best by predicted score. Returned: the top (1 - eps_random) * n unseen valid offspring by score, then
    eps_random * n uniform samples (topped up from either side when one runs short).

    `observe` retrains the model on the whole history; failed candidates (None) are never proposed again and
    train as FAIL_PENALTY (2) x the worst measured time (`model.targets`), so the model learns to avoid their
    neighbourhood. `features(config)`, when given, supplies the model's extra features (e.g. of the lowered
    loop IR); it is called for every candidate the model ranks, so it should be cheap or cached by the caller.
    """

    name = "evolutionary"

    def __init__(self, space: Space, seed: int = 0, *, population: int = 64, generations: int = 4,
                 mutation_prob: float = 0.85, neighbour_prob: float = 0.7, eps_random: float = 0.2,
                 elite: int = 8, model: CostModel | None = None,
                 features: Callable[[Config], Mapping[str, float] | None] | None = None) -> None:
        super().__init__(space, seed)
        if not 0.0 <= eps_random <= 1.0:
            raise ArgumentError(f"eps_random {eps_random} is not in [0, 1]")
        self.population, self.generations, self.elite = max(2, population), max(1, generations), max(1, elite)
        self.mutation_prob, self.neighbour_prob, self.eps_random = mutation_prob, neighbour_prob, eps_random
        self.model = model if model is not None else CostModel(space, seed=seed)
        self.features = features
        self._extra: dict[str, Mapping[str, float] | None] = {}
        self._index = {k.name: {config_key({"v": c}): i for i, c in enumerate(k.choices)} for k in space.knobs}

    # ------------------------------------------------------------------ the strategy

    def propose(self, n: int) -> list[Config]:
        out = self._default(n)
        n_rest = n - len(out)
        if n_rest <= 0:
            return self._mark(out)
        taken = {config_key(c) for c in out}
        if not any(t is not None for _, t in self._results.values()):
            # nothing measured yet: nothing to evolve from
            out += self._sampler.draw(n_rest, taken)
            return self._mark(out)
        pool = self._evolve(taken)
        ranked = [pool[i] for i in np.argsort(-self._score(pool), kind="stable")] if pool else []
        n_random = round(self.eps_random * n_rest)
        picked = ranked[: n_rest - n_random]
        taken |= {config_key(c) for c in picked}
        randoms = self._sampler.draw(n_rest - len(picked), taken)
        # the random share came up short (space nearly exhausted): fill from the rest of the ranked pool
        taken |= {config_key(c) for c in randoms}
        more = [c for c in ranked[len(picked):] if config_key(c) not in taken][: n_rest - len(picked) - len(randoms)]
        return self._mark(out + picked + randoms + more)

    def observe(self, results: Sequence[Result]) -> None:
        self._record(results)
        configs = [c for c, _ in self._results.values()]
        self.model.fit(configs, [t for _, t in self._results.values()], self._extras(configs))

    # ------------------------------------------------------------------ evolution

    def _extras(self, configs: list[Config]) -> list[Mapping[str, float] | None] | None:
        if self.features is None:
            return None
        out = []
        for c in configs:
            k = config_key(c)
            if k not in self._extra:
                self._extra[k] = self.features(c)
            out.append(self._extra[k])
        return out

    def _score(self, configs: list[Config]) -> np.ndarray:
        return self.model.predict(configs, self._extras(configs))

    def _evolve(self, taken: set[str]) -> list[Config]:
        """The unseen valid configurations met while evolving (not in `taken`), in the order first met."""
        ok = sorted((r for r in self._results.values() if r[1] is not None), key=lambda r: r[1])
        elite = [dict(c) for c, _ in ok[: self.elite] if self._sampler.ok(c)]
        fill = self._sampler.draw(self.population - len(elite), taken)
        found: dict[str, Config] = {}

        def meet(c: Config) -> None:
            k = config_key(c)
            if k not in self._sampler.seen and k not in taken:
                found.setdefault(k, c)

        for c in fill:
            meet(c)
        rest, rest_scores = fill, self._score(fill)
        for _ in range(self.generations):
            pop = elite + rest
            scores = np.concatenate([self._score(elite), rest_scores]) if elite else rest_scores
            children: dict[str, Config] = {}
            for _ in range(4 * self.population):
                if len(children) >= self.population:
                    break
                if len(pop) < 2 or self.rng.random() < self.mutation_prob:
                    child = self._mutate(self._tournament(pop, scores))
                else:
                    child = self._crossover(self._tournament(pop, scores), self._tournament(pop, scores))
                k = config_key(child)
                if k not in children and self._sampler.ok(child, k):
                    children[k] = child
                    meet(child)
            if not children:
                break
            # survivors: the best by predicted score among last survivors and children (elites always stay)
            cand = list({config_key(c): c for c in rest + list(children.values())}.values())
            cs = self._score(cand)
            keep = np.argsort(-cs, kind="stable")[: max(1, self.population - len(elite))]
            rest, rest_scores = [cand[i] for i in keep], cs[keep]
        return list(found.values())

    def _tournament(self, pop: list[Config], scores: np.ndarray) -> Config:
        i, j = self.rng.randrange(len(pop)), self.rng.randrange(len(pop))
        return pop[i] if scores[i] >= scores[j] else pop[j]

    def _mutate(self, parent: Config) -> Config:
        child = dict(parent)
        knobs = [k for k in self.space.knobs if len(k.choices) > 1]
        if not knobs:
            return child
        for knob in self.rng.sample(knobs, min(len(knobs), 1 if self.rng.random() < 0.7 else 2)):
            i = self._index[knob.name].get(config_key({"v": child.get(knob.name)}))
            if i is not None and self.rng.random() < self.neighbour_prob:
                step = self.rng.choice((-1, 1))
                j = i + step if 0 <= i + step < len(knob.choices) else i - step  # bounce off either end
            else:
                j = self.rng.choice([x for x in range(len(knob.choices)) if x != i])
            child[knob.name] = knob.choices[j]
        return child

    def _crossover(self, a: Config, b: Config) -> Config:
        return {k.name: (a if self.rng.random() < 0.5 else b).get(k.name) for k in self.space.knobs}


STRATEGIES: dict[str, Callable[..., Any]] = {"random": RandomSearch, "evolutionary": EvolutionarySearch}


def make_strategy(name: str, space: Space, seed: int = 0, **kw: Any) -> RandomSearch | EvolutionarySearch:
    """The strategy called `name` ("random" or "evolutionary") over `space`; keyword options go to its class."""
    if name not in STRATEGIES:
        raise ArgumentError(f"unknown search strategy {name!r}: one of {', '.join(STRATEGIES)}")
    return STRATEGIES[name](space, seed, **kw)
