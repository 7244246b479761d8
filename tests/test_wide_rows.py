"""Very wide rows on CUDA: the rfactor primitive (nest before / after, refusals with witnesses, numerics), the
split-row strategy the planner picks for rows too wide and too few to fill the GPU (softmax, layer norm,
RMSNorm at 8192, 50257 and 65536 elements, 1 to 64 rows), its thresholds as planner parameters (RowParams).

Numerics run the lowered CUDA program in the adversarial interpreter (`gpu_order="reversed"`) against float64
numpy on fresh random data with NaN-poisoned outputs; where the interpreter is too slow, the split is forced at
a row length of 3000 with a lower threshold (`rows={"split_row_min": 2048}`). Every kernel compiles with NVRTC."""

from __future__ import annotations

import numpy as np
import pytest

from codegen import build
from codegen.passes import lower
from loopir import interp, ir, te, workloads
from loopir.errors import ArgumentError, ArgumentTypeError, NotFoundError
from schedules import Schedule, ScheduleError, auto_schedule, plan_fusion
from schedules.cost import H200
from schedules.rows import RowParams, cache_worth, choose_row_strategy
from test_rows import WORKLOADS, _check_device, _check_interp, softmax

FORCE = {"split_row_min": 2048}  # test-only threshold: the split at interpreter-sized rows
SPLIT = {"split_row_min": 8192}  # the split from 8192 elements (the default splits only rows above 2**16)


def _group(s):
    (g,) = [g for g in s.plan.groups if g.strategy is not None]
    return g


# ----------------------------------------------------------------------------- the rfactor primitive


def _factored_max(n=3000, chunk=1024):
    ins, y, ref = softmax(3, n)
    s = Schedule([y])
    _, k = s.loops("row_max")
    ko, _ = s.split(k, chunk)
    return s, ko, ins, ref


def test_rfactor_moves_the_partials_into_a_nest_before_and_combines_them_in_place():
    s, ko, _, _ = _factored_max()
    part = s.rfactor("row_max", ko)
    text = str(s)
    assert part.name == "row_max_rf" and [str(d) for d in part.shape] == ["3", "3"]
    first = text.index("row_max_rf_init")
    assert first < text.index("# row_max_init")  # the partial nest runs before the reduction's nest
    assert "row_max_rf[i2, k_o2] = max(row_max_rf[i2, k_o2], x[i2, k_o2 * 1024 + k_i2])" in text
    assert "if k_o2 * 1024 + k_i2 < 3000:" in text  # the chunk's guard is copied with the partial
    assert "row_max[i] = max(row_max[i], row_max_rf[i, k_o])  # row_max" in text
    assert [h.var.name for h in s.loops("row_max")] == ["i", "k_o"]
    assert [h.var.name for h in s.loops(part.name)] == ["i2", "k_o2", "k_i2"]  # statements named after the buffer


@pytest.mark.parametrize("chunk", [1024, 7, 3000])
def test_rfactor_keeps_the_result_of_both_softmax_reductions(chunk):
    s, ko, ins, ref = _factored_max(chunk=chunk)
    s.rfactor("row_max", ko)
    _, k = s.loops("row_sum")
    ko2, _ = s.split(k, chunk)
    s.rfactor("row_sum", ko2)
    x = np.random.default_rng(chunk).standard_normal((3, 3000)).astype(np.float32)
    out = np.full((3, 3000), np.nan, np.float32)
    interp.run(s.program, x, out)
    np.testing.assert_allclose(out, ref(x), rtol=2e-5, atol=2e-6)


def _leaky_sum():
    """c[i] = c[i] * 0.5 + x[i, k]: an update that reads its own partial in another way (not reassociable)."""
    n = te.var("n")
    x = ir.buffer((4, n), dtype="float32", name="x")
    c = ir.buffer((4,), dtype="float32", name="c")
    b = ir.Builder("leaky")
    with b.loop("i", 0, 4) as i:
        with b.loop("k", 0, n) as k:
            b.store(c, (i,), c[i] * 0.5 + x[i, k], name="S")
    return b.finish([x, c])


