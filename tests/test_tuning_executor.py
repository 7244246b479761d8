"""The autotuner's measurement layer: the local and Ray executors (results streamed, timeouts, dead workers,
long-lived run workers) and `time_until_stable` on fake timers; `cuda_timer` on a GPU.

The jobs are `tuning_jobs.act` (tests/tuning_jobs.py): the workers import it because they put the parent's
sys.path (tests/ is on it under pytest) in front of theirs. Both executors run on the CPU with two workers'
worth of cores (Ray: `ray.init(num_cpus=2)`, one CPU for the run actor, one for build tasks)."""

from __future__ import annotations

import os
import pickle
import threading
import time

import numpy as np
import pytest
import tuning_jobs
from tuning_jobs import act

from codegen import build
from codegen.tune import ray_executor
from codegen.tune.executor import LocalExecutor, Outcome, core_sets, visible_gpus
from codegen.tune.feed import Feed, as_feed
from codegen.tune.measure import TimingPolicy, cpu_timer, cuda_timer, is_stable, median_ci, time_until_stable
from loopir import workloads
from loopir.errors import ArgumentError, ArgumentTypeError

# seconds a job may run; Ray's are longer because a build task's clock starts at submission and a fresh Ray
# worker takes a second or two to start on a loaded two-core machine (after the timeout test's kill, the next build
# task waits for one: at 5 s both quick jobs timed out in a CI run beside the whole suite)
TIMEOUT = {"local": 2.0, "ray": 10.0}


@pytest.fixture(scope="module")
def local():
    with LocalExecutor(build_workers=2, devices=0) as ex:  # devices=0: CPU run workers even where GPUs are
        yield ex


@pytest.fixture(scope="module")
def ray_ex():
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        ex = ray_executor.RayExecutor(devices=0)
        # the first task and the actor start their workers here, not inside a test's timeout
        assert [o.value for _, o in ex.builds(act, [("square", 2)], timeout=60)] == [4]
        assert [o.ok for _, o in ex.runs(act, [("square", 2)], timeout=60)] == [True]
        yield ex
        ex.close()
    finally:
        ray.shutdown()


@pytest.fixture(params=["local", "ray"])
def ex(request):
    return request.getfixturevalue("local" if request.param == "local" else "ray_ex")


def _kind(ex) -> str:
    return "local" if isinstance(ex, LocalExecutor) else "ray"


def _collect(stream):
    """[(index, outcome, seconds since the start)] in the order yielded."""
    t0 = time.monotonic()
    return [(i, o, time.monotonic() - t0) for i, o in stream]


@pytest.mark.parametrize("how", ["builds", "runs"])
def test_results_are_streamed_as_completed(ex, how):
    jobs = [("square", 3), ("sleep", 2.0), ("square", 4)]
    got = _collect(getattr(ex, how)(act, jobs, timeout=TIMEOUT[_kind(ex)] + 10))
    assert sorted(i for i, _, _ in got) == [0, 1, 2]
    out = {i: o for i, o, _ in got}
    assert [out[0].value, out[1].value, out[2].value] == [9, "slept", 16] and all(o.ok for o in out.values())
    assert out[1].seconds >= 2.0 and out[0].seconds < 1.0  # the job's own time, measured in the worker
    first = min(t for i, _, t in got if i == 0)
    assert first < max(t for _, _, t in got) - 1.5  # job 0 came out while the sleeper still ran
    assert all(o.worker for o in out.values())


def test_local_builds_complete_out_of_order(local):
    for _ in range(20):  # both build workers started (one may be restarting after an earlier test's kill)
        if len({o.worker for _, o in local.builds(act, [("sleep", 0.3)] * 2, timeout=60)}) == 2:
            break
    got = _collect(local.builds(act, [("sleep", 1.5), ("square", 2), ("square", 3)], timeout=10))
    assert [i for i, _, _ in got] == [1, 2, 0]  # two workers: the quick jobs pass the sleeper
    assert {o.worker for _, o, _ in got} == {"cpu-build-0", "cpu-build-1"}


@pytest.mark.parametrize("how", ["builds", "runs"])
def test_timeout_kills_the_job_and_the_rest_run(ex, how):
    timeout = TIMEOUT[_kind(ex)]
    t0 = time.monotonic()
    out = dict(getattr(ex, how)(act, [("sleep", 120.0), ("square", 5), ("square", 6)], timeout=timeout))
    assert out[0].error == f"timeout after {timeout:.1f} s" and not out[0].ok
    assert timeout <= out[0].seconds < timeout + 5
    assert (out[1].value, out[2].value) == (25, 36)
    assert time.monotonic() - t0 < timeout + 20  # the sleeper was killed, not waited for


