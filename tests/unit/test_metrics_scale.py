"""Metrics on a big, old queue: a week's event log is hundreds of MB (README: ~80 MB a day
at 10,000 jobs an hour). Folding it must not take memory in proportion to it, nor take a
runner's one thread away from its jobs for the seconds it takes to read it."""

from __future__ import annotations

import json
import os
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from renderctl import metrics
from renderctl.metrics import EventTotals, MetricsTextfile, collect, load_totals
from renderctl.store import Queue


def write_log(q: Queue, jobs: int) -> int:
    """A log of ``jobs`` jobs' accepted, claimed and completed lines; returns its size."""
    lines = []
    for i in range(jobs):
        jid = f"job-{i:07d}"
        lines += [{"ts": 1000.0 + i, "event": "accepted", "job": jid},
                  {"ts": 1000.5 + i, "event": "claimed", "job": jid, "attempt": 1},
                  {"ts": 1001.0 + i, "event": "completed", "job": jid, "kind": "python",
                   "state": "done", "attempt": 1, "outcome": "completed",
                   "elapsed_s": 0.02, "output": f"/srv/out/{jid}.pdf"}]
    data = "".join(json.dumps(ev, separators=(",", ":")) + "\n" for ev in lines).encode()
    (q.path / "events.jsonl").write_bytes(data)
    return len(data)


class RunnerView:
    """What MetricsTextfile asks of the runner it ticks for (its snapshot)."""

    def snapshot(self) -> dict[str, Any]:
        return {"oldest_pending_age_s": 1.5}


def test_folding_a_long_event_log_takes_memory_of_a_chunk_not_of_the_log(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a 6 MB event log, read 64 KiB at a time
    q = Queue(tmp_path / "q")
    size = write_log(q, 20_000)
    monkeypatch.setattr(metrics, "READ_CHUNK", 64 << 10, raising=False)
    # When `metrics` folds it
    totals = EventTotals()
    tracemalloc.start()
    try:
        totals.update(q)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # Then all of it is counted, with a peak far below the log's size (it read the whole
    # log at once and decoded every line into a list: ~10x the log's size)
    assert (totals.offset, totals.attempts["completed"], totals.wait.count) \
        == (size, 20_000, 20_000)
    assert peak < size / 3, (peak, size)


def test_a_runner_folds_a_long_log_a_bounded_share_per_tick_and_keeps_its_place(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a 3 MB event log nobody has folded, and a runner keeping a textfile
    q = Queue(tmp_path / "q")
    size = write_log(q, 10_000)
    monkeypatch.setattr(metrics, "TICK_FOLD_BYTES", 256 << 10, raising=False)
    prom = tmp_path / "m.prom"
    textfile = MetricsTextfile(q, prom)
    # When it writes the textfile on a tick
    textfile.tick(RunnerView())
    # Then that tick folded a bounded part of the log (it read all 3 MB before its first
    # claim: 11 s and 1.2 GB for a 116 MB log), and the file is there, its oldest pending
    # age the runner's
    assert 0 < textfile.totals.offset <= (256 << 10) + 1024, textfile.totals.offset
    assert "renderctl_oldest_pending_age_seconds 1.5" in prom.read_text()
    # ... and the last write, at the end, has every count, kept for whoever reads next
    textfile.close()
    assert textfile.totals.attempts["completed"] == 10_000
    again = load_totals(q)
    assert (again.offset, again.attempts["completed"]) == (size, 10_000)
    assert collect(q, again).totals.attempts["completed"] == 10_000


def test_a_successor_runners_textfile_never_shows_its_counters_going_down(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a runner killed after its textfile counted 10,000 completed attempts, which had
    # saved its totals when the log held only 1,000 jobs (at its last clean stop)
    q = Queue(tmp_path / "q")
    write_log(q, 1_000)
    early = EventTotals()
    early.update(q)
    metrics.save_totals(q, early)
    write_log(q, 10_000)  # (the log went on: the same file, grown)
    prom = tmp_path / "m.prom"
    before = MetricsTextfile(q, prom, interval_s=0)
    before.totals = EventTotals()
    before.totals.update(q)
    before.write(RunnerView())
    completed = 'renderctl_attempts_total{outcome="completed"} '
    assert f"{completed}10000" in prom.read_text()
    # When its successor writes the textfile, a bounded share of the log folded per tick
    monkeypatch.setattr(metrics, "TICK_FOLD_BYTES", 256 << 10, raising=False)
    after = MetricsTextfile(q, prom, interval_s=0)
    seen = []
    for _ in range(20):
        after.tick(RunnerView())
        seen.append(int(next(line for line in prom.read_text().splitlines()
                             if line.startswith(completed)).split()[-1]))
    # Then the file keeps the old figures until the fold has caught up, and never goes
    # below them (before: 1,000-odd at the first tick, then rising: to Prometheus a reset,
    # every attempt in between counted twice: audit BJ)
    assert seen == sorted(seen) and seen[0] == 10_000 and seen[-1] == 10_000, seen
    # ... and once caught up, it keeps its totals for the next successor
    assert load_totals(q).attempts["completed"] == 10_000
    # ... but holds the file no longer than HOLD_MAX_S (a log growing faster than the fold
    # would hold it, gauges and all, for good: review BK)
    metrics.save_totals(q, early)
    monkeypatch.setattr(metrics, "HOLD_MAX_S", 0.0, raising=False)
    MetricsTextfile(q, prom, interval_s=0).tick(RunnerView())
    assert f"{completed}10000" not in prom.read_text()


def test_a_runners_textfile_starts_over_on_a_log_rotated_under_it(tmp_path: Path) -> None:
    # Given a --follow runner's textfile that has folded a log of 300 jobs
    q = Queue(tmp_path / "q")
    write_log(q, 300)
    prom = tmp_path / "m.prom"
    textfile = MetricsTextfile(q, prom, interval_s=0)
    textfile.tick(RunnerView())
    assert textfile.totals.attempts["completed"] == 300

    def completed() -> str:
        return next(line for line in prom.read_text().splitlines()
                    if line.startswith('renderctl_attempts_total{outcome="completed"}'))

    # When the log is rotated by rename (logrotate) and the new one holds 100 jobs
    os.rename(q.path / "events.jsonl", q.path / "events.jsonl.1")
    write_log(q, 100)
    textfile.tick(RunnerView())
    # Then the counters start over with the new log, as `renderctl metrics` does (README:
    # a reset, which Prometheus handles), rather than stay frozen until the new log
    # outgrew the old one's offset (a week of a 10,000 jobs/h service), then be read from
    # the middle of a line
    assert completed().endswith(" 100"), completed()
    # ... and likewise when it is copied and truncated, then written again
    write_log(q, 40)  # (the same file, truncated: shorter than what was read of it)
    textfile.tick(RunnerView())
    assert completed().endswith(" 40"), completed()
    # ... while a log that only grew is read on from where it was
    with open(q.path / "events.jsonl", "a") as fh:
        fh.write(json.dumps({"ts": 2000.0, "event": "completed", "job": "late",
                             "outcome": "completed", "attempt": 1, "elapsed_s": 0.1}) + "\n")
    textfile.tick(RunnerView())
    assert completed().endswith(" 41"), completed()
