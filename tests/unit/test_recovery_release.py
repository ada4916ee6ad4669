"""Recovery's verdict on an attempt its runner released as the queue's disk filled."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

from renderctl.recovery import QUEUE_FULL_RELEASE, judge_orphan
from renderctl.store import Holder, Lease, Queue


def _orphan_of(tmp_path: Path, attempts: tuple[dict[str, object], ...]) -> dict[str, object]:
    q = Queue(tmp_path / "q")
    q.submit([{"id": "j", "kind": "python", "callable": "m:f", "output": "j.bin"}],
             base=tmp_path, out_root=tmp_path / "out")
    view = q.get("j")
    now = time.time()
    # (a holder on another host: whether it lives is not looked up)
    lease = Lease(Holder("elsewhere", "boot", 1, 1), "t-1", len(attempts) + 1, now - 1, now + 60)
    rec = replace(view.record, attempts=attempts, lease=lease)
    orphan = judge_orphan(rec, started={"t-1": now - 1}, now=now,
                          released={"t-1": QUEUE_FULL_RELEASE})
    assert orphan.crashed is not None
    return dict(orphan.crashed)


def test_an_attempt_released_on_a_full_queue_disk_is_not_charged(tmp_path: Path) -> None:
    verdict = _orphan_of(tmp_path, ())
    assert verdict["outcome"] == "released" and verdict["queue_full"] is True, verdict


def test_released_so_twice_in_a_row_the_attempt_is_charged(tmp_path: Path) -> None:
    # Given a job whose last attempt was released as the queue's disk was full: it may be
    # the one filling it (its output there), and must still end
    first = {"n": 1, "outcome": "released", "queue_full": True, "error": "full"}
    verdict = _orphan_of(tmp_path, (first,))
    assert verdict["outcome"] == "crashed", verdict