@pytest.mark.parametrize("how", ["builds", "runs"])
def test_a_dying_job_is_reported_and_the_rest_run(ex, how):
    jobs = [("exit", 3), ("square", 2), ("sigkill", 0), ("square", 3)]
    out = dict(getattr(ex, how)(act, jobs, timeout=TIMEOUT[_kind(ex)] + 25))
    assert out[0].error.startswith("worker died (") and out[2].error.startswith("worker died (")
    assert not out[0].ok and not out[2].ok
    if _kind(ex) == "local":
        assert (out[0].error, out[2].error) == ("worker died (exit code 3)", "worker died (exit code -9)")
    assert (out[1].value, out[3].value) == (4, 9)


def test_an_exception_is_the_jobs_error(ex):
    (i, o), = ex.builds(act, [("raise", 7)], timeout=30)
    assert (i, o.ok, o.value) == (0, False, None)
    assert o.error.startswith("ZeroDivisionError: job 7 divides by zero")
    assert "tuning_jobs.py" in o.error and "run_job" not in o.error  # the job's frames, not the worker's


def test_run_workers_are_long_lived(ex):
    first = dict(ex.runs(act, [("count", 0)] * 4, timeout=30))
    later = dict(ex.runs(act, [("count", 0)] * 2, timeout=30))  # a second call: still the same process
    seen = [first[i].value for i in range(4)] + [later[i].value for i in range(2)]
    assert len({pid for pid, _ in seen}) == 1 and {o.worker for o in [*first.values(), *later.values()]} == {
        "cpu-run-0"}
    counts = [c for _, c in seen]
    assert counts == list(range(counts[0], counts[0] + 6))  # the module-level counter grew job after job


def test_an_abandoned_stream_leaks_nothing(ex):
    it = ex.builds(act, [("square", 2), ("sleep", 120.0)], timeout=200)
    i, o = next(it)
    assert (i, o.value) == (0, 4)
    it.close()  # the sleeper is killed; its result must not reach the next call
    t0 = time.monotonic()
    assert [(i, o.value) for i, o in ex.builds(act, [("square", 7)], timeout=60)] == [(0, 49)]
    assert time.monotonic() - t0 < 30


def test_a_feed_orders_retries_and_drops():
    f = Feed([("square", 1)])
    assert f.put(("square", 2)) == 1 and f.pending == 2 and not f.done
    assert f.take() == (0, ("square", 1))
    f.retry(0, ("square", 1))  # given back: taken first
    assert f.take() == (0, ("square", 1)) and f.take() == (1, ("square", 2)) and f.take() is None
    f.put(("square", 3))
    f.close(drop=True)
    assert f.done and f.pending == 0 and f.take() is None
    with pytest.raises(RuntimeError, match="closed"):
        f.put(("square", 4))
    assert as_feed([1, 2]).done is False and as_feed(f) is f


def test_a_feed_refills_when_a_worker_is_free(ex):
    asked = []

    def more(feed):  # two waves, then the end
        asked.append(len(asked))
        if len(asked) <= 2:
            feed.put(("square", len(asked)))
            feed.put(("square", 10 + len(asked)))
        else:
            feed.close()

    got = dict(ex.builds(act, Feed(refill=more), timeout=60))
    assert {i: o.value for i, o in got.items()} == {0: 1, 1: 121, 2: 4, 3: 144}
    assert len(asked) >= 3


@pytest.mark.parametrize("how", ["builds", "runs"])
def test_a_stream_waits_for_jobs_put_later(ex, how):
    feed = Feed([("square", 3)])
    put_at = []
    t0 = time.monotonic()

    def late():
        time.sleep(1.0)
        put_at.append(time.monotonic() - t0)
        feed.put(("square", 4))
        time.sleep(0.5)
        feed.close()

    t = threading.Thread(target=late)
    t.start()
    got = [(i, o.value, time.monotonic() - t0) for i, o in getattr(ex, how)(act, feed, timeout=60)]
    t.join()
    assert [(i, v) for i, v, _ in got] == [(0, 9), (1, 16)]
    assert got[0][2] < put_at[0] <= got[1][2]  # the first job did not wait for the late one, nor for the close


