"""The autotuner's trial database (schedules.tuning.database): journal round trip, the queries' semantics, torn
and malformed lines, appends from several processes, and moving trials between databases. CPU only."""

from __future__ import annotations

import errno
import json
import multiprocessing
import os
import warnings

import pytest

from schedules.tuning.database import (
    Database,
    DatabaseWriteError,
    JournalWarning,
    default_path,
    parse_shape,
    shape_distance,
)
from schedules.tuning.record import Trial, config_key

W, T = "wk-gemm", "tk-h100"


def mk(config: dict, secs: float | None = None, shape: str = "512x1024", status: str = "", trial: int = 0,
       run: str = "r1", workload: str = W, **kw) -> Trial:
    """A trial: ok with times around `secs` when given, else `status` (run_error by default)."""
    if secs is not None:
        return Trial(workload, T, shape, config, "ok", times=(secs * 1.1, secs, secs * 0.9), trial=trial, run=run, **kw)
    return Trial(workload, T, shape, config, status or "run_error", error="boom", trial=trial, run=run, **kw)


def journal_lines(path) -> list[bytes]:
    with open(os.path.join(path, "journal.jsonl"), "rb") as f:
        return f.read().split(b"\n")


def test_round_trip(tmp_path):
    db = Database(tmp_path / "db")
    made = [mk({"threads": 128, "tile": (8, 16)}, 2e-4, trial=0, trace=("split i 32",), meta={"name": "gemm"}),
            mk({"threads": 256, "tile": (8, 8)}, status="timeout", trial=1),
            mk({"threads": 64, "tile": (4, 4)}, 1e-4, shape="256x256", trial=2, build_s=0.5)]
    for t in made:
        db.append(t)
    assert len(db) == 3 and db.trials() == made
    again = Database(tmp_path / "db")
    assert again.trials() == made and again.skipped == 0
    assert again.trials()[0].config["tile"] == (8, 16)  # JSON lists come back as tuples
    assert [json.loads(x)["trial"] for x in journal_lines(tmp_path / "db")[:-1]] == [0, 1, 2]
    assert again.trials(shape="256x256") == [made[2]] and again.trials(workload="other") == []
    assert again.trials(W, T, "512x1024") == made[:2]
    assert again.shapes(W, T) == ["512x1024", "256x256"] and again.shapes(W, "other") == []
    r = repr(again)
    assert str(tmp_path / "db") in r and "3 trials" in r and W in r


def test_best_never_ranks_failures(tmp_path):
    db = Database(tmp_path)
    db.append(mk({"a": 1}, 3e-4))
    db.append(mk({"a": 2}, status="wrong"))  # a wrong result may well be fast: its times are not kept
    db.append(mk({"a": 3}, 1e-4))
    db.append(mk({"a": 4}, 1e-4))  # a tie keeps the first
    db.append(mk({"a": 5}, status="timeout"))
    db.append(mk({"a": 6}, 5e-5, shape="128x128"))
    db.append(mk({"a": 7}, status="build_error", shape="64x64"))
    assert db.best(W, T, "512x1024").config == {"a": 3}
    assert db.best(W, T).config == {"a": 6}  # across shapes
    assert db.best(W, T, "64x64") is None  # only failures
    assert db.best(W, "other-target") is None and db.best(W, T, "1x1") is None


def test_measured_keeps_ok_then_fastest(tmp_path):
    db = Database(tmp_path)
    db.append(mk({"a": 1}, 2e-4, trial=0))
    db.append(mk({"a": 1}, 1e-4, trial=1))  # faster: kept
    db.append(mk({"a": 1}, 3e-4, trial=2))
    db.append(mk({"a": 2}, status="timeout", trial=3))
    db.append(mk({"a": 2}, 5e-4, trial=4))  # ok after a failure: kept
    db.append(mk({"a": 3}, 4e-4, trial=5))
    db.append(mk({"a": 3}, status="run_error", trial=6))  # a failure after an ok: the ok stays
    db.append(mk({"a": 4}, status="timeout", trial=7))
    db.append(mk({"a": 4}, status="invalid", trial=8))  # two failures: the latest
    db.append(mk({"a": 9}, 1e-5, shape="8x8"))  # another shape: not measured for this one
    m = db.measured(W, T, "512x1024")
    assert set(m) == {config_key({"a": a}) for a in (1, 2, 3, 4)}
    assert {k: t.trial for k, t in m.items()} == {config_key({"a": a}): i for a, i in ((1, 1), (2, 4), (3, 5), (4, 8))}
    assert db.measured(W, T, "1x1") == {}