def test_rfactor_refuses_an_update_that_is_not_reassociable_with_its_witness():
    s = Schedule(_leaky_sum())
    _, k = s.loops("S")
    ko, _ = s.split(k, 16)
    with pytest.raises(ScheduleError) as e:
        s.rfactor("S", ko)
    err = e.value
    assert err.primitive == "rfactor" and err.buffer == "c" and err.source[0] == "S" and err.sink[0] == "S"
    assert err.source[1]["i"] == err.sink[1]["i"] and err.source[1]["k"] < err.sink[1]["k"]
    assert "not C[idx] = C[idx] op e" in str(err)


def test_rfactor_refuses_partials_that_would_read_a_value_of_their_nest_before_it_is_written():
    _, y, _ = softmax(3, 3000)
    s = Schedule([y])
    s.fuse(s.loops("row_max")[0], s.loops("row_sum")[0])  # row_sum reads row_max, written in the same nest
    _, k = s.loops("row_sum")
    ko, _ = s.split(k, 1024)
    with pytest.raises(ScheduleError) as e:
        s.rfactor("row_sum", ko)
    assert e.value.buffer == "row_max" and e.value.sink[0] == "row_sum" and e.value.source[0].startswith("row_max")


def test_rfactor_bad_arguments_are_typed_errors():
    s, ko, _, _ = _factored_max()
    i = s.loops("row_max")[0]
    with pytest.raises(ArgumentTypeError):
        s.rfactor("row_max", "k_o")
    with pytest.raises(NotFoundError, match="no statement named 'nope'"):
        s.rfactor("nope", ko)
    with pytest.raises(ArgumentError, match="indexes 'row_max'"):
        s.rfactor("row_max", i)  # a spatial loop
    with pytest.raises(ArgumentError, match="does not enclose"):
        s.rfactor("row_sum", ko)
    with pytest.raises(ArgumentError, match="not a reduction"):
        s.rfactor("y", s.loops("y")[1])


# ----------------------------------------------------------------------------- the strategy and its thresholds