def test_builds_feed_runs_without_waiting_for_the_slowest_build(ex):
    # the tuner's pipeline: each built job goes to the run workers at once, so no run waits for a batch's
    # slowest build (here a 3 s one beside two quick ones)
    builds, runs = Feed([("square", 2), ("sleep", 3.0), ("square", 3)], closed=True), Feed()
    built_at: dict[int, float] = {}
    t0 = time.monotonic()

    def build_side():
        try:
            for i, o in ex.builds(act, builds, timeout=60):
                assert o.ok
                built_at[i] = time.monotonic() - t0
                runs.put(("square", i + 10))
        finally:
            runs.close()

    t = threading.Thread(target=build_side)
    t.start()
    ran = [(i, o.value, time.monotonic() - t0) for i, o in ex.runs(act, runs, timeout=60)]
    t.join()
    assert sorted(v for _, v, _ in ran) == [100, 121, 144] and len(built_at) == 3
    assert ran[0][2] < built_at[1]  # a quick candidate ran while the slow one was still building
    assert built_at[1] >= 3.0


def test_bad_arguments_fail_in_the_call(ex):
    with pytest.raises(ArgumentTypeError, match="module-level"):
        ex.builds(lambda job: job, [1], timeout=1)
    with pytest.raises(ArgumentError, match="timeout"):
        ex.runs(act, [("square", 1)], timeout=0)
    assert list(ex.builds(act, [], timeout=1)) == []


def test_an_unpicklable_value_is_an_error_locally(local):
    (_, o), = local.builds(act, [("unpicklable", 0)], timeout=30)
    assert not o.ok and "cannot be pickled" in o.error


def test_gpu_run_workers_see_their_own_device(monkeypatch):
    # no CUDA is touched: the job reads its environment. Parent's visible GPUs "7,5": ordinal 1 is GPU "5"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7,5")
    with LocalExecutor(build_workers=1, devices=[1, 0]) as ex:
        assert (ex.devices, ex.workers) == (2, ("gpu-1", "gpu-0"))
        out = dict(ex.runs(act, [("env", 2.0)] * 2, timeout=60))  # each busy 2 s: both workers get one
    seen = {o.worker: o.value[0] for o in out.values()}
    assert seen == {"gpu-1": "5", "gpu-0": "7"}
    with pytest.raises(ArgumentError, match="not visible"):
        LocalExecutor(devices=[2])


def test_cpu_run_workers_are_pinned_apart():
    with LocalExecutor(build_workers=1, devices=0, cpu_runs=2) as ex:
        out = dict(ex.runs(act, [("env", 2.0)] * 2, timeout=60))
    cores = {o.worker: frozenset(o.value[1]) for o in out.values()}
    assert set(cores) == {"cpu-run-0", "cpu-run-1"}
    assert all(o.value[0] == "" for o in out.values())  # CPU run workers see no GPU
    if len(os.sched_getaffinity(0)) >= 2:
        assert not cores["cpu-run-0"] & cores["cpu-run-1"]
    assert core_sets(1) == [None] and len(core_sets(3)) == 3


