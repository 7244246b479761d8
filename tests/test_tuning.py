"""The autotuner end to end on the CPU (codegen.tune): the space from the rules, build(schedule=...), tuning that
beats the untuned rules, the journal surviving a killed tuner (resume re-measures nothing), the Ray back end,
wrong candidates refused, and `build` reading the database."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from codegen import build, gpu_available
from codegen.tune.cli import main as cli_main
from codegen.tune.keys import shape_key, target_key, workload_key
from codegen.tune.measure import TimingPolicy, cuda_timer
from codegen.tune.ray_executor import RayExecutor
from codegen.tune.tuner import autotune
from loopir import blocks, te, workloads
from loopir.errors import ArgumentError, ArgumentTypeError
from loopir.subst import substitute_sizes
from schedules import Schedule, auto_schedule
from schedules.tuning.database import Database
from schedules.tuning.record import Knob, Trial, config_key
from schedules.tuning.space import options, space_for
from codegen.structure import structural_key
from tuning_refs import softmax_off_by_one, softmax_reference

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAST = TimingPolicy(min_repeat=5, max_repeat=40, max_seconds=0.5)
TWO_CPUS = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="the thread-count knob needs 2 CPUs")


# ----------------------------------------------------------------------------- the space


def test_space_follows_the_plan():
    sm = space_for(list(workloads.softmax().outputs), "cuda", {"m": 8192, "n": 8192})
    assert {k.name for k in sm.knobs} == {"threads", "rows.wide_threads", "fuse"}
    # fixed sizes: register rows (measured first), the shared row a candidate
    fixed = space_for(list(workloads.softmax(m=8192, n=8192).outputs), "cuda")
    assert "rows.register_row_max" in {k.name for k in fixed.knobs} and fixed.default["rows.register_row_max"] == 16384
    assert options({**fixed.default, "rows.register_row_max": 0}, fixed.default)[0] == {"rows": {"register_row_max": 0}}
    # short rows: a block per row today, warp rows below a higher threshold (the knobs that change the plan only)
    short = space_for(list(workloads.softmax().outputs), "cuda", {"m": 65536, "n": 512})
    assert {k.name for k in short.knobs} == {"threads", "rows.warp_row_max", "rows.warp_lanes", "fuse"}
    assert short.default["rows.warp_row_max"] == 0
    gh = space_for(list(workloads.matmul_bias_relu(dtype="float16").outputs), "cuda",
                   {"n": 4096, "m": 4096, "p": 4096})
    assert {k.name for k in gh.knobs} == {"gemm.mma.block", "gemm.mma.warp", "gemm.mma.k_tile", "gemm.wgmma.block"}
    assert gh.default == {"gemm.mma.block": (128, 128), "gemm.mma.warp": (64, 64), "gemm.mma.k_tile": 32,
                          "gemm.wgmma.block": (128, 256)}
    # a wgmma tile chosen asks for that recipe; an mma.sync tile chosen (wgmma at its default) for mma.sync
    assert options({**gh.default, "gemm.wgmma.block": (128, 128)}, gh.default)[0] == {
        "gemm": {"wgmma": {"block": (128, 128)}, "tensor_cores": True}}
    assert options({**gh.default, "gemm.mma.k_tile": 64}, gh.default)[0] == {  # the recipe's tiles go together
        "gemm": {"mma": {"block": (128, 128), "warp": (64, 64), "k_tile": 64}, "tensor_cores": True}}
    gf = space_for(list(workloads.matmul_bias_relu().outputs), "cuda", {"n": 4096, "m": 4096, "p": 4096})
    assert {k.name for k in gf.knobs} == {"gemm.block", "gemm.thread_tile", "gemm.k_tile"}
    cpu = space_for(list(workloads.matmul_bias_relu(64, 64, 64).outputs), "cpu")
    assert {k.name for k in cpu.knobs} == {"gemm.cpu_tile", "build.threads"}
    for sp in (sm, short, gh, gf, cpu):
        assert sp.check(sp.default) is None
        assert all(sp.default[k.name] in k.choices for k in sp.knobs)
        assert options(sp.default, sp.default) == ({}, {})  # the default configuration is the untuned build


def test_space_of_a_skinny_gemm_tunes_split_k_and_moves_its_tiles_together():
    wl = workloads.matmul_bias_relu(n=16, m=4096, p=4096)
    sp = space_for(list(wl.outputs), "cuda")
    assert {k.name for k in sp.knobs} == {"gemm.block", "gemm.thread_tile", "gemm.k_tile", "gemm.split_k"}
    assert sp.default["gemm.split_k"] == 512 and sp.default["gemm.block"] == (16, 128)
    assert sp.check(sp.default) is None and options(sp.default, sp.default) == ({}, {})
    # one tile changed: the planner's other skinny choices go with it (alone they would fall back to (64, 128), ...)
    sched = options({**sp.default, "gemm.k_tile": 16}, sp.default)[0]
    assert sched == {"gemm": {"block": (16, 128), "thread_tile": (4, 4), "k_tile": 16, "split_k": 512}}
    for chunk, launches in ((0, 1), (1024, 2)):
        sched = options({**sp.default, "gemm.split_k": chunk}, sp.default)[0]
        assert sched["gemm"]["split_k"] == chunk
        s = auto_schedule(list(wl.outputs), target="cuda", **sched)
        g = s.plan.groups[0]
        assert g.gemm["block"] == (16, 128) and g.cost.launches == launches
        assert (f"split k by {chunk}; rfactor(matmul" in s.plan.explain()) == bool(chunk)
    assert "not a multiple of k_tile 16" in sp.check({**sp.default, "gemm.split_k": 600, "gemm.k_tile": 16})
    # half inputs of 16 rows: the skinny plan's tensor-core tiles are the default, moved together with the split
    wh = workloads.matmul_bias_relu(n=16, m=4096, p=4096, dtype="float16")
    sh = space_for(list(wh.outputs), "cuda")
    assert sh.default == {"gemm.mma.block": (16, 64), "gemm.mma.warp": (16, 32), "gemm.mma.k_tile": 32,
                          "gemm.split_k": 512}
    assert sh.check(sh.default) is None and options(sh.default, sh.default) == ({}, {})
    sched = options({**sh.default, "gemm.mma.block": (32, 64), "gemm.split_k": 0}, sh.default)[0]
    assert sched == {"gemm": {"mma": {"block": (32, 64), "warp": (16, 32), "k_tile": 32}, "tensor_cores": True,
                              "split_k": 0}}
    s = auto_schedule(list(wh.outputs), target="cuda", **sched)
    assert s.plan.groups[0].cost.launches == 1 and "tiles {'block': (16, 64)" in s.plan.explain()  # fit to 16 rows
    sched = options({**sh.default, "gemm.mma.k_tile": 64}, sh.default)[0]
    s = auto_schedule(list(wh.outputs), target="cuda", **sched)
    assert s.plan.groups[0].cost.launches == 2 and "'k_tile': 64" in s.plan.explain()
    assert "not a multiple of k_tile 64" in sh.check({**sh.default, "gemm.mma.k_tile": 64, "gemm.split_k": 608})
    # a square GEMM has no split to tune
    assert "gemm.split_k" not in {k.name for k in space_for(list(workloads.matmul_bias_relu(256, 256, 256).outputs),
                                                            "cuda").knobs}


def test_space_of_attention_and_of_a_block():
    # the attention chain alone is mapped by fixed rules (schedule_attention): nothing to vary; inside a block the
    # chain is one online kernel of the plan, so its scores matmul brings no GEMM knobs of its own
    att = workloads.naive_attention(te.var("B"), te.var("n"), te.var("m"), 64, "causal", dtype="float16")
    sp = space_for(list(att.outputs), "cuda", {"B": 64, "n": 1024, "m": 1024})
    assert sp.knobs == () and sp.size() == 1 and sp.check(sp.default) is None
    blk = blocks.gpt2(dtype="float16")
    names = {k.name for k in space_for(list(blk.outputs), "cuda", {"B": 8, "T": 1024}).knobs}
    assert {"gemm.mma.block", "gemm.mma.warp", "gemm.mma.k_tile", "threads"} <= names
    assert not any(n in names for n in ("gemm.block", "gemm.thread_tile", "gemm.k_tile"))


def test_check_prunes_with_the_reason():
    gh = space_for(list(workloads.matmul_bias_relu(dtype="float16").outputs), "cuda",
                   {"n": 4096, "m": 4096, "p": 4096})
    bad = {**gh.default, "gemm.mma.block": (64, 64), "gemm.mma.warp": (64, 128)}
    assert "not a multiple of the warp tile" in gh.check(bad)
    big = {**gh.default, "gemm.mma.block": (256, 256), "gemm.mma.warp": (64, 64), "gemm.mma.k_tile": 64}
    assert "bytes" in gh.check(big)
    spill = {**gh.default, "gemm.mma.block": (128, 128), "gemm.mma.warp": (128, 64)}
    assert "accumulators per lane" in gh.check(spill)
    gf = space_for(list(workloads.matmul_bias_relu().outputs), "cuda", {"n": 4096, "m": 4096, "p": 4096})
    assert "threads per block" in gf.check({**gf.default, "gemm.block": (128, 128), "gemm.thread_tile": (2, 1)})


def test_options_map_knobs_to_auto_schedule_and_build():
    cfg = {"threads": 256, "rows.wide_threads": 1024, "gemm.mma.k_tile": 64, "build.threads": 1, "fuse": False}
    sched, bopts = options(cfg)
    assert sched == {"threads": 256, "rows": {"wide_threads": 1024}, "gemm": {"mma": {"k_tile": 64},
                                                                              "tensor_cores": True},
                     "fuse": False}
    assert bopts == {"threads": 1}


# ----------------------------------------------------------------------------- build(schedule=...)


def test_build_schedule_option_is_checked_and_keyed():
    w = workloads.matmul_bias_relu(48, 40, 24)
    outs, args = list(w.outputs), list(w.args)
    with pytest.raises(ArgumentError, match="unknown schedule option 'bogus'"):
        build(outs, args, "cpu", schedule={"bogus": 1})
    with pytest.raises(ArgumentTypeError, match="must be a dict"):
        build(outs, args, "cpu", schedule=[("fuse", False)])
    with pytest.raises(ArgumentError, match="already scheduled"):
        build(Schedule(outs), args, "cpu", schedule={"fuse": False})
    a = build(outs, args, "cpu", schedule={"gemm": {"cpu_tile": (2, 16)}})
    b = build(outs, args, "cpu")
    assert a.source != b.source and a.trace and '"primitive"' in a.trace
    rng = np.random.default_rng(1)
    ins = [rng.standard_normal(shape).astype(np.float32) for shape in ((48, 24), (24, 40), (40,))]
    for mod in (a, b):
        out = np.full((48, 40), np.nan, np.float32)
        mod(*ins, out)
        np.testing.assert_allclose(out, w.reference(*ins)[0], rtol=1e-4, atol=1e-4)


def test_build_forces_tensor_cores_on_cuda_source():
    w = workloads.matmul_bias_relu(256, 256, 256, dtype="float16")
    src = build(list(w.outputs), list(w.args), "cuda", schedule={
        "gemm": {"tensor_cores": True, "mma": {"block": (64, 128), "warp": (32, 64), "k_tile": 64}}}).source
    assert "mma.sync.aligned.m16n8k16" in src
    simt = build(list(w.outputs), list(w.args), "cuda", schedule={"gemm": {"tensor_cores": False}}).source
    assert "mma.sync" not in simt


def test_trace_replays_to_the_same_schedule():
    w = workloads.softmax(16, 96)
    mod = build(list(w.outputs), list(w.args), "cpu", schedule={"fuse": False})
    again = Schedule.replay(mod.trace, list(w.outputs))
    ref = auto_schedule(list(w.outputs), "cpu", fuse=False)
    assert structural_key(again.program) == structural_key(ref.program)


# ----------------------------------------------------------------------------- tuning


def _softmax():
    w = workloads.softmax()
    return list(w.outputs), list(w.args)


@TWO_CPUS
def test_tuning_cpu_softmax_beats_the_untuned_rules(tmp_path):
    outs, args = _softmax()
    res = autotune(outs, args, "cpu", sizes={"m": 64, "n": 256}, trials=4, db=str(tmp_path / "db"), policy=FAST,
                   progress=False, plot=str(tmp_path / "tune.png"))
    assert len(res.trials) == 4 and all(t.ok for t in res.trials), res.explain()
    assert res.default is not None and res.default.config == space_for(outs, "cpu", {"m": 64, "n": 256}).default
    assert res.best.median < res.default.median and res.speedup > 1.1, res.explain()
    assert open(tmp_path / "tune.png", "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    # build takes the tuned configuration (the database named), and says which trial it came from
    x = np.random.default_rng(2).standard_normal((64, 256)).astype(np.float32)
    mod = build(outs, args, "cpu", sizes={"m": 64, "n": 256}, tuned=str(tmp_path / "db"))
    note = [n for n in mod.notes if n.startswith("tuned:")]
    assert note and f"trial {res.best.trial} of run {res.best.run}" in note[0]
    y = np.full((64, 256), np.nan, np.float32)
    mod(x, y)
    np.testing.assert_allclose(y, softmax_reference(x)[0], rtol=1e-5, atol=1e-6)
    sym = build(outs, args, "cpu", tuned=str(tmp_path / "db"))  # sizes symbolic: the largest tuned shape
    assert any("largest tuned shape 64x256x64x256" in n for n in sym.notes)
    plain = build(outs, args, "cpu", sizes={"m": 64, "n": 256}, tuned=False)
    assert not any(n.startswith("tuned:") for n in plain.notes)


@TWO_CPUS
def test_tuning_cpu_gemm_beats_the_untuned_rules(tmp_path):
    w = workloads.matmul_bias_relu()
    res = autotune(list(w.outputs), list(w.args), "cpu", sizes={"n": 64, "m": 64, "p": 64}, trials=10,
                   db=str(tmp_path / "db"), policy=FAST, progress=False, strategy="random", seed=3)
    assert sum(t.ok for t in res.trials) >= 8, res.explain()
    assert res.speedup > 1.1, res.explain()
    assert "gemm.cpu_tile" in res.best.config


def test_wrong_candidates_never_rank(tmp_path):
    outs, args = _softmax()
    res = autotune(outs, args, "cpu", sizes={"m": 8, "n": 32}, trials=2, db=str(tmp_path / "db"), policy=FAST,
                   progress=False, reference=softmax_off_by_one)
    assert [t.status for t in res.trials] == ["wrong", "wrong"] and res.best is None
    assert "relative error" in res.trials[0].error


def test_bad_sizes_and_targets_are_refused(tmp_path):
    outs, args = _softmax()
    db = str(tmp_path / "db")
    with pytest.raises(ArgumentError, match="symbolic size 'n'"):
        autotune(outs, args, "cpu", sizes={"m": 8}, trials=1, db=db, progress=False)
    with pytest.raises(ArgumentError, match="sizes names 'k', which no argument's shape uses"):
        autotune(outs, args, "cpu", sizes={"m": 8, "n": 8, "k": 4}, trials=1, db=db, progress=False)
    with pytest.raises(ArgumentError, match=r"sizes\['n'\] must be a positive int"):
        autotune(outs, args, "cpu", sizes={"m": 8, "n": 0}, trials=1, db=db, progress=False)
    with pytest.raises(ArgumentError, match="target must be 'cuda' or 'cpu'"):
        autotune(outs, args, "gpu", sizes={"m": 8, "n": 8}, trials=1, db=db, progress=False)
    with pytest.raises(ArgumentError, match="trials must be a positive int"):
        autotune(outs, args, "cpu", sizes={"m": 8, "n": 8}, trials=0, db=db, progress=False)
    assert not os.path.exists(os.path.join(db, "journal.jsonl"))  # refused before anything was measured


@pytest.mark.skipif(gpu_available(), reason="checks the refusal where no GPU is visible")
def test_cuda_without_a_gpu_is_refused(tmp_path):
    outs, args = _softmax()
    with pytest.raises(ArgumentError, match="none is visible"):
        autotune(outs, args, "cuda", sizes={"m": 8, "n": 8}, trials=1, db=str(tmp_path / "db"), progress=False)


_KILLED = """
import sys
sys.path[:0] = [{root!r}, {tests!r}]
from codegen.tune.measure import TimingPolicy, cuda_timer
from codegen.tune.ray_executor import RayExecutor
from codegen.tune.tuner import autotune
from loopir import workloads
if __name__ == "__main__":
    w = workloads.matmul_bias_relu()
    autotune(list(w.outputs), list(w.args), "cpu", sizes={{"n": 32, "m": 32, "p": 32}}, trials=14, db={db!r},
             policy=TimingPolicy(min_repeat=10**6, max_repeat=10**6, max_seconds=0.4), progress=False,
             strategy="random", batch=2)  # every trial times for 0.4 s: the kill lands mid-run