def test_nearest(tmp_path):
    db = Database(tmp_path)
    db.append(mk({"a": 1}, 1e-4, shape="256x256"))
    db.append(mk({"a": 2}, 1e-4, shape="2048x2048"))
    db.append(mk({"a": 3}, 1e-4, shape="1024"))  # another rank: never a candidate for 2-d shapes
    db.append(mk({"a": 4}, shape="512x512"))  # failed only: not tuned
    db.append(mk({"a": 5}, 1e-4, shape="1024x1024"))
    assert db.nearest(W, T, "256x256").config == {"a": 1}  # exact
    assert db.nearest(W, T, "300x200").config == {"a": 1}
    assert db.nearest(W, T, "1200x1200").config == {"a": 5}
    assert db.nearest(W, T, "1500x1500").config == {"a": 2}  # nearer in ratio: 2048/1500 < 1500/1024
    assert db.nearest(W, T, "4096x4096").config == {"a": 2}
    assert db.nearest(W, T, "512x512").config == {"a": 1}  # 256² and 1024² are both 2 away: the smaller
    assert db.nearest(W, T, "100").config == {"a": 3}
    assert db.nearest(W, T, "8x8x8") is None and db.nearest(W, T, "any") is None
    assert db.nearest("other", T, "256x256") is None
    assert parse_shape("512x1024") == (512, 1024) and parse_shape("0x4") is None and parse_shape("") is None
    assert shape_distance((512, 1024), (1024, 256)) == 3.0


def test_torn_last_line_skipped_and_next_append_works(tmp_path):
    db = Database(tmp_path)
    db.append(mk({"a": 1}, 1e-4))
    db.append(mk({"a": 2}, 2e-4))
    with open(tmp_path / "journal.jsonl", "ab") as f:
        f.write(mk({"a": 3}, 5e-5).to_json().encode()[:40])  # a writer killed mid-line
    with pytest.warns(JournalWarning, match="torn"):
        db2 = Database(tmp_path)
    assert len(db2) == 2 and db2.skipped == 1 and db2.best(W, T, "512x1024").config == {"a": 1}
    with pytest.warns(JournalWarning, match="torn"):  # the long-lived one sees it too, without raising
        assert len(db) == 2 and db.skipped == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the torn line is reported once, not at every query
        db2.append(mk({"a": 4}, 3e-4))
        assert len(db2) == 3
    lines = journal_lines(tmp_path)
    assert len(lines) == 5 and lines[-1] == b"" and Trial.from_json(lines[3]).config == {"a": 4}
    with pytest.warns(JournalWarning, match="malformed"):  # now a whole line, and still not a trial
        db3 = Database(tmp_path)
    assert [t.config["a"] for t in db3.trials()] == [1, 2, 4] and db3.skipped == 1
    assert [t.config["a"] for t in db.trials()] == [1, 2, 4] and db.skipped == 1


def test_whole_trial_without_newline_is_kept_once_ended(tmp_path):
    Database(tmp_path).append(mk({"a": 1}, 1e-4))
    with open(tmp_path / "journal.jsonl", "ab") as f:
        f.write(mk({"a": 2}, 2e-4).to_json().encode())  # cut just before its newline
    with pytest.warns(JournalWarning, match="torn"):
        db = Database(tmp_path)
    assert len(db) == 1
    db.append(mk({"a": 3}, 3e-4))  # ends the line: no data of the journal is ever dropped
    assert [t.config["a"] for t in db.trials()] == [1, 2, 3] and db.skipped == 0
    assert [t.config["a"] for t in Database(tmp_path).trials()] == [1, 2, 3]