def test_visible_gpus_reads_the_environment(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,GPU-abc,-1,2")
    assert visible_gpus() == ["0", "GPU-abc"]  # CUDA stops at the first invalid entry
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert visible_gpus() == []


def test_make_executor_and_a_missing_ray(monkeypatch):
    ex = ray_executor.make_executor("local", build_workers=1, devices=0)
    try:
        assert isinstance(ex, LocalExecutor) and ex.devices == 1
    finally:
        ex.close()
    with pytest.raises(ArgumentError, match="unknown executor kind"):
        ray_executor.make_executor("slurm")
    monkeypatch.setattr(ray_executor, "ray", None)
    with pytest.raises(ImportError, match=r"pip install loopir\[tune\]"):
        ray_executor.make_executor("ray")


def test_outcome_travels():
    o = Outcome(False, None, "timeout after 1.0 s", 1.0, "gpu-0")
    assert pickle.loads(pickle.dumps(o)) == o and tuning_jobs.act(("square", 3)) == 9


# ----------------------------------------------------------------------------- timing


class FakeTimer:
    """run_once returning the given seconds in turn (cycling), counting its calls."""

    def __init__(self, values, sleep=0.0):
        self.values, self.sleep, self.calls = list(values), sleep, 0

    def __call__(self):
        v = self.values[self.calls % len(self.values)]
        self.calls += 1
        if self.sleep:
            time.sleep(self.sleep)
        return v


def test_a_stable_timer_stops_at_min_repeat():
    policy = TimingPolicy(min_repeat=5, max_repeat=100, warmup=2)
    t = FakeTimer([1e-3])
    samples = time_until_stable(t, policy)
    assert samples == (1e-3,) * 5 and t.calls == 7  # the warm-up runs are not returned


def test_a_noisy_timer_runs_to_max_repeat():
    # +-50 % uniform noise: the median's interval is ~0.65 / sqrt(n) of it wide, 1 % would take ~4000 runs
    t = FakeTimer(1e-3 * (1 + np.random.default_rng(1).uniform(-0.5, 0.5, 200)))
    samples = time_until_stable(t, TimingPolicy(max_repeat=60, max_seconds=30))
    assert len(samples) == 60 and samples[:3] == tuple(t.values[2:5])


def test_the_median_ignores_rare_outliers():
    # one run in ten 20x slower (an interrupt): the mean's interval would never reach 1 %, the median's does
    t = FakeTimer([1e-3] * 9 + [2e-2])
    samples = time_until_stable(t, TimingPolicy(min_repeat=10, max_repeat=100, max_seconds=30))
    assert 10 <= len(samples) < 100 and 2e-2 in samples


def test_max_seconds_cuts_a_slow_noisy_timer():
    t0 = time.perf_counter()
    samples = time_until_stable(FakeTimer([1.0, 3.0], sleep=0.02), TimingPolicy(max_seconds=0.3, max_repeat=1000))
    assert 3 <= len(samples) <= 20 and time.perf_counter() - t0 < 1.5


def test_median_ci_is_the_order_statistics_interval():
    xs = list(range(1, 21))  # 20 samples: the 95 % interval of the median is [x_6, x_15]
    assert median_ci(xs) == (10.5, 6.0, 15.0)
    assert median_ci([3.0, 1.0, 2.0, 5.0, 4.0]) == (3.0, 1.0, 5.0)  # 5 samples: the range
    assert is_stable([1.0] * 5, 0.0) and not is_stable([1.0, 1.0, 1.0, 1.0, 1.02], 0.01)
    with pytest.raises(ArgumentError, match="need 1 <= min_repeat <= max_repeat, got 10 and 5"):
        TimingPolicy(min_repeat=10, max_repeat=5)
    with pytest.raises(ArgumentError, match="max_seconds > 0"):
        TimingPolicy(max_seconds=0)
    with pytest.raises(ArgumentError, match="median_ci of no samples"):
        median_ci([])


def test_cpu_timer_measures_the_call():
    seconds = cpu_timer(lambda: time.sleep(0.02))()
    assert 0.02 <= seconds < 0.5


@pytest.mark.gpu
@pytest.mark.parametrize("flush", [True, False])
def test_cuda_timer_times_and_finishes(flush):
    w = workloads.gelu()
    mod = build(list(w.outputs), list(w.args), target="cuda")  # specializing: the variant for n is timed
    sizes = {v.name: 1 << 22 for v in w.sizes}
    ins = w.random_inputs(sizes, np.random.default_rng(0))
    outs = w.empty_outputs(sizes)
    policy = TimingPolicy(flush_l2=flush, max_seconds=5.0)
    with cuda_timer(mod, w.call_args(ins, outs), policy) as run_once:
        samples = time_until_stable(run_once, policy)
        assert run_once.module is not mod and mod.specializations  # a variant ran, not the generic module
        assert run_once.launches == len(run_once.module.gen.kernels) and run_once.held
        assert all(np.isnan(o).all() for o in outs)  # nothing copied back before finish()
        run_once.finish()
    assert policy.min_repeat <= len(samples) <= policy.max_repeat and 0 < min(samples) < 0.1
    for o, r in zip(outs, w.reference(*ins)):
        np.testing.assert_allclose(o, r, rtol=w.tolerance * 10, atol=w.tolerance * 10)


@pytest.mark.gpu
def test_gpu_run_workers_time_kernels():
    with LocalExecutor(build_workers=1) as ex:  # devices=None: one run worker per visible GPU
        assert ex.devices >= 1 and ex.workers == tuple(f"gpu-{k}" for k in range(ex.devices))
        out = dict(ex.runs(act, [("gpu_time", 1 << 22)] * (2 * ex.devices), timeout=300))
    assert all(o.ok for o in out.values()), [o.error for o in out.values()]
    for o in out.values():
        env, n, median, right, _ = o.value
        assert right and n >= 5 and 0 < median < 0.1 and env not in (None, "") and "," not in env
    assert any(o.value[4] for o in out.values())  # a later job on a worker found the module an earlier one built
