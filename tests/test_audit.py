"""The bad-input audit (issue 18): every case of tests/audit_cases.py runs in a subprocess (so a
segmentation fault or a hang is caught) and is classed as

    clear   an exception of a clear type whose message names the offending thing (the case's `names`)
    right   no exception and the right result
    unclear an exception of another type (AttributeError, KeyError, RecursionError...) or a message
            that does not name the thing
    wrong   no exception and a wrong result (or an error where a result was due)
    crash   the process died or hung

The test fails on anything but the first two and prints the counts. Cases run in batches (one
subprocess each, two at a time); a case marked `isolated` (it could crash) runs alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from audit_cases import CASES, CLEAR_TYPES  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "tests", "audit_cases.py")
TIMEOUT_S = 120


def _run_batch(names: list[str]) -> dict[str, dict]:
    """Run `names` in order in one process; a case that kills it is a crash, the rest run again."""
    out: dict[str, dict] = {}
    todo = list(names)
    while todo:
        env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
        try:
            p = subprocess.run([sys.executable, SCRIPT, *todo], capture_output=True, text=True, timeout=TIMEOUT_S,
                               env=env, cwd=ROOT)
            stdout, rc, why = p.stdout, p.returncode, p.stderr[-400:]
        except subprocess.TimeoutExpired as e:
            stdout = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            rc, why = "timeout", f"no answer in {TIMEOUT_S} s"
        for line in stdout.splitlines():
            if line.startswith("{"):
                r = json.loads(line)
                out[r["case"]] = r
        todo = [n for n in todo if n not in out]
        if todo:  # the first unanswered case took the process down
            out[todo[0]] = {"case": todo[0], "crash": f"exit status {rc}: {why}"}
            todo = todo[1:]
    return out


def classify(r: dict) -> str:
    c = CASES[r["case"]]
    if "crash" in r:
        return "crash"
    if "raised" in r:
        if c.names is None:
            return "wrong"  # a result was due
        if r["raised"] in CLEAR_TYPES and all(w in r["message"] for w in c.names):
            return "clear"
        return "unclear"
    if c.names is not None:
        return "wrong"  # accepted what must be refused
    return "right" if r["result"] else "wrong"


def run_audit() -> tuple[Counter, dict[str, tuple[str, dict]]]:
    plain = [n for n, c in CASES.items() if not c.isolated]
    batches = [plain[0::2], plain[1::2]] + [[n] for n, c in CASES.items() if c.isolated]
    results: dict[str, dict] = {}
    with ThreadPoolExecutor(2) as pool:
        for r in pool.map(_run_batch, batches):
            results.update(r)
    classes = {n: (classify(r), r) for n, r in results.items()}
    return Counter(c for c, _ in classes.values()), classes


def test_audit():
    counts, classes = run_audit()
    print(f"\naudit of {len(classes)} bad or unusual inputs: " +
          ", ".join(f"{k} {counts.get(k, 0)}" for k in ("clear", "right", "unclear", "wrong", "crash")))
    bad = {n: c for n, c in classes.items() if c[0] not in ("clear", "right")}
    for n, (c, r) in sorted(bad.items()):
        print(f"  {c:8s} {n}: {r.get('raised', '')} {r.get('message', r.get('crash', r.get('result')))}")
    assert len(classes) == len(CASES)
    assert not bad, f"{len(bad)} case(s) not a clear error or the right result: {', '.join(sorted(bad))}"


if __name__ == "__main__":
    test_audit()
