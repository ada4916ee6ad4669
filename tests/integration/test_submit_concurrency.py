"""Concurrent `renderctl submit` processes with overlapping ids: each id is accepted once."""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

from renderctl.lifecycle import State
from renderctl.store import Queue

MANIFESTS = 4
JOBS_EACH = 200
STRIDE = JOBS_EACH // 2  # manifest k holds ids [k*100, k*100+200): neighbours share half


def test_concurrent_submits_accept_every_id_exactly_once(
    tmp_path: Path, queue_dir: Path, write_manifest: Any, renderctl_argv: list[str]
) -> None:
    # Given four manifests in one folder (so shared ids have identical specs)
    ids = [[f"job-{n:04d}" for n in range(k * STRIDE, k * STRIDE + JOBS_EACH)]
           for k in range(MANIFESTS)]
    paths = [write_manifest([{"id": jid, "kind": "python", "callable": "m:f",
                              "output": f"o/{jid}.pdf"} for jid in batch], name=f"m{k}.toml")
             for k, batch in enumerate(ids)]
    expected = {jid for batch in ids for jid in batch}
    # When four submits are started together against one new queue
    procs = [subprocess.Popen([*renderctl_argv, "submit", "--json", "--queue", str(queue_dir),
                               "--out", str(tmp_path / "out"), str(p)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for p in paths]
    outputs = [p.communicate(timeout=120) for p in procs]
    # Then each succeeds
    for proc, (_, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err.decode()
        assert b"Traceback" not in err
    # And every id is in exactly one state folder, once
    q = Queue(queue_dir)
    seen = Counter(jid for s in State for jid in q.list_ids(s))
    assert set(seen) == expected and set(seen.values()) == {1}
    assert q.count(State.PENDING) == len(expected)
    # And each id was accepted by exactly one submit; the others saw it as already accepted
    reports = [json.loads(out) for out, _ in outputs]
    accepted = Counter(jid for r in reports for jid in r["accepted"])
    assert set(accepted) == expected and set(accepted.values()) == {1}
    for report, batch in zip(reports, ids, strict=True):
        assert sorted(report["accepted"] + report["already_accepted"]) == sorted(batch)
    assert Counter(e["job"] for e in q.events if e["event"] == "accepted") == accepted
    assert list((queue_dir / "tmp").iterdir()) == []


def _sleep_a_while() -> None:
    import time

    time.sleep(60)


def test_a_process_forked_while_a_submit_holds_the_lock_does_not_hold_it_after(
        tmp_path: Path) -> None:
    import multiprocessing
    import sys
    import threading

    # Given a thread inside a submit, holding the queue's submit lock, as the process
    # forks a helper (a multiprocessing worker under fork) that never uses renderctl
    q = Queue(tmp_path / "q")
    inside, go_on = threading.Event(), threading.Event()

    def hold(point: str) -> None:
        if point == "submit:checked":
            inside.set()
            go_on.wait(30)

    def job(jid: str) -> dict[str, Any]:
        return {"id": jid, "kind": "python", "callable": "json:dumps", "output": f"{jid}.bin"}

    submitter = threading.Thread(
        target=lambda: q.submit([job("a")], base=tmp_path, crash_hook=hold, advise=False))
    submitter.start()
    assert inside.wait(30)
    helper = multiprocessing.get_context("fork").Process(target=_sleep_a_while, daemon=True)
    helper.start()
    try:
        go_on.set()
        submitter.join(30)

        # When another process submits while the helper lives
        other = subprocess.run(
            [sys.executable, "-c", "import sys; from renderctl import Queue; print(Queue("
             "sys.argv[1]).submit([{'id': 'b', 'kind': 'python', 'callable': 'json:dumps', "
             "'output': 'b.bin'}], advise=False).accepted)", str(tmp_path / "q")],
            capture_output=True, text=True, timeout=60, cwd=tmp_path)

        # Then it is accepted at once (audit FC: the helper's copy of the lock's open file
        # held the lock for as long as it lived; every submit, from any process, waited)
        assert other.returncode == 0 and "'b'" in other.stdout, other.stderr
    finally:
        helper.kill()
        helper.join()
    assert set(q.list_ids(State.PENDING)) == {"a", "b"}