def test_malformed_lines_skipped_and_counted(tmp_path):
    good = [mk({"a": i}, i * 1e-4 + 1e-4) for i in range(3)]
    bad = [b"not json", b'{"workload": "w"}', json.dumps(json.loads(good[0].to_json()) | {"status": "??"}).encode(),
           b"[1, 2]", b"\xff\xfe{}", json.dumps(json.loads(good[0].to_json()) | {"times": ["x"]}).encode()]
    body = [good[0].to_json().encode(), *bad[:3], good[1].to_json().encode(), *bad[3:], good[2].to_json().encode()]
    (tmp_path / "journal.jsonl").write_bytes(b"\n".join(body) + b"\n")
    with pytest.warns(JournalWarning, match=r"skipped 6 malformed line\(s\), the first at line 2"):
        db = Database(tmp_path)
    assert db.trials() == good and db.skipped == 6


def _append_many(path: str, run: str, n: int, barrier) -> None:
    """One tuner process: appends n trials (lines longer than a page), reading the others' between appends."""
    warnings.simplefilter("error", JournalWarning)  # a reader that saw half a line would warn
    db = Database(path)
    barrier.wait()
    seen = 0
    for i in range(n):
        db.append(mk({"i": i, "run": run}, 1e-4 + i * 1e-6, trial=i, run=run, meta={"pad": run * 2000}))
        assert len(db) > seen
        seen = len(db)
    mine = [t for t in db.trials() if t.run == run]
    assert [t.trial for t in mine] == list(range(n)) and db.skipped == 0


