"""Prometheus metrics of a queue, in the text exposition format 0.0.4.

Where each number comes from (cheapest source that is honest):

- gauges of *now* (jobs per state, dead-letter depth, oldest pending age, corrupt files)
  from the queue folders (``Queue.status()``);
- counters (attempts by outcome, redeliveries, publish collisions) and both histograms
  from ``events.jsonl``, read incrementally: an ``EventTotals`` remembers its offset, so a
  runner that rewrites the textfile every few seconds reads only the new lines. The log is
  the story, not the truth: a crash may lose its last lines, so these counters may miss an
  attempt or two after a crash; deleting the log resets them (Prometheus treats a counter
  that goes down as a reset);
- workers alive vs desired from ``runner.state.json``, 0 when no runner holds the queue.

`renderctl metrics` runs once per scrape (cron, a textfile collector), so it keeps what it
folded in ``control/metrics.totals.json`` with the log's identity and offset: each call reads
only what was appended since the last (at 10,000 jobs an hour the log grows ~80 MB a day;
reading it whole took 0.5 s per 20,000 jobs). A log replaced, truncated or rewritten before
the offset is read again from the start.

Time to first attempt is ``claimed`` (attempt 1) minus ``accepted``; execution time is the
``elapsed_s`` of every attempt that ended (``released`` ones excepted: they were cut short)
less its ``paused_s``: a job stopped with its runner by Ctrl-Z for an hour did not take an
hour to render, and counting the pause would move a latency alert for a choice the user made.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from renderctl.fsutil import open_regular, read_file, read_regular, replace_beside, write_file
from renderctl.lifecycle import Outcome, State
from renderctl.store import Queue, QueueStatus

STATE_FILE = "runner.state.json"  # written by the runner (runner.STATE_FILE)
STATE_READ_MAX = 1 << 20  # (a snapshot of 64 workers' jobs is ~20 KB)
TEXTFILE_INTERVAL_S = 5.0
TOTALS_FILE = "metrics.totals.json"  # control/: EventTotals kept between `metrics` calls
TOTALS_VERSION = 1
# The log is folded this much at a time: reading a week's log (~80 MB a day at 10,000 jobs
# an hour) whole took ~10x its size in memory (1.2 GB for 116 MB).
READ_CHUNK = 4 << 20
TICK_FOLD_BYTES = 1 << 20  # per textfile write in a runner (~0.1 s here)
# How often a runner keeps its folded totals for the next one (caught up with the log): a
# runner killed later leaves its successor at most this much of the log to fold again.
TOTALS_SAVE_S = 60.0
# The longest a successor holds a killed runner's textfile while its fold catches up: a
# log growing faster than the fold's share (an incident's flood of failures) would hold it
# for good, gauges and all (review BK).
HOLD_MAX_S = 300.0
STATUS_COST_FACTOR = 50  # a runner lists the folders for metrics <= ~2% of its time
WAIT_BUCKETS_S = (0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)
EXEC_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                  120.0, 300.0)


@dataclass
class Histogram:
    """A cumulative Prometheus histogram: fixed upper bounds, sum and count."""

    bounds: Sequence[float]
    counts: list[int] = field(default_factory=list)
    sum: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * len(self.bounds)

    def observe(self, value: float) -> None:
        self.sum += value
        self.count += 1
        for i, b in enumerate(self.bounds):
            if value <= b:
                self.counts[i] += 1  # cumulative: every bucket at or above the value


@dataclass
class EventTotals:
    """Counters folded from ``events.jsonl``; ``update`` reads only what was appended."""

    offset: int = 0
    attempts: dict[str, int] = field(default_factory=lambda: {o.value: 0 for o in Outcome})
    redeliveries: int = 0
    wait: Histogram = field(default_factory=lambda: Histogram(WAIT_BUCKETS_S))
    exec: Histogram = field(default_factory=lambda: Histogram(EXEC_BUCKETS_S))
    accepted_at: dict[str, float] = field(default_factory=dict)  # not yet claimed
    # What identified the log where the last update stopped (_log_mark); None before one.
    mark: list[Any] | None = field(default=None, compare=False, repr=False)

    def update(self, queue: Queue, *, budget_bytes: float = math.inf) -> bool:
        """Fold what the log gained, ``READ_CHUNK`` at a time (memory stays flat however
        long the log), at most about ``budget_bytes`` of it; True once at the log's end.

        A log that is no longer the one read so far (rotated by rename, or copied and
        truncated) is folded from its start, the counters reset, as load_totals does: a
        --follow runner's textfile kept reading the new log at the old one's offset, its
        counters frozen until the new log outgrew it (days), then read from mid-line."""
        if self.mark is not None and _log_mark(queue, self.offset) != self.mark:
            fresh = EventTotals()
            self.offset, self.attempts, self.redeliveries = 0, fresh.attempts, 0
            self.wait, self.exec, self.accepted_at = fresh.wait, fresh.exec, {}
        try:
            return self._fold(queue, budget_bytes)
        finally:
            self.mark = _log_mark(queue, self.offset)

    def _fold(self, queue: Queue, budget_bytes: float) -> bool:
        spent = 0
        while spent < budget_bytes:
            start = self.offset
            events, self.offset = queue.events.read(
                offset=start, max_bytes=int(min(READ_CHUNK, budget_bytes - spent)))
            self.feed(events)
            if self.offset == start:
                return True  # the end (a half-written line at most is left)
            spent += self.offset - start
        return False

    def to_json(self) -> dict[str, Any]:
        return {"offset": self.offset, "attempts": self.attempts,
                "redeliveries": self.redeliveries, "accepted_at": self.accepted_at,
                "wait": [self.wait.counts, self.wait.sum, self.wait.count],
                "exec": [self.exec.counts, self.exec.sum, self.exec.count]}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> EventTotals:
        t = cls(offset=int(d["offset"]), redeliveries=int(d["redeliveries"]),
                accepted_at={str(k): float(v) for k, v in d["accepted_at"].items()})
        t.attempts.update({str(k): int(v) for k, v in d["attempts"].items()})
        for h, (counts, total, n) in ((t.wait, d["wait"]), (t.exec, d["exec"])):
            if len(counts) != len(h.bounds):
                raise ValueError("buckets changed")
            h.counts, h.sum, h.count = [int(c) for c in counts], float(total), int(n)
        return t

    def feed(self, events: Iterable[Mapping[str, Any]]) -> None:
        for ev in events:
            name = ev.get("event")
            job = ev.get("job")
            if name == "accepted" and isinstance(job, str):
                self.accepted_at[job] = _seconds(ev.get("ts")) or 0.0
            elif name == "claimed":
                accepted = self.accepted_at.pop(job, None) if isinstance(job, str) else None
                ts = _seconds(ev.get("ts"))
                if accepted is not None and ev.get("attempt") == 1 and ts:
                    self.wait.observe(max(0.0, ts - accepted))
                continue
            outcome = ev.get("outcome")
            if not isinstance(outcome, str):
                if name in ("cancelled", "expired") and isinstance(job, str):
                    self.accepted_at.pop(job, None)  # never ran; stop waiting for a claim
                continue
            self.attempts[outcome] = self.attempts.get(outcome, 0) + 1
            if isinstance(ev.get("attempt"), int) and ev["attempt"] > 1:
                self.redeliveries += 1
            elapsed = _seconds(ev.get("elapsed_s"))
            if outcome != Outcome.RELEASED.value and elapsed is not None:
                self.exec.observe(max(0.0, elapsed - (_seconds(ev.get("paused_s")) or 0.0)))


def _seconds(value: object) -> float | None:
    """A finite number from the event log, else None: a hand-edited or foreign line may
    hold a string there (``float()`` of it ended `metrics` in a traceback) or a NaN (it
    would make the histogram's sum NaN for good, since the sum is kept between calls)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


@dataclass(frozen=True)
class Metrics:
    """One scrape: everything ``exposition`` prints."""

    jobs: Mapping[str, int]
    corrupt: int
    oldest_pending_age_s: float | None
    runner_up: bool
    workers_alive: int
    workers_desired: int
    totals: EventTotals


def _log_mark(queue: Queue, offset: int) -> list[Any] | None:
    """What identifies the log up to ``offset``: device, inode, and the bytes just before it
    (an inode number is reused after a delete; those bytes tell a different log apart)."""
    try:
        fd, st = open_regular(queue.events.path, os.O_RDONLY)
    except OSError:  # none, or not a file (a FIFO a job put there)
        return None
    try:
        if st.st_size < offset:
            return None  # truncated: not the log we read
        start = max(0, offset - 64)
        return [st.st_dev, st.st_ino, os.pread(fd, offset - start, start).hex()]
    finally:
        os.close(fd)


def load_totals(queue: Queue) -> EventTotals:
    """What an earlier `renderctl metrics` folded, if it was of this same log; else nothing."""
    try:
        data = json.loads(read_file(queue.dir("control") / TOTALS_FILE))
        if data.get("v") != TOTALS_VERSION:
            return EventTotals()
        totals = EventTotals.from_json(data)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return EventTotals()
    if _log_mark(queue, totals.offset) != data.get("log"):
        return EventTotals()
    return totals


def save_totals(queue: Queue, totals: EventTotals) -> None:
    """Keep ``totals`` for the next call. No fsync: a file lost in a crash only means the
    next call reads the log from the start; a half-written one is never renamed into place."""
    mark = _log_mark(queue, totals.offset)
    if mark is None:
        return
    final = queue.dir("control") / TOTALS_FILE
    tmp = final.with_name(f".{TOTALS_FILE}.{os.getpid()}.tmp")
    with contextlib.suppress(OSError):  # a read-only queue still gets its metrics
        write_file(tmp, json.dumps({"v": TOTALS_VERSION, "log": mark,
                                    **totals.to_json()}).encode(), fsync=False)
        os.replace(tmp, final)


def read_runner_state(queue: Queue) -> dict[str, Any] | None:
    """The live runner's ``runner.state.json``, or None if no runner holds the queue."""
    if queue.runner_info() is None:
        return None
    try:
        # A regular file, a state's worth: a FIFO there hung `top`, and a character device
        # (/dev/zero) was read until memory ran out
        data = json.loads(read_regular(queue.path / STATE_FILE, STATE_READ_MAX)[0])
    except (OSError, ValueError):
        return {}  # a runner is alive but has not written its first snapshot yet
    return data if isinstance(data, dict) else {}


def collect(queue: Queue, totals: EventTotals | None = None, *,
            status: QueueStatus | None = None, budget_bytes: float = math.inf) -> Metrics:
    """Read the queue now; ``totals`` (updated in place) carries counters between calls.
    ``status``: the folders' figures if the caller has them; ``budget_bytes``: fold at most
    about that much of the log now (see EventTotals.update)."""
    totals = totals if totals is not None else EventTotals()
    totals.update(queue, budget_bytes=budget_bytes)
    st = status if status is not None else queue.status()
    state = read_runner_state(queue)
    return Metrics(
        jobs={s.value: int(st.counts[s.value]) for s in State},
        corrupt=st.corrupt,
        oldest_pending_age_s=st.oldest_pending_age_s,
        runner_up=state is not None,
        workers_alive=int((state or {}).get("workers_alive") or 0),
        workers_desired=int((state or {}).get("workers_desired") or 0),
        totals=totals,
    )


def _num(v: float) -> str:
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    if float(v).is_integer():
        return str(int(v))
    return repr(float(v))


def _label(value: str) -> str:
    """A label value as the text format writes it: backslash, quote and newline escaped
    (an outcome comes from events.jsonl, which any version, or hand, may have written)."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _family(lines: list[str], name: str, kind: str, help_: str) -> None:
    lines.append(f"# HELP {name} {help_}")
    lines.append(f"# TYPE {name} {kind}")


def _histogram(lines: list[str], name: str, help_: str, h: Histogram) -> None:
    _family(lines, name, "histogram", help_)
    for bound, n in zip(h.bounds, h.counts, strict=True):
        lines.append(f'{name}_bucket{{le="{_num(bound)}"}} {n}')
    lines.append(f'{name}_bucket{{le="+Inf"}} {h.count}')
    lines.append(f"{name}_sum {_num(round(h.sum, 6))}")
    lines.append(f"{name}_count {h.count}")


def exposition(m: Metrics) -> str:
    """The Prometheus text format (0.0.4) of ``m``; ends with a newline."""
    t = m.totals
    lines: list[str] = []
    _family(lines, "renderctl_jobs", "gauge", "Jobs in the queue, by state (folder).")
    for state, n in m.jobs.items():
        lines.append(f'renderctl_jobs{{state="{_label(state)}"}} {n}')
    _family(lines, "renderctl_dead_letter_depth", "gauge", "Jobs in the dead-letter folder.")
    lines.append(f"renderctl_dead_letter_depth {m.jobs.get('dead', 0)}")
    _family(lines, "renderctl_corrupt_files", "gauge", "Quarantined unparseable queue files.")
    lines.append(f"renderctl_corrupt_files {m.corrupt}")
    _family(lines, "renderctl_oldest_pending_age_seconds", "gauge",
            "Age of the oldest pending job (0 when none is pending).")
    lines.append(f"renderctl_oldest_pending_age_seconds "
                 f"{_num(round(m.oldest_pending_age_s or 0.0, 3))}")
    _family(lines, "renderctl_attempts_total", "counter",
            "Attempts that ended, by outcome (from events.jsonl).")
    for outcome, n in sorted(t.attempts.items()):
        lines.append(f'renderctl_attempts_total{{outcome="{_label(outcome)}"}} {n}')
    _family(lines, "renderctl_redeliveries_total", "counter",
            "Attempts beyond a job's first (retries and crash recoveries).")
    lines.append(f"renderctl_redeliveries_total {t.redeliveries}")
    _family(lines, "renderctl_publish_collisions_total", "counter",
            "Attempts whose output path already held a file (another job's, an earlier "
            "life's of this id, or not renderctl's): dead-lettered, never overwritten.")
    lines.append(f"renderctl_publish_collisions_total "
                 f"{t.attempts.get(Outcome.OUTPUT_EXISTS.value, 0)}")
    _histogram(lines, "renderctl_time_to_first_attempt_seconds",
               "From acceptance to the first claim of a job.", t.wait)
    _histogram(lines, "renderctl_execution_seconds",
               "Wall time of one attempt, less any time its run was paused (Ctrl-Z).", t.exec)
    _family(lines, "renderctl_runner_up", "gauge", "1 if a runner holds the queue.")
    lines.append(f"renderctl_runner_up {int(m.runner_up)}")
    _family(lines, "renderctl_workers_alive", "gauge", "Worker processes running now.")
    lines.append(f"renderctl_workers_alive {m.workers_alive}")
    _family(lines, "renderctl_workers_desired", "gauge", "Worker processes the runner wants.")
    lines.append(f"renderctl_workers_desired {m.workers_desired}")
    return "\n".join(lines) + "\n"


def write_textfile(path: str | os.PathLike[str], text: str) -> None:
    """Replace ``path`` atomically (temporary file beside it, then rename).

    The temporary name does not end in ``.prom``, so node_exporter never reads it half-done.
    """
    replace_beside(path, text.encode())


class MetricsTextfile:
    """Keeps a node_exporter textfile up to date from a runner's ticks (Reporter protocol).

    ``tick`` is called once per runner loop: it costs one clock read unless a write is due
    (every ``interval_s``); ``close`` writes the final figures.
    """

    def __init__(self, queue: Queue, path: str | os.PathLike[str], *,
                 interval_s: float = TEXTFILE_INTERVAL_S) -> None:
        self.queue = queue
        self.path = Path(path)
        self.interval_s = interval_s
        # From where the last `renderctl metrics` (or runner) got to in this same log: a
        # week's log is hundreds of MB, folded at ~10 MB/s on the runner's one thread.
        self.totals = load_totals(queue)
        # Whether the fold has reached the log's end once: until then a textfile already
        # there (a killed runner's, its counters as far as it got) is left as it is. A
        # successor writing as it folded from the totals last saved showed counters lower
        # than those, then rising again: to Prometheus a reset, and every attempt in
        # between counted twice (audit BJ: 450 failed attempts, 234, then 450).
        self._caught_up = False
        self._hold_until = time.monotonic() + HOLD_MAX_S
        self._save_due = 0.0
        self._saved_offset = self.totals.offset
        self._due = 0.0
        self._status: QueueStatus | None = None
        self._status_due = 0.0

    def event(self, ev: Mapping[str, Any]) -> None:
        pass

    def tick(self, runner: object) -> None:
        now = time.monotonic()
        if now < self._due:
            return
        self._due = now + self.interval_s
        self.write(runner)

    def write(self, runner: object = None) -> None:
        # A metrics file is an aid: never let it stop the runner. (The next write tries
        # again; the last one, in close, says why it failed.)
        with contextlib.suppress(OSError, ValueError):
            self._write(runner)

    def _write(self, runner: object = None) -> None:
        if runner is None:  # the last write: everything, exact
            m = collect(self.queue, self.totals)
        else:
            self._caught_up |= self.totals.update(self.queue, budget_bytes=TICK_FOLD_BYTES)
            if not self._caught_up and self.path.exists() \
                    and time.monotonic() < self._hold_until:
                return
            # On the runner's thread, which claims and finishes every job: a bounded share.
            # The log is folded TICK_FOLD_BYTES a tick (a long one catches up over ticks,
            # its counters rising), and the folders (done/ holds every job until pruned:
            # 0.3 s a listing at 300,000) are listed again only after STATUS_COST_FACTOR
            # times what the last listing took; the oldest pending age is the runner's own.
            now = time.monotonic()
            if self._status is None or now >= self._status_due:
                st = self.queue.status(oldest_pending=False)
                took = time.monotonic() - now
                self._status_due = now + max(self.interval_s, STATUS_COST_FACTOR * took)
                self._status = st
            snap = runner.snapshot() if hasattr(runner, "snapshot") else {}
            st = dataclasses.replace(self._status,
                                     oldest_pending_age_s=snap.get("oldest_pending_age_s"))
            m = collect(self.queue, self.totals, status=st, budget_bytes=0)  # (folded above)
            if self._caught_up and now >= self._save_due \
                    and self.totals.offset != self._saved_offset:
                began = time.monotonic()
                save_totals(self.queue, self.totals)
                # Its cost grows with the jobs accepted and not yet claimed (300,000: 0.25 s
                # on the runner's thread): at most a 50th of the time, as for the listings.
                self._save_due = now + max(TOTALS_SAVE_S,
                                           STATUS_COST_FACTOR * (time.monotonic() - began))
                self._saved_offset = self.totals.offset
        write_textfile(self.path, exposition(m))

    def close(self) -> None:
        """Write the final figures; raises OSError if that fails (the caller warns)."""
        self._write()
        save_totals(self.queue, self.totals)  # the next runner or `metrics` goes on from here