@pytest.mark.parametrize("n", [8192, 50257, 65536])
@pytest.mark.parametrize("rows", [1, 3, 16, 64])
def test_few_very_wide_rows_are_split_and_the_plan_says_how(n, rows):
    _, y, _ = softmax(rows, n)
    plan = plan_fusion([y], "cuda", device=H200, rows=SPLIT)
    (g,) = plan.groups
    assert g.mapping == "split" and g.strategy.name == "split"
    n_chunks = -(-n // g.strategy.chunk)
    # at least a chunk per thread of a block; else enough blocks for every SM
    assert g.strategy.chunk % g.strategy.lanes == 0
    assert rows * n_chunks >= H200.sm_count or g.strategy.chunk == g.strategy.lanes
    assert f"row strategy: split: row length {n:,}, {rows:,} row" in plan.explain()
    assert f"each row split into {n_chunks} chunks of {g.strategy.chunk:,} elements" in plan.explain()


def test_many_wide_rows_keep_a_block_per_row_and_the_thresholds_are_parameters():
    _, y, _ = softmax(1024, 50257)
    assert plan_fusion([y], "cuda", device=H200).groups[0].strategy.name == "block"
    _, y, _ = softmax(16, 50257)
    assert plan_fusion([y], "cuda", device=H200, rows={"split_rows_per_sm": 0}).groups[0].strategy.name == "block"
    assert plan_fusion([y], "cuda", device=H200, rows=RowParams(split_row_min=60000)).groups[0].mapping == "row"
    assert plan_fusion([y], "cuda", device=H200, rows={"wide_row": 100000, "split_rows_per_sm": 0,
                                                       "cluster_row_max": 0}).groups[0].strategy.lanes == 128
    assert plan_fusion([y], "cuda", device=H200).groups[0].strategy.name == "block"  # the default: 50257 < 2**17
    st = choose_row_strategy(50257, 1, [], True, 128, H200, RowParams(split_waves=1, split_threads=128,
                                                                      split_row_min=8192))
    assert st.name == "split" and st.lanes == 128 and -(-50257 // st.chunk) >= 0.9 * H200.sm_count


@pytest.mark.parametrize("bad, err", [({"nope": 1}, ArgumentError), ({"split_waves": -1}, ArgumentError),
                                      ({"split_threads": 100}, ArgumentError), ("fast", ArgumentTypeError),
                                      ({"wide_row": True}, ArgumentError)])
def test_bad_row_parameters_are_typed_errors(bad, err):
    _, y, _ = softmax(4, 8192)
    with pytest.raises(err):
        auto_schedule([y], "cuda", rows=bad)


def test_symbolic_rows_are_split_only_at_given_sizes():
    _, y, _ = softmax(te.var("m"), te.var("n"))
    assert plan_fusion([y], "cuda", device=H200).groups[0].strategy.name == "block"
    assert plan_fusion([y], "cuda", device=H200, sizes={"m": 16, "n": 50257}, rows=SPLIT).groups[0] \
        .strategy.name == "split"


# ----------------------------------------------------------------------------- numerics and compilation


@pytest.mark.parametrize("wl", sorted(WORKLOADS))
@pytest.mark.parametrize("m", [1, 3])
def test_split_rows_match_numpy_under_the_adversarial_interpreter(wl, m):
    ins, y, ref = WORKLOADS[wl](m, 3000)
    s = auto_schedule([y], "cuda", rows=FORCE)
    assert _group(s).strategy.name == "split"
    _check_interp(s, ins, ref, m, 3000, seed=m)


@pytest.mark.parametrize("wl", sorted(WORKLOADS))
@pytest.mark.parametrize("m, n", [(1, 3000), (3, 2999), (2, 1)])
def test_symbolic_split_rows_are_correct_at_every_size(wl, m, n):
    ins, y, ref = WORKLOADS[wl](te.var("m"), te.var("n"))
    s = auto_schedule([y], "cuda", sizes={"m": 3, "n": 3000}, rows=FORCE)
    assert _group(s).strategy.name == "split"
    _check_interp(s, ins, ref, m, n, seed=n)


def test_a_vocabulary_sized_row_split_over_blocks_matches_numpy():
    ins, y, ref = softmax(1, 50257)
    s = auto_schedule([y], "cuda", rows=SPLIT)
    assert _group(s).strategy.name == "split"
    _check_interp(s, ins, ref, 1, 50257)


@pytest.mark.parametrize("wl", sorted(WORKLOADS))
@pytest.mark.parametrize("m, n", [(1, 8192), (16, 50257), (64, 65536), (3, 50257)])
def test_split_rows_compile_with_nvrtc(wl, m, n):
    ins, y, _ = WORKLOADS[wl](m, n)
    s = auto_schedule([y], "cuda", rows=SPLIT)
    assert _group(s).strategy.name == "split"
    mod = build(s, [*ins, y], target="cuda")
    assert mod.cubin[:4] == b"\x7fELF"
    grids = [[str(d) for d in k.launch.grid] for k in mod.gen.kernels]
    assert len(grids) >= 3 and any(g[1] == str(m) and int(g[0]) > 1 for g in grids)  # rows x chunks blocks


@pytest.mark.parametrize("wl", sorted(WORKLOADS))
def test_symbolic_split_rows_compile_with_nvrtc(wl):
    ins, y, _ = WORKLOADS[wl](te.var("m"), te.var("n"))
    mod = build(auto_schedule([y], "cuda", sizes={"m": 16, "n": 50257}, rows=SPLIT), [*ins, y], target="cuda",
                specialize=False)
    assert mod.cubin[:4] == b"\x7fELF"


# ----------------------------------------------------------------------------- on the device


@pytest.mark.gpu
@pytest.mark.parametrize("wl", sorted(WORKLOADS))
@pytest.mark.parametrize("m, n, sizes", [(1, 50257, None), (3, 8192, None), (16, 50257, None), (64, 65536, None),
                                         (16, 50257, {"m": 16, "n": 50257}), (5, 40000, {"m": 16, "n": 50257})])
def test_split_rows_run_on_the_gpu(wl, m, n, sizes):
    symbolic = sizes is not None
    ins, y, ref = WORKLOADS[wl](te.var("m") if symbolic else m, te.var("n") if symbolic else n)
    s = auto_schedule([y], "cuda", sizes=sizes, rows=SPLIT)
    assert _group(s).strategy.name == "split"
    _check_device(build(s, [*ins, y], target="cuda"), ins, ref, m, n)


# ----------------------------------------------------------------------------- the row cache above 48 KiB


def test_the_cache_model_weighs_occupancy_against_re_reading():
    prm = RowParams()
    keep, why = cache_worth(100 * 1024, 2, 512, H200, prm)  # 2 blocks per SM, rows in flight beyond L2
    assert keep and "occupancy 50%" in why and "from DRAM = 3.00" in why
    keep, why = cache_worth(100 * 1024, 2, 512, H200, RowParams(full_occupancy=1.0, l2_bytes=2**30))
    assert not keep and "from L2" in why and "2.00 passes of DRAM time" in why
    keep, why = cache_worth(100 * 1024, 2, 512, H200, RowParams(cache_max_bytes=48 * 1024))
    assert not keep and "cache_max_bytes" in why


@pytest.mark.parametrize("prm", [{"cache_max_bytes": 48 * 1024}, {"full_occupancy": 1.0, "l2_bytes": 2**30}])
def test_the_planner_re_reads_a_row_whose_cache_costs_occupancy_and_says_why(prm):
    ins, y, ref = softmax(1024, 20000)  # 80 KB rows: dynamic shared memory
    assert plan_fusion([y], "cuda", device=H200).groups[0].caches
    s = auto_schedule([y], "cuda", rows={**prm, "cluster_row_max": 0})  # the block row, not the default cluster
    g = _group(s)
    assert g.strategy.name == "block" and not g.caches
    assert "above the static 48 KiB it costs occupancy" in s.plan.explain()
    assert "x_shared" not in str(s)


# ----------------------------------------------------------------------------- a whole warp per row


@pytest.mark.parametrize("wl", sorted(WORKLOADS))
@pytest.mark.parametrize("m, n", [(9, 1000), (5, 100), (3, 1024)])
def test_a_whole_warp_per_row_is_shuffle_only_and_matches_numpy(wl, m, n):
    ins, y, ref = WORKLOADS[wl](m, n)
    s = auto_schedule([y], "cuda", rows={"warp_lanes": 32, "warp_row_max": 1025})
    g = _group(s)
    lanes = 32 if n >= 128 else 16  # at most a float4 per lane's turn: a row of 100 is 25 of them (16 lanes)
    assert g.strategy.name == "warp" and g.strategy.lanes == lanes and g.strategy.rows == 128 // lanes
    assert f"get {lanes} lanes each" in s.plan.explain()
    mod = build(s, [*ins, y], target="cuda")
    assert mod.cubin[:4] == b"\x7fELF"
    body = mod.source[mod.source.index("__global__"):]  # the kernels, after the prelude
    assert f"loopir_subwarp_allreduce<{lanes}>(" in body and "loopir_block_allreduce(" not in body
    _check_interp(s, ins, ref, m, n, seed=n + m)


def test_warp_lanes_must_be_a_power_of_two_up_to_a_warp():
    _, y, _ = softmax(4, 100)
    with pytest.raises(ArgumentError, match="warp_lanes"):
        auto_schedule([y], "cuda", rows={"warp_lanes": 64})


def test_half_precision_split_rows_accumulate_their_partials_in_float32():
    wl = workloads.softmax(m=3, n=3000, dtype="float16")
    s = auto_schedule(list(wl.outputs), "cuda", rows=FORCE)
    assert _group(s).strategy.name == "split"
    prog = lower(s.program, "cuda")
    assert {b.name: b.dtype for b in prog.temps}["row_sum_rf"] == "float32"  # widen_accumulators
    x = np.random.default_rng(5).standard_normal((3, 3000)).astype(np.float16)
    out = np.full((3, 3000), np.nan, np.float16)
    interp.run(prog, x, out, gpu_order="reversed")
    a = x.astype(np.float64)
    e = np.exp(a - a.max(1, keepdims=True))
    np.testing.assert_allclose(out.astype(np.float64), e / e.sum(1, keepdims=True), rtol=2e-3, atol=1e-5)