def test_concurrent_appends_from_processes(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(4)
    procs = [ctx.Process(target=_append_many, args=(str(tmp_path), f"run{p}", 50, barrier)) for p in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0] * 4
    lines = journal_lines(tmp_path)
    assert len(lines) == 201 and lines[-1] == b""
    trials = [Trial.from_json(x) for x in lines[:-1]]  # every line whole
    assert sorted((t.run, t.trial) for t in trials) == [(f"run{p}", i) for p in range(4) for i in range(50)]
    db = Database(tmp_path)
    assert len(db) == 200 and db.skipped == 0
    assert len(db.measured(W, T, "512x1024")) == 200 and db.best(W, T).trial == 0


def test_second_database_sees_the_first_ones_appends(tmp_path):
    a, b = Database(tmp_path), Database(tmp_path)
    a.append(mk({"a": 1}, 2e-4))
    assert len(b) == 1 and b.best(W, T, "512x1024").config == {"a": 1}
    b.append(mk({"a": 2}, 1e-4))
    a.append(mk({"a": 3}, status="timeout"))
    assert b.refresh() == 1 and b.refresh() == 0
    assert [t.config["a"] for t in a.trials()] == [1, 2, 3] == [t.config["a"] for t in b.trials()]
    assert a.best(W, T, "512x1024").config == {"a": 2} and set(a.measured(W, T, "512x1024")) == {
        config_key({"a": i}) for i in (1, 2, 3)}
    os.unlink(tmp_path / "journal.jsonl")  # removed by hand: empty, then appendable again
    assert len(a) == 0 and a.best(W, T) is None
    b.append(mk({"a": 4}, 1e-4))
    assert [t.config["a"] for t in a.trials()] == [4]


def test_export_import_skip_duplicates(tmp_path):
    src = Database(tmp_path / "src")
    for i in range(4):
        src.append(mk({"a": i}, 1e-4 * (i + 1), trial=i))
    src.append(mk({"a": 0}, status="timeout", trial=0, run="r2"))  # same config and index, another run
    out = tmp_path / "all.jsonl"
    assert src.export(out) == 5 and len(out.read_bytes().splitlines()) == 5
    dst = Database(tmp_path / "dst")
    dst.append(mk({"a": 1}, 2e-4, trial=1))  # already there: not added again
    dst.append(mk({"a": 9}, 5e-5, trial=9))
    assert dst.import_(out) == 4 and len(dst) == 6
    assert dst.import_(out) == 0 and dst.import_(tmp_path / "src") == 0 and len(dst) == 6
    assert dst.best(W, T, "512x1024").config == {"a": 9}
    assert sorted((t.run, t.trial) for t in dst.trials()) == [("r1", 0), ("r1", 1), ("r1", 2), ("r1", 3), ("r1", 9),
                                                              ("r2", 0)]
    assert src.import_(tmp_path / "dst") == 1 and len(src) == 6  # a directory merges the same way
    assert [t.config["a"] for t in Database(tmp_path / "src").trials()] == [0, 1, 2, 3, 0, 9]
    dup = tmp_path / "dup.jsonl"  # duplicates inside one file, and no final newline
    line = mk({"z": 1}, 1e-4, run="r3").to_json().encode()
    dup.write_bytes(line + b"\n" + line)
    assert dst.import_(dup) == 1 and dst.import_(dup) == 0


def index_best(path) -> dict[str, list]:
    with open(os.path.join(path, "index.json")) as f:
        doc = json.load(f)
    assert doc["version"] == 1
    return {s: t["config"]["a"] for s, t in doc["best"][W][T].items()}


def test_index_updated_and_rebuilt(tmp_path):
    db = Database(tmp_path)
    db.append(mk({"a": 1}, 2e-4))
    db.append(mk({"a": 2}, 1e-4, shape="64x64"))
    assert index_best(tmp_path) == {"512x1024": 1, "64x64": 2}
    ino = os.stat(tmp_path / "index.json").st_ino
    db.append(mk({"a": 3}, 3e-4))  # slower and failed trials leave the index alone
    db.append(mk({"a": 4}, status="timeout"))
    assert os.stat(tmp_path / "index.json").st_ino == ino
    db.append(mk({"a": 5}, 1e-4))
    assert index_best(tmp_path) == {"512x1024": 5, "64x64": 2}
    want = (tmp_path / "index.json").read_bytes()
    os.unlink(tmp_path / "index.json")
    Database(tmp_path)
    assert (tmp_path / "index.json").read_bytes() == want
    (tmp_path / "index.json").write_text('{"version": 1, "be')  # corrupt
    Database(tmp_path)
    assert (tmp_path / "index.json").read_bytes() == want
    (tmp_path / "index.json").write_text('{"version": 1, "best": {}}')  # stale: a writer died before updating it
    Database(tmp_path)
    assert index_best(tmp_path) == {"512x1024": 5, "64x64": 2}


def test_unwritable_location_queries_then_raises_on_append(tmp_path):
    (tmp_path / "file").write_text("")
    where = tmp_path / "file" / "db"  # under a regular file: can never be created, even by root
    db = Database(where)
    assert len(db) == 0 and db.best(W, T) is None and db.trials() == []
    with pytest.raises(DatabaseWriteError, match=str(where)) as e:
        db.append(mk({"a": 1}, 1e-4))
    assert isinstance(e.value, OSError) and e.value.errno == errno.ENOTDIR


def test_read_only_database_is_queried(tmp_path):
    probe = tmp_path / "probe"
    probe.write_text("")
    probe.chmod(0o444)
    try:
        open(probe, "a").close()
        pytest.skip("this process writes read-only files (root)")
    except PermissionError:
        pass
    Database(tmp_path / "db").append(mk({"a": 1}, 1e-4))
    for name in ("journal.jsonl", "index.json", "lock", ""):
        os.chmod(tmp_path / "db" / name, 0o555 if not name else 0o444)
    try:
        db = Database(tmp_path / "db")
        assert db.best(W, T, "512x1024").config == {"a": 1}
        with pytest.raises(DatabaseWriteError, match=f"cannot write the tuning database at {tmp_path / 'db'}: Perm"):
            db.append(mk({"a": 2}, 1e-4))
        assert len(db) == 1
    finally:
        os.chmod(tmp_path / "db", 0o755)


def test_default_path(tmp_path, monkeypatch):
    monkeypatch.setenv("LOOPIR_TUNING_DB", str(tmp_path / "x"))
    assert default_path() == str(tmp_path / "x")
    monkeypatch.delenv("LOOPIR_TUNING_DB")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_path() == str(tmp_path / ".cache" / "loopir" / "tuning")
    assert not (tmp_path / ".cache").exists()