"""


def _lines(path: str) -> list[str]:
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [x for x in f.read().split("\n") if x]


def test_killed_tuner_loses_nothing_and_resumes(tmp_path):
    db = str(tmp_path / "db")
    script = tmp_path / "tune.py"
    script.write_text(_KILLED.format(root=ROOT, tests=os.path.join(ROOT, "tests"), db=db))
    p = subprocess.Popen([sys.executable, str(script)], start_new_session=True)
    journal = os.path.join(db, "journal.jsonl")
    deadline = time.time() + 240
    while len(_lines(journal)) < 3 and time.time() < deadline and p.poll() is None:
        time.sleep(0.2)
    os.killpg(p.pid, signal.SIGKILL)  # the tuner and its workers, mid-run
    p.wait()
    before = _lines(journal)
    assert 3 <= len(before) < 14, "the tuner should have been killed mid-run"
    w = workloads.matmul_bias_relu()
    res = autotune(list(w.outputs), list(w.args), "cpu", sizes={"n": 32, "m": 32, "p": 32}, trials=14, db=db,
                   policy=FAST, progress=False, strategy="random", batch=2)
    after = _lines(journal)
    assert after[: len(before)] == before  # nothing completed was lost or rewritten
    keys = [config_key(json.loads(x)["config"]) for x in after]
    assert len(keys) == len(set(keys)) == 14  # nothing measured twice
    assert res.resumed == len(before) and len(res.trials) == 14 - len(before)


def test_cli_tunes_and_summarizes(tmp_path, capsys):
    db = str(tmp_path / "db")
    assert cli_main(["tune", "loopir.workloads:softmax", "--kwargs", "m=8,n=32", "--target", "cpu", "--trials",
                     "2", "--db", db]) == 0
    out = capsys.readouterr().out
    assert "2 trials this run (2 ok)" in out and "best:" in out
    assert cli_main(["db", "--db", db]) == 0
    assert "2 trials, best" in capsys.readouterr().out
    share = str(tmp_path / "team.jsonl")
    assert cli_main(["db", "--db", db, "--export", share]) == 0
    assert cli_main(["db", "--db", str(tmp_path / "other"), "--import", share]) == 0
    out = capsys.readouterr().out
    assert "exported 2 trials" in out and "imported 2 trials" in out


def test_keys():
    a, b = workloads.softmax(), workloads.softmax()
    assert workload_key(list(a.outputs), list(a.args)) == workload_key(list(b.outputs), list(b.args))
    c = workloads.softmax(dtype="float16")
    assert workload_key(list(c.outputs), list(c.args)) != workload_key(list(a.outputs), list(a.args))
    fixed = substitute_sizes(list(a.outputs), {a.sizes[0]: 8})
    assert workload_key([fixed[a.outputs[0]]], [fixed.get(x, x) for x in a.args]) != workload_key(
        list(a.outputs), list(a.args))
    assert shape_key(list(a.args), {"m": 8, "n": 32}) == "8x32x8x32"
    k1, d1 = target_key("cpu")
    assert k1 == target_key("cpu")[0] and d1["target"] == "cpu" and "loopir" in d1
    n = te.var("n")
    x = te.placeholder((n,), "float32", name="x")
    assert shape_key([x], {"n": 5}) == "5"


def test_tuning_through_the_ray_back_end(tmp_path):
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
    try:
        ex = RayExecutor(devices=0)  # one run actor, builds as Ray tasks: 2 local workers
        outs, args = _softmax()
        res = autotune(outs, args, "cpu", sizes={"m": 16, "n": 64}, trials=3, db=str(tmp_path / "db"),
                       executor=ex, policy=FAST, progress=False)
        ex.close()
    finally:
        ray.shutdown()
    assert len(res.trials) == 3 and all(t.ok for t in res.trials), res.explain()
    assert len(_lines(str(tmp_path / "db" / "journal.jsonl"))) == 3


def test_unpicklable_reference_is_refused(tmp_path):
    outs, args = _softmax()
    with pytest.raises(ArgumentError, match="reference must be picklable"):
        autotune(outs, args, "cpu", sizes={"m": 8, "n": 8}, trials=1, db=str(tmp_path / "db"), progress=False,
                 reference=lambda x: (x,))


_UNGUARDED = """
import sys
sys.path[:0] = [{root!r}]
from codegen import autotune
from codegen.tune.measure import TimingPolicy, cuda_timer
from loopir import workloads
w = workloads.softmax()
res = autotune(list(w.outputs), list(w.args), "cpu", sizes={{"m": 8, "n": 32}}, trials=2, db={db!r}, progress=False,
               policy=TimingPolicy(min_repeat=3, max_repeat=5))
print("RESULT", len(res.trials), sum(t.ok for t in res.trials))
"""


def test_a_script_without_a_main_guard_tunes_once(tmp_path):
    # the spawned workers must not re-run the user's script (multiprocessing's spawn imports __main__)
    script = tmp_path / "tune.py"
    script.write_text(_UNGUARDED.format(root=ROOT, db=str(tmp_path / "db")))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.count("RESULT") == 1 and "RESULT 2 2" in out.stdout


def test_the_tuning_example_and_the_command_on_its_workload(tmp_path, capsys):
    out = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "tune.py"), "--cpu", "--small", "--trials",
                          "3", "--db", str(tmp_path / "db")], capture_output=True, text=True, timeout=240,
                         env=dict(os.environ, PYTHONPATH=ROOT), cwd=ROOT)
    assert out.returncode == 0 and "MISMATCH" not in out.stdout, out.stdout[-2000:] + out.stderr[-2000:]
    assert "3 trials this run (3 ok)" in out.stdout and "tuned: " in out.stdout
    assert cli_main(["tune", os.path.join(ROOT, "examples", "tune.py") + ":workload", "--sizes", "m=8,n=64",
                     "--target", "cpu", "--trials", "2", "--db", str(tmp_path / "db2")]) == 0
    assert "2 trials this run (2 ok)" in capsys.readouterr().out


def test_args_default_to_lowers_order(tmp_path):
    w = workloads.layernorm()
    res = autotune(list(w.outputs), None, "cpu", sizes={"m": 8, "n": 32}, trials=1, db=str(tmp_path / "db"),
                   policy=FAST, progress=False)
    assert res.shape == "8x32x32x32x8x32" and res.trials[0].ok  # x, weight, bias, y
    mod = build(list(w.outputs), list(w.args), "cpu", sizes={"m": 8, "n": 32}, tuned=str(tmp_path / "db"))
    assert any(n.startswith("tuned:") for n in mod.notes)  # the same workload key as with args given


@pytest.mark.gpu
def test_tuning_on_the_gpu(tmp_path):
    w = workloads.softmax(dtype="float16")
    outs, args = list(w.outputs), list(w.args)
    sizes = {"m": 4096, "n": 512}
    res = autotune(outs, args, "cuda", sizes=sizes, trials=6, db=str(tmp_path / "db"), policy=FAST, progress=False)
    assert len(res.trials) == 6 and all(t.ok for t in res.trials), res.explain()
    assert res.best.median <= res.default.median
    mod = build(outs, args, "cuda", sizes=sizes, tuned=str(tmp_path / "db"))
    assert any(f"trial {res.best.trial} of run {res.best.run}" in n for n in mod.notes)
    x = np.random.default_rng(5).standard_normal((4096, 512)).astype(np.float16)
    y = np.full((4096, 512), np.nan, np.float16)
    mod(x, y)
    np.testing.assert_allclose(y.astype(np.float64), softmax_reference(x)[0], rtol=2e-2, atol=2e-3)


def test_call_time_variants_take_their_row_class_options(tmp_path):
    # the shape-bucket dispatch: a symbolic build's variant for short rows takes the trial tuned at a short row,
    # the variant for long rows the one tuned at a long row (trials written by hand: what matters is the choice)
    w = workloads.softmax()
    outs, args = list(w.outputs), list(w.args)
    wk, tk = workload_key(outs, args), target_key("cpu")[0]
    db = Database(str(tmp_path / "db"))
    for shape, fuse, ms in (("64x64x64x64", False, 1.0), ("64x2000x64x2000", True, 2.0)):
        db.append(Trial(wk, tk, shape, {"fuse": fuse}, "ok", (ms * 1e-3,), run="hand", trial=int(fuse),
                        meta={"options": [{"fuse": fuse}, {}]}))
    mod = build(outs, args, "cpu", tuned=str(tmp_path / "db"))
    rng = np.random.default_rng(3)
    for n in (64, 2000):
        x = rng.standard_normal((8, n)).astype(np.float32)
        y = np.full((8, n), np.nan, np.float32)
        mod(x, y)
        np.testing.assert_allclose(y, softmax_reference(x)[0], rtol=1e-5, atol=1e-6)
    notes = {str(k): [x for x in v.notes if x.startswith("tuned:")] for k, v in mod.specializer.variants.items()}
    short = [v for k, v in notes.items() if "n<=64" in k]
    long_ = [v for k, v in notes.items() if "n<=2048" in k]
    assert short and "trial 0 of run hand" in short[0][0] and "n <= 64" in short[0][0]
    assert long_ and "trial 1 of run hand" in long_[0][0]


def test_bad_gemm_tensor_core_options_are_named():
    w = workloads.matmul_bias_relu(64, 64, 64, dtype="float16")
    with pytest.raises(ArgumentError, match="gemm tensor_cores must be None, True or False, got 'yes'"):
        auto_schedule(list(w.outputs), "cuda", gemm={"tensor_cores": "yes"})
    with pytest.raises(ArgumentError, match=r"gemm mma must be a dict with some of block, warp, k_tile, got \{'tile'"):
        auto_schedule(list(w.outputs), "cuda", gemm={"mma": {"tile": 32}})
    with pytest.raises(ArgumentError, match=r"block \(64, 64\), warp \(48, 64\), k_tile 32"):
        auto_schedule(list(w.outputs), "cuda", gemm={"mma": {"block": (64, 64), "warp": (48, 64)}})


@pytest.mark.parametrize("spec, match", [
    ("softmax", "expected FILE:FUNCTION or MODULE:FUNCTION, got 'softmax'"),
    ("no_such_dir/x.py:f", "no file 'no_such_dir/x.py'"),
    ("no_such_module_xyz:f", "no module 'no_such_module_xyz'"),
    ("loopir.workloads:no_such_function", "'loopir.workloads' has no function 'no_such_function'"),
    ("os:getcwd", "os:getcwd must return a Workload or \\(outputs, args\\[, sizes\\]\\), got str"),
    ("loopir.workloads:Workload", "calling loopir.workloads:Workload with no arguments failed: .*missing"),
])
def test_cli_names_a_bad_function(spec, match, tmp_path):
    with pytest.raises(SystemExit, match=match):
        cli_main(["tune", spec, "--target", "cpu", "--trials", "1", "--db", str(tmp_path / "db")])


def test_bad_records_and_outputs_are_named(tmp_path):
    with pytest.raises(ArgumentError, match="knob 'threads' has no choices"):
        Knob("threads", ())
    with pytest.raises(ArgumentError, match="trial status 'done' is not one of ok, invalid"):
        Trial("w", "t", "8", {}, "done")
    with pytest.raises(ArgumentError, match="a trial with status 'ok' needs its times"):
        Trial("w", "t", "8", {}, "ok")
    with pytest.raises(ArgumentTypeError, match="autotune takes a te tensor or a list of them"):
        autotune("y", None, "cpu", trials=1, db=str(tmp_path / "db"), progress=False)


def test_cuda_timer_refuses_a_cpu_module():
    w = workloads.softmax(4, 8)
    mod = build(list(w.outputs), list(w.args), "cpu")
    with pytest.raises(ArgumentTypeError, match="cuda_timer needs a CUDA module, got CpuModule"):
        cuda_timer(mod, [np.ones((4, 8), np.float32), np.empty((4, 8), np.float32)])
